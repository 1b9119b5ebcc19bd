"""ECSeg network: ECDet with EdgeCrafter's instance-mask head (after RF-DETR's segmentation head).

The detector is unchanged (:class:`.nn.ECNet`); its decoder also returns the evaluated layer's
queries (in training, every layer's), and :class:`ECSegHead` (checkpoint prefix ``decoder.decoder.segmentation_head``, after the
decoder layers' LQE heads) turns them into per-query mask logits:

* spatial side: the encoder's finest map (stride 8) is resized bilinearly to a FIXED grid of
  ``mask_size`` = (native input / 4)^2 = 160 x 160 cells, whatever the input size, so the grid
  always spans the whole input; then depthwise-conv blocks (:class:`DepthwiseConvBlock`: 3x3
  depthwise conv, channels-last LayerNorm, Linear, GELU, residual) and a 1x1 projection
  (``spatial_features_proj``);
* query side: an MLP block (:class:`MLPBlock`: LayerNorm, Linear to 4x, GELU, Linear back,
  residual) and a Linear projection (``query_features_proj``);
* mask logits = <query feature, spatial feature> + a learned scalar ``bias``.

The head holds one block per decoder layer. The original applies them in sequence, one more per
layer whose mask it makes: in eval only the evaluated (last) layer's queries are passed, so only
the first block runs; in training every layer's queries are, so layer i's mask uses the feature
after blocks 0..i and the last layer's has passed through every block. This network does the same.

Eval output: the detector's ``{"pred_logits", "pred_boxes"}`` plus ``"pred_masks"`` (B, Q, 160, 160)
mask LOGITS (no sigmoid; threshold 0). ``with_mask_parts=True`` returns the factors instead
(``"mask_embed"`` (B, Q, D) and ``"mask_feature"`` (B, D, 160, 160), whose dot product plus the
bias is the logits), so predict builds only the kept instances' masks.

Training format (the decoder in training mode, also the validation loss's pass): the masks of every
decoder layer (the final set, ``aux_outputs``) and every denoising layer (``dn_outputs``), as the
original supervises them, given as factors for :class:`~..detr_common.mask_loss.DetrMaskLoss`:
each set's ``"mask_embed"`` (B, Q, D) and ``"mask_feature"`` (B, D, 160, 160), its layer's
feature (a denoising layer shares its decoder layer's), and the top-level ``"mask_bias"``; so the
loss builds only the matched queries' masks.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .nn import INPUT_SIZE, STRIDES, ECConfig, ECNet

#: the mask grid's side: the native input size over the head's downsampling ratio (4)
MASK_SIZE = INPUT_SIZE // 4


class DepthwiseConvBlock(nn.Module):
    """3x3 depthwise conv -> LayerNorm over channels (eps 1e-6) -> Linear -> GELU, plus the input."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.act(self.pwconv1(self.norm(y)))
        return y.permute(0, 3, 1, 2) + x


class MLPBlock(nn.Module):
    """LayerNorm -> Linear (4x) -> GELU -> Linear, plus the input (keys ``norm_in``, ``layers.{0,2}``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm_in = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm_in(x)
        for layer in self.layers:
            y = layer(y)
        return y + x


def spatial_pass(feature: torch.Tensor, blocks, proj: nn.Module, mask_size: int) -> list[torch.Tensor]:
    """The mask head's spatial side: ``feature`` resized to the ``mask_size`` grid, then after each
    of ``blocks`` its projection (the list in block order)."""
    y = F.interpolate(feature, size=(mask_size, mask_size), mode="bilinear", align_corners=False)
    out = []
    for block in blocks:
        y = block(y)
        out.append(proj(y))
    return out


class ECSegHead(nn.Module):
    """Per-query mask logits on a fixed ``mask_size`` grid (see the module docstring)."""

    def __init__(self, dim: int, num_blocks: int, mask_size: int = MASK_SIZE):
        super().__init__()
        self.mask_size = int(mask_size)
        self.bias = nn.Parameter(torch.zeros(1))
        self.blocks = nn.ModuleList(DepthwiseConvBlock(dim) for _ in range(num_blocks))
        self.spatial_features_proj = nn.Conv2d(dim, dim, kernel_size=1)
        self.query_features_block = MLPBlock(dim)
        self.query_features_proj = nn.Linear(dim, dim)

    def spatial(self, feature: torch.Tensor, depth: int = 1) -> torch.Tensor:
        """(B, C, h, w) finest encoder map -> (B, D, S, S) projected mask feature after the first
        ``depth`` blocks (S = ``mask_size``)."""
        self._check_depth(depth)
        y = self._grid(feature)
        for block in self.blocks[:depth]:
            y = block(y)
        return self.spatial_features_proj(y)

    def spatial_layers(self, feature: torch.Tensor, count: int) -> list[torch.Tensor]:
        """The projected mask features after the first 1, 2, ..., ``count`` blocks (one per
        decoder layer, in layer order), computed in one pass: element i equals
        ``spatial(feature, i + 1)``."""
        self._check_depth(count)
        return spatial_pass(feature, self.blocks[:count], self.spatial_features_proj, self.mask_size)

    def _check_depth(self, depth: int) -> None:
        if not 1 <= depth <= len(self.blocks):
            raise ValueError(f"depth must be in [1, {len(self.blocks)}], got {depth}")

    def _grid(self, feature: torch.Tensor) -> torch.Tensor:
        return F.interpolate(feature, size=(self.mask_size, self.mask_size), mode="bilinear", align_corners=False)

    def embed(self, queries: torch.Tensor) -> torch.Tensor:
        """(B, Q, C) decoder queries -> (B, Q, D) mask embeddings."""
        return self.query_features_proj(self.query_features_block(queries))

    def logits(self, embed: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """(B, Q, D) embeddings x (B, D, S, S) feature -> (B, Q, S, S) mask logits."""
        return torch.einsum("bqc,bchw->bqhw", embed, feature) + self.bias.to(feature.dtype)


class ECSegFront(nn.Module):
    """The training seam of :class:`ECSegNet`: backbone, encoder and the mask head's spatial side
    (grid resize, every block, projection) as one module (the same parameters, never attached to
    the net) -> ``(*pyramid, one mask feature per decoder layer)``. Fixed-shape for a given image
    size (the grid is fixed whatever the size). It holds only the modules its forward uses: a
    captured forward+backward differentiates every parameter it holds, and the head's query side
    (its MLP and projection) and bias belong to the eager rest."""

    def __init__(self, net: ECSegNet):
        super().__init__()
        head = net.mask_head
        self.backbone = net.backbone
        self.encoder = net.encoder
        self.blocks = head.blocks
        self.spatial_features_proj = head.spatial_features_proj
        self.mask_size = head.mask_size

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pyramid = self.encoder(self.backbone(x))
        return (*pyramid, *spatial_pass(pyramid[0], self.blocks, self.spatial_features_proj, self.mask_size))


class ECSegNet(ECNet):
    """ECDet + :class:`ECSegHead` (``decoder.decoder.segmentation_head.*``); ``forward(x, targets=None,
    with_mask_parts=False)`` -> dict (see the module docstring)."""

    def __init__(self, cfg: ECConfig, nc: int = 80, mask_size: int = MASK_SIZE):
        super().__init__(cfg, nc)
        self.decoder.return_queries = True
        stack = self.decoder.decoder
        stack.segmentation_head = ECSegHead(cfg.hidden_dim, len(stack.layers), mask_size)

    @property
    def mask_head(self) -> ECSegHead:
        return self.decoder.decoder.segmentation_head

    def forward(self, x: torch.Tensor, targets: Any = None, with_mask_parts: bool = False) -> dict[str, Any]:
        head = self.mask_head
        front = self.__dict__.get("front_override")   # the training seam (ECSegFront), when one is set
        if front is not None:
            parts = front(x)   # the pyramid, then (ECSegFront) the layers' mask features
            feats, layer_features = list(parts[:len(STRIDES)]), list(parts[len(STRIDES):]) or None
        else:
            feats, layer_features = self.encoder(self.backbone(x)), None
            if self.decoder.training:   # before the decoder, as in the seam: the same backward, bit for bit
                layer_features = head.spatial_layers(feats[0], len(head.blocks))
        out = self.decoder(feats, targets)
        if self.decoder.training:
            return self._training_masks(out, layer_features)
        embed = head.embed(out.pop("queries"))
        feature = layer_features[0] if layer_features is not None else head.spatial(feats[0], 1)
        if with_mask_parts:
            out["mask_embed"], out["mask_feature"] = embed, feature
            return out
        out["pred_masks"] = head.logits(embed, feature)
        return out

    def _training_masks(self, out: dict[str, Any], layer_features: list[torch.Tensor]) -> dict[str, Any]:
        """Every decoder layer's and denoising layer's mask factors into the training dict (see the
        module docstring): layer i's queries with the feature after blocks 0..i."""
        head = self.mask_head
        layers = [*out.get("aux_outputs", ()), out]
        dn_layers = list(out.get("dn_outputs", ()))
        if len(layers) != len(layer_features) or (dn_layers and len(dn_layers) != len(layer_features)):
            raise RuntimeError(f"{len(layers)} decoder layers and {len(dn_layers)} denoising layers returned, "
                               f"{len(layer_features)} mask features")
        for group in (layers, dn_layers):
            for o, feature in zip(group, layer_features):
                o["mask_embed"] = head.embed(o.pop("queries"))
                o["mask_feature"] = feature
        out["mask_bias"] = head.bias
        return out
