"""NAFNet declarations (restore task, same-size restoration)."""
from __future__ import annotations

from torch import nn

from ...tasks.restore.family import RestoreFamily
from .nn import CONFIGS, DEFAULT_TRAIN_SIZE, NAFNetNet


class NAFNet(RestoreFamily):
    """NAFNet, sizes s (width 32) and l (width 64), task ``restore``: the image restored at its own
    size (denoising, deblurring). The network pads its input to a multiple of 16 itself; predict's
    tiles are multiples of 16 (``STRIDE``), so it pads nothing there.

    The checkpoint's ``imgsz`` is the size the weights were trained at: it sets the test-time local
    pooling windows (TLC, :mod:`.nn`), which change the network's output only for inputs larger
    than 1.5 times it (never for predict's tiles at the default ``imgsz``).
    """

    FAMILY = "nafnet"
    SUPPORTS_CUDA_GRAPH = True   # proven on a GPU: docs/families.md (session 31's rows, benchmarks/results/session31/)
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreNAFNet"   # the LibreYOLO checkpoint names: LibreNAFNets-restore.pt, ...
    DEFAULT_IMGSZ = DEFAULT_TRAIN_SIZE
    STRIDE = 16
    SIGNATURE_KEYS = ("intro.weight", "ending.weight", "middle_blks.0.beta", "downs.0.weight")
    #: NAFNet's recipe: AdamW at lr 1e-3 without weight decay, cosine decay (upstream: to 1e-7, betas
    #: (0.9, 0.9); here the trainer's lrf and momentum-as-beta1 0.9), no warm-up
    TRAIN_DEFAULTS = {**RestoreFamily.TRAIN_DEFAULTS, "lr0": 1e-3}

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return NAFNetNet(size)

    def _attach(self, net: nn.Module) -> None:
        # the TLC windows follow this model's train size (the checkpoint's imgsz)
        if isinstance(net, NAFNetNet):
            net.set_train_size(self.imgsz)
        super()._attach(net)
