"""Pose estimation (keypoints): per-instance boxes and keypoints in original-image pixels.

Predict stage (on the device, captured with the network where the family declares graphs): the
family's ``infer`` returns fixed-shape candidates sorted by score - boxes (B, K, 4) xyxy, scores
(B, K), classes (B, K), keypoints (B, K, N, 2) in canvas pixels and, where the family predicts
them, each keypoint's visibility (B, K, N) (a DETR-style family: a top-k over the queries, no NMS
and no visibility; a dense family such as YOLO-NAS-Pose: its best candidates by score, which the
class-aware NMS at ``iou`` thins). On CUDA with Triton and no class filter the stage goes on as
detection's does (:mod:`libreyolo.ops.nms_graph`): NMS (the walk without suppression for a head
whose ``NMS`` is False) and the selection of at most ``max_det``, each kept row naming its
candidate, whose keypoints (and visibility) are gathered; boxes and keypoints are mapped back to
each image's pixels there, and everything is packed into one (B, max_det * (6 + 3 N) + 1) tensor
(:func:`select_poses_in_stage`) that reaches the host in one copy. Otherwise (the CPU, no Triton,
a class filter) NMS and the selection run on the host after the stage, per image. Either way
the candidates above ``conf`` (at most ``max_det``), in each image's pixels, become
``Results.boxes`` and ``Results.keypoints`` (each keypoint's ``conf``: its visibility, else its
instance's score).

The keypoint layout (``kpt_shape``), left/right flip order (``flip_idx``) and ``skeleton`` come
from the checkpoint's metadata (a pose dataset's YAML), else COCO's 17-keypoint person layout.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...ops import nms_graph
from ...ops.letterbox import inverse_params, unletterbox_boxes, unletterbox_packed, unletterbox_points
from ...options import Float, Fraction, Int, check_fields, option
from ..base import Evaluator, InStageSelection, PredictPlan, Task, TaskOptions
from .results import Keypoints


@dataclass
class PoseOptions(TaskOptions):
    """Pose training options: flip augmentation, target padding, validation threshold."""

    fliplr: float = option(0.5, "probability of a horizontal flip (keypoints swapped by flip_idx)", Fraction())
    scale: float = option(0.0, "random zoom gain, +- fraction (0: none)", Float(0.0, 1.0, max_inclusive=False))
    translate: float = option(0.0, "random shift, +- fraction of the size (0: none)", Fraction())
    kpt_grad: float | None = option(None, "scale of the keypoint branch's gradient into the features it shares "
                                          "with the boxes (YOLO-NAS-Pose; default: the family's, 1 = unscaled)",
                                    Float(0.0, 1.0, min_inclusive=False, none=True))
    bucket: int = option(16, "instances padded to this times a power of two (fixed loss shapes)", Int(1))
    val_conf: float = option(0.001, "confidence threshold of validation", Fraction())
    val_iou: float = option(0.7, "NMS IoU threshold of validation (families whose candidates need NMS)",
                            Fraction())

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)


class PoseEvaluator(Evaluator):
    """OKS mAP50 / mAP50-95 and box mAP50 / mAP50-95 of a validation split
    (:func:`~.metrics.oks_map`), measured on the network's square input (the images as the stage
    sees them) with the dataset's sigmas."""

    def __init__(self, model, options: PoseOptions, sigmas: tuple[float, ...]):
        self.model, self.options, self.sigmas = model, options, tuple(sigmas)
        self.reset()

    def reset(self) -> None:
        self.preds: list[dict] = []
        self.gts: list[dict] = []

    def process(self, outputs, batch) -> None:
        boxes, scores, cls, kpts = (t.detach().float().cpu().numpy() for t in outputs[:4])
        images, gcls, gboxes, gkpts, mask = batch
        size = np.array([images.shape[-1], images.shape[-2]], np.float64)
        for i in range(len(images)):
            keep = kept(boxes[i], scores[i], cls[i], self.options.val_conf,
                        self.options.val_iou if self.model.NMS else None)
            self.preds.append({"boxes": boxes[i][keep], "scores": scores[i][keep], "cls": cls[i][keep],
                               "kpts": kpts[i][keep]})
            m = mask[i].numpy()
            b = gboxes[i].numpy()[m].astype(np.float64)
            xyxy = np.concatenate([(b[:, :2] - b[:, 2:] / 2) * size, (b[:, :2] + b[:, 2:] / 2) * size], 1)
            k = gkpts[i].numpy()[m].astype(np.float64)
            k[..., :2] *= size
            self.gts.append({"boxes": xyxy, "kpts": k, "cls": gcls[i].numpy()[m]})

    def evaluate(self) -> dict[str, float]:
        from .metrics import oks_map
        return oks_map(self.preds, self.gts, self.sigmas)


def kept(boxes: np.ndarray, scores: np.ndarray, cls: np.ndarray, conf: float, iou: float | None,
         classes: list[int] | None = None) -> np.ndarray:
    """Indices of one image's candidates (sorted by score) kept: score > ``conf``, in ``classes``,
    and with ``iou`` not None the survivors of a class-aware greedy NMS (torchvision's), in score
    order."""
    keep = scores > conf   # as detection's and the in-stage selection's threshold
    if classes is not None:
        keep &= np.isin(cls, classes)
    idx = np.flatnonzero(keep)
    if iou is None or len(idx) < 2:
        return idx
    from torchvision.ops import batched_nms
    survivors = batched_nms(torch.from_numpy(boxes[idx]).float(), torch.from_numpy(scores[idx]).float(),
                            torch.from_numpy(cls[idx]).long(), float(iou))
    return idx[np.sort(survivors.numpy())]


def skeleton_of(model) -> tuple | None:
    """The checkpoint's ``skeleton`` metadata (pairs of keypoint indices), else None (the default)."""
    meta = getattr(model, "meta", None) or {}
    sk = meta.get("skeleton")
    return None if sk is None else tuple(tuple(int(i) for i in pair) for pair in sk)


def unletterbox_keypoints(kpts: np.ndarray, sx: float, sy: float, pad_x: int = 0, pad_y: int = 0) -> np.ndarray:
    """(n, K, 2+) canvas keypoints -> an image's pixels, in place (not clipped: a keypoint may lie
    outside the image)."""
    kpts[..., 0] = (kpts[..., 0] - pad_x) / sx
    kpts[..., 1] = (kpts[..., 1] - pad_y) / sy
    return kpts


def select_poses_in_stage(outputs, thresholds: torch.Tensor, geometry: torch.Tensor, max_det: int, *,
                          nms: bool = True) -> torch.Tensor:
    """A pose family's ``infer`` outputs (sorted candidates: boxes, scores, classes, keypoints
    (B, K, N, 2), optional visibility (B, K, N)) -> one packed float32 tensor, fixed shape, no host
    synchronization (the in-stage half of :class:`PosePlan`): class-aware NMS (``nms=False``:
    none) and the selection of at most ``max_det`` (:func:`~libreyolo.ops.nms_graph.select_packed`
    with its candidate index), the kept rows' keypoints gathered, boxes and keypoints mapped to
    each image's pixels (``geometry`` from :func:`~libreyolo.ops.letterbox.geometry_rows`,
    ``thresholds`` ``[conf, iou]``).

    (B, M * (6 + 3 N) + 1): per kept row ``[x1, y1, x2, y2, score, cls]`` then its N keypoints
    ``(x, y, conf)`` (conf: the visibility, else the row's score), rows in score order, then each
    image's count; rows past the count are not read. M is ``max_det`` or the candidate count K
    where that is smaller (no more can be kept)."""
    boxes, scores, cls, kpts = outputs[:4]
    bsz, n_kpt = scores.shape[0], kpts.shape[2]
    max_det = min(int(max_det), scores.shape[1])
    packed = nms_graph.select_packed(boxes, scores, cls, thresholds, max_det, nms=nms, with_index=True)
    packed = unletterbox_packed(packed, geometry, max_det, cols=7)
    rows = packed[:, :max_det * 7].view(bsz, max_det, 7)
    idx = rows[..., 6].long()
    pts = unletterbox_points(kpts.float().gather(1, idx[..., None, None].expand(-1, -1, n_kpt, 2)), geometry)
    if len(outputs) > 4:
        conf = outputs[4].float().gather(1, idx[..., None].expand(-1, -1, n_kpt))
    else:
        conf = rows[..., 4:5].expand(-1, -1, n_kpt)
    body = torch.cat((rows[..., :6], torch.cat((pts, conf[..., None]), -1).flatten(2)), -1)
    return torch.cat((body.flatten(1), packed[:, -1:]), 1)


class PosePlan(InStageSelection, PredictPlan):
    """One pose predict call (see the module docstring)."""

    def __init__(self, model, constants: Callable[..., torch.Tensor] | None, *, conf: float, max_det: int,
                 classes: list[int] | None, iou: float = 0.45):
        self.model = model
        self.constants = constants
        self.conf, self.max_det, self.classes = float(conf), int(max_det), classes
        self.iou = float(iou) if model.NMS else None
        # NMS + selection inside the stage: CUDA with Triton, no class filter, a predictor's
        # cached constants (an exported model's plan has none)
        on = classes is None and constants is not None and nms_graph.available(getattr(model, "device", "cpu"))
        self.post = (self.max_det,) if on else None
        self.host = on
        self.tag = () if self.post is None else ("pose", "post", *self.post)

    def finish(self, outputs, *extra):
        """The family's infer (already the fixed-shape top-k); with the in-stage selection
        (``post``) its kept poses, packed (:func:`select_poses_in_stage`)."""
        if self.post is None:
            return outputs
        thr, geo = extra
        return select_poses_in_stage(outputs, thr, geo, self.max_det, nms=self.model.NMS)

    def results(self, out, chunk, size, speed):
        from ...results import Boxes, Results
        m = self.model
        if self.post is not None:
            return self._selected_results(out, chunk, speed)
        boxes, scores, cls, kpts = (t.detach().float().cpu().numpy() for t in out[:4])
        vis = out[4].detach().float().cpu().numpy() if len(out) > 4 else None
        skeleton = skeleton_of(m)
        results = []
        for i, it in enumerate(chunk):
            idx = kept(boxes[i], scores[i], cls[i], self.conf, self.iou, self.classes)[: self.max_det]
            det = np.concatenate([boxes[i][idx], scores[i][idx, None], cls[i][idx, None]], 1).astype(np.float32)
            pts = kpts[i][idx].astype(np.float32)
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            sx, sy, px, py = inverse_params(h, w, size, m.preprocess.resize)
            unletterbox_boxes(det, sx, sy, h, w, px, py)
            unletterbox_keypoints(pts, sx, sy, px, py)
            # each keypoint's visibility where the family predicts it, else its instance's score
            conf = (vis[i][idx, :, None].astype(np.float32) if vis is not None
                    else np.repeat(det[:, None, 4:5], pts.shape[1], 1))
            pts = np.concatenate([pts, conf], 2)
            results.append(Results(it.image, it.name, m.names, Boxes(torch.from_numpy(det), (h, w)),
                                   speed=dict(speed),
                                   keypoints=Keypoints(torch.from_numpy(np.ascontiguousarray(pts)), (h, w),
                                                       skeleton)))
        return results

    def _selected_results(self, out, chunk, speed):
        """The in-stage selection's one packed copy -> Results (rows already in each image's pixels)."""
        from ...results import Boxes, Results
        m = self.model
        host = out.wait().numpy()
        width = 6 + 3 * int(m.num_keypoints)   # a row: box, score, class, N keypoints (x, y, conf)
        skeleton = skeleton_of(m)
        results = []
        for i, it in enumerate(chunk):
            n = int(host[i, -1])
            block = host[i, :n * width].reshape(n, width)
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            det = torch.from_numpy(block[:, :6].copy())
            pts = torch.from_numpy(block[:, 6:].reshape(n, (width - 6) // 3, 3).copy())
            results.append(Results(it.image, it.name, m.names, Boxes(det, (h, w)), speed=dict(speed),
                                   keypoints=Keypoints(pts, (h, w), skeleton)))
        return results


class PoseTask(Task):
    name = "pose"
    primary_metric = "oks_map50_95"
    Options = PoseOptions
    val_option_names = {"conf": "val_conf", "iou": "val_iou"}
    predict_defaults = {"conf": 0.25, "iou": 0.45, "max_det": 300, "classes": None}

    def plan(self, model, size, constants, **opts) -> PosePlan:
        from ...options import check_fraction, check_max_det, parse_classes
        unknown = set(opts) - set(self.predict_defaults)
        if unknown:
            raise ValueError(f"unknown pose predict option(s) {', '.join(sorted(unknown))}; "
                             f"options: {', '.join(self.predict_defaults)}")
        o = {**self.predict_defaults, **opts}
        max_det, _ = check_max_det(o["max_det"], None)
        plan = PosePlan(model, constants, conf=check_fraction("conf", o["conf"]), max_det=max_det,
                        classes=parse_classes(o["classes"], model.names), iou=check_fraction("iou", o["iou"]))
        plan.reusable = not isinstance(o["classes"], str)   # class names: read from the model's names each call
        return plan

    # ------------------------------------------------------------------- data
    def prepare_model(self, model, data) -> None:
        """An untrained model takes the dataset's keypoint count (its keypoint layers rebuilt); a
        trained one must already have it."""
        n = getattr(model, "num_keypoints", None)
        if n is not None and data.kpt_shape[0] != n:
            if model.trained:
                raise ValueError(f"the dataset has {data.kpt_shape[0]} keypoints per instance (kpt_shape), the "
                                 f"trained {model.FAMILY}-{model.size} pose model {n}")
            model.reset_keypoints(data.kpt_shape[0])

    def prepare_training(self, model, net, options: PoseOptions) -> None:
        """The keypoint branch's gradient scale (``kpt_grad``; the family's default where not
        given) on a family whose keypoint branch is separate from the box branch."""
        setter = getattr(model, "set_keypoint_gradient", None)
        if setter is not None:
            setter(net, options.kpt_grad)
        elif options.kpt_grad is not None and options.kpt_grad != 1.0:
            from ...options import OptionError
            raise OptionError(f"kpt_grad={options.kpt_grad:g}: {model.FAMILY}'s pose network has no separate "
                              "keypoint branch to scale (YOLO-NAS-Pose has)")

    def resolve_data(self, data):
        from .data import resolve_pose_data
        return resolve_pose_data(data)

    def datasets(self, data, imgsz, model, options: PoseOptions):
        from .data import PoseDataset
        val, collate = self.val_dataset(data, imgsz, model, options)
        train = PoseDataset(data.train, imgsz, data.flip_idx, augment=True, fliplr=options.fliplr,
                             scale=options.scale, translate=options.translate)
        return train, val, collate

    def val_dataset(self, data, imgsz, model, options: PoseOptions):
        from .data import PoseDataset, collate_pose
        n = getattr(model, "num_keypoints", None)
        if n is not None and data.kpt_shape[0] != n:
            raise ValueError(f"the dataset has {data.kpt_shape[0]} keypoints per instance (kpt_shape), the "
                             f"{model.FAMILY}-{model.size} pose model {n}")
        # the dataset's keypoint layout travels with the model (its checkpoint, plots, OKS sigmas)
        model.meta.update(kpt_shape=list(data.kpt_shape), flip_idx=list(data.flip_idx),
                          skeleton=[list(p) for p in data.skeleton], kpt_sigmas=list(data.sigmas))
        val = PoseDataset(data.val, imgsz, data.flip_idx)
        return val, functools.partial(collate_pose, bucket=options.bucket)

    def target_rows(self, targets) -> int:
        return int(targets[0].shape[1])     # cls (B, M): the bucketed M

    def pad_target_rows(self, targets, rows: int) -> list:
        import torch.nn.functional as F
        cls, boxes, kpts, mask = targets
        more = rows - cls.shape[1]
        if more < 0:
            raise ValueError(f"cannot pad {cls.shape[1]} target rows to {rows}")
        return [F.pad(cls, (0, more)), F.pad(boxes, (0, 0, 0, more)), F.pad(kpts, (0, 0, 0, 0, 0, more)),
                F.pad(mask, (0, more), value=False)]

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: PoseOptions) -> PoseEvaluator:
        from .results import COCO_SIGMAS
        sigmas = (getattr(model, "meta", None) or {}).get("kpt_sigmas")
        if sigmas is None:
            n = getattr(model, "num_keypoints", 17)
            sigmas = COCO_SIGMAS if n == 17 else (0.05,) * n
        return PoseEvaluator(model, options, tuple(float(v) for v in sigmas))

    def fitness(self, metrics) -> float:
        def nz(v):
            return 0.0 if v is None or v != v else float(v)
        return 0.1 * nz(metrics.get("oks_map50")) + 0.9 * nz(metrics.get("oks_map50_95"))

    def empty_metrics(self) -> dict[str, float]:
        from .metrics import METRICS
        return dict.fromkeys(METRICS, float("nan"))

    def summary(self, metrics) -> str:
        return (f"OKS mAP50 {metrics['oks_map50']:.4f}  OKS mAP50-95 {metrics['oks_map50_95']:.4f}  "
                f"box mAP50 {metrics.get('map50', float('nan')):.4f}")
