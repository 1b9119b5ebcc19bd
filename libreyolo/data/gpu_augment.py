"""The YOLO training recipe on the device: mosaic, random affine, HSV jitter and flip on a batch.

With ``gpu_augment=True`` the DataLoader workers only decode and letterbox each image (or read it
from ``cache=ram|disk``): :class:`~libreyolo.data.augment.DetectionDataset` then yields
``(image uint8 (3, S, S), targets (n, 5), geometry int32 (4,))`` and the collate stacks them. The
trainer moves the batch to the device and calls :class:`DeviceAugment` on it there, before (and
outside) the captured step; what comes out is what the CPU recipe's collate gives the loss:
``(images uint8 (B, 3, S, S), targets float32 (B, M, 5) [cls, x1, y1, x2, y2] pixels, mask bool
(B, M))`` with ``M`` the kept counts' bucketed maximum (:func:`~libreyolo.data.augment.
max_targets_bucket`), padded rows zero.

Per sample, as :meth:`DetectionDataset._augmented` does it on the CPU:

* with probability ``mosaic``, four images - this one and three others drawn from a **pool**: the
  batch and the batches before it in the epoch, at least ``pool`` images besides the batch
  (:data:`POOL_IMAGES`; the CPU recipe draws them from the whole dataset, and the workers never
  see the augmentation) - are tiled around a random centre of a 2S x 2S canvas (the canvas
  centre for ``dense_mosaic``); tile boxes are clipped to their tile. Partners from the batch
  alone (``pool=0``) would make a batch of B mosaics show only B distinct images - each about
  four times - where the CPU recipe's shows about 3.6 B at B=16 on a 320-image set: a quarter of
  the diversity per step (docs/benchmarks.md, "gpu_augment's quality");
* one random affine (rotation within ``degrees``, zoom in ``1 +- scale`` - halved for a dense
  mosaic -, translation up to ``translate * S``; the CPU recipe has no shear or perspective, so
  neither has this) maps the canvas to S x S in a single bilinear resampling, outside grey 114
  (the 2S canvas itself is never built: each tile is sampled from its source image, see
  :meth:`DeviceAugment._warp`);
  boxes: the four corners mapped, their bounding box clipped, dropped when narrower than
  ``MIN_BOX_SIDE`` or keeping less than ``MIN_AREA_KEPT`` of their area;
* HSV jitter as one 3x3 colour matrix, rounding to uint8, and a horizontal flip;
* with probability ``mixup``, a second augmented sample (of another image of the pool) blended in
  with a ratio in [0.45, 0.55], both label sets kept.

Every probability and range is the dataset's own (read from it, so ``close_mosaic`` - which sets
the dataset's shared mosaic and MixUp probabilities to 0 - applies here too).

Randomness: all random numbers of a batch (a few per sample) are drawn on the host from a CPU
``torch.Generator`` that the trainer seeds from (seed, epoch) at every epoch, so a run - resumed
or not - augments the same way, and the CPU and CUDA versions of the same batch use the same
numbers: only the pixel and box arithmetic runs on the device. The same code runs on CPU tensors.
The pool is emptied there too (it holds only the epoch's batches), so a resumed run's pool is an
uninterrupted one's.

Why not torchvision.transforms.v2 for the affine and the colour: its functional ops take one set
of parameters per call (one angle, scale, translation or colour factor for the whole batch), so
per-sample randomness would be a Python loop over the batch; ``ColorJitter`` also is not the
recipe's HSV jitter (it converts to HSV and applies brightness/contrast/saturation/hue in a
random order). Here ``grid_sample`` resamples the whole batch with per-sample matrices (one
call per mosaic tile), and the colour jitter is a per-sample 3x3 matrix. v2 does the flips (image
and ``tv_tensors.BoundingBoxes``), which have no parameter.

Cost: per batch one device copy of the pool (the batch and the earlier batches it keeps, about
B + ``pool`` images, concatenated); per pass (two with MixUp) one upload of the parameters, four
resamplings at the output size when a sample of the batch is a mosaic (one otherwise) and some
hundred small kernels; the host reads one number back (the largest kept box count, which sets
``M``, so the loss sees the shapes the CPU recipe gives it) before the step. The letterbox stays
in the workers (and in the cache): batches of one image size stack, pin and upload in one copy
each.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors

from ..ops.letterbox import PAD_VALUE
from .augment import MIN_AREA_KEPT, MIN_BOX_SIDE, DetectionDataset, max_targets_bucket

__all__ = ["DeviceAugment", "POOL_IMAGES", "hue_matrices", "saturation_matrices"]

#: Mosaic and MixUp partners are drawn from the batch and from as many of the epoch's previous
#: batches as hold at least this many images (kept on the device: 128 images are 157 MB at 640 px,
#: 39 MB at 320). At batch 16 that is the last 8 batches: a batch of 16 mosaics then shows about 52
#: distinct images (47 on average over a 20-batch epoch, whose first batches' pool is still
#: filling), where batch-local partners show 16 and the CPU recipe's dataset-wide draws about 58
#: on a 320-image set (tests/unit/test_gpu_augment.py checks it against the CPU recipe).
POOL_IMAGES = 128

_LUMA = (0.299, 0.587, 0.114)   # the CPU recipe's luma weights (augment._LUMA)


def hue_matrices(theta: torch.Tensor) -> torch.Tensor:
    """(B,) angles in radians -> (B, 3, 3) float64 rotations of RGB space about the grey axis
    (Rodrigues' formula; the batched form of the CPU recipe's ``_hue_matrix``)."""
    theta = theta.to(torch.float64)
    k = torch.full((3,), 1.0 / math.sqrt(3.0), dtype=torch.float64)
    kx = torch.tensor([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]], dtype=torch.float64)
    c, s = theta.cos()[:, None, None], theta.sin()[:, None, None]
    return c * torch.eye(3, dtype=torch.float64) + s * kx + (1.0 - c) * torch.outer(k, k)


def saturation_matrices(gain: torch.Tensor) -> torch.Tensor:
    """(B,) gains -> (B, 3, 3) float64 ``gain * rgb + (1 - gain) * luma`` (the CPU recipe's
    ``_saturation_matrix``, batched)."""
    g = gain.to(torch.float64)[:, None, None]
    luma = torch.tensor(_LUMA, dtype=torch.float64).expand(3, 3)
    return g * torch.eye(3, dtype=torch.float64) + (1.0 - g) * luma


class _Draw:
    """One pass's random parameters for B samples, derived on the host (CPU tensors) from
    uniforms ``u`` (B, 9) in [0, 1) - columns: mosaic, angle, zoom, tx, ty, hue, saturation,
    value, flip -, the mosaic centres ``centre`` (B, 2) (x, y) and the four tiles' indices
    ``src`` (B, 4) into the pool (the batch first, then earlier batches; the sample's own image
    first)."""

    @classmethod
    def sample(cls, aug: DeviceAugment, own: torch.Tensor, pool: int | None = None) -> _Draw:
        """Random parameters for the samples whose own images are ``own`` (pool indices), with
        mosaic partners drawn uniformly from the first ``pool`` images of the pool (default: as
        many as ``own``)."""
        g, s, n = aug.generator, aug.imgsz, len(own)
        u = torch.rand((n, 9), generator=g, dtype=torch.float64)
        centre = torch.randint(s // 2, s + s // 2 + 1, (n, 2), generator=g)
        others = torch.randint(n if pool is None else int(pool), (n, 3), generator=g)
        return cls(aug, u, centre, torch.cat([own[:, None], others], 1))

    def __init__(self, aug: DeviceAugment, u: torch.Tensor, centre: torch.Tensor, src: torch.Tensor):
        s, n = aug.imgsz, u.shape[0]
        u = u.to(torch.float64)

        def uniform(col: int, lo: float, hi: float) -> torch.Tensor:
            return lo + (hi - lo) * u[:, col]

        self.mosaic = u[:, 0] < aug.mosaic
        self.any_mosaic = bool(self.mosaic.any())
        zeros, ones = torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)   # a range of 0
        angle = torch.deg2rad(uniform(1, -aug.degrees, aug.degrees)) if aug.degrees else zeros
        zoom = uniform(2, 1.0 - aug.scale, 1.0 + aug.scale) if aug.scale else ones
        if aug.dense_mosaic:   # the whole 2S canvas into S
            zoom = torch.where(self.mosaic, zoom * 0.5, zoom)
            centre = torch.where(self.mosaic[:, None], torch.full_like(centre, s), centre)
        t = aug.translate
        tx = uniform(3, -t, t) * s if t else zeros
        ty = uniform(4, -t, t) * s if t else zeros
        hue = uniform(5, -aug.hsv_h, aug.hsv_h) * 2.0 * math.pi if aug.hsv_h else zeros
        sat = uniform(6, 1.0 - aug.hsv_s, 1.0 + aug.hsv_s) if aug.hsv_s else ones
        val = uniform(7, 1.0 - aug.hsv_v, 1.0 + aug.hsv_v) if aug.hsv_v else ones
        self.flip = (u[:, 8] < aug.fliplr) if aug.fliplr > 0 else torch.zeros(n, dtype=torch.bool)
        self.zoom = zoom
        self.centre = centre                                          # (xc, yc) of each mosaic
        self.src = src                                                # the 4 tiles' batch indices
        # out = A (p - c) + (S/2 + t) in continuous pixel coordinates of the canvas; c is the
        # mosaic canvas' centre (S, S), or the image's (S/2, S/2) - it sits at the canvas origin
        cos, sin = angle.cos() * zoom, angle.sin() * zoom
        self.a = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)   # (B, 2, 2)
        c = torch.where(self.mosaic[:, None], torch.tensor([float(s), float(s)], dtype=torch.float64),
                        torch.tensor([s / 2.0, s / 2.0], dtype=torch.float64))
        self.b = torch.stack([s / 2.0 + tx, s / 2.0 + ty], -1) - (self.a @ c[:, :, None])[..., 0]
        # grid_sample's matrix, as the CPU recipe's _warp builds it: output point q (normalized
        # o, q = (S/2)(o + 1)) shows canvas point A^-1 (q - b), normalized by D p - 1 - here with
        # D = 2/S, the size of the images the tiles are sampled from (see DeviceAugment._warp)
        inv = torch.linalg.inv(self.a)
        d = 2.0 / s
        half = s / 2.0
        lin = d * inv * half
        off = d * (inv @ (half - self.b)[:, :, None])[..., 0] - 1.0
        self.theta = torch.cat([lin, off[:, :, None]], 2).to(torch.float32)           # (B, 2, 3)
        colour = val[:, None, None] * (saturation_matrices(sat) @ hue_matrices(hue))
        self.colour = colour.to(torch.float32)                                         # (B, 3, 3)
        self.identity_colour = not (aug.hsv_h or aug.hsv_s or aug.hsv_v)

    def to(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The per-sample parameters on ``device`` through ONE host-to-device copy (pinned and
        asynchronous on CUDA: a plain ``.to()`` of a host tensor waits for the stream each time).
        Every value is exact in float64 (indices, float32 matrices, float64 affine), so the device
        gets the same numbers as the host."""
        n = self.src.shape[0]
        cols = {"src": self.src, "mosaic": self.mosaic[:, None], "centre": self.centre, "flip": self.flip[:, None],
                "a": self.a.reshape(n, 4), "b": self.b, "zoom": self.zoom[:, None],
                "theta": self.theta.reshape(n, 6), "colour": self.colour.reshape(n, 9)}
        pack = torch.cat([v.to(torch.float64) for v in cols.values()], 1)
        if device.type == "cuda":
            pack = pack.pin_memory().to(device, non_blocking=True)
        else:
            pack = pack.to(device)
        out, i = {}, 0
        for k, v in cols.items():
            out[k] = pack[:, i:i + v.shape[1]]
            i += v.shape[1]
        return {"src": out["src"].long(), "mosaic": out["mosaic"][:, 0].bool(), "centre": out["centre"].long(),
                "flip": out["flip"][:, 0].bool(), "a": out["a"].reshape(n, 2, 2), "b": out["b"],
                "zoom": out["zoom"][:, 0], "theta": out["theta"].reshape(n, 2, 3).to(torch.float32),
                "colour": out["colour"].reshape(n, 3, 3).to(torch.float32)}


class DeviceAugment:
    """The YOLO recipe on a batch of device tensors (see the module docstring).

    ``dataset`` is the training :class:`DetectionDataset` built with ``gpu_augment=True``: its
    options (probabilities, ranges, image size) are this recipe's. ``bucket`` rounds the output's
    target rows as the collate does. ``pool``: mosaic and MixUp partners come from the batch and
    the fewest most recent earlier batches of the epoch holding at least this many images
    (default: :data:`POOL_IMAGES`, read when the instance is made; 0: the batch alone); the pool
    keeps references to those batches' device tensors (the inputs are never written to).
    """

    def __init__(self, dataset: DetectionDataset, bucket: int = 16, pool: int | None = None):
        if dataset.policy != "yolo":
            raise ValueError(f"gpu_augment covers the YOLO recipe (augment_policy='yolo'), not {dataset.policy!r}")
        pool = POOL_IMAGES if pool is None else pool
        if pool < 0:
            raise ValueError(f"pool must be >= 0 images, got {pool}")
        self.dataset = dataset
        self.bucket = int(bucket)
        self.pool = int(pool)
        self._earlier: list[tuple[torch.Tensor, ...]] = []   # earlier batches of the epoch, oldest first
        self.imgsz = dataset.imgsz
        self.degrees, self.translate, self.scale = dataset.degrees, dataset.translate, dataset.scale
        self.fliplr = dataset.fliplr
        self.hsv_h, self.hsv_s, self.hsv_v = dataset.hsv_h, dataset.hsv_s, dataset.hsv_v
        self.dense_mosaic = dataset.dense_mosaic
        self.generator = torch.Generator()

    @property
    def mosaic(self) -> float:
        return self.dataset.mosaic   # live: close_mosaic() sets it to 0

    @property
    def mixup(self) -> float:
        return self.dataset.mixup

    def seed(self, seed: int, epoch: int, rank: int = 0) -> None:
        """Seed the generator for ``epoch`` (and process ``rank`` of a distributed run)."""
        state = np.random.SeedSequence([int(seed), int(epoch), int(rank), 0x6A]).generate_state(1)[0]
        self.generator.manual_seed(int(state))
        self._earlier = []   # the epoch's first batch draws its partners from itself

    def _pooled(self, images, targets, mask, geometry) -> tuple[torch.Tensor, ...]:
        """The pool: this batch's tensors followed by the earlier batches' (targets padded to one
        row count), then this batch remembered and the batches no longer needed forgotten."""
        batches = [(images, targets, mask, geometry), *reversed(self._earlier)]
        if len(batches) > 1:
            m = max(b[1].shape[1] for b in batches)
            pad = [(b[0], F.pad(b[1], (0, 0, 0, m - b[1].shape[1])), F.pad(b[2], (0, m - b[2].shape[1])), b[3])
                   for b in batches]
            pooled = tuple(torch.cat([b[k] for b in pad]) for k in range(4))
        else:
            pooled = (images, targets, mask, geometry)
        if self.pool > 0:
            self._earlier.append((images, targets, mask, geometry))
            while len(self._earlier) > 1 and sum(b[0].shape[0] for b in self._earlier[1:]) >= self.pool:
                self._earlier.pop(0)
        return pooled

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                 geometry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(images uint8 (B, 3, S, S) letterboxed, targets (B, M, 5), mask (B, M), geometry
        (B, 4) [new_h, new_w, pad_y, pad_x])``, all on one device -> ``(images uint8 (B, 3, S,
        S), targets float32 (B, M', 5), mask bool (B, M'))``, augmented, on that device."""
        n, s = images.shape[0], self.imgsz
        if images.dtype != torch.uint8 or images.shape[1:] != (3, s, s):
            raise ValueError(f"DeviceAugment expects uint8 (B, 3, {s}, {s}) images, got {images.dtype} "
                             f"{tuple(images.shape)}")
        own = torch.arange(n)
        images, targets, mask, geometry = self._pooled(images, targets, mask, geometry)
        pool = images.shape[0]
        image, boxes, keep = self._pass(images, targets, mask, geometry, _Draw.sample(self, own, pool))
        mixup = self.mixup
        if mixup > 0:
            u = torch.rand((n, 2), generator=self.generator, dtype=torch.float64)
            mix = u[:, 0] < mixup
            if bool(mix.any()):
                partner = torch.randint(pool, (n,), generator=self.generator)
                other, more, keep2 = self._pass(images, targets, mask, geometry, _Draw.sample(self, partner, pool))
                dev = images.device
                host = torch.stack([(0.45 + 0.1 * u[:, 1]).to(torch.float32), mix.to(torch.float32)], 1)
                host = host.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else host.to(dev)
                r, mixed = host[:, 0, None, None, None], host[:, 1].bool()
                blend = (image.float() * r + other.float() * (1.0 - r)).round_().clamp_(0, 255).to(torch.uint8)
                image = torch.where(mixed[:, None, None, None], blend, image)
                boxes = torch.cat([boxes, more], 1)
                keep = torch.cat([keep, keep2 & mixed[:, None]], 1)
        return (image, *self._compact(boxes, keep))

    # ---- one pass: mosaic (maybe), affine, colour, flip -----------------------------------------

    def _pass(self, images, targets, mask, geometry, d: _Draw):
        """One augmented sample per row of ``d`` (B of them) from the pool's ``images``,
        ``targets``, ``mask``, ``geometry`` (the batch its first B rows) with the parameters ``d``:
        (images uint8 (B, 3, S, S), rows float32 (B, 4 M, 5) - each tile's M input rows -, kept
        bool (B, 4 M))."""
        dev, s = images.device, self.imgsz
        n = d.src.shape[0]
        p = d.to(dev)
        src, mosaic = p["src"], p["mosaic"]
        geo = geometry.to(device=dev, dtype=torch.int64)[src]                 # (B, 4 tiles, 4)
        nh, nw, py, px = geo.unbind(-1)
        xc, yc = (v[:, None] for v in p["centre"].unbind(1))
        tile = torch.arange(4, device=dev)
        right, below = tile % 2 == 1, tile >= 2                                  # tiles 1, 3 right of xc; 2, 3 below yc
        x0 = torch.where(right, xc, xc - nw)    # top-left corner of each tile on the canvas
        y0 = torch.where(below, yc, yc - nh)
        # not a mosaic: the whole letterboxed image (its padding included) at the canvas origin,
        # tiles 1-3 empty; the boxes are not moved or clipped
        solo = ~mosaic[:, None]
        first = (tile == 0)[None]
        zero = torch.zeros_like(x0)
        x0, y0 = torch.where(solo, zero, x0), torch.where(solo, zero, y0)
        px, py = torch.where(solo, zero, px), torch.where(solo, zero, py)
        nh = torch.where(solo, torch.where(first, s, 0), nh)
        nw = torch.where(solo, torch.where(first, s, 0), nw)

        # ---- pixels: mosaic + affine in one resampling, colour, rounding, flip
        image = self._warp(images, src, x0, y0, nh, nw, px, py, p["theta"], d)
        if not d.identity_colour:
            # per-sample 3x3 colour matrix, as three multiply-adds (a batched matmul could run in
            # TF32 on CUDA where that is enabled, and would not match the CPU's float32)
            m = p["colour"]
            flat = image.reshape(n, 3, -1)
            mixed = m[:, :, 0:1] * flat[:, 0:1]
            mixed.addcmul_(m[:, :, 1:2], flat[:, 1:2]).addcmul_(m[:, :, 2:3], flat[:, 2:3])
            image = mixed.reshape(n, 3, s, s)
        image = image.round_().clamp_(0, 255).to(torch.uint8)
        flip = p["flip"]
        if bool(d.flip.any()):
            image = torch.where(flip[:, None, None, None], TF.horizontal_flip(image), image)

        # ---- boxes: tiles' targets shifted and clipped, the affine, the filter, the flip
        m_in = targets.shape[1]
        t = targets.to(torch.float32)[src]                                     # (B, 4, M, 5)
        k = mask[src] & torch.where(solo, first, torch.ones_like(first))[..., None]
        lo_x = torch.where(solo, -math.inf, x0.clamp(min=0).to(torch.float32))[..., None]
        hi_x = torch.where(solo, math.inf, (x0 + nw).clamp(max=2 * s).to(torch.float32))[..., None]
        lo_y = torch.where(solo, -math.inf, y0.clamp(min=0).to(torch.float32))[..., None]
        hi_y = torch.where(solo, math.inf, (y0 + nh).clamp(max=2 * s).to(torch.float32))[..., None]
        bx = t[..., 1::2] - px[..., None, None].to(torch.float32)   # tile-local (the padding off)
        by = t[..., 2::2] - py[..., None, None].to(torch.float32)
        ref = (bx[..., 1] - bx[..., 0]) * (by[..., 1] - by[..., 0])            # area before the cut
        bx = (bx + x0[..., None, None].to(torch.float32)).clamp(lo_x[..., None], hi_x[..., None])
        by = (by + y0[..., None, None].to(torch.float32)).clamp(lo_y[..., None], hi_y[..., None])
        n_rows = 4 * m_in
        bx, by = bx.reshape(n, n_rows, 2).to(torch.float64), by.reshape(n, n_rows, 2).to(torch.float64)
        ref, k = ref.reshape(n, n_rows), k.reshape(n, n_rows)
        cls = t[..., 0].reshape(n, n_rows)
        a, b = p["a"], p["b"]
        cx = torch.stack([bx[..., 0], bx[..., 1], bx[..., 1], bx[..., 0]], -1)    # the four corners
        cy = torch.stack([by[..., 0], by[..., 0], by[..., 1], by[..., 1]], -1)
        ox = a[:, 0, 0, None, None] * cx + a[:, 0, 1, None, None] * cy + b[:, 0, None, None]
        oy = a[:, 1, 0, None, None] * cx + a[:, 1, 1, None, None] * cy + b[:, 1, None, None]
        out = torch.stack([ox.amin(-1), oy.amin(-1), ox.amax(-1), oy.amax(-1)], -1).clamp_(0, s)
        w, h = out[..., 2] - out[..., 0], out[..., 3] - out[..., 1]
        zoom = p["zoom"][:, None]
        kept = (w * h) / (ref.to(torch.float64) * zoom * zoom).clamp_min(1e-9)
        keep = k & (w >= MIN_BOX_SIDE) & (h >= MIN_BOX_SIDE) & (kept >= MIN_AREA_KEPT)
        boxes = out.to(torch.float32)
        if bool(d.flip.any()):
            flipped = TF.horizontal_flip(tv_tensors.BoundingBoxes(boxes.reshape(-1, 4), format="XYXY",
                                                                  canvas_size=(s, s)))
            boxes = torch.where(flip[:, None, None], flipped.as_subclass(torch.Tensor).reshape(n, n_rows, 4), boxes)
        return image, torch.cat([cls[..., None], boxes], -1), keep

    def _warp(self, images, src, x0, y0, nh, nw, px, py, theta, d: _Draw) -> torch.Tensor:
        """Float (B, 3, S, S): the (mosaic) canvas resampled through each sample's affine, without
        building the 2S x 2S canvas.

        The CPU recipe pastes the tiles' contents on a grey canvas and samples it bilinearly
        (``grid_sample`` on canvas - 114, zero outside). Bilinear sampling is linear in the image,
        and canvas - 114 is the sum over the tiles of each tile's content - 114 placed at its
        position (zero elsewhere), so the same output is the sum of four ``grid_sample`` calls,
        one per tile, each on the (B, 3, S, S) source images shifted by the tile's offset, with
        the source pixels outside the tile's content or off the canvas zeroed. That is four
        resamplings at the output's size instead of a canvas four times the output's size (and
        its gather) - the same numbers up to float rounding. Not a mosaic: tile 0 is the whole
        letterboxed image at the canvas origin, tiles 1-3 are empty (nothing is sampled for them
        when no sample of the pass is a mosaic)."""
        n, s, dev = d.src.shape[0], self.imgsz, images.device
        # the sampling grid of the affine (canvas coordinates / (S/2) - 1) without its offset, by
        # hand rather than F.affine_grid: that is a batched matmul, which CUDA runs in TF32 when
        # torch.backends.cuda.matmul.allow_tf32 is on (10-bit mantissas: a third of a pixel at
        # 640) - elementwise float32 gives the same grid on every device
        pos = torch.arange(s, device=dev)
        base = (pos.to(torch.float32) * 2.0 + 1.0) / s - 1.0     # output pixel centres, normalized
        lin = theta[:, :, :2, None, None]
        grid = torch.stack([lin[:, 0, 0] * base[None, None, :] + lin[:, 0, 1] * base[None, :, None],
                            lin[:, 1, 0] * base[None, None, :] + lin[:, 1, 1] * base[None, :, None]], -1)
        image = None
        for k in range(4 if d.any_mosaic else 1):
            own = k == 0 and torch.equal(d.src[:, 0], torch.arange(n))   # decided on the host
            x = (images[:n] if own else images.index_select(0, src[:, k])).to(torch.float32).sub_(PAD_VALUE)
            if d.any_mosaic:
                # source row r is canvas row r - pad_y + y0: keep the tile's content rows on the canvas
                rows = pos - py[:, k, None] + y0[:, k, None]
                rows_in = (pos >= py[:, k, None]) & (pos < (py + nh)[:, k, None]) & (rows >= 0) & (rows < 2 * s)
                cols = pos - px[:, k, None] + x0[:, k, None]
                cols_in = (pos >= px[:, k, None]) & (pos < (px + nw)[:, k, None]) & (cols >= 0) & (cols < 2 * s)
                x = x.mul_((rows_in[:, None, :, None] & cols_in[:, None, None, :]).to(torch.float32))
            # the tile's source pixel of canvas point p is p - (x0 - pad_x, y0 - pad_y)
            shift = torch.stack([x0[:, k] - px[:, k], y0[:, k] - py[:, k]], 1).to(torch.float32) * (2.0 / s)
            offset = theta[:, :, 2] - shift
            part = F.grid_sample(x, grid + offset[:, None, None, :], mode="bilinear", padding_mode="zeros",
                                 align_corners=False)
            image = part if image is None else image.add_(part)
        return image.add_(PAD_VALUE)

    def _compact(self, boxes: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Kept rows first (in order), padded to the bucketed maximum count with zero rows."""
        n, rows = keep.shape
        counts = keep.sum(1)
        m = max_targets_bucket([int(counts.max()) if n else 0], self.bucket)   # the one host read
        order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
        if m > rows:
            boxes = torch.cat([boxes, boxes.new_zeros(n, m - rows, 5)], 1)
            order = torch.cat([order, torch.arange(rows, m, device=order.device).expand(n, -1)], 1)
        idx = order[:, :m]
        out = boxes.gather(1, idx[..., None].expand(-1, -1, 5))
        valid = torch.arange(m, device=keep.device)[None] < counts[:, None]
        return out.masked_fill_(~valid[..., None], 0.0), valid
