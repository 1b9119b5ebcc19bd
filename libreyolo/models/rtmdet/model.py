"""RTMDet declarations and its capturable inference stage."""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ...ops.boxes import clip_to_canvas, distance_to_xyxy
from ...ops.preprocess import Preprocess
from ..base import Model
from ..common.assign import join_levels, level_priors
from .nn import CONFIGS, STRIDES, RtmdetInsNet, RtmdetNet

#: decode's prior points per input size (all levels joined: a few kernels per call, not ~36)
_PRIORS: dict = {}

# The original checkpoints take BGR pixels on the 0-255 scale, normalized with these.
BGR_MEAN = (103.53, 116.28, 123.675)
BGR_STD = (57.375, 57.12, 58.395)


class Rtmdet(Model):
    """RTMDet detector (CSPNeXt + PAFPN + shared-conv SepBN head), sizes t, s, m, l.

    Letterbox: top-left placement, grey 114 padding (the shared default).
    """

    FAMILY = "rtmdet"
    TASK = "detect"
    CHANNELS_LAST = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreRTMDet"
    DEFAULT_IMGSZ = 640
    #: letterboxed at the top-left with PIL's bilinear (antialiased when shrinking), as LibreYOLO does
    PREPROCESS = Preprocess("topleft", antialias=True, quantize=True)
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    # Declared after the GPU training parity passed (step-0 loss and BatchNorm buffers bitwise, 20-step
    # curves within eager noise; forward+backward and whole step): see docs/families.md.
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    #: RTMDet-Ins serves instance segmentation (the checkpoint's ``task`` picks it)
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"segment": ".rtmdet.model:RtmdetSeg"}

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return RtmdetNet(size, nc)

    SIGNATURE_KEYS = ("head.rtm_cls.0.weight", "head.rtm_reg.0.weight", "backbone.stem.0.conv.weight")

    @classmethod
    def _owns_own(cls, state_dict: dict) -> bool:
        """The detector's keys without the Ins head's kernel branch (that layout is RtmdetSeg's)."""
        return super()._owns_own(state_dict) and "head.rtm_kernel.0.weight" not in state_dict
    NC_KEY = "head.rtm_cls.0.weight"
    PRIOR_BIAS = (("head.rtm_cls.", 0, None),)

    @staticmethod
    def normalize(x: torch.Tensor) -> torch.Tensor:
        """RGB in [0, 1] -> the network's input: BGR, 0-255 scale, mean/std normalized.

        Per-channel Python scalars (no constant tensors built per call), so nothing is
        copied from the host while a CUDA graph is being captured.
        """
        chans = [(x[:, 2 - i] * 255.0 - BGR_MEAN[i]) / BGR_STD[i] for i in range(3)]
        return torch.stack(chans, 1)

    def build_loss(self) -> nn.Module:
        """Dynamic soft-label assignment, QFL and GIoU (mmdetection's RTMDet recipe)."""
        from .loss import RtmdetLoss
        return RtmdetLoss(self.nc)

    def train_forward(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
        """The network sees the same BGR mean/std input in training as in ``infer``."""
        return net(self.normalize(x))

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, H, W) RGB in [0, 1] -> boxes (B, N, 4) xyxy canvas pixels, score (B, N), class (B, N)."""
        cls_maps, box_maps = self.model(self.normalize(x))
        d = join_levels(box_maps).float()                                  # (B, N, 4) l,t,r,b
        pts, _ = level_priors(_PRIORS, [m.shape[-2:] for m in box_maps], STRIDES, 0.0, True, d.dtype, d.device)
        box = clip_to_canvas(distance_to_xyxy(pts, d), x.shape[-2], x.shape[-1])
        scores, cls = join_levels(cls_maps).float().sigmoid().max(-1)
        return box, scores, cls


class RtmdetSeg(Rtmdet):
    """RTMDet-Ins: the detector with a dynamic-convolution mask head (task ``segment``).

    ``infer`` gives the detector's per-anchor boxes, scores and classes plus each anchor's mask
    coefficients (its 169 dynamic-conv parameters, then its prior point x, y and stride) and the
    stride-8 prototypes; :meth:`mask_logits` turns chosen anchors' coefficients into mask logits.
    """

    TASK = "segment"
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"detect": ".rtmdet.model:Rtmdet"}
    # The predict graph passed the GPU parity protocol, the training rows (step 0, whole step with
    # SGD and AdamW, 20-step curve, the trainer's replays) too: docs/families.md
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    SIGNATURE_KEYS = Rtmdet.SIGNATURE_KEYS + ("head.rtm_kernel.0.weight", "head.mask_head.projection.weight")
    #: RTMDet-Ins's own recipe (mmdetection's rtmdet-ins configs: AdamW, lr 0.004, weight decay 0.05),
    #: not the YOLO families' SGD: with SGD at 0.01 the mask branch barely moves in a short run
    #: (the dice loss stays near its start through 30 epochs of the built-in set; docs/families.md)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 0.004, "weight_decay": 0.05}

    @classmethod
    def _owns_own(cls, state_dict: dict) -> bool:
        return Model._owns_own.__func__(cls, state_dict)
    #: the prototypes' stride (mask logits are upsampled by it to the network input)
    MASK_STRIDE = STRIDES[0]

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return RtmdetInsNet(size, nc)

    def init_for_training(self, net: nn.Module, prior: float = 0.01) -> int:
        """Before training an untrained network: the class biases to the prior (as the detector's)
        and the box convs as the original head initialises them, weights N(0, 0.01) and bias 1.
        The Ins head's distances are ``relu(raw) * stride``: so every side starts alive at one
        stride; with PyTorch's default init about half of them start at 0, where the ReLU passes
        no gradient to the box loss."""
        touched = super().init_for_training(net, prior)
        with torch.no_grad():
            for conv in net.head.rtm_reg:
                nn.init.normal_(conv.weight, 0.0, 0.01)
                nn.init.constant_(conv.bias, 1.0)
        return touched + len(net.head.rtm_reg)

    def build_loss(self) -> nn.Module:
        """RTMDet's detection loss plus the Ins mask loss (dice on the positives' masks)."""
        from .loss import RtmdetInsLoss
        return RtmdetInsLoss(self.nc)

    def train_forward(self, net: nn.Module, x: torch.Tensor, *targets: torch.Tensor):
        """As the detector's: the training targets here are boxes, their mask and the bitmaps."""
        return net(self.normalize(x))

    def infer(self, x: torch.Tensor):
        """(B, 3, H, W) RGB in [0, 1] -> boxes (B, N, 4) xyxy canvas pixels, score (B, N), class
        (B, N), mask coefficients (B, N, 172) and prototypes (B, 8, H/8, W/8)."""
        cls_maps, box_maps, kernel_maps, protos = self.model(self.normalize(x))
        d = join_levels(box_maps).float()
        pts, strides = level_priors(_PRIORS, [m.shape[-2:] for m in box_maps], STRIDES, 0.0, True, d.dtype, d.device)
        box = clip_to_canvas(distance_to_xyxy(pts, d), x.shape[-2], x.shape[-1])
        scores, cls = join_levels(cls_maps).float().sigmoid().max(-1)
        prior = torch.cat((pts, strides.to(pts.dtype)), -1).expand(d.shape[0], -1, -1)
        coeffs = torch.cat((join_levels(kernel_maps).float(), prior), -1)
        return box, scores, cls, coeffs, protos.float()

    @staticmethod
    def mask_logits(protos: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
        """Prototypes (P, h, w) of one image and (n, 172) coefficients -> (n, h, w) mask logits
        at the prototypes' stride: :func:`~.nn.dynamic_masks` with each anchor's relative
        coordinates. Leading batch dimensions are allowed on both (the ONNX graph's batch)."""
        from .nn import dynamic_masks
        return dynamic_masks(protos, coeffs[..., :-3], coeffs[..., -3:-1], coeffs[..., -1], RtmdetSeg.MASK_STRIDE)

