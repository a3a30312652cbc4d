"""The faults of the matrix (and of the soak), each a scenario for
:func:`bench.rig.matrix_harness.run_scenario`: it injects one fault beside the
rig's healthy streams, waits for the bad side's outcome, cleans up and returns
that outcome's figures.

Test media are made with ffmpeg at test time (1x1, 8K 7680x4320 x 5 frames, a
byte-flipped copy of the sample clip with a fixed seed); the cameras answering
401 are a tiny HTTP server and a tiny RTSP responder on port 0; the raw tunnel
clients live in :mod:`bench.rig.matrix_wire`.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import random
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from bench.rig import matrix_wire
from bench.rig.common import CLIP, ffmpeg
from bench.rig.matrix_harness import Rig, Scenario, healthy_config
from bench.rig.matrix_results import wait_until
from ingest.settings import StreamConfig

ENDED = ("STOPPED", "FAILED", "AUTH_FAILED")
RAISE_AFTER = 12
"""Batches the raising worker serves before every batch raises."""
BAD_NUMBERS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e308", "-1e308",
               "18446744073709551616", "-18446744073709551616")  # fmt: skip
NON_FINITE = frozenset(BAD_NUMBERS[:5])


# -- media ----------------------------------------------------------------------------


def tiny_source(root: Path) -> Path:
    """10 s of a 1x1-pixel H.264 video (4:4:4: 4:2:0 needs even sizes)."""
    out = root / "tiny-1x1.mp4"
    if not out.exists():
        ffmpeg("-f", "lavfi", "-i", "color=color=gray:size=16x16:rate=25", "-t", "10",
               "-vf", "scale=1:1", "-c:v", "libx264", "-pix_fmt", "yuv444p", str(out))  # fmt: skip
    return out


def huge_source(root: Path) -> Path:
    """5 frames of 8K (7680x4320) H.264."""
    out = root / "huge-8k.mp4"
    if not out.exists():
        ffmpeg("-f", "lavfi", "-i", "testsrc2=size=7680x4320:rate=25", "-frames:v", "5",
               "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
               str(out))  # fmt: skip
    return out


def byteflipped(root: Path, seed: int = 0) -> Path:
    """The sample clip as H.264 with B-frames, then bytes replaced (fixed seed): 8 in its
    composition-time table (``ctts``: presentation times jump back and forth, about 11
    times a second, as in the finding) and 100 in the media data after its first 5 %."""
    out = root / f"byteflipped-{seed}.mp4"
    if out.exists():
        return out
    clean = root / "clip-bframes.mp4"
    ffmpeg("-i", str(CLIP), "-c:v", "libx264", "-preset", "ultrafast", "-bf", "3", "-g", "25",
           "-pix_fmt", "yuv420p", str(clean))  # fmt: skip
    data = bytearray(clean.read_bytes())
    rnd = random.Random(seed)
    table = data.find(b"ctts")
    size = int.from_bytes(data[table - 4 : table], "big")
    for _ in range(8):
        data[rnd.randrange(table + 12, table - 4 + size)] = rnd.randrange(256)
    media = data.find(b"mdat")
    for _ in range(100):
        data[rnd.randrange(media + len(data) // 20, table - 8)] = rnd.randrange(256)
    out.write_bytes(bytes(data))
    return out


def make_media(root: Path) -> None:
    """Every file the scenarios use, made before any is measured (ffmpeg takes a core)."""
    tiny_source(root)
    huge_source(root)
    byteflipped(root)


# -- cameras answering 401 -------------------------------------------------------------


class _CountingHttp(http.server.ThreadingHTTPServer):
    hits = 0


class _CountingTcp(socketserver.ThreadingTCPServer):
    hits = 0
    daemon_threads = True


class _Http401Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        assert isinstance(self.server, _CountingHttp)
        if "Authorization" not in self.headers:  # an attempt's first request
            self.server.hits += 1
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="camera"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        return None


class _Rtsp401Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        assert isinstance(self.server, _CountingTcp)
        self.server.hits += 1
        for _ in range(8):  # a few requests per connection at most
            cseq = self._read_request()
            if cseq is None:
                return
            self.wfile.write(
                f"RTSP/1.0 401 Unauthorized\r\nCSeq: {cseq}\r\n"
                'WWW-Authenticate: Basic realm="camera"\r\nContent-Length: 0\r\n\r\n'.encode()
            )

    def _read_request(self) -> str | None:
        cseq = ""
        while True:
            line = self.rfile.readline(4096)
            if not line:
                return None
            if line in (b"\r\n", b"\n"):
                return cseq or "0"
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "cseq":
                cseq = value.strip()


class Cameras401:
    """An HTTP and an RTSP server on 127.0.0.1 that answer every request with 401;
    ``hits``: the attempts seen (HTTP requests without credentials: FFmpeg sends them
    again with credentials after a 401; RTSP connections)."""

    def __init__(self) -> None:
        self.http = _CountingHttp(("127.0.0.1", 0), _Http401Handler)
        self.rtsp = _CountingTcp(("127.0.0.1", 0), _Rtsp401Handler)
        for server in (self.http, self.rtsp):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def urls(self) -> dict[str, str]:
        return {
            "cam401-http": f"http://viewer:wrong@127.0.0.1:{self.http.server_address[1]}/cam.mp4",
            "cam401-rtsp": f"rtsp://viewer:wrong@127.0.0.1:{self.rtsp.server_address[1]}/cam",
        }

    def hits(self) -> dict[str, int]:
        return {"cam401-http": self.http.hits, "cam401-rtsp": self.rtsp.hits}

    def close(self) -> None:
        for server in (self.http, self.rtsp):
            server.shutdown()
            server.server_close()


# -- outcome of a bad stream -----------------------------------------------------------


def outcome(rig: Rig, stream_id: str, *counters: str) -> dict[str, Any]:
    """State, reason and a few counters of a stream, from the ingest's API."""
    s = rig.stream(stream_id)
    history = [f"{h['state']}: {h['reason']}" for h in s.get("history", [])[-3:]]
    keys = ("decoded", "sent", "results", *counters)
    return {"state": s["state"], "error": s["error"], "last_error": s["last_error"],
            "history": history, **{k: s.get(k) for k in keys}}  # fmt: skip


def _wait_state(rig: Rig, sid: str, states: tuple[str, ...], timeout_s: float) -> float | None:
    """Seconds until ``sid`` is in one of ``states``; None if not within ``timeout_s``."""
    try:
        return wait_until(lambda: rig.stream(sid)["state"] in states, timeout_s, sid)
    except TimeoutError:
        return None


def _file_stream(sid: str, path: Path, **over: Any) -> dict[str, Any]:
    return {"id": sid, "url": str(path), "fps": 3, **over}


# -- the scenarios ----------------------------------------------------------------------


def tiny(rig: Rig) -> dict[str, Any]:
    """A 1x1 source beside the healthy streams: FAILED (or refused) with a reason."""
    rig.add_stream(_file_stream("tiny-1x1", tiny_source(rig.root), realtime=True))
    try:
        took = _wait_state(rig, "tiny-1x1", ENDED, 15)
        return {"tiny-1x1": {**outcome(rig, "tiny-1x1"), "ended_after_s": took}}
    finally:
        rig.remove_stream("tiny-1x1")


def huge(rig: Rig) -> dict[str, Any]:
    """5 frames of 8K beside the healthy streams: downscaled or refused with a reason."""
    rig.add_stream(_file_stream("huge-8k", huge_source(rig.root)))
    try:
        took = _wait_state(rig, "huge-8k", ENDED, 30)
        return {"huge-8k": {**outcome(rig, "huge-8k"), "ended_after_s": took}}
    finally:
        rig.remove_stream("huge-8k")


def flipped(rig: Rig, hold_s: float = 8.0) -> dict[str, Any]:
    """A byte-flipped copy of the clip, real time, looped: epochs and frames sent stay in
    their budgets (sent <= fps over the run), or it ends with a reason."""
    fps = 3.0
    rig.add_stream(_file_stream("flipped", byteflipped(rig.root), fps=fps, realtime=True,
                                loop=True))  # fmt: skip
    start = time.monotonic()
    try:
        _wait_state(rig, "flipped", ENDED, hold_s)
        span = time.monotonic() - start
        out = outcome(rig, "flipped", "epoch", "corrupt", "decode_error", "corrupt_timestamps")
        out["max_epochs_per_min"] = rig.stream("flipped")["config"].get("max_epochs_per_min")
        out["span_s"] = round(span, 1)
        out["epochs_per_s"] = round(out["epoch"] / span, 2)
        out["sent_per_s"] = round(out["sent"] / span, 2)
        out["fps"] = fps
        return {"flipped": out}
    finally:
        rig.remove_stream("flipped")


def camera_401(rig: Rig, hold_s: float = 8.0) -> dict[str, Any]:
    """An HTTP and an RTSP camera answering 401: AUTH_FAILED, counted, retried slowly."""
    cams = Cameras401()
    urls = cams.urls()
    try:
        for sid, url in urls.items():
            rig.add_stream({"id": sid, "url": url, "fps": 3})
        took = {sid: _wait_state(rig, sid, ("AUTH_FAILED",), hold_s) for sid in urls}
        time.sleep(max(0.0, hold_s - max((t or hold_s) for t in took.values())))
        hits = cams.hits()
        return {sid: {**outcome(rig, sid, "auth_failed", "reconnects", "open_error"),
                      "auth_failed_after_s": took[sid], "attempts": hits[sid]}
                for sid in urls}  # fmt: skip
    finally:
        for sid in urls:
            rig.remove_stream(sid)
        cams.close()


def api_values(rig: Rig) -> dict[str, Any]:
    """NaN, Infinity and huge numbers in every numeric field of a stream definition (POST
    /v1/streams and the routing PUT) and in the results subscription: refused with 4xx."""
    statuses: dict[str, int] = {}
    fields = numeric_fields(StreamConfig.model_json_schema())
    for name in fields:
        for value in BAD_NUMBERS:
            statuses[f"POST {name}={value}"] = _post_raw(rig, name, value, len(statuses))
    for value in BAD_NUMBERS[:4]:
        statuses[f"PUT worker fps={value}"] = _put_worker_raw(rig, value, len(statuses))
        statuses[f"WS min_confidence={value}"] = asyncio.run(_subscribe_with(rig, value))
    return {"api": _summarise_statuses(statuses), "fields": fields}


def numeric_fields(schema: dict[str, Any]) -> list[str]:
    """Names of the properties whose type is a number or an integer (or may be)."""
    out = []
    for name, prop in schema["properties"].items():
        types = {prop.get("type")} | {p.get("type") for p in prop.get("anyOf", [])}
        if types & {"number", "integer"}:
            out.append(name)
    return out


def _probe_body(index: int, field: str, value: str) -> str:
    missing = CLIP.parent / "api-probe-missing.mp4"  # under the API's file roots, not there
    base = {"id": f"api-probe-{index}", "url": str(missing), "fps": 3}
    text = json.dumps({**base, field: 0}) if field != "id" else json.dumps(base)
    return text.replace(f'"{field}": 0', f'"{field}": {value}')


def _post_raw(rig: Rig, field: str, value: str, index: int) -> int:
    body = _probe_body(index, field, value)
    answer = rig.api("POST", "/v1/streams", content=body,
                     headers={"Content-Type": "application/json"})  # fmt: skip
    if answer.status_code < 300:
        rig.remove_stream(f"api-probe-{index}")
    return answer.status_code


def _put_worker_raw(rig: Rig, value: str, index: int) -> int:
    sid = f"api-probe-{index}"
    stream = _probe_body(index, "fps", value)
    wid = rig.worker_ids[-1]
    body = f'{{"worker_id": "{wid}", "url": "{rig.workers[wid].url}", "stream": {stream}}}'
    answer = rig.api("PUT", f"/v1/streams/{sid}/worker", content=body,
                     headers={"Content-Type": "application/json"})  # fmt: skip
    if answer.status_code < 300:
        rig.remove_stream(sid)
    return answer.status_code


async def _subscribe_with(rig: Rig, value: str) -> int:
    url = rig.api_url.replace("http://", "ws://") + f"/v1/results?min_confidence={value}"
    headers = {"Authorization": f"Bearer {rig.token}"}
    try:
        async with connect(url, additional_headers=headers, proxy=None):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def _summarise_statuses(statuses: dict[str, int]) -> dict[str, Any]:
    """Counts per status; every non-finite case that was accepted, by name."""
    counts: dict[int, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    accepted_non_finite = [
        case for case, status in statuses.items()
        if status < 400 and case.rsplit("=", 1)[1] in NON_FINITE
    ]  # fmt: skip
    accepted_huge = [case for case, status in statuses.items() if status < 400]
    server_errors = [case for case, status in statuses.items() if status >= 500]
    return {"cases": len(statuses), "statuses": counts,
            "accepted_non_finite": accepted_non_finite, "accepted_any": accepted_huge,
            "server_errors": server_errors}  # fmt: skip


def wire_values(rig: Rig) -> dict[str, Any]:
    """A raw tunnel client sends NaN/Inf/huge values in every numeric FRAME and OPEN
    field to the healthy streams' worker; afterwards it still infers and is ready."""
    wid = rig.worker_ids[0]
    url, token = rig.workers[wid].url, rig.worker_token(wid)
    outcomes = asyncio.run(matrix_wire.probe_worker(url, token, BAD_NUMBERS))
    ready = httpx.get(f"{rig.worker_http(wid)}/readyz", timeout=5)
    return {"worker": {**matrix_wire.summarise(outcomes, NON_FINITE),
                       "readyz": f"{ready.status_code} {ready.text[:80]}"}}  # fmt: skip


def ingest_wire_values(rig: Rig, hold_s: float = 10.0) -> dict[str, Any]:
    """A fake worker answers a victim stream with NaN/Inf/huge values in every numeric
    HELLO, RESULT and SNAPSHOT field: only the victim notices."""
    fake = matrix_wire.FakeWorker(BAD_NUMBERS).start()
    try:
        rig.place(healthy_config("victim-fake", 3), "fake-worker", fake.url)
        time.sleep(hold_s)
        out = outcome(rig, "victim-fake", "disconnected", "worker_error", "reconnects")
        seen = [s for s in rig.subscriber.snapshot() if s.stream == "victim-fake"]  # type: ignore[union-attr]
        out["results_published"] = len(seen)
        out["non_finite_published"] = sum(1 for s in seen if not (abs(s.captured_at) < 1e300))
        return {"victim-fake": out, "fake_worker": fake.summary()}
    finally:
        rig.remove_stream("victim-fake")
        fake.stop()


def flood(rig: Rig, seconds: float = 8.0) -> dict[str, Any]:
    """A tunnel client with a valid worker token floods the healthy streams' worker with
    invalid headers, bad JPEGs and frames beyond its credit (bounded rate and count)."""
    wid = rig.worker_ids[0]
    counts = asyncio.run(matrix_wire.flood(rig.workers[wid].url, rig.worker_token(wid), seconds))
    ready = httpx.get(f"{rig.worker_http(wid)}/readyz", timeout=5)
    return {"flooder": counts, "worker_readyz": ready.status_code}


def frozen_worker(seconds: float) -> tuple[Callable[[Rig], None], Scenario]:
    """(setup, scenario): a victim stream on the second worker, which is stopped by SIGSTOP
    for ``seconds``: the victim shows STALLED (or moves) and recovers after SIGCONT."""
    wid = "fm-b"
    sid = f"victim-freeze-{seconds:.0f}"

    def setup(rig: Rig) -> None:
        rig.place(healthy_config(sid, 3), wid)
        wait_until(lambda: rig.stream(sid)["results"] > 3, 30, f"{sid} results")

    def scenario(rig: Rig) -> dict[str, Any]:
        rig.freeze(wid)
        stopped = time.monotonic()
        try:
            seen = _watch(rig, sid, stopped + seconds)
        finally:
            rig.thaw(wid)
        thawed, before = time.monotonic(), rig.stream(sid)["results"]
        try:
            back: float | None = wait_until(
                lambda: rig.stream(sid)["results"] > before + 2, 30, f"{sid} results again"
            )
        except TimeoutError:
            back = None
        out = {**outcome(rig, sid, "timeout", "disconnected"), **seen,
               "results_again_after_s": back,
               "worker_now": rig.api("GET", "/v1/routing").json().get(sid)}  # fmt: skip
        rig.remove_stream(sid)
        out["thawed_for_s"] = round(time.monotonic() - thawed, 1)
        return {sid: out}

    return setup, scenario


def _reason(stream: dict[str, Any]) -> str | None:
    """Why the stream is in its state: its error, else the reason of its last change."""
    history = stream.get("history") or [{}]
    reason = stream.get("error") or history[-1].get("reason")
    return None if reason is None else str(reason)


def _watch(rig: Rig, sid: str, until: float) -> dict[str, Any]:
    """While the worker is frozen: when the victim first left RUNNING, in what state and
    why; when its history says it went STALLED (a failover to another worker can follow
    within one poll, so the state alone may never be seen out of RUNNING); its last
    changes (a move shows as RUNNING with "results from worker <the other one>")."""
    start, frozen_at = time.monotonic(), time.time()
    first, state, reason = None, "RUNNING", None
    stalled: dict[str, Any] = {"stalled_after_s": None, "stalled_reason": None}
    slowest = 0.0
    while time.monotonic() < until:
        t = time.monotonic()
        s = rig.stream(sid)
        slowest = max(slowest, time.monotonic() - t)
        if first is None and s["state"] != "RUNNING":
            first, state, reason = time.monotonic() - start, s["state"], _reason(s)
        if stalled["stalled_after_s"] is None:
            stalled = _first_stall(s, frozen_at) or stalled
        time.sleep(0.2)
    return {"left_running_after_s": first, "frozen_state": state, "frozen_reason": reason,
            **stalled, "slowest_poll_s": round(slowest, 2),
            "changes": [(round(h.get("at", 0) - frozen_at, 2), h.get("state"), h.get("reason"))
                        for h in (s.get("history") or [])[-4:]]}  # fmt: skip


def _first_stall(stream: dict[str, Any], since: float) -> dict[str, Any] | None:
    for change in stream.get("history") or []:
        if change.get("state") == "STALLED" and change.get("at", 0) >= since:
            return {"stalled_after_s": round(change["at"] - since, 2),
                    "stalled_reason": change.get("reason")}  # fmt: skip
    return None


def _served_then_left(rig: Rig, sid: str) -> bool:
    """Served, then failing: out of RUNNING, or RUNNING with the failure as its error."""
    s = rig.stream(sid)
    return bool(s["results"] > 0 and (s["state"] != "RUNNING" or s["error"]))


def raising_worker() -> tuple[Callable[[Rig], None], Scenario]:
    """(setup, scenario): a victim on a third worker whose inference raises after a few
    batches: the worker stays up, every frame of the victim fails and the victim says why
    (its ``error``; out of RUNNING or not); the worker's /readyz is reported."""
    wid, sid = "fm-raise", "victim-raise"

    def setup(rig: Rig) -> None:
        fault = f"raise_inference_after:{RAISE_AFTER}"
        rig.start_worker(
            wid, {"FRAMERELAY_WORKER_TEST_HOOKS": "true", "FRAMERELAY_WORKER_TEST_FAULT": fault}
        )

    def scenario(rig: Rig) -> dict[str, Any]:
        rig.place(healthy_config(sid, 3), wid)
        try:
            took = wait_until(lambda: _served_then_left(rig, sid), 25, f"{sid} noticed")
        except TimeoutError:
            took = None
        ready = httpx.get(f"{rig.worker_http(wid)}/readyz", timeout=5)
        out = {**outcome(rig, sid, "disconnected", "worker_error", "timeout"),
               "noticed_after_s": took, "worker_readyz": f"{ready.status_code} {ready.text[:100]}",
               "worker_alive": rig.alive()[wid]}  # fmt: skip
        rig.remove_stream(sid)
        rig.stop_worker(wid)
        return {sid: out}

    return setup, scenario
