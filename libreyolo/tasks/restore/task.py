"""Image restoration (``task="restore"``): denoising / deblurring at the image's size (NAFNet) and
super-resolution (Real-ESRGAN, SwinIR), the picture as the result.

Predict (:class:`RestorePlan`): the network runs at the image's own resolution, on tiles of
``imgsz`` x ``imgsz`` pixels. Each image is cut into tiles that overlap their neighbours by
``tile_overlap`` pixels (default 16, or a quarter of the tile when that is less) (the last tile of a row or column moved back to end at the image's edge;
an image smaller than a tile reflect-padded up to it), and the tiles go through the predict stage
``tile_batch`` at a time - a last, shorter batch filled up with copies of its last tile - so every
forward has one shape: with ``cuda_graph`` one captured graph serves every image of every size.
The tiles' outputs are blended into the picture at ``scale`` times the image's size, each weighted
by a window that ramps linearly across the overlap (the seams are cross-fades, not cuts), then
clamped to [0, 1] and rounded to uint8 on the device: ``Results.image``
(:class:`~.results.RestoredImage`).

Training: paired ``lq`` / ``gt`` images or the built-in ``shapes-restore`` set (:mod:`.data`,
:mod:`.synthetic`), patches of ``imgsz`` ``lq`` pixels, an L1 loss on the picture. Validation
reports PSNR and SSIM (torchmetrics') of the clamped output against the clean patch, and
``psnr_input``: the PSNR of the degraded patch itself (bicubic-upsampled for super-resolution),
the figure a useful model beats; fitness: PSNR.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...engine.sliced import SlicedPlan
from ...ops.tiles import cut_tiles, tile_origins
from ...options import Fraction, check_fields, option
from ..base import Evaluator, PredictPlan, Task, TaskOptions, host_views
from .results import RestoredImage

#: predict's defaults: the tiles' overlap (pixels of the image; at most a quarter of a tile) and how
#: many go through one forward
TILE_OVERLAP = 16
TILE_BATCH = 4


def reflect_index(n: int, length: int, device=None) -> torch.Tensor:
    """Indices 0..n-1 folded into 0..length-1 by reflection without repeating the edge (numpy's
    and torch's ``reflect``), for any ``n``: the rows or columns that pad an axis by reflection."""
    i = torch.arange(n, device=device)
    if length == 1:
        return torch.zeros_like(i)
    period = 2 * (length - 1)
    i = i % period
    return torch.where(i < length, i, period - i)


def pad_to(image: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """An (H, W, C) image (any dtype) reflect-padded at the bottom and right to (h, w) (h >= H, w >= W)."""
    ih, iw = int(image.shape[0]), int(image.shape[1])
    if (ih, iw) == (h, w):
        return image
    rows = reflect_index(h, ih, image.device)
    cols = reflect_index(w, iw, image.device)
    return image.index_select(0, rows).index_select(1, cols)


def blend_window(size: int, overlap: int, device=None) -> torch.Tensor:
    """(size, size) float32 weights of one output tile: 1 inside, falling linearly to ``0.5 /
    overlap`` over the ``overlap`` pixels along each edge (never 0, so a pixel that only one tile
    covers - at the image's border - keeps that tile's value exactly)."""
    i = torch.arange(size, dtype=torch.float32, device=device)
    ramp = torch.ones(size, dtype=torch.float32, device=device) if overlap <= 0 else \
        torch.minimum((i + 0.5) / overlap, (size - i - 0.5) / overlap).clamp(max=1.0)
    return ramp[:, None] * ramp[None, :]


class TilePlan(PredictPlan):
    """The predict stage of one batch of tiles: the network's output as it is (float32)."""

    tag = ("restore",)

    def __init__(self, model):
        self.model = model


class RestorePlan(SlicedPlan):
    """One restore predict call (see the module docstring). A :class:`SlicedPlan`: the predictor
    hands :meth:`run` each chunk of images, whose tiles go through the predictor's own stage
    (:class:`TilePlan`; the graph keys, capture and half path are predict's)."""

    tag = TilePlan.tag

    def __init__(self, model, tile: int, overlap: int, tile_batch: int):
        self.model, self.tile, self.overlap, self.tile_batch = model, int(tile), int(overlap), int(tile_batch)
        self.inner = TilePlan(model)
        self.mode, self.amp_dtype, self.half = False, None, None

    def finish(self, outputs: Any, *extra: torch.Tensor) -> Any:
        return outputs

    def run(self, predictor, images: list[torch.Tensor], size: int, mode: Any, amp_dtype: Any, repeating: bool,
            half: Any, stacked: torch.Tensor | None) -> list[torch.Tensor]:
        """A chunk's uint8 (H, W, 3) device images -> their restored pictures, uint8 (H*s, W*s, 3)."""
        return [self.restore(predictor, im, size, mode, amp_dtype, half) for im in images]

    def restore(self, predictor, image: torch.Tensor, size: int, mode: Any, amp_dtype: Any,
                half: Any) -> torch.Tensor:
        m, t, o, k = self.model, self.tile, self.overlap, self.tile_batch
        s = int(m.scale)
        h, w = int(image.shape[0]), int(image.shape[1])
        padded = pad_to(image, max(h, t), max(w, t))
        ph, pw = int(padded.shape[0]), int(padded.shape[1])
        origins = tile_origins(ph, pw, t, o / t)
        tiles = cut_tiles(padded, origins, (t, t))
        n = len(origins)
        outs = []
        for start in range(0, n, k):
            batch = tiles[start:start + k]
            if batch.shape[0] < k:   # one shape for every forward: the last batch filled up
                batch = torch.cat([batch, batch[-1:].expand(k - batch.shape[0], -1, -1, -1)])
            out = predictor.run_batch(list(batch), size, mode, amp_dtype, self.inner, repeating=True, half=half,
                                      stacked=batch.contiguous())
            outs.append(out[:min(k, n - start)].float())
        out = torch.cat(outs)
        with torch.no_grad():
            canvas = torch.zeros((3, ph * s, pw * s), dtype=torch.float32, device=out.device)
            weight = torch.zeros((1, ph * s, pw * s), dtype=torch.float32, device=out.device)
            win = blend_window(t * s, o * s, out.device)
            for (y, x), tile in zip(origins, out):
                canvas[:, y * s:(y + t) * s, x * s:(x + t) * s] += tile * win
                weight[:, y * s:(y + t) * s, x * s:(x + t) * s] += win
            pic = (canvas / weight)[:, :h * s, :w * s]
            return pic.clamp_(0.0, 1.0).mul_(255.0).round_().to(torch.uint8).permute(1, 2, 0).contiguous()

    def results(self, out, chunk, size, speed):
        from ...results import Results
        m = self.model
        return [Results(it.image, it.name, m.names, None, speed=dict(speed), image=RestoredImage(data, m.scale))
                for it, data in zip(chunk, host_views(out))]


# --------------------------------------------------------------------------------------------------
# Training: loss and metrics.

class RestoreLoss(nn.Module):
    """Mean absolute error of the network's picture (B, 3, S*s, S*s) against the clean uint8 patch."""

    item_names = ("l1",)

    def forward(self, pred: torch.Tensor, gt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        target = gt.to(device=pred.device, dtype=torch.float32) / 255.0
        loss = (pred.float() - target).abs().mean()
        return loss, loss.detach().reshape(1)


def restore_metrics(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image (PSNR in dB, SSIM) of (B, 3, H, W) pictures in [0, 1] against their targets:
    torchmetrics' functions (data range 1, SSIM's 11x11 Gaussian window, sigma 1.5)."""
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure
    psnr = peak_signal_noise_ratio(pred, target, data_range=1.0, reduction="none", dim=(1, 2, 3))
    ssim = structural_similarity_index_measure(pred, target, data_range=1.0, reduction="none")
    return psnr, ssim


def upsample_input(lq: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, 3, h, w) degraded patch in [0, 1] -> at the target's size (bicubic, clamped): the
    baseline a model is measured against (``psnr_input``)."""
    if scale == 1:
        return lq
    return F.interpolate(lq, scale_factor=float(scale), mode="bicubic", align_corners=False).clamp(0.0, 1.0)


class RestoreEvaluator(Evaluator):
    """Accumulates PSNR, SSIM and the input's PSNR over a validation split (per image, averaged)."""

    def __init__(self, scale: int = 1):
        self.scale = int(scale)

    def reset(self) -> None:
        self.sums: torch.Tensor | None = None

    def finish(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.float().clamp(0.0, 1.0)

    def process(self, outputs: torch.Tensor, batch: Sequence[torch.Tensor]) -> None:
        dev = outputs.device
        gt = batch[1].to(dev, non_blocking=True).float() / 255.0
        lq = batch[0].to(dev, non_blocking=True).float() / 255.0
        pred = outputs[:gt.shape[0]]
        psnr, ssim = restore_metrics(pred, gt)
        base, _ = restore_metrics(upsample_input(lq, self.scale), gt)
        sums = torch.stack([psnr.sum(), ssim.sum(), base.sum(), torch.tensor(float(gt.shape[0]), device=dev)])
        sums = sums.double()
        self.sums = sums if self.sums is None else self.sums + sums

    def evaluate(self) -> dict[str, Any]:
        if self.sums is None or float(self.sums[3]) == 0:
            return RestoreTask().empty_metrics()
        psnr, ssim, base, n = (float(v) for v in self.sums.cpu())
        return {"psnr": psnr / n, "ssim": ssim / n, "psnr_input": base / n}


@dataclass
class RestoreOptions(TaskOptions):
    """Restore training options: the augmentation of the training patch pairs (:class:`~.data.RestoreDataset`)."""

    fliplr: float = option(0.5, "probability of a left-right flip of a training patch pair", Fraction())
    flipud: float = option(0.5, "probability of an up-down flip of a training patch pair", Fraction())
    rot90: float = option(0.5, "probability of a 90-degree turn of a training patch pair", Fraction())

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_fields(self)


#: the smallest side of a validation target patch: SSIM's 11 x 11 window must fit
MIN_TARGET = 16


class RestoreTask(Task):
    name = "restore"
    primary_metric = "psnr"
    Options = RestoreOptions
    predict_defaults: dict = {"tile_overlap": None, "tile_batch": TILE_BATCH}

    def plan(self, model, size, constants, tile_overlap: int | None = None, tile_batch: int = TILE_BATCH,
             **opts) -> RestorePlan:
        if opts:
            raise TypeError(f"unknown restore predict option(s): {', '.join(sorted(opts))}")
        from ...options import check_int
        if tile_overlap is None:
            tile_overlap = min(TILE_OVERLAP, size // 4)
        overlap = check_int("tile_overlap", tile_overlap, 0)
        tile_batch = check_int("tile_batch", tile_batch, 1)
        if 2 * overlap >= size:
            raise ValueError(f"tile_overlap={overlap} leaves no inside to a {size}x{size} tile (imgsz): it must be "
                             f"less than half of imgsz; lower tile_overlap or raise imgsz")
        return RestorePlan(model, size, overlap, tile_batch)

    # ------------------------------------------------------------------- data
    def resolve_data(self, data):
        from .data import resolve_restore_data
        return resolve_restore_data(data)

    def _check_size(self, imgsz: int, model) -> None:
        if imgsz * model.scale < MIN_TARGET:
            raise ValueError(f"imgsz={imgsz} gives {imgsz * model.scale}x{imgsz * model.scale} target patches; "
                             f"validation's SSIM needs at least {MIN_TARGET} pixels a side: raise imgsz")

    def datasets(self, data, imgsz, model, options: RestoreOptions):
        from .data import RestoreDataset, check_pairs, collate_restore
        options.check()
        self._check_size(imgsz, model)
        pairs = check_pairs(data, model.scale, imgsz)   # every problem of both splits, before any epoch
        train = RestoreDataset(pairs["train"], imgsz, model.scale, augment=True, fliplr=options.fliplr,
                               flipud=options.flipud, rot90=options.rot90)
        val = RestoreDataset(pairs["val"], imgsz, model.scale)
        return train, val, collate_restore

    # ------------------------------------------------------------ evaluation
    def evaluator(self, model, options: RestoreOptions) -> RestoreEvaluator:
        return RestoreEvaluator(model.scale)

    def metric_columns(self, metrics) -> dict[str, float]:
        return {f"metrics/{k}": metrics[k] for k in ("psnr", "ssim", "psnr_input")}

    def summary(self, metrics) -> str:
        return f"psnr {metrics['psnr']:.2f}  ssim {metrics['ssim']:.4f}  (input psnr {metrics['psnr_input']:.2f})"

    def empty_metrics(self) -> dict[str, float]:
        return {"psnr": float("nan"), "ssim": float("nan"), "psnr_input": float("nan")}

    # ------------------------------------------------------------------ loss
    def build_loss(self, model) -> nn.Module:
        return RestoreLoss()
