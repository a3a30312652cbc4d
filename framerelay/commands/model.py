"""``framerelay model``: export and inspect detector models.

* ``framerelay model export MODEL.pt [--out PATH.onnx] [--imgsz 640] [--opset N]
  [--dynamic/--no-dynamic] [--half]`` writes the ONNX the worker serves, then
  loads it with the worker's own detector as a self-check.
* ``framerelay model info PATH`` prints a model's inputs, outputs, format and
  class names.

The work happens in :mod:`gpu_worker.export`, imported inside the handlers so
that ``framerelay --help`` needs neither onnxruntime nor Ultralytics.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_worker.export import ModelReport

_MAX_NAMES = 20


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``model`` with its ``export`` and ``show`` (alias ``info``) sub-commands."""
    parser = subparsers.add_parser(
        "model",
        help="export and inspect detector models",
        description="Export Ultralytics .pt models to ONNX and inspect model files.",
    )
    sub = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    _add_export(sub)
    _add_info(sub)


def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help="export an Ultralytics .pt detector to the ONNX the worker serves",
        description=(
            "Export an Ultralytics YOLO .pt detector to ONNX (needs the [ultralytics] "
            "extra), then load it with the worker's ONNX detector as a self-check."
        ),
    )
    p.add_argument("model", type=Path, metavar="MODEL.pt", help="Ultralytics checkpoint")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH.onnx",
        help="where to write the ONNX file (default: beside MODEL, .onnx)",
    )
    p.add_argument(
        "--imgsz",
        type=int,
        default=640,
        help="square input size in pixels, a multiple of 32 (default 640)",
    )
    p.add_argument(
        "--opset",
        type=int,
        default=None,
        help="ONNX opset (default: the best one for the installed torch/onnx)",
    )
    p.add_argument(
        "--dynamic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="symbolic batch axis so the worker can batch streams (default on); "
        "height and width stay fixed",
    )
    p.add_argument(
        "--half",
        action="store_true",
        help="FP16 weights (inputs and outputs stay float32); for GPU serving",
    )
    p.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip loading the result with the worker's detector",
    )
    p.set_defaults(func=_export)


def _add_info(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "show",
        aliases=["info"],
        help="print a model's inputs, outputs, format and class names",
        description="Describe an .onnx model (or a .pt one, with the [ultralytics] extra).",
    )
    p.add_argument("path", type=Path, metavar="PATH", help=".onnx or .pt model file")
    p.add_argument(
        "--providers",
        default="auto",
        choices=["auto", "tensorrt", "cuda", "cpu"],
        help="ONNX Runtime providers to try (default: auto)",
    )
    p.set_defaults(func=_info)


def _export(args: argparse.Namespace) -> int:
    from gpu_worker.export import ExportOptions, check_model_path, export_onnx, self_check

    check_model_path(args.model, (".pt",))
    options = ExportOptions(
        imgsz=args.imgsz, opset=args.opset, dynamic_batch=args.dynamic, half=args.half
    )
    out = export_onnx(args.model, args.out, options)
    print(f"exported {args.model} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")
    if args.check:
        report = self_check(out)
        print("self-check: loaded with the worker's ONNX detector")
        _print_report(report)
    return 0


def _info(args: argparse.Namespace) -> int:
    from gpu_worker.export import describe

    _print_report(describe(args.path, provider=args.providers))
    return 0


def _print_report(report: ModelReport) -> None:
    rows: list[tuple[str, str]] = [("model", str(report.path)), ("format", report.file_format)]
    rows += [("input", str(t)) for t in report.inputs]
    rows += [("output", str(t)) for t in report.outputs]
    if report.input_size is not None:
        rows.append(("input size", f"{report.input_size[0]}x{report.input_size[1]} (w x h)"))
    rows.append(("layout", report.layout))
    rows.append(("classes", f"{len(report.class_names)}: {_names(report.class_names)}"))
    if report.providers:
        rows.append(("providers", ", ".join(report.providers)))
    rows += [(f"meta {k}", v) for k, v in sorted(report.metadata.items())]
    if report.ms_per_image is not None:
        rows.append(
            (
                "speed",
                f"{report.ms_per_image:.1f} ms/image (batch of {report.batch_images}, one run)",
            )
        )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key.ljust(width)}  {value}")


def _names(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:_MAX_NAMES])
    return shown + (f", ... (+{len(names) - _MAX_NAMES})" if len(names) > _MAX_NAMES else "")
