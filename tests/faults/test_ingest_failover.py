"""Acceptance (issue 17, several ingests): kill -9 one of two sharded ingests under 6 streams.

Two real ``framerelay ingest --shard`` processes on one Redis (a private
``redis-server``), one real worker process (CPU ONNX model), six streams of the
sample clip paced like live cameras. Once each replica runs three streams,
replica A is killed with SIGKILL (no cleanup: its leases expire). Checked:

* every stream produces results again within 10 s (the worst gap between two
  results of a stream, measured on the Redis live channels, is printed);
* no stream is decoded by two replicas at once: the Redis transition log shows
  each take with a higher epoch, B starts A's streams only after the kill, and
  every result A wrote was captured before it;
* B resumes A's sessions: it starts each of A's streams from the snapshot A shared
  in Redis (its log says so) and its trackers carry tracks over the takeover (some
  track alive before keeps its id after). Judged with the default leases (5 s TTL,
  1 s renewal), killed early in a pass of the clip like the worker-failover test; a
  second run with short leases (2 s, 0.5 s) checks the gap and exclusivity only.

How many people keep their ids is printed against the clip's ground truth, not
judged: it is the tracker's bridge over a motion-only gap, and that gap grows with
the machine's load (the kill is placed by clip time and B resumes the file where a
live camera would be). On an idle machine 6/6 kept in 14 of 14 runs (4.7 s of clip
plain, 5.5 s beside two CPU hogs); with the whole suite beside it the gap was 6.4 s,
the resume landed at the clip's end and 3 of 6 kept. The bridge's own quality over
such gaps is judged where the gap is fixed: tests/tracker/test_gap.py (offline) and
tests/faults/test_failover_track_ids.py (real workers, a 5 s outage).

Loopback only; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis

from framerelay.results import ResultRecord
from tests.conftest import CLIP, ROOT, service_env
from tests.faults.id_continuity import Continuity, clip_gt, continuity
from tests.support.failover import workers
from tests.support.servers import RedisServer, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
STREAMS = tuple(f"cam-{i}" for i in range(6))
FPS = 25.0
KILL_WINDOW_S = (0.55, 1.0)
"""Clip time of A's streams at the kill: after the takeover (~5.5 s on with the default
leases) still in the same pass of the 7.16 s clip, as in test_failover_track_ids."""
PREFIX = "framerelay:ingest:shards"
MAX_GAP_S = 10.0
SHORT_LEASES = (2.0, 0.5)
"""TTL and renew interval shorter than the defaults (5 s, 1 s): gaps and exclusivity only."""
JUDGED = 5
"""Results after the takeover judged per stream (one second at 5 fps)."""
Arrival = tuple[float, ResultRecord]


class Ingest:
    def __init__(self, name: str, env: dict[str, str], streams: Path, worker: str, out: Path):
        self.name, self.out, self.port = name, out, free_port()
        self.cmd = [sys.executable, "-m", "framerelay", "ingest", "--worker-url", worker,
                    "--worker-id", "gpu-a", "--api-port", str(self.port), "--streams-file",
                    str(streams), "--shard", "--replica-id", name, "--out", str(out)]  # fmt: skip
        self.env = env
        self.log = out.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT)  # fmt: skip

    def ready(self) -> bool:
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz").status_code == 200
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def records(self) -> list[ResultRecord]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(ResultRecord.model_validate_json(line))
        return out


class Listener:
    """Every result published on the Redis live channels, with its arrival time."""

    def __init__(self, url: str) -> None:
        self.got: list[Arrival] = []
        self._pubsub = redis.Redis.from_url(url).pubsub()
        self._pubsub.psubscribe("framerelay:live:*")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._pubsub.get_message(timeout=0.2)
            if msg is not None and msg["type"] == "pmessage":
                rec = ResultRecord.model_validate_json(msg["data"])
                self.got.append((time.time(), rec))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()

    def of(self, sid: str) -> list[Arrival]:
        return [(t, r) for t, r in list(self.got) if r.stream_id == sid]


def owners(r: redis.Redis) -> dict[str, str]:
    out = {}
    for sid in STREAMS:
        raw = cast("bytes | None", r.get(f"{PREFIX}:lease:{sid}"))  # responses not decoded
        if raw is not None:
            out[sid] = raw.decode().rpartition("|")[0]
    return out


@contextlib.contextmanager
def fleet(tmp_path: Path, secret: str, ttl_s: float, renew_s: float) -> Iterator[dict[str, Any]]:
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    streams = tmp_path / "streams.json"
    cams = [{"id": s, "url": str(CLIP), "fps": 5, "realtime": True, "loop": True} for s in STREAMS]
    streams.write_text(json.dumps(cams))
    env = service_env()
    env.update(FRAMERELAY_TOKEN_SECRETS=secret, FRAMERELAY_REDIS_URL=server.url,
               FRAMERELAY_INGEST_SHARDS__LEASE_TTL_S=str(ttl_s),
               FRAMERELAY_INGEST_SHARDS__RENEW_INTERVAL_S=str(renew_s),
               # a replica that starts late (a busy machine) finds its peer holding all six;
               # the share evens out one handover a second instead of one an hour
               FRAMERELAY_INGEST_SHARDS__REBALANCE_INTERVAL_S="1",
               OMP_NUM_THREADS="1")  # fmt: skip
    listener = Listener(server.url)
    ingests: list[Ingest] = []
    try:
        with workers(secret, "gpu-a") as procs:
            url = procs["gpu-a"].url
            ingests = [Ingest(n, env, streams, url, tmp_path / f"{n}.jsonl") for n in ("a", "b")]
            for ingest in ingests:
                ingest.start()
            yield {"redis": redis.Redis.from_url(server.url), "listener": listener,
                   "a": ingests[0], "b": ingests[1]}  # fmt: skip
    finally:
        for ingest in ingests:
            ingest.stop()
        listener.close()
        server.stop()


def _in_kill_window(listener: Listener, sids: list[str]) -> bool:
    lo, hi = KILL_WINDOW_S
    latest = [listener.of(s)[-1][1] if listener.of(s) else None for s in sids]
    return all(r is not None and lo <= r.pts_time <= hi for r in latest)


def _worst_gap(arrivals: list[Arrival], killed_at: float) -> float:
    """The longest silence of a stream around the kill (seconds)."""
    times = [t for t, _ in arrivals if t >= killed_at - 2.0]
    return max((b - a for a, b in itertools.pairwise(times)), default=float("inf"))


def _transitions(r: redis.Redis) -> list[dict[str, Any]]:
    out = []
    log = cast("list[tuple[bytes, dict[bytes, bytes]]]", r.xrange(f"{PREFIX}:log"))  # not decoded
    for entry_id, fields in log:
        doc: dict[str, Any] = {k.decode(): v.decode() for k, v in fields.items()}
        doc["at"] = int(entry_id.decode().split("-")[0]) / 1000
        out.append(doc)
    return out


def _check_exclusive(log: list[dict[str, Any]], killed: str, killed_at: float) -> None:
    """Per stream: epochs rise at each take, and a start by one replica comes after the
    previous runner stopped (logged) or was killed."""
    for sid in STREAMS:
        events = [e for e in log if e["stream"] == sid]
        takes = [int(e["epoch"]) for e in events if e["event"] == "acquire"]
        assert takes == sorted(set(takes)), (sid, events)
        runner: str | None = None
        for e in events:
            if e["event"] == "start":
                if runner is not None and runner != e["owner"]:
                    assert runner == killed and e["at"] > killed_at, (sid, events)
                runner = e["owner"]
            elif e["event"] == "stop" and e["owner"] == runner:
                runner = None


def _scenario(f: dict[str, Any], judge_ids: bool) -> dict[str, Any]:
    r, listener, a, b = f["redis"], f["listener"], f["a"], f["b"]
    wait_until(lambda: a.ready() and b.ready(), 60, "both ingests ready")
    wait_until(lambda: sorted(owners(r).values()) == ["a"] * 3 + ["b"] * 3, 30,
             "three streams leased by each replica")  # fmt: skip
    wait_until(lambda: all(listener.of(s) for s in STREAMS), 60, "results of every stream")
    mine = sorted(s for s, o in owners(r).items() if o == "a")
    if judge_ids:
        wait_until(lambda: _in_kill_window(listener, mine), 45, "A's streams early in a clip pass")
    assert a.proc is not None
    killed_at = time.time()
    os.kill(a.proc.pid, signal.SIGKILL)
    last = {s: listener.of(s)[-1][1] for s in mine}
    wait_until(lambda: all(any(t > killed_at for t, _ in listener.of(s)) for s in STREAMS),
             MAX_GAP_S + 10, "results of every stream after the kill")  # fmt: skip
    time.sleep(1.5)  # a second of resumed tracks to judge
    return {"killed_at": killed_at, "mine": mine, "last": last, "owners": owners(r),
            "log": _transitions(r)}  # fmt: skip


def _after(listener: Listener, sid: str, killed_at: float) -> list[ResultRecord]:
    """B's first second of results of ``sid`` after the takeover (as the worker-failover
    test judges: later id switches are the tracker's, not the takeover's)."""
    after = [rec for t, rec in listener.of(sid) if t > killed_at]
    return [rec for rec in after if rec.epoch == after[0].epoch][:JUDGED] if after else []


@pytest.mark.parametrize("leases", [
    pytest.param(None, id="defaults"),
    pytest.param(SHORT_LEASES, id="short-leases"),
])  # fmt: skip
def test_kill_9_one_of_two_ingests(
    secret: str, tmp_path: Path, leases: tuple[float, float] | None
) -> None:
    """Gaps and exclusivity with both; the sessions resumed with the default leases (5 s,
    1 s), whose takeover lands in the same pass of the clip when A is killed early in one
    (the ids kept are printed: module doc)."""
    start = time.monotonic()
    ttl_s, renew_s = leases or (5.0, 1.0)
    with fleet(tmp_path, secret, ttl_s, renew_s) as f:
        out = _scenario(f, judge_ids=leases is None)
        listener, a = f["listener"], f["a"]
        killed_at = out["killed_at"]
        gaps = {s: _worst_gap(listener.of(s), killed_at) for s in STREAMS}
        after = {s: _after(listener, s, killed_at) for s in out["mine"]}
        a_records = a.records()
        b_log = f["b"].log.read_text()
    gt = clip_gt(CLIP)
    total = Continuity(0, 0, 0, 0, 0, 0)
    for sid in out["mine"]:
        c = continuity(out["last"][sid], after[sid], gt, FPS)
        total = total + c
        first = after[sid][0] if after[sid] else None
        print(f"\n{sid}: A's last result at clip {out['last'][sid].pts_time:.2f} s (epoch "
              f"{out['last'][sid].epoch}), B's first at "
              f"{first.pts_time if first else float('nan'):.2f} s (epoch "
              f"{first.epoch if first else -1}); worst gap {gaps[sid]:.2f} s: {c}")  # fmt: skip
    worst = max(gaps.values())
    kept = total.kept / total.eligible if total.eligible else 0.0
    print(f"kill -9 of ingest A: worst result gap {worst:.2f} s over {len(STREAMS)} streams "
          f"({', '.join(f'{s} {g:.2f}' for s, g in gaps.items())}); track ids kept "
          f"{total.kept}/{total.eligible} ({kept:.0%}), wrong {total.wrong}; owners now "
          f"{out['owners']}; wall {time.monotonic() - start:.0f} s")  # fmt: skip
    assert worst < MAX_GAP_S, gaps
    assert set(out["owners"].values()) == {"b"} and len(out["owners"]) == len(STREAMS)
    _check_exclusive(out["log"], "a", killed_at)
    assert all(rec.captured_at < killed_at for rec in a_records)
    if leases is not None:  # killed at once: a stream may not have shared a snapshot yet
        return
    resumed = [line for line in b_log.splitlines() if "snapshot: True" in line]
    assert all(any(f"stream {s} " in line for line in resumed) for s in out["mine"]), b_log
    assert total.any_id_kept >= 1, total  # B's trackers carried A's tracks over
