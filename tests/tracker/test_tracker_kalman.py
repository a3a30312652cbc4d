"""The vectorised compact Kalman filter against the textbook dense 8x8 filter."""

from __future__ import annotations

import numpy as np
import pytest

from tracker import kalman
from tracker.kalman import KalmanNoise


def _dense_q(mean: np.ndarray, dt: float, noise: KalmanNoise) -> np.ndarray:
    s = np.maximum(mean[:, [2, 3, 2, 3]], 1.0)
    q = np.concatenate([(noise.q_pos * s) ** 2 * dt, (noise.q_vel * s) ** 2 * dt], axis=1)
    return np.stack([np.diag(row) for row in q])


def _dense_predict(
    mean: np.ndarray, cov: np.ndarray, dt: float, noise: KalmanNoise
) -> tuple[np.ndarray, np.ndarray]:
    f = kalman.transition(dt)
    return mean @ f.T, f @ kalman.dense(cov) @ f.T + _dense_q(mean, dt, noise)


def _dense_update(
    mean: np.ndarray,
    cov: np.ndarray,
    z: np.ndarray,
    noise: KalmanNoise,
    r_scale: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    h = np.eye(4, 8)
    p = kalman.dense(cov)
    s = np.maximum(mean[:, [2, 3, 2, 3]], 1.0)
    if r_scale is not None:
        s = s * r_scale[:, None]
    r = np.stack([np.diag(row) for row in (noise.r_pos * s) ** 2])
    big_s = h @ p @ h.T + r
    gain = p @ h.T @ np.linalg.inv(big_s)
    new_mean = mean + np.einsum("nij,nj->ni", gain, z - mean[:, :4])
    new_p = (np.eye(8) - gain @ h) @ p
    return new_mean, new_p


CASES = [
    # (boxes [cx, cy, w, h], velocities, dt, noise)
    ([[100, 100, 40, 80]], [[0, 0, 0, 0]], 0.04, KalmanNoise()),
    ([[100, 100, 40, 80], [5, 7, 0.5, 2]], [[30, -10, 1, 2], [0, 0, 0, 0]], 0.2, KalmanNoise()),
    ([[640, 360, 200, 400]], [[-100, 5, 0, 0]], 1.5, KalmanNoise(0.1, 0.5, 2.0, 0.2, 3.0)),
    ([[10, 10, 10, 10]] * 3, [[1, 2, 3, 4]] * 3, 1 / 60, KalmanNoise(0.02, 0.1, 0.3, 0.05, 1.0)),
]


@pytest.mark.parametrize(("boxes", "vel", "dt", "noise"), CASES)
def test_predict_matches_dense_filter(
    boxes: list[list[float]], vel: list[list[float]], dt: float, noise: KalmanNoise
) -> None:
    mean, cov = kalman.initiate(np.array(boxes, float), noise)
    mean[:, 4:] = vel
    want_mean, want_cov = _dense_predict(mean, cov, dt, noise)
    got_mean, got_cov = kalman.predict(mean, cov, dt, noise)
    np.testing.assert_allclose(got_mean, want_mean, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(kalman.dense(got_cov), want_cov, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize(("boxes", "vel", "dt", "noise"), CASES)
def test_update_matches_dense_filter(
    boxes: list[list[float]], vel: list[list[float]], dt: float, noise: KalmanNoise
) -> None:
    mean, cov = kalman.initiate(np.array(boxes, float), noise)
    mean[:, 4:] = vel
    mean, cov = kalman.predict(mean, cov, dt, noise)
    z = mean[:, :4] + np.array([3.0, -2.0, 1.0, 0.5])
    want_mean, want_cov = _dense_update(mean, cov, z, noise)
    got_mean, got_cov = kalman.update(mean, cov, z, noise)
    np.testing.assert_allclose(got_mean, want_mean, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(kalman.dense(got_cov), want_cov, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize(("boxes", "vel", "dt", "noise"), CASES)
def test_update_with_per_row_measurement_noise_matches_dense_filter(
    boxes: list[list[float]], vel: list[list[float]], dt: float, noise: KalmanNoise
) -> None:
    mean, cov = kalman.initiate(np.array(boxes, float), noise)
    mean[:, 4:] = vel
    mean, cov = kalman.predict(mean, cov, dt, noise)
    z = mean[:, :4] + np.array([3.0, -2.0, 1.0, 0.5])
    r_scale = np.linspace(1.0, 4.0, len(boxes))
    want_mean, want_cov = _dense_update(mean, cov, z, noise, r_scale)
    got_mean, got_cov = kalman.update(mean, cov, z, noise, r_scale)
    np.testing.assert_allclose(got_mean, want_mean, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(kalman.dense(got_cov), want_cov, rtol=1e-10, atol=1e-9)


def test_noisier_measurement_moves_the_state_less() -> None:
    noise = KalmanNoise()
    mean, cov = kalman.initiate(np.array([[100.0, 100.0, 40.0, 80.0]] * 2), noise)
    z = mean[:, :4] + 10.0
    got, _ = kalman.update(mean, cov, z, noise, np.array([1.0, 3.0]))
    assert np.all(got[1, :4] - mean[1, :4] < got[0, :4] - mean[0, :4])


@pytest.mark.parametrize("dt", [0.0, -0.5])
def test_predict_without_time_passing_changes_nothing(dt: float) -> None:
    mean, cov = kalman.initiate(np.array([[50.0, 60, 20, 40]]), KalmanNoise())
    mean[:, 4:] = 10.0
    got_mean, got_cov = kalman.predict(mean, cov, dt, KalmanNoise())
    assert np.array_equal(got_mean, mean) and np.array_equal(got_cov, cov)


def test_inputs_are_not_modified() -> None:
    mean, cov = kalman.initiate(np.array([[50.0, 60, 20, 40]]), KalmanNoise())
    m0, c0 = mean.copy(), cov.copy()
    kalman.predict(mean, cov, 0.1, KalmanNoise())
    kalman.update(mean, cov, np.array([[51.0, 61, 20, 40]]), KalmanNoise())
    assert np.array_equal(mean, m0) and np.array_equal(cov, c0)


@pytest.mark.parametrize(
    "times",
    [
        np.arange(0, 3, 1 / 25),  # 25 fps
        np.arange(0, 3, 1 / 5),  # 5 fps sampling
        np.cumsum(np.r_[0, np.random.default_rng(3).uniform(0.01, 0.3, 40)]),  # VFR
    ],
    ids=["25fps", "5fps", "vfr"],
)
def test_velocity_is_learned_in_pixels_per_second_at_any_rate(times: np.ndarray) -> None:
    """A box moving at 60 px/s: the filter's velocity converges to 60 px/s
    whatever the frame spacing, because prediction uses real time."""
    noise = KalmanNoise()
    true_v = np.array([60.0, -20.0, 0.0, 0.0])
    start = np.array([100.0, 300.0, 40.0, 100.0])
    mean, cov = kalman.initiate(start[None], noise)
    last = times[0]
    for t in times[1:]:
        mean, cov = kalman.predict(mean, cov, float(t - last), noise)
        mean, cov = kalman.update(mean, cov, (start + true_v * t)[None], noise)
        last = t
    np.testing.assert_allclose(mean[0, 4:], true_v, atol=3.0)
    np.testing.assert_allclose(mean[0, :4], start + true_v * times[-1], atol=1.0)


@pytest.mark.parametrize(
    ("xyxy", "z"),
    [
        ([0, 0, 10, 20], [5, 10, 10, 20]),
        ([-4, 2, 4, 6], [0, 4, 8, 4]),
        ([3.5, 3.5, 3.5, 3.5], [3.5, 3.5, 0, 0]),
    ],
)
def test_box_conversions_round_trip(xyxy: list[float], z: list[float]) -> None:
    got = kalman.xyxy_to_z(np.array([xyxy], np.float32))
    np.testing.assert_allclose(got, [z])
    np.testing.assert_allclose(kalman.z_to_xyxy(got), [xyxy])


def test_empty_inputs() -> None:
    mean, cov = kalman.initiate(np.empty((0, 4)), KalmanNoise())
    assert mean.shape == (0, 8) and cov.shape == (0, 3, 4)
    assert kalman.predict(mean, cov, 1.0, KalmanNoise())[0].shape == (0, 8)
    assert kalman.update(mean, cov, np.empty((0, 4)), KalmanNoise())[1].shape == (0, 3, 4)
