"""MobileSAM declarations (promptable segmentation) and its two capturable stages."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ...options import parse_bool
from ..base import Model
from .nn import CONFIGS, MobileSAMNet, check_frame

log = logging.getLogger(__name__)


class MobileSAM(Model):
    """MobileSAM: SAM's prompt encoder and mask decoder on a TinyViT-5M image encoder (size tiny).

    Prediction has two stages (see ``libreyolo/tasks/segment_prompt``): :meth:`infer` embeds an
    image once (resized so its longer side is ``imgsz``, 1024 as trained; the network normalizes
    and zero-pads to the square itself) and :meth:`decode` turns the embedding and a prompt
    (points, labels, boxes in the ``imgsz`` frame) into mask logits and predicted IoUs. The image
    embedding is reused by every prompt on that image (``model.set_image``).
    """

    FAMILY = "mobilesam"
    TASK = "segment-prompt"
    # Declared for the GPU proof (tests/gpu/test_tasks_gpu.py SEGMENT_PROMPT_GRAPH_MODELS rows and
    # tests/gpu/test_segment_prompt_gpu.py: parity protocol on the network, the image stage and the
    # prompt stage, fp32 and AMP, batch 1 and 8; graphed predict and prompt calls == eager).
    SUPPORTS_CUDA_GRAPH = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreMobileSAM"   # the LibreYOLO checkpoint name: LibreMobileSAMtiny.pt
    DEFAULT_IMGSZ = 1024
    STRIDE = 16                      # input pixels per image-embedding cell
    #: longer side to imgsz with PIL's bilinear (whole levels), no padding: the network pads (SAM)
    PREPROCESS = Preprocess("long", antialias=True, quantize=True)

    SIGNATURE_KEYS = ("image_encoder.patch_embed.seq.0.c.weight", "prompt_encoder.not_a_point_embed.weight",
                      "mask_decoder.iou_token.weight")
    #: graphs kept per model: one encoder graph per input image size plus one prompt graph per
    #: (image size, number of points and boxes, multimask)
    MAX_GRAPHS = 16

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        """The network; ``nc`` is ignored: masks are class-agnostic (one class, "object")."""
        return MobileSAMNet(size)

    def __init__(self, net: nn.Module, *, nc: int = 1, names: Any = None, **kw):
        super().__init__(net, nc=1, names={0: "object"}, **kw)

    @classmethod
    def new(cls, size: str, nc: int = 1, names: Any = None, **kw) -> MobileSAM:
        """An untrained model; ``nc`` / ``names`` are ignored (class-agnostic masks)."""
        return super().new(size, 1, None, **kw)

    def _attach(self, net: nn.Module) -> None:
        super()._attach(net)
        self.runner.max_graphs = self.MAX_GRAPHS
        net.img_size = check_frame(self.imgsz)

    @property
    def imgsz(self) -> int:
        """The default frame size; the network's own default (its ``forward``) follows it."""
        return self._imgsz

    @imgsz.setter
    def imgsz(self, value: int) -> None:
        self._imgsz = check_frame(int(value))
        if getattr(self, "model", None) is not None:
            self.model.img_size = self._imgsz

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, h', w') RGB in [0, 1] with the longer side the frame size -> image embeddings
        (B, 256, S/16, S/16), S = max(h', w')."""
        return self.model.embed(x * 255.0, max(int(x.shape[-2]), int(x.shape[-1])))

    def decode(self, embeddings: torch.Tensor, points: torch.Tensor | None, labels: torch.Tensor | None,
               boxes: torch.Tensor | None, multimask: bool, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings + prompts in the ``size`` frame -> (B, M, S/4, S/4) mask logits, (B, M) IoU."""
        return self.model.decode(embeddings, points, labels, boxes, multimask, size)

    def predict(self, source: Any = None, *, save: bool = False, save_dir: str | Path | None = None,
                exist_ok: bool = False, **kwargs) -> Any:
        """Masks for a prompt: ``model(image, points=[[x, y]], labels=[1], boxes=[[x1, y1, x2, y2]],
        multimask=True)``, or ``model(points=...)`` on the image of :meth:`set_image`. See
        :class:`libreyolo.tasks.segment_prompt.predictor.PromptPredictor` for the options.
        ``save`` writes the annotated pictures to ``save_dir`` (default: a new
        ``runs/segment-prompt/predict``; ``Results.save_dir`` names it).
        One image (or none: the set image) gives one Results, several a list, as ``Model.predict``.
        """
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

    def set_image(self, source: Any, **kwargs) -> MobileSAM:
        """Embed one image now; later prompt calls without an image (``model(points=...)``) reuse
        its embedding. Options: ``imgsz``, ``cuda_graph``, ``amp``, ``bgr``. Returns the model."""
        self.get_predictor().set_image(source, **kwargs)
        return self
