"""Sub-commands of the ``framerelay`` CLI.

Each module here exposes ``register(subparsers) -> None``, adding one
sub-command whose parser sets ``func`` (``Callable[[argparse.Namespace], int]``).
Heavy imports happen inside ``func``, never at module import, so ``framerelay
--help`` stays fast and works without optional extras.
"""

from __future__ import annotations

import importlib
import importlib.util

COMMAND_MODULES: tuple[str, ...] = (
    "demo", "worker", "ingest", "model", "record", "clip",
    "orchestrator", "pods", "streams", "jobs", "fleet", "keys", "token", "ca", "volume",
    "runpod", "eval_tracker",
)  # fmt: skip


def load(name: str) -> object | None:
    """Import ``framerelay.commands.<name>`` (None if that module is absent)."""
    full = f"framerelay.commands.{name}"
    if importlib.util.find_spec(full) is None:
        return None
    return importlib.import_module(full)
