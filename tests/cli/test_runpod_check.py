"""``framerelay runpod check`` as a user runs it: real CLI processes against RunPod's
schema-checked v2 contract server (:mod:`bench.rig.runpod_v2_contract`), the key from a
file or the environment, never from the command line; docs/runpod.md's block as written.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from framerelay.cli import build_parser
from framerelay.commands.runpod import _explain, _Watch
from tests.conftest import ROOT
from tests.support.cli_runs import Run, clean_env, run_all
from tests.support.servers import free_port

pytestmark = pytest.mark.integration
KEY = "rpa_" + "Ch3ckK3yN0tF0rArgv" * 2
KEY_ENV = "FRAMERELAY_ORCH_RUNPOD__API_KEY"
KEY_FILE_ENV = f"{KEY_ENV}_FILE"
URL_ENV = "FRAMERELAY_ORCH_RUNPOD__BASE_URL"
DOC = ROOT / "docs" / "runpod.md"
ENDPOINT = {
    "image": "framerelay/worker:0.1.0",
    "type": "QUEUE",
    "gpu": {"pools": ["AMPERE_16"]},
    "workers": {"min": 0, "max": 2},
    "scaling": {"type": "QUEUE_DELAY", "queueDelay": 4},
}


@dataclass
class Api:
    server: ContractServer
    url: str
    key_file: Path


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """The contract server with a network volume, this fleet's endpoint and another one,
    and the L4 sold out on the community cloud; its exchanges checked at the end."""
    server = ContractServer(KEY)
    server.knobs.no_stock.add(("NVIDIA L4", "COMMUNITY"))
    key_file = tmp_path / "runpod.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    with running_runpod_v2(server) as url:
        made = [
            _post(
                url, "/network-volumes", {"name": "fr-cache", "size": 50, "dataCenter": "EU-RO-1"}
            ),
            _post(url, "/serverless", {**ENDPOINT, "name": "fr-jobs"}),
            _post(url, "/serverless", {**ENDPOINT, "name": "someone-else"}),
        ]
        assert all(resp.status_code == 201 for resp in made), [r.text for r in made]
        yield Api(server, url, key_file)
    assert server.violations == []
    assert server.client_errors == []
    assert not server.key_in_url


def _post(url: str, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"})


def _doc_commands() -> tuple[dict[str, str], list[list[str]]]:
    """docs/runpod.md's check block: its exported variables and its commands' arguments."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## First: check your key and what RunPod offers", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    exported: dict[str, str] = {}
    commands: list[list[str]] = []
    for line in block.strip().splitlines():
        words = shlex.split(line)
        if words[0] == "export":
            name, value = words[1].split("=", 1)
            exported[name] = value
        else:
            assert words[0] == "framerelay", line
            commands.append(words[1:])
    return exported, commands


def _one_line(run: Run, code: int, *words: str) -> str:
    assert "Traceback" not in run.stderr, run.stderr[-1500:]
    lines = run.stderr.strip().splitlines()
    assert run.rc == code and len(lines) == 1 and run.stdout == "", (run.rc, run)
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert KEY not in lines[0]
    return lines[0]


def test_the_documented_check_prints_the_catalog_with_the_key_from_a_file(api: Api) -> None:
    exported, commands = _doc_commands()
    assert list(exported) == [KEY_FILE_ENV] and commands == [
        ["runpod", "check"],
        ["runpod", "check", "--json"],
    ]
    env = clean_env(**{KEY_FILE_ENV: str(api.key_file), URL_ENV: api.url})
    assert KEY_ENV not in env
    text, as_json = run_all([(args, env) for args in commands])
    for run in (text, as_json):
        assert run.rc == 0 and run.stderr == "", run
        assert KEY not in run.stdout
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"RunPod API key works: {api.url} answered every read")
    assert f"{KEY_FILE_ENV} ({api.key_file})" in lines[0]
    rows = {line.split("  ")[0]: line.split() for line in lines if line.startswith("NVIDIA")}
    assert rows["NVIDIA L4"][2:9] == ["24", "HIGH", "NONE", "0.43", "0.30", "0.69", "12.8"]
    assert rows["NVIDIA RTX A4000"][3:6] == ["16", "HIGH", "HIGH"]
    assert any(line.split()[:2] == ["EU-RO-1", "Romania"] for line in lines)
    assert any("fr-cache" in line and "EU-RO-1" in line for line in lines)
    assert "fr-jobs" in text.stdout and "someone-else" not in text.stdout
    assert "1 other endpoint(s)" in text.stdout
    read = json.loads(as_json.stdout)
    l4 = next(g for g in read["gpus"] if g["id"] == "NVIDIA L4")
    assert l4["stock"] == {"SECURE": "HIGH", "COMMUNITY": "NONE"}
    assert [e["name"] for e in read["endpoints"]] == ["fr-jobs"]
    assert "env" not in read["endpoints"][0]
    _only_reads(api.server)


def _only_reads(server: ContractServer) -> None:
    """Besides the fixture's three creates, the check sent GETs only, the catalog one
    per cloud and scoped like the provider's (one GPU, the CUDA floor)."""
    sent = [(e.method, e.template) for e in server.exchanges]
    assert [s for s in sent if s[0] != "GET"] == [
        ("POST", "/v2/network-volumes"),
        ("POST", "/v2/serverless"),
        ("POST", "/v2/serverless"),
    ]
    catalog = server.requests("GET", "/v2/catalog/gpus")
    assert len(catalog) == 4  # two runs, two clouds each
    for read in catalog:
        assert sorted(read.query_names) == [
            "cloud",
            "count",
            "include",
            "minCudaVersion",
            "product",
        ]


def test_the_key_from_the_environment_and_a_fleet_prefix(api: Api) -> None:
    env = clean_env(**{KEY_ENV: KEY, URL_ENV: api.url, "FRAMERELAY_ORCH_FLEET": "other"})
    (run,) = run_all([(["runpod", "check"], env)])
    assert run.rc == 0 and run.stderr == "", run
    assert f"(key from {KEY_ENV})" in run.stdout.splitlines()[0]
    assert "fleet 'other' (named other-...): 0 (2 other endpoint(s)" in run.stdout
    assert "fr-jobs" not in run.stdout


def test_a_refused_key_no_network_or_no_key_is_one_line(api: Api, tmp_path: Path) -> None:
    bad = "rpa_" + "Wr0ngK3yN0tPr1nt3d" * 2
    bad_file = tmp_path / "bad.key"
    bad_file.write_text(bad)
    closed = f"http://127.0.0.1:{free_port()}/v2"
    cases = [
        (["runpod", "check"], clean_env(**{KEY_ENV: bad, URL_ENV: api.url})),
        (["runpod", "check"], clean_env(**{KEY_FILE_ENV: str(bad_file), URL_ENV: api.url})),
        (["runpod", "check", "--json"], clean_env(**{KEY_ENV: KEY, URL_ENV: closed})),
        (["runpod", "check"], clean_env(**{URL_ENV: api.url})),
        (["runpod", "check"], clean_env(**{KEY_ENV: KEY, URL_ENV: "https://rest.runpod.io/v1"})),
    ]
    by_env, by_file, no_network, no_key, v1 = run_all(cases)
    for run in (by_env, by_file):
        line = _one_line(run, 1, "refused the API key (HTTP 401)", api.url)
        assert bad not in line
    assert f"check the key in {KEY_ENV};" in by_env.stderr
    assert f"check the key in {KEY_FILE_ENV} ({bad_file})" in by_file.stderr
    _one_line(no_network, 1, f"cannot reach RunPod's API at {closed}", "check the network")
    _one_line(no_key, 2, "no RunPod API key", KEY_FILE_ENV, KEY_ENV)
    _one_line(v1, 2, "v1 was retired", URL_ENV)
    assert len(api.server.requests("GET", "/v2/catalog/gpus")) == 2  # one per bad-key run


def _sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = action.choices[name]
    return found


def test_the_key_has_no_place_on_the_command_line() -> None:
    check = _sub(_sub(build_parser(), "runpod"), "check")
    options = sorted(o for a in check._actions for o in a.option_strings)
    assert options == ["--help", "--json", "--log-format", "--log-level", "-h"]
    assert not any(a.option_strings == [] for a in check._actions)  # no positional either
    (run,) = run_all([(["runpod", "check", "--api-key", "x"], clean_env())])
    assert run.rc == 2 and "unrecognized arguments" in run.stderr


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (401, ("HTTP 401", "check the key in", "mistyped")),
        (403, ("HTTP 403", "for GET /v2/network-volumes", "read access")),
        (500, ("RunPod GET /network-volumes failed",)),
    ],
)
def test_each_refusal_is_explained(status: int, words: tuple[str, ...]) -> None:
    from deploy.providers.base import ProviderError
    from deploy.settings import RunPodSettings

    watch = _Watch()
    watch.request, watch.status = "GET /v2/network-volumes", status
    said = _explain(ProviderError("RunPod GET /network-volumes failed"), watch, RunPodSettings())
    assert all(word in said for word in words), said
    assert "https://api.runpod.io/v2" in said or status == 500
