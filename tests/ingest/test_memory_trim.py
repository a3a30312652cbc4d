"""The ingest's heap trimmer: free pages inside glibc's arenas go back to the system.

Run in a fresh interpreter (the trimmer is once per process): 40 MB of 100 KB
buffers allocated in a thread's arena, every other one freed (holes that
``free`` alone never returns), then the trimmer's next pass must give them back.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

CHILD = textwrap.dedent("""
    import threading, time
    from ingest import memory

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
