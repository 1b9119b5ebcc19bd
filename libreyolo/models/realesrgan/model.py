"""Real-ESRGAN declarations (restore task, super-resolution)."""
from __future__ import annotations

import torch
from torch import nn

from ...tasks.restore.family import RestoreFamily
from .nn import CONFIGS, build


def _is_srvgg(sd: dict) -> bool:
    """The compact generator's layout: a ``body`` list of convs and 1-D PReLU weights ending in a
    conv to 3 * 16 channels, and none of RRDBNet's keys."""
    if "conv_first.weight" in sd:
        return False
    first, prelu = sd.get("body.0.weight"), sd.get("body.1.weight")
    if getattr(first, "ndim", 0) != 4 or getattr(prelu, "ndim", 0) != 1 or tuple(first.shape[1:]) != (3, 3, 3):
        return False
    convs = [k for k, v in sd.items() if k.startswith("body.") and k.endswith(".weight") and getattr(v, "ndim", 0) == 4]
    last = max(convs, key=lambda k: int(k.split(".")[1]))
    return len(sd) == 3 * len(convs) - 1 and int(sd[last].shape[0]) == 48


class RealESRGAN(RestoreFamily):
    """Real-ESRGAN, sizes x4 (RRDBNet, RealESRGAN_x4plus), x2 (RRDBNet with its input
    pixel-unshuffled by 2, RealESRGAN_x2plus) and x4t (SRVGGNetCompact, realesr-general-x4v3),
    task ``restore``: the image super-resolved ``scale`` times (:mod:`.nn`). x2 takes even tile
    sides (``STRIDE`` 2)."""

    FAMILY = "realesrgan"
    SUPPORTS_CUDA_GRAPH = True   # proven on a GPU: docs/families.md (session 31's rows, benchmarks/results/session31/)
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreRealESRGAN"   # the LibreYOLO checkpoint names: LibreRealESRGANx4t-restore.pt, ...
    DEFAULT_IMGSZ = 64
    STRIDE = 2
    SCALE_BY_SIZE = {size: int(c["scale"]) for size, c in CONFIGS.items()}
    SIGNATURE_KEYS = ("conv_first.weight", "body.0.rdb1.conv1.weight", "conv_up1.weight", "conv_hr.weight")

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return build(size)

    @classmethod
    def _owns_own(cls, state_dict: dict[str, torch.Tensor]) -> bool:
        return super()._owns_own(state_dict) or _is_srvgg(state_dict)
