"""Sliced (tiled) inference and test-time augmentation: two predict options of detection models.

``tiling=True`` (SAHI's sliced prediction): each image is cut into overlapping tiles of ``tile``
pixels (default: ``imgsz``; :mod:`libreyolo.ops.tiles`), all of one shape, which go through the
predict stage ``batch`` at a time - the stage of any predict call, so with ``cuda_graph`` one
captured graph serves every full batch of tiles of that shape - each tile letterboxed to
``imgsz`` as an image would be. With ``tile_full`` the whole image is also predicted at
``imgsz`` (SAHI's "standard prediction", which keeps the objects larger than a tile). Each
tile's boxes are shifted to the image's pixels and the union merged (``tile_merge``: by IoS,
SAHI's match for tiles, or IoU, above the call's ``iou``), class-aware unless ``agnostic_nms``,
``max_det`` kept. An image no larger than one tile is predicted whole, exactly as without tiling.

``augment=True`` (Ultralytics' test-time augmentation, :mod:`libreyolo.ops.tta`): the images
at ``imgsz``, at 0.83 of it flipped left-right and at 0.67 of it, each view one pass of the stage
for the whole chunk; the boxes mapped back (the stage maps them to the image's pixels, the flip
is undone) and merged with class-aware NMS at the call's ``iou``.

Each pass's detections are predict's own (the stage's ``conf``, NMS, ``max_det``, ``classes``);
where the stage selects them on the device (CUDA with Triton) they stay there, and the merge runs
there too, with one copy to the host per chunk. The Results are those of a plain predict call.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from ..ops.letterbox import inverse_params, unletterbox_boxes
from ..ops.nms import nms_per_image
from ..ops.tiles import check_tiling, cut_tiles, merge_detections, shift_to_image, tile_origins, tile_shape
from ..ops.tta import TTA_VIEWS, tta_views, unflip_boxes
from ..tasks.base import PredictPlan

__all__ = ["SUPPORTED_TASKS", "SlicedPlan", "packed_rows", "sliced_plan"]

#: the tasks whose predict takes tiling and augment
SUPPORTED_TASKS = ("detect",)


def sliced_plan(predictor, plan: PredictPlan, options: Any, size: int) -> SlicedPlan:
    """The plan of a call with ``tiling`` or ``augment`` (``options``: its checked
    :class:`~libreyolo.engine.call_options.PredictOptions`), around the task's ``plan``; one
    clear error for a request these cannot serve."""
    from ..tasks.detect.task import DetectPlan
    o, model = options, predictor.model
    if o.tiling and o.augment:
        raise ValueError("tiling=True and augment=True exclude each other: pass one of them")
    what = "tiling=True" if o.tiling else "augment=True"
    if model.TASK not in SUPPORTED_TASKS or not isinstance(plan, DetectPlan):
        raise ValueError(f"{what} is offered for detection models; {model.FAMILY}-{model.size} is a {model.TASK} "
                         "model")
    tile = None
    if o.tiling:
        tile = size if o.tile is None else int(o.tile)
        check_tiling(tile, o.overlap_ratio)
    else:   # each view is predicted at its own size: one the model takes (YOLOv1 takes only 448)
        sizes = [s for s, _ in tta_views(size, model.STRIDE, TTA_VIEWS)]
        for s in sizes:
            try:
                predictor.plan(s)
            except ValueError as exc:
                raise ValueError(f"augment=True predicts at the sizes {sizes}, which {model.FAMILY}-{model.size} "
                                 f"cannot: {exc}") from None
    return SlicedPlan(plan, tile=tile, overlap=float(o.overlap_ratio), full=bool(o.tile_full),
                      metric=o.tile_merge, batch=int(o.batch), views=None if o.tiling else TTA_VIEWS)


def packed_rows(packed: torch.Tensor, max_det: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The in-stage selection's packed (B, max_det * 6 + 1) detections (each row: ``max_det``
    ``[x1, y1, x2, y2, conf, cls]`` in score order, the count last; see
    :func:`~libreyolo.ops.nms_graph.select_packed`) -> (the counted rows (K, 6), their image
    index (K,)), on its device."""
    rows = packed[:, :max_det * 6].view(packed.shape[0], max_det, 6)
    which = (torch.arange(max_det, device=packed.device)[None] < packed[:, -1:]).nonzero()
    return rows[which[:, 0], which[:, 1]], which[:, 0]


class SlicedPlan(PredictPlan):
    """A detection plan whose chunks run as tiles (``tile`` set) or augmented views (``views``):
    :meth:`run` (the predictor's ``run_batch`` hands it the chunk) puts them through the stage
    of the wrapped plan and merges them, :meth:`results` makes the Results."""

    def __init__(self, plan: PredictPlan, *, tile: int | None, overlap: float = 0.2, full: bool = True,
                 metric: str = "ios", batch: int = 1, views: Sequence[tuple[float, bool]] | None = None):
        # the wrapped plan's stage, its outputs kept on the device (no host copy) for the merge
        self.inner = copy.copy(plan)
        self.inner.host = False
        self.model = plan.model
        self.tile, self.overlap, self.full, self.metric, self.batch = tile, overlap, full, metric, batch
        self.views = views
        self.tag, self.mode, self.amp_dtype = plan.tag, plan.mode, plan.amp_dtype
        self.half = getattr(plan, "half", None)

    # ------------------------------------------------------------ passes
    def _pass(self, predictor, images: list[torch.Tensor], size: int, stacked: torch.Tensor | None,
              args: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the stage over ``images`` (one size or several) at ``size``: (detections
        (K, 6) ``[x1, y1, x2, y2, conf, cls]`` in their images' pixels, image index (K,))."""
        p = self.inner
        out = predictor.run_batch(images, size, plan=p, stacked=stacked, **args)
        if p.post is not None:
            return packed_rows(out, p.max_det)
        m = self.model
        dets = nms_per_image(*out, conf=p.conf, iou=p.iou, max_det=p.max_det, classes=p.classes,
                             agnostic=p.agnostic, nms_free=not m.NMS)   # (K, 7) on the host, letterboxed
        which = dets[:, 0].long()
        for i, im in enumerate(images):   # mapped back as predict's Results are
            h, w = int(im.shape[0]), int(im.shape[1])
            sx, sy, px, py = inverse_params(h, w, size, m.preprocess.resize)
            mine = which == i
            dets[mine, 1:5] = unletterbox_boxes(dets[mine, 1:5], sx, sy, h, w, px, py)
        return dets[:, 1:], which

    def run(self, predictor, images: list[torch.Tensor], size: int, mode: Any, amp_dtype: Any, repeating: bool,
            half: Any, stacked: torch.Tensor | None) -> list[torch.Tensor]:
        """A chunk's uint8 HWC device images -> their merged detections, (k, 6) each."""
        args = dict(mode=mode, amp_dtype=amp_dtype, half=half)
        if self.tile is None:
            return self._augmented(predictor, images, size, stacked, dict(args, repeating=repeating))
        return self._tiled(predictor, images, size, stacked, dict(args, repeating=repeating))

    def _merge(self, parts: list[torch.Tensor], hw: tuple[int, int], metric: str) -> torch.Tensor:
        """The union of several passes' detections of one image, merged; one pass's as they are
        (its boxes were selected before they were clipped to the image: NMS again after the clip
        could drop a pair the clip brought closer)."""
        if len(parts) == 1:
            return parts[0]
        p = self.inner
        return merge_detections(torch.cat(parts), image_size=hw, iou=p.iou, max_det=p.max_det,
                                agnostic=p.agnostic, metric=metric)

    def _tiled(self, predictor, images, size, stacked, args) -> list[torch.Tensor]:
        grids = []
        for im in images:
            h, w = int(im.shape[0]), int(im.shape[1])
            grids.append((tile_origins(h, w, self.tile, self.overlap), tile_shape(h, w, self.tile)))
        # the whole images: SAHI's full pass, and the images no larger than one tile
        whole = [i for i, (origins, _) in enumerate(grids) if self.full or len(origins) == 1]
        full: dict[int, torch.Tensor] = {}
        if whole:
            sel = [images[i] for i in whole]
            rows, which = self._pass(predictor, sel, size, stacked if len(sel) == len(images) else None, args)
            full = {i: rows[which == k] for k, i in enumerate(whole)}
        out = []
        tile_args = dict(args, repeating=True)   # every tile batch of an image has one shape
        for i, (im, (origins, shape)) in enumerate(zip(images, grids)):
            if len(origins) == 1:   # the image is its one tile: predict's own detections
                out.append(full[i])
                continue
            tiles = cut_tiles(im, origins, shape)
            parts = []
            for k in range(0, len(origins), self.batch):
                batch = tiles[k:k + self.batch]
                rows, which = self._pass(predictor, list(batch), size, batch, tile_args)
                parts.append(shift_to_image(rows, which + k, origins))
            if i in full:
                parts.append(full[i])
            out.append(self._merge(parts, (int(im.shape[0]), int(im.shape[1])), self.metric))
        return out

    def _augmented(self, predictor, images, size, stacked, args) -> list[torch.Tensor]:
        m = self.model
        parts: list[list[torch.Tensor]] = [[] for _ in images]
        widths = torch.tensor([float(im.shape[1]) for im in images])
        for view_size, flip in tta_views(size, m.STRIDE, self.views):
            imgs, st = images, stacked
            if flip:
                if stacked is not None:
                    st = stacked.flip(2)
                    imgs = list(st)
                else:
                    imgs = [im.flip(1) for im in images]
            rows, which = self._pass(predictor, imgs, view_size, st, args)
            if flip:
                rows = unflip_boxes(rows, widths.to(rows.device)[which])
            for i in range(len(images)):
                parts[i].append(rows[which == i])
        return [self._merge(p, (int(im.shape[0]), int(im.shape[1])), "iou") for p, im in zip(parts, images)]

    # ----------------------------------------------------------- results
    def results(self, out, chunk, size, speed):
        from ..results import Boxes, Results
        m = self.model
        host = torch.cat(out).cpu().float() if out else torch.zeros((0, 6))   # one copy for the chunk
        per_image = host.split([int(d.shape[0]) for d in out])
        results = []
        for d, it in zip(per_image, chunk):
            h, w = int(it.image.shape[0]), int(it.image.shape[1])
            results.append(Results(it.image, it.name, m.names, Boxes(d.contiguous(), (h, w)), speed=dict(speed)))
        return results
