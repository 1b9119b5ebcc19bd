"""The options of ``model.predict`` / ``model.track``, ``model.val`` and ``model.export`` as data.

Each option is a field declared with :func:`libreyolo.options.option` (default, help, check), as
the training options are (:mod:`libreyolo.engine.config`): the predictor checks a call's options
through :class:`PredictOptions`, and the CLI's parser, its --help and docs/options.md are made from
the same fields. This module imports no torch (the CLI parses its command line before torch is
imported); checks that need it import it when they run.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..data.video import DEFAULT_TIMEOUT
from ..export import FORMATS
from ..options import (
    AMP_FAMILY_DEFAULT,
    MAX_DET,
    MAX_WORKERS,
    Bool,
    Choice,
    Custom,
    Float,
    Fraction,
    Int,
    OptionError,
    Text,
    check_classes_text,
    check_fields,
    check_imgsz,
    check_int,
    check_max_det,
    did_you_mean,
    option,
    parse_amp,
)

__all__ = ["TRACK_CONF", "ExportOptions", "PredictOptions", "TrackOptions", "ValOptions"]

#: ``model.track``'s default ``conf``: detections from here on reach the tracker
TRACK_CONF = 0.1


def _imgsz(name: str, value: Any) -> int:
    # the family's stride is applied once the model is known (rounding up, with one warning)
    return check_imgsz(value, 1, name)


def _amp(name: str, value: Any) -> Any:
    """``amp`` kept as False, True (the family's autocast dtype), "fp16" or "bf16"."""
    import torch
    dtype = parse_amp(value)
    if dtype is None:
        return False
    if dtype is AMP_FAMILY_DEFAULT:
        return True
    return "bf16" if dtype is torch.bfloat16 else "fp16"


def _cuda_graph(name: str, value: Any) -> bool | str:
    from ..graphs.runner import normalize_mode
    return normalize_mode(value)


def _precision(name: str, value: Any) -> str:
    from .fastpath import parse_precision
    try:
        return parse_precision(value)
    except OptionError:
        raise
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _fast(name: str, value: Any) -> bool | str:
    from .fastpath import parse_fast
    return parse_fast(value)


def _decode(name: str, value: Any) -> str:
    from ..data.jpeg import parse_decode
    return parse_decode(value)


def _max_det(name: str, value: Any) -> int:
    return check_max_det(value)[0]


def _opset(name: str, value: Any) -> int:
    from ..export.onnx import MIN_OPSET
    return check_int(name, value, MIN_OPSET)


def _output_format(name: str, value: Any) -> Any:
    from ..options import check_choice
    return None if value is None else check_choice(name, str(value).lower().lstrip("."), ("jpg", "jpeg", "png",
                                                                                          "webp"))


_IMGSZ = Custom(_imgsz, "positive integer (pixels), rounded up to the family's stride", none=True)
_AMP = Custom(_amp, "false, true (the family's dtype), fp16 or bf16")


@dataclass
class PredictOptions:
    """The options of one ``model.predict`` call (see :meth:`libreyolo.engine.predictor.Predictor.__call__`).

    Fields with ``tasks`` in their metadata are the tasks' own predict options (detection's
    ``conf``...): a model of another task refuses them, and only those given reach the task's plan
    (the task's defaults, equal to these, apply otherwise).
    """

    imgsz: Any = option(None, "inference size (default: the model's)", _IMGSZ)
    batch: int = option(1, "images per forward", Int(1))
    cuda_graph: Any = option(False, "false, true (capture each new input signature) or auto (capture once a "
                                    "signature repeats)", Custom(_cuda_graph, "false, true or auto"))
    amp: Any = option(False, "autocast on CUDA: false, true (the family's dtype), fp16 or bf16", _AMP)
    precision: Any = option(None, "fp32 (default, bitwise), fp16 or bf16: the half network (fp16 with fast=true)",
                            Custom(_precision, "fp32, fp16 or bf16", none=True))
    fast: Any = option(False, "CUDA: compile the half network with inductor inside the CUDA graph: true "
                              "(torch.compile) or aot (ahead of time, a package per shape cached on disk)",
                       Custom(_fast, "false, true or aot"))
    decode: Any = option(None, "image files: cpu (default: PIL), gpu (JPEGs with nvjpeg, batched) or auto (gpu "
                               "where it can run)", Custom(_decode, "cpu, gpu or auto", none=True))
    bgr: Any = option(None, "numpy images are BGR (default, OpenCV's order); false: RGB", Bool(none=True),
                      cli=False)
    color_format: Any = option("auto", "numpy images' channel order: bgr (default, OpenCV's) or rgb",
                               Choice("auto", "bgr", "rgb"), cli=False)
    save: bool = option(False, "write annotated images (a video: an annotated .mp4)", Bool())
    save_dir: Any = option(None, "where annotated images go (default: a new runs/<task>/predict, predict2, ...; "
                                 "track: runs/detect/track, ...)",
                           Text("path"))
    exist_ok: bool = option(False, "save into runs/<task>/predict itself instead of a new numbered folder", Bool())
    output_path: Any = option(None, "with save: a folder for the annotated images (as save_dir), or a file path "
                                    "with a suffix for the first one (later ones beside it, numbered)",
                              Text("path"), cli=False)
    output_file_format: Any = option(None, "with save: the annotated images' format, jpg, png or webp (default: "
                                           "jpg; a matte png)", Custom(_output_format, "jpg, png or webp",
                                                                        none=True), cli=False)
    device: Any = option(None, "move the model to this device before predicting (e.g. cpu, cuda:0)", Text("device"),
                         cli=False)
    half: Any = option(None, "accepted and ignored, as LibreYOLO 1.6.0 does (a warning says so); the half path "
                             "is precision=fp16", Bool(none=True), cli=False)
    augment: bool = option(False, "detection: test-time augmentation, the image at 1, 0.83 (flipped) and 0.67 of "
                                  "imgsz, the boxes merged", Bool())
    tiling: bool = option(False, "detection: sliced inference of large images, overlapping tiles of tile pixels "
                                 "each predicted at imgsz, the boxes merged", Bool())
    tile: Any = option(None, "with tiling: the tiles' side in the image's pixels (default: imgsz)",
                       Int(1, none=True))
    overlap_ratio: float = option(0.2, "with tiling: neighbouring tiles overlap by this fraction of a tile",
                                  Float(0.0, 1.0, max_inclusive=False))
    tile_full: bool = option(True, "with tiling: also predict the whole image at imgsz and merge its boxes (SAHI's "
                                   "full pass)", Bool())
    tile_merge: str = option("ios", "with tiling: boxes of one object merged by ios (intersection over the smaller "
                                    "box, SAHI's) or iou, above the iou threshold", Choice("ios", "iou"))
    verbose: bool = option(False, "a progress bar", Bool())
    profile: bool = option(False, "synchronize between the stages so that Results.speed is exact", Bool())
    stream: bool = option(False, "yield the results one step at a time (constant memory; files decoded lazily)",
                          Bool())
    vid_stride: int = option(1, "predict every N-th frame of a video", Int(1))
    show: bool = option(False, "show the annotated frames in a window (where a display exists)", Bool())
    timeout: float = option(DEFAULT_TIMEOUT, "seconds a camera or stream URL may take to answer",
                            Float(0.0, min_inclusive=False))
    strict: bool = option(False, "an unreadable file of a directory or glob stops the call (default: a warning "
                                 "naming it, and the rest go on)", Bool())
    threads: Any = option(None, "torch's intra-op threads on the CPU (default: from the cores this process can "
                                "get: affinity, cgroup quota, load; also LIBREYOLO_THREADS)", Int(1, none=True))
    # ---- the tasks' own options
    conf: float = option(0.25, "detection, pose, segment, obb, point: confidence threshold", Fraction(),
                         tasks=("detect", "pose", "segment", "obb", "point"))
    iou: float = option(0.45, "detection, pose, segment, obb: NMS IoU threshold (pose: the dense families, e.g. "
                              "YOLO-NAS-Pose)", Fraction(), tasks=("detect", "pose", "segment", "obb"))
    max_det: int = option(300, "detection, pose, segment, obb, point: detections kept per image (an ONNX model: "
                               "its exported max_det)", Custom(_max_det, f"integer in [1, {MAX_DET}]"),
                          tasks=("detect", "pose", "segment", "obb", "point"))
    max_nms: int = option(1000, "detection, segment: candidates per image entering NMS (default 1000, or max_det "
                                "when larger)", Int(1), tasks=("detect", "segment"))
    classes: Any = option(None, "detection, pose, segment, obb, point: only these classes, ids or names, e.g. 0,2 "
                                "or person,car", Custom(check_classes_text, "class ids or names", none=True),
                          tasks=("detect", "pose", "segment", "obb", "point"))
    agnostic_nms: bool = option(False, "detection, segment, obb: NMS across classes", Bool(),
                                tasks=("detect", "segment", "obb"))
    topk: int = option(5, "classification: classes returned per image", Int(1), tasks=("classify",))
    prompts: Any = option(None, "classification with a text tower (CLIP, SigLIP 2): zero-shot classes, text "
                                "prompts separated by commas, e.g. 'a cat,a dog'; segment-prompt: 'grid' for "
                                "automatic mask generation (every object; also what a Python call without a "
                                "prompt does)", Text("prompts"), tasks=("classify", "segment-prompt"))
    det_thresh: float = option(0.3, "ocr: text-pixel threshold of the detector's map", Fraction(), tasks=("ocr",))
    box_thresh: float = option(0.6, "ocr: mean score a text box needs", Fraction(), tasks=("ocr",))
    unclip_ratio: float = option(2.0, "ocr: how far a text box is grown", Float(0.0), tasks=("ocr",))
    rec_conf: float = option(0.0, "ocr: confidence a recognised line needs", Fraction(), tasks=("ocr",))
    max_lines: int = option(1000, "ocr: text lines per image at most", Int(1), tasks=("ocr",))
    rec_batch: int = option(8, "ocr: lines recognised per forward", Int(1, 256), tasks=("ocr",))
    points: Any = option(None, "segment-prompt: points x,y;x,y in pixels, or 'center' (the default without "
                               "boxes)", Text("points"), tasks=("segment-prompt",))
    labels: Any = option(None, "segment-prompt: one label per point, 1 foreground / 0 background, e.g. 1,0",
                         Text("labels"), tasks=("segment-prompt",))
    boxes: Any = option(None, "segment-prompt: boxes x1,y1,x2,y2;... in pixels", Text("boxes"),
                        tasks=("segment-prompt",))
    multimask: bool = option(True, "segment-prompt: three candidate masks, as SAM gives, or one", Bool(),
                             tasks=("segment-prompt",))
    mask_input: Any = option(None, "segment-prompt (SAM, SAM 2, EdgeTAM): a mask prompt, alone or with points / "
                                   "boxes: a .npy of low-resolution logits (a previous call's Results.masks.logits[i]) "
                                   "or an image file whose non-zero pixels are the mask (Python: the array itself)",
                             Text("a file (.npy logits, or an image of a binary mask); Python: an array or tensor"),
                             tasks=("segment-prompt",))
    threshold: float = option(0.8, "panoptic: class probability a query needs to make a segment", Fraction(),
                              tasks=("panoptic",))
    mask_threshold: float = option(0.5, "panoptic: mask probability of a segment's pixels", Fraction(),
                                   tasks=("panoptic",))
    overlap_threshold: float = option(0.8, "panoptic: share of its own mask a query must win (else it is dropped "
                                           "as occluded)", Fraction(), tasks=("panoptic",))
    tile_overlap: Any = option(None, "restore: pixels the tiles (imgsz a side) overlap their neighbours by, blended "
                                     "across (default: 16, at most a quarter of imgsz)", Int(0, none=True),
                               tasks=("restore",))
    tile_batch: int = option(4, "restore: tiles per forward (the last batch filled up: one shape)", Int(1),
                             tasks=("restore",))
    nms_radius: int = option(1, "point: a peak of the centroid map must be its class's largest within this many "
                                "cells (0: every cell above conf)", Int(0), tasks=("point",))
    points_per_side: int = option(32, "segment-prompt, prompts=grid: grid points per side", Int(1),
                                  tasks=("segment-prompt",))
    points_per_batch: int = option(64, "segment-prompt, prompts=grid: grid points decoded together", Int(1),
                                   tasks=("segment-prompt",))
    pred_iou_thresh: float = option(0.88, "segment-prompt, prompts=grid: predicted IoU a mask needs", Fraction(),
                                    tasks=("segment-prompt",))
    stability_score_thresh: float = option(0.95, "segment-prompt, prompts=grid: stability score a mask needs",
                                           Fraction(), tasks=("segment-prompt",))
    box_nms_thresh: float = option(0.7, "segment-prompt, prompts=grid: NMS IoU threshold between masks' boxes",
                                   Fraction(), tasks=("segment-prompt",))

    @classmethod
    def task_names(cls) -> set[str]:
        """The names of the tasks' own options."""
        return {f.name for f in fields(cls) if f.metadata.get("tasks")}

    @classmethod
    def build(cls, task: Any, kwargs: dict[str, Any]) -> tuple[PredictOptions, dict[str, Any]]:
        """The checked options of a call with keywords ``kwargs`` on a model of ``task`` (a
        :class:`~libreyolo.tasks.base.Task`), and the task's own options that were given (what
        its plan takes). An option that neither predict nor the task takes is a TypeError listing
        the known ones; a bad value an OptionError naming it."""
        generic = [f.name for f in fields(cls) if not f.metadata.get("tasks")]
        own = set(task.predict_defaults)
        unknown = sorted(set(kwargs) - set(generic) - own)
        if unknown:
            raise TypeError(f"unknown predict option(s) {', '.join(unknown)} for a {task.name} model"
                            f"{did_you_mean(unknown, [*generic, *own])}; known: {', '.join(generic)}, "
                            + ", ".join(task.predict_defaults))
        declared = cls.task_names()
        opts = cls(**{k: v for k, v in kwargs.items() if k in generic or k in declared})
        check_fields(opts, [k for k in kwargs if k in generic or k in declared])
        task_opts = {k: (getattr(opts, k) if k in declared else v) for k, v in kwargs.items() if k in own}
        return opts, task_opts


@dataclass
class TrackOptions(PredictOptions):
    """``model.track``: predict's options, the tracker's, and a lower default ``conf``."""

    conf: float = option(TRACK_CONF, "confidence threshold (detections below the tracker's 0.25 only extend "
                                     "tracks)", Fraction(), tasks=("detect",))
    tracker: Any = option("bytetrack", "bytetrack, botsort, ocsort or deepocsort (or, from Python, a tracker "
                                       "object)", Custom(lambda n, v: v, "bytetrack, botsort, ocsort or deepocsort"))
    persist: bool = option(False, "keep the trackers (and their ids) from the previous track call", Bool())
    frame: int = option(0, "segment-prompt video (SAM 2, EdgeTAM): the frame the prompt (points, labels, boxes) is on",
                        Int(0), tasks=("segment-prompt",))
    obj_id: int = option(1, "segment-prompt video (SAM 2, EdgeTAM): the id of the prompted object", Int(0),
                         tasks=("segment-prompt",))


@dataclass
class ValOptions:
    """``model.val``: the metrics of the current weights on a dataset's validation split."""

    data: Any = option(None, "dataset YAML, a dataset folder, or a built-in set by name (e.g. shapes); required "
                             "(default: none)", Text("path or built-in name"))
    imgsz: Any = option(None, "size (default: the model's)", _IMGSZ)
    batch: int = option(16, "batch size", Int(1))
    workers: int = option(2, "DataLoader workers", Int(0, MAX_WORKERS))
    verbose: bool = option(False, "a progress bar", Bool())
    save_json: bool = option(False, "detection: also write the predictions as COCO results (predictions.json)",
                             Bool())
    save_dir: Any = option(None, "where predictions.json goes (default: a new runs/<task>/val, val2, ...)",
                           Text("path"))
    threads: Any = option(None, "torch's intra-op threads on the CPU (default: from the cores this process can "
                                "get: affinity, cgroup quota, load; also LIBREYOLO_THREADS)", Int(1, none=True))
    conf: float = option(0.001, "detection: confidence threshold", Fraction(), tasks=("detect",))
    iou: float = option(0.7, "detection, pose: NMS IoU threshold (pose: the dense families, e.g. YOLO-NAS-Pose)",
                        Fraction(), tasks=("detect", "pose"))


@dataclass
class ExportOptions:
    """``model.export``: the format and its options (see :func:`libreyolo.export.onnx.export_onnx`)."""

    format: str = option("onnx", "export format", Choice(*FORMATS))
    file: Any = option(None, "where to write (default: beside the checkpoint, same name, .onnx or .torchscript; "
                             "openvino: a <name>_openvino_model directory)", Text("path"))
    imgsz: Any = option(None, "input size (default: the model's)", _IMGSZ)
    batch: int = option(1, "batch size of a static graph", Int(1))
    dynamic: bool = option(False, "symbolic batch, height and width", Bool())
    half: bool = option(False, "float16 weights (onnxruntime's CPU fp16 kernels are limited; openvino: refused)",
                        Bool())
    simplify: bool = option(False, "run onnxscript's optimizer over the graph", Bool())
    opset: Any = option(None, "ONNX opset (default 17)", Custom(_opset, "integer >= 11", none=True))
    max_det: int = option(300, "detection, segment, obb: instances per image (rows of the output)",
                          Custom(_max_det, f"integer in [1, {MAX_DET}]"))
    max_nms: Any = option(None, "detection, segment: candidates per image entering NMS (default 1000, or "
                                "max_det when larger)", Int(1, none=True))
    agnostic_nms: bool = option(False, "detection, segment, obb: NMS across classes", Bool())
    topk: int = option(5, "classification: classes the graph returns", Int(1))
    int8: bool = option(False, "openvino, engine: int8 post-training quantization calibrated on data=", Bool())
    data: Any = option(None, "int8's calibration set: a built-in set's name or a dataset YAML (its training images)",
                       Text("path or name"))
