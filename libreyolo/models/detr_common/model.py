"""DetrModel: the shared declarations and capturable inference stage of the DETR families.

A DETR family subclasses :class:`DetrModel`, sets ``FAMILY``/``SIZES``/``FILE_PREFIX``/
``SIGNATURE_KEYS``/``NC_KEY`` and implements ``build_network``. Its network, called on the
(normalised) canvas, returns a dict with ``pred_logits`` (B, Q, nc, pre-sigmoid) and
``pred_boxes`` (B, Q, 4, normalised cx, cy, w, h); a family whose network returns
something else overrides :meth:`DetrModel.split_outputs`.

Post-processing is the RT-DETR one: sigmoid, then one top-K over the flattened
query x class scores. There is no NMS (``NMS = False``), and every shape is fixed, so
:meth:`DetrModel.infer` can be captured whole into a CUDA graph.

Training: :meth:`DetrModel.train_forward` feeds the targets to the network for query denoising
(:mod:`.denoising`) and :meth:`DetrModel.build_loss` returns the set criterion (:mod:`.loss`,
Hungarian matching in :mod:`.matcher`) of the family's recipe (``LOSS_KIND``).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torchvision.ops import box_convert

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..base import Model, train_format

#: DETRs are trained on images resized to the square, ignoring the aspect ratio; most take RGB in
#: [0, 1], those with ImageNet-pretrained ViT backbones take ImageNet mean/std (``IMAGENET``).
#: RT-DETR and RT-DETRv2 resize as OpenCV's INTER_LINEAR does on uint8 pixels (``STRETCH``); D-FINE
#: and its descendants (DEIM, DEIMv2, EC, RT-DETRv4) as PIL's bilinear does (``PIL_STRETCH``,
#: ``IMAGENET``): antialiased when shrinking. Both round the resized pixels to whole levels.
STRETCH = Preprocess("stretch", quantize=True)
PIL_STRETCH = Preprocess("stretch", antialias=True, quantize=True)
IMAGENET = Preprocess("stretch", mean=IMAGENET_MEAN, std=IMAGENET_STD, antialias=True, quantize=True)


def detr_postprocess(logits: torch.Tensor, boxes: torch.Tensor, width: int, height: int,
                     num_top: int, return_index: bool = False) -> tuple[torch.Tensor, ...]:
    """DETR head outputs -> the K best (query, class) pairs, sorted by score descending.

    ``logits`` (B, Q, nc) pre-sigmoid, ``boxes`` (B, Q, 4) normalised cxcywh. Returns
    boxes (B, K, 4) xyxy in pixels of a ``width`` x ``height`` canvas, scores (B, K) and
    classes (B, K) int64, with K = min(num_top, Q * nc). One query may appear with several
    classes, as in the reference post-processor (focal-loss DETRs have no background class).
    ``return_index`` also returns each pair's flat index ``query * nc + class`` (B, K).
    """
    b, q, nc = logits.shape
    k = min(int(num_top), q * nc)
    scores, index = logits.sigmoid().flatten(1).topk(k, dim=1, sorted=True)
    cls = index % nc
    query = index // nc
    xyxy = box_convert(boxes, "cxcywh", "xyxy")
    # scale with Python scalars: no host->device copy inside a graph capture
    xyxy = torch.stack((xyxy[..., 0] * width, xyxy[..., 1] * height,
                        xyxy[..., 2] * width, xyxy[..., 3] * height), -1)
    picked = xyxy.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
    if return_index:
        return picked, scores, cls, index
    return picked, scores, cls


class DetrModel(Model):
    """Base of the DETR-style families: stretch resize, no NMS, top-K post-processing.

    Subclasses declare ``FAMILY``, ``SIZES``, ``FILE_PREFIX``, ``SIGNATURE_KEYS``, ``NC_KEY``
    and implement ``build_network(size, nc)``; they may change ``PREPROCESS`` (``STRETCH``: RGB in
    [0, 1], OpenCV's resampling; ``PIL_STRETCH``: the same with PIL's; ``IMAGENET``: PIL's with
    ImageNet mean/std) and ``NUM_TOP``.
    """

    TASK = "detect"
    PREPROCESS: ClassVar[Preprocess] = STRETCH
    #: NMS-free: the predictor applies only the confidence threshold and max_det
    NMS: ClassVar[bool] = False
    #: how many (query, class) pairs :meth:`infer` returns per image (at most Q * nc)
    NUM_TOP: ClassVar[int] = 300
    #: the RT-DETR / D-FINE recipes: AdamW, lr 1e-4, weight decay 1e-4, gradients clipped at 0.1, their
    #: augmentations (photometric distortion, zoom-out, IoU crop, flip; no mosaic) until close_mosaic
    TRAIN_DEFAULTS: ClassVar[dict[str, Any]] = {"optimizer": "AdamW", "lr0": 1e-4, "weight_decay": 1e-4,
                                                "clip_grad": 0.1, "augment_policy": "detr", "mosaic": 0.0}
    DEFAULT_IMGSZ: ClassVar[int] = 640
    STRIDE: ClassVar[int] = 32
    # Training captures backbone + encoder forward and backward (the seam, :meth:`train_seam`); the
    # decoder, matcher and loss run eager. The GPU tests check it for every DETR family (tests/gpu,
    # SEAM_MODELS: rtdetr-r18, rtdetrv2-r18, dfine-n, deim-n, rtdetrv4-s, deimv2-atto, ec-s): step-0 loss
    # and BatchNorm buffers bitwise equal to eager, two accumulated micro-batches' gradients within
    # eager's run-to-run noise, the trainer replays it. See docs/families.md.
    SUPPORTS_CUDA_GRAPH_TRAIN_SEAM: ClassVar[bool] = True

    def split_outputs(self, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The network's eval output -> (pred_logits (B, Q, nc), pred_boxes (B, Q, 4) cxcywh)."""
        return out["pred_logits"], out["pred_boxes"]

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) preprocessed canvas -> boxes (B, K, 4) xyxy canvas pixels, scores (B, K),
        classes (B, K) int64, sorted by score descending; K = min(NUM_TOP, Q * nc).

        Fixed shapes and no host synchronisation: the engine captures this whole.
        """
        logits, boxes = self.split_outputs(self.model(x))
        return detr_postprocess(logits.float(), boxes.float(), x.shape[-1], x.shape[-2], self.NUM_TOP)

    #: which set criterion trains the family: "rtdetr" (VFL + L1 + GIoU) or "dfine" (adds union
    #: matching, FGL and DDF); None: "dfine" when the network's decoder has edge distributions
    #: (a :class:`~.dfine_decoder.DFineDecoder`), else "rtdetr"
    LOSS_KIND: ClassVar[str | None] = None
    #: query denoising's gt-slot bucket: None = the batch's largest gt count (the reference; the
    #: decoder's token count varies), an int k = the targets' padded row count rounded up to a
    #: multiple of k (fixed shapes, nothing read on the host); see :mod:`.denoising`
    DN_PAD_TO: ClassVar[int | None] = None

    def loss_kind(self) -> str:
        """The criterion recipe for this model (see ``LOSS_KIND``)."""
        if self.LOSS_KIND is not None:
            return self.LOSS_KIND
        from .dfine_decoder import DFineDecoder
        return "dfine" if isinstance(getattr(self.model, "decoder", None), DFineDecoder) else "rtdetr"

    def build_loss(self) -> nn.Module:
        """The DETR set criterion (:class:`~.loss.DetrLoss`) for this family's recipe."""
        from .loss import DetrLoss
        kind = self.loss_kind()
        if kind not in ("rtdetr", "dfine"):
            raise ValueError(f"unknown LOSS_KIND {kind!r} (expected 'rtdetr' or 'dfine')")
        return DetrLoss(self.nc, fine=kind == "dfine")

    def train_seam(self, net: nn.Module) -> nn.Module | None:
        """Backbone + encoder: fixed-shape for a given image size, unlike the decoder (its
        denoising queries follow the batch's largest ground-truth count) and the Hungarian
        matcher (host-side), which stay eager."""
        from .net import DetrFront
        return DetrFront(net)

    def set_train_seam(self, net: nn.Module, segment: nn.Module | None) -> None:
        if segment is None:
            net.__dict__.pop("front_override", None)
        else:
            net.__dict__["front_override"] = segment   # not registered: no state-dict keys

    def val_loss_outputs(self, net: nn.Module, out, x: torch.Tensor, *targets: torch.Tensor) -> Any:
        """The eval decoder returns its last layer only: a second pass with the decoder in training
        format (every layer's outputs, the encoder proposals and the denoising queries, which
        draw from torch's random generator), its normalization layers and the backbone and
        encoder in eval mode."""
        with train_format(net.decoder):
            return self.train_forward(net, x, *targets)

    def train_forward(self, net: nn.Module, x: torch.Tensor, targets: torch.Tensor | None,
                      mask: torch.Tensor | None) -> Any:
        """Training-mode forward: ``x`` (B, 3, S, S) preprocessed input; ``targets`` (B, M, 5) ``[cls, x1,
        y1, x2, y2]`` in input pixels with ``mask`` (B, M) feed query denoising (normalised cxcywh
        inside). Returns the network's training dict plus ``input_size`` (h, w), which the loss
        uses to normalise the targets."""
        dn_targets = None
        if targets is not None and mask is not None:
            from .loss import normalized_targets
            labels, boxes = normalized_targets(targets, (x.shape[-2], x.shape[-1]), self.nc)
            dn_targets = {"labels": labels, "boxes": boxes, "mask": mask.bool()}
            if self.DN_PAD_TO is not None:
                dn_targets["pad_to"] = self.DN_PAD_TO
        out = net(x, dn_targets)
        out["input_size"] = (int(x.shape[-2]), int(x.shape[-1]))
        return out
