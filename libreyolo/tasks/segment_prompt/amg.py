"""Automatic mask generation ("segment everything"): a point grid through the prompt stage.

SAM's automatic mask generator (``SamAutomaticMaskGenerator``, one crop: the whole image), on the
image embedding of the predictor's image stage:

1. a ``points_per_side`` x ``points_per_side`` grid of foreground points, cell centres of the
   image (``(i + 0.5) / n`` of its width and height), mapped into the frame as any point prompt;
2. the points in batches of ``points_per_batch``, each point its own prompt with three masks
   (``multimask``), through :func:`grid_stage` - the decoder, the masks' logits brought to the
   image's size as the prompt stage brings them, the stability score, the threshold and each
   mask's box, all on the device (the last batch is filled with copies of its last point, so
   every batch has one shape; the copies are dropped);
3. masks kept whose predicted IoU is above ``pred_iou_thresh`` and whose stability score - the IoU
   of the mask thresholded at +offset and at -offset of the logits (offset 1.0) - is at least
   ``stability_score_thresh``;
4. non-maximum suppression over the kept masks' boxes (``box_nms_thresh``, torchvision's
   ``batched_nms`` on the device), ranked by predicted IoU.

The result is :class:`AutoMasks` (``Results.masks``): the masks in NMS order (best first) with
their predicted IoU (``scores``), stability scores, areas in pixels, boxes and the grid point
each came from. Every promptable family with an image embedding serves it (MobileSAM, SAM, and
SAM 3, whose three maps and stretched frame the stage takes through ``embedding_parts`` and the family's
``upscale_logits``); PicoSAM3, prompted by boxes only, refuses it, and so does a family that
up-samples its masks its own way without saying how as logits (SAM 2, EdgeTAM: one error naming it).

The grid stage has fixed shapes (one per image size and batch), so it can be captured like the
prompt stage; until a GPU run proves its replay equal to eager (the command is in
docs/families.md), it runs eager whatever ``cuda_graph`` says (:data:`GRID_GRAPH_PROVEN`), while
the image stage keeps its graph.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...options import check_fraction, check_int
from .prompts import unpack
from .results import PromptMasks

__all__ = ["AMGOptions", "AutoMasks", "GRID", "generate", "grid_stage", "mask_boxes", "point_grid",
           "stability_score"]

#: ``prompts="grid"``: automatic mask generation (also what a call without any prompt does)
GRID = "grid"
#: whether the grid stage may be captured (``cuda_graph``): not until a GPU run proves it
GRID_GRAPH_PROVEN = False
#: SAM's offset of the stability score's two thresholds (logits)
STABILITY_OFFSET = 1.0


@dataclass(frozen=True)
class AMGOptions:
    """SAM's automatic-mask-generator settings (its defaults)."""

    points_per_side: int = 32
    points_per_batch: int = 64
    pred_iou_thresh: float = 0.88
    stability_score_thresh: float = 0.95
    box_nms_thresh: float = 0.7

    @classmethod
    def parse(cls, points_per_side: Any = 32, points_per_batch: Any = 64, pred_iou_thresh: Any = 0.88,
              stability_score_thresh: Any = 0.95, box_nms_thresh: Any = 0.7) -> AMGOptions:
        return cls(check_int("points_per_side", points_per_side, 1),
                   check_int("points_per_batch", points_per_batch, 1),
                   check_fraction("pred_iou_thresh", pred_iou_thresh),
                   check_fraction("stability_score_thresh", stability_score_thresh),
                   check_fraction("box_nms_thresh", box_nms_thresh))


def point_grid(n: int) -> np.ndarray:
    """(n * n, 2) x, y in [0, 1]: the centres of an n x n grid, rows of x for each y (SAM's
    ``build_point_grid``)."""
    side = np.linspace(1 / (2 * n), 1 - 1 / (2 * n), n)
    xs = np.tile(side[None, :], (n, 1))
    ys = np.tile(side[:, None], (1, n))
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def stability_score(logits: torch.Tensor, threshold: float, offset: float) -> torch.Tensor:
    """(..., H, W) logits -> (...,) the IoU of the masks thresholded at ``threshold + offset``
    and ``threshold - offset`` (SAM's ``calculate_stability_score``; counts in int32)."""
    inter = (logits > (threshold + offset)).sum(-1, dtype=torch.int32).sum(-1, dtype=torch.int32)
    union = (logits > (threshold - offset)).sum(-1, dtype=torch.int32).sum(-1, dtype=torch.int32)
    return inter / union


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """(..., H, W) bool masks -> (..., 4) float x1, y1, x2, y2 of each mask's first and last
    pixel column and row (SAM's ``batched_mask_to_box``: inclusive; an empty mask gives zeros).
    No host synchronisation: fixed shapes throughout."""
    h, w = masks.shape[-2:]
    rows, cols = masks.any(-1), masks.any(-2)
    ar_h = torch.arange(h, device=masks.device)
    ar_w = torch.arange(w, device=masks.device)
    bottom = (rows * ar_h).amax(-1)
    top = (rows * ar_h + h * ~rows).amin(-1)
    right = (cols * ar_w).amax(-1)
    left = (cols * ar_w + w * ~cols).amin(-1)
    boxes = torch.stack([left, top, right, bottom], -1)
    empty = (right < left) | (bottom < top)
    return (boxes * ~empty[..., None]).float()


def grid_stage(model, size: int, resized: tuple[int, int], hw: tuple[int, int], offset: float = STABILITY_OFFSET):
    """(embedding (1, 256, s, s), packed points (N, 3): x, y in the frame and label 1) ->
    (masks (N, 3, h, w) bool, predicted IoU (N, 3), stability (N, 3), boxes (N, 3, 4)): each
    point one prompt with SAM's three masks, post-processed as the prompt stage does."""
    from .predictor import MASK_THRESHOLD, embedding_whole, upscale_logits
    # a family whose image is stretched to the frame (SAM 3) brings its logits to the image its own way
    up = getattr(model, "upscale_logits", upscale_logits)

    def stage(*args):   # the embedding's maps (one, or SAM 3's three), then the packed points
        *embedding, packed = args
        n = packed.shape[0]
        pts, lab, _ = unpack(packed, 1, 0)
        low, iou = model.decode(embedding_whole(tuple(e.expand(n, -1, -1, -1) for e in embedding)), pts, lab, None, True, size)
        logits = up(low, size, resized, hw)
        masks = logits > MASK_THRESHOLD
        return masks, iou.float(), stability_score(logits, MASK_THRESHOLD, offset), mask_boxes(masks)
    return stage


def check_family(model) -> None:
    """A family prompted by boxes only (PicoSAM3) has no point grid: one error naming it."""
    if not getattr(model, "GRID_PROMPTS", True):
        raise ValueError(f"{model.FAMILY} takes box prompts only: automatic mask generation (prompts='grid', or "
                         "no prompt) needs a point-promptable family (sam, mobilesam)")
    if hasattr(model, "postprocess_masks") and not hasattr(model, "upscale_logits"):
        # its prompt stage brings masks to the image its own way: the grid's stability score needs those logits
        raise ValueError(f"{model.FAMILY} has no automatic mask generation yet (prompts='grid', or no prompt): its "
                         "masks are up-sampled its own way and the grid stage needs that as logits (upscale_logits); "
                         "give points or boxes, or use sam, sam3, mobilesam")


def generate(predictor, state, opts: AMGOptions, mode, speed: dict):
    """The automatic masks of ``state``'s image (an :class:`~.predictor.ImageState`) -> Results."""
    from torchvision.ops import batched_nms

    from ...results import Results
    from .predictor import embedding_parts
    model = predictor.model
    check_family(model)
    t0 = time.perf_counter()
    h, w = state.hw
    rh, rw = state.resized
    grid = point_grid(opts.points_per_side) * np.array([w, h])          # image pixels, as SAM scales them
    rows = np.concatenate([grid * np.array([rw / w, rh / h]), np.ones((len(grid), 1))], 1).astype(np.float32)
    n = min(opts.points_per_batch, len(rows))
    fn = grid_stage(model, state.size, state.resized, state.hw)
    key = ("sam-grid", state.size, *state.resized, *state.hw, n, STABILITY_OFFSET)
    run_mode = mode if GRID_GRAPH_PROVEN else False
    dev = model.device
    kept: list[tuple[torch.Tensor, ...]] = []
    parts = embedding_parts(state.embedding)
    with torch.no_grad(), predictor._autocast(state.amp_dtype):
        for start in range(0, len(rows), n):
            chunk = rows[start:start + n]
            real = len(chunk)
            if real < n:   # one shape for every batch: the last point repeated, its copies dropped
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], n - real, 0)])
            packed = torch.from_numpy(chunk).to(dev)
            masks, iou, stab, boxes = model.runner(key, fn, (*parts, packed), run_mode, constant=tuple(range(len(parts))))
            pts = torch.from_numpy(grid[start:start + real]).to(dev, torch.float32)
            masks, iou, stab, boxes = (t[:real].flatten(0, 1) for t in (masks, iou, stab, boxes))
            keep = (iou > opts.pred_iou_thresh) & (stab >= opts.stability_score_thresh)
            src = pts.repeat_interleave(3, 0)
            kept.append(tuple(t[keep] for t in (masks, iou, stab, boxes, src)))
        masks, iou, stab, boxes, src = (torch.cat(parts) for parts in zip(*kept))
        order = batched_nms(boxes, iou, torch.zeros_like(iou, dtype=torch.int64), opts.box_nms_thresh)
        masks, iou, stab, boxes, src = (t[order] for t in (masks, iou, stab, boxes, src))
    speed = {**speed, "prompt": (time.perf_counter() - t0) * 1e3}
    return Results(state.item.image, state.item.name, model.names, None, speed=speed,
                   masks=AutoMasks(masks, iou, stab, boxes, src))


#: overlay colours of the automatic masks (cycled, largest mask drawn first)
PALETTE = ((30, 144, 255), (255, 99, 71), (60, 179, 113), (238, 130, 238), (255, 215, 0), (0, 206, 209),
           (255, 140, 0), (154, 205, 50), (199, 21, 133), (100, 149, 237), (210, 105, 30), (127, 255, 212))


class AutoMasks(PromptMasks):
    """The automatic masks of one image: ``data`` (M, H, W) bool, best first (NMS order);
    ``scores`` (M,) predicted IoU; ``stability`` (M,) stability score; ``areas`` (M,) pixels;
    ``xyxy`` (M, 4) each mask's box in pixel edges (x2, y2 one past the last pixel); ``points``
    (M, 2) the grid point that gave the mask. Tensors on the model's device as predict returns them."""

    def __init__(self, data, scores, stability, boxes, points):
        pts = points.cpu().numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
        super().__init__(data, scores, pts, np.ones(len(pts), np.int64), None)
        self._stability = stability
        self._boxes = boxes           # inclusive last pixel, as NMS saw them

    def _with(self, data, scores, logits=None) -> AutoMasks:
        def like(t):   # the extra fields follow the masks: device tensors, or numpy
            if isinstance(data, torch.Tensor):
                return (torch.from_numpy(np.ascontiguousarray(t)) if isinstance(t, np.ndarray) else t).to(data.device)
            return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t
        return AutoMasks(data, scores, like(self._stability), like(self._boxes), self.points)

    @property
    def stability(self):
        """(M,) stability score of each mask."""
        return self._stability

    @property
    def areas(self):
        """(M,) pixels in each mask."""
        d = self._data
        return d.sum((1, 2)) if isinstance(d, torch.Tensor) else d.sum((1, 2))

    @property
    def xyxy(self):
        """(M, 4) x1, y1, x2, y2 of each mask's box, pixel edges (x2, y2 one past the last pixel)."""
        b = self._boxes
        return b + (torch.tensor([0, 0, 1, 1], dtype=b.dtype, device=b.device) if isinstance(b, torch.Tensor)
                    else np.array([0, 0, 1, 1], dtype=b.dtype))

    @property
    def best(self) -> int:
        return 0   # NMS order: the first mask has the highest predicted IoU

    def __repr__(self) -> str:
        return f"AutoMasks(masks={len(self)}, shape={self.orig_shape})"

    def summary(self, names: dict[int, str] | None = None, decimals: int = 5) -> list[dict[str, Any]]:
        """One dict per mask, best first: name, index, confidence (predicted IoU), stability,
        area (fraction of the image), pixels, box (pixel edges) and the grid point."""
        def host(t):
            return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        scores, stab = host(self._scores).astype(np.float64), host(self._stability).astype(np.float64)
        areas, boxes = host(self.areas).astype(np.int64), host(self.xyxy).astype(np.int64)
        total = max(1, self.orig_shape[0] * self.orig_shape[1])
        return [{"name": f"mask{i}", "index": i, "confidence": round(float(scores[i]), decimals),
                 "stability": round(float(stab[i]), decimals), "area": round(float(areas[i]) / total, decimals),
                 "pixels": int(areas[i]), "box": dict(zip(("x1", "y1", "x2", "y2"), (int(v) for v in boxes[i]))),
                 "point": [round(float(v), 2) for v in self.points[i]]} for i in range(len(self))]

    def plot_on(self, image: np.ndarray, names: dict[int, str] | None = None, alpha: float = 0.5,
                index: int | None = None) -> np.ndarray:
        """``image`` with every mask blended in (one colour each, largest first so small masks
        stay visible), or only mask ``index``."""
        if tuple(image.shape[:2]) != self.orig_shape:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the masks {self.orig_shape}")
        data = self._data.detach().cpu().numpy() if isinstance(self._data, torch.Tensor) else np.asarray(self._data)
        out = image.copy()
        order = [int(index)] if index is not None else list(np.argsort(-data.sum((1, 2))))
        for i in order:
            m = data[i].astype(bool)
            color = np.array(PALETTE[i % len(PALETTE)], dtype=np.float32)
            out[m] = np.clip(np.rint(out[m].astype(np.float32) * (1 - alpha) + color * alpha), 0, 255).astype(np.uint8)
        return out
