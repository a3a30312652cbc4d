"""The tracker contract and the registry of implementations.

A tracker is a pure object (no I/O): the GPU worker keeps one per stream.

* ``update(detections, t)`` takes the detections of one frame and the frame's
  time in seconds (from the stream's PTS, never a frame count) and returns the
  same detections with ``tracker_id`` filled (``-1`` for detections that did
  not become or continue a confirmed track).
* ``reset()`` forgets every track (and restarts ids at 1).
* ``snapshot()`` returns a versioned binary of the full state;
  ``restore_tracker(blob)`` rebuilds an equal tracker in any process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from framerelay.detections import Detections
from framerelay.errors import ConfigError


@runtime_checkable
class Tracker(Protocol):
    """What every tracker implements."""

    name: str

    def update(self, detections: Detections, t: float) -> Detections:
        """Associate one frame's detections at time ``t`` (seconds)."""
        ...

    def reset(self) -> None:
        """Drop all state; the next id is 1 again."""
        ...

    def snapshot(self) -> bytes:
        """Versioned, compact binary of the full state."""
        ...


TrackerFactory = Callable[..., Tracker]
_T = TypeVar("_T", bound=TrackerFactory)
_REGISTRY: dict[str, TrackerFactory] = {}
_RESTORERS: dict[str, Callable[[bytes], Tracker]] = {}
_LEGACY_NONE_MAGIC = b"FRTN"
"""Header of the first ``none`` tracker snapshots (still accepted)."""


def register_tracker(
    name: str, restore: Callable[[bytes], Tracker] | None = None
) -> Callable[[_T], _T]:
    """Class decorator: make a tracker available to ``create_tracker(name)``.

    Snapshots whose header names ``name`` are restored by ``restore`` or, when it
    is not given, by the factory's own ``restore`` classmethod if it has one.
    """

    def deco(factory: _T) -> _T:
        _REGISTRY[name] = factory
        own = getattr(factory, "restore", None)
        chosen = restore if restore is not None else own
        if callable(chosen):
            _RESTORERS[name] = chosen
        return factory

    return deco


def register_restorer(name: str, restore: Callable[[bytes], Tracker]) -> None:
    """Register how snapshots whose header names ``name`` are restored."""
    _RESTORERS[name] = restore


def available_trackers() -> list[str]:
    """Names accepted by ``create_tracker``."""
    _load_builtins()
    return sorted(_REGISTRY)


def create_tracker(name: str = "default", **settings: Any) -> Tracker:
    """Build a tracker by registered name with optional setting overrides."""
    _load_builtins()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise ConfigError(f"unknown tracker {name!r}; available: {known}") from None
    return factory(**settings)


def restore_tracker(data: bytes) -> Tracker:
    """Rebuild whichever tracker wrote ``data`` (dispatching on its header).

    Raises :class:`tracker.snapshot.SnapshotError` (a ``ConfigError``) for
    garbage, truncated or corrupt data, a newer format version, or a tracker
    this build does not know.
    """
    from tracker.snapshot import SnapshotError, read_header

    _load_builtins()
    if bytes(data[:4]) == _LEGACY_NONE_MAGIC:
        name = "none"
    else:
        _, name = read_header(data)
    try:
        restore = _RESTORERS[name]
    except KeyError:
        known = ", ".join(sorted(_RESTORERS)) or "(none)"
        raise SnapshotError(
            f"snapshot holds a {name!r} tracker, which this framerelay cannot restore "
            f"(it knows: {known}); upgrade framerelay or start the tracker afresh"
        ) from None
    return restore(data)


def restorers() -> dict[str, Callable[[bytes], Tracker]]:
    """Snapshot restorers by tracker name (used by ``restore_tracker``)."""
    _load_builtins()
    return dict(_RESTORERS)


def _load_builtins() -> None:
    # Importing the package registers the built-in trackers.
    import tracker  # noqa: F401
