"""Issue 15: deploy/grafana/framerelay.json names only metrics that exist, in valid PromQL.

Real processes, as in test_promtool: the session's worker, ``framerelay
ingest`` on the sample clip with ``--latency-slo-ms`` (so the SLO series
exist) and a subscriber that received results, and ``framerelay
orchestrator``. Every metric name in the dashboard's expressions must be in
one of their ``/metrics`` (a sample, or a ``# TYPE`` line for a family that
has no sample yet). The GPU gauges appear only where NVML sees a GPU: on a
machine without one they are taken from the worker's own metrics code
(:class:`gpu_worker.metrics.WorkerMetrics`) fed one GPU's readings instead of
NVML's. Every expression, with Grafana's variables filled in, must pass
``promtool check rules``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from framerelay.launcher import LocalWorker
from gpu_worker.gpu_stats import GpuStats, GpuStatus
from gpu_worker.metrics import WorkerMetrics
from tests.conftest import ROOT
from tests.support.service_processes import running_ingest

# sync tests on an async fixture: anyio sets it up only where anyio_backend is requested
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("anyio_backend")]
DASHBOARD = ROOT / "deploy" / "grafana" / "framerelay.json"
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$stream": ".*"}
"""What Grafana puts in place of its variables (promtool knows none of them)."""
METRIC = re.compile(r"\bframerelay_[a-z0-9_]+\b")
ONE_GPU = GpuStatus(available=True, gpus=[GpuStats(
    index=0, name="NVIDIA H200", uuid="GPU-0", utilization_pct=50.0, memory_used_bytes=1,
    memory_total_bytes=2, temperature_c=40.0, power_w=100.0, power_limit_w=700.0,
)])  # fmt: skip


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def expressions(dash: dict[str, Any]) -> list[str]:
    """Every target expression of every panel (rows' nested panels included)."""
    panels = list(dash["panels"])
    for p in dash["panels"]:
        panels += p.get("panels", [])
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def filled(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not fill: {expr}"
    return expr


def exposed(text: str) -> set[str]:
    """The metric names of an exposition: sample names and declared families."""
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    names |= {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
              if line and not line.startswith("#")}  # fmt: skip
    return names


@pytest.fixture(scope="module")
async def ingest_with_slo(
    local_worker: LocalWorker, secret: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    folder = tmp_path_factory.mktemp("ingest")
    async with running_ingest(local_worker.url, secret, folder, "grafana", "--latency-slo-ms",
                        "50") as base:  # fmt: skip
        yield base


def test_the_dashboard_is_importable() -> None:
    dash = dashboard()
    assert dash["schemaVersion"] >= 36 and dash["title"] and dash["uid"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["stream"]["type"] == "query" and variables["stream"]["includeAll"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = expressions(dash)
    assert len(exprs) >= 30 and all('stream=~"$stream"' in e for e in exprs
                                    if "framerelay_ingest_stream_" in e)  # fmt: skip


def test_every_expression_is_valid_promql(tmp_path: Path) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool not found: run scripts/services.sh (Debian package prometheus)")
    rules = {"groups": [{"name": "grafana-dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": filled(e)}
        for i, e in enumerate(expressions(dashboard()))
    ]}]}  # fmt: skip
    path = tmp_path / "rules.json"  # YAML is a superset of JSON: promtool reads it
    path.write_text(json.dumps(rules))
    done = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_metric_it_names_exists(
    local_worker: LocalWorker,
    ingest_with_slo: str,
    orchestrator: str,
) -> None:
    worker = local_worker.url.replace("ws://", "http://").removesuffix("/v1/tunnel")
    texts = {
        "ingest": httpx.get(f"{ingest_with_slo}/metrics").text,
        "worker": httpx.get(f"{worker}/metrics").text,
        "orchestrator": httpx.get(f"{orchestrator}/metrics").text,
    }
    real = set().union(*(exposed(t) for t in texts.values()))
    if not any(n.startswith("framerelay_worker_gpu_") for n in real):  # no GPU here
        real |= exposed(WorkerMetrics(gpus=lambda: ONE_GPU).render().decode())
    named = {m for e in expressions(dashboard()) for m in METRIC.findall(e)}
    assert named - real == set(), f"the dashboard names metrics no service exports: {named - real}"
    for must in ("framerelay_ingest_result_latency_seconds_bucket",
                 "framerelay_ingest_slo_breaches_total", "framerelay_ingest_latency_slo_seconds",
                 "framerelay_orch_cost_per_stream_hour_usd",
                 "framerelay_worker_gpu_utilization_ratio"):  # fmt: skip
        assert must in named
    slo = 'framerelay_ingest_latency_slo_seconds{stream="stream-1"} 0.05'
    assert slo in texts["ingest"]
