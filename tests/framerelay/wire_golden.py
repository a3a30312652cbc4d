"""The canonical tunnel messages and their golden bytes (tests/framerelay/fixtures/wire).

Every message type has at least one canonical message here; its bytes, as this
code writes them in each supported protocol version, are checked in under
``fixtures/wire/v<N>/<name>.bin``. ``test_wire_golden.py`` checks that encoding
gives exactly those bytes and decoding them gives the message, so any change of
the bytes on the wire is a deliberate one. The v1 files were written by the v1
codec as released (:mod:`tests.support.wire_v1_peer`), i.e. by real v1 peers.

To change them on purpose (a new message, a new optional field in a new version)::

    .venv/bin/python -m tests.framerelay.wire_golden --write

and review the diff of the ``.bin`` files (``git diff --text``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from framerelay import wire
from framerelay.detections import Detections
from tests.support import wire_v1_peer as v1

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "wire"
TIMING: dict[str, Any] = {
    "stream_id": "cam-1",
    "epoch": 2,
    "seq": 7,
    "pts": 8_589_934_000,
    "time_base": (1, 90_000),
    "captured_at": 1_700_000_000.25,
}
CLOCK: dict[str, Any] = {"epoch": 3, "offset": 1.5, "last_t": 12.25, "last_captured": 1.7e9}
DETECTIONS = Detections(
    xyxy=np.array([[10, 20, 110, 220], [5, 6, 7, 8]], np.float32),
    confidence=np.array([0.875, 0.25], np.float32),
    class_id=np.array([0, 2], np.int32),
    tracker_id=np.array([3, -1], np.int64),
)
HELLO: dict[str, Any] = {
    "worker_id": "gpu-a",
    "input_w": 416,
    "input_h": 416,
    "class_names": ["person", "bicycle", "car"],
    "providers": ["CPUExecutionProvider"],
    "max_inflight": 4,
}
FIELDS: dict[str, tuple[wire.MsgType, dict[str, Any], bytes]] = {
    "hello": (wire.MsgType.HELLO, HELLO, b""),
    "open": (wire.MsgType.OPEN, {"stream_id": "cam-1", "tracker": "default"}, b""),
    "open_resume": (
        wire.MsgType.OPEN,
        {"stream_id": "cam-1", "tracker": "default", "clock": CLOCK},
        b"FRTK\x00tracker-state",
    ),
    "close": (wire.MsgType.CLOSE, {"stream_id": "cam-1"}, b""),
    "frame": (
        wire.MsgType.FRAME,
        {**TIMING, "src_w": 1280, "src_h": 720, "scale": 0.325},
        b"\xff\xd8\xff\xe0JFIF\xff\xd9",
    ),
    "result": (
        wire.MsgType.RESULT,
        {**TIMING, "n": 2, "timings": {"infer_ms": 3.5, "batch": 1.0}},
        wire.pack_detections(DETECTIONS),
    ),
    "result_empty": (wire.MsgType.RESULT, {**TIMING, "n": 0}, b""),
    "error_frame": (
        wire.MsgType.ERROR,
        {"code": "bad_image", "message": "not a JPEG", "stream_id": "cam-1", "seq": 7},
        b"",
    ),
    "error_tunnel": (wire.MsgType.ERROR, {"code": "protocol", "message": "bad header"}, b""),
    "snapshot": (
        wire.MsgType.SNAPSHOT,
        {"stream_id": "cam-1", "seq": 41, "clock": CLOCK},
        b"FRTK\x00tracker-state",
    ),
}
"""Per canonical message: its type, its header fields (v2 and v1 alike) and payload."""
V2_EXTRA: dict[str, dict[str, Any]] = {"hello": {"features": ["resume", "snapshots"]}}
"""Fields only version 2 has."""
V1_EXTRA: dict[str, dict[str, Any]] = {"hello": {"encodings": ["jpeg"]}}
"""Fields only version 1 had."""


def message(name: str) -> tuple[wire.Header, bytes]:
    """The canonical message ``name`` (current codec) and its payload."""
    mtype, fields, payload = FIELDS[name]
    built = wire.build(wire._BY_TYPE[mtype], **fields, **V2_EXTRA.get(name, {}))
    header = cast(wire.Header, built)  # _BY_TYPE's classes are Header's members
    return header, payload


def v1_bytes(name: str) -> bytes:
    """``name`` as the v1 codec (a v1 peer) writes it."""
    mtype, fields, payload = FIELDS[name]
    model: Callable[..., v1.Header] = v1._BY_TYPE[mtype]  # type: ignore[assignment]
    return v1.encode(model(**fields, **V1_EXTRA.get(name, {})), payload)


def golden(version: int, name: str) -> bytes:
    """The checked-in bytes of ``name`` in protocol ``version``."""
    return (FIXTURES / f"v{version}" / f"{name}.bin").read_bytes()


def generate() -> dict[Path, bytes]:
    """What the fixture files should hold: v2 from this codec, v1 from the v1 codec."""
    files: dict[Path, bytes] = {}
    for name in FIELDS:
        header, payload = message(name)
        files[FIXTURES / "v2" / f"{name}.bin"] = wire.encode(header, payload)
        files[FIXTURES / "v1" / f"{name}.bin"] = v1_bytes(name)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the fixture files")
    args = parser.parse_args()
    for path, data in generate().items():
        old = path.read_bytes() if path.exists() else None
        state = "same" if old == data else ("new" if old is None else "CHANGED")
        print(f"{state:8} {path.relative_to(FIXTURES)} ({len(data)} B)")
        if args.write and old != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


if __name__ == "__main__":
    main()
