"""All tracks of one tracker as a struct of arrays (one row per track).

Rows are kept in creation order, so iteration order (and with it every
assignment and id) is deterministic and survives snapshot/restore.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tracker.kalman import DIM, STATE

TENTATIVE = 0
"""Seen, not yet confirmed: has no id and is not reported."""
TRACKED = 1
"""Confirmed and matched in the latest update."""
LOST = 2
"""Confirmed, not matched in the latest update; kept for ``max_lost_s``."""

_DTYPES: dict[str, tuple[type[Any], tuple[int, ...]]] = {
    "mean": (np.float64, (STATE,)),
    "cov": (np.float64, (3, DIM)),
    "track_id": (np.int64, ()),
    "status": (np.int8, ()),
    "hits": (np.int64, ()),
    "t_obs": (np.float64, ()),
    "obs": (np.float64, (4,)),
    "anchors": (np.float64, (2, 3)),
    "class_id": (np.int32, ()),
}


@dataclass(slots=True)
class TrackTable:
    """Per-track arrays; every field has the track count as its first axis.

    Attributes:
        mean: (N, 8) Kalman state ``[cx, cy, w, h, vcx, vcy, vw, vh]``.
        cov: (N, 3, 4) compact Kalman covariance (see :mod:`tracker.kalman`).
        track_id: (N,) public id, 0 while tentative.
        status: (N,) :data:`TENTATIVE`, :data:`TRACKED` or :data:`LOST`.
        hits: (N,) number of matched detections so far.
        t_obs: (N,) time (s) of the last matched detection.
        obs: (N, 4) last matched detection box (xyxy).
        anchors: (N, 2, 3) two past observations ``[cx, cy, t]``: slot 0 is the
            anchor the motion direction is measured from (between one and two
            ``direction_window_s`` older than the latest observation), slot 1
            the observation that becomes the anchor next.
        class_id: (N,) class of the last matched detection.
    """

    mean: NDArray[np.float64]
    cov: NDArray[np.float64]
    track_id: NDArray[np.int64]
    status: NDArray[np.int8]
    hits: NDArray[np.int64]
    t_obs: NDArray[np.float64]
    obs: NDArray[np.float64]
    anchors: NDArray[np.float64]
    class_id: NDArray[np.int32]

    @classmethod
    def empty(cls) -> TrackTable:
        return cls(**{k: np.zeros((0, *shape), dt) for k, (dt, shape) in _DTYPES.items()})

    def __len__(self) -> int:
        return int(self.track_id.shape[0])

    def keep(self, mask: NDArray[np.bool_]) -> None:
        """Drop the rows where ``mask`` is False (in place)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name)[mask])

    def extend(self, other: TrackTable) -> None:
        """Append ``other``'s rows after the existing ones (in place)."""
        for f in fields(self):
            name = f.name
            setattr(self, name, np.concatenate([getattr(self, name), getattr(other, name)]))

    def arrays(self) -> dict[str, NDArray[Any]]:
        """Field name -> array, for snapshots."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, NDArray[Any]]) -> TrackTable:
        """Rebuild from :meth:`arrays`; checks names, dtypes and shapes."""
        if set(arrays) != set(_DTYPES):
            missing = sorted(set(_DTYPES) - set(arrays))
            extra = sorted(set(arrays) - set(_DTYPES))
            raise ValueError(f"track arrays mismatch: missing {missing}, unexpected {extra}")
        n = arrays["track_id"].shape[0]
        for name, (dtype, shape) in _DTYPES.items():
            arr = arrays[name]
            if arr.dtype != np.dtype(dtype) or arr.shape != (n, *shape):
                raise ValueError(
                    f"track array {name!r}: expected {np.dtype(dtype)} {(n, *shape)}, "
                    f"got {arr.dtype} {arr.shape}"
                )
        return cls(**{k: np.array(v, copy=True) for k, v in arrays.items()})
