"""Where a file resumes when a stream is taken over from another ingest replica."""

from __future__ import annotations

import time
from dataclasses import dataclass
from fractions import Fraction

import av
from av.video.stream import VideoStream


@dataclass(frozen=True, slots=True)
class ResumeAt:
    """Where a file resumes (see :mod:`ingest.shards`)."""

    pts_s: float
    """The position, in seconds of the file's PTS..."""
    since: float | None = None
    """...at this Unix time, moving on in real time from then (a file paced like a live
    camera: it did not wait); None: fixed (a file read as fast as possible)."""

    def now(self) -> float:
        return self.pts_s + (max(0.0, time.time() - self.since) if self.since else 0.0)


def seek(
    container: av.container.InputContainer,
    stream: VideoStream,
    tb: Fraction,
    resume: ResumeAt | None,
    loop: bool,
) -> ResumeAt | None:
    """Seek a file to ``resume`` (wrapped into a looped file's length): where the frames
    to hand on start (None: from the start, e.g. a file that cannot seek)."""
    if resume is None:
        return None
    at = resume.now()
    length = container.duration / 1_000_000 if container.duration else None
    if length is not None and at >= length:
        at = at % length if loop else length
    try:
        container.seek(int(at / tb), stream=stream, backward=True)
    except (av.error.FFmpegError, OSError, ValueError):
        return None
    return ResumeAt(at, time.time() if resume.since is not None else None)
