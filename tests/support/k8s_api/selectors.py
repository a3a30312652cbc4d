"""Label selectors as the API defines them: the ``labelSelector`` query string
(``a=b,c!=d,e in (x,y),f notin (z),g,!h``), a ``LabelSelector`` object (``matchLabels``
and ``matchExpressions`` with In, NotIn, Exists, DoesNotExist) and a node selector
requirement (those plus Gt, Lt). An empty ``LabelSelector`` selects everything."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from tests.support.k8s_api.resources import ApiStatus, Obj

Labels = Mapping[str, str]
Match = Callable[[Labels], bool]
_SET = re.compile(r"^\s*(\S+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def parse_query(text: str) -> Match:
    """A ``labelSelector`` (or a ``fieldSelector``'s ``=``/``!=`` terms) as a predicate;
    a malformed one is a 400 ``BadRequest``."""
    terms = [t for t in _split(text) if t.strip()]
    checks = [_term(t) for t in terms]
    return lambda labels: all(check(labels) for check in checks)


def _split(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


def _term(term: str) -> Match:
    found = _SET.match(term)
    if found:
        key, op, raw = found.groups()
        values = [v.strip() for v in raw.split(",") if v.strip()]
        return requirement(
            {"key": key, "operator": "In" if op == "in" else "NotIn", "values": values}
        )
    term = term.strip()
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = (s.strip() for s in term.partition(op))
            if not key:
                break
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if re.fullmatch(r"!?[A-Za-z0-9./_-]+", term):
        key = term.lstrip("!")
        return (
            (lambda labels: key not in labels)
            if term.startswith("!")
            else (lambda labels: key in labels)
        )
    raise ApiStatus(400, "BadRequest", f"unable to parse requirement: {term!r}")


def requirement(req: Obj) -> Match:
    """One ``matchExpressions`` (or node selector) requirement."""
    key, op, values = req["key"], req["operator"], list(req.get("values") or [])
    checks: dict[str, Match] = {
        "In": lambda labels: key in labels and labels[key] in values,
        "NotIn": lambda labels: key not in labels or labels[key] not in values,
        "Exists": lambda labels: key in labels,
        "DoesNotExist": lambda labels: key not in labels,
        "Gt": lambda labels: _int(labels.get(key)) > _int(values[0]),
        "Lt": lambda labels: _int(labels.get(key)) < _int(values[0]),
    }
    if op not in checks:
        raise ApiStatus(400, "BadRequest", f"{op!r} is not a valid selector operator")
    return checks[op]


def _int(text: str | None) -> float:
    """A label's value as a number for Gt/Lt (NaN, which compares false, when it is
    none)."""
    try:
        return int(text) if text is not None else float("nan")
    except ValueError:
        return float("nan")


def label_selector(selector: Obj | None) -> Match:
    """A ``LabelSelector`` object; ``None`` or ``{}`` selects everything."""
    selector = selector or {}
    wanted = dict(selector.get("matchLabels") or {})
    reqs = [requirement(r) for r in selector.get("matchExpressions") or []]
    return lambda labels: wanted.items() <= dict(labels).items() and all(r(labels) for r in reqs)
