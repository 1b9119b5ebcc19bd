"""BiRefNet declarations (matting) and its inference stage, captured whole or split at a seam."""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..base import Model
from .nn import CONFIGS, BiRefNetNet, SwinConfig, swin_depths


class BiRefNet(Model):
    """BiRefNet (Swin v1 encoder at two scales + a decoder of deformable-convolution blocks),
    sizes t (Swin-T) and l (Swin-L); foreground matting (``task="matte"``).

    Preprocessing as BiRefNet's inference: the image stretched to the square (1024 by default),
    ImageNet mean / std. :meth:`infer` returns the matte logit at the network's input size; the
    matte task's stage applies the sigmoid and maps the alpha back to each image's size.

    The decoder's ``torchvision.ops.deform_conv2d`` is the one op whose capture in a CUDA graph
    is in question. ``PREDICT_SEAM`` is the one declaration that decides what predict captures:
    True - preprocessing + the encoder (:meth:`infer_front`: both Swin passes, the two-scale
    fusion and the context) replay as one graph and the squeeze module + decoder + sigmoid
    (:meth:`infer_back`, every deformable convolution) run eager after it; False - the whole
    stage is one graph. The seam stays until tests/gpu/test_birefnet_gpu.py shows a captured
    ``deform_conv2d`` replaying bitwise equal to eager on two different inputs (that test fails
    while the declaration disagrees with what it measures).
    """

    FAMILY = "birefnet"
    TASK = "matte"
    #: size -> the Swin backbone; a family on this network with other backbones (FeyNobg) declares its own
    CONFIGS: ClassVar[dict[str, SwinConfig]] = CONFIGS
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreBiRefNet"     # the LibreYOLO checkpoint names: LibreBiRefNett.pt, ...
    DEFAULT_IMGSZ = 1024
    DEFAULT_NC = 1                     # one output channel: the alpha
    STRIDE = 32                        # the input-patch tiles need sizes that divide by 32
    #: stretched with PIL's bilinear (antialiased, whole levels), ImageNet mean/std, as LibreYOLO does
    PREPROCESS = Preprocess("stretch", mean=IMAGENET_MEAN, std=IMAGENET_STD, antialias=True, quantize=True)
    PREDICT_SEAM = True
    # with the seam it vouches for the captured encoder stage (GPU: tests/gpu/test_birefnet_gpu.py,
    # MATTE_GRAPH_MODELS in test_tasks_gpu.py; docs/families.md)
    SUPPORTS_CUDA_GRAPH = True

    SIGNATURE_KEYS = ("bb.patch_embed.proj.weight", "squeeze_module.0.conv_in.weight",
                      "decoder.ipt_blk5.conv1.weight")
    NC_KEY = "decoder.conv_out1.0.weight"

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if int(nc) != 1:
            raise ValueError(f"{cls.__name__} predicts one alpha matte (nc=1), got nc={nc}")
        if size not in cls.CONFIGS:
            raise ValueError(f"unknown {cls.__name__} size {size!r}; sizes: {', '.join(cls.CONFIGS)}")
        return BiRefNetNet(cls.CONFIGS[size])

    @classmethod
    def _owns_own(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        """BiRefNet's keys with the stage depths of one of this class's sizes: families on this
        network share every key name and differ in depth (FeyNobg: a 24-block third stage)."""
        return super()._owns_own(state_dict) and \
            swin_depths(state_dict) in {c.depths for c in cls.CONFIGS.values()}

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalized RGB -> float32 matte logits (B, 1, S, S), the whole network."""
        return self.model(x).float()

    def infer_front(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The seam's captured side: the encoder's outputs (input, four two-scale maps)."""
        return self.model.forward_encoder(x)

    def infer_back(self, *front: torch.Tensor) -> torch.Tensor:
        """The seam's eager side: :meth:`infer_front`'s outputs -> float32 matte logits."""
        return self.model.forward_decoder(*front).float()
