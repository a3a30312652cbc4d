"""The tunnel's description of a model a worker serves (HELLO's ``models``)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

MODEL_NAME_CHARS = 64
ModelName = Annotated[str, Meta(min_length=1, max_length=MODEL_NAME_CHARS)]
"""A model's name on the wire (OPEN's and RESULT's ``model``)."""
MAX_MODELS = 16
"""HELLO lists at most this many models."""


class ModelInfo(Struct, frozen=True, kw_only=True):
    """A model a worker serves: what a stream's frames and results need to know of it."""

    name: ModelName
    input_w: Annotated[int, Meta(gt=0, le=8192)]
    input_h: Annotated[int, Meta(gt=0, le=8192)]
    class_names: Annotated[list[Annotated[str, Meta(max_length=128)]], Meta(max_length=10_000)]
