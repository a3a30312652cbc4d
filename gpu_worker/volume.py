"""What a worker takes from a shared volume: only bytes a signed manifest vouches for.

Every pod of a tier mounts one writable volume (``FRAMERELAY_WORKER_VOLUME_DIR``, set by
the orchestrator), so whatever one pod writes there every later pod would read: a pod
that is taken over could plant a model, a model registry, a built graph or a TensorRT
engine for all of them. Here a file under the volume is used only when the volume's
manifest (``<volume>/framerelay/manifest.jwt``, :mod:`framerelay.auth.manifest`),
verified with the worker's public key set, lists its exact size and sha256:

- a model file is copied, verified while it is copied, to a pod-local folder, and the
  detector loads that copy (the volume can change after the check; the copy cannot);
- a model registry is read once, checked, and parsed from those bytes;
- a PyTorch file (``.pt`` and kin: a pickle, whose loading runs code) and anything the
  Ultralytics backend would load are never taken from the volume, signed or not;
- the artefact cache and TensorRT engine cache on the volume are read through a
  pod-local cache: the signed files of this detector's entry are copied there first
  (a hit); an entry that is not signed as it is, is refused with one warning line and
  the worker builds its own copy, in the pod-local cache. What a worker builds is then
  written back to the volume's cache, unsigned: no other worker uses it until an
  operator who trusts that build signs the volume again.

A model or registry that is refused stops the worker (or fails that model's streams)
with one line saying why; a refused cache entry costs a build, never the start.
Without ``volume_dir`` every path is the worker's own and is used as it is.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from framerelay.auth import KeySet
from framerelay.auth.config import load_keys
from framerelay.auth.manifest import (
    MANIFEST_PATH,
    MAX_MANIFEST_BYTES,
    PICKLE_SUFFIXES,
    FileDigest,
    Manifest,
    ManifestError,
    verify_manifest,
)
from framerelay.errors import ConfigError, ModelError
from gpu_worker.artefact_cache import META, copy_atomic
from gpu_worker.detectors import (
    Detector,
    DetectorSettings,
    OnnxDetectorSettings,
    load_detector,
)
from gpu_worker.detectors.base import acceleration_of
from gpu_worker.settings import WorkerSettings

log = logging.getLogger(__name__)
KEYS_ENV = "FRAMERELAY_WORKER_TUNNEL_KEYS"
_CHUNK = 1 << 20
Loader = Callable[[DetectorSettings], Detector]


class _Refused(Exception):
    """Why a file on the volume is not used (said in one line by the caller)."""


class _Changed(_Refused):
    """The file is not the one that was signed."""


@dataclass(frozen=True, slots=True)
class _Link:
    """A cache folder on the volume and the pod-local folder that stands in for it."""

    volume: Path
    local: Path


class SharedVolume:
    """The worker's view of its shared volume (none: every path is its own)."""

    def __init__(
        self, root: Path | None, keys: KeySet | None, *, local_dir: Path | None = None
    ) -> None:
        self.root = None if root is None else Path(os.path.abspath(root))
        self._real = None if root is None else root.resolve()
        self._keys = keys
        self._local_dir = local_dir
        self._local: Path | None = None
        self._lock = threading.Lock()
        self._seen: tuple[tuple[int, int, int], Manifest | str] | None = None

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> SharedVolume:
        """The volume of ``settings.volume_dir``, verified with the worker's key set."""
        if settings.volume_dir is None:
            return cls(None, None)
        keys = load_keys(settings.tunnel_keys, settings.token_secrets, jwks_env=KEYS_ENV)
        volume = cls(settings.volume_dir, keys, local_dir=settings.volume_local_dir)
        volume.report()
        return volume

    def report(self) -> None:
        """Say once, at start, what the volume's manifest vouches for."""
        try:
            manifest = self.manifest()
        except ManifestError as exc:
            log.warning(
                "shared volume %s: %s; nothing on it is trusted (this worker builds "
                "its own artefacts)",
                self.root,
                exc,
            )
            return
        log.info(
            "shared volume %s: signed manifest (key %s, %d files)",
            self.root,
            manifest.kid,
            len(manifest.files),
        )

    def rel(self, path: Path) -> str | None:
        """``path`` relative to the volume (as written, or with links resolved), or None
        when it is not on the volume."""
        if self.root is None or self._real is None:
            return None
        for base, full in ((self.root, Path(os.path.abspath(path))), (self._real, path.resolve())):
            if full == base or full.is_relative_to(base):
                return full.relative_to(base).as_posix()
        return None

    def manifest(self) -> Manifest:
        """The volume's verified manifest (read again when the file changes);
        :class:`ManifestError` saying why there is none to trust."""
        assert self.root is not None  # noqa: S101 - only asked of a volume
        path = self.root / MANIFEST_PATH
        with self._lock:
            try:
                st = path.stat()
            except OSError:
                raise ManifestError(f"no signed manifest at {path}") from None
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._seen is None or self._seen[0] != stamp:
                self._seen = (stamp, self._read_manifest(path))
            seen = self._seen[1]
        if isinstance(seen, str):
            raise ManifestError(seen)
        return seen

    def _read_manifest(self, path: Path) -> Manifest | str:
        if self._keys is None:
            return f"no key set to verify {path} (give the worker {KEYS_ENV})"
        try:
            with _open_regular(path) as fh:
                text = fh.read(MAX_MANIFEST_BYTES + 1).decode("utf-8", errors="replace")
            return verify_manifest(text, self._keys)
        except OSError as exc:
            return f"cannot read {path} ({exc.strerror})"
        except _Refused as exc:
            return f"{path}: {exc}"
        except ManifestError as exc:
            return f"{path}: {exc}"

    def _expected(self, rel: str) -> FileDigest:
        try:
            digest = self.manifest().get(rel)
        except ManifestError as exc:
            raise _Refused(str(exc)) from None
        if digest is None:
            raise _Refused("the volume's signed manifest does not list it")
        return digest

    def _refusal(self, path: Path, why: object) -> str:
        fix = (
            "put back the file that was signed (sign again only a change you made yourself)"
            if isinstance(why, _Changed)
            else "if you trust it, sign the volume where the signing keys are ('framerelay "
            "volume sign'), or use a file outside the volume"
        )
        return f"{path} is on the shared volume {self.root} and is not used: {why}; {fix}"

    def read_bytes(self, path: Path, max_bytes: int) -> bytes:
        """At most ``max_bytes`` + 1 bytes of ``path`` (a model registry); on the volume
        only when signed as it is (ConfigError, one line, otherwise)."""
        rel = self.rel(path)
        if rel is None:
            with path.open("rb") as fh:
                return fh.read(max_bytes + 1)
        try:
            expected = self._expected(rel)
            with _open_regular(path) as fh:
                data = fh.read(min(expected.size, max_bytes) + 1)
            _match(path.name, FileDigest(hashlib.sha256(data).hexdigest(), len(data)), expected)
        except OSError as exc:
            raise ConfigError(self._refusal(path, exc.strerror or exc)) from None
        except _Refused as exc:
            raise ConfigError(self._refusal(path, exc)) from None
        return data

    def model_file(self, path: Path, *, onnx: bool = True) -> Path:
        """The file a detector loads for ``path``: ``path`` itself off the volume, else a
        verified pod-local copy; ModelError (one line) for a file that is not signed as
        it is, and for any file on the volume that is a pickle or meant for a backend
        other than ONNX Runtime (``onnx`` false: Ultralytics)."""
        rel = self.rel(path)
        if rel is None:
            return path
        if not onnx or path.suffix.lower() in PICKLE_SUFFIXES:
            raise ModelError(
                f"{path} is on the shared volume {self.root}: a worker never loads a PyTorch "
                "file (a pickle: loading one runs code) or the Ultralytics backend from it; "
                "export it to ONNX ('framerelay model export') and sign the .onnx, or put "
                "it in the image"
            )
        try:
            expected = self._expected(rel)
            target = self._local_root() / "models" / expected.sha256[:16] / path.name
            if not target.is_file():
                _copy_verified(path, target, expected)
        except OSError as exc:
            raise ModelError(self._refusal(path, exc.strerror or exc)) from None
        except _Refused as exc:
            raise ModelError(self._refusal(path, exc)) from None
        return target

    def _local_root(self) -> Path:
        """The pod-local folder for verified copies and this worker's builds (0700)."""
        with self._lock:
            if self._local is None:
                if self._local_dir is not None:
                    self._local_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                    self._local = self._local_dir
                else:
                    self._local = Path(tempfile.mkdtemp(prefix="framerelay-volume-"))
                    atexit.register(shutil.rmtree, self._local, ignore_errors=True)
            return self._local

    def load_detector(self, settings: DetectorSettings, load: Loader = load_detector) -> Detector:
        """``load`` (:func:`~gpu_worker.detectors.load_detector`) with the volume's files
        replaced by verified pod-local copies (see the module doc); off a volume, ``load``
        as it is."""
        if self.root is None:
            return load(settings)
        local, links = self._localise(settings)
        key = _entry_key(local) if links else None
        for link in links if key else []:
            self._hydrate(link.volume / str(key), link.local / str(key))
        detector = load(local)
        acc = acceleration_of(detector)
        if acc.artefact_cache == "built" and acc.artefact_key is not None:
            for link in links:
                self._publish(link.local / acc.artefact_key, link.volume / acc.artefact_key)
        return detector

    def _localise(self, settings: DetectorSettings) -> tuple[DetectorSettings, list[_Link]]:
        """``settings`` with the model and caches on the volume made pod-local."""
        onnx = isinstance(settings, OnnxDetectorSettings)
        update: dict[str, object] = {"model": self.model_file(settings.model, onnx=onnx)}
        links: list[_Link] = []
        if isinstance(settings, OnnxDetectorSettings):
            local = self._local_root() / "cache"
            engines = settings.engine_cache_path()
            if settings.cache_dir is not None and self.rel(settings.cache_dir) is not None:
                update["cache_dir"] = local
                links.append(_Link(settings.cache_dir / "models", local / "models"))
                if self.rel(engines) is not None:  # keyed by the entry: shared through it
                    links.append(_Link(engines, local / "trt"))
            if self.rel(engines) is not None:
                update["engine_cache_dir"] = local / "trt"
        return settings.model_copy(update=update), links

    def _hydrate(self, source: Path, target: Path) -> None:
        """Copy the cache entry ``source`` on the volume to ``target`` when the manifest
        lists its files as they are; one warning line, and nothing copied, otherwise."""
        names = _files_in(source)
        if not names or (target / META).is_file():
            return  # nothing there, or this pod already holds its own
        rel = self.rel(source)
        try:
            manifest = self.manifest()
            listed = {
                r.rsplit("/", 1)[1]: d
                for r, d in manifest.files.items()
                if r.rsplit("/", 1)[0] == rel
            }
            if not listed:
                raise _Refused("the volume's signed manifest lists none of its files")
            if missing := sorted(set(listed) - set(names)):
                raise _Refused(f"{missing[0]} is signed but missing")
            for name in sorted(listed, key=lambda n: n == META):  # the meta last
                _copy_verified(source / name, target / name, listed[name])
        except (_Refused, ManifestError, OSError) as exc:
            shutil.rmtree(target, ignore_errors=True)
            log.warning(
                "artefact cache entry %s on the shared volume is refused (%s); this "
                "worker builds its own copy",
                source,
                _one_line(exc),
            )
            return
        log.info("artefact cache entry %s verified against the volume's manifest", source)

    def _publish(self, source: Path, target: Path) -> None:
        """Write this worker's build ``source`` to the volume's cache as ``target``
        (unsigned: other workers use it only once the volume is signed again)."""
        names = sorted(_files_in(source), key=lambda n: n == META)
        if not names:
            return
        if self.rel(target.resolve()) is None:  # a link another pod made: not followed
            log.warning("not writing this worker's build to %s: it leads off the volume", target)
            return
        try:
            target.mkdir(parents=True, exist_ok=True)
            for name in names:
                copy_atomic(source / name, target / name)
        except OSError as exc:  # a full or read-only volume: this worker serves anyway
            log.warning("could not write this worker's build to %s: %s", target, exc.strerror)
            return
        log.info(
            "wrote this worker's build to %s (unsigned: other workers use it once "
            "'framerelay volume sign' lists it)",
            target,
        )


def _entry_key(settings: DetectorSettings) -> str | None:
    """The artefact cache key the detector will use for ``settings`` (its own code)."""
    if not isinstance(settings, OnnxDetectorSettings) or settings.cache_dir is None:
        return None
    import onnxruntime as ort

    from gpu_worker.detectors import build_cache as bc
    from gpu_worker.detectors.onnx_backend import choose_providers

    store = bc.open_store(settings, choose_providers(settings.providers), ort.__version__)
    return None if store is None else store.key


def _files_in(folder: Path) -> list[str]:
    with contextlib.suppress(OSError):
        found = [p for p in folder.iterdir() if not p.name.startswith(".")]
        return sorted(p.name for p in found if p.is_file() and not p.is_symlink())
    return []


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading when it is a regular file; :class:`_Refused` for a
    FIFO, a device or a folder (which another pod can put there to hang or feed a
    reader), checked on the opened file itself."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Refused(f"{path.name} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _match(name: str, got: FileDigest, expected: FileDigest) -> None:
    if got != expected:
        raise _Changed(
            f"{name} does not match the volume's signed manifest (sha256 {got.sha256[:12]}..., "
            f"{got.size} bytes; signed: {expected.sha256[:12]}..., {expected.size} bytes): "
            "it changed after signing"
        )


def _copy_verified(src: Path, dst: Path, expected: FileDigest) -> None:
    """``src`` at ``dst`` when its bytes are ``expected`` (hashed while copied, so what is
    checked is what is kept); nothing at ``dst`` and :class:`_Refused` otherwise."""
    dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out, _open_regular(src) as fh:
            while size <= expected.size:
                chunk = fh.read(min(_CHUNK, expected.size + 1 - size))
                if not chunk:
                    break
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        _match(src.name, FileDigest(digest.hexdigest(), size), expected)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _one_line(exc: BaseException) -> str:
    said = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return (said.splitlines() or [type(exc).__name__])[0][:300]


__all__ = ["SharedVolume"]
