"""The versioned binary format of tracker snapshots.

Layout (all integers little-endian)::

    magic     4 bytes  b"FRTK"
    version   u16      FORMAT_VERSION
    name      u16 length + UTF-8       registered tracker name
    settings  u32 length + UTF-8 JSON  the tracker's settings model
    count     u16                      number of arrays
    arrays    count x (u8 key length, key, u8 dtype length, dtype (e.g. "<f8"),
                       u8 ndim, ndim x u32 dims, raw C-order bytes)
    crc32     u32                      of every byte before it

Floats are stored bit-exact, so a restored tracker continues exactly as the
original would have. Anything that is not a complete snapshot of a version
this code knows raises :class:`SnapshotError` saying what to do.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from framerelay.errors import ConfigError

MAGIC = b"FRTK"
FORMAT_VERSION = 1
_ALLOWED_DTYPES = frozenset({"<f8", "<f4", "<i8", "<i4", "|i1", "|b1"})
_MAX_DIMS = 4


class SnapshotError(ConfigError):
    """A tracker snapshot is corrupt, truncated, foreign or from a newer version."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A decoded snapshot: who wrote it, with which settings, and its arrays."""

    name: str
    version: int
    settings_json: str
    arrays: dict[str, NDArray[Any]]


def encode(name: str, settings_json: str, arrays: dict[str, NDArray[Any]]) -> bytes:
    """Serialise a tracker state (see the module docstring for the layout)."""
    name_b = name.encode()
    settings_b = settings_json.encode()
    parts = [
        MAGIC,
        struct.pack("<HH", FORMAT_VERSION, len(name_b)),
        name_b,
        struct.pack("<I", len(settings_b)),
        settings_b,
        struct.pack("<H", len(arrays)),
    ]
    for key, value in arrays.items():
        arr = np.asarray(value)
        dtype = arr.dtype.newbyteorder("<").str if arr.dtype.byteorder == ">" else arr.dtype.str
        if dtype not in _ALLOWED_DTYPES:
            raise ValueError(f"snapshot array {key!r} has unsupported dtype {arr.dtype}")
        key_b, dtype_b = key.encode(), dtype.encode()
        parts += [struct.pack("<B", len(key_b)), key_b, struct.pack("<B", len(dtype_b)), dtype_b]
        parts += [struct.pack(f"<B{arr.ndim}I", arr.ndim, *arr.shape)]
        parts.append(arr.astype(dtype, copy=False).tobytes())
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise SnapshotError(_broken("it is truncated"))
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))


def _broken(why: str) -> str:
    return (
        f"not a valid tracker snapshot ({why}); discard it and start the stream's "
        "tracker afresh (create_tracker) instead of restoring"
    )


def read_header(data: bytes) -> tuple[int, str]:
    """``(version, tracker name)`` of a snapshot, checking magic and version."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SnapshotError(_broken(f"expected bytes, got {type(data).__name__}"))
    if bytes(data[:4]) != MAGIC:
        raise SnapshotError(_broken("bad magic: it was not written by tracker.snapshot"))
    r = _Reader(bytes(data))
    r.take(4)
    version, name_len = r.unpack("<HH")
    if version > FORMAT_VERSION:
        raise SnapshotError(
            f"tracker snapshot format version {version} is newer than this framerelay "
            f"understands (up to {FORMAT_VERSION}); upgrade framerelay on this worker, "
            "or start the stream's tracker afresh"
        )
    if version < 1:
        raise SnapshotError(_broken(f"unknown format version {version}"))
    try:
        name = r.take(name_len).decode()
    except UnicodeDecodeError:
        raise SnapshotError(_broken("tracker name is not UTF-8")) from None
    return version, name


def decode(data: bytes) -> Snapshot:
    """Parse and verify a snapshot written by :func:`encode`."""
    version, name = read_header(data)
    if len(data) < 4 or zlib.crc32(data[:-4]) != struct.unpack("<I", data[-4:])[0]:
        raise SnapshotError(_broken("checksum mismatch: corrupt or truncated"))
    r = _Reader(bytes(data[:-4]))
    r.take(4 + 4 + len(name.encode()))
    (settings_len,) = r.unpack("<I")
    try:
        settings_json = r.take(settings_len).decode()
    except UnicodeDecodeError:
        raise SnapshotError(_broken("settings are not UTF-8")) from None
    (count,) = r.unpack("<H")
    arrays = dict(_read_array(r) for _ in range(count))
    if r.pos != len(r.data):
        raise SnapshotError(_broken("unexpected bytes after the last array"))
    return Snapshot(name, version, settings_json, arrays)


def _read_array(r: _Reader) -> tuple[str, NDArray[Any]]:
    (key_len,) = r.unpack("<B")
    key = r.take(key_len).decode("ascii", errors="replace")
    (dtype_len,) = r.unpack("<B")
    dtype = r.take(dtype_len).decode("ascii", errors="replace")
    if dtype not in _ALLOWED_DTYPES:
        raise SnapshotError(_broken(f"array {key!r} has unsupported dtype {dtype!r}"))
    (ndim,) = r.unpack("<B")
    if ndim > _MAX_DIMS:
        raise SnapshotError(_broken(f"array {key!r} has {ndim} dimensions"))
    shape = r.unpack(f"<{ndim}I")
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = r.take(nbytes)
    return key, np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
