"""A live "camera": a clip looped forever in real time, served as MPEG-TS over HTTP.

``python tests/results/camera.py --clip C.mp4`` prints ``{"port": P}`` and
serves ``http://127.0.0.1:P/live.ts`` to any number of clients at once, like an
IP camera's HTTP-TS output: every client gets the same packets with the same
timestamps (continuous across loops, so one endless timeline), starting at the
next keyframe after it connects. No re-encoding: packets are remuxed.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import av

CLIENT_QUEUE = 256


@dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes
    pts: int
    dts: int
    key: bool
    duration: int


class Broadcaster:
    """Demuxes the clip in a loop at its own pace and fans packets out to clients."""

    def __init__(self, clip: Path) -> None:
        self.clip = clip
        self.clients: list[queue.Queue[Chunk | None]] = []
        self.lock = threading.Lock()
        with av.open(str(clip)) as c:
            s = c.streams.video[0]
            self.time_base = Fraction(s.time_base or Fraction(1, 90000))
            self.template_path = str(clip)
            # MP4 keeps the codec headers out of band; a TS reader needs them in band,
            # before every keyframe (what FFmpeg's dump_extra filter does).
            self.headers = bytes(s.codec_context.extradata or b"")

    def add(self) -> queue.Queue[Chunk | None]:
        q: queue.Queue[Chunk | None] = queue.Queue(CLIENT_QUEUE)
        with self.lock:
            self.clients.append(q)
        return q

    def remove(self, q: queue.Queue[Chunk | None]) -> None:
        with self.lock:
            if q in self.clients:
                self.clients.remove(q)

    def run(self) -> None:
        offset = 0
        origin = time.monotonic()
        while True:
            last_end = offset
            with av.open(str(self.clip)) as c:
                stream = c.streams.video[0]
                for pkt in c.demux(stream):
                    if pkt.pts is None or pkt.size == 0:
                        continue
                    pts, dts = pkt.pts + offset, (pkt.dts or pkt.pts) + offset
                    due = origin + float(dts * self.time_base)
                    if due > time.monotonic():
                        time.sleep(due - time.monotonic())
                    duration = pkt.duration or 0
                    data = (self.headers if pkt.is_keyframe else b"") + bytes(pkt)
                    self._send(Chunk(data, pts, dts, bool(pkt.is_keyframe), duration))
                    last_end = max(last_end, pts + duration)
            offset = last_end

    def _send(self, chunk: Chunk) -> None:
        with self.lock:
            for q in list(self.clients):
                try:
                    q.put_nowait(chunk)
                except queue.Full:  # a client that does not read is dropped
                    self.clients.remove(q)
                    q.put(None)


def make_handler(caster: Broadcaster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "video/mp2t")
            self.end_headers()
            q = caster.add()
            try:
                self._stream(q)
            except (OSError, av.error.FFmpegError, ValueError):
                pass
            finally:
                caster.remove(q)

        def _stream(self, q: queue.Queue[Chunk | None]) -> None:
            with av.open(caster.template_path) as src:
                template = src.streams.video[0]
                out = av.open(self.wfile, "w", format="mpegts")
                ostream = out.add_stream_from_template(template)
                started = False
                while (chunk := q.get()) is not None:
                    started = started or chunk.key
                    if not started:
                        continue
                    pkt = av.Packet(chunk.data)
                    pkt.pts, pkt.dts, pkt.duration = chunk.pts, chunk.dts, chunk.duration
                    pkt.is_keyframe = chunk.key
                    pkt.time_base = caster.time_base
                    pkt.stream = ostream
                    out.mux(pkt)
                    self.wfile.flush()

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clip", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    caster = Broadcaster(args.clip)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(caster))
    server.daemon_threads = True
    threading.Thread(target=caster.run, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
