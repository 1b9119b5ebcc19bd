"""RT-DETR's transformer decoder with query selection (RT-DETR and RT-DETRv2 layouts).

Pipeline: project each encoder map (``input_proj``), flatten them into one memory; score every
memory token with ``enc_output`` -> ``enc_score_head`` and regress a box relative to its anchor
(``enc_bbox_head``); the top-Q tokens by max class score become the queries (content = the
token, reference box = its box). Each decoder layer (self-attention, deformable
cross-attention, FFN) refines the boxes iteratively through ``dec_bbox_head``; the class
logits of the last layer come from ``dec_score_head``.

Layout differences between the versions are constructor flags: RT-DETRv2 names the
``enc_output`` entries ``proj``/``norm`` (RT-DETR: ``0``/``1``), stores the anchors and
valid mask for its native input size and the ``num_points_scale`` of its deformable attention.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from .deformable import MSDeformableAttention
from .denoising import contrastive_denoising, split_denoising_outputs
from .layers import MLP, activation, inverse_sigmoid


def generate_anchors(shapes: list[tuple[int, int]], grid_size: float = 0.05, eps: float = 1e-2,
                     device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor boxes for every cell of every level, as logits, plus their valid mask.

    Cell (i, j) of level l is the box (cx, cy) = ((j + 0.5) / w, (i + 0.5) / h), side
    grid_size * 2**l. Returns anchors (1, N, 4) in inverse-sigmoid space, +inf where the
    box is not strictly inside (eps, 1 - eps), and valid_mask (1, N, 1) bool.
    """
    per_level = []
    for lvl, (h, w) in enumerate(shapes):
        ys = (torch.arange(h, dtype=torch.float32, device=device) + 0.5) / h
        xs = (torch.arange(w, dtype=torch.float32, device=device) + 0.5) / w
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        wh = torch.full_like(gx, grid_size * 2.0 ** lvl)
        per_level.append(torch.stack((gx, gy, wh, wh), -1).reshape(1, h * w, 4))
    anchors = torch.cat(per_level, 1)
    valid = ((anchors > eps) & (anchors < 1 - eps)).all(-1, keepdim=True)
    logits = torch.log(anchors / (1 - anchors))
    return torch.where(valid, logits, torch.inf), valid


class DecoderLayer(nn.Module):
    """Post-norm layer: self-attention over queries, deformable cross-attention, ReLU FFN."""

    def __init__(self, d_model: int = 256, nhead: int = 8, dim_ff: int = 1024, num_levels: int = 3,
                 num_points: int | list[int] = 4, store_points_scale: bool = False, act: str = "relu"):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn = MSDeformableAttention(d_model, nhead, num_levels, num_points,
                                                store_points_scale=store_points_scale)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, dim_ff)
        self.act = activation(act)
        self.linear2 = nn.Linear(dim_ff, d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, tgt: torch.Tensor, ref_boxes: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]], query_pos: torch.Tensor,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        qk = tgt + query_pos
        tgt = self.norm1(tgt + self.self_attn(qk, qk, tgt, attn_mask=attn_mask, need_weights=False)[0])
        tgt = self.norm2(tgt + self.cross_attn(tgt + query_pos, ref_boxes, memory, shapes))
        return self.norm3(tgt + self.linear2(self.act(self.linear1(tgt))))


class TransformerDecoder(nn.Module):
    """The decoder layers (checkpoint name ``layers``) with iterative box refinement."""

    def __init__(self, num_layers: int, eval_idx: int = -1, **layer_kwargs: Any):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(**layer_kwargs) for _ in range(num_layers))
        self.eval_idx = eval_idx % num_layers

    def forward(self, tgt: torch.Tensor, ref_unact: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]], bbox_heads: nn.ModuleList, score_heads: nn.ModuleList,
                query_pos_head: nn.Module, attn_mask: torch.Tensor | None = None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Returns per-layer (boxes, logits): every layer in training, only ``eval_idx`` in eval.

        Training follows the reference: a layer's box for the loss is refined from the
        previous layer's undetached box, while the next layer's input is detached.
        """
        boxes_out, logits_out = [], []
        ref = ref_unact.sigmoid()        # detached reference boxes fed to the layers
        ref_grad = ref                   # the previous layer's box, with gradient (training)
        for i, layer in enumerate(self.layers):
            tgt = layer(tgt, ref.unsqueeze(2), memory, shapes, query_pos_head(ref), attn_mask)
            delta = bbox_heads[i](tgt)
            box = (delta + inverse_sigmoid(ref)).sigmoid()
            if self.training:
                logits_out.append(score_heads[i](tgt))
                boxes_out.append(box if i == 0 else (delta + inverse_sigmoid(ref_grad)).sigmoid())
            elif i == self.eval_idx:
                logits_out.append(score_heads[i](tgt))
                boxes_out.append(box)
                break
            ref_grad = box
            ref = box.detach() if self.training else box
        return boxes_out, logits_out


class RTDETRDecoder(nn.Module):
    """Query selection + :class:`TransformerDecoder` + prediction heads.

    Eval output: ``{"pred_logits": (B, Q, nc), "pred_boxes": (B, Q, 4) cxcywh in [0, 1]}``.
    Training output additionally holds ``aux_outputs`` (earlier layers) and ``enc_outputs``
    (the selected encoder proposals); with ``targets`` (``{"labels", "boxes" (normalised
    cxcywh), "mask"}``, see :mod:`.denoising`) also ``dn_outputs`` (the denoising queries' outputs
    of every layer) and ``dn_meta``.
    """

    def __init__(self, num_classes: int = 80, hidden_dim: int = 256, *, feat_channels: list[int] = (256, 256, 256),
                 num_levels: int = 3, num_queries: int = 300, num_layers: int = 6, nhead: int = 8,
                 dim_feedforward: int = 1024, num_points: int | list[int] = 4, num_denoising: int = 100,
                 eval_idx: int = -1, eps: float = 1e-2, version: int = 1,
                 native_size: tuple[int, int] | None = None, feat_strides: tuple[int, ...] = (8, 16, 32)):
        super().__init__()
        if len(feat_channels) != num_levels:
            raise ValueError("one feature channel count per level is expected")
        self.num_classes, self.hidden_dim = num_classes, hidden_dim
        self.num_queries, self.num_levels, self.eps = num_queries, num_levels, eps
        self.version = version
        # v2 stores anchors for its native size; they are used only at exactly that grid
        self.native_shapes: list[tuple[int, int]] | None = None
        if version == 2 and native_size is not None:
            self.native_shapes = [(native_size[0] // s, native_size[1] // s) for s in feat_strides]
            anchors, valid = generate_anchors(self.native_shapes, eps=eps)
            self.register_buffer("anchors", anchors)
            self.register_buffer("valid_mask", valid)
        self.input_proj = nn.ModuleList(
            nn.Sequential(OrderedDict([("conv", nn.Conv2d(c, hidden_dim, 1, bias=False)),
                                       ("norm", nn.BatchNorm2d(hidden_dim))]))
            for c in feat_channels)
        self.decoder = TransformerDecoder(num_layers, eval_idx, d_model=hidden_dim, nhead=nhead,
                                          dim_ff=dim_feedforward, num_levels=num_levels, num_points=num_points,
                                          store_points_scale=(version == 2))
        if num_denoising > 0:  # used by training with targets (query denoising)
            self.denoising_class_embed = nn.Embedding(num_classes + 1, hidden_dim, padding_idx=num_classes)
        # query denoising settings (training with targets; see denoising.py), not in the state dict
        self.num_denoising, self.label_noise_ratio, self.box_noise_scale = num_denoising, 0.5, 1.0
        self.dn_pad_to: int | None = None
        self.query_pos_head = MLP(4, 2 * hidden_dim, hidden_dim, 2)
        if version == 2:
            self.enc_output = nn.Sequential(OrderedDict([("proj", nn.Linear(hidden_dim, hidden_dim)),
                                                         ("norm", nn.LayerNorm(hidden_dim))]))
        else:
            self.enc_output = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.LayerNorm(hidden_dim))
        self.enc_score_head = nn.Linear(hidden_dim, num_classes)
        self.enc_bbox_head = MLP(hidden_dim, hidden_dim, 4, 3)
        self.dec_score_head = nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_layers))
        self.dec_bbox_head = nn.ModuleList(MLP(hidden_dim, hidden_dim, 4, 3) for _ in range(num_layers))
        self._reset_parameters()

    @torch.no_grad()
    def _reset_parameters(self) -> None:
        """The reference initialisation for training from scratch: class heads start at a 1% prior
        probability, box heads predict no change from their reference, Xavier elsewhere."""
        prior = -math.log((1 - 0.01) / 0.01)
        for cls_head, box_head in zip([self.enc_score_head, *self.dec_score_head],
                                      [self.enc_bbox_head, *self.dec_bbox_head]):
            nn.init.constant_(cls_head.bias, prior)
            nn.init.zeros_(box_head.layers[-1].weight)
            nn.init.zeros_(box_head.layers[-1].bias)
        nn.init.xavier_uniform_(self.enc_output[0].weight)
        for lin in self.query_pos_head.layers:
            nn.init.xavier_uniform_(lin.weight)

    def _memory(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Project and flatten the levels into one (B, sum(h*w), C) memory."""
        tokens, shapes = [], []
        for proj, f in zip(self.input_proj, feats):
            f = proj(f)
            shapes.append((int(f.shape[2]), int(f.shape[3])))
            tokens.append(f.flatten(2).transpose(1, 2))
        return torch.cat(tokens, 1), shapes

    def _anchors(self, shapes: list[tuple[int, int]], device: torch.device,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.training and self.native_shapes is not None and shapes == self.native_shapes:
            return self.anchors, self.valid_mask
        anchors, valid = generate_anchors(shapes, eps=self.eps, device=device)
        # in the activations' dtype, as the native-size buffers are in a half copy (fp32: no-op)
        return anchors.to(dtype), valid

    def _select_queries(self, memory: torch.Tensor, shapes: list[tuple[int, int]]):
        """Top-Q encoder proposals by max class score -> (content, box logits, enc logits)."""
        anchors, valid = self._anchors(shapes, memory.device, memory.dtype)
        out_memory = self.enc_output(valid.to(memory.dtype) * memory)
        enc_logits = self.enc_score_head(out_memory)
        enc_boxes = self.enc_bbox_head(out_memory) + anchors
        k = min(self.num_queries, memory.shape[1])
        idx = enc_logits.max(-1).values.topk(k, dim=1).indices
        content = out_memory.gather(1, idx.unsqueeze(-1).expand(-1, -1, out_memory.shape[-1]))
        box_unact = enc_boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
        topk_logits = enc_logits.gather(1, idx.unsqueeze(-1).expand(-1, -1, enc_logits.shape[-1]))
        return content.detach(), box_unact.detach(), box_unact.sigmoid(), topk_logits

    def forward(self, feats: list[torch.Tensor], targets: Any = None) -> dict[str, Any]:
        memory, shapes = self._memory(feats)
        content, ref_unact, enc_boxes, enc_logits = self._select_queries(memory, shapes)
        dn = None
        if self.training and targets is not None and self.num_denoising > 0:
            dn = contrastive_denoising(targets, self.num_classes, content.shape[1], self.denoising_class_embed,
                                       self.decoder.layers[0].self_attn.num_heads, num_denoising=self.num_denoising,
                                       label_noise_ratio=self.label_noise_ratio,
                                       box_noise_scale=self.box_noise_scale, pad_to=self.dn_pad_to)
        if dn is not None:  # denoising queries first: [denoising | matching]
            content = torch.cat([dn.content.to(content.dtype), content], 1)
            ref_unact = torch.cat([dn.ref_unact.to(ref_unact.dtype), ref_unact], 1)
        boxes, logits = self.decoder(content, ref_unact, memory, shapes, self.dec_bbox_head,
                                     self.dec_score_head, self.query_pos_head,
                                     attn_mask=dn.attn_mask if dn is not None else None)
        out: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.training:
            out["aux_outputs"] = [{"pred_logits": lg, "pred_boxes": bx} for lg, bx in zip(logits[:-1], boxes[:-1])]
            out["enc_outputs"] = {"pred_logits": enc_logits, "pred_boxes": enc_boxes}
        return split_denoising_outputs(out, dn)
