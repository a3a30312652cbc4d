"""One verb set everywhere (list/add/remove/show; old names kept as aliases), and the
``streams add ID URL --url ORCH`` regression: the camera URL and the orchestrator's
address once shared one argparse destination (real orchestrator, real CLI processes)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from redis import Redis

from framerelay.cli import build_parser
from tests.conftest import ROOT, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.cli_runs import Run, clean_env, run_all

pytestmark = pytest.mark.integration
SECRET = "cli-verbs-secret-cli-verbs-secret-0123456789"


@pytest.fixture(scope="module")
def orch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real orchestrator (local provider, no pods) on a private Redis key prefix."""
    tmp = tmp_path_factory.mktemp("orch")
    prefix = f"test-verbs-{os.getpid()}-{time.monotonic_ns()}:"
    env = clean_env(
        FRAMERELAY_TOKEN_SECRETS=SECRET, FRAMERELAY_ORCH_KEY_PREFIX=prefix,
        FRAMERELAY_ORCH_CA_DIR=str(tmp / "ca"), FRAMERELAY_ORCH_TICK_S="0.2",
        FRAMERELAY_ORCH_TIERS=json.dumps([{"name": "ondemand", "max_workers": 0}]),
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "framerelay", "orchestrator", "--port", "0"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        yield json.loads(proc.stdout.readline())["url"]
    finally:
        proc.terminate()
        proc.communicate(timeout=20 * TIMEOUT_FACTOR)
        redis = Redis()
        for key in redis.scan_iter(match=prefix + "*"):
            redis.delete(key)
        redis.close()


def _cli(url: str, *calls: list[str]) -> list[Run]:
    env = clean_env(FRAMERELAY_TOKEN_SECRETS=SECRET, FRAMERELAY_ORCH_URL=url)
    return run_all([(argv, env) for argv in calls])


def _streams(url: str) -> dict[str, dict[str, object]]:
    auth = {"Authorization": f"Bearer {mint(SECRET, ['fleet:read'], 'orchestrator')}"}
    return {s["id"]: s for s in httpx.get(f"{url}/v1/streams", headers=auth).json()}


def test_streams_add_keeps_the_camera_url_apart_from_url(orch: str) -> None:
    """The issue's command: it failed with "cannot reach the orchestrator at rtsp://..."."""
    after, before = run_all(
        [(["streams", "add", "cam-1", "rtsp://cam/stream", "--fps", "5", "--url", orch],
          clean_env(FRAMERELAY_TOKEN_SECRETS=SECRET)),
         (["streams", "--log-level", "warning", "add", "--url", orch, "cam-2", "rtsp://cam/2"],
          clean_env(FRAMERELAY_TOKEN_SECRETS=SECRET))],
    )  # fmt: skip
    assert after.rc == 0 and "added cam-1" in after.stdout, after.stderr
    assert before.rc == 0 and "added cam-2" in before.stdout, before.stderr
    streams = _streams(orch)
    assert streams["cam-1"]["url"] == "rtsp://cam/stream" and streams["cam-1"]["fps"] == 5
    assert streams["cam-2"]["url"] == "rtsp://cam/2"


def test_list_show_remove_and_their_old_names(orch: str) -> None:
    added = _cli(orch, ["streams", "add", "cam-v", "rtsp://cam/v"])[0]
    assert added.rc == 0, added.stderr
    ls, ls_old, show, show_none, fleet, fleet_old, pods, pods_old, pod_none = _cli(
        orch, ["streams", "list"], ["streams", "ls"], ["streams", "show", "cam-v"],
        ["streams", "show", "nope"], ["fleet", "show"], ["fleet", "status"],
        ["pods", "list"], ["pods", "ls"], ["pods", "show", "nope"],
    )  # fmt: skip
    assert ls.rc == 0 and "cam-v" in ls.stdout and ls.stdout == ls_old.stdout, ls.stderr
    assert show.rc == 0 and "url: rtsp://cam/v" in show.stdout, show.stderr
    for missing, what in ((show_none, "no stream 'nope'"), (pod_none, "no pod 'nope'")):
        (line,) = missing.stderr.strip().splitlines()
        assert missing.rc == 2 and what in line
    assert fleet.rc == 0 and "TIER" in fleet.stdout and fleet_old.rc == 0, fleet.stderr
    assert pods.rc == 0 and pods.stdout.startswith("POD") and pods_old.rc == 0, pods.stderr
    tier, tier_old, removed = _cli(
        orch, ["pods", "add", "--tier", "nope"], ["pods", "create", "--tier", "nope"],
        ["streams", "remove", "cam-v"],
    )  # fmt: skip
    for refused in (tier, tier_old):
        assert refused.rc == 2 and "no tier 'nope'" in refused.stderr
    assert removed.rc == 0 and "removed cam-v" in removed.stdout, removed.stderr
    (again,) = _cli(orch, ["streams", "rm", "cam-v"])  # the old name: the same verb
    assert again.rc == 2 and "no stream 'cam-v'" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert "cam-v" not in _streams(orch)


def _verbs(parser: argparse.ArgumentParser, command: str) -> dict[str, argparse.ArgumentParser]:
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = top.choices[command]
    verbs = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
    return dict(verbs.choices)


@pytest.mark.parametrize(
    ("command", "verbs", "aliases"),
    [
        ("streams", {"list", "add", "remove", "show", "move"}, {"ls": "list", "rm": "remove"}),
        ("pods", {"list", "add", "remove", "show"},
         {"ls": "list", "create": "add", "terminate": "remove", "rm": "remove"}),
        ("fleet", {"show"}, {"status": "show"}),
        ("keys", {"list", "add", "remove", "generate", "public"}, {"ls": "list", "rm": "remove"}),
        ("model", {"show", "export"}, {"info": "show"}),
    ],
)  # fmt: skip
def test_one_verb_set_with_the_old_names_as_aliases(
    command: str, verbs: set[str], aliases: dict[str, str]
) -> None:
    choices = _verbs(build_parser(), command)
    assert verbs | set(aliases) == set(choices)
    for old, new in aliases.items():
        assert choices[old] is choices[new]


def test_help_names_the_camera_url_and_the_orchestrator_apart() -> None:
    (run,) = run_all([(["streams", "add", "--help"], clean_env())])
    assert run.rc == 0 and "id URL" in run.stdout and "--url URL" in run.stdout, run.stderr
    assert "--log-level" in run.stdout and "--log-format" in run.stdout


def test_streams_add_takes_a_streams_own_tracker_times(orch: str) -> None:
    """Issue 16: --max-lost-s / --max-gap-s reach the orchestrator's stream definition (which
    passes them to the ingest, and the ingest in the stream's OPEN); a bad value is one line."""
    good, bad = _cli(
        orch,
        ["streams", "add", "cam-t", "rtsp://cam/t", "--max-lost-s", "2.5", "--max-gap-s", "20"],
        ["streams", "add", "cam-u", "rtsp://cam/u", "--max-gap-s", "600"],
    )
    assert good.rc == 0, good.stderr
    assert _streams(orch)["cam-t"]["tracker_settings"] == {
        "max_lost_s": 2.5, "max_gap_s": 20.0, "tentative_max_gap_s": None,
        "direction_window_s": None,
    }  # fmt: skip
    assert bad.rc != 0 and "Traceback" not in bad.stderr
    assert "max_gap_s" in bad.stderr and "less than or equal to 60" in bad.stderr
