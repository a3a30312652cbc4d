"""``Detections``: the one currency from detector through tracker to the wire.

A struct of numpy arrays, validated at construction, in the style of
roboflow/supervision. Boxes are ``xyxy`` in source-frame pixels.
``tracker_id`` is ``-1`` until a tracker assigns an id (ids start at 1).
:meth:`Detections.to_supervision` and :meth:`Detections.from_supervision`
convert to and from ``supervision.Detections`` (imported only when called).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    import supervision as sv

UNTRACKED = -1


def _read_only(array: NDArray[Any]) -> NDArray[Any]:
    array.setflags(write=False)
    return array


_EMPTY = (
    _read_only(np.empty((0, 4), np.float32)),
    _read_only(np.empty(0, np.float32)),
    _read_only(np.empty(0, np.int32)),
    _read_only(np.empty(0, np.int64)),
)
"""The arrays of :meth:`Detections.empty`."""


def _as(name: str, value: ArrayLike, dtype: type[Any], n: int | None) -> Any:
    """``value`` as a contiguous ``dtype`` array of shape (N, 4) (``n`` None) or (n,)."""
    arr = np.ascontiguousarray(value, dtype=dtype)
    shape = arr.shape
    if n is None:
        if len(shape) != 2 or shape[1] != 4:
            raise ValueError(f"Detections.{name} must have shape (N, 4), got {shape}")
    elif shape != (n,):
        raise ValueError(f"Detections.{name} must have shape ({n}), got {shape}")
    return arr


@dataclass(frozen=True, slots=True, eq=False)
class Detections:
    """Detections of one frame.

    Attributes:
        xyxy: float32 (N, 4) boxes ``[x1, y1, x2, y2]`` in source pixels.
        confidence: float32 (N,) scores in [0, 1].
        class_id: int32 (N,) class indices of the model's label set.
        tracker_id: int64 (N,) track ids, ``-1`` for untracked.
    """

    xyxy: NDArray[np.float32]
    confidence: NDArray[np.float32]
    class_id: NDArray[np.int32]
    tracker_id: NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))

    def __post_init__(self) -> None:
        xyxy = _as("xyxy", self.xyxy, np.float32, None)
        n = xyxy.shape[0]
        tid = self.tracker_id
        if n and np.size(tid) == 0:
            tid = np.full(n, UNTRACKED, np.int64)
        object.__setattr__(self, "xyxy", xyxy)
        object.__setattr__(self, "confidence", _as("confidence", self.confidence, np.float32, n))
        object.__setattr__(self, "class_id", _as("class_id", self.class_id, np.int32, n))
        object.__setattr__(self, "tracker_id", _as("tracker_id", tid, np.int64, n))
        if n and not np.isfinite(xyxy).all():
            raise ValueError("Detections.xyxy contains NaN or infinite coordinates")

    @classmethod
    def empty(cls) -> Detections:
        """Zero detections. The answer to most frames, so it is one shared, immutable
        object: the dataclass is frozen and its four zero-row arrays are read-only."""
        return _EMPTY_DETECTIONS

    def __len__(self) -> int:
        return int(self.xyxy.shape[0])

    def __getitem__(self, index: NDArray[Any] | slice | Sequence[int]) -> Detections:
        """Select rows by boolean mask, index array or slice."""
        idx: Any = index
        return Detections(
            xyxy=self.xyxy[idx],
            confidence=self.confidence[idx],
            class_id=self.class_id[idx],
            tracker_id=self.tracker_id[idx],
        )

    def with_tracker_id(self, tracker_id: ArrayLike) -> Detections:
        """A copy with ``tracker_id`` replaced."""
        return Detections(self.xyxy, self.confidence, self.class_id, np.asarray(tracker_id))

    @classmethod
    def concatenate(cls, parts: Sequence[Detections]) -> Detections:
        """Join several sets into one, in order."""
        if not parts:
            return cls.empty()
        return cls(
            xyxy=np.concatenate([p.xyxy for p in parts]),
            confidence=np.concatenate([p.confidence for p in parts]),
            class_id=np.concatenate([p.class_id for p in parts]),
            tracker_id=np.concatenate([p.tracker_id for p in parts]),
        )

    def equals(self, other: Detections, *, atol: float = 0.0) -> bool:
        """Value equality (arrays compared element-wise)."""
        return (
            len(self) == len(other)
            and np.allclose(self.xyxy, other.xyxy, atol=atol, rtol=0)
            and np.allclose(self.confidence, other.confidence, atol=atol, rtol=0)
            and np.array_equal(self.class_id, other.class_id)
            and np.array_equal(self.tracker_id, other.tracker_id)
        )

    def to_supervision(self) -> sv.Detections:
        """These detections as ``supervision.Detections`` (needs ``supervision`` installed).

        ``tracker_id`` is None when no row is tracked (supervision's "no tracker"), else
        the ids with ``-1`` for untracked rows.
        """
        import supervision as sv

        tracked = bool((self.tracker_id != UNTRACKED).any())
        return sv.Detections(
            xyxy=self.xyxy.copy(),
            confidence=self.confidence.copy(),
            class_id=self.class_id.astype(np.int64),
            tracker_id=self.tracker_id.copy() if tracked else None,
        )

    @classmethod
    def from_supervision(cls, detections: sv.Detections) -> Detections:
        """``supervision.Detections`` as our type: masks and ``data`` are left out; a missing
        ``confidence`` becomes 1.0 (annotations), a missing ``tracker_id`` ``-1``; a missing
        ``class_id`` is refused (ValueError)."""
        n = len(detections.xyxy)
        if detections.class_id is None and n:
            raise ValueError("Detections.from_supervision needs class_id (it is None)")
        confidence, class_id, tracker_id = (
            detections.confidence, detections.class_id, detections.tracker_id
        )  # fmt: skip
        return cls(
            xyxy=np.asarray(detections.xyxy, np.float32).reshape(-1, 4),
            confidence=np.asarray(1.0 if confidence is None else confidence, np.float32)
            * np.ones(n, np.float32),
            class_id=np.asarray(() if class_id is None else class_id, np.int32),
            tracker_id=np.asarray(() if tracker_id is None else tracker_id, np.int64),
        )


def _empty_detections() -> Detections:
    det = object.__new__(Detections)
    xyxy, conf, cls_id, tid = _EMPTY
    object.__setattr__(det, "xyxy", xyxy)
    object.__setattr__(det, "confidence", conf)
    object.__setattr__(det, "class_id", cls_id)
    object.__setattr__(det, "tracker_id", tid)
    return det


_EMPTY_DETECTIONS = _empty_detections()
"""What :meth:`Detections.empty` returns (valid as built: not validated again)."""
