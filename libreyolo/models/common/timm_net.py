"""Image classifiers built by timm: the shared base of the classification families.

The networks are timm's own modules (``timm.create_model(name, pretrained=False,
num_classes=nc)``): their state-dict keys, order and shapes are timm's, which is the LibreYOLO
checkpoint layout of these families, so LibreYOLO and timm checkpoint files load unchanged.
Nothing is downloaded: ``pretrained=False`` builds from the configuration only.

A family subclasses :class:`TimmClassifier` and declares ``CONFIGS`` (size -> :class:`TimmSize`:
the timm model name and the evaluation preprocessing of that size's reference weights) plus its
sniffing keys; the rest - network, preprocessing, default input size, logits, training recipe -
is shared here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..base import Model

#: the normalization of TensorFlow-trained weights (timm's ``tf_efficientnetv2_s/m/l``): [-1, 1]
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class TimmSize:
    """One size of a family: the timm model it is and how its reference weights are evaluated
    (input size, centre-crop fraction, interpolation, normalization: timm's ``pretrained_cfg``
    of the ImageNet-1k weights, as the LibreYOLO checkpoints of these families use them)."""

    timm_name: str
    imgsz: int = 224
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD


def build_timm_network(name: str, nc: int) -> nn.Module:
    """timm's ``name`` with an ``nc``-way classifier, randomly initialised (nothing downloaded)."""
    import timm
    if int(nc) < 1:
        raise ValueError(f"a classifier needs nc >= 1, got {nc}")
    return timm.create_model(name, pretrained=False, num_classes=int(nc))


class TimmClassifier(Model):
    """Base of the timm-built classification families (ResNet, EfficientNetV2, MobileNetV4, ConvNeXt).

    ``infer`` is the network alone - logits (B, nc) in float32 -, a fixed-shape, sync-free forward;
    softmax and top-k are the classify task's, inside the same captured stage.
    """

    TASK = "classify"
    CHANNELS_LAST = True
    DEFAULT_NC = 1000   # ImageNet-1k, the label set of the published checkpoints

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        """ImageNet-1k's class names (timm ships them) for a 1000-class classifier."""
        if nc == 1000:
            from timm.data import ImageNetInfo
            info = ImageNetInfo()
            return {i: info.index_to_description(i).split(",")[0].strip() for i in range(1000)}
        return super().default_names(nc)
    # Declared after the GPU parity protocol passed (predict stages fp32 and AMP, batch 1 and 8) and the
    # training parity (step-0 loss and BatchNorm buffers bitwise, whole step with SGD and AdamW, 20-step
    # curve within eager noise): see docs/families.md.
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    WHOLE_STEP_OPTIMIZERS = ("sgd", "adamw")
    STRIDE = 32
    DEFAULT_IMGSZ = 224
    #: timm's evaluation transform as LibreYOLO runs it (torchvision on PIL images): shorter side to
    #: ``floor(imgsz / crop_pct)`` with PIL's bicubic (antialiased, whole levels), the longer side
    #: truncated, the centre crop, ImageNet mean/std
    PREPROCESS = Preprocess("crop", mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=0.875, interpolation="bicubic",
                            antialias=True, quantize=True)
    #: size -> timm model and evaluation preprocessing
    CONFIGS: ClassVar[dict[str, TimmSize]] = {}
    #: The classification recipe for modest batch sizes and short runs: AdamW (beta1 0.9), lr 1e-3
    #: with one warm-up epoch then cosine decay to 1 %, weight decay 0.05 on weights only (norms
    #: and biases undecayed). The warm-up starts every group at lr 0 - the detection recipes'
    #: bias warm-up from 0.1 would throw a fresh classifier head off. (Task options: label
    #: smoothing 0.1, crop + flip; TrivialAugment / RandAugment and MixUp / CutMix off.)
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "AdamW", "lr0": 1e-3, "lrf": 0.01, "momentum": 0.9, "weight_decay": 0.05,
        "warmup_epochs": 1.0, "warmup_bias_lr": 0.0, "warmup_momentum": 0.8, "cos_lr": True,
    }

    def __init__(self, net: nn.Module, *, size: str, imgsz: int | None = None, **kwargs: Any):
        cfg = self.CONFIGS.get(size)
        super().__init__(net, size=size, imgsz=imgsz or (cfg.imgsz if cfg else None), **kwargs)

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        if size not in cls.CONFIGS:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        return build_timm_network(cls.CONFIGS[size].timm_name, nc)

    @classmethod
    def preprocess_for(cls, size: str) -> Preprocess:
        c = cls.CONFIGS.get(size)
        if c is None:
            return cls.PREPROCESS
        return Preprocess("crop", mean=c.mean, std=c.std, crop_pct=c.crop_pct, interpolation=c.interpolation,
                          antialias=True, quantize=True)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalized batch -> class logits (B, nc), float32."""
        return self.model(x).float()

    def fuse_network(self, net: nn.Module) -> None:
        """:meth:`Model.fuse`'s fold: every BatchNorm whose input is exactly a convolution's output,
        found on the network's FX graph (:func:`~.timm_fuse.fold_batchnorms`); LayerNorm networks
        (ConvNeXt) have none and stay as they are."""
        from .timm_fuse import fold_batchnorms
        fold_batchnorms(net)

    def train_defaults(self) -> dict[str, Any]:
        """The family's recipe at this model's input size (not the detection default of 640)."""
        return {**self.TRAIN_DEFAULTS, "imgsz": self.imgsz}

    def train(self, **kwargs: Any) -> dict:
        """Train as :meth:`Model.train`; the nominal batch ``nbs`` defaults to ``batch`` here.

        The classification loss is the per-sample mean, so the batch is the optimizer's batch:
        no gradient accumulation and the weight decay as given. Passing ``nbs`` larger than
        ``batch`` accumulates ``nbs / batch`` micro-batches, whose mean gradients then add up
        (AdamW is insensitive to that scale; with SGD it multiplies the effective lr).
        """
        if kwargs.get("nbs") is None:
            from ...engine.config import RunConfig
            batch = kwargs.get("batch")
            kwargs["nbs"] = int(batch if batch is not None else self.train_defaults().get("batch", RunConfig.batch))
        return super().train(**kwargs)
