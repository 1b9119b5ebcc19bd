"""PicoSAM3 declarations and its predictor: one network forward per box prompt.

PicoSAM3 is prompted by boxes only (its upstream contract): each box is grown by 10 % of its
width and height on every side, made square about its centre, clipped to the image (pixel
coordinates truncated to integers), and that region is cut out of the image, resized to 96 x 96
(PIL's bilinear, whole levels) and ImageNet-normalized; the network's 96 x 96 logits are resized
bilinearly back onto the region and thresholded at 0 there, and the mask's score is the mean
sigmoid over its pixels (0 for an empty mask). So there is no image embedding to reuse:
``set_image`` keeps the uploaded image on the device, and each prompt call cuts, runs and pastes.
Points, ``prompts="grid"`` (automatic masks) and a prompt without boxes are refused by name.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess, resize_to
from ...tasks.segment_prompt.predictor import MASK_THRESHOLD, ImageState, PromptPredictor
from ..sam.model import PromptModel

#: how far a box grows on each side before it is cut out (upstream's 10 %)
ROI_PADDING = 0.1


def roi_of_box(box, w: int, h: int, padding: float = ROI_PADDING) -> tuple[int, int, int, int]:
    """An x1, y1, x2, y2 box (image pixels) -> the integer crop x1, y1, x2, y2 the network sees:
    grown by ``padding`` of its size on each side, squared about its centre, clipped to the
    (w, h) image. A box of no width or height, or one that leaves nothing after clipping, is a
    ValueError naming it."""
    x1, y1, x2, y2 = (float(v) for v in box)
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"PicoSAM3 box ({x1:g}, {y1:g}, {x2:g}, {y2:g}) has no area: it needs x2 > x1 and y2 > y1")
    bw, bh = x2 - x1, y2 - y1
    x1, y1 = x1 - bw * padding, y1 - bh * padding
    bw, bh = bw * (1 + 2 * padding), bh * (1 + 2 * padding)
    side = max(bw, bh)
    cx, cy = x1 + bw / 2, y1 + bh / 2
    crop = (max(0, int(cx - side / 2)), max(0, int(cy - side / 2)), min(w, int(cx + side / 2)),
            min(h, int(cy + side / 2)))
    if crop[2] <= crop[0] or crop[3] <= crop[1]:
        raise ValueError(f"PicoSAM3 box {list(box)} leaves no region of the {w}x{h} image after clipping")
    return crop


class PicoPredictor(PromptPredictor):
    """The segment-prompt predictor with PicoSAM3's stages: the "image stage" uploads the image;
    a prompt runs the ROI stage (:meth:`roi_stage`: cut each box's region out of the uint8
    image, resize it to the crop size, normalize, the network on all crops as one batch; fixed
    shapes for fixed regions) through the model's graph runner, then pastes the logits back
    (:meth:`paste_stage`)."""

    def encode(self, items, size: int, mode, amp_dtype) -> list[ImageState]:
        return [ImageState(it, self._upload(it.image)[None], size, tuple(int(v) for v in it.image.shape[:2]),
                           (size, size), amp_dtype) for it in items]

    def encoder_stage(self, size: int):
        return lambda u8: u8

    def roi_stage(self, rois: list[tuple[int, int, int, int]], size: int):
        """uint8 (1, H, W, 3) image -> (K, 1, size, size) mask logits of the K regions."""
        net = self.model.model

        def stage(u8):
            crops = torch.cat([resize_to(u8[:, y1:y2, x1:x2], (size, size), "bilinear", antialias=True, quantize=True)
                               for x1, y1, x2, y2 in rois])
            x = torch.cat([(crops[:, i:i + 1] - m) / sd for i, (m, sd) in enumerate(zip(IMAGENET_MEAN, IMAGENET_STD))], 1)
            return net(x)
        return stage

    @staticmethod
    def paste_stage(rois: list[tuple[int, int, int, int]], hw: tuple[int, int]):
        """(K, 1, s, s) logits -> (masks (K, H, W) bool, scores (K,)): each region's logits resized
        bilinearly onto it and thresholded at 0; the score is the mean sigmoid over the mask."""
        def stage(logits):
            logits = logits.float()
            masks = torch.zeros((len(rois), *hw), dtype=torch.bool, device=logits.device)
            scores = []
            for i, (x1, y1, x2, y2) in enumerate(rois):
                roi = F.interpolate(logits[i:i + 1], (y2 - y1, x2 - x1), mode="bilinear", align_corners=False)[0, 0]
                inside = roi > MASK_THRESHOLD
                masks[i, y1:y2, x1:x2] = inside
                n = inside.sum()
                scores.append(torch.where(n > 0, (roi.sigmoid() * inside).sum() / n.clamp(min=1), 0.0))
            return masks, torch.stack(scores)
        return stage

    def prompt(self, state: ImageState, prompt, multimask: bool, mode, speed: dict, mask_input=None):
        from ...results import Results
        from ...tasks.segment_prompt.results import PromptMasks
        t0 = time.perf_counter()
        if prompt.center or len(prompt.points):
            raise ValueError("PicoSAM3 takes box prompts only (boxes=[[x1, y1, x2, y2], ...]), not points: "
                             "use sam or mobilesam for point prompts")
        h, w = state.hw
        p = prompt.for_image(h, w)
        rois = [roi_of_box(b, w, h) for b in p.boxes]
        key = ("picosam3-roi", state.size, *state.hw, *(v for r in rois for v in r))
        with torch.no_grad(), self._autocast(state.amp_dtype):
            logits = self.model.runner(key, self.roi_stage(rois, state.size), (state.embedding,), mode)
            masks, scores = self.paste_stage(rois, state.hw)(logits)
        speed = {**speed, "prompt": (time.perf_counter() - t0) * 1e3}
        return Results(state.item.image, state.item.name, self.model.names, None, speed=speed,
                       masks=PromptMasks(masks, scores, p.points, p.labels, p.boxes))

    def capture(self, *args: Any, **kwargs: Any) -> dict:
        raise NotImplementedError("PicoSAM3 has no image stage to capture: its ROI stage is captured per "
                                  "box set on use (cuda_graph=True), where graphs are declared")


class PicoSAM3(PromptModel):
    """PicoSAM3 (size pico): a box-prompted ROI segmenter, one forward per box (see the module)."""

    FAMILY = "picosam3"
    SUPPORTS_CUDA_GRAPH = True   # proven on a GPU: docs/families.md (session 31's rows, benchmarks/results/session31/)
    SIZES = ("pico",)
    FILE_PREFIX = "LibrePicoSAM3"
    DEFAULT_IMGSZ = 96               # the ROI crop's side
    STRIDE = 16
    #: the ROI crop's resize (PIL bilinear, whole levels) and normalization; predict cuts the
    #: crops itself (PicoPredictor), this records the convention in checkpoints
    PREPROCESS = Preprocess("stretch", mean=IMAGENET_MEAN, std=IMAGENET_STD, antialias=True, quantize=True)
    SIGNATURE_KEYS = ("encoder_stage1.0.weight", "bottleneck.0.0.weight", "skip_conn4.weight", "eca.conv1x1.weight")
    GRID_PROMPTS = False

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        from .nn import PicoSAM3Net
        if size not in cls.SIZES:
            raise ValueError(f"unknown PicoSAM3 size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return PicoSAM3Net()

    def prompt_predictor(self) -> PicoPredictor:
        return PicoPredictor(self)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, 96, 96) normalized crops -> (B, 1, 96, 96) mask logits."""
        return self.model(x)

    def verify_cases(self, size: int, batch: int, source_hw: tuple[int, int]) -> list[tuple]:
        """(name, fn, probe A, probe B) of the parity protocol: the network on ``batch`` crops of
        ``size``, the ROI stage (uint8 image -> logits of ``batch`` regions) and the paste stage."""
        g = torch.Generator().manual_seed(2024)
        dev = self.device
        h, w = source_hw
        a = torch.randn((batch, 3, size, size), generator=g).to(dev)
        b = (3 * torch.rand((batch, 3, size, size), generator=g) - 1.5).to(dev)
        ua = torch.randint(0, 256, (1, h, w, 3), generator=g, dtype=torch.uint8).to(dev)
        ub = torch.randint(90, 140, (1, h, w, 3), generator=g, dtype=torch.uint8).to(dev)
        boxes = [(w * (0.1 + 0.05 * i), h * 0.2, w * (0.5 + 0.05 * i), h * (0.6 + 0.03 * i)) for i in range(batch)]
        rois = [roi_of_box(bx, w, h) for bx in boxes]
        pred = PicoPredictor(self)
        la, lb = torch.randn((batch, 1, size, size), generator=g).to(dev), torch.randn((batch, 1, size, size), generator=g).to(dev) + 0.5
        return [("network", self.model, (a,), (b,)),
                (f"roi-stage {h}x{w}->{size}", pred.roi_stage(rois, size), (ua,), (ub,)),
                (f"paste-stage {h}x{w}", pred.paste_stage(rois, (h, w)), (la,), (lb,))]


__all__ = ["PicoSAM3", "PicoPredictor", "roi_of_box"]
