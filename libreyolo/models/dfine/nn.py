"""D-FINE network: HGNetv2 backbone + D-FINE hybrid encoder + FDR decoder.

DEIM and RT-DETRv4 reuse this network unchanged (they differ in training recipe and in the
decoder activations), so :class:`DFineConfig` and :class:`DFineNet` are the shared assembly and
each family folder only holds its size table. Layout (checkpoint keys): ``backbone.*``
(:class:`~..detr_common.hgnetv2.HGNetv2`), ``encoder.*``
(:class:`~..detr_common.dfine_encoder.DFineHybridEncoder`), ``decoder.*``
(:class:`~..detr_common.dfine_decoder.DFineDecoder`).

Input: RGB in [0, 1], no mean/std. Eval output: ``{"pred_logits": (B, 300, nc) pre-sigmoid,
"pred_boxes": (B, 300, 4) normalised cx, cy, w, h}``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..detr_common.dfine_decoder import DFineDecoder
from ..detr_common.dfine_encoder import DFineHybridEncoder
from ..detr_common.hgnetv2 import ConvBNAct, HGNetv2
from ..detr_common.layers import MLP
from ..detr_common.mask import MaskDecoder, mask_embedding, query_masks
from ..detr_common.net import DetrNet


@dataclass(frozen=True)
class DFineConfig:
    """One size of the D-FINE line, as in the published configs."""
    backbone: str                        # HGNetv2 variant
    use_lab: bool                        # learnable affine after backbone activations
    frozen_norm: bool                    # backbone BatchNorms frozen (no num_batches_tracked key)
    return_idx: tuple[int, ...]          # backbone stages fed to the encoder
    in_channels: tuple[int, ...]         # their widths
    strides: tuple[int, ...]             # their strides
    enc_dim: int                         # encoder hidden width
    enc_ffn: int                         # AIFI feed-forward width
    expansion: float                     # RepNCSPELAN4 branch width factor
    depth_mult: float                    # RepNCSPELAN4 depth factor
    use_encoder_idx: tuple[int, ...]     # levels that get the AIFI transformer
    dec_dim: int                         # decoder hidden width
    dec_ffn: int                         # decoder feed-forward width
    num_layers: int                      # decoder layers
    num_points: tuple[int, ...]          # deformable sampling points per level
    reg_scale: float                     # curvature of the FDR weighting function
    activation: str = "relu"             # decoder FFN + LQE activation
    mlp_act: str = "relu"                # box / query-position MLP activation


_S = dict(backbone="B0", use_lab=True, frozen_norm=False, return_idx=(1, 2, 3), in_channels=(256, 512, 1024),
          strides=(8, 16, 32), enc_dim=256, enc_ffn=1024, expansion=0.5, depth_mult=0.34, use_encoder_idx=(2,),
          dec_dim=256, dec_ffn=1024, num_layers=3, num_points=(3, 6, 3), reg_scale=4.0)

#: the D-FINE sizes (D-FINE's configs dfine_hgnetv2_{n,s,m,l,x}_coco)
DFINE_CONFIGS: dict[str, DFineConfig] = {
    "n": DFineConfig(**{**_S, "return_idx": (2, 3), "in_channels": (512, 1024), "strides": (16, 32),
                        "enc_dim": 128, "enc_ffn": 512, "expansion": 0.34, "depth_mult": 0.5,
                        "use_encoder_idx": (1,), "dec_dim": 128, "dec_ffn": 512, "num_points": (6, 6)}),
    "s": DFineConfig(**_S),
    "m": DFineConfig(**{**_S, "backbone": "B2", "in_channels": (384, 768, 1536), "expansion": 1.0,
                        "depth_mult": 0.67, "num_layers": 4}),
    "l": DFineConfig(**{**_S, "backbone": "B4", "use_lab": False, "frozen_norm": True,
                        "in_channels": (512, 1024, 2048), "expansion": 1.0, "depth_mult": 1.0, "num_layers": 6}),
    "x": DFineConfig(**{**_S, "backbone": "B5", "use_lab": False, "frozen_norm": True,
                        "in_channels": (512, 1024, 2048), "enc_dim": 384, "enc_ffn": 2048, "expansion": 1.0,
                        "depth_mult": 1.0, "num_layers": 6, "reg_scale": 8.0}),
}


def with_decoder_activation(act: str, sizes: tuple[str, ...]) -> dict[str, DFineConfig]:
    """D-FINE sizes with another decoder activation (DEIM and RT-DETRv4 use SiLU for both kinds)."""
    return {k: replace(DFINE_CONFIGS[k], activation=act, mlp_act=act) for k in sizes}


class DFineNet(DetrNet):
    """Backbone -> hybrid encoder -> FDR decoder; ``forward(x, targets=None)`` -> dict."""

    def __init__(self, cfg: DFineConfig, nc: int = 80, eval_size: tuple[int, int] | None = (640, 640)):
        levels = len(cfg.in_channels)
        super().__init__(
            HGNetv2(cfg.backbone, use_lab=cfg.use_lab, return_idx=cfg.return_idx, frozen_norm=cfg.frozen_norm),
            DFineHybridEncoder(cfg.in_channels, cfg.enc_dim, dim_feedforward=cfg.enc_ffn,
                               use_encoder_idx=cfg.use_encoder_idx, expansion=cfg.expansion,
                               depth_mult=cfg.depth_mult),
            DFineDecoder(nc, cfg.dec_dim, feat_channels=(cfg.enc_dim,) * levels, feat_strides=cfg.strides,
                         num_levels=levels, num_points=cfg.num_points, num_layers=cfg.num_layers,
                         dim_feedforward=cfg.dec_ffn, activation=cfg.activation, mlp_act=cfg.mlp_act,
                         eval_size=eval_size, reg_scale=cfg.reg_scale))
        self.cfg = cfg

    @torch.no_grad()
    def fuse(self) -> DFineNet:
        """Fold BatchNorms into convolutions and merge each RepVGG pair (inference only)."""
        super().fuse()
        for m in list(self.modules()):
            if isinstance(m, ConvBNAct):
                m.fuse()
        return self


class DFineSegFront(nn.Module):
    """The training seam of :class:`DFineSegNet`: backbone, encoder and mask decoder as one module
    (the same parameters, never attached to the net) -> ``(*pyramid, mask feature)``."""

    def __init__(self, net: DFineSegNet):
        super().__init__()
        self.backbone = net.backbone
        self.encoder = net.encoder
        self.mask_decoder = net.decoder.mask_decoder

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feats = self.backbone(x)
        pyramid = self.encoder(feats[1:])
        return (*pyramid, self.mask_decoder([feats[0], *pyramid]))


class DFineSegNet(DFineNet):
    """D-FINE with an instance-mask head (``decoder.mask_decoder.*``, ``decoder.mask_head.*``).

    The backbone also returns the stage before the encoder's first level (stride / 2); the mask
    decoder fuses it with the encoder outputs into a stride-4 feature (see
    :mod:`..detr_common.mask`). Eval output adds ``"pred_masks"``: (B, Q, H/4, W/4) mask
    probabilities (sigmoid applied); training mode gives each set's mask embeddings and the mask
    feature instead (see :meth:`forward`).
    """

    def __init__(self, cfg: DFineConfig, nc: int = 80, eval_size: tuple[int, int] | None = (640, 640)):
        super().__init__(cfg, nc, eval_size)
        first = cfg.return_idx[0] - 1
        if first < 0:
            raise ValueError("DFineSegNet needs a backbone stage before the encoder's first level")
        self.backbone = HGNetv2(cfg.backbone, use_lab=cfg.use_lab, return_idx=(first, *cfg.return_idx),
                                frozen_norm=cfg.frozen_norm)
        fine = self.backbone.out_channels[0]
        dec = self.decoder
        dec.return_queries = True
        dec.mask_decoder = MaskDecoder((fine,) + (cfg.enc_dim,) * len(cfg.in_channels), cfg.dec_dim)
        dec.mask_head = MLP(cfg.dec_dim, cfg.dec_dim, cfg.dec_dim, 3)
        # checkpoint key order: the mask modules follow the decoder layers (``decoder.decoder``)
        mods = dec._modules
        after = list(mods)[list(mods).index("decoder") + 1:]
        for name in after:
            if name not in ("mask_decoder", "mask_head"):
                mods[name] = mods.pop(name)

    def front(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The fixed-shape part of the forward: the encoder pyramid and the stride-4 mask feature."""
        feats = self.backbone(x)
        pyramid = self.encoder(feats[1:])
        return pyramid, self.decoder.mask_decoder([feats[0], *pyramid])

    def forward(self, x: torch.Tensor, targets: Any = None, with_mask_parts: bool = False) -> dict[str, Any]:
        """As :class:`DFineNet` plus ``"pred_masks"``; ``with_mask_parts`` returns, instead of the
        masks of every query, their factors: ``"mask_embed"`` (B, Q, D) and ``"mask_feature"``
        (B, D, H/4, W/4), whose dot product is the mask logits (predict builds only the kept ones).

        In training format (the decoder in training mode) the masks are always given as factors:
        every output set with queries (the final layer, ``aux_outputs``, ``dn_outputs``) gets its
        ``"mask_embed"`` and the top-level dict ``"mask_feature"``, so the mask loss builds only
        the matched queries' masks (:mod:`..detr_common.mask_loss`)."""
        front = self.__dict__.get("front_override")   # a graphed backbone+encoder+mask decoder while training
        if front is not None:
            *pyramid, feature = front(x)
        else:
            pyramid, feature = self.front(x)
        out = self.decoder(list(pyramid), targets)
        head = self.decoder.mask_head
        if self.decoder.training:
            for o in (out, *out.get("aux_outputs", ()), *out.get("dn_outputs", ())):
                o["mask_embed"] = mask_embedding(head, o.pop("queries"))
            out["mask_feature"] = feature
            return out
        embed = mask_embedding(head, out.pop("queries"))
        if with_mask_parts:
            out["mask_embed"], out["mask_feature"] = embed, feature
            return out
        out["pred_masks"] = query_masks(embed, feature).sigmoid()
        return out
