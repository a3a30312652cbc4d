"""Fixtures of the ingest test rig (real RTSP/HTTP/Redis servers, ffmpeg-made media)."""

from tests.support.fixtures import media

__all__ = ["media"]
