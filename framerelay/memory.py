"""Give the memory of large decoded frames back to the system (glibc).

Decoding an 8K stream allocates buffers of tens of MB per frame, from the
decoder's threads. With glibc's default *dynamic* mmap threshold, the first
large buffer freed raises the threshold (up to 32 MB), so later ones come from
the threads' heaps (arenas) and stay mapped after the stream ends: a 5-frame
8K file left the ingest ~275 MB larger for good, ``malloc_trim`` alone
giving back little of it. A fixed threshold (1 MiB) keeps every large buffer
an ``mmap`` of its own, unmapped when freed (FFmpeg's buffer pools reuse them
within a session, so this costs no extra system calls per frame), and
:func:`trim` (``malloc_trim(0)``) returns what the small allocations of a
session left free. Both do nothing where the C library is not glibc.

Between those sessions the heaps still creep: decode threads, encode threads
and the event loop each allocate and free in their own arena, and free memory
inside an arena stays resident until something gives it back, so a process
with many short-lived buffers grows by fragmentation for hours (the soak's
ingest: +10 MB/h with no fault at all). :func:`tune` therefore also starts one
daemon thread that calls ``malloc_trim(0)`` every :data:`TRIM_EVERY_S`
seconds: glibc then returns every whole free page of every arena
(``MADV_DONTNEED``), which takes well under a millisecond here.

Trimming alone still left the soak's ingest creeping (+6.5 MB/h with a fault
every 2 minutes, +26 MB/h over the second pass of faults every minute): glibc
gives every thread that contends for a heap its own arena, up to 8 per core,
and each arena keeps its own high-water fragments. :func:`tune` caps the arenas
at :data:`ARENA_MAX` (2), so the decode, encode and event-loop threads share
two heaps whose free space is reused instead of spread thin (same soak:
+2.6 to +3.4 MB/h, standard error about 2, and about 5 MB lower; the rest is
steps left by some faults, see bench/README.md). Small allocations stay per thread (glibc's
tcache), so the cap costs no measurable throughput (``bench/ingest.py``).
glibc's own ``MALLOC_ARENA_MAX``, when set, wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger(__name__)
MMAP_THRESHOLD = 1 << 20
"""Allocations of this size and above are mmap'ed (returned to the OS when freed)."""
ARENA_MAX = 2
"""Heaps (arenas) glibc may create for this process's threads."""
TRIM_EVERY_S = 30.0
"""How often the trimmer thread gives free heap pages back to the system."""
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers
_M_ARENA_MAX = -8
_lock = threading.Lock()
_state: dict[str, ctypes.CDLL | None] = {}
_stop = threading.Event()
_trimmer: list[threading.Thread] = []


def _libc() -> ctypes.CDLL | None:
    """glibc, or None (another C library, or none found)."""
    with _lock:
        if "libc" not in _state:
            _state["libc"] = _load()
        return _state["libc"]


def _load() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD))
        if "MALLOC_ARENA_MAX" not in os.environ:  # glibc's own tunable: the operator's word
            libc.mallopt(ctypes.c_int(_M_ARENA_MAX), ctypes.c_int(ARENA_MAX))
    except (OSError, AttributeError, TypeError):
        log.debug("not glibc: large-buffer memory tuning is off")
        return None
    return libc


def tune() -> bool:
    """Fix glibc's mmap threshold and start the trimmer (once per process); True if
    it is glibc."""
    libc = _libc()
    if libc is not None:
        _start_trimmer()
    return libc is not None


def _start_trimmer() -> None:
    with _lock:
        if _trimmer:
            return
        thread = threading.Thread(target=_trim_forever, name="malloc-trim", daemon=True)
        _trimmer.append(thread)
    thread.start()


def _trim_forever() -> None:
    while not _stop.wait(TRIM_EVERY_S):
        trim()


def trimmer_running() -> bool:
    """True once :func:`tune` has started the trimmer thread in this process."""
    return bool(_trimmer) and _trimmer[0].is_alive()


def trim() -> None:
    """Return the free memory of every heap to the system (glibc ``malloc_trim(0)``)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(ctypes.c_size_t(0))
