"""Object detection: boxes, NMS (or none for set-prediction heads), COCO mAP.

Predict stage (on the device, captured): ``model.infer`` (boxes, scores, classes per anchor or
query) -> the top ``max_nms`` candidates -> with Triton on CUDA and no class filter, NMS and the
final selection (:mod:`libreyolo.ops.nms_graph`) and the boxes mapped back to each image's
pixels, as one packed (B, max_det * 6 + 1) tensor copied to the host once; otherwise NMS runs
after the stage (torchvision) and the boxes are mapped back on the host.

Training: YOLO/COCO datasets or the built-in ``shapes`` set, mosaic / affine / HSV / flip (or the
DETR recipe; with ``gpu_augment=True`` the YOLO recipe runs on the device per batch, see
:mod:`libreyolo.data.gpu_augment`), targets padded to a bucketed row count so losses have fixed shapes; validation
mAP50 and mAP50-95, fitness 0.1 * mAP50 + 0.9 * mAP50-95.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...ops import nms_graph
from ...ops.letterbox import inverse_params, unletterbox_boxes, unletterbox_packed
from ...ops.nms import nms_per_image, top_candidates
from ...ops.nms_graph import select_packed
from ...options import (
    MAX_DET,
    Bool,
    Choice,
    Custom,
    Float,
    Fraction,
    Int,
    OptionError,
    check_fields,
    check_max_det,
    option,
)
from ..base import Evaluator, InStageSelection, PredictPlan, Task, TaskOptions


@dataclass
class DetectOptions(TaskOptions):
    """Detection training options: augmentation, target padding, validation thresholds."""

    close_mosaic: int = option(10, "epochs at the end trained without mosaic and MixUp (default: the family's, "
                                   "else 10)", Int(0))
    mosaic: float = option(1.0, "probability of mosaic (default: the family's, else 1; DETRs 0)", Fraction())
    dense_mosaic: bool = option(False, "DEIM's Dense O2O: mosaic tiles shrunk so each image holds all four", Bool())
    mixup: float = option(0.0, "probability of MixUp, blending two augmented samples (default: the family's, "
                               "else 0; closed with mosaic)", Fraction())
    augment_policy: str = option("yolo", "yolo (affine + HSV) or detr (photometric, zoom-out, IoU crop); default: "
                                         "the family's", Choice("yolo", "detr"))
    degrees: float = option(0.0, "random rotation, +- degrees", Float(0.0, 180.0))
    translate: float = option(0.1, "random translation, +- fraction of the size", Fraction())
    scale: float = option(0.5, "random scale gain, +- fraction", Float(0.0, 1.0, max_inclusive=False))
    fliplr: float = option(0.5, "probability of a horizontal flip", Fraction())
    hsv_h: float = option(0.015, "hue augmentation, +- fraction", Fraction())
    hsv_s: float = option(0.7, "saturation augmentation, +- fraction", Fraction())
    hsv_v: float = option(0.4, "value (brightness) augmentation, +- fraction", Fraction())
    bucket: int = option(16, "targets padded to this times a power of two (fixed loss shapes)", Int(1))
    gpu_augment: bool = option(False, "the YOLO recipe (mosaic, affine, HSV, flip) on the training device per "
                                      "batch, the workers only decode (augment_policy=yolo only)", Bool())
    val_conf: float = option(0.001, "confidence threshold of validation", Fraction())
    val_iou: float = option(0.7, "NMS IoU threshold of validation", Fraction())
    max_det: int = option(300, "detections kept per image in validation", Custom(
        lambda n, v: check_max_det(v)[0], f"integer in [1, {MAX_DET}]"))

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)
        if self.gpu_augment and self.augment_policy != "yolo":
            raise OptionError("gpu_augment=True runs the YOLO recipe (mosaic, affine, HSV, flip) on the device; "
                              f"this run has augment_policy={self.augment_policy!r}, whose transforms run in the "
                              "DataLoader workers: leave gpu_augment off or use augment_policy=yolo")


class DetectPlan(InStageSelection, PredictPlan):
    """One detection predict call (see the module docstring)."""

    def __init__(self, model, constants: Callable[..., torch.Tensor], *, conf: float, iou: float,
                 max_det: int, max_nms: int, classes: list[int] | None, agnostic_nms: bool):
        self.model = model
        self.constants = constants
        self.conf, self.iou = float(conf), float(iou)
        self.max_det, self.max_nms = int(max_det), int(max_nms)
        self.classes, self.agnostic = classes, bool(agnostic_nms)
        # NMS + selection inside the stage: CUDA with Triton and no class filter
        self.post = (self.max_det, self.agnostic) if classes is None and nms_graph.available(model.device) else None
        self.host = self.post is not None
        self.tag = (self.max_nms,) if self.post is None else (self.max_nms, "post", *self.post)

    def finish(self, outputs, *extra):
        cand = top_candidates(*outputs, self.max_nms)
        if self.post is None:
            return cand
        thr, geo = extra
        packed = select_packed(*cand, thr, self.max_det, nms=self.model.NMS, agnostic=self.agnostic)
        return unletterbox_packed(packed, geo, self.max_det)

    def results(self, out, chunk, size, speed):
        from ...results import Boxes, Results
        m = self.model
        # Host work on a few hundred numbers: numpy, whose small-array calls cost about a
        # microsecond where a CPU torch op costs several.
        if self.post is None:
            dets = nms_per_image(*out, conf=self.conf, iou=self.iou, max_det=self.max_det,
                                 classes=self.classes, agnostic=self.agnostic, nms_free=not m.NMS).numpy()
            img_col = dets[:, 0]
            per_image = [dets[img_col == i, 1:] for i in range(len(chunk))]
        else:  # one copy: (B, max_det * 6 + 1) = detections in score order + count per image
            host = out.wait().numpy()
            counts = host[:, -1].astype(np.int64).tolist()
            per_image = [host[i, :n * 6].reshape(n, 6).copy() for i, n in enumerate(counts)]
        results = []
        for i, it in enumerate(chunk):
            d = per_image[i]
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            if self.post is None:  # the post stage maps its boxes back on the device
                sx, sy, px, py = inverse_params(h, w, size, m.preprocess.resize)
                unletterbox_boxes(d, sx, sy, h, w, px, py)
            results.append(Results(it.image, it.name, m.names, Boxes(torch.from_numpy(d), (h, w)),
                                   speed=dict(speed)))
        return results


class DetectionEvaluator(Evaluator):
    """COCO mAP50 / mAP50-95 of a validation split (NMS as predict does, at ``val_conf``: on
    CUDA with Triton the same in-stage NMS, otherwise torchvision's on the host)."""

    def __init__(self, model, options: DetectOptions):
        self.model, self.options = model, options
        self.reset()

    #: the confidence of the confusion matrix (and of the validation-batch picture)
    PLOT_CONF = 0.25

    def reset(self) -> None:
        self.preds: list[np.ndarray] = []
        self.gts: list[np.ndarray] = []
        self.first_batch: np.ndarray | None = None
        self.pr = None

    #: candidates per image before NMS (every anchor of a 640 px YOLO head, and more)
    MAX_CANDIDATES = 30000

    def device_nms(self, scores: torch.Tensor) -> bool:
        """Whether NMS and the selection run in the stage for these candidate scores: on CUDA
        with Triton, when every candidate fits the fixed-shape kernel (validation keeps all of
        them: capping them would change the metric)."""
        return nms_graph.available(scores.device) and (not self.model.NMS or scores.shape[1] <= nms_graph.MAX_CANDIDATES)

    def finish(self, outputs):
        """In the stage: the top :attr:`MAX_CANDIDATES` anchors per image, sorted by score, and
        where :meth:`device_nms` says so NMS and the selection too - predict's fixed-shape NMS
        (:func:`~libreyolo.ops.nms_graph.select_packed`), one packed (B, max_det * 6 + 1) tensor.
        Otherwise NMS runs in :meth:`process`, on the host (torchvision)."""
        cand = top_candidates(*outputs, self.MAX_CANDIDATES)
        if not self.device_nms(cand[1]):
            return cand
        o = self.options
        # two fill kernels (an item assignment would copy a CPU scalar: not capturable)
        thr = cand[1].new_empty(2, dtype=torch.float32)
        thr[:1].fill_(o.val_conf)
        thr[1:].fill_(o.val_iou)
        return select_packed(*cand, thr, o.max_det, nms=self.model.NMS)

    @property
    def stage_tag(self) -> tuple:
        """What the stage of :meth:`finish` bakes in besides the evaluator's class (the
        thresholds of the device NMS): part of the stage's graph key."""
        o = self.options
        return (o.val_conf, o.val_iou, o.max_det)

    def process(self, outputs, batch) -> None:
        imgs, targets, mask = batch
        o = self.options
        if self.first_batch is None:
            self.first_batch = imgs[:16].numpy()
        # split per image in numpy: a torch call per image gives up the GIL (and waits to get it
        # back behind a busy thread, such as the next epoch's pin-memory thread)
        targets, mask = targets.numpy(), mask.numpy()
        if isinstance(outputs, torch.Tensor):   # finish's packed detections: count last in each row
            host = outputs.cpu().numpy()
            preds = [host[i, :n * 6].reshape(-1, 6).copy() for i, n in enumerate(host[:, -1].astype(np.int64))]
        else:
            dets = nms_per_image(*outputs, conf=o.val_conf, iou=o.val_iou, max_det=o.max_det,
                                 nms_free=not self.model.NMS).numpy()
            preds = [dets[dets[:, 0] == i, 1:] for i in range(targets.shape[0])]
        self.preds.extend(preds)
        self.gts.extend(targets[i][mask[i]] for i in range(targets.shape[0]))

    def evaluate(self) -> dict:
        """COCO mAP50 / mAP50-95 (per class too), and precision / recall at the confidence of the
        best mean F1 (IoU 0.5)."""
        from ...graphs.capture import no_gc
        from .curves import pr_summary
        from .metrics import evaluate_detections
        # tens of thousands of small dicts and arrays (a weak detector's max_det rows per image):
        # in a training process's large heap, the collections they trigger cost more than the
        # evaluation itself
        with no_gc():
            # the run's pool (classes dealt out to child processes: the same figures) when it
            # takes the split, else here
            res = None if self.pool is None else self.pool.evaluate(self.preds, self.gts, self.model.nc,
                                                                    self.model.names)
            if res is None:
                out = evaluate_detections(self.preds, self.gts, self.model.nc, self.model.names)
                self.pr = pr_summary(self.preds, self.gts, self.model.nc)
            else:
                out, self.pr = res
        out["precision"], out["recall"] = self.pr.p, self.pr.r
        return out

    writes_coco_json = True

    def coco_predictions(self, dataset, data) -> list[dict]:
        """COCO results of the last evaluation: each validation image's detections mapped from
        the letterboxed canvas back to the image's pixels, as ``{"image_id", "category_id",
        "bbox": [x, y, w, h], "score"}``. Ids are the dataset's own for a COCO json dataset
        (image ids from its json, category ids mapped back from class indices); for a YOLO
        dataset the image id is the file stem (an int when it is one) and the category id the
        class index."""
        out = []
        cats = list(data.category_ids) or list(range(self.model.nc))
        size, resize = dataset.imgsz, dataset.resize
        for sample, p in zip(dataset.samples, self.preds):
            h, w = sample.height, sample.width
            image_id = data.image_ids.get(str(sample.image)) if data.image_ids else None
            if image_id is None:
                stem = sample.image.stem
                image_id = int(stem) if stem.isdigit() else stem
            boxes = np.asarray(p[:, :4], np.float32).copy()
            sx, sy, px, py = inverse_params(h, w, size, resize)
            unletterbox_boxes(boxes, sx, sy, h, w, px, py)
            for (x1, y1, x2, y2), score, cls in zip(boxes.tolist(), p[:, 4].tolist(), p[:, 5].tolist()):
                out.append({"image_id": image_id, "category_id": int(cats[int(cls)]),
                            "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                            "score": round(float(score), 5)})
        return out

    def images(self, n: int) -> list:
        """The first ``n`` validation images with their detections at :attr:`PLOT_CONF` drawn as
        predict's ``Results.plot()`` draws them (class name and score)."""
        from ...results import Boxes, Results
        if self.first_batch is None:
            return []
        out = []
        for image, p in zip(self.first_batch[:n], self.preds):
            hwc = np.ascontiguousarray(np.transpose(image, (1, 2, 0)))
            p = np.asarray(p[p[:, 4] >= self.PLOT_CONF], np.float32).reshape(-1, 6)
            drawn = Results(hwc, "val", self.model.names, Boxes(torch.from_numpy(p), hwc.shape[:2])).plot(conf=True)
            out.append(torch.from_numpy(np.ascontiguousarray(drawn)).permute(2, 0, 1))
        return out

    def plot(self, run_dir) -> list:
        """pr_curve.png, confusion_matrix.png, val_batch0_labels.jpg, val_batch0_pred.jpg.

        With :attr:`plotter` (a training run's plot child) the two matplotlib figures are drawn
        there while this process draws the batch pictures; without one, or when it is gone,
        all four here."""
        from pathlib import Path

        from . import plots
        from .curves import confusion_matrix
        run_dir, names, nc = Path(run_dir), self.model.names, self.model.nc
        if self.pr is None:
            self.evaluate()
        matrix = confusion_matrix(self.preds, self.gts, nc, self.PLOT_CONF)
        npz = run_dir / ".curves.npz"   # the curves' arrays for the child; removed here, whatever happens
        try:
            reply = None
            if self.plotter is not None:
                plots.save_curves(npz, self.pr, matrix)
                reply = self.plotter.send({"call": {"file": plots.__file__, "fn": "draw_saved_curves", "kwargs": {
                    "npz": str(npz), "run_dir": str(run_dir), "names": {str(k): v for k, v in names.items()},
                    "conf": self.PLOT_CONF}}})
            batch = []
            try:
                if self.first_batch is not None:
                    n = len(self.first_batch)
                    batch.append(plots.plot_batch(self.first_batch, self.gts[:n], names,
                                                  run_dir / "val_batch0_labels.jpg", False))
                    preds = [p[p[:, 4] >= self.PLOT_CONF] for p in self.preds[:n]]
                    batch.append(plots.plot_batch(self.first_batch, preds, names, run_dir / "val_batch0_pred.jpg",
                                                  True))
            finally:
                curves = self._curves_reply(reply)   # the child's reply is always read
        finally:
            npz.unlink(missing_ok=True)
        if curves is None:
            curves = plots.plot_curves(self.pr, matrix, names, run_dir, self.PLOT_CONF)
        return curves + batch

    @staticmethod
    def _curves_reply(reply) -> list | None:
        """The curves' paths from the plot child; None when there was no child or it died."""
        from pathlib import Path

        from ...childproc import ChildGone
        if reply is None:
            return None
        try:
            return [Path(p) for p in reply()]
        except ChildGone:
            return None


class DetectTask(Task):
    name = "detect"
    primary_metric = "map50_95"
    Options = DetectOptions
    predict_defaults = {"conf": 0.25, "iou": 0.45, "max_det": 300, "max_nms": 1000, "classes": None,
                        "agnostic_nms": False}
    val_option_names = {"conf": "val_conf", "iou": "val_iou"}

    def plan(self, model, size, constants, **opts) -> DetectPlan:
        from ...options import check_fraction, check_max_det, parse_bool, parse_classes
        o = {**self.predict_defaults, **opts}
        conf, iou = check_fraction("conf", o["conf"]), check_fraction("iou", o["iou"])
        # max_nms given or not: when not, it follows a max_det above the default's 1000
        max_det, max_nms = check_max_det(o["max_det"], opts.get("max_nms"))
        classes = parse_classes(o["classes"], model.names)
        plan = DetectPlan(model, constants, conf=conf, iou=iou, max_det=max_det, max_nms=max_nms,
                          classes=classes, agnostic_nms=parse_bool("agnostic_nms", o["agnostic_nms"]))
        plan.reusable = not isinstance(o["classes"], str)   # class names: read from the model's names each call
        return plan

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from ...data.datasets import resolve_data
        return resolve_data(data)

    def datasets(self, data, imgsz, model, options: DetectOptions):
        from ...data.augment import DetectionDataset
        o = options
        hyp = dict(mosaic=o.mosaic, degrees=o.degrees, translate=o.translate, scale=o.scale, fliplr=o.fliplr,
                   hsv_h=o.hsv_h, hsv_s=o.hsv_s, hsv_v=o.hsv_v, dense_mosaic=o.dense_mosaic, mixup=o.mixup,
                   policy=o.augment_policy)
        # as predict feeds the network: letterbox or stretch, with predict's resampling
        resize, antialias = model.preprocess.resize, model.preprocess.antialias
        train = DetectionDataset(data.train, imgsz, augment=True, resize=resize, gpu_augment=o.gpu_augment,
                                 antialias=antialias, **hyp)
        val, collate = self.val_dataset(data, imgsz, model, options)
        return train, val, collate

    def val_dataset(self, data, imgsz, model, options: DetectOptions):
        from ...data.augment import DetectionDataset, collate_detections
        val = DetectionDataset(data.val, imgsz, augment=False, resize=model.preprocess.resize,
                               antialias=model.preprocess.antialias)
        return val, functools.partial(collate_detections, bucket=options.bucket)  # picklable under spawn

    def device_augment(self, train_set, options: DetectOptions):
        """``gpu_augment=True``: the YOLO recipe on the device (:class:`~libreyolo.data.gpu_augment.
        DeviceAugment`) for the loader's raw batches; else None."""
        if not getattr(train_set, "gpu_augment", False):
            return None
        from ...data.gpu_augment import DeviceAugment
        return DeviceAugment(train_set, bucket=options.bucket)

    def target_rows(self, targets) -> int:
        return int(targets[0].shape[1])   # (B, M, 5) boxes, (B, M) mask: the bucketed M

    def pad_target_rows(self, targets, rows: int) -> list:
        import torch.nn.functional as F
        boxes, mask, *rest = targets
        more = rows - boxes.shape[1]
        if more < 0:
            raise ValueError(f"cannot pad {boxes.shape[1]} target rows to {rows}")
        # zero rows, masked out (False): what the collate pads with
        return [F.pad(boxes, (0, 0, 0, more)), F.pad(mask, (0, more), value=False), *rest]

    def on_epoch(self, train_set, epoch, epochs, options: DetectOptions) -> str | None:
        if options.close_mosaic and not getattr(train_set, "mosaic_closed", False) \
                and epoch >= max(0, epochs - options.close_mosaic):
            train_set.close_mosaic()
            train_set.mosaic_closed = True
            return f"mosaic closed for the last {epochs - epoch} epochs"
        return None

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: DetectOptions) -> DetectionEvaluator:
        return DetectionEvaluator(model, options)

    def evaluation_pool(self, processes: int):
        """:class:`~.evalpool.EvalPool`: the classes' COCO and PR figures computed in
        ``processes`` child interpreters (at least two; else None)."""
        if processes < 2:
            return None
        from .evalpool import EvalPool
        return EvalPool(processes)

    def fitness(self, metrics) -> float:
        def nz(v):
            return 0.0 if v is None or v != v else float(v)
        return 0.1 * nz(metrics.get("map50")) + 0.9 * nz(metrics.get("map50_95"))

    def metric_columns(self, metrics) -> dict[str, float]:
        return {"metrics/precision": metrics["precision"], "metrics/recall": metrics["recall"],
                "metrics/mAP50": metrics["map50"], "metrics/mAP50-95": metrics["map50_95"]}

    def summary(self, metrics) -> str:
        return (f"P {metrics['precision']:.3f}  R {metrics['recall']:.3f}  mAP50 {metrics['map50']:.4f}  "
                f"mAP50-95 {metrics['map50_95']:.4f}")

    def empty_metrics(self) -> dict[str, float]:
        return {"precision": float("nan"), "recall": float("nan"), "map50": float("nan"), "map50_95": float("nan")}
