"""The model registry: which detectors a fleet serves, by name.

Each entry names a model file (a path, relative to the registry file, or a
``file://`` URI), its format, input size, class names, the GPU memory it needs
(``vram_mb``, what a worker counts against its budget) and its own canary: an
image and the detections expected on it (at least N of a class, above a
confidence). A stream names its model (the ingest's stream setting ``model``,
the orchestrator's ``StreamSpec.model``); the worker loads it on demand
(:mod:`gpu_worker.model_pool`) and the orchestrator's canary checks every
loaded model against its own expectation (:mod:`deploy.health`).

The registry is a TOML or JSON file::

    [models.vehicles]
    file = "vehicles.onnx"
    format = "yolox"
    input_w = 416
    input_h = 416
    classes = ["car", "bus", "truck"]
    vram_mb = 300
    canary = { image = "kitti17-000001.jpg", expect = { car = 1 }, min_confidence = 0.5 }

:data:`BUILTIN` (the shipped COCO YOLOX-Nano, canary: at least 3 persons on
frame 1 of TUD-Stadtmitte) is always there unless a file redefines its name.
A bad file is a :class:`~framerelay.errors.ConfigError` with one line saying
where, never a traceback. A worker reads a registry on a shared volume through its
volume (``read``: the bytes only when the volume's signed manifest lists them,
:mod:`gpu_worker.volume`); the entries' model files are checked when they load.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import unquote, urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from framerelay.coco import COCO_CLASSES
from framerelay.data import CANARY_STILL, DEFAULT_MODEL
from framerelay.errors import ConfigError

BUILTIN_NAME = "yolox_nano"
"""The shipped model's name (also ``StreamSpec.model``'s default)."""
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_FILE_BYTES = 1024 * 1024
Reader = Callable[[Path, int], bytes]
"""(path, n) -> at most n + 1 bytes of the file; OSError or ConfigError when it cannot."""
ModelName = Annotated[str, StringConstraints(pattern=MODEL_NAME)]
ClassName = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class CanarySpec(BaseModel):
    """A model's canary: an image and what must be found on it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    image: Path = Field(description="A JPEG (relative to the registry file).")
    expect: dict[ClassName, Annotated[int, Field(ge=1, le=10_000)]] = Field(
        min_length=1, max_length=64, description="class name -> at least this many detections"
    )
    min_confidence: float = Field(0.25, ge=0.0, le=1.0)


class ModelEntry(BaseModel):
    """One model of the registry."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: ModelName
    file: Path = Field(description="The model file (a path, or given as a file:// URI).")
    format: Literal["auto", "yolox", "ultralytics"] = "auto"
    input_w: int = Field(gt=0, le=8192)
    input_h: int = Field(gt=0, le=8192)
    classes: tuple[ClassName, ...] = Field(min_length=1, max_length=10_000)
    vram_mb: float = Field(gt=0, le=1_000_000, description="GPU memory it needs loaded (MiB).")
    canary: CanarySpec

    @model_validator(mode="after")
    def _expected_classes_exist(self) -> ModelEntry:
        unknown = sorted(set(self.canary.expect) - set(self.classes))
        if unknown:
            raise ValueError(f"canary expects {unknown}, which are not among its classes")
        return self

    def info(self) -> dict[str, object]:
        """What a worker says about it (``/info``, HELLO)."""
        return {"name": self.name, "input_w": self.input_w, "input_h": self.input_h,
                "classes": len(self.classes), "vram_mb": self.vram_mb}  # fmt: skip


BUILTIN = ModelEntry(
    name=BUILTIN_NAME,
    file=DEFAULT_MODEL,
    format="yolox",
    input_w=416,
    input_h=416,
    classes=COCO_CLASSES,
    vram_mb=256.0,
    canary=CanarySpec(image=CANARY_STILL, expect={"person": 3}),
)


class ModelRegistry:
    """Entries by name; :meth:`get` says which names exist when one does not."""

    def __init__(self, entries: Mapping[str, ModelEntry]) -> None:
        self.entries = dict(entries)

    def get(self, name: str) -> ModelEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise ConfigError(f"unknown model {name[:64]!r}; the registry has {self.names()}")
        return entry

    def names(self) -> str:
        return ", ".join(sorted(self.entries)) or "none"

    def __contains__(self, name: object) -> bool:
        return name in self.entries


def builtin_registry() -> ModelRegistry:
    return ModelRegistry({BUILTIN_NAME: BUILTIN})


def load_registry(path: Path | None, read: Reader | None = None) -> ModelRegistry:
    """The built-in entry plus those of ``path`` (TOML or JSON), its bytes from ``read``
    (default: the file as it is); ConfigError on any fault."""
    registry = builtin_registry()
    if path is None:
        return registry
    raw = _read(path, read or _read_file)
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(models, dict) or set(raw) - {"models"}:
        raise ConfigError(f"{path}: expected one table 'models' of name -> model")
    for name, fields in models.items():
        registry.entries[name] = _entry(path, name, fields)
    return registry


def _read_file(path: Path, max_bytes: int) -> bytes:
    with path.open("rb") as fh:
        return fh.read(max_bytes + 1)


def _read(path: Path, read: Reader) -> object:
    try:
        data = read(path, MAX_FILE_BYTES)
    except OSError as exc:
        raise ConfigError(f"model registry {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"model registry {path} is over {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode()
        return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"model registry {path}: not valid {_kind(path)}: {exc}") from None


def _kind(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "TOML"


def _entry(path: Path, name: str, fields: object) -> ModelEntry:
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: models.{name[:64]} must be a table")
    data = {**fields, "name": name}
    base = path.resolve().parent
    try:
        data["file"] = _model_file(fields, base)
        canary = dict(fields.get("canary") or {})
        if "image" in canary:
            canary["image"] = base / str(canary["image"])
        data["canary"] = canary
        data.pop("uri", None)
        return ModelEntry.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: models.{name[:64]}.{where}: {err['msg']}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: models.{name[:64]}: {exc}") from None


def _model_file(fields: Mapping[str, object], base: Path) -> Path:
    """``file`` (relative to the registry) or ``uri`` (``file://`` only), exactly one."""
    file, uri = fields.get("file"), fields.get("uri")
    if (file is None) == (uri is None):
        raise ConfigError("give exactly one of 'file' and 'uri'")
    if file is not None:
        return base / str(file)
    parsed = urlparse(str(uri))
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        raise ConfigError(
            f"uri scheme {parsed.scheme or 'none'!r} is not supported: only file:// "
            "(put the file on the pod's volume and name it there)"
        )
    return Path(unquote(parsed.path))


def check_files(registry: ModelRegistry) -> list[str]:
    """One line per model file or canary image that is missing (empty: all present)."""
    out = []
    for entry in registry.entries.values():
        for what, p in (("model file", entry.file), ("canary image", entry.canary.image)):
            if not p.is_file():
                out.append(f"model {entry.name}: {what} not found: {p}")
    return out
