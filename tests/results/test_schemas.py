"""Acceptance 5: the checked-in JSON Schema / AsyncAPI documents follow the models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, create_model

from framerelay import schemas
from framerelay.schemas import (
    ErrorMessage,
    NoticeMessage,
    ResultMessage,
    SubscribedMessage,
    Subscription,
)


def test_checked_in_documents_match_the_models() -> None:
    problems = schemas.check()
    assert problems == [], "\n".join(problems) + "\nrun: python -m framerelay.schemas --write"


def _swap_notice(monkeypatch: pytest.MonkeyPatch, model: type[BaseModel]) -> None:
    messages = (SubscribedMessage, ResultMessage, model, ErrorMessage)
    monkeypatch.setattr(schemas, "_MESSAGES", messages)


def test_an_added_field_is_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    grown = create_model("NoticeMessage", __base__=NoticeMessage, severity=(int, 0))
    grown.__doc__ = NoticeMessage.__doc__
    _swap_notice(monkeypatch, grown)
    problems = schemas.check()
    assert any("asyncapi.json differs" in p for p in problems)
    assert any("messages.schema.json differs" in p for p in problems)
    assert not any("breaking" in p for p in problems)  # additive: fine after regenerating


def _without(model: type[BaseModel], field: str) -> dict[str, Any]:
    return {n: (f.annotation, f) for n, f in model.model_fields.items() if n != field}


def test_a_removed_or_retyped_field_is_a_breaking_change(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = _without(NoticeMessage, "stream_id")
    fields["dropped"] = (str, "0")
    shrunk = create_model("NoticeMessage", __doc__=NoticeMessage.__doc__, **fields)
    _swap_notice(monkeypatch, shrunk)
    problems = schemas.check()
    assert any("NoticeMessage.stream_id was removed" in p for p in problems)
    assert any("NoticeMessage.dropped changed type" in p for p in problems)
    assert all("bump SCHEMA_VERSION" in p for p in problems if "breaking" in p)


def test_refusing_unknown_fields_is_a_breaking_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers ignore fields they do not know; a model that starts refusing them breaks
    every peer that is one additive change ahead (issue 12)."""
    strict = create_model("NoticeMessage", __base__=NoticeMessage)
    strict.model_config = {**NoticeMessage.model_config, "extra": "forbid"}
    strict.model_rebuild(force=True)
    strict.__doc__ = NoticeMessage.__doc__
    _swap_notice(monkeypatch, strict)
    problems = schemas.check()
    assert any("NoticeMessage now refuses unknown fields" in p for p in problems), problems


def test_the_cli_regenerates_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1  # nothing there yet
    assert schemas.main(["--write", "--dir", str(tmp_path)]) == 0
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 0
    grown = create_model("NoticeMessage", __base__=NoticeMessage, severity=(int, 0))
    _swap_notice(monkeypatch, grown)
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1


def test_asyncapi_document_shape() -> None:
    doc = json.loads((schemas.SCHEMA_DIR / "asyncapi.json").read_text())
    assert doc["asyncapi"].startswith("3.") and doc["info"]["version"] == "1"
    channel = doc["channels"]["results"]
    assert channel["address"] == "/v1/results"
    assert set(channel["messages"]) == {"subscribed", "result", "notice", "error"}
    assert set(channel["bindings"]["ws"]["query"]["properties"]) == {
        "stream", "class", "min_confidence", "resume",
    }  # fmt: skip
    for ref in channel["messages"].values():
        name = ref["$ref"].rsplit("/", 1)[1]
        payload = doc["components"]["messages"][name]["payload"]["$ref"].rsplit("/", 1)[1]
        assert payload in doc["components"]["schemas"]
    assert "Subscription" in doc["components"]["schemas"]


def test_every_message_kind_round_trips() -> None:
    sub = Subscription(streams=["cam-1"], resume={"cam-1": "1-0"})
    msgs = [
        SubscribedMessage(subscription=sub, queue_size=8, send_timeout_s=5, durable=False),
        NoticeMessage(code="gap", message="m", stream_id="cam-1"),
        ErrorMessage(code="forbidden", message="m", http_status=403),
    ]
    for m in msgs:
        assert schemas.SERVER_MESSAGE.validate_json(m.model_dump_json()) == m
