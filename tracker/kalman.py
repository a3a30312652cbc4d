"""A vectorised, time-aware constant-velocity Kalman filter for boxes.

All tracks live in one set of arrays: ``mean`` is (N, 8) ``[cx, cy, w, h, vcx,
vcy, vw, vh]`` (pixels and pixels per second). Every function works on all
tracks (or a selected subset) at once; there is no per-track Python object.

The transition, the measurement matrix and every noise matrix act on each of
the four components (cx, cy, w, h) and its velocity separately, so the 8x8
covariance of the textbook filter is block-sparse: it only ever has entries
``var(x_k)``, ``cov(x_k, v_k)`` and ``var(v_k)``. ``cov`` therefore holds just
those, as (N, 3, 4) rows ``[PP, PV, VV]``; the update needs no matrix inverse,
and the result is identical to the dense filter (:func:`dense` rebuilds the
8x8 matrix; the tests check both give the same numbers).

Time is continuous: :func:`predict` takes the real time step ``dt`` in seconds.
Process noise is a random walk on position and velocity, so its variance grows
linearly with ``dt`` and does not depend on the frame rate::

    Q(dt) = diag((q_pos * s)^2 * dt, (q_vel * s)^2 * dt),   s = [w, h, w, h]

Noise scales with the box size (as in DeepSORT/ByteTrack/BoT-SORT), so the
filter behaves the same for near and far objects. The measurement is the box
``[cx, cy, w, h]`` with noise ``(r_pos * s)^2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

DIM = 4
"""Measured components: cx, cy, w, h."""
STATE = 2 * DIM
PP, PV, VV = 0, 1, 2
"""Rows of the compact covariance: var(position), cov(position, velocity), var(velocity)."""
_MIN_SIZE = 1.0
"""Sizes used for noise scaling are clamped to at least one pixel."""


@dataclass(frozen=True, slots=True)
class KalmanNoise:
    """Noise levels, as fractions of the box size (see the module docstring).

    Attributes:
        r_pos: measurement std (fraction of size).
        q_pos: position random-walk std per sqrt(second) (fraction of size).
        q_vel: velocity random-walk std per second per sqrt(second).
        init_pos: initial position std (fraction of size).
        init_vel: initial velocity std per second (fraction of size).
        outlier_sigma: innovations beyond this many standard deviations are
            down-weighted (robust update); 0 turns that off.
    """

    r_pos: float = 0.05
    q_pos: float = 0.25
    q_vel: float = 1.0
    init_pos: float = 0.1
    init_vel: float = 1.5
    outlier_sigma: float = 0.0


def xyxy_to_z(xyxy: NDArray[np.floating]) -> F64:
    """(N, 4) corner boxes to (N, 4) ``[cx, cy, w, h]``."""
    b = np.asarray(xyxy, np.float64)
    wh = b[:, 2:4] - b[:, 0:2]
    return np.concatenate([b[:, 0:2] + 0.5 * wh, wh], axis=1)


def z_to_xyxy(z: F64) -> F64:
    """(N, >=4) ``[cx, cy, w, h, ...]`` to (N, 4) corner boxes."""
    half = 0.5 * z[:, 2:4]
    return np.concatenate([z[:, 0:2] - half, z[:, 0:2] + half], axis=1)


_WHWH = [2, 3, 2, 3]


def _scale(z: F64) -> F64:
    """Per-component size scale ``[w, h, w, h]`` (N, 4), at least one pixel."""
    return np.maximum(z[:, _WHWH], _MIN_SIZE)


def initiate(z: F64, noise: KalmanNoise) -> tuple[F64, F64]:
    """New tracks at measurements ``z`` (N, 4), at rest, with a wide covariance."""
    n = z.shape[0]
    mean = np.zeros((n, STATE))
    mean[:, :DIM] = z
    s = _scale(z)
    cov = np.zeros((n, 3, DIM))
    cov[:, PP] = (noise.init_pos * s) ** 2
    cov[:, VV] = (noise.init_vel * s) ** 2
    return mean, cov


@lru_cache(maxsize=8)
def transition(dt: float) -> F64:
    """The (8, 8) constant-velocity transition over ``dt`` seconds (read-only, cached:
    streams mostly repeat the same few time steps)."""
    f = np.eye(STATE)
    f[np.arange(DIM), np.arange(DIM) + DIM] = dt
    f.setflags(write=False)
    return f


@lru_cache(maxsize=8)
def _cov_transition(dt: float) -> F64:
    """How ``[PP, PV, VV]`` of each component move under ``F = [[1, dt], [0, 1]]``."""
    m = np.array([[1.0, 2.0 * dt, dt * dt], [0.0, 1.0, dt], [0.0, 0.0, 1.0]])
    m.setflags(write=False)
    return m


@lru_cache(maxsize=8)
def _process_noise(dt: float, q_pos: float, q_vel: float) -> F64:
    """(3, 1) random-walk variances added to ``[PP, PV, VV]`` per squared size."""
    q = np.array([[q_pos**2 * dt], [0.0], [q_vel**2 * dt]])
    q.setflags(write=False)
    return q


def predict(mean: F64, cov: F64, dt: float, noise: KalmanNoise) -> tuple[F64, F64]:
    """Move every track ``dt`` seconds ahead (``dt <= 0`` leaves them as they are).

    Per component: ``x += dt v``; ``P = F P F^T + Q`` with ``F = [[1, dt], [0, 1]]``,
    i.e. ``PP += 2 dt PV + dt^2 VV + Q_pos``, ``PV += dt VV``, ``VV += Q_vel``.
    Returns new arrays; the inputs are not modified.
    """
    if dt <= 0.0 or mean.shape[0] == 0:
        return mean, cov
    new_mean = mean @ transition(dt).T
    s2 = _scale(mean)
    s2 *= s2
    new_cov = _cov_transition(dt) @ cov
    new_cov += _process_noise(dt, noise.q_pos, noise.q_vel) * s2[:, None, :]
    return new_mean, new_cov


def update(
    mean: F64, cov: F64, z: F64, noise: KalmanNoise, r_scale: F64 | None = None
) -> tuple[F64, F64]:
    """Correct tracks (N, 8)/(N, 3, 4) with their matched measurements ``z`` (N, 4).

    Per component: ``S = P_pp + R``, gain ``K = [P_pp, P_pv] / S``,
    ``x += K (z - x_pos)``, ``P = (I - K H) P``. ``r_scale`` (N,), when given,
    multiplies each measurement's noise std (e.g. less trust in a low-score box).
    """
    if mean.shape[0] == 0:
        return mean, cov
    scale = _scale(mean)
    if r_scale is not None:
        scale = scale * r_scale[:, None]
    s = cov[:, PP] + (noise.r_pos**2) * (scale * scale)
    innovation = z - mean[:, :DIM]
    if noise.outlier_sigma > 0.0:
        # Huber-style: a component more than ``outlier_sigma`` standard deviations
        # off gets its measurement noise inflated, so one merged or clipped box
        # cannot throw the velocity off
        s = s * np.maximum(1.0, np.abs(innovation) / (noise.outlier_sigma * np.sqrt(s)))
    gain = cov[:, PP:VV] / s[:, None, :]  # (N, 2, 4): position and velocity gains
    new_mean = mean + (gain * innovation[:, None, :]).reshape(-1, STATE)
    new_cov = np.empty_like(cov)
    new_cov[:, PP:VV] = cov[:, PP:VV] * (1.0 - gain[:, 0:1])  # PP, PV times (1 - K_pos)
    new_cov[:, VV] = cov[:, VV] - gain[:, 1] * cov[:, PV]
    return new_mean, new_cov


def dense(cov: F64) -> F64:
    """The full (N, 8, 8) covariance that the compact (N, 3, 4) form stands for."""
    n = cov.shape[0]
    out = np.zeros((n, STATE, STATE))
    i = np.arange(DIM)
    out[:, i, i] = cov[:, PP]
    out[:, i, i + DIM] = cov[:, PV]
    out[:, i + DIM, i] = cov[:, PV]
    out[:, i + DIM, i + DIM] = cov[:, VV]
    return out


__all__ = [
    "DIM",
    "STATE",
    "KalmanNoise",
    "dense",
    "initiate",
    "predict",
    "transition",
    "update",
    "xyxy_to_z",
    "z_to_xyxy",
]
