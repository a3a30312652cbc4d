"""Soak: does any process grow while streams run and faults come and go?

    python bench/soak.py [--minutes 20] [--warmup-minutes 4] [--fault-every 2]
                         [--streams 4] [--fps 3] [--sample-s 5]

Issue 11's soak, measured as it reads: the fault matrix's rig
(:mod:`bench.rig.matrix_harness`: two ``framerelay worker`` processes on CPU
with the real model, one ``framerelay ingest`` process with its API, a
subscriber of its results WebSocket) with ``--streams`` real-time streams (the
sample clip, looped) for ``--minutes``; every ``--fault-every`` minutes the
next fault of the matrix (:mod:`bench.rig.matrix_faults`, in rotation) is
injected beside them, with its own figures. The RSS of every process is
sampled every ``--sample-s`` seconds; the figure is each process's RSS slope
after the warm-up: the least-squares slope of its per-minute median RSS
(:func:`levels`), in MB/h with its standard error, target < 1 MB/h; the slope
of the raw samples is printed beside it. Writes ``bench/results/<name>.json``
and ``<name>.png`` (each process's RSS over time, the warm-up shaded, the
faults marked).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from bench.rig import matrix_faults as faults  # noqa: E402
from bench.rig.matrix_harness import Rig, Scenario, run_scenario, running_rig, window  # noqa: E402

TARGET_MB_PER_H = 1.0
KEEP_RESULTS_S = 300.0
Setup = Callable[[Rig], None] | None


def rotation() -> list[tuple[str, Setup, Scenario]]:
    """The matrix's faults, in the order the soak injects them (then again)."""
    frozen, raising = faults.frozen_worker(10), faults.raising_worker()
    return [
        ("1x1 source", None, faults.tiny),
        ("worker frozen 10 s", *frozen),
        ("8K source", None, faults.huge),
        ("garbage-flooding tunnel", None, faults.flood),
        ("byte-flipped file", None, faults.flipped),
        ("NaN/Inf/huge in wire fields", None, faults.wire_values),
        ("camera answering 401", None, faults.camera_401),
        ("inference loop raises", *raising),
        ("NaN/Inf/huge in API fields", None, faults.api_values),
        ("NaN/Inf/huge from a fake worker", None, faults.ingest_wire_values),
    ]


class RssSampler:
    """RSS of the rig's long-lived processes every ``every_s`` seconds, in a thread."""

    def __init__(self, rig: Rig, every_s: float) -> None:
        self.rig, self.every_s = rig, every_s
        self.names = list(rig.pids())
        self.samples: dict[str, list[tuple[float, float]]] = {n: [] for n in self.names}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            now, rss = time.monotonic(), self.rig.rss()
            for name in self.names:
                if name in rss and not math.isnan(rss[name]):
                    self.samples[name].append((now, rss[name]))
            self._stop.wait(self.every_s)


def slope_mb_per_h(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) in MB per hour (NaN under 3 points)."""
    return fit(points)[0]


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (seconds, MB) and its standard error, in MB per hour
    (NaN under 3 points)."""
    n = len(points)
    if n < 3:
        return math.nan, math.nan
    mt = sum(t for t, _ in points) / n
    mr = sum(r for _, r in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var <= 0:
        return math.nan, math.nan
    slope = sum((t - mt) * (r - mr) for t, r in points) / var
    resid = sum((r - mr - slope * (t - mt)) ** 2 for t, r in points)
    return slope * 3600, math.sqrt(resid / (n - 2) / var) * 3600


def levels(points: list[tuple[float, float]], span_s: float = 60.0) -> list[tuple[float, float]]:
    """The RSS *level* of each ``span_s`` window: (middle, median of its samples).

    A 5 s sample can land inside a fault's transient (an 8K frame decoding is
    +100 MB for a second) or on a batch of frames in flight; the median of a
    minute is the level the process sits at. Its slope is the growth; successive
    medians are also far less correlated than 5 s samples, so the slope's
    standard error means something."""
    buckets: dict[int, list[float]] = {}
    for t, r in points:
        buckets.setdefault(int((t - points[0][0]) // span_s), []).append(r)
    return [
        (points[0][0] + (k + 0.5) * span_s, statistics.median(rs))
        for k, rs in sorted(buckets.items())
        if len(rs) >= 3
    ]


def _soak(rig: Rig, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Faults every ``fault_every`` minutes until ``minutes`` have passed."""
    start, faults_list = time.monotonic(), rotation()
    figures: list[dict[str, Any]] = []
    end = start + args.minutes * 60
    if args.fault_every <= 0:  # steady state: the streams and the subscriber only
        _sleep_until(end)
        return figures
    slot = 0
    while time.monotonic() < end - 30:
        name, setup, scenario = faults_list[slot % len(faults_list)]
        print(f"[{(time.monotonic() - start) / 60:5.1f} min] fault: {name}", flush=True)
        result = run_scenario(rig, name, scenario, setup=setup)
        print(result.report(), flush=True)
        figures.append({**result.as_dict(), "at_min": (time.monotonic() - start) / 60})
        assert rig.subscriber is not None
        rig.subscriber.trim(time.time() - KEEP_RESULTS_S)
        slot += 1
        _sleep_until(min(end, start + slot * args.fault_every * 60))
    _sleep_until(end)
    return figures


def _prime(rig: Rig) -> list[dict[str, Any]]:
    """Each fault of the rotation once, back to back, before the measured run: the
    first run of a fault pays one-time costs (code paths used for the first time,
    a worker's first flood of garbage: a 1.7 MB step measured once and never again)
    that are not growth; with a fault every 2 minutes each fault runs only once in
    20 minutes, so without this pass those steps would all read as a slope."""
    figures = []
    for name, setup, scenario in rotation():
        print(f"[priming] fault: {name}", flush=True)
        result = run_scenario(rig, name, scenario, setup=setup)
        figures.append({**result.as_dict(), "priming": True})
    return figures


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.monotonic()))


def _slopes(sampler: RssSampler, warmup_s: float) -> dict[str, dict[str, float]]:
    out = {}
    for name, points in sampler.samples.items():
        t0 = points[0][0] if points else 0.0
        after = [(t, r) for t, r in points if t - t0 >= warmup_s]
        minutes = levels(after)
        slope, err = fit(minutes)
        out[name] = {
            "slope_mb_per_h": slope,
            "slope_stderr_mb_per_h": err,
            "raw_slope_mb_per_h": slope_mb_per_h(after),
            "late_half_slope_mb_per_h": fit(minutes[len(minutes) // 2 :])[0],
            "first_mb": points[0][1] if points else math.nan,
            "after_warmup_mb": minutes[0][1] if minutes else math.nan,
            "last_mb": minutes[-1][1] if minutes else math.nan,
            "samples": len(after),
            "minutes": len(minutes),
        }
    return out


def _healthy_rates(rig: Rig, span_s: float) -> dict[str, dict[str, float]]:
    assert rig.subscriber is not None
    seen, now = rig.subscriber.snapshot(), time.time()
    out = {}
    for sid in rig.healthy_ids:
        w = window(seen, sid, now - min(span_s, KEEP_RESULTS_S), now - 2)
        out[sid] = {"results_per_s": w.rate, "p99_ms": w.p99_ms}
    return out


@contextlib.contextmanager
def _rig(args: argparse.Namespace) -> Iterator[Rig]:
    with tempfile.TemporaryDirectory(prefix="framerelay-soak-") as tmp:
        root = Path(tmp)
        faults.make_media(root)
        env = dict(kv.split("=", 1) for kv in args.ingest_env)
        with running_rig(root, healthy=args.streams, fps=args.fps, ingest_env=env) as rig:
            yield rig


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--warmup-minutes", type=float, default=4.0,
                        help="RSS before this is left out of the slope (at most half of "
                             "--minutes); with --fault-every 1 and --warmup-minutes 10 the "
                             "slope covers the second pass of the fault rotation: one-time costs "
                             "of each fault's first run are not counted as growth")  # fmt: skip
    parser.add_argument("--fault-every", type=float, default=2.0,
                        help="minutes between faults (0: no faults, steady state)")  # fmt: skip
    parser.add_argument("--prime", action=argparse.BooleanOptionalAction, default=True,
                        help="each fault once before the measured minutes (one-time costs "
                             "are warm-up, not growth); --no-prime counts them")  # fmt: skip
    parser.add_argument("--name", default="soak", help="results file name (bench/results/)")
    parser.add_argument("--ingest-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra environment variable for the ingest process (repeatable), "
                             "e.g. MALLOC_ARENA_MAX=2")  # fmt: skip
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--fps", type=float, default=3.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    args = parser.parse_args()
    if bad := [kv for kv in args.ingest_env if "=" not in kv]:
        parser.error(f"--ingest-env takes NAME=VALUE, got {bad[0]!r}")
    warmup_s = min(args.warmup_minutes, args.minutes / 2) * 60
    with _rig(args) as rig:
        primed = _prime(rig) if args.prime and args.fault_every > 0 else []
        with RssSampler(rig, args.sample_s) as sampler, Progress.timed(args.minutes * 60, "soak"):
            figures = _soak(rig, args)
            healthy = _healthy_rates(rig, args.minutes * 60)
            alive = rig.alive()
    slopes = _slopes(sampler, warmup_s)
    _print(slopes, healthy, figures, alive, warmup_s)
    write_results(args.name, {
        "minutes": args.minutes, "warmup_s": warmup_s, "streams": args.streams, "fps": args.fps,
        "fault_every_min": args.fault_every, "primed": bool(primed), "priming": primed,
        "target_mb_per_h": TARGET_MB_PER_H, "rss": slopes, "healthy": healthy, "alive": alive,
        "faults": figures, "rss_samples": sampler.samples,
    }, plot)  # fmt: skip
    return 0 if all(s["slope_mb_per_h"] < TARGET_MB_PER_H for s in slopes.values()) else 1


def _print(
    slopes: dict[str, dict[str, float]],
    healthy: dict[str, dict[str, float]],
    figures: list[dict[str, Any]],
    alive: dict[str, bool],
    warmup_s: float,
) -> None:
    print(f"\nRSS after {warmup_s / 60:.1f} min of warm-up (target < {TARGET_MB_PER_H} MB/h; "
          "slope of the per-minute median RSS, +- 2 standard errors):")  # fmt: skip
    for name, s in slopes.items():
        verdict = "ok" if s["slope_mb_per_h"] < TARGET_MB_PER_H else "OVER"
        print(f"  {name:8s} {s['first_mb']:6.0f} -> {s['after_warmup_mb']:6.0f} -> "
              f"{s['last_mb']:6.0f} MB, slope {s['slope_mb_per_h']:+7.2f} "
              f"+- {2 * s['slope_stderr_mb_per_h']:5.2f} MB/h (last half "
              f"{s['late_half_slope_mb_per_h']:+7.2f}; "
              f"5 s samples {s['raw_slope_mb_per_h']:+7.2f}; "
              f"{s['minutes']} minutes) {verdict}")  # fmt: skip
    for sid, h in healthy.items():
        print(f"  {sid}: {h['results_per_s']:.2f} results/s, p99 {h['p99_ms']:.0f} ms "
              "(last 5 min)")  # fmt: skip
    failed = [f["name"] for f in figures if f["problems"]]
    print(f"  faults: {len(figures)} injected, with problems: {failed or 'none'}")
    print(f"  alive at the end: {', '.join(n for n, ok in alive.items() if ok)}")


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """RSS of each process over the run, one panel each: warm-up shaded, faults marked."""
    samples: dict[str, list[list[float]]] = {k: v for k, v in results["rss_samples"].items() if v}
    t0 = min((pts[0][0] for pts in samples.values()), default=0.0)
    fig.set_size_inches(10, 3 + 2 * max(1, len(samples)))  # room for the faults' names
    axes = fig.subplots(max(1, len(samples)), 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(f"soak: {results['streams']} streams at {results['fps']:g} fps, a fault every "
                 f"{results['fault_every_min']:g} min (dotted: a fault ends)\nRSS slope after "
                 f"the warm-up (shaded), target < {results['target_mb_per_h']:g} MB/h")  # fmt: skip
    for ax, (name, pts) in zip(axes, samples.items(), strict=False):
        slope = results["rss"].get(name, {}).get("slope_mb_per_h", math.nan)
        ax.axvspan(0, results["warmup_s"] / 60, color="0.9")
        ax.plot([(t - t0) / 60 for t, _ in pts], [mb for _, mb in pts], lw=1)
        ax.set_ylabel("MB")
        ax.set_title(f"{name}: {slope:+.2f} MB/h", fontsize="medium", loc="left")
        for f in results["faults"]:
            ax.axvline(f["at_min"], color="tab:red", lw=0.6, ls=":")
    if results["faults"]:
        top = axes[0].secondary_xaxis("top")
        top.set_xticks([f["at_min"] for f in results["faults"]],
                       [f["name"] for f in results["faults"]], rotation=90, fontsize=6)  # fmt: skip
    axes[-1].set_xlabel("minutes")


if __name__ == "__main__":
    raise SystemExit(main())
