"""SAM 3 declarations (promptable segmentation of images and video with points, boxes and masks).

This module imports neither transformers nor the network: the registry lists the family and reads
its checkpoints' keys without the optional extra; ``build_network`` imports ``nn.py``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.preprocess import Preprocess
from ..sam2.model import Sam2Family

#: SAM 3's frame as released (72 x 72 patches of 14 pixels)
FRAME = 1008
#: transformers' Sam3ImageProcessor normalization (IMAGENET_STANDARD_MEAN / _STD)
MEAN = STD = (0.5, 0.5, 0.5)


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
    SUPPORTS_CUDA_GRAPH = True   # proven on a GPU: docs/families.md (session 31's rows, benchmarks/results/session31/)
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
    def checked_frame(cls, size: int) -> int:
        """``size`` if it is a frame the network builds at (a multiple of the 14-pixel patch), else
        a clear error (the rule lives with the network, whose module imports transformers)."""
        from .nn import check_frame
        return check_frame(size)

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        """As :meth:`Sam2Family.build_network`, an unknown size refused by name."""
        if size not in cls.SIZES:
            raise ValueError(f"unknown SAM 3 size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return super().build_network(size, nc)

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
