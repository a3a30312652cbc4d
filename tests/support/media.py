"""Test media made with ffmpeg (Debian's) from the sample clips, at test time.

The sample clips are MPEG-4 Part 2; RTSP/RTMP tests need H.264. Files are
built once per session into a temporary folder and never committed.
"""

from __future__ import annotations

import random
import subprocess
import threading
from pathlib import Path

from tests.conftest import CAMPUS, CLIP

WRAP = 1 << 33
_LOCK = threading.Lock()
_SHARED: dict[str, Media] = {}


def ffmpeg(*args: str) -> None:
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *args],
        check=True,
        timeout=120,
    )


class Media:
    """Lazily built media files, cached by name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.RLock()

    @classmethod
    def shared(cls, root: Path) -> Media:
        """One instance per test process (fixtures in several conftests share it)."""
        with _LOCK:
            return _SHARED.setdefault("media", cls(root))

    def _path(self, name: str) -> Path:
        return self.root / name

    def h264_clip(self) -> Path:
        """43 s of TUD-Stadtmitte at 320x240, H.264 (GOP 1 s, no B-frames), MP4 with moov first."""
        out = self._path("clip-h264.mp4")
        with self._lock:
            if not out.exists():
                ffmpeg("-stream_loop", "5", "-i", str(CLIP), "-vf", "scale=320:240",
                       "-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency",
                       "-g", "25", "-bf", "0", "-pix_fmt", "yuv420p", "-movflags", "+faststart",
                       str(out))  # fmt: skip
        return out

    def short(self, container: str) -> Path:
        """The first 10 s of :meth:`h264_clip` as ``mp4`` (moov at the end), ``ts`` or ``h264``."""
        out = self._path(f"short.{container}")
        src = self.h264_clip()
        with self._lock:
            if not out.exists():
                extra = ["-bsf:v", "h264_mp4toannexb", "-f", "h264"] if container == "h264" else []
                ffmpeg("-i", str(src), "-t", "10", "-c", "copy", *extra, str(out))
        return out

    def ts_near_wrap(self, before_s: float = 3.0) -> Path:
        """MPEG-TS whose PTS start ``before_s`` seconds before 2^33 (then wrap to ~0)."""
        out = self._path("near-wrap.ts")
        src = self.short("ts")
        with self._lock:
            if not out.exists():
                offset = (WRAP - before_s * 90_000) / 90_000
                ffmpeg("-i", str(src), "-c", "copy", "-f", "mpegts",
                       "-output_ts_offset", f"{offset:.6f}", str(out))  # fmt: skip
        return out

    def resolution_change_ts(self) -> Path:
        """3 s at 320x240 then 3 s at 640x480, H.264 in one MPEG-TS (a camera reconfigured)."""
        out = self._path("res-change.ts")
        with self._lock:
            if not out.exists():
                a, b = self._path("res-a.ts"), self._path("res-b.ts")
                ffmpeg("-i", str(self.short("ts")), "-t", "3", "-c", "copy", str(a))
                ffmpeg("-i", str(CAMPUS / "TUD-Campus.mp4"), "-t", "3", "-c:v", "libx264",
                       "-preset", "ultrafast", "-g", "25", "-bf", "0", "-f", "mpegts",
                       "-output_ts_offset", "3.2", str(b))  # fmt: skip
                out.write_bytes(a.read_bytes() + b.read_bytes())
        return out

    def truncated(self, container: str) -> Path:
        """The 10 s file cut in the middle."""
        out = self._path(f"truncated.{container}")
        with self._lock:
            if not out.exists():
                data = self.short(container).read_bytes()
                out.write_bytes(data[: len(data) // 2])
        return out

    def bitflipped(self, container: str, flips: int = 200, seed: int = 1) -> Path:
        """The 10 s file with ``flips`` random bits flipped after its first 10 %."""
        out = self._path(f"bitflipped.{container}")
        with self._lock:
            if not out.exists():
                data = bytearray(self.short(container).read_bytes())
                rnd = random.Random(seed)
                for _ in range(flips):
                    i = rnd.randrange(len(data) // 10, len(data))
                    data[i] ^= 1 << rnd.randrange(8)
                out.write_bytes(bytes(data))
        return out

    def hls(self) -> Path:
        """An HLS (VOD) playlist of the 10 s clip in 2 s MPEG-TS segments; returns the folder."""
        folder = self._path("hls")
        with self._lock:
            if not (folder / "index.m3u8").exists():
                folder.mkdir(exist_ok=True)
                ffmpeg("-i", str(self.short("mp4")), "-c", "copy", "-f", "hls", "-hls_time", "2",
                       "-hls_list_size", "0", str(folder / "index.m3u8"))  # fmt: skip
        return folder
