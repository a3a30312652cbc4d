"""Warm pools on a schedule: how many workers a tier keeps warm at a time.

A tier keeps ``min_warm`` workers outside its windows (zero for batch-only
tiers) and ``window.min_warm`` inside one. It scales up ``lead_s`` *before* a
window opens (a GPU pod takes minutes to pull and warm up) and, after a window
ends, its extra workers are drained (streams moved off) and stopped.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

from deploy.settings import TierConfig, Window


def _in_window(w: Window, local: dt.datetime) -> bool:
    t = local.timetz().replace(tzinfo=None)
    if w.start <= w.end:
        return local.weekday() in w.days and w.start <= t < w.end
    # overnight: the part after start belongs to the start day, the rest to the day before
    if t >= w.start:
        return local.weekday() in w.days
    return t < w.end and (local.weekday() - 1) % 7 in w.days


def active_windows(
    tier: TierConfig, t: float, tz: ZoneInfo, *, lead_s: float = 0.0
) -> list[Window]:
    """Windows open at ``t`` (or opening within ``lead_s``)."""
    local = dt.datetime.fromtimestamp(t, tz)
    ahead = dt.datetime.fromtimestamp(t + lead_s, tz)
    return [w for w in tier.windows if _in_window(w, local) or _in_window(w, ahead)]


def in_window(tier: TierConfig, t: float, tz: ZoneInfo) -> bool:
    """True while a window is open (no lead): batch streams may run."""
    return bool(active_windows(tier, t, tz)) or not tier.windows


def warm_target(tier: TierConfig, t: float, tz: ZoneInfo) -> int:
    """Workers the schedule alone wants warm at ``t`` (demand may ask for more)."""
    windows = active_windows(tier, t, tz, lead_s=tier.lead_s)
    if windows:
        return min(tier.max_workers, max(w.min_warm for w in windows))
    if tier.batch_only and tier.windows:
        return 0
    return min(tier.max_workers, tier.min_warm)


def may_run(tier: TierConfig, t: float, tz: ZoneInfo) -> bool:
    """Whether the tier may have any worker at ``t`` (batch-only: windows only)."""
    if not tier.batch_only or not tier.windows:
        return True
    return bool(active_windows(tier, t, tz, lead_s=tier.lead_s))
