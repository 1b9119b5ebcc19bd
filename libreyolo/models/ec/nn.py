"""ECDet network (EdgeCrafter): ECViT backbone + hybrid encoder + FDR decoder.

EdgeCrafter (Liu et al. 2026) is the successor of DEIMv2 from the same lab: a compact ViT
(:mod:`.backbone`) whose last two blocks are averaged and resampled into a stride 8/16/32
pyramid, the D-FINE hybrid encoder with sum fusion, "csp2" blocks without the trailing 3x3
convs and a SiLU transformer layer, and the DEIMv2-style FDR decoder (no ``enc_output``, a
3-layer query-position MLP applied once) whose layers are D-FINE's gated layers with the last
LayerNorm named ``norm2``. Four decoder layers, points (3, 6, 3), 300 queries in every size.

Layout (checkpoint keys): ``backbone.{backbone, projector}`` (:class:`.backbone.ECBackbone`),
``encoder.*`` (:class:`~..detr_common.dfine_encoder.DFineHybridEncoder`, no input projections),
``decoder.*`` (:class:`~..detr_common.dfine_decoder.DFineDecoder`).

Input: RGB normalised with the ImageNet mean/std (done by the model wrapper, outside the
network). Eval output: ``{"pred_logits": (B, 300, nc) pre-sigmoid, "pred_boxes": (B, 300, 4)
normalised cx, cy, w, h}``.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..deimv2.nn import deimv2_style_decoder
from ..detr_common.dfine_decoder import FDRDecoderLayer
from ..detr_common.dfine_encoder import DFineHybridEncoder
from ..detr_common.net import DetrNet
from .backbone import ECBackbone


@dataclass(frozen=True)
class ECConfig:
    """One ECDet size, as in EdgeCrafter's configs ecdet_{s,m,l,x}.yml."""
    embed_dim: int              # ViT width
    num_heads: int              # ViT heads
    proj_dim: int | None        # projector width (None: embed_dim, stride-32 level only)
    ffn_ratio: float            # ViT MLP width / embed_dim
    hidden_dim: int             # encoder and decoder width
    enc_ffn: int                # encoder transformer feed-forward width
    expansion: float            # RepNCSPELAN4 branch width factor
    depth_mult: float           # RepNCSPELAN4 depth factor
    dec_ffn: int                # decoder feed-forward width


EC_CONFIGS: dict[str, ECConfig] = {
    "s": ECConfig(192, 3, None, 4.0, 192, 512, 0.34, 0.67, 512),
    "m": ECConfig(256, 4, None, 4.0, 256, 512, 0.75, 0.67, 1024),
    "l": ECConfig(384, 6, 256, 4.0, 256, 1024, 0.75, 1.0, 1024),
    "x": ECConfig(384, 6, 256, 6.0, 256, 2048, 1.5, 1.0, 2048),
}

STRIDES = (8, 16, 32)
NUM_POINTS = (3, 6, 3)
INPUT_SIZE = 640


class ECNet(DetrNet):
    """Backbone -> hybrid encoder -> FDR decoder; ``forward(x, targets=None)`` -> dict."""

    def __init__(self, cfg: ECConfig, nc: int = 80):
        d = cfg.hidden_dim
        backbone = ECBackbone(cfg.embed_dim, cfg.num_heads, cfg.proj_dim, cfg.ffn_ratio)
        encoder = DFineHybridEncoder(tuple(backbone.out_channels), d, dim_feedforward=cfg.enc_ffn, enc_act="silu",
                                     use_encoder_idx=(2,), expansion=cfg.expansion, depth_mult=cfg.depth_mult,
                                     csp_type="csp2", elan_tail=False, fuse_op="sum", identity_proj=True)

        def layer(i: int) -> nn.Module:
            return FDRDecoderLayer(d, 8, cfg.dec_ffn, NUM_POINTS, act="silu", out_norm="norm2")

        super().__init__(backbone, encoder,
                         deimv2_style_decoder(nc, d, num_queries=300, strides=STRIDES, num_points=NUM_POINTS,
                                              num_layers=4, eval_size=INPUT_SIZE, layer_factory=layer))
        self.cfg = cfg
