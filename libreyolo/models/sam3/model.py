"""SAM 3 declarations (promptable segmentation of images and video with points, boxes and masks).

This module imports neither transformers nor the network: the registry lists the family and reads
its checkpoints' keys without the optional extra; ``build_network`` imports ``nn.py``.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from ..sam2.model import Sam2Family, needs_transformers

#: SAM 3's frame as released (72 x 72 patches of 14 pixels)
FRAME = 1008
#: transformers' Sam3ImageProcessor normalization (IMAGENET_STANDARD_MEAN / _STD)
MEAN = STD = (0.5, 0.5, 0.5)

#: how the network being built is shaped: (frame, with the video memory); set by :meth:`Sam3.new` /
#: :meth:`Sam3.from_checkpoint` around the base class's construction (SAM 2's has another default frame)
_BUILD: contextvars.ContextVar[tuple[int, bool]] = contextvars.ContextVar("sam3_build", default=(FRAME, False))


@contextlib.contextmanager
def building(frame: int, video: bool) -> Iterator[None]:
    token = _BUILD.set((int(frame), bool(video)))
    try:
        yield
    finally:
        _BUILD.reset(token)


def _check_frame(size: int) -> int:
    """The frame rule (it lives with the network, whose module imports transformers)."""
    from .nn import check_frame
    return check_frame(size)


class Sam3(Sam2Family):
    """SAM 3's tracker, size ``large`` (Perception-Encoder ViT-L/14 + FPN neck, SAM 2's prompt
    encoder and mask decoder; memory attention, memory encoder and object pointers for video), on
    transformers' ``Sam3TrackerModel`` / ``Sam3TrackerVideoModel``: the visual-prompt path
    (points, boxes, masks). Predict, ``set_image``, automatic masks, ``track`` and checkpoints as
    :class:`~..sam2.model.Sam2`; the frame is 1008 (multiples of 14 build), images stretched to
    it and normalized with mean / std 0.5 (transformers' ``Sam3ImageProcessor``)."""

    FAMILY = "sam3"
    SIZES = ("large",)
    FILE_PREFIX = "LibreSAM3"
    SUPPORTS_CUDA_GRAPH = False   # pending the GPU proof: tests/rows.py GRAPH_PENDING, docs/families.md
    DEFAULT_IMGSZ = FRAME
    STRIDE = 14
    PREPROCESS = Preprocess("stretch", mean=MEAN, std=STD, antialias=True, quantize=True)
    SIGNATURE_KEYS = ("no_memory_embedding", "vision_encoder.backbone.embeddings.position_embeddings",
                      "vision_encoder.neck.fpn_layers.0.proj1.weight", "mask_decoder.conv_s0.weight")

    # ---------------------------------------------------------------- networks
    @classmethod
    def image_network(cls, size: str, frame: int) -> nn.Module:
        from .nn import Sam3ImageNet
        return Sam3ImageNet(size, frame)

    @classmethod
    def video_network(cls, size: str, frame: int) -> nn.Module:
        from .nn import Sam3VideoNet
        return Sam3VideoNet(size, frame)

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        """The image network (the LibreYOLO 1.6.0 layout) or, inside ``new`` and for checkpoints
        with the memory modules, the video network; ``nc`` is ignored (class-agnostic masks)."""
        needs_transformers(cls.FAMILY)
        if size not in cls.SIZES:
            raise ValueError(f"unknown SAM 3 size {size!r}; sizes: {', '.join(cls.SIZES)}")
        frame, video = _BUILD.get()
        return (cls.video_network if video else cls.image_network)(size, frame)

    @classmethod
    def new(cls, size: str, nc: int = 1, names: Any = None, *, imgsz: int | None = None, video: bool = True,
            **kw: Any) -> Model:
        """An untrained model (random weights) at frame ``imgsz`` (default 1008, as released);
        ``video=False`` builds the image network alone."""
        frame = _check_frame(imgsz or cls.DEFAULT_IMGSZ)
        with building(frame, video):
            return Model.new.__func__(cls, size, 1, None, imgsz=frame, **kw)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, *, size: str | None = None, device: Any = "auto",
                        source: str | None = None) -> Model:
        """As :meth:`Model.from_checkpoint`, the network shaped by the file: its frame (``imgsz``)
        and, where its state dict has the memory modules, the video network."""
        video = any(k.startswith(cls.VIDEO_KEY) for k in ckpt["model"])
        with building(_check_frame(ckpt.get("imgsz") or cls.DEFAULT_IMGSZ), video):
            return Model.from_checkpoint.__func__(cls, ckpt, size=size, device=device, source=source)

    @classmethod
    def sniff_size(cls, state_dict: dict[str, torch.Tensor], nc: int) -> str | None:
        video = any(k.startswith(cls.VIDEO_KEY) for k in state_dict)
        frame, _ = _BUILD.get()
        with building(frame, video):
            return Model.sniff_size.__func__(cls, state_dict, nc)

    @property
    def imgsz(self) -> int:
        """The network's square frame (fixed by its config: 1008 as released)."""
        return self._imgsz

    @imgsz.setter
    def imgsz(self, value: int) -> None:
        value = _check_frame(int(value))
        net = getattr(self, "model", None)
        if net is not None and int(net.frame) != value:
            raise ValueError(f"{self.FAMILY}-{self.size}'s network is built for {net.frame}x{net.frame} frames; "
                             f"build one for imgsz={value} with LibreYOLO.new({self.FAMILY!r}, {self.size!r}, imgsz={value})")
        self._imgsz = value

    # ------------------------------------------------------------------ stages
    @staticmethod
    def upscale_logits(low: torch.Tensor, size: int, resized: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
        """(B, M, s, s) logits -> (B, M, h, w) logits of the image: bilinear straight to its size
        (the image was stretched to the frame; transformers' ``post_process_masks``)."""
        return F.interpolate(low, hw, mode="bilinear", align_corners=False)

    @classmethod
    def postprocess_masks(cls, low: torch.Tensor, size: int, resized: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
        """(B, M, s, s) logits -> (B, M, h, w) masks: :meth:`upscale_logits`, > 0."""
        return cls.upscale_logits(low, size, resized, hw) > 0.0
