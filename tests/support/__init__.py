"""Test rig for ingest: real RTSP/RTMP/HTTP/Redis servers and media made with ffmpeg."""
