"""Boxes, track ids and labels drawn on RGB frames with numpy (no OpenCV needed).

Text uses a built-in 5x7 bitmap font (digits, lower-case letters, a few signs)
scaled by an integer factor; anything else is drawn as ``?``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from framerelay.results import DetectionOut

Image = npt.NDArray[np.uint8]

_FONT: dict[str, tuple[int, ...]] = {
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14),
    "2": (14, 17, 1, 2, 4, 8, 31), "3": (31, 2, 4, 2, 1, 17, 14),
    "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8),
    "8": (14, 17, 17, 14, 17, 17, 14), "9": (14, 17, 17, 15, 1, 2, 12),
    "a": (0, 0, 14, 1, 15, 17, 15), "b": (16, 16, 22, 25, 17, 17, 30),
    "c": (0, 0, 14, 16, 16, 17, 14), "d": (1, 1, 13, 19, 17, 17, 15),
    "e": (0, 0, 14, 17, 31, 16, 14), "f": (6, 9, 8, 28, 8, 8, 8),
    "g": (0, 15, 17, 17, 15, 1, 14), "h": (16, 16, 22, 25, 17, 17, 17),
    "i": (4, 0, 12, 4, 4, 4, 14), "j": (2, 0, 6, 2, 2, 18, 12),
    "k": (16, 16, 18, 20, 24, 20, 18), "l": (12, 4, 4, 4, 4, 4, 14),
    "m": (0, 0, 26, 21, 21, 17, 17), "n": (0, 0, 22, 25, 17, 17, 17),
    "o": (0, 0, 14, 17, 17, 17, 14), "p": (0, 0, 30, 17, 30, 16, 16),
    "q": (0, 0, 13, 19, 15, 1, 1), "r": (0, 0, 22, 25, 16, 16, 16),
    "s": (0, 0, 14, 16, 14, 1, 30), "t": (8, 8, 28, 8, 8, 9, 6),
    "u": (0, 0, 17, 17, 17, 19, 13), "v": (0, 0, 17, 17, 17, 10, 4),
    "w": (0, 0, 17, 17, 21, 21, 10), "x": (0, 0, 17, 10, 4, 10, 17),
    "y": (0, 0, 17, 17, 15, 1, 14), "z": (0, 0, 31, 2, 4, 8, 31),
    "#": (10, 10, 31, 10, 31, 10, 10), ".": (0, 0, 0, 0, 0, 12, 12),
    "-": (0, 0, 0, 31, 0, 0, 0), ":": (0, 12, 12, 0, 12, 12, 0),
    " ": (0, 0, 0, 0, 0, 0, 0), "?": (14, 17, 1, 2, 4, 0, 4),
}  # fmt: skip
_GLYPHS = {
    ch: np.array([[(row >> (4 - c)) & 1 for c in range(5)] for row in rows], dtype=bool)
    for ch, rows in _FONT.items()
}
PALETTE: tuple[tuple[int, int, int], ...] = (
    (255, 56, 56), (56, 255, 56), (56, 128, 255), (255, 200, 0), (255, 0, 255),
    (0, 255, 255), (255, 128, 0), (160, 80, 255), (0, 200, 120), (255, 100, 160),
)  # fmt: skip
UNTRACKED = (200, 200, 200)
THICKNESS = 2
SCALE = 2


def color_of(det: DetectionOut) -> tuple[int, int, int]:
    return PALETTE[det.tracker_id % len(PALETTE)] if det.tracker_id >= 0 else UNTRACKED


def label_of(det: DetectionOut) -> str:
    track = f"#{det.tracker_id} " if det.tracker_id >= 0 else ""
    return f"{track}{det.class_name} {det.confidence:.2f}".lower()


def box_pixels(det: DetectionOut, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The box in whole pixels, clipped to the image: x1, y1, x2, y2 (inclusive)."""
    h, w = shape[0], shape[1]
    x1, y1, x2, y2 = (round(v) for v in det.box)

    def clip(v: int, hi: int) -> int:
        return max(0, min(v, hi - 1))

    return clip(x1, w), clip(y1, h), clip(x2, w), clip(y2, h)


def draw_box(img: Image, det: DetectionOut) -> None:
    """The box outline (``THICKNESS`` px, inside the box) and its label above it."""
    x1, y1, x2, y2 = box_pixels(det, img.shape)
    color = np.array(color_of(det), dtype=np.uint8)
    t = THICKNESS
    img[y1 : y1 + t, x1 : x2 + 1] = color
    img[max(y1, y2 - t + 1) : y2 + 1, x1 : x2 + 1] = color
    img[y1 : y2 + 1, x1 : x1 + t] = color
    img[y1 : y2 + 1, max(x1, x2 - t + 1) : x2 + 1] = color
    draw_label(img, label_of(det), x1, y1, color)


def label_area(text: str, x: int, y: int, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Where a label drawn at box corner (x, y) goes: x1, y1, x2, y2 (exclusive ends)."""
    h, w = shape[0], shape[1]
    tw, th = len(text) * 6 * SCALE + SCALE, 9 * SCALE
    top = y - th if y - th >= 0 else min(y + THICKNESS, max(0, h - th))
    left = min(x, max(0, w - tw))
    return left, top, min(w, left + tw), min(h, top + th)


def draw_label(img: Image, text: str, x: int, y: int, color: npt.NDArray[np.uint8]) -> None:
    x1, y1, x2, y2 = label_area(text, x, y, img.shape)
    img[y1:y2, x1:x2] = color
    ink = np.array((0, 0, 0) if int(color.astype(np.int32).sum()) > 380 else (255, 255, 255),
                   dtype=np.uint8)  # fmt: skip
    for i, ch in enumerate(text):
        glyph = _GLYPHS.get(ch, _GLYPHS["?"])
        big = np.kron(glyph, np.ones((SCALE, SCALE), dtype=bool))
        gx, gy = x1 + SCALE + i * 6 * SCALE, y1 + SCALE
        region = img[gy : gy + big.shape[0], gx : gx + big.shape[1]]
        region[big[: region.shape[0], : region.shape[1]]] = ink


def draw_detections(img: Image, detections: list[DetectionOut]) -> None:
    for det in detections:
        draw_box(img, det)
