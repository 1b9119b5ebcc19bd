"""Classification training and validation data: transforms (torchvision.transforms.v2) and the collate.

Training images: random resized crop to ``imgsz`` (area ``scale``..1, aspect 3/4..4/3, the
family's interpolation, antialiased), horizontal flip, then TrivialAugment or RandAugment
(option ``auto_augment``, off by default). Validation images: predict's own resize (``model.preprocess``: the
shorter side to ``imgsz / crop_pct``, the centre crop) run on the CPU, rounded back to uint8.
Both give uint8 (3, S, S); the trainer scales to [0, 1] and normalizes as predict does.

The collate stacks a batch into ``(images uint8 (B, 3, S, S), targets float (B, nc))``: the
targets are always class probabilities, so the loss has one fixed shape - one-hot, or mixed by
MixUp / CutMix (``v2.MixUp`` / ``v2.CutMix``; when both are on, each batch draws one of them),
then label-smoothed: ``(1 - eps) * t + eps / nc``, which makes the soft-target cross-entropy equal
to cross-entropy with ``label_smoothing=eps``. Validation batches are left one-hot: each item says
which split it comes from, because the trainer gives both loaders one collate.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset
from torchvision.transforms import InterpolationMode, v2

from ...data.sources import decode_image
from ...ops.preprocess import Preprocess

AUTO_AUGMENT = ("trivialaugment", "randaugment", "none")
_INTERP = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


class ClassifyDataset(Dataset):
    """(image, class) pairs -> ``(uint8 (3, S, S), class id, augmented)`` items."""

    def __init__(self, samples: Sequence[tuple[Path, int]], imgsz: int, preprocess: Preprocess, *,
                 augment: bool, scale: float = 0.35, fliplr: float = 0.5, auto_augment: str = "none"):
        if auto_augment not in AUTO_AUGMENT:
            raise ValueError(f"auto_augment must be one of {AUTO_AUGMENT}, got {auto_augment!r}")
        self.samples = list(samples)
        self.imgsz = int(imgsz)
        self.preprocess = preprocess
        self.augment = bool(augment)
        steps: list = [v2.RandomResizedCrop(self.imgsz, scale=(float(scale), 1.0),
                                            interpolation=_INTERP[preprocess.interpolation], antialias=True)]
        if fliplr > 0:
            steps.append(v2.RandomHorizontalFlip(float(fliplr)))
        if auto_augment == "trivialaugment":
            steps.append(v2.TrivialAugmentWide())
        elif auto_augment == "randaugment":
            steps.append(v2.RandAugment())
        self.train_transform = v2.Compose(steps)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, bool]:
        path, cls = self.samples[index]
        hwc = torch.from_numpy(decode_image(path))
        if self.augment:
            return self.train_transform(hwc.permute(2, 0, 1)).contiguous(), int(cls), True
        x = self.preprocess.resize_images(hwc.unsqueeze(0), self.imgsz)[0]   # float [0, 1], as predict
        return x.mul(255).round_().clamp_(0, 255).to(torch.uint8), int(cls), False


class ClassifyCollate:
    """Items of :class:`ClassifyDataset` -> ``(images uint8 (B, 3, S, S), targets (B, nc))``.

    ``mixup`` / ``cutmix``: the Beta(alpha, alpha) parameter of each (0: off); ``label_smoothing``:
    eps of the smoothed targets. Both apply to training batches only (see the module docstring).
    MixUp blends in float and rounds back to uint8 (a half-level of 255 at most).
    """

    def __init__(self, nc: int, *, mixup: float = 0.0, cutmix: float = 0.0, label_smoothing: float = 0.0):
        self.nc = int(nc)
        self.label_smoothing = float(label_smoothing)
        mixes = []
        if mixup > 0:
            mixes.append(v2.MixUp(alpha=float(mixup), num_classes=self.nc))
        if cutmix > 0:
            mixes.append(v2.CutMix(alpha=float(cutmix), num_classes=self.nc))
        self.mix = None if not mixes else mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)

    def __call__(self, items: Sequence[tuple[torch.Tensor, int, bool]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([it[0] for it in items])
        labels = torch.tensor([it[1] for it in items], dtype=torch.long)
        targets = torch.nn.functional.one_hot(labels, self.nc).float()
        if not all(it[2] for it in items):   # validation: one-hot targets, images as predict sees them
            return images, targets
        if self.mix is not None and len(items) > 1:
            mixed, targets = self.mix(images.float(), targets)
            images = mixed.round_().clamp_(0, 255).to(torch.uint8)
        if self.label_smoothing > 0:
            targets = targets * (1.0 - self.label_smoothing) + self.label_smoothing / self.nc
        return images, targets
