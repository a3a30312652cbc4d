"""The Detections currency validates at construction."""

from __future__ import annotations

import numpy as np
import pytest

from framerelay.detections import Detections


def test_defaults_and_dtypes() -> None:
    # array-likes of other dtypes on purpose: the coercion is what is tested
    d = Detections(xyxy=[[0, 0, 1, 1]], confidence=[0.5], class_id=[3])  # type: ignore[arg-type]
    assert d.xyxy.dtype == np.float32 and d.confidence.dtype == np.float32
    assert d.class_id.dtype == np.int32 and d.tracker_id.dtype == np.int64
    assert d.tracker_id.tolist() == [-1]
    assert len(Detections.empty()) == 0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (
            {"xyxy": [[0, 0, 1]], "confidence": [1], "class_id": [0]},
            r"xyxy must have shape \(N, 4\), got \(1, 3\)",
        ),
        (
            {"xyxy": [[0, 0, 1, 1]], "confidence": [1, 2], "class_id": [0]},
            r"confidence must have shape \(1\)",
        ),
        (
            {"xyxy": [[0, 0, 1, 1]], "confidence": [1], "class_id": []},
            r"class_id must have shape \(1\)",
        ),
        (
            {"xyxy": [[0, 0, 1, 1]], "confidence": [1], "class_id": [0], "tracker_id": [1, 2]},
            "tracker_id",
        ),
        ({"xyxy": [[np.inf, 0, 1, 1]], "confidence": [1], "class_id": [0]}, "NaN or infinite"),
    ],
)
def test_bad_shapes_name_expected_and_actual(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Detections(**kwargs)  # type: ignore[arg-type]


def test_select_concat_and_replace_ids() -> None:
    d = Detections(
        xyxy=np.arange(12).reshape(3, 4),  # type: ignore[arg-type]
        confidence=[0.1, 0.5, 0.9],  # type: ignore[arg-type]
        class_id=[0, 1, 2],  # type: ignore[arg-type]
    )  # array-likes of other dtypes, converted at construction
    sub = d[d.confidence > 0.3]
    assert sub.class_id.tolist() == [1, 2]
    both = Detections.concatenate([sub, d[[0]]])
    assert both.class_id.tolist() == [1, 2, 0]
    assert both.with_tracker_id([7, 8, 9]).tracker_id.tolist() == [7, 8, 9]
    assert Detections.concatenate([]).equals(Detections.empty())
