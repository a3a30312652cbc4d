"""The SORT-family tracking engine shared by ``bytetrack``, ``ocsort`` and ``hybrid``.

One update, with all tracks' Kalman filters first predicted to the frame's
time ``t`` (tracks unseen for longer than ``max_lost_s`` are dropped first):

1. high detections  <-> confirmed tracks (tracked or lost): IoU with the
   predicted box, optionally height-modulated (``height_iou``) and plus
   OC-SORT's direction term (``direction_weight``);
2. low detections   <-> confirmed tracks still tracked (and lost ones, with
   ``low_stage_lost``): IoU (ByteTrack's second stage, ``use_low_stage``);
3. leftover high    <-> leftover confirmed tracks: IoU with their *last
   observed* box (OC-SORT's observation-centric recovery, ``recovery``),
   both boxes grown by the distance ``recovery_speed`` covers since the track
   was seen (the last box goes stale while the target moves on unseen), plus
   the direction term (``recovery_direction_weight``);
4. leftover high    <-> tentative tracks: IoU with the predicted box, or
   (``tentative_speed`` > 0) with the last box, both boxes grown by the
   distance that speed covers since the track was seen (a new track has no
   velocity yet, and at 2-6 fps a walker moves most of its width per frame);
5. matched tracks get a Kalman update (robust to outliers with
   ``outlier_sigma``; low detections count ``low_noise`` times noisier);
   leftover high detections above ``new_track_threshold`` start tentative
   tracks; a tentative track is confirmed (and gets the next id) after
   ``min_hits`` matches; tracked tracks that found nothing become lost;
   tentative ones unmatched for ``tentative_max_gap_s`` and lost ones
   unmatched for ``max_lost_s`` (seconds) are dropped.

Each stage solves one optimal assignment (:func:`tracker.association.assign`).
Matched detections below ``report_threshold`` keep their track alive but are
returned with ``tracker_id`` -1. Everything is vectorised over tracks
(see :mod:`tracker.tracks`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import NDArray
from pydantic import ValidationError

from framerelay.detections import Detections
from framerelay.errors import ConfigError
from tracker import gap as gap_mod
from tracker import kalman
from tracker.association import assign, direction_score, grown_iou, height_iou, iou_matrix
from tracker.settings import SortSettings
from tracker.snapshot import SnapshotError, decode, encode
from tracker.tracks import LOST, TENTATIVE, TRACKED, TrackTable

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
Mask = NDArray[np.bool_]
_NO_TIME = math.nan
_MAX_BUFFER = 1.0
"""Stage 4 grows boxes by at most their size on every side (2 fps at 2 sizes/s)."""


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
        low = (d.confidence >= s.low_threshold) ^ high  # low <= high, so this is "and not"
        return cls(xyxy, kalman.xyxy_to_z(xyxy), d.confidence, d.class_id, high, low)


@dataclass(frozen=True, slots=True)
class _Candidates:
    """Track/detection pairs that overlap: row-aligned (K,) arrays."""

    rows: I64
    cols: I64
    iou: F64
    score: F64


def _expand(xyxy: F64, ratio: float) -> F64:
    """Boxes grown by ``ratio`` of their size on every side (C-BIoU's buffer)."""
    pad = ratio * (xyxy[:, 2:4] - xyxy[:, 0:2])
    return np.concatenate([xyxy[:, 0:2] - pad, xyxy[:, 2:4] + pad], axis=1)


def _known_settings(model: type[SortSettings], settings_json: str) -> SortSettings:
    """A snapshot's settings; names this version does not know (a newer worker wrote
    them) are left out, as readers of a peer's message do."""
    values = json.loads(settings_json)
    if not isinstance(values, dict):
        raise TypeError(f"settings are a JSON {type(values).__name__}, not an object")
    return model.model_validate({k: v for k, v in values.items() if k in model.model_fields})


def _any(mask: Mask) -> bool:
    """``mask.any()``, about four times cheaper on the small arrays used here."""
    return bool(np.count_nonzero(mask))


class SortFamilyTracker:
    """Base of the registered trackers; subclasses set ``name`` and ``settings_model``."""

    name: str = "sort-family"
    settings_model: ClassVar[type[SortSettings]] = SortSettings

    def __init__(self, settings: SortSettings | None = None, **overrides: Any) -> None:
        self._configure(settings.model_dump() if settings is not None else {}, overrides)
        self._match = np.empty(0, np.int64)
        self._free = np.empty(0, bool)
        self.reset()

    def _configure(self, base: dict[str, Any], overrides: dict[str, Any]) -> None:
        try:
            self.settings = self.settings_model(**{**base, **overrides})
        except ValidationError as exc:
            fields = ", ".join(sorted(self.settings_model.model_fields))
            raise ConfigError(
                f"invalid settings for tracker {self.name!r}: {exc}\nvalid settings are: {fields}"
            ) from exc
        self._noise = self.settings.noise()

    def configure(self, **overrides: Any) -> None:
        """Change some settings, keeping every track (e.g. a stream's own time settings
        on a tracker restored from a snapshot). Raises ConfigError like the constructor."""
        self._configure(self.settings.model_dump(), overrides)

    # ------------------------------------------------------------------ contract

    def reset(self) -> None:
        """Forget every track; the next id is 1 again."""
        self.tracks = TrackTable.empty()
        self._next_id = 1
        self._t = _NO_TIME
        self._updates = 0
        self._bridged = 0.0
        """The gap (s) bridged just before the next update; 0 when none."""

    def update(self, detections: Detections, t: float) -> Detections:
        """Associate one frame's detections at time ``t`` (seconds, from PTS).

        Returns ``detections`` (same rows, same order) with ``tracker_id`` set
        for rows that continue or confirm a track, -1 elsewhere. ``t`` should
        not decrease; an earlier ``t`` is treated as the latest time seen.
        """
        now = self._advance(t)
        gap, self._bridged = self._bridged, 0.0
        if len(detections) == 0:  # nothing to associate: only age the tracks
            if len(self.tracks):
                self._age(np.ones(len(self.tracks), bool), now)
            self._updates += 1
            return detections
        frame = _Frame.of(detections, self.settings)
        match = self._associate(frame, gap)
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
            settings = _known_settings(cls.settings_model, snap.settings_json)
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
        if dt > 0.0 and len(self.tracks):
            tr = self.tracks
            expired = t - tr.t_obs > self.settings.max_lost_s  # e.g. after a stall
            if _any(expired):
                tr.keep(~expired)
            tr.mean, tr.cov = kalman.predict(tr.mean, tr.cov, dt, self._noise)
        self._t = max(self._t, t)
        return self._t

    def bridge(self, t: float) -> bool:
        """The stream was not observed from the latest time seen until ``t`` (an
        outage: its worker died and the stream was re-homed). Carries every track over
        the gap (:mod:`tracker.gap`) instead of ageing it, and makes the next update
        match by the grown uncertainty first. A gap over ``max_gap_s`` is not bridged
        (the next update ages the tracks as usual). Returns whether it bridged."""
        t = float(t)
        if not math.isfinite(t):
            raise ValueError(f"bridge time must be a finite number of seconds, got {t!r}")
        gap = t - self._t
        if not 0.0 < gap <= self.settings.max_gap_s or not len(self.tracks):  # False for NaN
            return False
        gap_mod.bridge_tracks(self.tracks, gap, self._noise)
        self._t, self._bridged = t, gap
        return True

    def _gap_stage(self, f: _Frame, gap: float) -> None:
        """First update after :meth:`bridge`: confirmed tracks vs high detections by
        distance from the prediction (:func:`tracker.gap.gap_candidates`)."""
        tr = self.tracks
        rows = np.nonzero(tr.status != TENTATIVE)[0]
        cols = np.nonzero(f.high)[0]
        r, c, gain = gap_mod.gap_candidates(tr, rows, f.z, cols, gap)
        if self.settings.class_aware and r.size:
            same = tr.class_id[r] == f.cls[c]
            r, c, gain = r[same], c[same], gain[same]
        if r.size:
            rivals = np.unique(r)
            r, d = gap_mod.unambiguous_assignment(r, c, gain)
            self._match[d] = r
            self._free[rivals] = False  # an ambiguous track waits for the next frame

    def _predicted_xyxy(self) -> F64:
        mean = self.tracks.mean
        half = 0.5 * np.maximum(mean[:, 2:4], 1.0)
        return np.concatenate([mean[:, 0:2] - half, mean[:, 0:2] + half], axis=1)

    def _stage(self, c: _Candidates, rows: Mask, cols: Mask, thr: float) -> None:
        """Assign free ``rows`` (track mask) to unmatched ``cols`` (detection mask)
        among candidates ``c`` with ``iou >= thr`` and ``score > thr``."""
        rows = rows & self._free
        cols = cols & (self._match < 0)
        if c.rows.size == 0 or not _any(rows) or not _any(cols):
            return
        ok = rows[c.rows]
        ok &= cols[c.cols]
        ok &= c.iou >= thr
        if c.score is not c.iou:
            ok &= c.score > thr
        if not _any(ok):
            return
        r, d = assign(c.rows[ok], c.cols[ok], c.score[ok] - thr)
        self._match[d] = r
        self._free[r] = False

    def _candidates(
        self, boxes: F64, f: _Frame, gate: float, rows: I64 | None = None, dets: F64 | None = None
    ) -> _Candidates:
        """Pairs of track ``boxes`` and detections (``dets``: their boxes, grown or
        not) with IoU >= ``gate`` (and same class)."""
        iou = iou_matrix(boxes, f.xyxy if dets is None else dets)
        pr, pc = np.nonzero(iou >= gate)  # intp, i.e. int64 here
        values = iou[pr, pc]
        if rows is not None:
            pr = rows[pr]
        if self.settings.class_aware:
            same = self.tracks.class_id[pr] == f.cls[pc]
            pr, pc, values = pr[same], pc[same], values[same]
        return _Candidates(pr, pc, values, values)

    def _associate(self, f: _Frame, gap: float = 0.0) -> I64:
        """Run the stages (after a bridged ``gap``, the gap stage first); returns, per
        detection, the matched track row or -1."""
        s, tr = self.settings, self.tracks
        self._match = match = np.full(f.xyxy.shape[0], -1, np.int64)
        self._free = np.ones(len(tr), bool)
        if len(tr) == 0 or match.size == 0:
            return match
        gate = min(s.match_iou, s.low_match_iou, s.tentative_match_iou)
        if gap > 0.0:
            self._gap_stage(f, gap)
        predicted = self._predicted_xyxy()
        cand = self._candidates(predicted, f, gate)
        confirmed = tr.status != TENTATIVE
        self._stage(self._first_stage(cand, predicted, f), confirmed, f.high, s.match_iou)
        if s.use_low_stage:
            low_rows = confirmed if s.low_stage_lost else tr.status == TRACKED
            self._stage(cand, low_rows, f.low, s.low_match_iou)
        if s.recovery:
            rows = np.nonzero(self._free & confirmed)[0]
            cols = f.high & (match < 0)
            if rows.size and _any(cols):
                back = self._recovery(rows, f, cols)
                if s.recovery_direction_weight > 0 and back.rows.size:
                    back = self._with_direction(back, f, back.iou, s.recovery_direction_weight)
                self._stage(back, confirmed, cols, s.recovery_iou)
        self._stage(self._tentative(cand, f), ~confirmed, f.high, s.tentative_match_iou)
        return match

    def _recovery(self, rows: I64, f: _Frame, cols: Mask) -> _Candidates:
        """Stage 3 candidates: track ``rows`` by their last observed box against the
        ``cols`` detections. That box goes stale while the target moves on unseen, so
        (``recovery_speed`` > 0) it and the detections are grown by the distance that
        speed covers in the time since the track was seen (per track, at most
        ``recovery_max_buffer`` of their size): right after a miss the bar is
        ``recovery_iou`` on nearly the boxes themselves, after a longer gap it eases."""
        s, tr = self.settings, self.tracks
        boxes = tr.obs[rows]
        if s.recovery_buffer > 0:
            boxes = _expand(boxes, s.recovery_buffer)
        if s.recovery_speed <= 0:
            return self._candidates(boxes, f, s.recovery_iou, rows)
        ratio = np.minimum(s.recovery_speed * (self._t - tr.t_obs[rows]), s.recovery_max_buffer)
        dets = np.nonzero(cols)[0]
        iou = grown_iou(boxes, f.xyxy[dets], ratio)
        pr, pc = np.nonzero(iou >= s.recovery_iou)
        values = iou[pr, pc]
        pr, pc = rows[pr], dets[pc]
        if s.class_aware:
            same = tr.class_id[pr] == f.cls[pc]
            pr, pc, values = pr[same], pc[same], values[same]
        return _Candidates(pr, pc, values, values)

    def _tentative(self, cand: _Candidates, f: _Frame) -> _Candidates:
        """Stage 4 candidates. A tentative track has no velocity yet, so at a low
        frame rate its next box is searched for with both boxes grown by the
        distance an object may move in the time since it was seen:
        ``tentative_speed`` sizes per second (C-BIoU's buffer, scaled by time)."""
        s, tr = self.settings, self.tracks
        if s.tentative_speed <= 0:
            return cand
        rows = np.nonzero(self._free & (tr.status == TENTATIVE))[0]
        if rows.size == 0 or not _any(f.high & (self._match < 0)):
            return cand
        # tentative tracks miss at most tentative_max_gap_s: the newest sets the step
        step = self._t - float(tr.t_obs[rows].max())
        ratio = min(s.tentative_speed * step, _MAX_BUFFER)
        if ratio <= 0:
            return cand
        grown = _expand(tr.obs[rows], ratio)
        return self._candidates(grown, f, s.tentative_match_iou, rows, _expand(f.xyxy, ratio))

    def _first_stage(self, c: _Candidates, predicted: F64, f: _Frame) -> _Candidates:
        """Stage 1 scores: IoU, or height-modulated IoU (which then also gates),
        plus the OC-SORT direction term."""
        s = self.settings
        if not (s.height_iou or s.direction_weight > 0) or c.rows.size == 0:
            return c
        iou = c.iou
        if s.height_iou:
            iou = iou * height_iou(predicted[c.rows], f.xyxy[c.cols])
        if s.direction_weight > 0:
            return self._with_direction(c, f, iou, s.direction_weight)
        return _Candidates(c.rows, c.cols, iou, iou)

    def _with_direction(self, c: _Candidates, f: _Frame, iou: F64, weight: float) -> _Candidates:
        """Candidates scored ``iou`` plus OC-SORT's direction agreement."""
        tr = self.tracks
        w = weight * f.conf[c.cols].astype(np.float64)
        anchor = tr.anchors[c.rows, 0, :2]
        obs = tr.obs[c.rows]
        motion = 0.5 * (obs[:, 0:2] + obs[:, 2:4]) - anchor  # anchor -> last observation
        extra = direction_score(motion, anchor, f.z[c.cols, :2], w)
        return _Candidates(c.rows, c.cols, iou, iou + extra)

    def _apply(self, f: _Frame, match: I64, now: float) -> I64:
        """Update matched tracks, age the rest, start new ones; ids per detection."""
        tr = self.tracks
        dets = np.nonzero(match >= 0)[0]
        rows = match[dets]
        ids = np.full(f.xyxy.shape[0], -1, np.int64)
        if rows.size:
            status = tr.status[rows]
            self._correct(rows, status, f, dets, now)
            self._observe(rows, f, dets, now)
            tentative = status == TENTATIVE
            promote = tentative & (tr.hits[rows] >= self.settings.min_hits)
            # lost tracks are back; tentative ones are promoted or stay tentative
            tr.status[rows] = np.where(tentative ^ promote, TENTATIVE, TRACKED)
            if _any(promote):
                self._confirm(rows[promote])
            found = tr.track_id[rows]
            found[f.conf[dets] < self.settings.report_threshold] = 0
            ids[dets] = found
            ids[ids == 0] = -1
        if len(tr) > rows.size:
            unmatched = np.ones(len(tr), bool)
            unmatched[rows] = False
            self._age(unmatched, now)
        born = np.nonzero(f.high & (match < 0) & (f.conf >= self.settings.new_track_threshold))[0]
        if born.size:
            started = self._start(f, born, now)
            started[f.conf[born] < self.settings.report_threshold] = -1
            ids[born] = started
        return ids

    def _correct(
        self, rows: I64, status: NDArray[np.int8], f: _Frame, dets: I64, now: float
    ) -> None:
        """Kalman update of matched rows (with OC-SORT re-update for returning tracks)."""
        tr, z = self.tracks, f.z[dets]
        r_scale = None
        if self.settings.low_noise != 1.0:
            r_scale = np.where(f.low[dets], self.settings.low_noise, 1.0)
        mean, cov = kalman.update(tr.mean[rows], tr.cov[rows], z, self._noise, r_scale)
        back = status == LOST
        if self.settings.reupdate and _any(back):
            gap = now - tr.t_obs[rows]
            back &= gap > 0
            obs = tr.obs[rows[back]]
            last = 0.5 * (obs[:, 0:2] + obs[:, 2:4])
            # centre velocity from the whole gap; size velocities restart at zero
            # (over short gaps a size change is mostly detector noise)
            velocity = np.zeros((last.shape[0], kalman.DIM))
            velocity[:, :2] = (z[back, :2] - last) / gap[back, None]
            mean[back, kalman.DIM :] = velocity
        tr.mean[rows], tr.cov[rows] = mean, cov

    def _observe(self, rows: I64, f: _Frame, dets: I64, now: float) -> None:
        """Record the matched observation and move the direction anchors along."""
        tr = self.tracks
        tr.hits[rows] += 1
        tr.t_obs[rows] = now
        tr.obs[rows] = f.xyxy[dets]
        tr.class_id[rows] = f.cls[dets]
        if self.settings.direction_weight == 0 and self.settings.recovery_direction_weight == 0:
            return
        # two-slot lag: the anchor is always between one and two windows old
        anchors = tr.anchors
        due = now - anchors[rows, 1, 2] >= self.settings.direction_window_s
        if _any(due):
            roll = rows[due]
            anchors[roll, 0] = anchors[roll, 1]
            anchors[roll, 1, :2] = f.z[dets[due], :2]
            anchors[roll, 1, 2] = now

    def _confirm(self, rows: I64) -> None:
        tr = self.tracks
        tr.status[rows] = TRACKED
        tr.track_id[rows] = np.arange(self._next_id, self._next_id + rows.size)
        self._next_id += int(rows.size)

    def _age(self, unmatched: Mask, now: float) -> None:
        """Unmatched tracked tracks become lost; stale tentative/lost ones are dropped."""
        tr, s = self.tracks, self.settings
        status = tr.status
        newly_lost = unmatched & (status == TRACKED)
        if _any(newly_lost):
            status[newly_lost] = LOST
            tr.mean[newly_lost, kalman.DIM + 2 :] = 0.0  # stop growing/shrinking while unseen
        limit = np.where(status == TENTATIVE, s.tentative_max_gap_s, s.max_lost_s)
        drop = unmatched & (now - tr.t_obs > limit)
        if _any(drop):
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
            anchors=np.repeat(np.column_stack([f.z[dets, :2], np.full(n, now)])[:, None], 2, 1),
            class_id=f.cls[dets].astype(np.int32),
        )
        first = len(self.tracks)
        self.tracks.extend(new)
        first_update = self._updates == 0 and self.settings.confirm_first_update
        if first_update or self.settings.min_hits <= 1:
            self._confirm(np.arange(first, first + n, dtype=np.int64))
        return np.where(self.tracks.track_id[first:] > 0, self.tracks.track_id[first:], -1)
