"""YOLOX declarations and its capturable inference stage."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model, train_format
from .nn import CONFIGS, YoloxNet, decode


class Yolox(Model):
    """YOLOX detector, sizes n, t, s, m, l, x (n uses depthwise-separable convs).

    The network takes BGR on a 0-255 scale with no mean/std; :meth:`infer` converts the
    library's RGB [0, 1] letterboxed canvas to that convention itself.
    """

    FAMILY = "yolox"
    TASK = "detect"
    CHANNELS_LAST = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreYOLOX"
    # Declared after the GPU parity protocol passed (fp32 and AMP, batch 1 and 8): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    # Declared after the GPU training parity passed (step-0 loss and BatchNorm buffers bitwise, 20-step
    # curves within eager noise; forward+backward and whole step): see docs/families.md.
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    DEFAULT_IMGSZ = 640
    #: nano and tiny were trained (and are evaluated) at 416
    DEFAULT_IMGSZ_BY_SIZE = {"n": 416, "t": 416}
    #: letterboxed at the top-left with PIL's bilinear (antialiased when shrinking), as LibreYOLO does
    PREPROCESS = Preprocess("topleft", antialias=True, quantize=True)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return YoloxNet(size, nc)

    SIGNATURE_KEYS = ("backbone.backbone.stem.conv.conv.weight", "backbone.C3_n4.conv1.conv.weight",
                      "head.obj_preds.0.weight", "head.stems.0.conv.weight")
    NC_KEY = "head.cls_preds.0.weight"
    PRIOR_BIAS = (("head.cls_preds.", 0, None), ("head.obj_preds.", 0, None))
    #: YOLOX's last 15 epochs train without mosaic (and with the L1 term, switched by the loss's
    #: on_epoch at the same epoch, so the training graphs are released and recaptured once)
    TRAIN_DEFAULTS = {"close_mosaic": 15}

    def train_defaults(self) -> dict:
        """YOLOX-s and larger also train with MixUp (probability 1, off with mosaic at the end);
        nano and tiny do not, as in the original experiment files."""
        return {**self.TRAIN_DEFAULTS, "mixup": 0.0 if self.size in ("n", "t") else 1.0}

    def build_loss(self) -> nn.Module:
        """YOLOX's SimOTA loss; its L1 term comes on for the last 15 epochs (``on_epoch``)."""
        from .loss import YoloxLoss
        return YoloxLoss(self.nc)

    def train_forward(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Train-mode outputs for the library's RGB [0, 1] batch: the network is fed BGR [0, 255],
        the convention it was trained in and that :meth:`infer` uses."""
        return net(x.flip(1) * 255.0)

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor) -> list[torch.Tensor]:
        """The head gives logits only in training mode (its eval output is sigmoided, which does
        not invert exactly): a second pass with the head in training format, BatchNorm in eval."""
        with train_format(net.head):
            return self.train_forward(net, x)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) RGB in [0, 1] -> boxes (B, N, 4) xyxy canvas pixels, score (B, N), class (B, N)."""
        x = x.flip(1) * 255.0                      # RGB [0, 1] -> BGR [0, 255]
        maps = [m.float() for m in self.model(x)]
        return decode(maps)
