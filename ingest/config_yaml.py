"""YAML for camera files (:mod:`ingest.config_file`): safe tags only, duplicate keys
refused, and errors that give the parser's reason and position but never the text
(PyYAML's own messages quote the offending line, which may hold a password)."""

from __future__ import annotations

from typing import Any

import yaml  # type: ignore[import-untyped]

from framerelay.errors import ConfigError

MERGE_TAG = "tag:yaml.org,2002:merge"
_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when there is one


class _Loader(_BASE):  # type: ignore[misc]
    """The safe loader (LibYAML's when present), refusing a key given twice in a mapping."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue  # '<<: *anchor' merges; its keys may be overridden
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value[:64]!r}", key_node.start_mark
                )
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, label: str) -> object:
    """The document of ``text``; ConfigError ``<label>: not valid YAML (why, line L column C)``."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f", line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        why = exc.problem or "syntax error"
        raise ConfigError(f"{label}: not valid YAML ({why}{where})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label}: not valid YAML ({type(exc).__name__})") from None
