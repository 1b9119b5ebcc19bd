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
and the D-FINE hybrid encoder with sum fusion and "csp2" blocks. Sizes s / m / l / x
(:data:`DINO_SIZES`) use a ViT distilled from or equal to DINOv3 plus DEIMv2's Spatial Tuning
Adapter (:class:`DINOv3STABackbone`), the hybrid encoder in its "deim" version (csp2 blocks
without the trailing 3x3 convs) on strides 8 / 16 / 32, and 4 (x: 6) gated decoder layers:

- s: ViT-Tiny (192 wide, 3 heads), blocks 3 / 7 / 11; adapter stem 16; width 192; encoder
  FFN 512, expansion 0.34, depth 0.67; decoder FFN 512.
- m: ViT-Tiny+ (256 wide, 4 heads), blocks 3 / 7 / 11; adapter stem 16; width 256; encoder
  FFN 512, expansion 0.67, depth 1.0; decoder FFN 512.
- l: DINOv3 ViT-S/16 (384 wide, 6 heads), blocks 5 / 8 / 11; adapter stem 32; width 224;
  encoder FFN 896, expansion 1.0, depth 1.0; decoder FFN 1792.
- x: DINOv3 ViT-S+/16 (384 wide, 6 heads, SwiGLU), blocks 5 / 8 / 11; adapter stem 64;
  width 256; encoder FFN 1024, expansion 1.25, depth 1.37; decoder FFN 2048, 6 layers.

(Intellindust-AI-Lab/DEIMv2, configs/deimv2/deimv2_dinov3_{s,m,l,x}_coco.yml.) These sizes take
RGB normalised with the ImageNet mean/std (the model wrapper applies it, see ``Deimv2``).

Layout (checkpoint keys): ``backbone.*`` (:class:`~..detr_common.hgnetv2.HGNetv2`, or
:class:`DINOv3STABackbone` for s-x), ``encoder.*``, ``decoder.*``
(:class:`~..detr_common.dfine_decoder.DFineDecoder` with the DEIMv2 options and
:class:`DEIMv2DecoderLayer`). No fixture pins the s-x layout: its backbone keys follow the
upstream module names as read from the reference code (``backbone.dinov3._model.*`` for the
ViT-Tiny sizes, ``backbone.dinov3.*`` for the DINOv3 ones, ``backbone.sta.*``,
``backbone.convs.*``, ``backbone.norms.*``), but no released checkpoint has been loaded to
confirm them.

Input: RGB in [0, 1], no mean/std (atto-n). Eval output: ``{"pred_logits": (B, Q, nc)
pre-sigmoid, "pred_boxes": (B, Q, 4) normalised cx, cy, w, h}``, Q = ``num_queries`` of the size.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..detr_common.dfine_decoder import DEIMV2_MODULE_ORDER, DFineDecoder, FDRDeformableAttention, Gate
from ..detr_common.dfine_encoder import DFineHybridEncoder, RepNCSPELAN4
from ..detr_common.hgnetv2 import ConvBNAct, HGNetv2
from ..detr_common.layers import ConvNorm, activation, fold_conv_bn
from ..detr_common.net import DetrNet

if TYPE_CHECKING:
    from ..ec.backbone import ECViT

#: sizes whose backbone is a DINOv3-derived ViT with the Spatial Tuning Adapter
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
class DinoSpec:
    """The ViT + Spatial Tuning Adapter backbone of one DEIMv2 size s-x."""
    embed_dim: int                       # ViT width
    num_heads: int
    interaction_indexes: tuple[int, ...]  # ViT blocks whose tokens make the stride 8 / 16 / 32 levels
    conv_inplane: int                    # adapter stem width (levels: 2x, 4x, 4x of it)
    out_dim: int                         # width of the three output levels
    dinov3: bool                         # DINOv3 ViT-S(+) (else DEIMv2's distilled ViT-Tiny(+))
    ffn_ratio: float = 4.0
    ffn: str = "mlp"                     # "swiglu" in ViT-S+


class _TinyViTHolder(nn.Module):
    """Holds the ViT-Tiny as ``_model``: the reference wraps it so, and its keys carry the name."""

    def __init__(self, vit: ECViT):
        super().__init__()
        self._model = vit


def _fold_pairs(seq: nn.Sequential) -> None:
    """Fold every BatchNorm2d that directly follows a Conv2d in ``seq`` (inference only)."""
    names = list(seq._modules)
    for a, b in zip(names[:-1], names[1:]):
        conv, bn = seq._modules[a], seq._modules[b]
        if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
            seq._modules[a] = fold_conv_bn(conv, bn)
            seq._modules[b] = nn.Identity()


class SpatialTuningAdapter(nn.Module):
    """DEIMv2's STA detail branch: a small CNN on the image giving stride 8, 16 and 32 maps of
    width 2c, 4c, 4c (c = ``inplanes``), which are concatenated to the ViT's resampled tokens.

    stem: 3x3/2 conv -> BN -> GELU -> 3x3/2 max-pool (stride 4); then three 3x3/2 conv -> BN
    stages (the last two preceded by a GELU). Keys: ``stem.{0,1}``, ``conv2.{0,1}``,
    ``conv3.{1,2}``, ``conv4.{1,2}`` (upstream ``SpatialPriorModulev2``).
    """

    def __init__(self, inplanes: int):
        super().__init__()
        c = inplanes

        def conv(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, 2, 1, bias=False), nn.BatchNorm2d(c_out)]

        self.stem = nn.Sequential(*conv(3, c), nn.GELU(), nn.MaxPool2d(3, 2, 1))
        self.conv2 = nn.Sequential(*conv(c, 2 * c))
        self.conv3 = nn.Sequential(nn.GELU(), *conv(2 * c, 4 * c))
        self.conv4 = nn.Sequential(nn.GELU(), *conv(4 * c, 4 * c))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        s8 = self.conv2(self.stem(x))
        s16 = self.conv3(s8)
        return [s8, s16, self.conv4(s16)]

    @torch.no_grad()
    def fuse(self) -> None:
        for seq in (self.stem, self.conv2, self.conv3, self.conv4):
            _fold_pairs(seq)


class DINOv3STABackbone(nn.Module):
    """ViT + Spatial Tuning Adapter -> three maps of width ``out_dim`` at strides 8, 16, 32.

    The tokens of the three ``interaction_indexes`` blocks (1/16 grid) are resampled
    bilinearly to 2x (stride 8), kept (stride 16) and halved (stride 32); each is concatenated
    with the adapter's map of that stride and projected by a bias-free 1x1 conv + BatchNorm
    (``convs.<i>``, ``norms.<i>``). The ViT is :class:`~..ec.backbone.ECViT` with DINOv3 options:
    ViT-Tiny(+) (s, m: one 16x16 patch conv, a ``cls_token``, LayerNorm eps 1e-6, GELU MLP, the
    raw block outputs) under ``dinov3._model``; DINOv3 ViT-S/16(+) (l, x: 4 register tokens, a
    ``mask_token``, LayerScale 1e-5, LayerNorm eps 1e-5, masked key bias, the final norm applied
    to each taken block, RoPE coordinates rescaled by up to 2x while training, SwiGLU in S+)
    under ``dinov3``. Input: ImageNet-normalised RGB, sides a multiple of 32.
    """

    def __init__(self, spec: DinoSpec):
        super().__init__()
        # imported here: the ec package imports this module (its decoder is deimv2_style_decoder)
        from ..ec.backbone import ECViT
        common = dict(embed_dim=spec.embed_dim, num_heads=spec.num_heads, depth=12, ffn_ratio=spec.ffn_ratio,
                      return_layers=spec.interaction_indexes, patch_embed="conv", token_name="cls_token",
                      rope_fp32=True)
        if spec.dinov3:
            self.dinov3: nn.Module = ECViT(**common, num_storage_tokens=4, mask_token=True, norm_eps=1e-5,
                                           layer_scale=1e-5, ffn=spec.ffn, mask_k_bias=True, final_norm=True,
                                           rope_rescale=2.0)
        else:
            self.dinov3 = _TinyViTHolder(ECViT(**common, ffn=spec.ffn))
        self.sta = SpatialTuningAdapter(spec.conv_inplane)
        c, e = spec.conv_inplane, spec.embed_dim
        self.convs = nn.ModuleList(nn.Conv2d(e + k * c, spec.out_dim, 1, bias=False) for k in (2, 4, 4))
        self.norms = nn.ModuleList(nn.BatchNorm2d(spec.out_dim) for _ in range(3))
        self.out_channels = [spec.out_dim] * 3

    @property
    def vit(self) -> ECViT:
        return self.dinov3._model if isinstance(self.dinov3, _TinyViTHolder) else self.dinov3

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs, h, w = self.vit(x)
        b = x.shape[0]
        sem = [t.transpose(1, 2).reshape(b, -1, h, w) for t in outs]
        # strides 8 / 16 / 32 from the 1/16 grid (a same-size bilinear resample is the identity)
        sem[0] = F.interpolate(sem[0], size=(h * 2, w * 2), mode="bilinear", align_corners=False)
        sem[2] = F.interpolate(sem[2], size=(h // 2, w // 2), mode="bilinear", align_corners=False)
        detail = self.sta(x)
        return [norm(conv(torch.cat((s, d), 1)))
                for conv, norm, s, d in zip(self.convs, self.norms, sem, detail)]

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the adapter's and the projections' BatchNorms (inference only)."""
        self.sta.fuse()
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            if isinstance(norm, nn.BatchNorm2d):
                self.convs[i] = fold_conv_bn(conv, norm)
                self.norms[i] = nn.Identity()


@dataclass(frozen=True)
class DEIMv2Config:
    """One size of DEIMv2, as in the published configs (deimv2_hgnetv2_*_coco, deimv2_dinov3_*_coco)."""
    backbone: str                        # HGNetv2 variant, or the ViT's upstream name (s-x)
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
    vit: DinoSpec | None = None          # s-x: the ViT + adapter backbone (then return_idx is unused)
    elan_tail: bool = True               # hybrid encoder: ELAN branches end with a 3x3 ConvNorm


_LITE = dict(return_idx=(2,), lite=True, expansion=0.34, depth_mult=0.5, num_points=(4, 2), gateway=False,
             share_bbox_head=True)

def _dino(backbone: str, spec: DinoSpec, *, expansion: float, depth_mult: float, enc_ffn: int, dec_ffn: int,
          num_layers: int = 4) -> DEIMv2Config:
    d = spec.out_dim
    return DEIMv2Config(backbone=backbone, return_idx=spec.interaction_indexes, in_channels=(d, d, d), lite=False,
                        hidden_dim=d, expansion=expansion, depth_mult=depth_mult, dec_ffn=dec_ffn, num_queries=300,
                        num_points=(3, 6, 3), gateway=True, share_bbox_head=False, input_size=640,
                        enc_ffn=enc_ffn, strides=(8, 16, 32), num_layers=num_layers, vit=spec, elan_tail=False)


#: every DEIMv2 size
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
    "s": _dino("vit_tiny", DinoSpec(192, 3, (3, 7, 11), 16, 192, dinov3=False),
               expansion=0.34, depth_mult=0.67, enc_ffn=512, dec_ffn=512),
    "m": _dino("vit_tinyplus", DinoSpec(256, 4, (3, 7, 11), 16, 256, dinov3=False),
               expansion=0.67, depth_mult=1.0, enc_ffn=512, dec_ffn=512),
    "l": _dino("dinov3_vits16", DinoSpec(384, 6, (5, 8, 11), 32, 224, dinov3=True),
               expansion=1.0, depth_mult=1.0, enc_ffn=896, dec_ffn=1792),
    "x": _dino("dinov3_vits16plus", DinoSpec(384, 6, (5, 8, 11), 64, 256, dinov3=True, ffn_ratio=6.0, ffn="swiglu"),
               expansion=1.25, depth_mult=1.37, enc_ffn=1024, dec_ffn=2048, num_layers=6),
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
                                         depth_mult=cfg.depth_mult, csp_type="csp2", elan_tail=cfg.elan_tail,
                                         fuse_op="sum", identity_proj=True)
        backbone: nn.Module = (DINOv3STABackbone(cfg.vit) if cfg.vit is not None else
                               HGNetv2(cfg.backbone, use_lab=True, return_idx=cfg.return_idx))

        def layer(i: int) -> nn.Module:
            return DEIMv2DecoderLayer(d, 8, cfg.dec_ffn, cfg.num_points, cfg.gateway)

        super().__init__(
            backbone,
            encoder,
            deimv2_style_decoder(nc, d, num_queries=cfg.num_queries, strides=cfg.strides,
                                 num_points=cfg.num_points, num_layers=cfg.num_layers, eval_size=cfg.input_size,
                                 layer_factory=layer, share_bbox_head=cfg.share_bbox_head))
        self.cfg = cfg

    @torch.no_grad()
    def fuse(self) -> DEIMv2Net:
        """Fold BatchNorms into convolutions and merge each RepVGG pair (inference only)."""
        super().fuse()
        for m in list(self.modules()):
            if isinstance(m, (ConvBNAct, DINOv3STABackbone)):
                m.fuse()
        return self
