"""RT-DETRv2 for oriented boxes: HGNetv2 backbone, the hybrid encoder with identity-branch RepVGG
blocks, and a five-coordinate decoder (cx, cy, w, h, angle / pi).

The layout is that of the released RT-DETRv2-OBB checkpoints (sizes n..x, DOTA): the backbone is
D-FINE's HGNetv2 (B0 for n and s, B2, B4, B5), size n keeps two levels (strides 16 and 32). The
decoder is RT-DETRv2's with three changes:

* every box has a fifth coordinate, the angle divided by pi, sigmoid-activated like the other
  four (so angles lie in (0, pi)); the encoder proposals' anchors get an angle logit of 0, and the
  proposals' logits are clamped to [-20, 20] (the anchors of border cells are +inf);
* the deformable cross-attention scales each sampling offset by the reference box's extent
  rotated by its angle: ``loc = (cx, cy) + off * point_scale * R(angle) @ (w, h) * 0.5``
  (element-wise product with the rotated extent vector, as the released models were trained);
* the query position head and box heads take / give five values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..detr_common.deformable import MSDeformableAttention, deformable_sample
from ..detr_common.hgnetv2 import HGNetv2
from ..detr_common.hybrid_encoder import HybridEncoder, RepVggBlock
from ..detr_common.layers import MLP, fold_conv_bn
from ..detr_common.net import DetrNet
from ..detr_common.rtdetr_decoder import RTDETRDecoder

#: the released models' input size (their stored anchors are for it)
OBB_NATIVE_SIZE = 1024


@dataclass(frozen=True)
class OBBConfig:
    backbone: str                  # HGNetv2 variant
    use_lab: bool
    return_idx: tuple[int, ...]    # backbone stages fed to the encoder
    hidden_dim: int                # encoder and decoder width
    enc_ff: int                    # AIFI feed-forward width
    expansion: float               # CSPRepLayer width expansion
    depth_mult: float              # RepVGG blocks per CSPRepLayer: round(3 * depth_mult)
    dec_layers: int
    num_points: tuple[int, ...]    # deformable sampling points per level

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(4 * 2 ** i for i in self.return_idx)


OBB_CONFIGS: dict[str, OBBConfig] = {
    "n": OBBConfig("B0", True, (2, 3), 128, 512, 0.34, 0.50, 3, (6, 6)),
    "s": OBBConfig("B0", True, (1, 2, 3), 224, 1024, 0.50, 0.34, 3, (4, 4, 4)),
    "m": OBBConfig("B2", True, (1, 2, 3), 256, 1024, 1.0, 0.67, 3, (4, 4, 4)),
    "l": OBBConfig("B4", False, (1, 2, 3), 256, 1024, 1.0, 0.67, 4, (4, 4, 4)),
    "x": OBBConfig("B5", False, (1, 2, 3), 384, 2048, 1.0, 0.67, 4, (4, 4, 4)),
}


class IdentityRepVggBlock(RepVggBlock):
    """RepVGG block with the third (identity BatchNorm) branch: ``act(conv3x3 + conv1x1 + bn(x))``."""

    def __init__(self, c_in: int, c_out: int, act: str = "silu"):
        super().__init__(c_in, c_out, act)
        self.identity = nn.BatchNorm2d(c_in) if c_in == c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.act(self.fused(x))
        y = self.conv1(x) + self.conv2(x)
        if self.identity is not None:
            y = y + self.identity(x)
        return self.act(y)

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Merge the three branches into ``self.fused`` (the identity as a centred 3x3 delta)."""
        if self.fused is not None:
            return
        identity = self.identity
        super().reparameterize()
        if identity is not None:
            c = identity.num_features
            delta = nn.Conv2d(c, c, 1, bias=False).to(self.fused.weight)
            delta.weight.zero_()
            delta.weight[range(c), range(c), 0, 0] = 1.0
            folded = fold_conv_bn(delta, identity)
            self.fused.weight.add_(F.pad(folded.weight, (1, 1, 1, 1)))
            self.fused.bias.add_(folded.bias)
        self.identity = None


class OBBHybridEncoder(HybridEncoder):
    """RT-DETR's hybrid encoder whose fusion blocks use :class:`IdentityRepVggBlock`."""

    def __init__(self, in_channels: list[int], hidden_dim: int, *, expansion: float, depth_mult: float,
                 act: str = "silu", **kwargs: Any):
        super().__init__(in_channels, hidden_dim, expansion=expansion, depth_mult=depth_mult, act=act, **kwargs)
        n = round(3 * depth_mult)
        for blocks in (self.fpn_blocks, self.pan_blocks):
            for layer in blocks:
                hidden = int(hidden_dim * expansion)
                layer.bottlenecks = nn.Sequential(*[IdentityRepVggBlock(hidden, hidden, act) for _ in range(n)])


class RotatedDeformableAttention(MSDeformableAttention):
    """:class:`MSDeformableAttention` whose offsets follow the reference box's rotated extent."""

    def forward(self, query: torch.Tensor, ref_boxes: torch.Tensor, value: torch.Tensor,
                shapes: list[tuple[int, int]], value_mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (B, Lq, C); ref_boxes (B, Lq, 1, 5) normalised cx, cy, w, h, angle / pi."""
        b, lq = query.shape[:2]
        total = sum(self.num_points_list)
        v = self.value_proj(value)
        if value_mask is not None:
            v = v * value_mask.to(v.dtype).unsqueeze(-1)
        v = v.reshape(b, value.shape[1], self.num_heads, self.embed_dim // self.num_heads)
        offsets = self.sampling_offsets(query).reshape(b, lq, self.num_heads, total, 2)
        weights = self.attention_weights(query).reshape(b, lq, self.num_heads, total).softmax(-1)
        ref = ref_boxes[:, :, None, :, :]                                   # (B, Lq, 1, 1, 5)
        angle = ref[..., 4:5] * math.pi
        cos, sin = angle.cos(), angle.sin()
        wh = ref[..., 2:4] * self.offset_scale
        # R(angle) @ (w, h): the extent vector rotated by the box's angle
        extent = torch.cat((cos * wh[..., :1] - sin * wh[..., 1:2], sin * wh[..., :1] + cos * wh[..., 1:2]), -1)
        scale = self.num_points_scale.to(query.dtype).unsqueeze(-1)        # (P, 1)
        locations = ref[..., :2] + offsets * scale * extent
        out = deformable_sample(v, shapes, locations, weights, self.num_points_list)
        return self.output_proj(out)


class OBBDecoder(RTDETRDecoder):
    """The RT-DETRv2 decoder with five-coordinate boxes (see the module docstring).

    Eval output: ``{"pred_logits": (B, Q, nc), "pred_boxes": (B, Q, 5)}`` (cx, cy, w, h normalised to
    the input, angle / pi; all after sigmoid). Training output adds ``aux_outputs`` and
    ``enc_outputs`` as the horizontal decoder's; query denoising is not used.
    """

    BOX_DIM = 5

    def __init__(self, num_classes: int, hidden_dim: int, **kwargs: Any):
        super().__init__(num_classes, hidden_dim, version=2, **kwargs)
        for layer in self.decoder.layers:
            old = layer.cross_attn
            layer.cross_attn = RotatedDeformableAttention(hidden_dim, old.num_heads, old.num_levels,
                                                          old.num_points_list, store_points_scale=True)
        n = len(self.dec_bbox_head)
        self.query_pos_head = MLP(5, 2 * hidden_dim, hidden_dim, 2)
        self.enc_bbox_head = MLP(hidden_dim, hidden_dim, 5, 3)
        self.dec_bbox_head = nn.ModuleList(MLP(hidden_dim, hidden_dim, 5, 3) for _ in range(n))
        self._reset_parameters()

    def _select_queries(self, memory: torch.Tensor, shapes: list[tuple[int, int]]):
        """Top-Q encoder proposals by max class score; the anchors get an angle logit of 0 and the
        proposals' logits are clamped to [-20, 20]."""
        anchors, valid = self._anchors(shapes, memory.device, memory.dtype)
        out_memory = self.enc_output(valid.to(memory.dtype) * memory)
        enc_logits = self.enc_score_head(out_memory)
        anchors = torch.cat((anchors, torch.zeros_like(anchors[..., :1])), -1)
        enc_boxes = (self.enc_bbox_head(out_memory) + anchors).clamp(-20.0, 20.0)
        k = min(self.num_queries, memory.shape[1])
        idx = enc_logits.max(-1).values.topk(k, dim=1).indices
        content = out_memory.gather(1, idx.unsqueeze(-1).expand(-1, -1, out_memory.shape[-1]))
        box_unact = enc_boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 5))
        topk_logits = enc_logits.gather(1, idx.unsqueeze(-1).expand(-1, -1, enc_logits.shape[-1]))
        return content.detach(), box_unact.detach(), box_unact.sigmoid(), topk_logits

    def forward(self, feats: list[torch.Tensor], targets: Any = None) -> dict[str, Any]:
        return super().forward(feats, None)     # no query denoising for rotated boxes


def build_rtdetrv2_obb(size: str, nc: int) -> DetrNet:
    """The RT-DETRv2-OBB network of ``size`` (n, s, m, l, x) for ``nc`` classes."""
    if size not in OBB_CONFIGS:
        raise ValueError(f"unknown RT-DETRv2 OBB size {size!r}; sizes: {', '.join(OBB_CONFIGS)}")
    cfg = OBB_CONFIGS[size]
    backbone = HGNetv2(cfg.backbone, use_lab=cfg.use_lab, return_idx=cfg.return_idx)
    levels = len(cfg.return_idx)
    encoder = OBBHybridEncoder(backbone.out_channels, cfg.hidden_dim, dim_feedforward=cfg.enc_ff,
                               expansion=cfg.expansion, depth_mult=cfg.depth_mult,
                               use_encoder_idx=(levels - 1,))
    decoder = OBBDecoder(nc, cfg.hidden_dim, feat_channels=[cfg.hidden_dim] * levels, num_levels=levels,
                         num_layers=cfg.dec_layers, num_points=list(cfg.num_points),
                         native_size=(OBB_NATIVE_SIZE, OBB_NATIVE_SIZE), feat_strides=cfg.strides)
    return DetrNet(backbone, encoder, decoder)
