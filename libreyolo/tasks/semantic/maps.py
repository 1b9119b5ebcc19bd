"""Class-map geometry shared by predict and the datasets: nearest-neighbour resize, letterbox
placement, and the in-memory value of ignored pixels."""
from __future__ import annotations

import numpy as np
import torch

from ...ops.letterbox import MODES as LETTERBOX_MODES
from ...ops.letterbox import letterbox_params

__all__ = ["IGNORE", "check_resize", "letterbox_mask", "resize_nearest"]

#: the value of ignored pixels in the masks the datasets return (int64), whatever the files use
IGNORE = -1


def resize_nearest(labels: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(..., H, W) class map of any integer dtype -> (..., h, w), nearest neighbour with pixel
    centres aligned (the index rule of ``F.interpolate(mode="nearest-exact")``), on its device."""
    H, W = int(labels.shape[-2]), int(labels.shape[-1])
    if (H, W) == (h, w):
        return labels
    dev = labels.device

    def index(n_out: int, n_in: int) -> torch.Tensor:
        scale = float(np.float32(n_in) / np.float32(n_out))
        i = (torch.arange(n_out, device=dev, dtype=torch.float32) + 0.5).mul_(scale).floor_().to(torch.int64)
        return i.clamp_(max=n_in - 1)

    return labels.index_select(-2, index(h, H)).index_select(-1, index(w, W))


def letterbox_mask(mask: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """(H, W) class map -> (size, size) placed as :func:`~libreyolo.ops.letterbox.letterbox` places
    its image (stretched, or scaled to fit at the top-left / centre), padding :data:`IGNORE`."""
    p = letterbox_params(int(mask.shape[0]), int(mask.shape[1]), size, mode)
    m = resize_nearest(mask, p.new_h, p.new_w)
    if (p.new_h, p.new_w) == (size, size):
        return m
    out = torch.full((size, size), IGNORE, dtype=m.dtype, device=m.device)
    out[p.pad_y:p.pad_y + p.new_h, p.pad_x:p.pad_x + p.new_w] = m
    return out


def check_resize(mode: str) -> None:
    """Class maps can be mapped back to the image only for the letterbox / stretch resizes."""
    if mode not in LETTERBOX_MODES:
        raise ValueError(f"semantic segmentation needs a resize that keeps the whole image "
                         f"({', '.join(LETTERBOX_MODES)}); this model's preprocess resize is {mode!r}, which crops it")
