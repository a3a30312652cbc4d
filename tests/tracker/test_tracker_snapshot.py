"""Snapshots: bit-exact continuation (also in a fresh process) and clear errors."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framerelay.commands.eval_tracker import load_detections
from framerelay.detections import Detections
from framerelay.errors import ConfigError
from tracker import SnapshotError, create_tracker, restore_tracker
from tracker import eval as ev
from tracker.bytetrack import ByteTrackTracker, HybridTracker
from tracker.engine import SortFamilyTracker
from tracker.passthrough import PassthroughTracker
from tracker.snapshot import FORMAT_VERSION, MAGIC, encode

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "samples/models/yolox_nano_416.onnx"
SEQUENCES = ["TUD-Campus", "TUD-Stadtmitte"]


def _stream(seed: int, frames: int = 60) -> list[tuple[float, Detections]]:
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0, 500, (8, 2))
    vel = rng.normal(0, 60, (8, 2))
    out = []
    t = 0.0
    for _ in range(frames):
        t += float(rng.choice([0.04, 0.04, 0.08, 0.2]))
        seen = rng.random(8) > 0.2
        c = (pos + vel * t)[seen] + rng.normal(0, 2, (int(seen.sum()), 2))
        half = np.array([20.0, 50.0])
        xyxy = np.hstack([c - half, c + half]).astype(np.float32)
        conf = rng.uniform(0.05, 1, len(c)).astype(np.float32)
        out.append((t, Detections(xyxy, conf, np.zeros(len(c), np.int32))))
    return out


@pytest.mark.parametrize("name", ["default", "hybrid", "bytetrack", "ocsort", "none"])
@pytest.mark.parametrize("cut", [0, 1, 17, 59])
def test_restore_continues_exactly(name: str, cut: int) -> None:
    stream = _stream(seed=cut)
    straight = create_tracker(name)
    want = [straight.update(d, t).tracker_id for t, d in stream]
    first = create_tracker(name)
    for t, d in stream[:cut]:
        first.update(d, t)
    blob = first.snapshot()
    again = restore_tracker(blob)
    assert again.name == first.name
    assert again.snapshot() == blob
    got = [again.update(d, t).tracker_id for t, d in stream[cut:]]
    assert all(np.array_equal(a, b) for a, b in zip(want[cut:], got, strict=True))


def test_snapshot_is_compact() -> None:
    trk = cast(SortFamilyTracker, create_tracker("default"))
    for t, d in _stream(seed=3):
        trk.update(d, t)
    per_track = 8 * (8 + 12 + 4 + 2 + 2 + 2) + 8 * 5 + 4 + 1
    assert len(trk.snapshot()) < 1024 + per_track * len(trk.tracks)


def _restore_subprocess(cases: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from framerelay.detections import Detections\n"
        "from tracker import restore_tracker\n"
        "for case in sorted(Path(sys.argv[1]).glob('*.npz')):\n"
        "    z = np.load(case)\n"
        "    trk = restore_tracker(z['blob'].tobytes())\n"
        "    ids, bounds = [], np.concatenate([[0], np.cumsum(z['counts'])])\n"
        "    for k, t in enumerate(z['t']):\n"
        "        a, b = bounds[k], bounds[k + 1]\n"
        "        d = Detections(z['xyxy'][a:b], z['conf'][a:b], z['cls'][a:b])\n"
        "        ids.append(trk.update(d, float(t)).tracker_id)\n"
        "    np.save(case.with_suffix('.out.npy'), np.concatenate(ids))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(cases)], check=True, cwd=ROOT, timeout=120)


def test_restore_in_fresh_process_on_real_sequences(tmp_path: Path) -> None:
    """Snapshot at the middle of each sequence, finish in a new process: the ids
    equal those of the run that never stopped."""
    want: dict[str, np.ndarray] = {}
    for seq in SEQUENCES:
        video = ROOT / "samples/mot15" / seq / f"{seq}.mp4"
        frames = load_detections(video, MODEL, cache_dir=ROOT / ".cache/detections")
        for every in (1, 5):
            for name in ("default", "bytetrack", "ocsort"):
                kept = ev.select_frames(frames, every)
                straight = create_tracker(name)
                ids = [straight.update(f.detections, f.t).tracker_id for f in kept]
                mid = len(kept) // 2
                trk = create_tracker(name)
                for f in kept[:mid]:
                    trk.update(f.detections, f.t)
                rest = kept[mid:]
                key = f"{seq}-{every}-{name}"
                np.savez(
                    tmp_path / f"{key}.npz",
                    blob=np.frombuffer(trk.snapshot(), np.uint8),
                    t=np.array([f.t for f in rest]),
                    counts=np.array([len(f.detections) for f in rest]),
                    xyxy=np.concatenate([f.detections.xyxy for f in rest]),
                    conf=np.concatenate([f.detections.confidence for f in rest]),
                    cls=np.concatenate([f.detections.class_id for f in rest]),
                )
                want[key] = np.concatenate(ids[mid:])
                assert (want[key] > 0).any(), "the second half must contain tracked objects"
    _restore_subprocess(tmp_path)
    for key, want_ids in want.items():
        assert np.array_equal(np.load(tmp_path / f"{key}.out.npy"), want_ids), key


def _valid() -> bytes:
    trk = create_tracker("default")
    for t, d in _stream(seed=5, frames=10):
        trk.update(d, t)
    return trk.snapshot()


def _with_version(blob: bytes, version: int) -> bytes:
    body = blob[:4] + struct.pack("<H", version) + blob[6:-4]
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"", "bad magic"),
        (lambda b: b"hello world, not a snapshot", "bad magic"),
        (lambda b: b[:3], "bad magic"),
        (lambda b: b[:40], "checksum|truncated"),
        (lambda b: b[:-1], "checksum"),
        (lambda b: b[:100] + bytes([b[100] ^ 0xFF]) + b[101:], "checksum"),
        (lambda b: _with_version(b, FORMAT_VERSION + 1), "newer than this framerelay"),
        (lambda b: _with_version(b, 0), "unknown format version"),
        (lambda b: encode("kalmanator", "{}", {}), "cannot restore"),
        (lambda b: encode("hybrid", '{"bogus": 1}', {}), "inconsistent"),
        (lambda b: encode("hybrid", "{}", {"next_id": np.array(1)}), "inconsistent"),
    ],
)
def test_bad_snapshots_raise_clear_errors(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SnapshotError, match=message) as info:
        restore_tracker(mutate(_valid()))
    assert isinstance(info.value, ConfigError)
    assert "afresh" in str(info.value) or "upgrade" in str(info.value)


def test_snapshot_of_another_tracker_is_refused() -> None:
    blob = create_tracker("bytetrack").snapshot()
    with pytest.raises(SnapshotError, match="restore_tracker"):
        HybridTracker.restore(blob)
    assert isinstance(restore_tracker(blob), ByteTrackTracker)


def test_legacy_passthrough_snapshot_still_restores() -> None:
    assert isinstance(restore_tracker(b"FRTN" + struct.pack("<H", 1)), PassthroughTracker)


def test_header_layout() -> None:
    blob = create_tracker("ocsort").snapshot()
    assert blob[:4] == MAGIC
    version, name_len = struct.unpack("<HH", blob[4:8])
    assert version == FORMAT_VERSION
    assert blob[8 : 8 + name_len] == b"ocsort"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data: bytes) -> None:
    try:
        restore_tracker(data)
    except SnapshotError:
        pass
    else:  # pragma: no cover - would need a valid CRC by chance
        pytest.fail("garbage was accepted")


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=8, max_value=2000), st.integers(min_value=0, max_value=255))
def test_corrupted_valid_snapshots_are_rejected(pos: int, xor: int) -> None:
    blob = bytearray(_valid())
    pos = pos % len(blob)
    blob[pos] ^= xor or 1
    with pytest.raises(SnapshotError):
        restore_tracker(bytes(blob))
