"""The ingest's heap trimmer: free pages inside glibc's arenas go back to the system.

Run in a fresh interpreter (the trimmer is once per process): 40 MB of 100 KB
buffers allocated in a thread's arena, every other one freed (holes that
``free`` alone never returns), then the trimmer's next pass must give them back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

CHILD = textwrap.dedent("""
    import threading, time
    from framerelay import memory

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    memory.TRIM_EVERY_S = 0.2
    assert memory.tune() and memory.tune()
    assert memory.trimmer_running()
    names = [t.name for t in threading.enumerate()]
    assert names.count("malloc-trim") == 1, names
    kept = []

    def fragment():
        blocks = [b"x" * 100_000 for _ in range(400)]
        kept.extend(blocks[::2])

    memory._stop.set()  # pause the trimmer while the holes are made
    time.sleep(0.5)
    t = threading.Thread(target=fragment); t.start(); t.join()
    held = rss_mb()
    memory._stop.clear()
    threading.Thread(target=memory._trim_forever, daemon=True).start()
    time.sleep(1.0)
    print(f"{held:.1f} {rss_mb():.1f}")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux")
def test_the_trimmer_returns_the_free_pages_of_a_fragmented_arena() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    held, after = map(float, out.stdout.split())
    print(f"RSS with 20 MB of holes {held:.1f} MB, after the trimmer's pass {after:.1f} MB")
    assert held - after > 10, (held, after)


ARENAS = textwrap.dedent("""
    import threading
    from framerelay import memory

    def heaps():
        # glibc arenas other than the main one are 64 MiB-aligned anonymous mappings
        n = 0
        for line in open("/proc/self/maps"):
            parts = line.split()
            start = int(parts[0].split("-")[0], 16)
            if len(parts) == 5 and start % (64 << 20) == 0 and parts[1].startswith("rw"):
                n += 1
        return n

    memory.tune()
    barrier = threading.Barrier(8)

    def churn():
        barrier.wait()
        for _ in range(2000):
            blocks = [b"x" * 5000 for _ in range(20)]
            del blocks

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(heaps())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas: Linux")
@pytest.mark.parametrize(("env", "most"), [({}, 2), ({"MALLOC_ARENA_MAX": "6"}, 6)])
def test_threads_share_at_most_arena_max_heaps(env: dict[str, str], most: int) -> None:
    """Eight threads allocating at once get at most ARENA_MAX extra heaps (glibc's
    default allows 8 per core); glibc's own MALLOC_ARENA_MAX, when set, wins."""
    run_env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run(
        [sys.executable, "-c", ARENAS], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=run_env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    heaps = int(out.stdout)
    print(f"{env or 'default'}: {heaps} thread heaps")
    assert heaps <= most
