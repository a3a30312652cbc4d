"""The numbers every API and settings test throws at a numeric field."""

from __future__ import annotations

BAD_NUMBERS: list[tuple[str, str]] = [
    ("nan", "NaN"),
    ("inf", "Infinity"),
    ("-inf", "-Infinity"),
    ("1e400", "1e400"),  # json.loads: inf
    ("1e308", "1e308"),
    ("-1e308", "-1e308"),
    ("10**400", "1" + "0" * 400),
    ("-10**400", "-1" + "0" * 400),
    ("2**63", str(2**63)),
]
"""(test id, the JSON literal)."""
CLEAR = ("finite number", "less than", "greater than", "valid number", "valid integer",
         "maximum size")  # fmt: skip
"""What a 422 message for a bad number says (pydantic's words)."""
