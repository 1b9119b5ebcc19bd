"""PIDNet declarations (semantic segmentation): preprocessing, the predict stage's upsampling,
the training heads and loss."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model, load_strict, train_format
from .loss import PIDNetLoss, upsample
from .nn import AUX_PREFIXES, CONFIGS, PIDNetNet

#: the label set of the published checkpoints (Cityscapes' 19 training classes)
CITYSCAPES_NAMES = ("road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
                    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle",
                    "bicycle")


def _main(sd: dict) -> dict:
    """A state dict without the training-only heads."""
    return {k: v for k, v in sd.items() if not k.startswith(AUX_PREFIXES)}


class Pidnet(Model):
    """PIDNet (three branches: integral / context, proportional / detail, derivative / boundary),
    sizes s / m / l, semantic segmentation.

    The network takes RGB in [0, 1] and normalizes it itself; the shared preprocessing letterboxes
    the image at the top-left (grey 114, OpenCV's INTER_LINEAR on uint8), as the reference does.
    :meth:`infer` upsamples the 1/8 logits to the network's input size (bilinear,
    ``align_corners=True``, PIDNet's evaluation); the semantic task's stage takes the argmax and
    maps it back to each image.

    Training adds PIDNet's two auxiliary heads to the network (:meth:`train`) and trains with
    its boundary-aware loss (:mod:`.loss`); checkpoints written while they exist hold them
    (``seghead_p.*``, ``seghead_d.*``) and load back with them. The LibreYOLO layout of an
    inference checkpoint (the fixture's) has none.
    """

    FAMILY = "pidnet"
    TASK = "semantic"
    DEFAULT_NC = 19   # Cityscapes, the label set of the published checkpoints
    # Not declared: no GPU has run the parity protocol on this family (docs/families.md, PIDNet
    # and LingBot-Vision, gives the commands). The predict stage is written graph-safe.
    SUPPORTS_CUDA_GRAPH = True   # the GPU parity protocol and graph predict == eager passed (docs/families.md)
    SUPPORTS_CUDA_GRAPH_TRAIN = False
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibrePIDNet"   # the LibreYOLO checkpoint names: LibrePIDNets.pt, ...
    DEFAULT_IMGSZ = 1024
    #: the logits are at 1/8 of the input: sides must be multiples of 8 (deeper levels are
    #: resized onto that grid, so no larger multiple is needed)
    STRIDE = 8
    #: letterboxed at the top-left (grey 114) with OpenCV's INTER_LINEAR on uint8, as the
    #: reference does; mean/std None: PIDNetNet normalizes internally
    PREPROCESS = Preprocess("topleft", quantize=True)

    SIGNATURE_KEYS = ("conv1.0.weight", "pag3.f_x.0.weight", "final_layer.conv2.weight")
    NC_KEY = "final_layer.conv2.weight"

    #: PIDNet's Cityscapes recipe: SGD lr 0.01, momentum 0.9, weight decay 5e-4, batch 12, poly
    #: decay (power 0.9) to 0 over the run (here linear to 0: the trainer's schedules are linear or
    #: cosine), no warm-up, no photometric augmentation. The trainer's SGD is Nesterov's (the
    #: original's is not).
    TRAIN_DEFAULTS: dict[str, Any] = {
        "optimizer": "SGD", "lr0": 0.01, "lrf": 0.0, "momentum": 0.9, "weight_decay": 5e-4, "nbs": 12,
        "warmup_epochs": 0.0, "cos_lr": False, "color_jitter": 0.0,
    }

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return PIDNetNet(size, nc)

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        if nc == len(CITYSCAPES_NAMES):
            return dict(enumerate(CITYSCAPES_NAMES))
        return super().default_names(nc)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [0, 1] -> float32 class logits (B, nc, S, S)."""
        return upsample(self.model(x), x.shape[-2:])

    # ------------------------------------------------------------------ training
    def build_loss(self) -> nn.Module:
        return PIDNetLoss()

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor):
        """The eval pass gives the main logits only: a second pass in training format (BatchNorm
        in eval) gives the three outputs the loss takes."""
        with train_format(net):
            return net(x)

    def train(self, **kwargs) -> dict:
        """:meth:`Model.train` with PIDNet's auxiliary heads on the network (added, seeded by the
        run's ``seed``, when it has none): they give the loss its P and D terms."""
        if not self.model.has_aux:
            from ...options import check_seed
            seed = kwargs.get("seed")
            with torch.random.fork_rng(devices=[]):   # the caller's random stream left as it was
                torch.manual_seed(check_seed(0 if seed is None else seed))
                self.model.add_aux_heads()
            self.runner.release()
            self._attach(self.model)   # new parameters: a fresh graph runner and predictor
        return super().train(**kwargs)

    # -------------------------------------------------------- checkpoints with aux heads
    @classmethod
    def from_checkpoint(cls, ckpt: dict, *, size: str | None = None, device: Any = "auto",
                        source: str | None = None) -> Model:
        """As :meth:`Model.from_checkpoint`; a checkpoint written during training also holds the
        auxiliary heads, which load with it."""
        sd = ckpt["model"]
        main = _main(sd)
        if len(main) == len(sd):
            return super().from_checkpoint(ckpt, size=size, device=device, source=source)
        model = super().from_checkpoint({**ckpt, "model": main}, size=size, device=device, source=source)
        model.model.add_aux_heads()
        load_strict(model.model, sd, f"{cls.FAMILY}-{model.size} (with its training heads)", source)
        return model

    @classmethod
    def sniff_size(cls, state_dict: dict[str, torch.Tensor], nc: int) -> str | None:
        return super().sniff_size(_main(state_dict), nc)

    def reset_classes(self, nc: int, names: Any = None) -> None:
        """Rebuild for ``nc`` classes; auxiliary heads, when present, come back with every weight
        whose shape still fits (the boundary head is class-free)."""
        old = {k: v for k, v in self.model.state_dict().items() if k.startswith(AUX_PREFIXES)}
        super().reset_classes(nc, names)
        if old:
            self.model.add_aux_heads()
            fresh = self.model.state_dict()
            self.model.load_state_dict({k: v for k, v in old.items() if fresh[k].shape == v.shape}, strict=False)
