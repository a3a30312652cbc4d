"""A memory probe for a soaked process: put this folder on its PYTHONPATH.

    bench/soak.py --minutes 40 --name X \\
        --ingest-env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \\
        --ingest-env MALLOC_CONF=prof:true,lg_prof_sample:15,prof_accum:false \\
        --ingest-env PYTHONPATH=bench/rig/heap_probe

Every minute (``FRAMERELAY_HEAP_PROBE_EVERY_S``) it appends one line to
``$FRAMERELAY_HEAP_PROBE_OUT/probe.log`` (default
``/tmp/heap-probe``): RssAnon, the Python memory tracemalloc traces (numpy buffers
included) and how many of the ingest's per-stream objects are alive; where jemalloc with
profiling is preloaded it dumps a heap profile (``ingest.NNN.heap``; compare two with
``jeprof --text --base=A.heap $(readlink -f .venv/bin/python) B.heap``). With
``FRAMERELAY_HEAP_PROBE_TRACEMALLOC=1`` it also traces allocations (8 frames, which costs
memory of its own) and saves a snapshot every 5 minutes (``tm.NNN.snap``).

Each line also says what the allocator holds beside what is live: on jemalloc
``stats.allocated`` / ``stats.resident`` / ``stats.retained``, on glibc ``mallinfo2``'s
in-use and free bytes; where pymalloc is the allocator (not ``PYTHONMALLOC=malloc``),
``sys._debugmallocstats()`` is written to ``pymalloc.NNN.txt`` every 10 minutes.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import tempfile
import threading
import time
import tracemalloc

DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "heap-probe")
OUT = os.environ.get("FRAMERELAY_HEAP_PROBE_OUT") or DEFAULT_OUT
EVERY_S = float(os.environ.get("FRAMERELAY_HEAP_PROBE_EVERY_S") or 60)
"""Seconds between two lines (and heap profiles)."""
WATCHED = ("Preparer", "IngestStream", "AVSource", "InputContainer", "Subscription", "Task")


def _jemalloc() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libjemalloc.so.2", mode=os.RTLD_NOLOAD)  # only if preloaded
    except OSError:
        return None
    return lib if hasattr(lib, "mallctl") else None


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _jemalloc_stats(lib: ctypes.CDLL) -> str:
    epoch = ctypes.c_uint64(1)
    lib.mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
    out = []
    for key in ("allocated", "resident", "retained", "mapped"):
        value = ctypes.c_size_t(0)
        size = ctypes.c_size_t(ctypes.sizeof(value))
        lib.mallctl(f"stats.{key}".encode(), ctypes.byref(value), ctypes.byref(size), None, 0)
        out.append(f"je_{key}_kb={value.value // 1024}")
    return " ".join(out)


def _glibc_stats() -> str:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return ""
    return (
        f"glibc_inuse_kb={(info.uordblks + info.hblkhd) // 1024} "
        f"glibc_free_kb={info.fordblks // 1024} glibc_arena_kb={info.arena // 1024}"
    )


def _pymalloc_stats(k: int) -> None:
    """``sys._debugmallocstats()`` writes to fd 2; point fd 2 at a file for the call."""
    if os.environ.get("PYTHONMALLOC", "") not in ("", "pymalloc") or k % 10:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(f"{OUT}/pymalloc.{k:03d}.txt", "w") as f:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _profiling(lib: ctypes.CDLL) -> bool:
    value = ctypes.c_bool(False)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    ok = lib.mallctl(b"opt.prof", ctypes.byref(value), ctypes.byref(size), None, 0) == 0
    return ok and value.value


def _counts() -> dict[str, int]:
    out = dict.fromkeys(WATCHED, 0)
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in out:
            out[name] += 1
    return out


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))


def _loop(jemalloc: ctypes.CDLL | None, traced: bool) -> None:
    k = 0
    while True:
        time.sleep(EVERY_S)
        if jemalloc is not None and _profiling(jemalloc):
            name = ctypes.c_char_p(f"{OUT}/ingest.{k:03d}.heap".encode())
            jemalloc.mallctl(b"prof.dump", None, None, ctypes.byref(name), ctypes.sizeof(name))
        if traced and k % 5 == 0:
            tracemalloc.take_snapshot().dump(f"{OUT}/tm.{k:03d}.snap")
        _pymalloc_stats(k)
        held = _jemalloc_stats(jemalloc) if jemalloc is not None else _glibc_stats()
        traced_kb = tracemalloc.get_traced_memory()[0] // 1024 if traced else -1
        with open(f"{OUT}/probe.log", "a") as f:
            line = f"rss_kb={_rss_kb()} traced_kb={traced_kb} {held} {_counts()}"
            f.write(f"{k} {time.time():.0f} {line}\n")
        k += 1


def _start() -> None:
    os.makedirs(OUT, exist_ok=True)
    traced = os.environ.get("FRAMERELAY_HEAP_PROBE_TRACEMALLOC") == "1"
    if traced:
        tracemalloc.start(8)
    args = (_jemalloc(), traced)
    threading.Thread(target=_loop, args=args, daemon=True, name="heap-probe").start()


_start()
