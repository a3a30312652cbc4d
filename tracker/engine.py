"""The SORT-family tracking engine shared by ``bytetrack``, ``ocsort`` and ``hybrid``.

One update, with all tracks predicted to the frame's time ``t`` first:

1. high detections  <-> confirmed tracks (tracked or lost), IoU with the
   predicted box, plus OC-SORT's direction term (``direction_weight``);
2. low detections   <-> confirmed tracks still tracked, IoU (ByteTrack);
3. leftover high    <-> leftover confirmed tracks, IoU with their *last
   observed* box (OC-SORT's observation-centric recovery);
4. leftover high    <-> tentative tracks, IoU with the predicted box;
5. leftover high detections above ``new_track_threshold`` start tentative
   tracks; a tentative track is confirmed (and gets the next id) after
   ``min_hits`` matches; tracks unmatched for too long (seconds) are dropped.

Everything is vectorised over tracks (see :mod:`tracker.tracks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import NDArray
from pydantic import ValidationError

from framerelay.detections import Detections
from tracker import kalman
from tracker.association import assign, direction_score, iou_matrix
from tracker.settings import SortSettings
from tracker.snapshot import SnapshotError, decode, encode
from tracker.tracks import LOST, TENTATIVE, TRACKED, TrackTable

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
_NO_TIME = math.nan


@dataclass(frozen=True, slots=True)
class _Frame:
    """One update's detections in the forms the stages need."""

    xyxy: F64
    z: F64
    conf: NDArray[np.float32]
    cls: NDArray[np.int32]
    high: NDArray[np.bool_]
    low: NDArray[np.bool_]

    @classmethod
    def of(cls, d: Detections, s: SortSettings) -> _Frame:
        xyxy = d.xyxy.astype(np.float64)
        high = d.confidence >= s.high_threshold
        low = (d.confidence >= s.low_threshold) & ~high
        return cls(xyxy, kalman.xyxy_to_z(xyxy), d.confidence, d.class_id, high, low)


class SortFamilyTracker:
    """Base of the registered trackers; subclasses set ``name`` and ``settings_model``."""

    name: str = "sort-family"
    settings_model: ClassVar[type[SortSettings]] = SortSettings

    def __init__(self, settings: SortSettings | None = None, **overrides: Any) -> None:
        if settings is None:
            settings = self.settings_model(**overrides)
        elif overrides:
            settings = self.settings_model(**{**settings.model_dump(), **overrides})
        if type(settings) is not self.settings_model:
            settings = self.settings_model(**settings.model_dump())
        self.settings = settings
        self._noise = settings.noise()
        self.reset()

    # ------------------------------------------------------------------ contract

    def reset(self) -> None:
        """Forget every track; the next id is 1 again."""
        self.tracks = TrackTable.empty()
        self._next_id = 1
        self._t = _NO_TIME
        self._updates = 0

    def update(self, detections: Detections, t: float) -> Detections:
        """Associate one frame's detections at time ``t`` (seconds, from PTS).

        Returns ``detections`` (same rows, same order) with ``tracker_id`` set
        for rows that continue or confirm a track, -1 elsewhere. ``t`` should
        not decrease; an earlier ``t`` is treated as the latest time seen.
        """
        now = self._advance(t)
        frame = _Frame.of(detections, self.settings)
        match = self._associate(frame)
        ids = self._apply(frame, match, now)
        self._updates += 1
        return detections.with_tracker_id(ids)

    def snapshot(self) -> bytes:
        """Versioned binary of the full state (see :mod:`tracker.snapshot`)."""
        arrays: dict[str, NDArray[Any]] = {
            f"tracks.{k}": v for k, v in self.tracks.arrays().items()
        }
        arrays["next_id"] = np.array(self._next_id, np.int64)
        arrays["t"] = np.array(self._t, np.float64)
        arrays["updates"] = np.array(self._updates, np.int64)
        return encode(self.name, self.settings.model_dump_json(), arrays)

    @classmethod
    def restore(cls, data: bytes) -> Self:
        """Rebuild a tracker from :meth:`snapshot` output (in any process)."""
        snap = decode(data)
        if snap.name != cls.name:
            raise SnapshotError(
                f"snapshot holds a {snap.name!r} tracker, not {cls.name!r}; "
                "restore it with tracker.restore_tracker(data)"
            )
        try:
            settings = cls.settings_model.model_validate_json(snap.settings_json)
            prefix = "tracks."
            table = TrackTable.from_arrays(
                {k[len(prefix) :]: v for k, v in snap.arrays.items() if k.startswith(prefix)}
            )
            next_id = int(snap.arrays["next_id"])
            t = float(snap.arrays["t"])
            updates = int(snap.arrays["updates"])
        except (ValidationError, ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(
                f"{cls.name!r} snapshot content is inconsistent ({exc}); "
                "discard it and start the stream's tracker afresh"
            ) from None
        trk = cls(settings)
        trk.tracks, trk._next_id, trk._t, trk._updates = table, next_id, t, updates
        return trk

    # ------------------------------------------------------------------ steps

    def _advance(self, t: float) -> float:
        t = float(t)
        if not math.isfinite(t):
            raise ValueError(f"update time must be a finite number of seconds, got {t!r}")
        if math.isnan(self._t):
            self._t = t
            return t
        dt = t - self._t
        if dt > 0.0:
            tr = self.tracks
            tr.mean, tr.cov = kalman.predict(tr.mean, tr.cov, dt, self._noise)
            self._t = t
        return self._t

    def _predicted_xyxy(self, rows: I64) -> F64:
        z = self.tracks.mean[rows, : kalman.DIM].copy()
        z[:, 2:] = np.maximum(z[:, 2:], 1.0)
        return kalman.z_to_xyxy(z)

    def _stage(
        self, rows: I64, cols: I64, score: F64, iou: F64, thr: float, f: _Frame
    ) -> tuple[I64, I64]:
        """Gate (IoU, class) and assign; returns matched (track rows, det indices)."""
        allowed = iou >= thr
        if self.settings.class_aware:
            allowed &= self.tracks.class_id[rows][:, None] == f.cls[cols][None, :]
        r, c = assign(score, allowed, thr)
        return rows[r], cols[c]

    def _associate(self, f: _Frame) -> I64:
        """Run the stages; returns, per detection, the matched track row or -1."""
        s, tr = self.settings, self.tracks
        match = np.full(f.xyxy.shape[0], -1, np.int64)
        free = np.ones(len(tr), bool)

        def commit(rows: I64, cols: I64) -> None:
            match[cols] = rows
            free[rows] = False

        confirmed = tr.status != TENTATIVE
        rows, cols = np.flatnonzero(confirmed), np.flatnonzero(f.high)
        iou = iou_matrix(self._predicted_xyxy(rows), f.xyxy[cols])
        score = iou + self._direction(rows, cols, f) if s.direction_weight > 0 else iou
        commit(*self._stage(rows, cols, score, iou, s.match_iou, f))
        if s.use_low_stage:
            rows, cols = np.flatnonzero(free & (tr.status == TRACKED)), np.flatnonzero(f.low)
            iou = iou_matrix(self._predicted_xyxy(rows), f.xyxy[cols])
            commit(*self._stage(rows, cols, iou, iou, s.low_match_iou, f))
        if s.recovery:
            rows = np.flatnonzero(free & confirmed)
            cols = np.flatnonzero(f.high & (match < 0))
            iou = iou_matrix(tr.obs[rows], f.xyxy[cols])
            commit(*self._stage(rows, cols, iou, iou, s.recovery_iou, f))
        rows = np.flatnonzero(tr.status == TENTATIVE)
        cols = np.flatnonzero(f.high & (match < 0))
        iou = iou_matrix(self._predicted_xyxy(rows), f.xyxy[cols])
        commit(*self._stage(rows, cols, iou, iou, s.tentative_match_iou, f))
        return match

    def _direction(self, rows: I64, cols: I64, f: _Frame) -> F64:
        tr = self.tracks
        centers = f.z[cols, :2]
        weight = self.settings.direction_weight * f.conf[cols].astype(np.float64)
        return direction_score(tr.direction[rows], tr.anchor[rows], centers, weight)

    def _apply(self, f: _Frame, match: I64, now: float) -> I64:
        """Update matched tracks, age the rest, start new ones; ids per detection."""
        tr = self.tracks
        dets = np.flatnonzero(match >= 0)
        rows = match[dets]
        self._correct(rows, f.z[dets], now)
        self._observe(rows, f, dets, now)
        was_tentative = tr.status[rows] == TENTATIVE
        tr.status[rows[~was_tentative]] = TRACKED
        promote = rows[was_tentative & (tr.hits[rows] >= self.settings.min_hits)]
        self._confirm(promote)
        ids = np.full(f.xyxy.shape[0], -1, np.int64)
        ids[dets] = tr.track_id[rows]
        ids[ids == 0] = -1
        self._age(np.isin(np.arange(len(tr)), rows, invert=True), now)
        born = np.flatnonzero(
            f.high & (match < 0) & (f.conf >= self.settings.new_track_threshold)
        )
        if born.size:
            ids[born] = self._start(f, born, now)
        return ids

    def _correct(self, rows: I64, z: F64, now: float) -> None:
        """Kalman update of matched rows (with OC-SORT re-update for returning tracks)."""
        if rows.size == 0:
            return
        tr = self.tracks
        mean, cov = kalman.update(tr.mean[rows], tr.cov[rows], z, self._noise)
        if self.settings.reupdate:
            back = tr.status[rows] == LOST
            gap = now - tr.t_obs[rows]
            back &= gap > 0
            if back.any():
                last = kalman.xyxy_to_z(tr.obs[rows[back]])
                mean[back, kalman.DIM :] = (z[back] - last) / gap[back, None]
        tr.mean[rows], tr.cov[rows] = mean, cov

    def _observe(self, rows: I64, f: _Frame, dets: I64, now: float) -> None:
        """Record the matched observation and refresh the motion direction."""
        tr = self.tracks
        tr.hits[rows] += 1
        tr.t_obs[rows] = now
        tr.obs[rows] = f.xyxy[dets]
        tr.class_id[rows] = f.cls[dets]
        center = f.z[dets, :2]
        delta = center - tr.anchor[rows]
        norm = np.sqrt((delta**2).sum(axis=1))
        due = (now - tr.t_anchor[rows] >= self.settings.direction_window_s) & (norm > 1e-6)
        moved = rows[due]
        tr.direction[moved] = delta[due] / norm[due, None]
        tr.anchor[moved] = center[due]
        tr.t_anchor[moved] = now

    def _confirm(self, rows: I64) -> None:
        tr = self.tracks
        tr.status[rows] = TRACKED
        tr.track_id[rows] = np.arange(self._next_id, self._next_id + rows.size)
        self._next_id += int(rows.size)

    def _age(self, unmatched: NDArray[np.bool_], now: float) -> None:
        """Unmatched tracked tracks become lost; stale tentative/lost ones are dropped."""
        tr, s = self.tracks, self.settings
        silent = now - tr.t_obs
        newly_lost = unmatched & (tr.status == TRACKED)
        tr.status[newly_lost] = LOST
        tr.mean[newly_lost, kalman.DIM + 2 :] = 0.0  # stop growing/shrinking while unseen
        drop = unmatched & (
            ((tr.status == TENTATIVE) & (silent > s.tentative_max_gap_s))
            | ((tr.status == LOST) & (silent > s.max_lost_s))
        )
        if drop.any():
            tr.keep(~drop)

    def _start(self, f: _Frame, dets: I64, now: float) -> I64:
        """Append tentative tracks for ``dets``; returns their output ids."""
        mean, cov = kalman.initiate(f.z[dets], self._noise)
        n = dets.size
        new = TrackTable(
            mean=mean,
            cov=cov,
            track_id=np.zeros(n, np.int64),
            status=np.full(n, TENTATIVE, np.int8),
            hits=np.ones(n, np.int64),
            t_obs=np.full(n, now),
            obs=f.xyxy[dets].copy(),
            anchor=f.z[dets, :2].copy(),
            t_anchor=np.full(n, now),
            direction=np.zeros((n, 2)),
            class_id=f.cls[dets].astype(np.int32),
        )
        first = len(self.tracks)
        self.tracks.extend(new)
        first_update = self._updates == 0 and self.settings.confirm_first_update
        if first_update or self.settings.min_hits <= 1:
            self._confirm(np.arange(first, first + n, dtype=np.int64))
        return np.where(self.tracks.track_id[first:] > 0, self.tracks.track_id[first:], -1)
