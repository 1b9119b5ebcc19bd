"""EdgeTAM declarations (promptable segmentation of images and video, on-device SAM 2)."""
from __future__ import annotations

import torch
from torch import nn

from ..sam2.model import Sam2Family


class EdgeTAM(Sam2Family):
    """EdgeTAM (timm RepViT-M1 image encoder, SAM 2's prompt encoder and mask decoder; a 2-D
    spatial perceiver in its memory), one size, ``edge``, on transformers' ``EdgeTamModel`` /
    ``EdgeTamVideoModel``. Predict, prompts, video and checkpoints as :class:`~..sam2.model.Sam2`."""

    FAMILY = "edgetam"
    SIZES = ("edge",)
    FILE_PREFIX = "LibreEdgeTAM"
    # float16 autocast leaves the finite range on some inputs (NaN outputs, which no replay can
    # compare equal); bfloat16 keeps float32's range: its replays equal eager (docs/families.md)
    AMP_DTYPE = torch.bfloat16
    SUPPORTS_CUDA_GRAPH = True
    SIGNATURE_KEYS = ("no_memory_embedding", "vision_encoder.backbone.timm_model.stem.conv1.c.weight",
                      "mask_decoder.conv_s0.weight")

    @classmethod
    def image_network(cls, size: str, frame: int) -> nn.Module:
        from .nn import EdgeTamImageNet
        return EdgeTamImageNet(size, frame)

    @classmethod
    def video_network(cls, size: str, frame: int) -> nn.Module:
        from .nn import EdgeTamVideoNet
        return EdgeTamVideoNet(size, frame)
