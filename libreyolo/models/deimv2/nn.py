"""DEIMv2 network: HGNetv2 backbone + lite or hybrid encoder + the DEIMv2 FDR decoder.

DEIMv2 (Huang et al. 2025) keeps D-FINE's fine-grained distribution refinement and changes the
decoder layer: RMSNorm instead of LayerNorm, a SwiGLU feed-forward (``swish_ffn.{w12, w3}``),
and, in the three smallest sizes, a plain residual + ``norm2`` where D-FINE has the gated
merge (the larger sizes keep the gate, with an RMSNorm). Around the layers: no ``enc_output``
before query selection, a 3-layer ``query_pos_head`` of width ``hidden_dim`` that embeds the
initial boxes once (D-FINE re-embeds before every layer), and, in atto / femto / pico, one
``dec_bbox_head`` shared by all layers (listed under every index in checkpoints).

Sizes atto / femto / pico use a three-stage HGNetv2 (stride 16) and the :class:`LiteEncoder`
(a second, stride-32 level made by average pooling; no transformer); size n uses HGNetv2-B0
and the D-FINE hybrid encoder with sum fusion and "csp2" blocks. Sizes s / m / l / x use a
DINOv3-derived ViT backbone, which is not implemented (see :data:`DINO_SIZES`).

Layout (checkpoint keys): ``backbone.*`` (:class:`~..detr_common.hgnetv2.HGNetv2`),
``encoder.*``, ``decoder.*`` (:class:`~..detr_common.dfine_decoder.DFineDecoder` with the
DEIMv2 options and :class:`DEIMv2DecoderLayer`).

Input: RGB in [0, 1], no mean/std. Eval output: ``{"pred_logits": (B, Q, nc) pre-sigmoid,
"pred_boxes": (B, Q, 4) normalised cx, cy, w, h}``, Q = ``num_queries`` of the size.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..detr_common.dfine_decoder import DEIMV2_MODULE_ORDER, DFineDecoder, FDRDeformableAttention, Gate
from ..detr_common.dfine_encoder import DFineHybridEncoder, RepNCSPELAN4
from ..detr_common.hgnetv2 import ConvBNAct, HGNetv2
from ..detr_common.layers import ConvNorm, activation
from ..detr_common.net import DetrNet

#: sizes whose backbone is a DINOv3 / ViT-Tiny with spatial-tuning adapters (not implemented)
DINO_SIZES = ("s", "m", "l", "x")


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension (computed in fp32), times ``scale``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.scale


class SwiGLUFFN(nn.Module):
    """``w3(silu(a) * b)`` with ``(a, b)`` the two halves of ``w12(x)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, dim)
        for lin in (self.w12, self.w3):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w12(x).chunk(2, -1)
        return self.w3(F.silu(a) * b)


class RMSGate(Gate):
    """The D-FINE gated merge with an RMSNorm (DEIMv2)."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.norm = RMSNorm(dim)   # replaces the LayerNorm in place (same checkpoint position)


class DEIMv2DecoderLayer(nn.Module):
    """Self-attention -> RMSNorm; deformable cross-attention merged by a residual + ``norm2`` (or
    a :class:`RMSGate` when ``gateway``); SwiGLU feed-forward -> RMSNorm (clamped to fp16 range).
    Same call signature as :class:`~..detr_common.dfine_decoder.FDRDecoderLayer`."""

    def __init__(self, dim: int, heads: int, ffn: int, points: Sequence[int], gateway: bool):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.norm1 = RMSNorm(dim)
        self.cross_attn = FDRDeformableAttention(dim, heads, points)
        if gateway:
            self.gateway = RMSGate(dim)
        else:
            self.norm2 = RMSNorm(dim)
        self.use_gateway = gateway
        self.swish_ffn = SwiGLUFFN(dim, ffn // 2)
        self.norm3 = RMSNorm(dim)

    def forward(self, x: torch.Tensor, ref: torch.Tensor, value: torch.Tensor, shapes: list[tuple[int, int]],
                attn_mask: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor:
        q = x + pos
        x = self.norm1(x + self.self_attn(q, q, x, attn_mask=attn_mask, need_weights=False)[0])
        y = self.cross_attn(x + pos, ref, value, shapes)
        x = self.gateway(x, y) if self.use_gateway else self.norm2(x + y)
        x = x + self.swish_ffn(x)
        return self.norm3(x.clamp(-65504, 65504))


def deimv2_style_decoder(nc: int, hidden_dim: int, *, num_queries: int, strides: Sequence[int],
                         num_points: Sequence[int], num_layers: int, eval_size: int | None,
                         layer_factory, share_bbox_head: bool = False, reg_max: int = 32,
                         reg_scale: float = 4.0) -> DFineDecoder:
    """The FDR decoder as DEIMv2 and ECDet configure it (their layers differ: ``layer_factory``).

    Every encoder level is already ``hidden_dim`` wide (no input projections); activations SiLU.
    """
    levels = len(strides)
    return DFineDecoder(nc, hidden_dim, num_queries, feat_channels=(hidden_dim,) * levels,
                        feat_strides=tuple(strides), num_levels=levels, num_points=tuple(num_points),
                        num_layers=num_layers, activation="silu", mlp_act="silu",
                        eval_size=(eval_size, eval_size) if eval_size else None, reg_max=reg_max,
                        reg_scale=reg_scale, query_pos_layers=3, query_pos_hidden=hidden_dim,
                        enc_output=False, module_order=DEIMV2_MODULE_ORDER, layer_factory=layer_factory,
                        query_pos_per_layer=False, share_bbox_head=share_bbox_head)


class GapFusion(nn.Module):
    """Adds the global average of the map to every position, then a 1x1 ConvNorm + activation."""

    def __init__(self, dim: int, act: str = "silu"):
        super().__init__()
        self.cv = ConvNorm(dim, dim, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv(x + x.mean((2, 3), keepdim=True))


def _avg_down(dim: int, act: str) -> nn.Sequential:
    """3x3/2 average pool (zero padding counted) -> 1x1 conv -> BN -> activation (keys ``1``, ``2``)."""
    return nn.Sequential(nn.AvgPool2d(3, 2, 1), nn.Conv2d(dim, dim, 1, bias=False), nn.BatchNorm2d(dim),
                         activation(act))


class LiteEncoder(nn.Module):
    """DEIMv2's two-level encoder for its smallest sizes: one stride-16 input -> stride 16 and 32 maps.

    The input is projected (1x1 ConvNorm) to ``hidden_dim``; an average-pooling downsample makes
    the stride-32 level, which gets the global context (:class:`GapFusion`); one top-down and one
    bottom-up fusion (sum, then a csp2 :class:`~..detr_common.dfine_encoder.RepNCSPELAN4`).
    Layout: ``input_proj.0.{conv, norm}``, ``down_sample1``, ``down_sample2``, ``bi_fusion.cv``,
    ``fpn_block``, ``pan_block``.
    """

    def __init__(self, in_channels: int, hidden_dim: int, expansion: float, depth_mult: float,
                 act: str = "silu"):
        super().__init__()
        self.input_proj = nn.ModuleList([ConvNorm(in_channels, hidden_dim, 1)])
        self.down_sample1 = _avg_down(hidden_dim, act)
        self.down_sample2 = _avg_down(hidden_dim, act)
        self.bi_fusion = GapFusion(hidden_dim, act)
        branch, depth = round(expansion * hidden_dim // 2), round(3 * depth_mult)
        block = RepNCSPELAN4(hidden_dim, hidden_dim, hidden_dim * 2, branch, depth, act, csp="csp2", tail=True)
        self.fpn_block = block
        self.pan_block = copy.deepcopy(block)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        fine = self.input_proj[0](feats[0])
        coarse = self.bi_fusion(self.down_sample1(fine))
        fine = self.fpn_block(fine + F.interpolate(coarse, scale_factor=2.0, mode="nearest"))
        coarse = self.pan_block(coarse + self.down_sample2(fine))
        return [fine, coarse]


@dataclass(frozen=True)
class DEIMv2Config:
    """One HGNetv2-based size of DEIMv2, as in the published configs (deimv2_hgnetv2_*_coco)."""
    backbone: str                        # HGNetv2 variant
    return_idx: tuple[int, ...]          # backbone stages fed to the encoder
    in_channels: tuple[int, ...]         # their widths
    lite: bool                           # LiteEncoder (one input level) or the hybrid encoder
    hidden_dim: int                      # encoder and decoder width
    expansion: float                     # RepNCSPELAN4 branch width factor
    depth_mult: float                    # RepNCSPELAN4 depth factor
    dec_ffn: int                         # decoder feed-forward width (SwiGLU hidden = half)
    num_queries: int
    num_points: tuple[int, ...]          # deformable sampling points per level
    gateway: bool                        # gated cross-attention merge (else residual + norm2)
    share_bbox_head: bool                # one dec_bbox_head for every decoder layer
    input_size: int                      # training resolution (the checkpoints' imgsz)
    enc_ffn: int = 512                   # AIFI feed-forward width (hybrid encoder only)
    strides: tuple[int, ...] = (16, 32)
    num_layers: int = 3


_LITE = dict(return_idx=(2,), lite=True, expansion=0.34, depth_mult=0.5, num_points=(4, 2), gateway=False,
             share_bbox_head=True)

#: the sizes implemented here (DINOv3-backbone sizes s / m / l / x are not)
DEIMV2_CONFIGS: dict[str, DEIMv2Config] = {
    "atto": DEIMv2Config(backbone="Atto", in_channels=(256,), hidden_dim=64, dec_ffn=160, num_queries=100,
                         input_size=320, **_LITE),
    "femto": DEIMv2Config(backbone="Femto", in_channels=(512,), hidden_dim=96, dec_ffn=256, num_queries=150,
                          input_size=416, **_LITE),
    "pico": DEIMv2Config(backbone="Pico", in_channels=(512,), hidden_dim=112, dec_ffn=320, num_queries=200,
                         input_size=640, **_LITE),
    "n": DEIMv2Config(backbone="B0", return_idx=(2, 3), in_channels=(512, 1024), lite=False, hidden_dim=128,
                      expansion=0.34, depth_mult=0.5, dec_ffn=512, num_queries=300, num_points=(6, 6),
                      gateway=True, share_bbox_head=False, input_size=640),
}


class DEIMv2Net(DetrNet):
    """Backbone -> encoder -> DEIMv2 decoder; ``forward(x, targets=None)`` -> dict."""

    def __init__(self, cfg: DEIMv2Config, nc: int = 80):
        d = cfg.hidden_dim
        if cfg.lite:
            encoder: nn.Module = LiteEncoder(cfg.in_channels[0], d, cfg.expansion, cfg.depth_mult)
        else:
            encoder = DFineHybridEncoder(cfg.in_channels, d, dim_feedforward=cfg.enc_ffn,
                                         use_encoder_idx=(len(cfg.in_channels) - 1,), expansion=cfg.expansion,
                                         depth_mult=cfg.depth_mult, csp_type="csp2", elan_tail=True,
                                         fuse_op="sum", identity_proj=True)

        def layer(i: int) -> nn.Module:
            return DEIMv2DecoderLayer(d, 8, cfg.dec_ffn, cfg.num_points, cfg.gateway)

        super().__init__(
            HGNetv2(cfg.backbone, use_lab=True, return_idx=cfg.return_idx),
            encoder,
            deimv2_style_decoder(nc, d, num_queries=cfg.num_queries, strides=cfg.strides,
                                 num_points=cfg.num_points, num_layers=cfg.num_layers, eval_size=cfg.input_size,
                                 layer_factory=layer, share_bbox_head=cfg.share_bbox_head))
        self.cfg = cfg

    @torch.no_grad()
    def fuse(self) -> "DEIMv2Net":
        """Fold BatchNorms into convolutions and merge each RepVGG pair (inference only)."""
        super().fuse()
        for m in list(self.modules()):
            if isinstance(m, ConvBNAct):
                m.fuse()
        return self
