"""Built model artefacts kept on a (network) volume, so a second worker skips the build.

A worker's start builds things from its model file: the rewritten graph (batch axis,
in-graph pre/post-processing), ONNX Runtime's optimised model, TensorRT engines. Each
is valid only for what it was built from, so each lives in a directory named by a
digest of exactly that (:func:`artefact_key`): the model file's sha256, the providers,
the ONNX Runtime version, the machine (CPU model and flags; GPU name), and every setting
that shapes the graph (batch, input handling, precision, post-processing thresholds).
A different model, GPU type or ORT upgrade gets a new directory: nothing is ever
overwritten in place or trusted across versions.

Writes are atomic: a file is written under a temporary name in the same directory and
renamed (:func:`write_atomic`), and ``meta.json`` - written last - is what makes an
entry complete, so two workers starting together never read a half-written artefact.
The race is tolerated rather than locked for the files written here (both build, the
last rename wins, the contents are the same); :func:`build_lock` serialises builds that
ONNX Runtime writes itself (TensorRT engines), best effort, with a timeout, because
locks on network file systems are not always honoured.

Nothing here checks who wrote an entry: a directory any other machine can write (a
network volume shared by pods) is reached only through :mod:`gpu_worker.volume`, which
copies an entry to a pod-local cache only when the volume's signed manifest lists its
bytes, and has the worker build its own copy otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from framerelay.errors import ConfigError

log = logging.getLogger(__name__)
META = "meta.json"
FORMAT_VERSION = 1
"""Bumped when what a cache entry holds changes shape; part of every key."""
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def cpu_fingerprint() -> str:
    """The CPU model and instruction-set flags: ONNX Runtime's optimised CPU models use
    layouts (NCHWc) chosen for the CPU they were built on."""
    model, flags = "", ""
    text = ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = hashlib.sha256(" ".join(sorted(value.split())).encode()).hexdigest()[:16]
    return f"{platform.machine()}|{model}|{flags}"


def artefact_key(facts: Mapping[str, object]) -> str:
    """A short, filesystem-safe digest of everything an artefact depends on."""
    blob = json.dumps({"format": FORMAT_VERSION, **facts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, all or nothing (temp file in the same directory + rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def copy_atomic(src: Path, dst: Path) -> None:
    """``src``'s bytes at ``dst``, all or nothing (streamed: engines can be large)."""
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class ArtefactCache:
    """One directory per key under ``root``; an entry is complete once its meta is there."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def prepare(self) -> ArtefactCache:
        """Create the root and prove it writable; one-line :class:`ConfigError` if not."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".write-check-"):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ConfigError(
                f"artefact cache {self.root} is not writable ({reason}); set "
                "FRAMERELAY_WORKER_DETECTOR__CACHE_DIR to a writable directory (a volume)"
            ) from None
        return self

    def entry(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The entry's meta when it is complete and readable, else None (a miss)."""
        try:
            meta = json.loads((self.entry(key) / META).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("artefact cache entry %s is unreadable (%s); building again", key, exc)
            return None
        return meta if isinstance(meta, dict) else None

    def read(self, key: str, name: str) -> bytes:
        return (self.entry(key) / name).read_bytes()

    def store(self, key: str, files: Mapping[str, bytes], meta: Mapping[str, object]) -> Path:
        """Write ``files`` then ``meta`` (last: it marks the entry complete)."""
        folder = self.entry(key)
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            write_atomic(folder / name, data)
        body = {**meta, "files": sorted(files), "built_at": time.time()}
        write_atomic(folder / META, json.dumps(body, sort_keys=True).encode())
        return folder


@contextlib.contextmanager
def build_lock(folder: Path, timeout_s: float) -> Iterator[bool]:
    """An exclusive lock on ``folder/.build.lock`` while building; yields whether it was
    taken. Past ``timeout_s`` (or where the file system refuses locks) the build goes on
    unlocked: a slow or lost lock must never stop a worker from starting."""
    folder.mkdir(parents=True, exist_ok=True)
    fh: IO[bytes] = (folder / ".build.lock").open("ab")
    deadline = time.monotonic() + timeout_s
    taken = False
    try:
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    log.warning("build lock in %s not taken (%s); building anyway", folder, exc)
                    break
                time.sleep(0.1)
        yield taken
    finally:
        if taken:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()


__all__ = [
    "ArtefactCache",
    "artefact_key",
    "build_lock",
    "copy_atomic",
    "cpu_fingerprint",
    "file_sha256",
    "write_atomic",
]
