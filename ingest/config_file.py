"""Camera files: ``framerelay ingest --config cameras.yaml`` (YAML, TOML or JSON).

A file holds the stream definitions ``POST /v1/streams`` takes
(:class:`ingest.settings.StreamConfig`, same fields, same checks) under
``streams``, and optionally ``defaults`` that every stream starts from::

    defaults: {fps: 5, username: viewer, password_env: CAM_PASSWORD}
    streams:
      - {id: lobby, url: "rtsp://10.0.0.11/stream"}
      - {id: dock, url: "rtsp://10.0.0.12/stream", fps: 2}

TOML spells the same as ``[defaults]`` and ``[[streams]]`` tables; a JSON (or
YAML) file may also be a bare list of definitions. The format follows the
extension: ``.yaml``/``.yml``, ``.toml`` or ``.json``.

``password_env: NAME`` (in a stream or in ``defaults``, never beside
``password``) takes the password from the environment variable ``NAME``, so
the file itself holds no secret.

Every problem is a :class:`~framerelay.errors.ConfigError` of one line that
names the file, the stream (its number, from 1, and its id) and the field as
the REST API's 422 names it (``loc``), with the 422's message; an unknown key
names the nearest valid one. Nothing from the file is repeated but key names
and stream ids (values may hold a password). Duplicate ids and duplicate keys
are errors.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from framerelay.errors import ConfigError
from ingest.settings import IngestSettings, StreamConfig

MAX_FILE_BYTES = 16 << 20
"""A camera file larger than this is refused (about 80,000 cameras of 200 bytes)."""
FORMATS = {".yaml": "YAML", ".yml": "YAML", ".toml": "TOML", ".json": "JSON"}
TOP_KEYS = ("streams", "defaults")
PASSWORD_ENV = "password_env"  # noqa: S105 - a key name
STREAM_FIELDS = (*StreamConfig.model_fields, PASSWORD_ENV)
DEFAULT_FIELDS = tuple(f for f in STREAM_FIELDS if f != "id")
_SHOWN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


def load_streams(
    path: Path,
    environ: Mapping[str, str],
    *,
    option: str = "--config",
    format_: str | None = None,
    list_only: bool = False,
) -> list[StreamConfig]:
    """The stream definitions in ``path``, validated; ConfigError (one line) otherwise.

    ``option`` starts every message (``--config cameras.yaml: ...``); ``format_``
    ("YAML", "TOML", "JSON") overrides the extension; ``list_only`` accepts only a
    bare list of definitions (``--streams-file``)."""
    label = f"{option} {path}"
    fmt = format_ or _format(path, label)
    raw = _parse(_read_text(path, label), fmt, label)
    defaults, entries = _sections(raw, fmt, label, list_only)
    try:
        _password_from_env(defaults, environ, where="defaults.")
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    streams, problems = [], []
    for i, entry in enumerate(entries):
        try:
            streams.append(_stream(entry, defaults, environ))
        except ConfigError as exc:
            problems.append(f"stream {i + 1}{_shown_id(entry)}: {exc}")
    if problems:
        more = f" (and {len(problems) - 1} more invalid streams)" if len(problems) > 1 else ""
        raise ConfigError(f"{label}: {problems[0]}{more}")
    _check_unique(streams, label)
    return streams


def _format(path: Path, label: str) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"{label}: unknown format {path.suffix or '(no extension)'!r}; name the file "
            ".yaml, .yml, .toml or .json"
        )
    return fmt


def _read_text(path: Path, label: str) -> str:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{label}: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: not UTF-8 text") from None


def _parse(text: str, fmt: str, label: str) -> object:
    """The document; ConfigError with the parser's reason and position (never the text)."""
    if fmt == "TOML":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{label}: not valid TOML ({exc})") from None
    if fmt == "YAML":
        from ingest.config_yaml import parse_yaml

        return parse_yaml(text, label)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{label}: not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
        ) from None
    except _DuplicateKey as exc:
        raise ConfigError(f"{label}: not valid JSON ({exc})") from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"duplicate key {key[:64]!r}")
        out[key] = value
    return out


def _sections(
    raw: object, fmt: str, label: str, list_only: bool
) -> tuple[dict[str, Any], list[object]]:
    """(defaults, stream entries) of the document."""
    if isinstance(raw, list):
        return {}, raw
    if list_only:
        raise ConfigError(f"{label}: expected a {fmt} list of stream definitions")
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}: expected a mapping with a 'streams' list, got {_kind(raw)}")
    _check_top_keys(raw, label)
    entries = raw.get("streams")
    if not isinstance(entries, list):
        got = "nothing" if entries is None else _kind(entries)
        raise ConfigError(f"{label}: 'streams' must be a list of stream definitions, got {got}")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{label}: 'defaults' must be a mapping of fields, got {_kind(defaults)}")
    for key in defaults:
        if key not in DEFAULT_FIELDS:
            raise ConfigError(f"{label}: defaults: {_unknown(key, DEFAULT_FIELDS)}")
    return dict(defaults), entries


def _check_top_keys(raw: dict[Any, Any], label: str) -> None:
    for key in raw:
        if key in IngestSettings.model_fields and key != "streams":
            raise ConfigError(
                f"{label}: {key}: an ingest setting, not part of a camera file; set "
                f"{IngestSettings.env_name(key)} or its command-line option"
            )
        if key not in TOP_KEYS:
            raise ConfigError(f"{label}: {_unknown(key, TOP_KEYS)}")


def _stream(entry: object, defaults: dict[str, Any], environ: Mapping[str, str]) -> StreamConfig:
    """One definition: ``defaults`` under ``entry``, ``password_env`` resolved, validated."""
    if not isinstance(entry, dict):
        raise ConfigError(f"expected a mapping of fields (id, url, ...), got {_kind(entry)}")
    for key in entry:
        if key not in STREAM_FIELDS:
            raise ConfigError(_unknown(key, STREAM_FIELDS))
    if "password" in entry or PASSWORD_ENV in entry:  # the stream's own replaces the default
        defaults = {k: v for k, v in defaults.items() if k not in ("password", PASSWORD_ENV)}
    merged = {**defaults, **entry}
    _password_from_env(merged, environ, where="")
    try:
        return StreamConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, entry, defaults)) from None


def _password_from_env(merged: dict[str, Any], environ: Mapping[str, str], where: str) -> None:
    """``password_env: NAME`` becomes ``password``: the value of ``NAME`` (never shown)."""
    if PASSWORD_ENV not in merged:
        return
    name = merged.pop(PASSWORD_ENV)
    if name is None:  # password_env: null - none (e.g. over a YAML merge key)
        return
    if merged.get("password") is not None:
        raise ConfigError(f"{where}{PASSWORD_ENV}: set password or password_env, not both")
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ConfigError(
            f"{where}{PASSWORD_ENV}: expected the name of an environment variable "
            "([A-Za-z_][A-Za-z0-9_]*)"
        )
    if name not in environ:
        raise ConfigError(f"{where}{PASSWORD_ENV}: the environment variable {name} is not set")
    merged["password"] = environ[name]


def _describe(exc: ValidationError, own: dict[Any, Any], defaults: dict[str, Any]) -> str:
    """Each error as ``field: message`` (the 422's loc and msg), no values."""
    said = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ").replace("\n", " ")
        top = str(err["loc"][0]) if err["loc"] else ""
        if top and top not in own and top in defaults:
            loc = f"defaults.{loc}"
        said.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(said)


def _check_unique(streams: list[StreamConfig], label: str) -> None:
    first: dict[str, int] = {}
    for i, cfg in enumerate(streams):
        if cfg.id in first:
            raise ConfigError(
                f"{label}: stream {i + 1} (id {cfg.id}): id: stream {first[cfg.id] + 1} has "
                "this id already; ids must be unique"
            )
        first[cfg.id] = i


def _unknown(key: object, valid: tuple[str, ...]) -> str:
    """``'fsp': unknown field; did you mean 'fps'?`` (the key cut short, never a value)."""
    name = str(key)[:64]
    near = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if near:
        hint = f"did you mean {near[0]!r}?"
    elif len(valid) <= len(TOP_KEYS):
        hint = "valid: " + ", ".join(valid)
    else:
        hint = "see the fields of POST /v1/streams in the API's /docs"
    return f"{name}: Extra inputs are not permitted (unknown field; {hint})"


def _shown_id(entry: object) -> str:
    sid = entry.get("id") if isinstance(entry, dict) else None
    return f" (id {sid})" if isinstance(sid, str) and _SHOWN_ID.fullmatch(sid) else ""


def _kind(value: object) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    return names.get(type(value), f"a {type(value).__name__}")
