"""OCR: text detection (DB) + recognition (CTC), two stages with a host seam between them.

Stage 1 (on the device, captured per input shape by the predictor like every task's stage):
the resize (PP-OCR's: the aspect ratio kept, sides to a multiple of 32), the detector (``model.infer``: the sigmoid shrink map) and the binarization
``map > det_thresh`` (the threshold is a cached graph input, so changing it needs no new
capture). The map and the binary map reach the host in one copy.

Host seam: the DB post-process (:mod:`.postprocess`: OpenCV contours, minimum-area rectangles,
box scores, pyclipper unclipping) gives a data-dependent number of quadrilaterals of
data-dependent shape - no fixed-shape graph can hold it - then the lines are put in reading
order, warped upright from the original image and resized to height 48 (OpenCV).

Stage 2 (on the device, captured per batch shape): the lines are taken narrowest first and
batched by similar width (:func:`~.postprocess.rec_batches`: at most ``rec_batch`` lines whose
widths stay within 1.25x the batch's first plus 32 pixels), each batch as wide as its widest line
rounded up to a multiple of 32 - every line is recognised at about its own width, as PaddleOCR
pads a batch to its widest line - with one row per line on the CPU and the rows rounded up to a
power of two elsewhere (fewer shapes for the graph cache; rows are computed independently). The
stage normalizes (BGR, [-1, 1], mid-grey to the right of each line's width), runs the recognizer
and decodes greedily on the device: per time step the most probable class; steps past the
line's width, the blank (class 0) and repeats of the previous step are dropped; the line's
confidence is the mean probability of the kept steps. Only the class ids, the keep mask and the
confidences go to the host, where the ids become characters (``model.charset``).

Padding is part of what this stage computes: the SVTR encoder's global attention (and the convs
at the line's end) see the padded columns, so a line's probabilities depend on its batch's
width (``tests/unit/test_ocr.py`` measures it). Padding a line far beyond its width (a fixed
bucket of 320..1280 columns) made trained weights drop the spaces between words; padded by at
most a quarter of its width plus 32 columns it reads as it does alone
(``tests/unit/test_ocr_real.py``). Eager runs the same padded batch as the graph:
``cuda_graph`` changes how, not what.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...options import check_float, check_fraction, check_int
from ..base import PredictPlan, Task

#: how many lines the synthetic benchmark page holds (the OCR target: det + rec of 10 lines)
BENCH_LINES = 10


def ctc_greedy(probs: torch.Tensor, widths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy CTC decoding on the device, fixed shapes (graph-safe).

    ``probs`` (B, T, C) per-step class probabilities (class 0 = blank), ``widths`` (B,) the
    valid input columns of each line (8 per step). Returns class ids (B, T) int32, the keep
    mask (B, T) bool (not blank, not a repeat of the previous step, inside the line) and the
    confidence (B,) float32: the mean probability of the kept steps (0 without any).
    """
    conf, idx = probs.float().max(-1)
    steps = torch.arange(probs.shape[1], device=probs.device)
    inside = steps < ((widths.to(torch.int64) + 7) // 8).view(-1, 1)
    idx = torch.where(inside, idx, torch.zeros((), dtype=idx.dtype, device=idx.device))
    first = torch.ones_like(idx[:, :1], dtype=torch.bool)
    keep = (idx != 0) & torch.cat((first, idx[:, 1:] != idx[:, :-1]), 1)
    kept = keep.to(conf.dtype)
    score = (conf * kept).sum(1) / kept.sum(1).clamp_min(1.0)
    return idx.to(torch.int32), keep, score


class OcrPlan(PredictPlan):
    """One OCR predict call (see the module docstring)."""

    host = True

    def __init__(self, model, constants: Callable[..., torch.Tensor], *, det_thresh: float, box_thresh: float,
                 unclip_ratio: float, rec_conf: float, max_lines: int, rec_batch: int):
        self.model = model
        self.constants = constants
        self.det_thresh, self.box_thresh = float(det_thresh), float(box_thresh)
        self.unclip_ratio, self.rec_conf = float(unclip_ratio), float(rec_conf)
        self.max_lines, self.rec_batch = int(max_lines), int(rec_batch)
        self.tag = ("db-binarize",)

    @property
    def constant(self) -> tuple[int, ...]:
        return (1,)   # the cached threshold

    def extra(self, shapes, size):
        t = self.det_thresh
        return (self.constants("ocr-thresh", (t,), lambda: [t]),)

    def finish(self, prob: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (thresh,) = extra
        p = prob[:, 0]
        return p, (p > thresh).to(torch.uint8)

    # ------------------------------------------------------------ stage 2
    def _autocast(self):
        amp = getattr(self, "amp_dtype", None)
        if amp is None:
            dev = self.model.device.type
            return torch.autocast(dev, enabled=False) if torch.is_autocast_enabled(dev) else contextlib.nullcontext()
        return torch.autocast("cuda", dtype=amp)

    def rec_stage(self, crops_u8: torch.Tensor, widths: torch.Tensor):
        """Stage 2 on device tensors: recognizer + greedy CTC (the function the runner captures)."""
        return ctc_greedy(self.model.infer_rec(crops_u8, widths), widths)

    def parity_stages(self, batch, device):
        """Stage 2 at each bucket width on ``batch`` lines: probe A random pixels with random widths,
        probe B dim pixels with full widths (different distributions)."""
        g = torch.Generator().manual_seed(99)
        stages = []
        for width in self.model.REC_BUCKETS:
            a = torch.randint(0, 256, (batch, 48, width, 3), generator=g, dtype=torch.uint8)
            wa = torch.randint(1, width + 1, (batch,), generator=g, dtype=torch.int32)
            b = torch.randint(90, 140, (batch, 48, width, 3), generator=g, dtype=torch.uint8)
            wb = torch.full((batch,), width, dtype=torch.int32)
            stages.append((f"rec-stage w{width}", self.rec_stage, (a.to(device), wa.to(device)),
                           (b.to(device), wb.to(device))))
        return stages

    def recognize(self, lines: list[np.ndarray]) -> tuple[list[str], np.ndarray]:
        """Texts and confidences of resized (48-high) uint8 RGB lines, through stage 2."""
        from .postprocess import rec_batches
        m = self.model
        texts, confs = [""] * len(lines), np.zeros((len(lines),), np.float32)
        charset = m.charset
        rows = "exact" if m.device.type == "cpu" else "pow2"   # fewer graph shapes where graphs exist
        for idx, u8, widths in rec_batches(lines, self.rec_batch, rows=rows):
            u8_t = torch.from_numpy(u8).to(m.device)
            w_t = torch.from_numpy(widths).to(m.device)
            with torch.no_grad(), self._autocast():
                out = m.runner(("ocr-rec", u8.shape[2]), self.rec_stage, (u8_t, w_t), getattr(self, "mode", False),
                                host=True)
            ids, keep, score = (t.numpy() for t in out.wait())
            for r, i in enumerate(idx):
                texts[i] = "".join(charset[c] for c in ids[r][keep[r]])
                confs[i] = score[r]
        return texts, confs

    # ------------------------------------------------------------ results
    def results(self, out, chunk, size, speed):
        from ...ops.letterbox import MODES as LETTERBOX_MODES
        from ...ops.letterbox import letterbox_params
        from ...results import Results
        from .postprocess import crop_line, db_boxes, reading_order, resize_line
        from .results import TextLines
        m = self.model
        prob, bitmap = out.wait()
        per_image, lines = [], []
        for i, it in enumerate(chunk):
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            mode = m.preprocess.resize
            if mode in LETTERBOX_MODES:
                p = letterbox_params(h, w, size, mode)
                sl = (slice(p.pad_y, p.pad_y + p.new_h), slice(p.pad_x, p.pad_x + p.new_w))
            else:   # "limit" / "cover" / "long": the whole map is the image's, scaled per axis
                sl = (slice(None), slice(None))
            boxes = db_boxes(np.ascontiguousarray(bitmap[i].numpy()[sl]), prob[i].numpy()[sl], (h, w),
                             self.box_thresh, self.unclip_ratio, self.max_lines)
            order = reading_order(boxes.quads)
            quads, scores = boxes.quads[order], boxes.scores[order]
            first = len(lines)
            lines.extend(resize_line(crop_line(it.image, q), m.REC_BUCKETS) for q in quads)
            per_image.append((quads, scores, first))
        texts, confs = self.recognize(lines) if lines else ([], np.zeros((0,), np.float32))
        results = []
        for it, (quads, scores, first) in zip(chunk, per_image):
            t = texts[first:first + len(quads)]
            c = confs[first:first + len(quads)]
            keep = [j for j in range(len(quads)) if t[j] and c[j] >= self.rec_conf]
            lines_ = TextLines(torch.from_numpy(quads[keep].reshape(-1, 4, 2)), [t[j] for j in keep],
                               torch.from_numpy(c[keep]), torch.from_numpy(scores[keep]))
            results.append(Results(it.image, it.name, m.names, None, speed=dict(speed), texts=lines_))
        return results


class OcrTask(Task):
    """Text detection + recognition (predict only: no OCR training or metric yet)."""

    name = "ocr"
    primary_metric = ""
    #: DB binarization threshold, minimum box score, unclip ratio, minimum recognition confidence
    #: (PaddleOCR's 0.3 / 0.6, lines with no text dropped too), the most lines per image,
    #: recognition batch (the most lines per forward). The unclip ratio is 2.0, not PaddleOCR's
    #: 1.5: with trained PP-OCR weights the boxes grown by 1.5 are tight enough that the
    #: recognizer drops the spaces between words on rendered pages (docs/benchmarks.md, OCR)
    predict_defaults: dict = {"det_thresh": 0.3, "box_thresh": 0.6, "unclip_ratio": 2.0, "rec_conf": 0.0,
                              "max_lines": 1000, "rec_batch": 8}

    def plan(self, model, size, constants, **opts) -> OcrPlan:
        o = {**self.predict_defaults, **opts}
        if model.preprocess.resize == "crop":
            raise ValueError("OCR needs the whole image: preprocess resize 'crop' is not supported "
                             "(use 'limit', 'topleft', 'center' or 'stretch')")
        return OcrPlan(model, constants,
                       det_thresh=check_fraction("det_thresh", o["det_thresh"]),
                       box_thresh=check_fraction("box_thresh", o["box_thresh"]),
                       unclip_ratio=check_float("unclip_ratio", o["unclip_ratio"], minimum=0.0),
                       rec_conf=check_fraction("rec_conf", o["rec_conf"]),
                       max_lines=check_int("max_lines", o["max_lines"], 1),
                       rec_batch=check_int("rec_batch", o["rec_batch"], 1, 256))

    def resolve_data(self, data: Any):
        raise NotImplementedError("the ocr task has no datasets (training and validation are not implemented)")

    def evaluator(self, model, options):
        raise NotImplementedError("the ocr task has no evaluator (validation is not implemented)")

    # ------------------------------------------------------------ bench
    def bench_setup(self, model, imgsz: int) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        """``libreyolo bench``'s input for OCR: a synthetic page of :data:`BENCH_LINES` printed
        lines, ``imgsz`` wide (the target: detection at ``imgsz`` + recognition of 10 lines).
        Trained weights run with the default options. Random weights (untrained; the bench
        re-draws them) detect noise, so they run with box threshold 0, no recognition
        threshold and at most 10 lines: the timing then covers detection plus recognition of
        up to 10 lines, as a trained model's on such a page. Returns (image, options, notes)."""
        from .synthetic import text_page
        page = text_page(BENCH_LINES, width=imgsz)
        if model.trained:
            return page, {}, {"lines_on_page": BENCH_LINES, "options": "defaults"}
        opts = {"box_thresh": 0.0, "rec_conf": 0.0, "max_lines": BENCH_LINES}
        return page, opts, {"lines_on_page": BENCH_LINES, "options": "untrained: " + ", ".join(
            f"{k}={v}" for k, v in opts.items())}

    def bench_arms(self, model, image, runs, warmup, imgsz, time_call) -> dict[str, Any]:
        """The recognition stage alone on one full batch (``rec_batch`` lines at the second bucket
        width), eager and - on CUDA for a graph-declared family - replayed: what each batch of
        lines costs inside the end-to-end arms (the detector alone is the forward arms)."""
        from ...graphs.capture import CudaGraphCapturer
        plan = self.plan(model, imgsz, model.get_predictor().constant)
        dev, buckets = model.device, model.REC_BUCKETS
        width = buckets[min(1, len(buckets) - 1)]
        g = torch.Generator().manual_seed(0)
        u8 = torch.randint(0, 256, (plan.rec_batch, 48, width, 3), generator=g, dtype=torch.uint8).to(dev)
        widths = torch.full((plan.rec_batch,), width, dtype=torch.int32).to(dev)
        name = f"rec_stage_b{plan.rec_batch}_w{width}"
        arms: dict[str, Any] = {}
        with torch.no_grad():
            arms[name + "_eager"] = time_call(lambda: plan.rec_stage(u8, widths), dev, runs, warmup)
            if dev.type == "cuda" and model.SUPPORTS_CUDA_GRAPH:
                graph = CudaGraphCapturer().capture(plan.rec_stage, (u8, widths), module=model.model)
                arms[name + "_graph"] = time_call(lambda: graph.replay((u8, widths), clone=False), dev, runs, warmup)
                del graph
        return arms
