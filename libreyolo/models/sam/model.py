"""SAM declarations (promptable segmentation), and :class:`PromptModel`: the predict / set_image
surface the promptable families share (SAM, PicoSAM3).

This module imports neither transformers nor the network: the registry lists the family, names
its files and reads its checkpoints' keys without the optional extra; ``build_network`` (a model
built or loaded) imports ``nn.py``, which names the extra to install when transformers is missing.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ...options import parse_bool
from ..base import Model

log = logging.getLogger(__name__)


class PromptModel(Model):
    """A promptable-segmentation model: ``model(image, points=..., boxes=...)``,
    ``model.set_image(image)`` then prompt calls, ``model(image)`` for automatic masks (see
    :class:`libreyolo.tasks.segment_prompt.predictor.PromptPredictor`). Class-agnostic: one
    class, "object"."""

    TASK = "segment-prompt"
    DEFAULT_NC = 1
    #: graphs kept per model: one image-stage graph per input size plus one prompt-stage graph per
    #: (image size, number of points and boxes, multimask)
    MAX_GRAPHS = 16
    #: whether point prompts (and so the point grid of automatic masks) are taken
    GRID_PROMPTS = True
    #: whether mask prompts (``mask_input``) are taken: the prompt encoder's mask input (SAM)
    MASK_PROMPTS = False

    def __init__(self, net: nn.Module, *, nc: int = 1, names: Any = None, **kw):
        super().__init__(net, nc=1, names={0: "object"}, **kw)

    @classmethod
    def new(cls, size: str, nc: int | None = None, names: Any = None, **kw) -> Model:
        """An untrained model; ``nc`` / ``names`` are ignored (class-agnostic masks)."""
        return super().new(size, 1, None, **kw)

    def _attach(self, net: nn.Module) -> None:
        super()._attach(net)
        self.runner.max_graphs = self.MAX_GRAPHS

    def predict(self, source: Any = None, *, save: bool = False, save_dir: str | Path | None = None,
                exist_ok: bool = False, **kwargs) -> Any:
        """Masks for a prompt: ``model(image, points=[[x, y]], labels=[1], boxes=[[x1, y1, x2, y2]],
        multimask=True)``, ``model(points=...)`` on the image of :meth:`set_image`, or automatic
        masks with no prompt (``prompts="grid"``). ``save`` writes the annotated pictures to
        ``save_dir`` (default: a new ``runs/segment-prompt/predict``). One image (or none: the set
        image) gives one Results, several a list, as ``Model.predict``."""
        results = self.get_predictor()(source, **kwargs)
        if parse_bool("save", save):
            from ...engine.paths import UniqueNames, next_run_dir, task_project
            from ...logs import info_shown
            out_dir = Path(save_dir) if save_dir else next_run_dir(task_project(self.TASK), "predict", exist_ok)
            out_dir.mkdir(parents=True, exist_ok=True)
            unique = UniqueNames()
            for r in results:
                r.saved_to, r.save_dir = r.save(out_dir / unique(Path(r.path).stem)), str(out_dir)
            info_shown(log, "saved %d annotated image(s) to %s", len(results), out_dir)
        from ...data.sources import one_or_all
        return one_or_all(source, results)

    __call__ = predict

    def set_image(self, source: Any, **kwargs) -> PromptModel:
        """Embed one image now; later prompt calls without an image (``model(points=...)``) reuse
        it. Options: ``imgsz``, ``cuda_graph``, ``amp``, ``bgr``. Returns the model."""
        self.get_predictor().set_image(source, **kwargs)
        return self


class SAM(PromptModel):
    """SAM (Segment Anything): a ViT-B / L / H image encoder, SAM's prompt encoder and two-way
    mask decoder - transformers' modules (``nn.py`` says why).

    Two stages as MobileSAM: :meth:`infer` embeds an image once (resized so its longer side is
    the 1024 frame, normalized with ImageNet's mean / std and zero-padded to the square) and
    :meth:`decode` turns the embedding and a prompt (points, labels, boxes in the frame) into
    mask logits and predicted IoUs. The frame is fixed by the ViT's position embedding.
    """

    FAMILY = "sam"
    MASK_PROMPTS = True              # transformers' SamPromptEncoder.mask_embed: SAM's mask_input
    # proven on the GPU (docs/families.md "Promptable segmentation (SAM, PicoSAM3)")
    SUPPORTS_CUDA_GRAPH = True
    SIZES = ("base", "large", "huge")
    FILE_PREFIX = "LibreSAM1"        # the reference's class: LibreSAM1base.pt
    DEFAULT_IMGSZ = 1024
    STRIDE = 16                      # input pixels per image-embedding cell
    #: longer side to the frame with PIL's bilinear (whole levels), as SamProcessor resizes; the
    #: network normalizes and pads
    PREPROCESS = Preprocess("long", antialias=True, quantize=True)
    SIGNATURE_KEYS = ("shared_image_embedding.positional_embedding", "vision_encoder.pos_embed",
                      "vision_encoder.layers.0.attn.rel_pos_h", "mask_decoder.upscale_conv1.weight")

    #: entries that hold one tensor under two names (SamModel's tie): a transformers snapshot
    #: (``model.safetensors``) stores such a tensor once, under the second name
    TIED = {"prompt_encoder.shared_embedding.positional_embedding": "shared_image_embedding.positional_embedding"}

    @classmethod
    def from_checkpoint(cls, ckpt: dict, **kw: Any) -> Model:
        """A checkpoint, or a transformers SAM state dict whose tied entry is stored once."""
        sd = ckpt["model"]
        tied = {k: sd[v] for k, v in cls.TIED.items() if k not in sd and v in sd}
        if tied:
            ckpt = {**ckpt, "model": {**sd, **tied}}
        return super().from_checkpoint(ckpt, **kw)

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        """The network (transformers' modules at the original release's size); ``nc`` is ignored."""
        from .nn import SamNet, sam_config
        if size not in cls.SIZES:
            raise ValueError(f"unknown SAM size {size!r}; sizes: {', '.join(cls.SIZES)}")
        return SamNet(sam_config(size))

    def __init__(self, net: nn.Module, *, imgsz: int | None = None, **kw):
        super().__init__(net, imgsz=net.img_size if imgsz is None else imgsz, **kw)

    @property
    def imgsz(self) -> int:
        """The frame (fixed by the network: its ViT's position embedding)."""
        return self._imgsz

    @imgsz.setter
    def imgsz(self, value: int) -> None:
        net = getattr(self, "model", None)
        if net is not None and int(value) != net.img_size:
            raise ValueError(f"SAM's frame is fixed at {net.img_size} (its ViT's position embedding), got imgsz={value}")
        self._imgsz = int(value)

    def _attach(self, net: nn.Module) -> None:
        if getattr(self, "_imgsz", net.img_size) != net.img_size:
            raise ValueError(f"SAM's frame is fixed at {net.img_size} (its ViT's position embedding), "
                             f"got imgsz={self._imgsz}")
        self._imgsz = int(net.img_size)
        super()._attach(net)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, h', w') RGB in [0, 1] with the longer side the frame -> image embeddings
        (B, 256, S/16, S/16)."""
        return self.model.embed(x, max(int(x.shape[-2]), int(x.shape[-1])))

    def decode(self, embeddings: torch.Tensor, points: torch.Tensor | None, labels: torch.Tensor | None,
               boxes: torch.Tensor | None, multimask: bool, size: int,
               mask_input: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings + prompts in the ``size`` frame (``mask_input``: (B, 1, S/4, S/4) mask
        logits, SAM's dense prompt) -> (B, M, S/4, S/4) mask logits, (B, M) IoU."""
        return self.model.decode(embeddings, points, labels, boxes, multimask, size, mask_input=mask_input)
