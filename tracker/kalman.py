"""A vectorised, time-aware constant-velocity Kalman filter for boxes.

All tracks live in one set of arrays: ``mean`` is (N, 8) ``[cx, cy, w, h, vcx,
vcy, vw, vh]`` (pixels and pixels per second), ``cov`` is (N, 8, 8). Every
function works on all tracks (or a selected subset) at once; there is no
per-track Python object.

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

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

DIM = 4
"""Measured components: cx, cy, w, h."""
STATE = 2 * DIM
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
    """

    r_pos: float = 0.05
    q_pos: float = 0.25
    q_vel: float = 1.0
    init_pos: float = 0.1
    init_vel: float = 1.5


def xyxy_to_z(xyxy: NDArray[np.floating]) -> F64:
    """(N, 4) corner boxes to (N, 4) ``[cx, cy, w, h]``."""
    b = np.asarray(xyxy, np.float64)
    z = np.empty_like(b)
    z[:, 2] = b[:, 2] - b[:, 0]
    z[:, 3] = b[:, 3] - b[:, 1]
    z[:, 0] = b[:, 0] + 0.5 * z[:, 2]
    z[:, 1] = b[:, 1] + 0.5 * z[:, 3]
    return z


def z_to_xyxy(z: F64) -> F64:
    """(N, >=4) ``[cx, cy, w, h, ...]`` to (N, 4) corner boxes."""
    out = np.empty((z.shape[0], 4), np.float64)
    half_w = 0.5 * z[:, 2]
    half_h = 0.5 * z[:, 3]
    out[:, 0] = z[:, 0] - half_w
    out[:, 1] = z[:, 1] - half_h
    out[:, 2] = z[:, 0] + half_w
    out[:, 3] = z[:, 1] + half_h
    return out


def _scale(z: F64) -> F64:
    """Per-component size scale ``[w, h, w, h]`` (N, 4), at least one pixel."""
    wh = np.maximum(z[:, 2:4], _MIN_SIZE)
    return np.concatenate([wh, wh], axis=1)


def initiate(z: F64, noise: KalmanNoise) -> tuple[F64, F64]:
    """New tracks at measurements ``z`` (N, 4), at rest, with a wide covariance."""
    n = z.shape[0]
    mean = np.zeros((n, STATE))
    mean[:, :DIM] = z
    s = _scale(z)
    var = np.concatenate([(noise.init_pos * s) ** 2, (noise.init_vel * s) ** 2], axis=1)
    cov = np.zeros((n, STATE, STATE))
    idx = np.arange(STATE)
    cov[:, idx, idx] = var
    return mean, cov


def transition(dt: float) -> F64:
    """The (8, 8) constant-velocity transition over ``dt`` seconds."""
    f = np.eye(STATE)
    f[np.arange(DIM), np.arange(DIM) + DIM] = dt
    return f


def predict(mean: F64, cov: F64, dt: float, noise: KalmanNoise) -> tuple[F64, F64]:
    """Move every track ``dt`` seconds ahead (``dt <= 0`` leaves them as they are)."""
    if dt <= 0.0 or mean.shape[0] == 0:
        return mean, cov
    f = transition(dt)
    new_mean = mean @ f.T
    new_cov = f @ cov @ f.T
    s = _scale(mean)
    idx = np.arange(STATE)
    new_cov[:, idx, idx] += np.concatenate([(noise.q_pos * s) ** 2, (noise.q_vel * s) ** 2], 1) * dt
    return new_mean, new_cov


def update(mean: F64, cov: F64, z: F64, noise: KalmanNoise) -> tuple[F64, F64]:
    """Correct tracks (N, 8)/(N, 8, 8) with their matched measurements ``z`` (N, 4)."""
    if mean.shape[0] == 0:
        return mean, cov
    r = (noise.r_pos * _scale(mean)) ** 2
    s_mat = cov[:, :DIM, :DIM].copy()
    idx = np.arange(DIM)
    s_mat[:, idx, idx] += r
    ph_t = cov[:, :, :DIM]  # P H^T, (N, 8, 4)
    # K = P H^T S^-1, solved as S K^T = H P (S is symmetric positive definite)
    gain = np.linalg.solve(s_mat, np.transpose(ph_t, (0, 2, 1))).transpose(0, 2, 1)
    innovation = z - mean[:, :DIM]
    new_mean = mean + np.einsum("nij,nj->ni", gain, innovation)
    new_cov = cov - gain @ cov[:, :DIM, :]
    return new_mean, new_cov


__all__ = [
    "DIM",
    "STATE",
    "KalmanNoise",
    "initiate",
    "predict",
    "transition",
    "update",
    "xyxy_to_z",
    "z_to_xyxy",
]
