"""Settings models of the SORT-family trackers (one per registered tracker).

Every threshold on time is in seconds, every threshold on confidence is a
detector score in [0, 1], every IoU is in [0, 1]. The three models differ only
in their defaults: which association stages are on.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracker.kalman import KalmanNoise


class SortSettings(BaseModel):
    """Common settings; the defaults are those of the ``hybrid`` tracker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- which detections take part
    high_threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="Detections at or above this score are 'high'."
    )
    low_threshold: float = Field(
        0.1, ge=0.0, le=1.0, description="Detections below this score are ignored entirely."
    )
    new_track_threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="Unmatched high detections at/above this start a track."
    )
    report_threshold: float = Field(
        0.4,
        ge=0.0,
        le=1.0,
        description="Detections below this score may keep a track alive but are "
        "returned with tracker_id -1 (their boxes are often partial).",
    )
    class_aware: bool = Field(
        True, description="Only match a detection to a track of the same class_id."
    )
    # --- association stages
    match_iou: float = Field(
        0.2, ge=0.0, le=1.0, description="Stage 1 (high detections, all tracks): minimum IoU."
    )
    height_iou: bool = Field(
        True, description="Stage 1 uses IoU x vertical-extent IoU (Hybrid-SORT's HMIoU)."
    )
    use_low_stage: bool = Field(
        True, description="Stage 2 (ByteTrack): match low detections to still-tracked tracks."
    )
    low_match_iou: float = Field(0.3, ge=0.0, le=1.0, description="Stage 2: minimum IoU.")
    low_stage_lost: bool = Field(
        True, description="Stage 2 also offers low detections to lost tracks (as roboflow's)."
    )
    direction_weight: float = Field(
        0.0, ge=0.0, le=2.0, description="OC-SORT momentum: weight of direction agreement."
    )
    direction_window_s: float = Field(
        0.12, ge=0.0, le=10.0, description="Baseline (s) of a track's motion direction."
    )
    recovery: bool = Field(
        True, description="Stage 3 (OC-SORT OCR): match leftover tracks by their last observed box."
    )
    recovery_iou: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Stage 3: minimum IoU (last observed boxes go stale; in crowds "
        "a low bar hands a lost track to whoever walks past).",
    )
    recovery_speed: float = Field(
        2.0,
        ge=0.0,
        le=20.0,
        description="Stage 3: how far (box sizes per second) a target may have moved "
        "since its last observed box; that box and the detections are grown by this x "
        "the time since the track was seen (at most recovery_max_buffer) before IoU "
        "(0: off).",
    )
    recovery_max_buffer: float = Field(
        0.35,
        ge=0.0,
        le=1.0,
        description="Stage 3: the most (fraction of their size) boxes are grown by "
        "recovery_speed; after a longer gap, a generous buffer hands the track to "
        "whoever walks past.",
    )
    recovery_direction_weight: float = Field(
        0.2, ge=0.0, le=2.0, description="Stage 3: weight of direction agreement."
    )
    recovery_buffer: float = Field(
        0.0, ge=0.0, le=2.0, description="Stage 3: grow last boxes by this x size (C-BIoU)."
    )
    reupdate: bool = Field(
        False, description="OC-SORT ORU: velocity from the gap when a lost track returns."
    )
    tentative_match_iou: float = Field(
        0.3, ge=0.0, le=1.0, description="Stage 4 (tentative tracks, high detections): minimum IoU."
    )
    tentative_speed: float = Field(
        2.0,
        ge=0.0,
        le=20.0,
        description="Stage 4: how far (box sizes per second) a target may move; a "
        "tentative track and the detections are grown by this x the time since it "
        "was seen (at most by their size) before IoU (0: off).",
    )
    # --- lifecycle (time in seconds)
    min_hits: int = Field(2, ge=1, le=100, description="Matches before a track is confirmed.")
    confirm_first_update: bool = Field(
        True, description="On the very first update (or after reset) confirm new tracks at once."
    )
    tentative_max_gap_s: float = Field(
        0.2, ge=0.0, le=60.0, description="A tentative track unmatched for longer is dropped."
    )
    max_lost_s: float = Field(
        1.2, ge=0.0, le=3600.0, description="A confirmed track unmatched for longer is dropped."
    )
    max_gap_s: float = Field(
        10.0,
        ge=0.0,
        le=60.0,
        description="An outage (stream re-homed to another worker) up to this long is "
        "bridged: tracks are predicted over it instead of aged (0: never).",
    )
    # --- Kalman noise (fractions of box size; see tracker.kalman)
    r_pos: float = Field(0.05, gt=0.0, le=10.0, description="Measurement std.")
    q_pos: float = Field(0.3, ge=0.0, le=100.0, description="Position noise per sqrt(s).")
    q_vel: float = Field(1.0, ge=0.0, le=100.0, description="Velocity noise per s per sqrt(s).")
    init_pos: float = Field(0.1, gt=0.0, le=10.0, description="Initial position std.")
    init_vel: float = Field(1.5, gt=0.0, le=100.0, description="Initial velocity std per s.")
    outlier_sigma: float = Field(
        2.0, ge=0.0, le=100.0, description="Robust update beyond this many sigmas (0: off)."
    )
    low_noise: float = Field(
        3.0,
        ge=1.0,
        le=100.0,
        description="Measurement std of a low detection (stage 2) x this: its box is "
        "often partial or merged, so it moves the filter less (1: like any other).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low_threshold > self.high_threshold:
            raise ValueError(
                f"low_threshold ({self.low_threshold}) must not exceed "
                f"high_threshold ({self.high_threshold})"
            )
        return self

    def noise(self) -> KalmanNoise:
        return KalmanNoise(
            self.r_pos, self.q_pos, self.q_vel, self.init_pos, self.init_vel, self.outlier_sigma
        )


class HybridSettings(SortSettings):
    """``hybrid`` (also ``default``): ByteTrack's two stages plus OC-SORT's
    momentum, recovery and re-update."""


class _PaperSettings(SortSettings):
    """What ``bytetrack`` and ``ocsort`` keep from the papers where ``hybrid`` was
    retuned on the development set (issue 16): ByteTrack's new-track threshold, stage
    2 gate and 30-frame (1 s) lost buffer, no low-stage extras, the first noise tuning."""

    new_track_threshold: float = Field(0.6, ge=0.0, le=1.0, description="ByteTrack's 0.6.")
    low_match_iou: float = Field(0.5, ge=0.0, le=1.0, description="ByteTrack's 0.5 (stage 2).")
    low_stage_lost: bool = Field(False, description="Stage 2 for tracked tracks only.")
    low_noise: float = Field(1.0, ge=1.0, le=100.0, description="Plain Kalman update.")
    tentative_max_gap_s: float = Field(0.0, ge=0.0, le=60.0, description="Dropped at a miss.")
    max_lost_s: float = Field(1.0, ge=0.0, le=3600.0, description="30 frames at 30 fps.")
    q_pos: float = Field(0.25, ge=0.0, le=100.0, description="Position noise per sqrt(s).")


class ByteTrackSettings(_PaperSettings):
    """``bytetrack``: high then low confidence association, no OC-SORT steps
    (plain IoU, plain Kalman update, as in the paper)."""

    height_iou: bool = Field(False, description="Off for ByteTrack.")
    outlier_sigma: float = Field(0.0, ge=0.0, le=100.0, description="Off for ByteTrack.")
    report_threshold: float = Field(0.0, ge=0.0, le=1.0, description="ByteTrack reports all.")
    recovery_direction_weight: float = Field(0.0, ge=0.0, le=2.0, description="Off for ByteTrack.")
    recovery: bool = Field(False, description="Off for ByteTrack.")
    recovery_speed: float = Field(0.0, ge=0.0, le=20.0, description="Off for ByteTrack.")
    reupdate: bool = Field(False, description="Off for ByteTrack.")
    tentative_speed: float = Field(0.0, ge=0.0, le=20.0, description="Off for ByteTrack.")


class OCSortSettings(_PaperSettings):
    """``ocsort``: OC-SORT (momentum, recovery, re-update) without the low stage
    (plain IoU, plain Kalman update, as in the paper)."""

    height_iou: bool = Field(False, description="Off for OC-SORT.")
    outlier_sigma: float = Field(0.0, ge=0.0, le=100.0, description="Off for OC-SORT.")
    report_threshold: float = Field(0.0, ge=0.0, le=1.0, description="OC-SORT reports all.")
    use_low_stage: bool = Field(False, description="Off for OC-SORT.")
    reupdate: bool = Field(True, description="OC-SORT's observation-centric re-update.")
    direction_weight: float = Field(
        0.2, ge=0.0, le=2.0, description="OC-SORT momentum in stage 1 (the paper's 0.2)."
    )
    recovery_direction_weight: float = Field(
        0.0, ge=0.0, le=2.0, description="OC-SORT's recovery is IoU only."
    )
    recovery_iou: float = Field(0.2, ge=0.0, le=1.0, description="OC-SORT's 0.2 (stage 3).")
    recovery_speed: float = Field(0.0, ge=0.0, le=20.0, description="Off for OC-SORT.")
    tentative_speed: float = Field(0.0, ge=0.0, le=20.0, description="Off for OC-SORT.")
