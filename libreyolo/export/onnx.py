"""ONNX export: the network plus the task's post-processing as one graph, with the model's metadata.

What the graph takes
    ``images``: float32 (B, 3, S, S) RGB in [0, 1], already resized the family's way (the
    ``preprocess`` metadata: letterboxed with grey 114 at the top-left or centre, stretched, or
    resized and centre-cropped), in NCHW. The per-channel mean / std normalization, when the
    family has one, is inside the graph. The resize stays outside because its output is not a
    uint8 image: eager predict resizes the uint8 pixels to float without rounding, and a uint8
    graph input would round them (up to half a grey level per pixel), which moves boxes by more
    than the 1e-3 px the parity tests hold the export to. ``Preprocess.resize_images`` (torch,
    any device) or the recipe in docs/export.md produce the input.

What it returns, per task
    * detect: ``dets`` float32 (B, max_det, 6) ``[x1, y1, x2, y2, score, class]`` in the input
      canvas' pixels, best first, rows past ``num_dets`` (int64 (B,)) zero. Inputs
      ``conf_threshold`` (1,) and ``iou_threshold`` (1,) float32 and ``class_mask`` float32
      (nc,) (1 keeps a class, 0 drops it) make the thresholds and the class filter run-time
      values. The stage is the one eager predict runs: decode, the top ``max_nms`` candidates
      by score, the confidence and class filters, class-aware NMS through ONNX
      ``NonMaxSuppression`` (classes kept apart by eager's box offsets, so the IoUs compared are
      the same numbers), then a fixed-size selection of the first ``max_det`` survivors. The
      DETR-line families (``NMS = False``) skip the NMS: their top-k is the output.
    * segment: ``dets`` (B, max_det, 6) and ``num_dets`` as detect's (the same inputs and
      stage: decode, top ``max_nms``, the task's ``>`` threshold and class mask, NMS for the
      dense families - RTMDet-Ins - and none for the DETR line - D-FINE-seg), plus
      ``mask_logits`` float32 (B, max_det, h, w): each kept instance's mask logits from the
      family's ``mask_logits`` (prototypes x dynamic-conv coefficients, or query embedding x mask
      feature) at the family's mask resolution (S/8 for RTMDet-Ins, S/4 for D-FINE-seg), zero
      past ``num_dets``. The loader samples them at each image's pixels (the letterbox inverted,
      bilinear), cuts them to the box and thresholds them at logit 0 with the segment task's own
      ``PredictPlan.results``: a resize to every image's own size cannot be one fixed graph.
    * obb: ``dets`` float32 (B, max_det, 7) ``[cx, cy, w, h, angle, score, class]`` (canvas
      pixels, radians, the longer side first), ``num_dets``; inputs as detect's. A dense family
      (YOLO-NAS-R) runs the obb task's rotated NMS inside the graph - ProbIoU overlaps of its
      score-sorted candidates, above ``iou_threshold`` within a class, then the greedy walk as one
      ONNX ``Loop`` (:func:`rotated_suppress`); a set-prediction one (RT-DETRv2-OBB) has none.
      Then the task's ``>=`` threshold, the class mask and the first ``max_det``. The loader
      maps the rows back through the obb task's own ``PredictPlan.results``.
    * classify: ``probs`` (B, nc) softmax, ``top_conf`` (B, k) and ``top_class`` (B, k) int64.
    * pose: the family's ``infer`` outputs ``out0``.. (boxes (B, K, 4), scores (B, K), classes
      (B, K), keypoints (B, K, N, 2), visibility (B, K, N) where the family predicts it), float32;
      the loader runs the pose task's own filter, NMS (the dense families only: the ``nms``
      metadata) and mapping back on the host.
    * point: the family's ``infer`` output ``out0``, the centroid-map logits (B, 1 + nc, S/8,
      S/8); the loader runs the point task's own peak stage (softmax, per-class max-pool peaks,
      top ``max_det``), threshold and mapping back on the host, so ``conf``, ``max_det`` and
      ``nms_radius`` stay predict-time options.
    * semantic: ``class_map`` (B, S, S), the argmax, in the dtype eager predict uses (uint8 up to
      256 classes).

The metadata's ``nms`` says whether the family's candidates go through NMS (every task); a
loader that read a missing entry as True ran the dense families' rotated NMS over RT-DETRv2-OBB's
candidates on the host (297 boxes where eager gives 300).

Exporter: the TorchScript-based one (``torch.onnx.export(dynamo=False)``). Every detection, classification
and semantic family and the segment, obb and pose variants export with it at 160 px and onnxruntime
reproduces eager predict (tests/unit/test_export_onnx.py, tests/unit/test_export_onnx_tasks.py). The
dynamo exporter, tried on the networks of yolo9-t, rtdetr-r18, dfine-n, resnet-18 and
segformer-b0, exported them too, but many times more slowly, which the parity tests of every
family could not afford; and the NMS step needs
ONNX's ``NonMaxSuppression``, whose data-dependent output the TorchScript exporter takes from an
``autograd.Function.symbolic`` directly (:class:`_NonMaxSuppression`). While tracing,
``nn.MultiheadAttention``'s inference fast path is off (EC-pose's self-attention would otherwise
trace as ``aten::_native_multi_head_attention``, which has no ONNX export).
"""
from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from ..atomic import FileWriteError, atomic_write, write_error
from ..ops.nms import nan_last

log = logging.getLogger(__name__)

#: opset the exported graphs use unless ``opset=`` says otherwise (NonMaxSuppression needs >= 11)
DEFAULT_OPSET = 17
#: the opset of networks with a deformable convolution (ONNX ``DeformConv`` is opset 19)
DEFORM_OPSET = 19
MIN_OPSET = 11
#: metadata_props keys (values are strings; the JSON ones are marked in docs/export.md)
META_FORMAT = "libreyolo_format"
FORMAT_VERSION = "1"


class OnnxExportError(RuntimeError):
    """A model that cannot be exported to ONNX; the message names the family and the operator."""


def require_onnx() -> None:
    """Import onnx, or say how to install the export extra."""
    try:
        import onnx  # noqa: F401
    except ImportError as exc:   # pragma: no cover - the test extra installs it
        raise ImportError("ONNX export needs the 'onnx' package: pip install 'libreyolo-graphs[export]'") from exc


# ----------------------------------------------------------------------------------- graph parts
class _NonMaxSuppression(torch.autograd.Function):
    """ONNX ``NonMaxSuppression`` for the TorchScript exporter: eager (what tracing runs) with
    torchvision's NMS, exported as the ONNX operator with its data-dependent output.

    ``boxes`` (B, N, 4) xyxy, ``scores`` (B, 1, N); returns (K, 3) int64 rows ``[image, 0, box]``,
    per image in descending score order, at most ``max_out`` per image.
    """

    @staticmethod
    def forward(ctx, boxes, scores, max_out, iou, score_threshold):  # noqa: D401 - autograd signature
        from torchvision.ops import nms
        rows = []
        for i in range(boxes.shape[0]):
            s = scores[i, 0]
            idx = (s > score_threshold).nonzero().flatten()
            keep = idx[nms(boxes[i, idx], s[idx], float(iou))][:int(max_out)]
            rows.append(torch.stack((torch.full_like(keep, i), torch.zeros_like(keep), keep), 1))
        return torch.cat(rows) if rows else torch.zeros((0, 3), dtype=torch.int64)

    @staticmethod
    def symbolic(g, boxes, scores, max_out, iou, score_threshold):
        return g.op("NonMaxSuppression", boxes, scores, max_out, iou, score_threshold, center_point_box_i=0)


def top_sorted(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, k: int, *extra: torch.Tensor):
    """:func:`libreyolo.ops.nms.top_candidates` (one descending sort, its first ``k``) written so
    that a dynamic graph keeps it dynamic: the slice clips at the candidate count instead of a
    ``min(k, N)`` that tracing would freeze at the traced size's N. NaN scores rank last, as there
    (:func:`~libreyolo.ops.nms.nan_last`, exported as IsNaN / IsInf and Where). ``extra``: more
    per-candidate tensors (B, N, D) gathered the same way (a segment family's mask coefficients)."""
    s, idx = nan_last(scores).sort(dim=1, descending=True)
    s, idx = s[:, :k], idx[:, :k]
    b = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, boxes.shape[-1]))
    more = tuple(t.gather(1, idx.unsqueeze(-1).expand(-1, -1, t.shape[-1])) for t in extra)
    return (b, s, cls.gather(1, idx), *more)


def kept_positions(keep: torch.Tensor, max_det: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B, N) keep mask over candidates in score order -> the positions (B, max_det) of the
    first ``max_det`` kept ones per image and whether each is real (B, max_det).

    Fixed-size: ``max_det`` empty candidates are appended (so any N works; their positions are
    N..N + max_det - 1, which :func:`pad_rows` makes rows of), then a TopK of the smallest keys
    picks them - a kept candidate's key is its position, the others' 2**24 more (float keys, exact
    below 2**24 candidates). Positions come from a cumulative sum, not from N, so nothing here
    depends on the traced size.
    """
    k = int(max_det)
    keep = torch.cat((keep, torch.zeros_like(keep[:, :1]).expand(-1, k)), 1)
    pos = torch.ones_like(keep, dtype=torch.float32).cumsum(1) - 1
    key = torch.where(keep, pos, pos + float(2 ** 24))
    idx = key.topk(k, dim=1, largest=False, sorted=True).indices
    return idx, keep.gather(1, idx)


def pad_rows(t: torch.Tensor, idx: torch.Tensor, max_det: int) -> torch.Tensor:
    """Rows ``idx`` (from :func:`kept_positions`) of per-candidate ``t`` (B, N, D), the
    ``max_det`` appended candidates being zero rows."""
    t = torch.cat((t, torch.zeros_like(t[:, :1]).expand(-1, int(max_det), -1)), 1)
    return t.gather(1, idx.unsqueeze(-1).expand(-1, -1, t.shape[-1]))


def first_kept(keep: torch.Tensor, boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor,
               max_det: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates in score order and a (B, N) keep mask -> the first ``max_det`` kept per image as
    (B, max_det, D + 2) rows ``[*box, score, cls]`` (zero past the count; D = 4 for xyxy boxes, 5
    for rotated ones) and the counts (:func:`kept_positions`)."""
    rows = torch.cat((boxes, scores.unsqueeze(-1), cls.to(boxes.dtype).unsqueeze(-1)), -1)
    idx, valid = kept_positions(keep, max_det)
    picked = pad_rows(rows, idx, max_det)
    dets = torch.where(valid.unsqueeze(-1), picked, torch.zeros_like(picked))
    return dets, valid.sum(1)


def nms_keep(b: torch.Tensor, s: torch.Tensor, c: torch.Tensor, valid: torch.Tensor, iou: torch.Tensor,
             agnostic: bool, max_det: int) -> torch.Tensor:
    """Class-aware (or ``agnostic``) greedy NMS of score-sorted xyxy candidates through ONNX
    ``NonMaxSuppression`` -> the (B, N) keep mask; only ``valid`` candidates take part.

    Classes are kept apart by the offsets eager's ``batched_nms`` adds (class * (largest
    coordinate of the valid boxes + 1)), so the IoUs compared are the same numbers. Invalid
    candidates get a score below the (negative) threshold: the ``valid`` filter is the only one,
    so a runtime's > or >= convention for the threshold cannot matter.
    """
    if not agnostic:
        bmax = torch.where(valid.unsqueeze(-1), b, torch.full_like(b, float("-inf"))).amax((1, 2))
        bmax = torch.where(valid.any(1), bmax, torch.zeros_like(bmax))
        b = b + (c.to(b.dtype) * (bmax.unsqueeze(1) + 1)).unsqueeze(-1)
    nms_scores = torch.where(valid, s, torch.full_like(s, -1.0)).unsqueeze(1)
    sel = _NonMaxSuppression.apply(b, nms_scores, torch.tensor([int(max_det)], dtype=torch.int64),
                                   iou, torch.tensor([-0.5], dtype=torch.float32))
    hits = torch.zeros_like(s).index_put((sel[:, 0], sel[:, 2]), torch.ones_like(sel[:, 0], dtype=s.dtype))
    return hits > 0


class _Normalize(nn.Module):
    """The family's mean / std (Preprocess.normalize's ops), or nothing."""

    def __init__(self, preprocess):
        super().__init__()
        self.prep = preprocess

    def forward(self, x):
        return self.prep.normalize(x)


class DetectGraph(nn.Module):
    """images, conf, iou, class mask -> dets (B, max_det, 6), num_dets (B,): eager predict's stage."""

    def __init__(self, model, net: nn.Module, *, max_det: int, max_nms: int, agnostic: bool, half: bool):
        super().__init__()
        self.net = net                       # registered: its weights become the graph's initializers
        self.infer = model.infer_with(net)
        self.norm = _Normalize(model.preprocess)
        self.nms = bool(model.NMS)
        self.max_det, self.max_nms, self.agnostic, self.half = int(max_det), int(max_nms), bool(agnostic), half

    def forward(self, images, conf, iou, class_mask):
        x = self.norm(images)
        if self.half:
            x = x.half()
        boxes, scores, cls = self.infer(x)
        b, s, c = top_sorted(boxes.float(), scores.float(), cls, self.max_nms)
        valid = (s > conf) & (class_mask[c] > 0)
        keep = nms_keep(b, s, c, valid, iou, self.agnostic, self.max_det) if self.nms else valid
        return first_kept(keep, b, s, c, self.max_det)


class SegmentGraph(nn.Module):
    """images, conf, iou, class mask -> dets (B, max_det, 6), num_dets (B,), mask_logits
    (B, max_det, h, w): the segment stage up to each kept instance's mask logits at the family's
    mask resolution (the host samples them at each image's pixels, the segment task's own code).

    As :class:`DetectGraph` for the boxes (decode, the top ``max_nms`` by score, the confidence
    and class filters with the segment task's ``>``, NMS where the family has it, the first
    ``max_det`` survivors); then the kept rows' mask coefficients through the family's
    ``mask_logits`` (prototypes x coefficients, or a DETR's query embedding x mask feature),
    called once with the batch as a leading dimension (a family's ``mask_logits`` must allow one;
    ``torch.vmap`` does not trace). Rows past ``num_dets`` are zero.
    """

    def __init__(self, model, net: nn.Module, *, max_det: int, max_nms: int, agnostic: bool, half: bool):
        super().__init__()
        self.net = net
        self.infer = model.infer_with(net)
        self.mask_logits = model.mask_logits
        self.norm = _Normalize(model.preprocess)
        self.nms = bool(model.NMS)
        self.max_det, self.max_nms, self.agnostic, self.half = int(max_det), int(max_nms), bool(agnostic), half

    def forward(self, images, conf, iou, class_mask):
        x = self.norm(images)
        if self.half:
            x = x.half()
        boxes, scores, cls, coeffs, protos = self.infer(x)
        b, s, c, k = top_sorted(boxes.float(), scores.float(), cls, self.max_nms, coeffs)
        valid = (s > conf) & (class_mask[c] > 0)
        keep = nms_keep(b, s, c, valid, iou, self.agnostic, self.max_det) if self.nms else valid
        dets, counts = first_kept(keep, b, s, c, self.max_det)
        idx, real = kept_positions(keep, self.max_det)
        logits = self.mask_logits(protos, pad_rows(k, idx, self.max_det)).float()
        # an empty row's coefficients are zeros, which some mask heads divide by (RTMDet's stride)
        logits = torch.where(real[:, :, None, None], logits, torch.zeros_like(logits))
        return dets, counts, logits


def _greedy_walk(hit: torch.Tensor) -> torch.Tensor:
    """(B, K, K) "a kept i drops j" -> keep (B, K): the greedy walk of
    :func:`~libreyolo.tasks.obb.rotated.rotated_nms`, step for step. Scripted (:func:`greedy_walk`)
    it exports as one ONNX ``Loop`` over the candidates instead of K unrolled steps."""
    b, k = hit.shape[0], hit.shape[1]
    alive = torch.ones([b, k], dtype=torch.bool, device=hit.device)
    keep = torch.zeros([b, k], dtype=torch.bool, device=hit.device)
    for i in range(k):
        ki = alive[:, i]
        keep[:, i] = ki
        alive = alive & ~(hit[:, i] & ki.unsqueeze(1))
    return keep


_SCRIPTED_WALK = None


def greedy_walk(hit: torch.Tensor) -> torch.Tensor:
    """:func:`_greedy_walk` through ``torch.jit.script`` (scripted once, on first use): the
    TorchScript exporter turns its loop into an ONNX ``Loop`` whose trip count is the candidate
    count, so the graph stays small (about 150 nodes where 300 unrolled steps made 13,000) and
    a dynamic graph takes any count."""
    global _SCRIPTED_WALK
    if _SCRIPTED_WALK is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch.jit.script's deprecation notice: the exporter is the same vintage
            _SCRIPTED_WALK = torch.jit.script(_greedy_walk)
    return _SCRIPTED_WALK(hit)


def rotated_suppress(xywhr: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, iou: torch.Tensor,
                     agnostic: bool) -> torch.Tensor:
    """The obb task's :func:`~libreyolo.tasks.obb.task.suppress` for the graph: the same overlap
    test (:func:`~libreyolo.tasks.obb.rotated.probiou` above ``iou`` with an earlier candidate of
    the same class, any class with ``agnostic``) and greedy walk (:func:`greedy_walk`), the
    suppressed candidates' scores set to 0. ``iou`` is a graph input."""
    from ..tasks.obb.rotated import probiou
    ov = probiou(xywhr[:, :, None, :], xywhr[:, None, :, :])                        # (B, K, K)
    pos = torch.ones_like(scores[0]).cumsum(0)                                       # 1..K, any K
    hit = (ov > iou) & (pos[None, :] > pos[:, None])
    if not agnostic:
        hit = hit & (cls[:, :, None] == cls[:, None, :])
    keep = greedy_walk(hit)
    return torch.where(keep, scores, torch.zeros_like(scores))


class ObbGraph(nn.Module):
    """images, conf, iou, class mask -> dets (B, max_det, 7) ``[cx, cy, w, h, angle, score,
    class]`` (canvas pixels, radians), num_dets (B,): the obb stage.

    The family's candidates (sorted by score), a dense family's rotated NMS
    (:func:`rotated_suppress`: the obb task's ProbIoU test and greedy walk, as one ONNX ``Loop``;
    ``iou_threshold`` a graph input), then the task's ``>=`` confidence filter, the class mask and
    the first ``max_det`` survivors. A set-prediction family (``NMS = False``) skips the NMS.
    """

    def __init__(self, model, net: nn.Module, *, max_det: int, agnostic: bool, half: bool):
        super().__init__()
        self.net = net
        self.infer = model.infer_with(net)
        self.norm = _Normalize(model.preprocess)
        self.nms = bool(model.NMS)
        self.max_det, self.agnostic, self.half = int(max_det), bool(agnostic), half

    def forward(self, images, conf, iou, class_mask):
        x = self.norm(images)
        if self.half:
            x = x.half()
        xywhr, s, c = self.infer(x)
        xywhr, s = xywhr.float(), s.float()
        if self.nms:
            s = rotated_suppress(xywhr, s, c, iou, self.agnostic)
        valid = (s >= conf) & (class_mask[c] > 0)
        return first_kept(valid, xywhr, s, c, self.max_det)


class ClassifyGraph(nn.Module):
    """images -> probs (B, nc), top_conf (B, k), top_class (B, k): the classify stage."""

    def __init__(self, model, net: nn.Module, *, topk: int, half: bool):
        super().__init__()
        self.net = net
        self.infer = model.infer_with(net)
        self.norm = _Normalize(model.preprocess)
        self.k, self.half = int(topk), half

    def forward(self, images):
        x = self.norm(images)
        probs = self.infer(x.half() if self.half else x).float().softmax(-1)
        conf, idx = probs.topk(self.k, dim=-1)
        return probs, conf, idx


class RawGraph(nn.Module):
    """images -> the family's ``infer`` outputs (a tuple of fixed-shape tensors, named ``out0``,
    ``out1``, ...): the network and its decode, for the tasks whose remaining stage (pose: the
    confidence filter and class-aware NMS) :class:`~libreyolo.export.onnx_model.OnnxModel` runs on
    the host through the task's own ``PredictPlan.finish`` and ``results``."""

    def __init__(self, model, net: nn.Module, *, half: bool):
        super().__init__()
        self.net = net
        self.infer = model.infer_with(net)
        self.norm = _Normalize(model.preprocess)
        self.half = half

    def forward(self, images):
        x = self.norm(images)
        out = _as_tuple(self.infer(x.half() if self.half else x))
        return tuple(t.float() if t.is_floating_point() else t for t in out)


#: the tasks exported as :class:`RawGraph` (the network's outputs; the rest of the stage on the host:
#: pose's filter and NMS, depth's resize back to the image, matte's sigmoid and resize, OCR's
#: binarization, DB boxes and the recognizer - its own graph, :mod:`libreyolo.export.twostage`)
RAW_TASKS = ("pose", "depth", "matte", "ocr")
RAW_TASKS += ("panoptic",)   # EoMT's query logits: the merge runs on the host, as after eager predict's stage
RAW_TASKS += ("point",)   # FOMO's centroid-map logits; the host runs the point task's peak stage
#: the tasks exported as two graphs, the second in a file beside the first
#: (:mod:`libreyolo.export.twostage`): OCR's recognizer, promptable segmentation's prompt decoder
SECOND_GRAPH_TASKS = ("ocr", "segment-prompt")


class PromptImageGraph(nn.Module):
    """images (B, 3, h', w') as the family's preprocessing gives them (MobileSAM, SAM: RGB in
    [0, 1], the longer side the frame ``size``, the network normalizes and zero-pads; SAM 2,
    EdgeTAM, SAM 3: the stretched square frame, normalized) -> the image embedding: one map
    (B, 256, s, s), or the family's several maps (SAM 2-style: the two high-resolution skip
    features, then the embedding). The family's own image stage (``model.infer``) on the export's
    network copy. The frame is fixed in the graph; a long-side family's image sides are symbolic
    (exported dynamic, always: the long-side resize gives every aspect ratio its own shape)."""

    def __init__(self, model, net: nn.Module, size: int):
        super().__init__()
        self.net, self.size = net, int(size)
        twin = copy.copy(model)
        twin.model = net
        self.stage = twin.infer

    def forward(self, images):
        return self.stage(images)


def prompt_square_frame(model) -> bool:
    """Whether the family's images are stretched to the square frame (SAM 2, EdgeTAM, SAM 3):
    its image graph takes the square frame only."""
    return getattr(model.preprocess, "resize", None) == "stretch"


def prompt_map_names(n: int) -> list[str]:
    """The image graph's outputs: ``embeddings``, or a SAM 2-style family's three maps."""
    return ["embeddings"] if n == 1 else [f"high_res_{i}" for i in range(n - 1)] + ["embeddings"]


def prompt_trace_width(model, size: int) -> int:
    """The shorter side of the input the prompt encoder is traced on (the longer one: ``size``)."""
    return max(int(model.STRIDE), size - 2 * int(model.STRIDE))


class SemanticGraph(nn.Module):
    """images -> class_map (B, S, S): the semantic stage's argmax."""

    def __init__(self, model, net: nn.Module, *, half: bool):
        super().__init__()
        from ..tasks.semantic.task import class_map_dtype
        self.net = net
        self.infer = model.infer_with(net)
        self.norm = _Normalize(model.preprocess)
        self.dtype, self.half = class_map_dtype(model.nc), half

    def forward(self, images):
        x = self.norm(images)
        return self.infer(x.half() if self.half else x).argmax(1).to(self.dtype)


# ----------------------------------------------------------------------------------------- export
def default_path(model) -> Path:
    """Next to the checkpoint the model came from (same stem), else ``<family>-<size>.onnx`` here."""
    src = Path(model.source) if model.source else None
    if src is not None and src.suffix.lower() in (".pt", ".pth", ".safetensors"):
        return src.with_suffix(".onnx")
    return Path(f"{model.FAMILY}-{model.size}.onnx")


def export_onnx(model, file: str | os.PathLike | None = None, *, imgsz: int | None = None, batch: int = 1,
                dynamic: bool = False, half: bool = False, simplify: bool = False, opset: int | None = None,
                max_det: int = 300, max_nms: int | None = None, agnostic_nms: bool = False, topk: int = 5) -> Path:
    """Write ``model`` as an ONNX graph ending in its task's outputs (see the module docstring).

    ``imgsz``: the square input size (default the model's; rounded up to the family's stride);
    ``batch``: the batch size of a static graph; ``dynamic``: batch, height and width are symbolic
    (checked when exporting: a family whose graph bakes its size is refused); ``half``: float16 weights and
    activations (inputs and outputs stay float32; see docs/export.md on onnxruntime's limited fp16
    CPU kernels); ``simplify``: onnxscript's optimizer (constant folding, dead-node removal) over
    the exported graph; ``opset``: ONNX opset (default 17, at least 11). Detection, segment and
    obb: ``max_det`` (rows of ``dets``), ``agnostic_nms`` (NMS across classes; fixed in the
    graph); detection and segment: ``max_nms`` (candidates entering NMS, as predict's: default
    1000, or ``max_det`` when that is larger). Classification: ``topk``.
    The file is written atomically (temp file in the target directory, then rename); returns its path.
    """
    require_onnx()
    import onnx

    # torchvision's first import calls its own operators (``_cuda_version``): imported inside the
    # trace (the NMS's forward imports it where it runs) the tracer records that call and fails
    import torchvision.ops  # noqa: F401

    from ..options import check_imgsz, check_int, check_max_det, parse_bool
    size = check_imgsz(model.imgsz if imgsz is None else imgsz, model.STRIDE)
    batch = check_int("batch", batch, 1)
    dynamic, half = parse_bool("dynamic", dynamic), parse_bool("half", half)
    simplify, agnostic_nms = parse_bool("simplify", simplify), parse_bool("agnostic_nms", agnostic_nms)
    if opset is not None:
        opset = check_int("opset", opset, MIN_OPSET)
    max_det, max_nms = check_max_det(max_det, max_nms)
    topk = min(check_int("topk", topk, 1), int(model.nc))
    path = Path(file if file is not None else default_path(model)).expanduser()
    if path.suffix.lower() != ".onnx":
        raise ValueError(f"export file must end in .onnx, got {str(path)!r}")

    net = export_network(model, half)
    if opset is None:
        opset = DEFORM_OPSET if uses_deform_conv(net) else DEFAULT_OPSET
    opset = check_int("opset", opset, MIN_OPSET)
    t0 = time.perf_counter()
    if model.TASK in SECOND_GRAPH_TASKS:   # two graphs: the second beside the first (libreyolo/export/twostage.py)
        from .twostage import export_second_graph
        second = export_second_graph(model, net, path, size=size, dynamic=dynamic, half=half, opset=opset)
    else:
        second = {}
    try:
        graph, inputs, in_names, out_names, axes = _graph_for(model, net, size, batch, half, max_det, max_nms,
                                                              agnostic_nms, topk)
        if model.TASK == "segment-prompt":
            dynamic = True   # the batch; a long-side family's sides too (every aspect ratio its own shape)
        dynamic_axes = axes if dynamic else None
        proto = trace_graph(model, graph, inputs, in_names, out_names, dynamic_axes, opset, half)
        if simplify:
            proto = _simplify(proto)
        meta = _metadata(model, size, batch, dynamic, half, opset, max_det, max_nms, agnostic_nms,
                         topk, [i.name for i in proto.graph.input], out_names)
        _set_metadata(proto, {**meta, **second})
        onnx.checker.check_model(proto)
        data = proto.SerializeToString()
        if dynamic:
            _check_dynamic(model, graph, data, size, in_names, inputs[1:])
    except BaseException:
        if second:   # the first graph failed: no second graph left without it
            from .twostage import part_path
            part_path(path, model.TASK).unlink(missing_ok=True)
        raise
    write_atomic(data, path)   # after the second graph: a reader that finds this file finds both
    log.info("exported %s-%s to %s (%.1f s, %.1f MB)", model.FAMILY, model.size, path,
             time.perf_counter() - t0, path.stat().st_size / 1e6)
    return path


def export_network(model, half: bool) -> nn.Module:
    """The network the graph is traced from: a CPU copy in eval mode (float16 with ``half``)."""
    net = copy.deepcopy(model.model).to("cpu").eval()
    return net.half() if half else net


def uses_deform_conv(net: nn.Module) -> bool:
    """Whether the network calls ``torchvision.ops.deform_conv2d`` (BiRefNet's decoder): ONNX has
    ``DeformConv`` from opset 19, which :func:`register_deform_conv` exports it to."""
    import inspect
    seen: set[type] = set()
    for m in net.modules():
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        try:
            if "deform_conv2d" in inspect.getsource(cls.forward):
                return True
        except (OSError, TypeError):
            continue
    return False


_DEFORM_REGISTERED = False


def register_deform_conv() -> None:
    """``torchvision::deform_conv2d`` -> ONNX ``DeformConv`` (opset 19) for the TorchScript
    exporter (torchvision registers none): the same inputs - offsets as (dy, dx) pairs per
    kernel tap, the modulation mask, the bias - and attributes; onnxruntime and OpenVINO run it."""
    global _DEFORM_REGISTERED
    if _DEFORM_REGISTERED:
        return
    from torch.onnx import symbolic_helper as sh

    @sh.parse_args("v", "v", "v", "v", "v", "i", "i", "i", "i", "i", "i", "i", "i", "b")
    def deform_conv2d(g, x, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                      groups, offset_groups, use_mask):
        args = [x, weight, offset, bias] + ([mask] if use_mask else [])
        return g.op("DeformConv", *args, strides_i=[stride_h, stride_w], pads_i=[pad_h, pad_w, pad_h, pad_w],
                    dilations_i=[dil_h, dil_w], group_i=groups, offset_group_i=offset_groups)

    torch.onnx.register_custom_op_symbolic("torchvision::deform_conv2d", deform_conv2d, DEFORM_OPSET)
    _DEFORM_REGISTERED = True


def trace_graph(model, graph: nn.Module, inputs: tuple, in_names: list[str], out_names: list[str],
                dynamic_axes: dict | None, opset: int, half: bool = False):
    """Trace ``graph`` with the TorchScript exporter -> the ONNX proto (unused inputs dropped);
    a failure is one :class:`OnnxExportError` naming the family and the operator."""
    import onnx
    graph.eval()   # the exporter puts the module back into the mode it found it in
    if opset >= DEFORM_OPSET:
        register_deform_conv()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "graph.onnx"
        try:
            with warnings.catch_warnings(), torch.no_grad(), _range_in_float32(half), _mha_fastpath_off(), \
                    _interpolate_sizes_as_numbers():
                # the TorchScript exporter's deprecation notice and the tracer's warnings (Python
                # values from shapes become constants: right for a static graph, and a dynamic one
                # is checked instead) would only confuse
                warnings.simplefilter("ignore")
                torch.onnx.export(graph, inputs, str(raw), dynamo=False, opset_version=opset,
                                  input_names=in_names, output_names=out_names, dynamic_axes=dynamic_axes,
                                  do_constant_folding=True)
        except Exception as exc:
            raise _export_error(model, opset, exc) from exc
        proto = onnx.load(str(raw))
    return _drop_unused_inputs(proto)


def _graph_for(model, net, size, batch, half, max_det, max_nms, agnostic, topk):
    x = torch.rand((batch, 3, size, size), generator=torch.Generator().manual_seed(0))
    axes = {"images": {0: "batch", 2: "height", 3: "width"}}
    task = model.TASK
    if task == "detect":
        g = DetectGraph(model, net, max_det=max_det, max_nms=max_nms, agnostic=agnostic, half=half)
        inputs = (x, torch.tensor([0.25]), torch.tensor([0.45]), torch.ones(int(model.nc)))
        axes.update(dets={0: "batch"}, num_dets={0: "batch"})
        return g, inputs, ["images", "conf_threshold", "iou_threshold", "class_mask"], ["dets", "num_dets"], axes
    if task == "classify":
        g = ClassifyGraph(model, net, topk=topk, half=half)
        axes.update(probs={0: "batch"}, top_conf={0: "batch"}, top_class={0: "batch"})
        return g, (x,), ["images"], ["probs", "top_conf", "top_class"], axes
    if task == "semantic":
        g = SemanticGraph(model, net, half=half)
        axes.update(class_map={0: "batch", 1: "height", 2: "width"})
        return g, (x,), ["images"], ["class_map"], axes
    if task == "segment":
        g = SegmentGraph(model, net, max_det=max_det, max_nms=max_nms, agnostic=agnostic, half=half)
        inputs = (x, torch.tensor([0.25]), torch.tensor([0.45]), torch.ones(int(model.nc)))
        axes.update(dets={0: "batch"}, num_dets={0: "batch"}, mask_logits={0: "batch", 2: "mask_height",
                                                                             3: "mask_width"})
        return (g, inputs, ["images", "conf_threshold", "iou_threshold", "class_mask"],
                ["dets", "num_dets", "mask_logits"], axes)
    if task == "obb":
        g = ObbGraph(model, net, max_det=max_det, agnostic=agnostic, half=half)
        inputs = (x, torch.tensor([0.25]), torch.tensor([0.45]), torch.ones(int(model.nc)))
        axes.update(dets={0: "batch"}, num_dets={0: "batch"})
        return g, inputs, ["images", "conf_threshold", "iou_threshold", "class_mask"], ["dets", "num_dets"], axes
    if task == "segment-prompt":   # the image encoder; the prompt decoder is the second graph
        g = PromptImageGraph(model, net, size)
        if prompt_square_frame(model):   # stretched to the square frame: only the batch is symbolic
            x = torch.rand((batch, 3, size, size), generator=torch.Generator().manual_seed(0))
            axes = {"images": {0: "batch"}}
        else:
            # traced on a non-square input so that the padding to the frame is in the graph (a
            # square one takes no padding, which tracing would keep as "none")
            x = torch.rand((batch, 3, size, prompt_trace_width(model, size)), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            names = prompt_map_names(len(_as_tuple(g(x))))
        axes.update({name: {0: "batch"} for name in names})
        return g, (x,), ["images"], names, axes
    if task in RAW_TASKS:
        g = RawGraph(model, net, half=half)
        with torch.no_grad():
            n = len(g(x))
        names = [f"out{i}" for i in range(n)]
        axes.update({name: {0: "batch"} for name in names})
        return g, (x,), ["images"], names, axes
    if task == "restore":   # the network on one batch of tiles, clamped (tasks/restore/export.py)
        from ..tasks.restore.export import restore_graph
        return restore_graph(model, net, x, half, axes)
    raise OnnxExportError(f"ONNX export does not know the {task!r} task of {model.FAMILY}")


@contextlib.contextmanager
def _mha_fastpath_off():
    """``nn.MultiheadAttention`` without its inference fast path while tracing: under ``no_grad``
    in eval mode a self-attention (query, key and value the same tensor, as EC-pose's decoder
    runs) dispatches to ``aten::_native_multi_head_attention``, which has no ONNX export; the
    regular path computes the same attention from exportable matrix products and softmax."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


@contextlib.contextmanager
def _interpolate_sizes_as_numbers():
    """While tracing: an ``F.interpolate`` whose ``size`` / ``scale_factor`` the tracer made
    tensors (they were computed from an input's shape) and that the operator then refuses
    (bicubic: "invalid combination of arguments", Depth Anything's position-embedding resize) is
    retried with those values as Python numbers - the traced size's, a constant in the graph.
    Only calls that fail otherwise are changed; a dynamic graph built that way is refused by the
    dynamic check (:func:`_check_dynamic`), a static one is what eager computes at its size."""
    import torch.nn.functional as F
    original = F.interpolate

    def number(v):
        return v.item() if isinstance(v, torch.Tensor) else v

    def interpolate(input, size=None, scale_factor=None, *args, **kwargs):
        try:
            return original(input, size, scale_factor, *args, **kwargs)
        except TypeError:
            as_num = (lambda x: None if x is None else type(x)(number(v) for v in x)
                      if isinstance(x, (tuple, list)) else number(x))
            return original(input, as_num(size), as_num(scale_factor), *args, **kwargs)

    F.interpolate = interpolate
    try:
        yield
    finally:
        F.interpolate = original


@contextlib.contextmanager
def _range_in_float32(active: bool):
    """While tracing a float16 network: ``torch.arange(..., dtype=float16)`` as a float32 arange
    cast to float16. ONNX's ``Range`` has no float16 type (and the exporter's shape inference
    fails on one), while the families build their anchor grids with ``arange`` in the feature
    dtype; the values (small integers, + 0.5) are exact in float16 either way."""
    if not active:
        yield
        return
    original = torch.arange

    def arange(*args, dtype=None, **kwargs):
        if dtype in (torch.float16, torch.bfloat16):
            return original(*args, dtype=torch.float32, **kwargs).to(dtype)
        return original(*args, dtype=dtype, **kwargs)

    torch.arange = arange
    try:
        yield
    finally:
        torch.arange = original


def _check_dynamic(model, graph: nn.Module, data: bytes, size: int, in_names: list[str], extra: tuple) -> None:
    """A dynamic graph must hold at another size and batch: run it (onnxruntime, CPU) at
    ``size + 2 * stride`` with batch 2 next to the traced module in torch. Tracing turns Python
    values computed from shapes (anchor grids, position embeddings) into constants, so a family
    that computes them that way exports a graph that fails, or answers wrongly, at other sizes;
    this raises :class:`OnnxExportError` instead of writing such a file."""
    import numpy as np
    import onnxruntime as ort
    s2 = size + 2 * int(model.STRIDE)
    hw = (s2, s2)
    if model.TASK == "segment-prompt":   # the frame is fixed: the other orientation, another side
        hw = (size, size) if prompt_square_frame(model) else (size - int(model.STRIDE), size)
    x = torch.rand((2, 3, *hw), generator=torch.Generator().manual_seed(1))
    if model.TASK in ("detect", "segment", "obb"):   # every candidate counts: a baked grid shows in the boxes
        extra = (torch.tensor([0.0]), *extra[1:])
    with torch.no_grad(), _mha_fastpath_off():
        ref = [t.numpy() for t in _as_tuple(graph(x, *extra))]
    hint = (f"{model.FAMILY}-{model.size}: dynamic=True does not hold for this family (the traced graph fixes "
            f"shapes that depend on the input size); export with dynamic=False at the size you need")
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4   # the failure is reported below, as one error
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        got = sess.run(None, {n: t.numpy() for n, t in zip(in_names, (x, *extra)) if n in names})
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OnnxExportError(f"{hint}; at {hw[0]}x{hw[1]}, batch 2, onnxruntime failed: {first}") from exc
    if not _agree(model.TASK, ref, got, np):
        raise OnnxExportError(f"{hint}; at {hw[0]}x{hw[1]}, batch 2, its outputs differ from the PyTorch model's")


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _agree(task: str, ref: list, got: list, np) -> bool:
    """Loose agreement of torch and onnxruntime outputs: enough to tell a graph whose shapes were
    baked in (garbage or errors) from float noise, not the parity claim of the tests."""
    if any(r.shape != g.shape for r, g in zip(ref, got)):
        return False
    if task == "classify":
        return bool(np.abs(ref[0] - got[0]).max() <= 1e-3 and (ref[2][:, 0] == got[2][:, 0]).all())
    if task == "semantic":
        return bool((ref[0] == got[0]).mean() >= 0.99)
    if task in ("restore", "point"):   # restore: the pictures in [0, 1]; point: the centroid-map logits (out0)
        return bool(np.abs(ref[0] - got[0]).max() <= 1e-3)
    if task in ("pose", "panoptic"):   # the family's candidates sorted by score (out1): the same scores
        return bool(np.abs(np.sort(ref[1], 1) - np.sort(got[1], 1)).max() <= 1e-3)
    if task in RAW_TASKS or task == "segment-prompt":   # maps / embeddings: close relative to their scale
        return all(bool(np.abs(r - g).max() <= 1e-3 * max(1.0, float(np.abs(r).max()))) for r, g in zip(ref, got))
    # dets rows [*box, score, class] (box: 4 corners' coordinates, or a rotated box's 5 values)
    for dr, nr, dg, ng in zip(ref[0], ref[1], got[0], got[1]):
        a, b = dr[:int(nr)], dg[:int(ng)]
        if abs(len(a) - len(b)) > 0.05 * max(len(a), 1):
            return False
        if len(a) == 0:
            continue
        if len(b) == 0:
            return False
        close = ((np.abs(a[:, None, :-2] - b[None, :, :-2]).max(-1) <= 1e-2)
                 & (np.abs(a[:, None, -2] - b[None, :, -2]) <= 1e-3) & (a[:, None, -1] == b[None, :, -1]))
        if close.any(1).mean() < 0.9:
            return False
    return True


_OP_PATTERNS = (re.compile(r"operator '([\w:.]+)'"), re.compile(r"(aten::\w+|prim::\w+|torchvision::\w+)"))


def _export_error(model, opset: int, exc: Exception) -> OnnxExportError:
    """The exporter's failure as one error naming the family and, where it says, the operator."""
    text = str(exc)
    op = next((m.group(1) for p in _OP_PATTERNS for m in [p.search(text)] if m), None)
    what = f"operator {op}" if op else "an operation"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return OnnxExportError(f"{model.FAMILY}-{model.size} cannot be exported to ONNX (opset {opset}): {what} has "
                           f"no ONNX export ({first})")


def _drop_unused_inputs(proto):
    """Graph inputs no node reads (a DETR's ``iou_threshold``: it has no NMS) are removed."""
    used = {name for node in proto.graph.node for name in node.input}
    keep = [i for i in proto.graph.input if i.name in used]
    if len(keep) != len(proto.graph.input):
        del proto.graph.input[:]
        proto.graph.input.extend(keep)
    return proto


def _simplify(proto):
    """onnxscript's optimizer (installed with the export extra): constant folding, shape-op
    folding and dead-node removal; the graph's inputs, outputs and results stay the same."""
    try:
        import onnxscript.optimizer
    except ImportError as exc:   # pragma: no cover - the export extra installs it
        raise ImportError("simplify=True needs the 'onnxscript' package: pip install 'libreyolo-graphs[export]'") from exc
    before = len(proto.graph.node)
    out = onnxscript.optimizer.optimize(proto)
    log.info("simplified the graph from %d to %d nodes", before, len(out.graph.node))
    return out


def _metadata(model, size, batch, dynamic, half, opset, max_det, max_nms, agnostic, topk, inputs, outputs) -> dict:
    from .. import __version__
    meta = {META_FORMAT: FORMAT_VERSION, "libreyolo_version": __version__, "family": model.FAMILY,
            "size": model.size, "task": model.TASK, "nc": str(model.nc),
            "names": json.dumps({str(k): v for k, v in model.names.items()}),
            "imgsz": str(size), "batch": str(batch), "dynamic": json.dumps(dynamic), "half": json.dumps(half),
            "preprocess": json.dumps(model.preprocess.as_dict()), "stride": str(model.STRIDE),
            "opset": str(opset), "exporter": "torch.onnx (TorchScript)", "torch_version": torch.__version__,
            "inputs": json.dumps(inputs), "outputs": json.dumps(outputs), "trained": json.dumps(bool(model.trained))}
    # whether the family's candidates go through NMS (in the graph, or on the host for pose)
    meta["nms"] = json.dumps(bool(getattr(model, "NMS", True)))
    if model.TASK in ("detect", "segment", "obb"):
        meta.update(max_det=str(max_det), agnostic_nms=json.dumps(agnostic))
        if model.TASK != "obb":   # obb's predict has no max_nms: its candidates are the family's top-k
            meta["max_nms"] = str(max_nms)
    elif model.TASK == "classify":
        meta["topk"] = str(topk)
    elif model.TASK == "restore":   # output pixels per input pixel
        meta["scale"] = str(model.scale)
    elif model.TASK == "pose" and (getattr(model, "meta", None) or {}).get("skeleton") is not None:
        # a trained model's keypoint layout (its dataset's limbs), which Results.keypoints draws
        meta["skeleton"] = json.dumps([[int(i) for i in pair] for pair in model.meta["skeleton"]])
    if model.TASK == "panoptic" and (getattr(model, "meta", None) or {}).get("thing_class_ids") is not None:
        meta["thing_class_ids"] = json.dumps([int(i) for i in model.meta["thing_class_ids"]])   # which are things
    return meta


def _set_metadata(proto, meta: dict) -> None:
    del proto.metadata_props[:]
    for k, v in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    proto.producer_name, proto.doc_string = "libreyolo", f"libreyolo {meta['family']}-{meta['size']} ({meta['task']})"


def unreadable_onnx(path: str | os.PathLike, cause: BaseException | str) -> ValueError:
    """The one error for an ONNX file that onnx or onnxruntime cannot read (corrupt, truncated,
    not ONNX at all): it names the file and the reader's complaint, in one line."""
    if isinstance(cause, BaseException):
        text = " ".join(str(cause).split())
        # onnxruntime's "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Load model from <path> failed:" prefix
        text = re.sub(r"^\[ONNXRuntimeError\][^:]*:[^:]*:[^:]*: (Load model from .*? failed: ?)?", "", text)
        cause = f"{type(cause).__name__}: {text[:300]}" if text else type(cause).__name__
    return ValueError(f"cannot load ONNX model '{path}': not a readable ONNX model, the file is corrupt or truncated "
                      f"({cause}); export it again")


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata_props of an ONNX file (strings), without loading its weights. A file that does
    not parse as an ONNX model raises :func:`unreadable_onnx`'s ``ValueError``, naming it."""
    require_onnx()
    import onnx
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except OSError:   # a missing or unreadable file: the OS's own error names it
        raise
    except Exception as exc:   # protobuf's DecodeError ("Wire format was corrupt") and the like
        raise unreadable_onnx(path, exc) from exc
    if not proto.ir_version or not proto.HasField("graph"):   # an empty file parses as an empty message
        raise unreadable_onnx(path, "no ir_version or graph in it")
    return {p.key: p.value for p in proto.metadata_props}


def write_atomic(data: bytes, path: Path) -> None:
    """``data`` to ``path`` via a temp file in the same directory, fsync and ``os.replace``; a
    failed write names ``path`` (:class:`libreyolo.atomic.FileWriteError`)."""
    try:
        with atomic_write(path, fsync=True, mode=0o644, what="export") as f:
            f.write(data)
    except FileWriteError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):   # the size is known here: say it
            raise write_error(path, exc.__cause__, needed=len(data), what="export") from exc.__cause__
        raise


_write_atomic = write_atomic   # the name tests/unit/test_atomic.py imports
