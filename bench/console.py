"""What the operator console costs the ingest, with 100 streams (issue 15's acceptance).

    python bench/console.py [--streams 100] [--rounds 2] [--seconds 20] [--warmup 5]

One ``framerelay ingest`` process (its API on a free port, tokens under a secret
of the run's own) holds ``--streams`` streams of a tiny clip made once with
ffmpeg (64x64, 2 fps, 6 s, H.264), each played in real time and looped
(``realtime: true, loop: true``, ``fps`` 2). Decoding such a clip is cheap, so
the ingest's own work stays small, the 2-core box is not saturated, and what
the console adds is visible. **No worker**: the ingest's ``worker_url`` points
at a port nobody listens on. Its streams still decode, count ``fps_in`` and
report RUNNING (each frame is dropped as ``no_credit`` before encoding), and
their rows are complete but for results and latency. Results would need a
worker, whose CPU and JPEG encoding for 100 streams would drown the figure on
two cores. What latency figures add to building a row is measured beside the
run, in-process: the **row micro-benchmark** times
``ingest.console_summary.snapshot`` for the same number of streams with empty
latency windows and with full ones (256 results each, so percentiles are
computed), and the ``json.dumps`` of the event.

Phases, ``--rounds`` times in this order, each measured for ``--seconds``
after ``--warmup``:

* **baseline**: no console open;
* **browser**: the console open in real headless Chromium (Debian's
  ``chromium`` + ``chromedriver`` through selenium, offline), signed in with a
  ``streams:read`` token; the browser is started once and goes to
  ``about:blank`` between its phases;
* **sse**: a plain client (httpx, streaming) reading ``GET /v1/console/streams``.

Per phase: the ingest's CPU time (utime + stime of ``/proc/<pid>/stat``) as %
of one core, and for the consoles the ``streams`` events received per second
and the longest gap between two. The browser's updates are counted in the page
itself: a ``MutationObserver`` injected by selenium (the product's code is
unchanged) notes each time ``#status-line`` is rewritten to "updated ...".
The console's cost is the phase minus the same round's baseline: target < 5 %
of one core, and at least 1 update/s. Also printed: the whole box's CPU
(other work shares it) and the browser's own CPU (every process under
chromedriver; the operator's machine pays it, not the ingest).

Writes ``bench/results/console.json`` and ``console.png`` (the ingest's CPU per
phase and round, the cost against the target).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from bench.rig.common import ffmpeg, free_port, mint  # noqa: E402
from bench.rig.console_clients import Browser, Console, SseClient  # noqa: E402

TARGET_PCT = 5.0
"""The console may cost the ingest less than this % of one core."""
TARGET_UPDATES = 1.0
"""...and must update at least this often (per second)."""
SLACK = 0.02
"""The mean period between updates may exceed 1 s by this share: the server sleeps 1 s
after building and sending each event, so its period is 1 s plus that work and the
timer's lateness (both printed)."""
CLIP_FPS, CLIP_S, CLIP_SIDE, SAMPLE_FPS = 2, 6, 64, 2.0
TICK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 90.0
TOKEN_TTL_S = 3600.0


# -- the ingest process ---------------------------------------------------------------


def make_clip(folder: Path) -> Path:
    """A tiny H.264 clip: 64x64, 2 fps, 6 s, a key frame every second."""
    clip = folder / "tiny.mp4"
    ffmpeg("-f", "lavfi", "-i", f"testsrc2=size={CLIP_SIDE}x{CLIP_SIDE}:rate={CLIP_FPS}",
           "-t", str(CLIP_S), "-c:v", "libx264", "-pix_fmt", "yuv420p", "-g", str(CLIP_FPS),
           str(clip))  # fmt: skip
    return clip


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def box_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, all cores."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and every process under it (the browser's)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    parents[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
    tree, todo = {root}, [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == pid and p not in tree]
        tree.update(kids)
        todo.extend(kids)
    total = 0.0
    for pid in tree:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_s(pid)
    return total


@dataclass
class Ingest:
    """``framerelay ingest`` with ``streams`` looped streams of ``clip`` and no worker."""

    root: Path
    clip: Path
    streams: int
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    proc: subprocess.Popen[bytes] | None = None
    base: str = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def token(self, scope: str = "streams:read") -> str:
        return mint(self.secret, scope, "ingest", TOKEN_TTL_S)

    def start(self) -> Ingest:
        defs = [{"id": f"cam-{i + 1:03d}", "url": str(self.clip), "realtime": True, "loop": True,
                 "fps": SAMPLE_FPS} for i in range(self.streams)]  # fmt: skip
        (self.root / "streams.json").write_text(json.dumps(defs), encoding="utf-8")
        port, nobody = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}
        env.update(FRAMERELAY_TOKEN_SECRETS=self.secret, FRAMERELAY_LOG_LEVEL="WARNING",
                   FRAMERELAY_INGEST_STORE_PATH=str(self.root / "store.json"))  # fmt: skip
        with (self.root / "ingest.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "framerelay", "ingest", "--worker-url",
                 f"ws://127.0.0.1:{nobody}/v1/tunnel", "--worker-id", "nobody",
                 "--api-port", str(port), "--streams-file", str(self.root / "streams.json")],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.base = f"http://127.0.0.1:{port}"
        return self

    def check(self) -> None:
        """Raise, with the end of its log, when the ingest has exited."""
        if self.proc is None or self.proc.poll() is not None:
            tail = (self.root / "ingest.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the ingest exited:\n{tail}")

    def wait_running(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Seconds until every stream is RUNNING (raises after ``timeout_s``)."""
        start = time.monotonic()
        headers = {"Authorization": f"Bearer {self.token()}"}
        running = 0
        with httpx.Client(timeout=10) as http:
            while time.monotonic() - start < timeout_s:
                self.check()
                with contextlib.suppress(httpx.TransportError):
                    r = http.get(f"{self.base}/v1/streams", headers=headers)
                    if r.status_code == 200:
                        running = sum(s["state"] == "RUNNING" for s in r.json())
                        if running == self.streams:
                            return time.monotonic() - start
                time.sleep(0.5)
        raise RuntimeError(f"{running}/{self.streams} streams RUNNING after {timeout_s:.0f} s")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# -- phases ---------------------------------------------------------------------------


@dataclass
class Phase:
    kind: str
    round: int
    ingest_pct: float
    box_pct: float
    """Busy share of the whole machine (every core), %."""
    browser_pct: float | None = None
    updates_per_s: float | None = None
    updates: int | None = None
    period_ms: float | None = None
    max_gap_s: float | None = None
    detail: str = ""


def measure(
    ingest: Ingest, console: Console | None, rnd: int, args: argparse.Namespace,
    browser_pid: int | None,
) -> Phase:  # fmt: skip
    """One phase: ``console`` (None: no console) open, warm-up, then ``--seconds`` measured."""
    if console is not None:
        console.open()
    try:
        time.sleep(args.warmup)
        ingest.check()
        if console is not None:
            console.mark()
        c0, b0, t0 = cpu_s(ingest.pid), box_cpu(), time.monotonic()
        w0 = tree_cpu_s(browser_pid) if browser_pid else 0.0
        time.sleep(args.seconds)
        c1, b1, t1 = cpu_s(ingest.pid), box_cpu(), time.monotonic()
        w1 = tree_cpu_s(browser_pid) if browser_pid else 0.0
        seen = console.seen() if console is not None else None
    finally:
        if console is not None:
            console.close()
    ingest.check()
    wall = t1 - t0
    phase = Phase(kind=console.name if console else "baseline", round=rnd,
                  ingest_pct=100 * (c1 - c0) / wall,
                  box_pct=100 * (b1[0] - b0[0]) / max(1, b1[1] - b0[1]))  # fmt: skip
    if console is not None and seen is not None:
        phase.updates_per_s, phase.updates = seen.per_s, seen.updates
        phase.period_ms = 1000 * seen.period_s
        phase.max_gap_s, phase.detail = seen.max_gap_s, seen.detail
    if console is not None and console.name == "browser":
        phase.browser_pct = 100 * (w1 - w0) / wall
    return phase


def line(p: Phase, base: Phase | None) -> str:
    text = f"  round {p.round} {p.kind:<8} ingest {p.ingest_pct:5.2f} % of a core"
    if base is not None and p is not base:
        text += f" (+{p.ingest_pct - base.ingest_pct:5.2f})"
    text += f"; box {p.box_pct:3.0f} % busy"
    if p.updates_per_s is not None:
        text += (f"; {p.updates} updates, every {p.period_ms:.0f} ms ({p.updates_per_s:.3f}/s), "
                 f"longest gap {p.max_gap_s:.2f} s")  # fmt: skip
    if p.browser_pct is not None:
        text += f"; browser {p.browser_pct:.1f} % of a core"
    return text + (f"  [{p.detail}]" if p.detail else "")


# -- the row micro-benchmark ----------------------------------------------------------


def row_cost(clip: Path, n: int, seconds: float = 1.0) -> dict[str, float]:
    """ms per ``snapshot`` of ``n`` streams (empty, then full latency windows) and per
    ``json.dumps`` of the event, in this process (streams built, never started)."""
    import numpy as np

    from ingest.console_summary import Rates, snapshot
    from ingest.latency import RECENT
    from ingest.settings import StreamConfig
    from ingest.stream import IngestStream

    loop = asyncio.new_event_loop()
    try:
        streams = {f"cam-{i + 1:03d}": IngestStream(StreamConfig(
            id=f"cam-{i + 1:03d}", url=str(clip), realtime=True, loop=True, fps=SAMPLE_FPS,
        ), loop, 1) for i in range(n)}  # fmt: skip
        rates = Rates()
        out = {"empty_ms": _per_call(lambda: snapshot(streams, {}, "nobody", rates), seconds)}
        rng = np.random.default_rng(1)
        for s in streams.values():
            for v in rng.uniform(40, 400, RECENT):
                s.latency.window.append(float(v))
        rows = snapshot(streams, {}, "nobody", rates)
        out["full_ms"] = _per_call(lambda: snapshot(streams, {}, "nobody", rates), seconds)
        body = {"at": time.time(), "streams": rows, "workers": []}
        out["json_ms"] = _per_call(lambda: json.dumps(body, allow_nan=False, default=str), seconds)
        out["event_bytes"] = float(len(json.dumps(body, allow_nan=False, default=str)))
    finally:
        loop.close()
    return out


def _per_call(call: Any, seconds: float) -> float:
    """Median ms of ``call`` over batches filling about ``seconds`` (at most 10,000 calls)."""
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(times) < 10_000:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


# -- main -----------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, default=100, help="streams on the ingest (1-500)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the three phases (1-10)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured per phase (5-120)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds not measured (2-60)")
    ap.add_argument("--no-browser", action="store_true", help="skip the Chromium phases")
    args = ap.parse_args()
    if not (1 <= args.streams <= 500 and 1 <= args.rounds <= 10 and 5 <= args.seconds <= 120
            and 2 <= args.warmup <= 60):  # fmt: skip
        ap.error("--streams 1-500, --rounds 1-10, --seconds 5-120, --warmup 2-60")
    return args


def run(args: argparse.Namespace, folder: Path) -> tuple[list[Phase], dict[str, float], float]:
    clip = make_clip(folder)
    rows = row_cost(clip, args.streams)
    ingest = Ingest(folder, clip, args.streams).start()
    phases: list[Phase] = []
    kinds = 2 if args.no_browser else 3
    try:
        ready_s = ingest.wait_running()
        print(f"{args.streams} streams RUNNING {ready_s:.1f} s after the ingest started",
              flush=True)  # fmt: skip
        with contextlib.ExitStack() as stack:
            browser = None if args.no_browser else stack.enter_context(Browser(ingest))
            consoles: list[Console | None] = [None, *([browser] if browser else []),
                                              SseClient(ingest)]  # fmt: skip
            bar = stack.enter_context(Progress(kinds * args.rounds, "console", "phases"))
            for rnd in range(1, args.rounds + 1):
                base: Phase | None = None
                for console in consoles:
                    pid = browser.pid if console is browser and browser else None
                    phase = measure(ingest, console, rnd, args, pid)
                    base = base or phase
                    phases.append(phase)
                    print(line(phase, base), flush=True)
                    bar.advance()
    finally:
        ingest.close()
    return phases, rows, ready_s


def summary(phases: list[Phase], kind: str) -> dict[str, Any] | None:
    """The median cost of ``kind`` over the rounds (each against its round's baseline)."""
    base = {p.round: p.ingest_pct for p in phases if p.kind == "baseline"}
    mine = [p for p in phases if p.kind == kind]
    if not mine:
        return None
    costs = [p.ingest_pct - base[p.round] for p in mine]
    rates = [p.updates_per_s or 0.0 for p in mine]
    return {
        "cost_pct": statistics.median(costs), "costs_pct": costs,
        "updates_per_s": statistics.median(rates), "min_updates_per_s": min(rates),
        "max_gap_s": max(p.max_gap_s or 0.0 for p in mine),
        "max_period_ms": max(p.period_ms or math.inf for p in mine),
        "cost_ok": statistics.median(costs) < TARGET_PCT,
        "updates_ok": min(rates) >= TARGET_UPDATES / (1 + SLACK),
        "updates_strictly_ok": min(rates) >= TARGET_UPDATES,
    }  # fmt: skip


def report(args: argparse.Namespace, phases: list[Phase], rows: dict[str, float],
           ready_s: float) -> None:  # fmt: skip
    base = [p.ingest_pct for p in phases if p.kind == "baseline"]
    print(f"\n{args.streams} streams, no worker, {args.rounds} rounds of {args.seconds:g} s "
          f"per phase (median over rounds; cost = phase - the round's baseline):")  # fmt: skip
    print(f"  baseline (no console)  ingest {statistics.median(base):5.2f} % of a core  "
          f"{[round(b, 2) for b in base]}")  # fmt: skip
    results: dict[str, Any] = {}
    for kind in ("browser", "sse"):
        s = summary(phases, kind)
        if s is None:
            continue
        results[kind] = s
        print(f"  {kind:<8} console cost {s['cost_pct']:+5.2f} % of a core "
              f"{[round(c, 2) for c in s['costs_pct']]} (target < {TARGET_PCT:g}): "
              f"{'ok' if s['cost_ok'] else 'ABOVE'}")  # fmt: skip
        print(f"  {'':<8} updates {s['updates_per_s']:.3f}/s (lowest round "
              f"{s['min_updates_per_s']:.3f}, longest period {s['max_period_ms']:.0f} ms, "
              f"longest gap {s['max_gap_s']:.2f} s; target >= {TARGET_UPDATES:g}/s, "
              f"{100 * SLACK:g} % timer slack): {'ok' if s['updates_ok'] else 'BELOW'}"
              f"{'' if s['updates_strictly_ok'] else ' (within the slack)'}")  # fmt: skip
    per_s = 100 / 1000  # ms per call at one call a second -> % of a core
    print(f"  rows in-process ({args.streams} streams): snapshot {rows['empty_ms']:.2f} ms "
          f"(no latency) / {rows['full_ms']:.2f} ms (latency windows full), json.dumps "
          f"{rows['json_ms']:.2f} ms, {rows['event_bytes'] / 1000:.1f} kB/event: once a second "
          f"that is {(rows['empty_ms'] + rows['json_ms']) * per_s:.2f} % of a core "
          f"as in this run (no results, so no latency), "
          f"{(rows['full_ms'] + rows['json_ms']) * per_s:.2f} % with results flowing "
          f"(built once a second and shared, whatever the number of consoles)")  # fmt: skip
    write_results("console", {
        "args": vars(args), "target_pct": TARGET_PCT, "target_updates_per_s": TARGET_UPDATES,
        "ready_s": ready_s, "phases": [asdict(p) for p in phases], "summary": results,
        "rows_in_process": rows,
    }, plot)  # fmt: skip


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        phases, rows, ready_s = run(args, Path(tmp))
    report(args, phases, rows, ready_s)
    return 0


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """The ingest's CPU in each phase of each round; the console's cost against the target."""
    cpu, cost = fig.subplots(1, 2, width_ratios=(3, 2))
    phases = results["phases"]
    kinds = list(dict.fromkeys(p["kind"] for p in phases))
    rounds = sorted({p["round"] for p in phases})
    width = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        values = [next((p["ingest_pct"] for p in phases if p["kind"] == kind
                        and p["round"] == r), 0.0) for r in rounds]  # fmt: skip
        cpu.bar([r + (k - (len(kinds) - 1) / 2) * width for r in rounds], values, width,
                label=kind)  # fmt: skip
    cpu.set_xticks(rounds, [f"round {r}" for r in rounds])
    cpu.set(ylabel="ingest CPU (% of one core)",
            title=f"{results['args']['streams']} streams, no worker")  # fmt: skip
    cpu.legend(loc="lower right", fontsize="small")
    names = list(results["summary"])
    for i, name in enumerate(names):
        costs = results["summary"][name]["costs_pct"]
        cost.scatter([i] * len(costs), costs, color="tab:blue", zorder=3)
        cost.bar(i, results["summary"][name]["cost_pct"], 0.5, color="tab:blue", alpha=0.35)
    cost.axhline(results["target_pct"], color="tab:red", ls="--", label="target (< 5 %)")
    cost.axhline(0, color="black", lw=0.6)
    cost.set_xticks(range(len(names)), names)
    cost.set(ylabel="console cost (% of one core)", title="cost: phase - baseline")
    cost.legend(loc="upper right", fontsize="small")


if __name__ == "__main__":
    raise SystemExit(main())
