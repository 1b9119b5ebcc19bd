"""Instance segmentation: boxes, classes and one mask per instance.

Predict stage (on the device, captured with the network where the family allows): ``model.infer``
(per anchor: boxes, scores, classes, mask coefficients; and the prototypes) -> the top ``max_nms``
candidates with their coefficients, fixed shapes. On CUDA with Triton and no class filter the
stage goes on as detection's does (:mod:`libreyolo.ops.nms_graph`): NMS (none for
set-prediction heads, whose ``NMS`` is False) and the selection of at most ``max_det`` (capped at
the candidate count), each kept row naming its candidate, whose mask coefficients are gathered
into a fixed (B, max_det, C) tensor, and the boxes mapped back to each image's pixels (the cached
letterbox geometry): the stage gives the packed (B, max_det * 7 + 1) rows with each image's
count, the coefficients and the prototypes (:func:`select_instances_in_stage`). Otherwise (the CPU, no
Triton, a class filter) NMS runs after the stage (torchvision), per image.

After the stage, on the same device: the kept instances' masks from the family's mask head
(``model.mask_logits(prototypes, coefficients)``), sampled straight at each original image's
pixels (the letterbox inverted, bilinear as an upsampling of the logits), cut to the instance's
box and thresholded at 0.5 (:mod:`libreyolo.ops.mask_sample`; on CUDA one fused kernel). With the in-stage selection the host reads the counts and rows from
one copy of the packed tensor and samples the first ``count`` instances of each image.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...ops import nms_graph
from ...ops.letterbox import inverse_params, unletterbox_boxes, unletterbox_packed
from ...ops.nms import nan_last
from ...options import MAX_DET, Custom, Fraction, Int, check_fields, check_max_det, option
from ..base import Evaluator, InStageSelection, PredictPlan, Task, TaskOptions

#: instances whose masks are sampled at the original size in one batch (bounds the memory of
#: a large image with many instances)
MASK_CHUNK = 32
#: instances whose mask logits (at the prototypes' size) are computed in one batch: the logits'
#: few small ops per batch are launch-bound on a GPU, so fewer, larger batches; bounded because a
#: dynamic-conv head's intermediates take about 1 MB per instance at a 640 canvas
LOGITS_CHUNK = 128


def sample_masks(logits: torch.Tensor, canvas: int, h: int, w: int, sx: float, sy: float, px: float, py: float
                 ) -> torch.Tensor:
    """(n, ph, pw) mask logits over the (canvas x canvas) letterboxed input -> (n, h, w) logits at
    the original image's pixels: each pixel centre mapped into the canvas (``x * sx + px``) and
    read bilinearly (edges clamped), which equals upsampling the logits to the canvas and then
    resizing the image region back."""
    dev, dt = logits.device, logits.dtype
    gx = ((torch.arange(w, device=dev, dtype=dt) + 0.5) * sx + px) / canvas * 2 - 1
    gy = ((torch.arange(h, device=dev, dtype=dt) + 0.5) * sy + py) / canvas * 2 - 1
    grid = torch.stack(torch.meshgrid(gx, gy, indexing="xy"), -1)            # (h, w, 2)
    out = torch.nn.functional.grid_sample(logits[:, None], grid.expand(logits.shape[0], h, w, 2),
                                          mode="bilinear", padding_mode="border", align_corners=False)
    return out[:, 0]


def crop_to_boxes(masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """(n, h, w) bool masks kept only at pixels whose centres lie inside each (n, 4) xyxy box."""
    h, w = masks.shape[-2:]
    xs = torch.arange(w, device=masks.device, dtype=boxes.dtype) + 0.5
    ys = torch.arange(h, device=masks.device, dtype=boxes.dtype) + 0.5
    inx = (xs >= boxes[:, 0:1]) & (xs <= boxes[:, 2:3])                         # (n, w)
    iny = (ys >= boxes[:, 1:2]) & (ys <= boxes[:, 3:4])                         # (n, h)
    return masks & iny[:, :, None] & inx[:, None, :]


def select_instances(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, *, conf: float, iou: float,
                     max_det: int, classes: list[int] | None = None, agnostic: bool = False,
                     nms_free: bool = False) -> torch.Tensor:
    """One image's sorted candidates -> the indices of the kept ones (score order): above
    ``conf``, of ``classes``, through NMS per class (all together with ``agnostic``; none with
    ``nms_free``, for set-prediction heads), at most ``max_det``."""
    from torchvision.ops import batched_nms
    keep = scores > conf
    if classes is not None:
        keep &= torch.isin(cls, torch.as_tensor(classes, device=cls.device, dtype=cls.dtype))
    idx = keep.nonzero().squeeze(1)
    if idx.numel() == 0 or nms_free:
        return idx[:max_det]
    groups = torch.zeros_like(cls[idx]) if agnostic else cls[idx]
    kept = batched_nms(boxes[idx].float(), scores[idx].float(), groups, iou)
    return idx[kept[:max_det]]


def box_windows(boxes: np.ndarray, h: int, w: int) -> np.ndarray:
    """(n, 4) xyxy boxes (the image's pixels) -> (n, 4) int pixel windows ``x0, y0, x1, y1``
    (exclusive ends, clamped to the image) holding every pixel whose centre can lie inside the
    box, with one pixel to spare on each side: the exact test is :func:`crop_to_boxes`'."""
    # NaN: no pixel centre lies inside (any window will do); an infinite edge reaches the image's
    # edge (nan_to_num makes it the largest finite float, which the clip brings to the image)
    b = np.nan_to_num(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), nan=0.0)
    lo = np.floor(b[:, :2]) - 1
    hi = np.ceil(b[:, 2:]) + 1
    lim = np.array([w, h], dtype=np.float64)
    return np.concatenate((np.clip(lo, 0, lim), np.clip(hi, 0, lim)), 1).astype(np.int64)


def grid_sample_masks(chunks: list[torch.Tensor], boxes: torch.Tensor, canvas: int, h: int, w: int,
                      inverse: tuple[float, float, float, float], thr: float = 0.0) -> torch.Tensor:
    """Per chunk of (c, ph, pw) mask logits, the whole image sampled by ``grid_sample``
    (:func:`sample_masks`; ``inverse``: :func:`inverse_params`' ``sx, sy, px, py``), above ``thr``
    and cut to ``boxes`` -> (n, h, w) bool: CUDA's way where the fused kernel is off or Triton missing."""
    n = sum(c.shape[0] for c in chunks)
    out = torch.zeros((n, h, w), dtype=torch.bool, device=boxes.device)
    s = 0
    for logits in chunks:
        e = s + logits.shape[0]
        out[s:e] = crop_to_boxes(sample_masks(logits, canvas, h, w, *inverse) > thr, boxes[s:e])
        s = e
    return out


def instance_masks(model, protos: torch.Tensor, coeffs: torch.Tensor, boxes: torch.Tensor, canvas: int,
                   h: int, w: int, resize: str, thr: float = 0.0, host_boxes: np.ndarray | None = None,
                   windows: bool | None = None) -> torch.Tensor:
    """The (n, h, w) bool masks of one image's kept instances: the family's mask logits, sampled
    at the image's pixels, above ``thr`` (logit 0 = probability 0.5), cut to ``boxes`` (xyxy,
    the image's pixels; ``host_boxes``: a host copy of them, if the caller has one).

    The sampling is :mod:`libreyolo.ops.mask_sample`'s (bilinear at each pixel centre mapped into
    the canvas, edges clamped: ``grid_sample``'s positions, one fixed order of the products), the
    same bits three ways: on CUDA with Triton one fused kernel for every instance and pixel
    (while :data:`~libreyolo.ops.mask_sample.FUSED_ON_CUDA` is on; with
    :data:`~libreyolo.ops.mask_sample.WINDOWS_ON_CUDA` it visits only each instance's box window,
    the rest zeroed by one fill; off, or without Triton, CUDA samples the whole image with
    ``grid_sample``, its earlier way); elsewhere only the pixels of each
    instance's box window (:func:`box_windows`; a chunk of instances shares the largest window's
    shape), the rest staying False - a fraction of the work where instances are small (a 720p
    image: 0.92 M pixels per instance otherwise); or the whole image per chunk of instances.
    ``windows``: True / False forces the windows or the whole-image tensor way (None: by the
    device)."""
    from ...ops import mask_sample
    sx, sy, px, py = inverse_params(h, w, canvas, resize)
    n, dev = coeffs.shape[0], protos.device
    if n == 0:
        return torch.zeros((n, h, w), dtype=torch.bool, device=dev)
    b = boxes.to(dev)
    parts = [model.mask_logits(protos, coeffs[s:s + LOGITS_CHUNK]).float() for s in range(0, n, LOGITS_CHUNK)]
    logits = parts[0] if len(parts) == 1 else torch.cat(parts)
    chunks = logits.split(MASK_CHUNK)
    fused = windows is None and dev.type == "cuda"
    if fused and not (mask_sample.FUSED_ON_CUDA and mask_sample.available(dev)):
        # the kernel switched off or no Triton: grid_sample over the whole image, cut to the box
        return grid_sample_masks(list(chunks), b, canvas, h, w, (sx, sy, px, py), thr)
    ph, pw = chunks[0].shape[-2:]
    xt, yt = mask_sample.axis_tables(h, w, sx, sy, px, py, canvas, ph, pw, dev)

    def pixel_windows() -> np.ndarray:   # from the caller's host copy of the boxes where it has one
        return box_windows(boxes.detach().cpu().numpy() if host_boxes is None else host_boxes, h, w)

    if fused:
        if not mask_sample.WINDOWS_ON_CUDA:
            return mask_sample.masks_triton(logits, xt, yt, b, thr)
        return mask_sample.masks_triton(logits, xt, yt, b, thr, windows=pixel_windows())
    out = torch.zeros((n, h, w), dtype=torch.bool, device=dev)
    if windows is False:
        for k, part in enumerate(chunks):
            s = k * MASK_CHUNK
            out[s:s + part.shape[0]] = mask_sample.masks_torch(part, xt, yt, b[s:s + part.shape[0]], thr)
        return out
    win = pixel_windows()
    for k, part in enumerate(chunks):
        s = k * MASK_CHUNK
        e = s + part.shape[0]
        ww = int((win[s:e, 2] - win[s:e, 0]).max())
        hh = int((win[s:e, 3] - win[s:e, 1]).max())
        if ww <= 0 or hh <= 0:   # every box of the chunk outside the image or empty
            continue
        org = torch.from_numpy(win[s:e, :2]).to(dev)
        # each instance's window, clamped to the image: a clamped column repeats the edge pixel,
        # whose value it computes again (the same coordinate), so repeated writes agree
        xs = (org[:, 0:1] + torch.arange(ww, device=dev)).clamp_(max=w - 1)          # (c, ww)
        ys = (org[:, 1:2] + torch.arange(hh, device=dev)).clamp_(max=h - 1)          # (c, hh)
        vals = mask_sample.masks_torch(part, xt, yt, b[s:e], thr, xs=xs, ys=ys)
        rows = torch.arange(s, e, device=dev)[:, None, None]
        out[rows, ys[:, :, None], xs[:, None, :]] = vals
    return out


def top_instances(outputs, k: int):
    """``model.infer``'s (boxes, scores, classes, coefficients, prototypes) -> the same for the
    ``k`` best-scoring anchors per image, sorted (NaN scores last), and the prototypes: fixed
    shapes, graph-safe."""
    boxes, scores, cls, coeffs, protos = outputs
    k = min(int(k), scores.shape[1])
    s, idx = nan_last(scores).sort(dim=1, descending=True)
    s, idx = s[:, :k], idx[:, :k]
    b = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
    c = coeffs.gather(1, idx.unsqueeze(-1).expand(-1, -1, coeffs.shape[-1]))
    return b, s, cls.gather(1, idx), c, protos


def select_instances_in_stage(outputs, thresholds: torch.Tensor, geometry: torch.Tensor, max_nms: int, max_det: int,
                              *, nms: bool = True, agnostic: bool = False):
    """``model.infer``'s outputs -> the kept instances, fixed shapes, no host synchronization (the
    in-stage half of :class:`SegmentPlan`): the top ``max_nms`` candidates (:func:`top_instances`),
    NMS and the selection of at most ``max_det`` (:func:`~libreyolo.ops.nms_graph.select_packed`
    with its candidate index; ``nms=False`` for set-prediction heads), the kept rows' mask
    coefficients gathered, the boxes mapped to each image's pixels
    (:func:`~libreyolo.ops.letterbox.unletterbox_packed`; ``geometry`` from
    :func:`~libreyolo.ops.letterbox.geometry_rows`, ``thresholds`` ``[conf, iou]``).

    Returns ``(packed, coefficients, prototypes)``: packed (B, M * 7 + 1) float32 rows
    ``[x1, y1, x2, y2, score, cls, candidate]`` in score order then each image's count; the
    (B, M, C) coefficients of those rows (rows past the count: candidate 0's, unread); the
    prototypes unchanged. M is ``max_det`` or the candidate count where that is smaller (no
    more can be kept)."""
    boxes, scores, cls, coeffs, protos = top_instances(outputs, max_nms)
    max_det = min(int(max_det), scores.shape[1])
    packed = nms_graph.select_packed(boxes, scores, cls, thresholds, max_det, nms=nms, agnostic=agnostic,
                                     with_index=True)
    idx = packed[:, :max_det * 7].view(packed.shape[0], max_det, 7)[..., 6].long()
    kept = coeffs.gather(1, idx.unsqueeze(-1).expand(-1, -1, coeffs.shape[-1]))
    return unletterbox_packed(packed, geometry, max_det, cols=7), kept, protos


@dataclass
class SegmentOptions(TaskOptions):
    """Instance-segmentation training options: flip augmentation, target padding, validation."""

    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    bucket: int = option(16, "instances padded to this times a power of two (fixed loss shapes)", Int(1))
    val_conf: float = option(0.001, "confidence threshold of validation", Fraction())
    val_iou: float = option(0.7, "NMS IoU threshold of validation", Fraction())
    max_det: int = option(100, "instances kept per image in validation", Custom(
        lambda n, v: check_max_det(v)[0], f"integer in [1, {MAX_DET}]"))

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)


class SegmentPlan(InStageSelection, PredictPlan):
    """One instance-segmentation predict call (see the module docstring)."""

    def __init__(self, model, constants: Callable[..., torch.Tensor], *, conf: float, iou: float, max_det: int,
                 max_nms: int, classes: list[int] | None, agnostic_nms: bool):
        self.model = model
        self.constants = constants
        self.conf, self.iou = float(conf), float(iou)
        self.max_det, self.max_nms = int(max_det), int(max_nms)
        self.classes, self.agnostic = classes, bool(agnostic_nms)
        # NMS + selection inside the stage: CUDA with Triton, no class filter, a predictor's
        # cached constants (an exported model's plan has none: its graph selected already), and
        # candidates the fixed-shape NMS takes
        fits = not model.NMS or self.max_nms <= nms_graph.MAX_CANDIDATES
        on = (classes is None and constants is not None and fits
              and nms_graph.available(getattr(model, "device", "cpu")))
        self.post = (self.max_det, self.agnostic) if on else None
        self.tag = ("segment", self.max_nms) if self.post is None else ("segment", self.max_nms, "post", *self.post)

    def finish(self, outputs, *extra):
        """The top ``max_nms`` anchors per image by score (sorted), their boxes, classes and mask
        coefficients, and the prototypes: fixed shapes, graph-safe. With the in-stage selection
        (``post``), its kept instances instead (:func:`select_instances_in_stage`)."""
        if self.post is None:
            return top_instances(outputs, self.max_nms)
        thr, geo = extra
        return select_instances_in_stage(outputs, thr, geo, self.max_nms, self.max_det, nms=self.model.NMS,
                                         agnostic=self.agnostic)

    def results(self, out, chunk, size, speed):
        if self.post is not None:
            return self._selected_results(out, chunk, size, speed)
        from ...results import Boxes, Results
        from .results import InstanceMasks
        boxes, scores, cls, coeffs, protos = out
        m = self.model
        results = []
        for i, it in enumerate(chunk):
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            keep = select_instances(boxes[i], scores[i], cls[i], conf=self.conf, iou=self.iou, max_det=self.max_det,
                                    classes=self.classes, agnostic=self.agnostic, nms_free=not m.NMS)
            b = boxes[i][keep].float().clone()
            sx, sy, px, py = inverse_params(h, w, size, m.preprocess.resize)
            unletterbox_boxes(b, sx, sy, h, w, px, py)
            masks = instance_masks(m, protos[i], coeffs[i][keep], b, size, h, w, m.preprocess.resize)
            det = torch.cat((b, scores[i][keep, None].float(), cls[i][keep, None].float()), 1).cpu()
            results.append(Results(it.image, it.name, m.names, Boxes(det, (h, w)), speed=dict(speed),
                                   masks=InstanceMasks(masks, det[:, 5].to(torch.int64))))
        return results

    def _selected_results(self, out, chunk, size, speed):
        """The in-stage selection's outputs: counts and rows from one host copy of the packed
        tensor; each image's first ``count`` instances' masks sampled on the device (their boxes,
        already in the image's pixels, from the device copy of the same rows)."""
        from ...results import Boxes, Results
        from .results import InstanceMasks
        packed, coeffs, protos = out
        m = self.model
        host = packed.cpu().numpy()
        counts = host[:, -1].astype(np.int64).tolist()
        rows = packed[:, :-1].view(packed.shape[0], coeffs.shape[1], 7)
        results = []
        for i, it in enumerate(chunk):
            n = counts[i]
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            masks = instance_masks(m, protos[i], coeffs[i, :n], rows[i, :n, :4], size, h, w, m.preprocess.resize,
                                   host_boxes=host[i, :n * 7].reshape(n, 7)[:, :4])
            det = torch.from_numpy(host[i, :n * 7].reshape(n, 7)[:, :6].copy())
            results.append(Results(it.image, it.name, m.names, Boxes(det, (h, w)), speed=dict(speed),
                                   masks=InstanceMasks(masks, det[:, 5].to(torch.int64))))
        return results


class SegmentEvaluator(Evaluator):
    """Box and mask COCO mAP of a validation split, on the letterboxed canvas: the boxes in
    input pixels, the masks on the stride-4 grid of the training masks (the predicted logits
    sampled there, cut to the box, thresholded at 0.5)."""

    #: candidates per image before NMS
    MAX_CANDIDATES = 1000

    def __init__(self, model, options: SegmentOptions):
        self.model, self.options = model, options
        self.reset()

    def reset(self) -> None:
        self.boxes: list[np.ndarray] = []
        self.gt_boxes: list[np.ndarray] = []
        self.masks: list[tuple[np.ndarray, list]] = []
        self.gt_masks: list[tuple[np.ndarray, list]] = []
        self.hw: tuple[int, int] = (0, 0)

    def finish(self, outputs):
        return top_instances(outputs, self.MAX_CANDIDATES)

    def process(self, outputs, batch) -> None:
        from .data import MASK_STRIDE
        from .metrics import encode_masks
        imgs, targets, mask, gt_masks = batch
        boxes, scores, cls, coeffs, protos = outputs
        o, size = self.options, int(imgs.shape[-1])
        g = size // MASK_STRIDE
        self.hw = (g, g)
        for i in range(targets.shape[0]):
            keep = select_instances(boxes[i], scores[i], cls[i], conf=o.val_conf, iou=o.val_iou, max_det=o.max_det,
                                    nms_free=not self.model.NMS)
            b = boxes[i][keep].float()
            if keep.numel():
                logits = self.model.mask_logits(protos[i], coeffs[i][keep]).float()
                full = sample_masks(logits, size, g, g, MASK_STRIDE, MASK_STRIDE, 0, 0) > 0
                m = crop_to_boxes(full, b / MASK_STRIDE).cpu().numpy()
            else:
                m = np.zeros((0, g, g), bool)
            det = torch.cat((b, scores[i][keep, None].float(), cls[i][keep, None].float()), 1).cpu().numpy()
            self.boxes.append(det)
            self.masks.append((det[:, 4:6], encode_masks(m)))
            real = mask[i].numpy()
            gt = targets[i].numpy()[real]
            self.gt_boxes.append(gt)
            self.gt_masks.append((gt[:, 0].astype(np.int64), encode_masks(gt_masks[i].numpy()[real].astype(bool))))

    def evaluate(self) -> dict:
        """Box mAP50 / mAP50-95 (detection's COCO evaluation) and mask mAP50 / mAP50-95
        (faster-coco-eval, ``iouType="segm"``)."""
        from ..detect.metrics import evaluate_detections
        from .metrics import evaluate_masks
        out = evaluate_detections(self.boxes, self.gt_boxes, self.model.nc, self.model.names)
        res = {"map50": out["map50"], "map50_95": out["map50_95"]}
        res.update(evaluate_masks(self.masks, self.gt_masks, self.model.nc, self.hw))
        return res


class SegmentTask(Task):
    name = "segment"
    primary_metric = "mask_map50_95"
    Options = SegmentOptions
    predict_defaults = {"conf": 0.25, "iou": 0.45, "max_det": 300, "max_nms": 1000, "classes": None,
                        "agnostic_nms": False}
    val_option_names = {"conf": "val_conf", "iou": "val_iou"}

    def plan(self, model, size, constants, **opts) -> SegmentPlan:
        from ...options import check_fraction, check_max_det, parse_bool, parse_classes
        o = {**self.predict_defaults, **opts}
        conf, iou = check_fraction("conf", o["conf"]), check_fraction("iou", o["iou"])
        max_det, max_nms = check_max_det(o["max_det"], opts.get("max_nms"))
        plan = SegmentPlan(model, constants, conf=conf, iou=iou, max_det=max_det, max_nms=max_nms,
                           classes=parse_classes(o["classes"], model.names),
                           agnostic_nms=parse_bool("agnostic_nms", o["agnostic_nms"]))
        plan.reusable = not isinstance(o["classes"], str)   # class names: read from the model's names each call
        return plan

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_segment_data
        return resolve_segment_data(data)

    def datasets(self, data, imgsz, model, options: SegmentOptions):
        import functools

        from .data import SegmentDataset, collate_instances
        resize = model.preprocess.resize
        train = SegmentDataset(data.train, imgsz, resize, augment=True, fliplr=options.fliplr)
        val = SegmentDataset(data.val, imgsz, resize, augment=False)
        return train, val, functools.partial(collate_instances, bucket=options.bucket)

    def target_rows(self, targets) -> int:
        return int(targets[0].shape[1])   # (B, M, 5) boxes, (B, M) mask, (B, M, h, w) bitmaps

    def pad_target_rows(self, targets, rows: int) -> list:
        import torch.nn.functional as F
        boxes, mask, bitmaps = targets
        more = rows - boxes.shape[1]
        if more < 0:
            raise ValueError(f"cannot pad {boxes.shape[1]} target rows to {rows}")
        return [F.pad(boxes, (0, 0, 0, more)), F.pad(mask, (0, more), value=False),
                F.pad(bitmaps, (0, 0, 0, 0, 0, more))]

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: SegmentOptions) -> SegmentEvaluator:
        return SegmentEvaluator(model, options)

    def fitness(self, metrics) -> float:
        def nz(v):
            return 0.0 if v is None or v != v else float(v)
        return 0.1 * nz(metrics.get("mask_map50")) + 0.9 * nz(metrics.get("mask_map50_95"))

    def summary(self, metrics) -> str:
        return (f"box mAP50 {metrics['map50']:.4f}  mAP50-95 {metrics['map50_95']:.4f}  "
                f"mask mAP50 {metrics['mask_map50']:.4f}  mAP50-95 {metrics['mask_map50_95']:.4f}")

    def empty_metrics(self) -> dict[str, float]:
        return {k: float("nan") for k in ("map50", "map50_95", "mask_map50", "mask_map50_95")}
