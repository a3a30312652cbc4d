"""Issue 28, holes 4 and 5, and ``job.sidecar``: one redaction (:mod:`framerelay.redact`)
for every view, checked as a table and as properties, then against the real services.

- Hole 4: a job whose input is ``https://alice:S3cretPW@host/x?X-Amz-Signature=abcd``; the
  orchestrator's ``GET /v1/jobs`` (and ``/v1/jobs/{id}``, ``/v1/streams``, ``/v1/fleet``,
  ``framerelay jobs status``, the ingest console's jobs panel, both services' logs) shows
  neither the password nor the signature, ``spec.inputs`` included.
- Hole 5: a camera ``rtsp://cam/x?user=admin&pwd=hunter2&token=t0k`` (and one on a port that
  refuses, so errors are logged); neither the ingest's ``GET /v1/streams``, the console's
  views, its ``/metrics`` nor its log output holds ``hunter2`` or ``t0k`` (nor the
  orchestrator's stream views).
- ``job.sidecar``: the ingest writes sidecars only under ``FRAMERELAY_INGEST_JOB_SIDECAR_DIRS``
  (a 422 through the real API for a path elsewhere, through a symbolic link, with ``..``,
  relative; none at all without the setting).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framerelay.auth import KeySet
from framerelay.redact import (
    MASK,
    SECRET_KEYS,
    SECRET_WORDS,
    redact_options,
    redact_text,
    redact_url,
    secret_key,
    secret_values,
)
from tests.conftest import REDIS_URL, TIMEOUT_FACTOR
from tests.security.procs import (
    Service,
    bearer,
    ready_line,
    redis_prefix,
    run_cli,
    spawn,
    wait_healthy,
)
from tests.support.auth import ed_keys, mint
from tests.support.ingest_api import client, running_ingest
from tests.support.servers import free_port
from tests.support.waiting import wait_until

JOB_INPUT = "https://alice:S3cretPW@host/x?X-Amz-Signature=abcd"
CAMERA = "rtsp://cam/x?user=admin&pwd=hunter2&token=t0k"
REFUSING = "rtsp://127.0.0.1:1/x?user=admin&pwd=hunter2&token=t0k"

# -- the function ------------------------------------------------------------------------

TABLE = [
    (JOB_INPUT, "https://***@host/x?X-Amz-Signature=***"),
    (CAMERA, "rtsp://cam/x?user=***&pwd=***&token=***"),
    ("rtsp://cam:554/s", "rtsp://cam:554/s"),
    ("/rec/cam-1/seg.mp4", "/rec/cam-1/seg.mp4"),
    ("rtsp://admin:pw@cam/s?channel=1&subtype=0", "rtsp://***@cam/s?channel=1&subtype=0"),
    ("rtsp://u:p@ss@cam/s", "rtsp://***@cam/s"),  # an unescaped '@' in the password
    ("rtsp://u:p?w@cam/s", "rtsp://***@cam/s"),  # a '?' in it
    ("https://ghp_tok3n@github.com/x", "https://***@github.com/x"),  # a token as the user
    ("http://cam/snap?PASSWORD=x&Pwd=y&TOKEN=z", "http://cam/snap?PASSWORD=***&Pwd=***&TOKEN=***"),
    (
        "http://cam/video.cgi?loginuse=admin&loginpas=p1",
        "http://cam/video.cgi?loginuse=***&loginpas=***",
    ),
    (
        "http://cam/v?api_key=a&apikey=b&key=c&access_token=d&auth=e&credentials=f&secret=g",
        "http://cam/v?api_key=***&apikey=***&key=***&access_token=***&auth=***&credentials=***"
        "&secret=***",
    ),
    (
        "https://b.s3.amazonaws.com/k.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIA/20260101/eu-west-1/s3/aws4_request&X-Amz-Date=20260101T000000Z"
        "&X-Amz-Security-Token=FwoG&X-Amz-Signature=9f86",
        "https://b.s3.amazonaws.com/k.mp4?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
        "&X-Amz-Date=20260101T000000Z&X-Amz-Security-Token=***&X-Amz-Signature=***",
    ),
    (
        "https://storage.googleapis.com/b/o?X-Goog-Credential=sa%2F2026&X-Goog-Signature=ab12"
        "&GoogleAccessId=sa@p.iam&Expires=1",
        "https://storage.googleapis.com/b/o?X-Goog-Credential=***&X-Goog-Signature=***"
        "&GoogleAccessId=***&Expires=1",
    ),
    (
        "https://d1.cloudfront.net/v.m3u8?Policy=eyJ&Signature=Zm9v&Key-Pair-Id=K2",
        "https://d1.cloudfront.net/v.m3u8?Policy=***&Signature=***&Key-Pair-Id=***",
    ),
    (
        "https://a.blob.core.windows.net/c/v.mp4?sv=2024-01-01&sp=r&se=2030-01-01&sig=AbC%2B",
        "https://a.blob.core.windows.net/c/v.mp4?sv=***&sp=***&se=***&sig=***",
    ),
    (
        "rtsp://cam/user=admin&password=pw9&channel=1&stream=0.sdp",  # some cameras' path style
        "rtsp://cam/user=***&password=***&channel=1&stream=0.sdp",
    ),
    ("http://cam/live;jsessionid=abc123/x.m3u8", "http://cam/live;jsessionid=***/x.m3u8"),
    ("http://cam/x?a=1;pwd=se;cret&b=2", "http://cam/x?a=1;pwd=***&b=2"),  # ';' inside a value
    ("http://cam/x?pwd=a=b&c", "http://cam/x?pwd=***&c"),
    ("http://cam/x?p%77d=hunter2", "http://cam/x?p%77d=***"),  # an encoded key
    ("https://app/cb#access_token=t0k3n&state=s", "https://app/cb#access_token=***&state=s"),
    ("http://cam/x?pwd=&channel=1", "http://cam/x?pwd=&channel=1"),  # nothing to hide
    ("", ""),
]


@pytest.mark.parametrize(("url", "shown"), TABLE)
def test_redact_url_masks_userinfo_and_secret_pairs(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # masked once is masked for good


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("X-Amz-Signature", True),
        ("x-goog-credential", True),
        ("Key-Pair-Id", True),
        ("passphrase", True),
        ("headers", True),
        ("cookies", True),
        ("decryption_key", True),
        ("SE", True),
        ("user", True),
        ("channel", False),
        ("subtype", False),
        ("fps", False),
        ("user_agent", False),
        ("rtsp_transport", False),
        ("X-Amz-Date", False),
        ("Expires", False),
    ],
)
def test_secret_key(name: str, secret: bool) -> None:
    assert secret_key(name) is secret


def test_options_text_and_values() -> None:
    assert redact_options({"headers": "Authorization: Basic x", "analyzeduration": "5"}) == {
        "headers": MASK,
        "analyzeduration": "5",
    }
    said = "cannot open 'rtsp://a:b@cam/x?token=abcd' (then http://h/p?sig=zz9#k=1)."
    assert (
        redact_text(said)
        == "cannot open 'rtsp://***@cam/x?token=***' (then http://h/p?sig=***#k=1)."
    )
    assert secret_values("rtsp://u:p%40ss@cam/x?token=t0k&sp=r&ch=1") == ["p%40ss", "p@ss", "t0k"]


KEYS = sorted(SECRET_KEYS) + [f"x-{w}-y" for w in SECRET_WORDS]
VALUE = st.text(st.characters(categories=["L", "N"], exclude_characters="&#/;"), min_size=1)
PLAIN = st.text(st.characters(categories=["Ll"], max_codepoint=127), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(KEYS).flatmap(lambda k: st.sampled_from([k, k.upper(), k.title()])),
    value=VALUE,
    before=st.lists(st.tuples(PLAIN, PLAIN), max_size=3),
    where=st.sampled_from(["?", "#", "/", ";"]),
    password=VALUE,
)
def test_no_secret_value_survives(
    key: str, value: str, before: list[tuple[str, str]], where: str, password: str
) -> None:
    """Any value of any documented key, in the query, fragment or path, and any password,
    is gone from the redacted URL and from a text quoting it; plain pairs are kept."""
    pairs = "&".join(f"q{k}={v}" for k, v in before)
    secret, pw = f"\x01{value}", f"\x02{password}"  # marked: never part of the rest
    url = f"rtsp://viewer:{pw}@cam:554/live{where}{pairs}{'&' if pairs else ''}{key}={secret}"
    shown = redact_url(url)
    assert secret not in shown and pw not in shown and f"{key}={MASK}" in shown
    assert all(f"q{k}={v}" in shown for k, v in before if not secret_key(f"q{k}"))
    assert redact_url(shown) == shown
    text = redact_text(f"open({url}): failed")
    assert secret not in text and pw not in text


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_is_redacted_without_failing(text: str) -> None:
    once = redact_url(text)
    assert redact_url(once) == once
    assert redact_text(redact_text(text)) == redact_text(text)


# -- the services ------------------------------------------------------------------------


@dataclass
class Seen:
    """Every body, log and metric the test read: ``where -> text``."""

    items: dict[str, str] = field(default_factory=dict)

    def add(self, where: str, text: str) -> str:
        self.items[where] = text
        return text

    def leaks(self, *secrets: str) -> list[str]:
        forms = {f for s in secrets for f in (s, quote(s, safe=""))}
        return [
            f"{f!r} in {where}: ...{text[max(0, text.find(f) - 80) : text.find(f) + 20]!r}"
            for where, text in self.items.items()
            for f in forms
            if f in text
        ]


@dataclass
class World:
    keys: KeySet
    tmp: Path
    orch: Service
    ingest: Service
    env: dict[str, str]
    seen: Seen = field(default_factory=Seen)

    def get(self, where: str, url: str, *scopes: str, aud: str = "orchestrator") -> Any:
        headers = bearer(mint(self.keys, scopes, aud)) if scopes else {}
        resp = httpx.get(url, headers=headers, timeout=20 * TIMEOUT_FACTOR)
        assert resp.status_code == 200, (where, resp.status_code, resp.text[:300])
        self.seen.add(where, resp.text)
        return resp.json() if "json" in resp.headers.get("content-type", "") else resp.text

    def post(self, url: str, body: dict[str, Any], scope: str, aud: str) -> httpx.Response:
        headers = bearer(mint(self.keys, [scope], aud))
        resp = httpx.post(url, json=body, headers=headers, timeout=20 * TIMEOUT_FACTOR)
        self.seen.add(f"POST {url} {body.get('id')}", resp.text)
        return resp

    def first_event(self, where: str, url: str) -> str:
        """The first server-sent event of a console view."""
        headers = bearer(mint(self.keys, ["streams:read"], "ingest"))
        text = ""
        with httpx.stream("GET", url, headers=headers, timeout=20 * TIMEOUT_FACTOR) as resp:
            assert resp.status_code == 200, where
            for chunk in resp.iter_text():
                text += chunk
                if "\n\n" in text:
                    break
        return self.seen.add(where, text)


def _orchestrator(keys_file: Path, tmp: Path, prefix: str) -> Service:
    env = {
        "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
        "FRAMERELAY_ORCH_KEY_PREFIX": prefix,
        "FRAMERELAY_ORCH_CA_DIR": str(tmp / "ca"),
        "FRAMERELAY_ORCH_TICK_S": "0.2",
        "FRAMERELAY_ORCH_TIERS": json.dumps([{"name": "ondemand", "max_workers": 0}]),
        "FRAMERELAY_ORCH_JOBS__OUTPUT_DIR": str(tmp / "out"),
        "FRAMERELAY_ORCH_JOBS__REDIS_PREFIX": prefix,
    }
    orch = spawn("orchestrator", ["orchestrator", "--port", "0"], env, tmp)
    wait_healthy(orch, ready_line(orch)["url"])
    return orch


def _ingest(keys_file: Path, tmp: Path, orch_url: str) -> Service:
    port = free_port()
    env = {
        "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
        "FRAMERELAY_INGEST_STORE_PATH": str(tmp / "streams.json"),
        "FRAMERELAY_INGEST_ORCHESTRATOR_URL": orch_url,
        "FRAMERELAY_INGEST_WORKER_ID": "w1",
    }
    args = ["ingest", "--api-port", str(port), "--worker-url", "ws://127.0.0.1:9/v1/tunnel"]
    ingest = spawn("ingest", args, env, tmp)
    wait_healthy(ingest, f"http://127.0.0.1:{port}")
    return ingest


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp, keys = tmp_path_factory.mktemp("redaction"), ed_keys()
    keys_file = tmp / "signing.jwks"
    keys_file.write_text(keys.to_json())
    keys_file.chmod(0o600)
    started: list[Service] = []
    with redis_prefix("redaction") as prefix:
        try:
            started.append(_orchestrator(keys_file, tmp, prefix))
            started.append(_ingest(keys_file, tmp, started[0].url))
            env = {
                "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
                "FRAMERELAY_ORCH_URL": started[0].url,
            }
            yield World(keys, tmp, started[0], started[1], env)
        finally:
            for svc in reversed(started):
                svc.stop()


def _task_stream(w: World) -> bool:
    streams = w.get("orchestrator streams", f"{w.orch.url}/v1/streams", "fleet:read")
    return any(s["id"] == "job-leak-4-0" for s in streams)


def _jobs_panel(w: World) -> dict[str, Any] | None:
    """The ingest console's jobs panel once it shows a job."""
    panel = w.get("console jobs", f"{w.ingest.url}/v1/console/jobs", "streams:read", aud="ingest")
    return dict(panel) if panel["jobs"] else None


@pytest.mark.integration
def test_hole_4_job_inputs_are_redacted_in_every_view(world: World) -> None:
    w, orch = world, world.orch.url
    job = {"id": "leak-4", "inputs": [JOB_INPUT], "max_parallel": 1}
    submitted = w.post(f"{orch}/v1/jobs", job, "jobs:write", "orchestrator")
    assert submitted.status_code == 201, submitted.text
    wait_until(lambda: _task_stream(w), 30, "the job's task stream", every_s=0.2)
    jobs = w.get("GET /v1/jobs", f"{orch}/v1/jobs", "jobs:read")
    (mine,) = [j for j in jobs if j["id"] == "leak-4"]
    assert mine["spec"]["inputs"] == mine["inputs"] == ["https://***@host/x?X-Amz-Signature=***"]
    w.get("GET /v1/jobs/leak-4", f"{orch}/v1/jobs/leak-4", "jobs:read")
    w.get("GET /v1/fleet", f"{orch}/v1/fleet", "fleet:read")
    panel = wait_until(lambda: _jobs_panel(w), 30, "the console's jobs panel", every_s=0.2)
    assert [j["id"] for j in panel["jobs"]] == ["leak-4"]
    cli = run_cli(["jobs", "status", "leak-4"], w.env)
    assert cli.returncode == 0, cli.stderr
    w.seen.add("framerelay jobs status", cli.stdout + cli.stderr)
    w.seen.add("orchestrator log", w.orch.output())
    leaks = w.seen.leaks("S3cretPW", "abcd")
    assert not leaks, "\n".join(leaks)


def _refusal_logged(w: World) -> bool:
    streams = w.get("ingest streams", f"{w.ingest.url}/v1/streams", "streams:read", aud="ingest")
    errors = {s["id"]: s["last_error"] for s in streams}
    return bool(errors.get("cam-5b")) and "cannot open" in w.ingest.output()


@pytest.mark.integration
def test_hole_5_camera_query_secrets_are_redacted_in_every_view(world: World) -> None:
    w, ingest, orch = world, world.ingest.url, world.orch.url
    for sid, url in (("cam-5a", CAMERA), ("cam-5b", REFUSING)):
        added = w.post(
            f"{ingest}/v1/streams",
            {"id": sid, "url": url, "open_timeout_s": 2},
            "streams:write",
            "ingest",
        )
        assert added.status_code == 201, added.text
    bad = w.post(
        f"{ingest}/v1/streams",
        {"id": "cam-5c", "url": CAMERA, "fps": -1},
        "streams:write",
        "ingest",
    )
    assert bad.status_code == 422
    on_orch = w.post(
        f"{orch}/v1/streams", {"id": "cam-5a", "url": CAMERA}, "fleet:write", "orchestrator"
    )
    assert on_orch.status_code == 201, on_orch.text
    wait_until(lambda: _refusal_logged(w), 30, "the refused camera's error", every_s=0.2)
    listed = w.get("ingest streams", f"{ingest}/v1/streams", "streams:read", aud="ingest")
    assert {s["id"]: s["source"] for s in listed}["cam-5a"] == redact_url(CAMERA)
    one = w.get("ingest cam-5a", f"{ingest}/v1/streams/cam-5a", "streams:read", aud="ingest")
    assert one["config"]["url"] == "rtsp://cam/x?user=***&pwd=***&token=***"
    w.get("ingest cam-5b", f"{ingest}/v1/streams/cam-5b", "streams:read", aud="ingest")
    table = w.first_event("console streams", f"{ingest}/v1/console/streams")
    assert "cam-5a" in table and "pwd=***" in table
    w.get("console page", f"{ingest}/console")
    w.get("ingest metrics", f"{ingest}/metrics")
    w.get("orchestrator streams", f"{orch}/v1/streams", "fleet:read")
    w.get("orchestrator fleet", f"{orch}/v1/fleet", "fleet:read")
    w.get("orchestrator metrics", f"{orch}/metrics")
    w.seen.add("ingest log", w.ingest.output())
    w.seen.add("orchestrator log", w.orch.output())
    leaks = w.seen.leaks("hunter2", "t0k")
    assert not leaks, "\n".join(leaks)
    assert "cam-5b" in w.seen.items["ingest log"]  # its errors were logged, redacted


# -- job.sidecar -------------------------------------------------------------------------


def _task(sidecar: str, clip: Path, sid: str = "job-side-0") -> dict[str, Any]:
    return {
        "id": sid,
        "url": str(clip),
        "fps": 0,
        "realtime": False,
        "job": {"job_id": "side", "index": 0, "sidecar": sidecar},
    }


@pytest.mark.integration
async def test_job_sidecars_are_written_only_under_the_configured_dirs(tmp_path: Path) -> None:
    allowed, elsewhere, clip = tmp_path / "sidecars", tmp_path / "elsewhere", tmp_path / "a.mp4"
    allowed.mkdir()
    elsewhere.mkdir()
    (allowed / "link").symlink_to(elsewhere)
    refused = {
        "outside": str(elsewhere / "a.jsonl"),
        "through a link": str(allowed / "link" / "a.jsonl"),
        "dot-dot": f"{allowed}/../elsewhere/a.jsonl",
        "relative": "sidecars/a.jsonl",
    }
    keys = ed_keys()

    out: dict[str, httpx.Response] = {}
    with redis_prefix("sidecar") as prefix:
        over = {"redis_url": REDIS_URL, "results": {"redis_prefix": prefix}}
        async with running_ingest(keys, tmp_path, job_sidecar_dirs=(allowed,), **over) as ing:
            async with client(ing, headers=ing.auth()) as http:
                for name, path in refused.items():
                    out[name] = await http.post("/v1/streams", json=_task(path, clip))
                await http.post("/v1/streams", json={"id": "cam", "url": str(clip)})
                out["update"] = await http.put(
                    "/v1/streams/cam", json=_task(refused["outside"], clip, "cam")
                )
                worker = {
                    "worker_id": "w1",
                    "url": "ws://127.0.0.1:9/v1/tunnel",
                    "stream": _task(refused["outside"], clip, "job-side-1"),
                }
                out["placed"] = await http.put("/v1/streams/job-side-1/worker", json=worker)
                out["inside"] = await http.post(
                    "/v1/streams", json=_task(str(allowed / "night" / "a.jsonl"), clip)
                )
                out["kept"] = await http.get("/v1/streams/cam")
        (tmp_path / "none").mkdir()
        async with running_ingest(keys, tmp_path / "none", **over) as ing:
            async with client(ing, headers=ing.auth()) as http:
                inside = str(allowed / "b.jsonl")
                out["no dirs"] = await http.post("/v1/streams", json=_task(inside, clip))
    for name in (*refused, "update", "placed"):
        assert out[name].status_code == 422, (name, out[name].text)
    assert "outside FRAMERELAY_INGEST_JOB_SIDECAR_DIRS" in out["outside"].text
    assert "outside FRAMERELAY_INGEST_JOB_SIDECAR_DIRS" in out["through a link"].text
    assert "without '..'" in out["dot-dot"].text and "absolute" in out["relative"].text
    assert "outside" in out["update"].text and "outside" in out["placed"].text
    assert str(elsewhere) not in out["outside"].text  # the path is not echoed
    assert out["kept"].json()["config"]["job"] is None  # the refused update was not stored
    assert out["inside"].status_code == 201, out["inside"].text
    assert out["no dirs"].status_code == 422
    assert "no job sidecars: set FRAMERELAY_INGEST_JOB_SIDECAR_DIRS" in out["no dirs"].text
    assert os.listdir(elsewhere) == []  # nothing was created outside
