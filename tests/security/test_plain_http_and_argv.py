"""Issue 28's smaller holes: bearer tokens never go over plain ``http://`` to another host,
and a Redis password never goes on a command line.

* the orchestrator refused nothing when its ingest was ``http://`` on another host (it
  warned), so its tokens crossed the network in clear;
* the fleet CLI sent bearer tokens over ``http://`` to any host;
* the RunPod base URL (the API key goes in every request) could be ``http://``;
* ``framerelay orchestrator --redis-url redis://:password@...`` put the password where
  every user of the host can read it (``ps``), and ``redis_url`` was a plain string.

Each refusal is decided before any connection: the hosts named here are never dialled
(nothing in them resolves or listens), and the CLI runs as a subprocess.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deploy.settings import OrchestratorSettings, RunPodSettings
from tests.security.procs import run_cli

REMOTE = "http://orchestrator.invalid:8090"  # .invalid never resolves (RFC 2606)
PASSWORD = "S3cretRedisPw"


@pytest.mark.parametrize(
    "ingest_url",
    ["http://ingest.invalid:8080", "https://ingest-a.invalid, http://10.1.2.3:8080"],
)
def test_the_orchestrator_refuses_plain_http_to_a_remote_ingest(ingest_url: str) -> None:
    with pytest.raises(ValidationError, match="refusing plain http://") as refused:
        OrchestratorSettings(ingest_url=ingest_url)
    assert "ALLOW_INSECURE_INGEST" in str(refused.value)
    OrchestratorSettings(ingest_url=ingest_url, allow_insecure_ingest=True)  # said out loud


@pytest.mark.parametrize(
    "ingest_url", ["http://127.0.0.1:8080", "http://localhost:8080", "https://ingest.invalid"]
)
def test_loopback_and_https_ingests_are_fine(ingest_url: str) -> None:
    assert OrchestratorSettings(ingest_url=ingest_url).ingest_url == ingest_url


def test_runpod_takes_its_api_key_over_https_only() -> None:
    with pytest.raises(ValidationError, match="refusing plain http://"):
        RunPodSettings(base_url="http://api.runpod.invalid/v2")
    with pytest.raises(ValidationError, match="https://"):
        RunPodSettings(base_url="ftp://api.runpod.invalid/v2")
    assert RunPodSettings(base_url="http://127.0.0.1:9/v2").base_url  # a contract server


@pytest.mark.parametrize("verb", [["fleet", "status"], ["pods", "list"], ["jobs", "list"]])
def test_the_fleet_cli_sends_no_token_over_plain_http_to_another_host(verb: list[str]) -> None:
    done = run_cli([*verb, "--url", REMOTE], {"FRAMERELAY_TOKEN": "eyJ.not-sent.x"})
    assert done.returncode != 0
    err = done.stderr.strip()
    assert "refusing plain http:// to the orchestrator" in err and len(err.splitlines()) == 1
    assert "Traceback" not in err and "not-sent" not in err


def test_a_redis_password_on_the_command_line_is_refused_unread() -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:1/0"
    done = run_cli(["orchestrator", "--port", "0", "--redis-url", url], {}, timeout_s=60)
    assert done.returncode != 0
    err = done.stderr.strip()
    assert "FRAMERELAY_ORCH_REDIS_URL" in err and len(err.splitlines()) == 1
    assert PASSWORD not in done.stderr + done.stdout


def test_the_redis_url_is_a_secret_in_the_orchestrator_settings() -> None:
    settings = OrchestratorSettings(redis_url=f"redis://:{PASSWORD}@127.0.0.1:6379/0")
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings.model_dump())
    with pytest.raises(ValidationError) as bad:
        OrchestratorSettings(redis_url=f"redis://:{PASSWORD}@127.0.0.1:notaport/0")
    assert PASSWORD not in str(bad.value)
