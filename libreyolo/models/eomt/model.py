"""EoMT declarations: the family (semantic segmentation) and its segment and panoptic variants.

One network (:mod:`.nn`) serves three tasks; the checkpoint's ``task`` picks the class (and the
head's class count: ADE20K's 150 for semantic, COCO's 80 for instance segmentation, COCO
panoptic's 133). A checkpoint without a ``task`` (a bare state dict) is read by its class count:
80 -> segment, 133 -> panoptic, any other -> semantic (the label sets EoMT is published for).

The input size is fixed by the checkpoint: the position embeddings hold one row per patch of
the native grid and are not interpolated (as in HF's EoMT), so predict, val, train and export take
the model's ``imgsz`` only (``grid * 16``: 512 for the ADE20K semantic checkpoints, 640 for COCO)
and refuse another with one error. Images are resized so that their longer side fits the square,
antialiased, and padded with black at the bottom-right (the COCO processors' ``do_pad`` path; the
network normalizes with the ImageNet mean / std itself, so the pad lands on ``-mean / std`` as
there). The semantic checkpoints' sliding-window inference (shortest edge 512, windows averaged)
is not done: the semantic variant predicts the padded square like the others.
"""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model, load_strict, train_format
from .nn import CONFIGS, MASK_STRIDE, PATCH, EomtConfig, EomtNet, semantic_scores

#: the size name of a model built from its own configuration (:meth:`Eomt.custom`)
CUSTOM = "custom"

#: COCO panoptic's 53 stuff categories (after the 80 things), in the contiguous order of the
#: 133-class label set the COCO panoptic checkpoints use
COCO_PANOPTIC_STUFF = (
    "banner", "blanket", "bridge", "cardboard", "counter", "curtain", "door-stuff", "floor-wood", "flower",
    "fruit", "gravel", "house", "light", "mirror-stuff", "net", "pillow", "platform", "playingfield",
    "railroad", "river", "road", "roof", "sand", "sea", "shelf", "snow", "stairs", "tent", "towel",
    "wall-brick", "wall-stone", "wall-tile", "wall-wood", "water-other", "window-blind", "window-other",
    "tree-merged", "fence-merged", "ceiling-merged", "sky-other-merged", "cabinet-merged", "table-merged",
    "floor-other-merged", "pavement-merged", "mountain-merged", "grass-merged", "dirt-merged", "paper-merged",
    "food-other-merged", "building-other-merged", "rock-merged", "wall-other-merged", "rug-merged",
)


def fixed_size_error(native: int, got: Any) -> ValueError:
    return ValueError(f"this EoMT model takes a fixed {native}x{native} input (its position embeddings hold one "
                      f"row per patch of a {native // PATCH}x{native // PATCH} grid and are not interpolated), got "
                      f"{got}: leave imgsz out or pass imgsz={native}")


def checkpoint_imgsz(state_dict: dict) -> int | None:
    """The native input size of an EoMT state dict: sqrt(position rows) * 16."""
    w = state_dict.get("embeddings.position_embeddings.weight")
    if w is None or w.dim() != 2:
        return None
    side = math.isqrt(int(w.shape[0]))
    return side * PATCH if side * side == int(w.shape[0]) else None


def checkpoint_size(state_dict: dict) -> str | None:
    """The size whose width, depth and query blocks match ``state_dict``."""
    q = state_dict.get("query.weight")
    probs = state_dict.get("attn_mask_probs")
    if q is None:
        return None
    depth = len({k.split(".")[1] for k in state_dict if k.startswith("layers.")})
    for size, cfg in CONFIGS.items():
        if cfg.dim == q.shape[1] and cfg.depth == depth and (probs is None or probs.numel() == cfg.blocks):
            return size
    return None


class Eomt(Model):
    """EoMT (Encoder-only Mask Transformer: a DINOv2 ViT whose last blocks carry 100 learned
    queries), sizes s / b / l; this class serves semantic segmentation, :class:`EomtSeg` instance
    segmentation and :class:`EomtPanoptic` panoptic segmentation (see the module docstring).

    Semantic: :meth:`infer` gives the per-class score map ``sum_q softmax(class) * sigmoid(mask)``
    at the input size (the fixture's ``semantic_logits``); the semantic task's stage takes its
    argmax. Training: Mask2Former's set criterion on every query block, with the masked-attention
    annealing (:mod:`.loss`).
    """

    FAMILY = "eomt"
    TASK = "semantic"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreEoMT"
    DEFAULT_NC = 150          # ADE20K, the semantic checkpoints' label set
    DEFAULT_IMGSZ = 512
    STRIDE = PATCH
    # predict proven on a GPU for the semantic, segment and panoptic heads: docs/families.md
    # (session 31's rows); the masked-attention decision reads a host copy of the schedule.
    # Training capture: no GPU rows yet.
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = False
    #: a set-prediction head: no NMS
    NMS = False
    #: longer side to the square (antialiased), black pad at the bottom-right, [0, 1] RGB (the
    #: network applies the ImageNet mean / std)
    PREPROCESS = Preprocess("topleft", antialias=True, pad=0)
    SIGNATURE_KEYS = ("query.weight", "mask_head.fc1.weight", "upscale_block.block.0.conv1.weight",
                      "embeddings.register_tokens")
    NC_KEY = "class_predictor.weight"
    NC_EXTRA_CHANNELS = 1     # the no-object logit
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"segment": ".eomt.model:EomtSeg",
                                               "panoptic": ".eomt.model:EomtPanoptic"}
    #: EoMT's recipe: AdamW, lr 1e-4, weight decay 0.05, gradient clipping 0.01 (not the YOLO
    #: warm-up's bias boost); the layer-wise lr decay and the poly schedule are not reproduced
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 0.05,
                                                "clip_grad": 0.01, "warmup_bias_lr": 0.0}

    # ------------------------------------------------------------------ building
    @classmethod
    def build_network(cls, size: str, nc: int, imgsz: int | None = None) -> nn.Module:
        if size not in CONFIGS:
            raise ValueError(f"unknown EoMT size {size!r}; sizes: {', '.join(CONFIGS)}")
        return EomtNet(CONFIGS[size], nc, int(imgsz or cls.DEFAULT_IMGSZ))

    @classmethod
    def new(cls, size: str, nc: int | None = None, names: Any = None, *, imgsz: int | None = None,
            device: Any = "auto", seed: int | None = None, task: str | None = None) -> Model:
        """An untrained EoMT; ``imgsz`` (a multiple of 16) fixes its position-embedding grid."""
        if task is not None and task != cls.TASK:
            return cls.for_task(task).new(size, nc=nc, names=names, imgsz=imgsz, device=device, seed=seed)
        if size not in cls.SIZES:
            raise ValueError(f"unknown size {size!r} for {cls.FAMILY}; sizes: {', '.join(cls.SIZES)}")
        from ...options import check_imgsz, check_int, check_seed
        nc = check_int("nc", cls.DEFAULT_NC if nc is None else nc, 1)
        imgsz = cls.DEFAULT_IMGSZ if imgsz is None else check_imgsz(imgsz)
        if imgsz % PATCH:
            raise ValueError(f"EoMT's imgsz must be a multiple of {PATCH} (its patch size), got {imgsz}")
        if seed is not None:
            torch.manual_seed(check_seed(seed))
        return cls(cls.build_network(size, nc, imgsz), size=size, nc=nc, names=names, imgsz=imgsz,
                   device=device, trained=False, source=f"untrained {cls.FAMILY}-{size}")

    @classmethod
    def custom(cls, config: EomtConfig, nc: int | None = None, names: Any = None, *, imgsz: int | None = None,
               device: Any = "auto", seed: int | None = None, task: str | None = None) -> Model:
        """An untrained EoMT of another width / depth (:class:`~.nn.EomtConfig`), size ``"custom"``:
        a small one trains in seconds on a CPU. Its checkpoints carry the configuration
        (``eomt_config``) and load back through ``LibreYOLO(path)``."""
        if task is not None and task != cls.TASK:
            return cls.for_task(task).custom(config, nc, names, imgsz=imgsz, device=device, seed=seed)
        from ...options import check_imgsz, check_int, check_seed
        nc = check_int("nc", cls.DEFAULT_NC if nc is None else nc, 1)
        imgsz = cls.DEFAULT_IMGSZ if imgsz is None else check_imgsz(imgsz)
        if seed is not None:
            torch.manual_seed(check_seed(seed))
        net = EomtNet(config, nc, imgsz)
        return cls(net, size=CUSTOM, nc=nc, names=names, imgsz=imgsz, device=device, trained=False,
                   source=f"untrained {cls.FAMILY}-{CUSTOM}", meta={"eomt_config": asdict(config)})

    @classmethod
    def sniff_size(cls, state_dict: dict[str, torch.Tensor], nc: int) -> str | None:
        return checkpoint_size(state_dict)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, *, size: str | None = None, device: Any = "auto",
                        source: str | None = None) -> Model:
        """The checkpoint's ``task`` picks the class (without one: the class count, see the module
        docstring); the network is built at the checkpoint's own grid."""
        sd = ckpt["model"]
        task = ckpt.get("task")
        nc = int(ckpt.get("nc") or cls.nc_from_state_dict(sd) or cls.DEFAULT_NC)
        if task is None and cls is Eomt:
            task = {80: "segment", 133: "panoptic"}.get(nc, "semantic")
        if task is not None and task != cls.TASK:
            served = [cls.TASK] + [v.TASK for v in cls.task_variants()]
            if task not in served:
                raise ValueError(f"{source or 'checkpoint'}: its task is {task!r}, but the {cls.FAMILY} family "
                                 f"here serves {', '.join(served)}")
            return cls.for_task(task).from_checkpoint(ckpt, size=size, device=device, source=source)
        size = ckpt.get("size") or size or checkpoint_size(sd)
        imgsz = checkpoint_imgsz(sd) or int(ckpt.get("imgsz") or cls.DEFAULT_IMGSZ)
        meta = {k: v for k, v in ckpt.items() if k not in ("model", "train_state")}
        if size == CUSTOM and isinstance(ckpt.get("eomt_config"), dict):
            net = EomtNet(EomtConfig(**ckpt["eomt_config"]), nc, imgsz)
            load_strict(net, sd, f"{cls.FAMILY}-{CUSTOM}", source)
            return cls(net, size=size, nc=nc, names=ckpt.get("names"), imgsz=imgsz, device=device, trained=True,
                       source=source, meta=meta)
        if size not in CONFIGS:
            raise ValueError(f"{source or 'checkpoint'}: its tensors match no EoMT size ({', '.join(CONFIGS)})"
                             if size is None else f"{source or 'checkpoint'}: unknown EoMT size {size!r}")
        net = cls.build_network(size, nc, imgsz)
        load_strict(net, sd, f"{cls.FAMILY}-{size}", source)
        return cls(net, size=size, nc=nc, names=ckpt.get("names"), imgsz=imgsz, device=device, trained=True,
                   source=source, meta=meta)

    def reset_classes(self, nc: int, names: Any = None) -> None:
        """Rebuild for ``nc`` classes at the same grid, keeping every weight whose shape fits."""
        new = EomtNet(self.model.cfg, nc, self.model.imgsz)
        old, fresh = self.model.state_dict(), new.state_dict()
        new.load_state_dict({k: v for k, v in old.items() if k in fresh and fresh[k].shape == v.shape}, strict=False)
        new.train(self.model.training)   # a fresh module is in training mode; keep the old one's
        self._attach(new.to(self.device))
        self.nc = int(nc)
        from ..common.names import normalize_names
        self.names = self.default_names(self.nc) if names is None else normalize_names(names, self.nc)

    # ------------------------------------------------------------------ the fixed input size
    def check_imgsz(self, value: Any) -> None:
        """Refuse an ``imgsz`` other than the network's (one error for every entry point)."""
        if value is not None and int(value) != self.model.imgsz:
            raise fixed_size_error(self.model.imgsz, f"imgsz={value!r}")

    def get_predictor(self):
        if self._predictor is None:
            from .predict import FixedSizePredictor
            self._predictor = FixedSizePredictor(self)
        return self._predictor

    def train(self, **kwargs) -> dict:
        self.check_imgsz(kwargs.get("imgsz"))
        kwargs.setdefault("imgsz", self.model.imgsz)
        return super().train(**kwargs)

    def val(self, data: str | None = None, **kwargs) -> dict:
        self.check_imgsz(kwargs.get("imgsz"))
        return super().val(data, **kwargs)

    def export(self, format: str = "onnx", **kwargs):
        self.check_imgsz(kwargs.get("imgsz"))
        if kwargs.get("dynamic"):
            raise ValueError(f"EoMT cannot be exported with dynamic=True: its position embeddings fix the input at "
                             f"{self.model.imgsz}x{self.model.imgsz}; export with dynamic=False (the default)")
        return super().export(format, **kwargs)

    # ------------------------------------------------------------------ inference
    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [0, 1] -> (B, nc, S, S) float32 per-class scores."""
        p = self.model(x, raw=True)
        masks = F.interpolate(p.mask_logits, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return semantic_scores(p.class_logits.float(), masks.float())

    # ------------------------------------------------------------------ training
    def build_loss(self) -> nn.Module:
        from .loss import EomtLoss
        net = self.model
        return EomtLoss(self.TASK, self.nc, net.criterion.empty_weight, net.cfg.blocks, net.set_mask_probs)

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor):
        """The eval pass gives the task's outputs: a second pass in training format gives the
        loss's (every query block's prediction)."""
        with train_format(net):
            return net(x)


class EomtSeg(Eomt):
    """EoMT for instance segmentation (task ``segment``): each query is one instance candidate.

    :meth:`infer` gives the segment task's tuple per query (no NMS: set prediction): the box
    around the query's stride-4 mask (logit > 0), the score (best class probability, no-object
    excluded, times the mean mask probability inside the mask: HF EoMT's instance score), the
    class, the mask embedding and the stride-4 mask feature; :meth:`mask_logits` is their dot
    product, which the task samples at each image's pixels.
    """

    TASK = "segment"
    DEFAULT_NC = 80
    DEFAULT_IMGSZ = 640
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"semantic": ".eomt.model:Eomt",
                                               "panoptic": ".eomt.model:EomtPanoptic"}

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """-> boxes (B, Q, 4) xyxy canvas pixels, scores (B, Q), classes (B, Q), mask embeddings
        (B, Q, D), mask feature (B, D, S/4, S/4)."""
        p = self.model(x, raw=True)
        logits = p.mask_logits.float()
        fg = logits > 0
        probs = p.class_logits.float().softmax(-1)[..., :-1]
        cls_score, cls = probs.max(-1)
        sig = logits.sigmoid()
        mask_score = (sig * fg).flatten(2).sum(-1) / fg.flatten(2).sum(-1).clamp(min=1)
        return mask_boxes(fg), cls_score * mask_score, cls, p.mask_embed.float(), p.feature.float()

    @staticmethod
    def mask_logits(feature: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """Mask feature (D, h, w) and (n, D) embeddings -> (n, h, w) logits (leading batch dims allowed)."""
        return torch.einsum("...nc,...chw->...nhw", embed, feature)


def mask_boxes(fg: torch.Tensor) -> torch.Tensor:
    """(B, Q, h, w) bool stride-4 masks -> (B, Q, 4) xyxy boxes in canvas pixels around each
    mask's cells (all zero for an empty mask); fixed shapes."""
    h, w = fg.shape[-2:]
    cols, rows = fg.any(-2), fg.any(-1)                                                 # (B, Q, w), (B, Q, h)
    x1 = cols.float().argmax(-1)
    x2 = w - 1 - cols.flip(-1).float().argmax(-1)
    y1 = rows.float().argmax(-1)
    y2 = h - 1 - rows.flip(-1).float().argmax(-1)
    box = torch.stack((x1, y1, x2 + 1, y2 + 1), -1).float() * MASK_STRIDE
    return box * cols.any(-1, keepdim=True)


class EomtPanoptic(Eomt):
    """EoMT for panoptic segmentation (task ``panoptic``): :meth:`infer` gives the class logits
    (B, Q, nc + 1) and the stride-4 mask logits (B, Q, S/4, S/4); the panoptic task merges them
    into one segment map (:mod:`libreyolo.tasks.panoptic`). Which classes are things comes from
    the checkpoint's ``thing_class_ids`` (COCO panoptic's 80 things for a 133-class model)."""

    TASK = "panoptic"
    DEFAULT_NC = 133
    DEFAULT_IMGSZ = 640
    TASK_VARIANTS: ClassVar[dict[str, str]] = {"semantic": ".eomt.model:Eomt", "segment": ".eomt.model:EomtSeg"}

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        if nc == 80 + len(COCO_PANOPTIC_STUFF):
            things = super().default_names(80)
            return {**things, **{80 + i: n for i, n in enumerate(COCO_PANOPTIC_STUFF)}}
        return super().default_names(nc)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.model(x, raw=True)
        return p.class_logits.float(), p.mask_logits.float()
