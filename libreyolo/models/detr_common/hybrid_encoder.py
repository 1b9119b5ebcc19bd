"""RT-DETR's hybrid encoder: per-level input projections, an intra-scale transformer (AIFI)
on the coarsest map, and a cross-scale CNN fusion (top-down FPN + bottom-up PAN) built from
CSPRepLayers of RepVGG blocks.

Checkpoint layout: ``input_proj.{i}.{0,1}`` (conv, BatchNorm), ``encoder.{j}.layers.{k}``
(self_attn, linear1, linear2, norm1, norm2), ``lateral_convs``, ``fpn_blocks``,
``downsample_convs``, ``pan_blocks``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import ConvNorm, activation, fold_conv_bn


def sincos_pos_embed_2d(w: int, h: int, dim: int, temperature: float = 10000.0,
                        device: torch.device | None = None) -> torch.Tensor:
    """(1, w*h, dim) fixed 2D sine-cosine position embedding.

    Channels: [sin(x*f), cos(x*f), sin(y*f), cos(y*f)] with dim/4 frequencies f each. Token t
    gets x = t // h and y = t % h: the reference enumerates the grid width-major, and trained
    weights depend on that exact assignment, so it is kept (the two agree on square maps up to
    a transpose of the grid).
    """
    if dim % 4:
        raise ValueError(f"the embedding dim must be divisible by 4 for a 2D sin-cos embedding, got {dim}")
    quarter = dim // 4
    freq = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32, device=device) / quarter)
    xs = torch.arange(w, dtype=torch.float32, device=device).repeat_interleave(h)
    ys = torch.arange(h, dtype=torch.float32, device=device).repeat(w)
    px, py = xs[:, None] * freq[None], ys[:, None] * freq[None]
    return torch.cat((px.sin(), px.cos(), py.sin(), py.cos()), 1)[None]


class EncoderLayer(nn.Module):
    """Post-norm transformer encoder layer; the position embedding is added to queries and keys."""

    def __init__(self, d_model: int, nhead: int, dim_ff: int, act: str = "gelu"):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_ff)
        self.linear2 = nn.Linear(dim_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.act = activation(act)

    def forward(self, src: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        qk = src + pos
        attn = self.self_attn(qk, qk, src, need_weights=False)[0]
        src = self.norm1(src + attn)
        return self.norm2(src + self.linear2(self.act(self.linear1(src))))


class TransformerEncoder(nn.Module):
    """A stack of :class:`EncoderLayer` (AIFI); checkpoint name ``layers``."""

    def __init__(self, num_layers: int, d_model: int, nhead: int, dim_ff: int, act: str = "gelu"):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d_model, nhead, dim_ff, act) for _ in range(num_layers))

    def forward(self, src: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            src = layer(src, pos)
        return src


class RepVggBlock(nn.Module):
    """3x3 ConvNorm + 1x1 ConvNorm summed, then the activation; re-parameterizable to one conv."""

    def __init__(self, c_in: int, c_out: int, act: str = "silu"):
        super().__init__()
        self.conv1 = ConvNorm(c_in, c_out, 3, 1)
        self.conv2 = ConvNorm(c_in, c_out, 1, 1)
        self.act = activation(act)
        self.fused: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.act(self.fused(x))
        return self.act(self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Merge both branches (BatchNorms folded, the 1x1 padded to 3x3) into ``self.fused``."""
        if self.fused is not None:
            return
        a = fold_conv_bn(self.conv1.conv, self.conv1.norm)
        b = fold_conv_bn(self.conv2.conv, self.conv2.norm)
        a.weight.add_(F.pad(b.weight, (1, 1, 1, 1)))
        a.bias.add_(b.bias)
        self.fused = a
        del self.conv1, self.conv2


class CSPRepLayer(nn.Module):
    """Two 1x1 ConvNorm branches, one through ``n`` RepVGG blocks, summed and projected by conv3."""

    def __init__(self, c_in: int, c_out: int, n: int = 3, expansion: float = 1.0, act: str = "silu"):
        super().__init__()
        hidden = int(c_out * expansion)
        self.conv1 = ConvNorm(c_in, hidden, 1, 1, act=act)
        self.conv2 = ConvNorm(c_in, hidden, 1, 1, act=act)
        self.bottlenecks = nn.Sequential(*[RepVggBlock(hidden, hidden, act) for _ in range(n)])
        self.conv3 = ConvNorm(hidden, c_out, 1, 1, act=act) if hidden != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


class HybridEncoder(nn.Module):
    """Projects backbone maps to ``hidden_dim``, runs AIFI on ``use_encoder_idx`` levels, then
    fuses top-down and bottom-up. Returns one ``hidden_dim`` map per input level (fine to coarse).
    """

    #: how two maps meet in the FPN/PAN: "cat" (channel concat, RT-DETR / D-FINE) or "sum"
    #: (DEIMv2 / ECDet, whose fusion blocks then take ``hidden_dim`` channels); set by subclasses
    fuse_op: str = "cat"

    def __init__(self, in_channels: list[int], hidden_dim: int = 256, *, nhead: int = 8,
                 dim_feedforward: int = 1024, enc_act: str = "gelu", use_encoder_idx: tuple[int, ...] = (2,),
                 num_encoder_layers: int = 1, pe_temperature: float = 10000.0, expansion: float = 1.0,
                 depth_mult: float = 1.0, act: str = "silu"):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = tuple(use_encoder_idx)
        self.pe_temperature = pe_temperature
        self.input_proj = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, hidden_dim, 1, bias=False), nn.BatchNorm2d(hidden_dim))
            for c in in_channels)
        self.encoder = nn.ModuleList(
            TransformerEncoder(num_encoder_layers, hidden_dim, nhead, dim_feedforward, enc_act)
            for _ in self.use_encoder_idx)
        n_blocks = round(3 * depth_mult)
        levels = len(in_channels)
        self.lateral_convs = nn.ModuleList(ConvNorm(hidden_dim, hidden_dim, 1, 1, act=act)
                                           for _ in range(levels - 1))
        self.fpn_blocks = nn.ModuleList(CSPRepLayer(2 * hidden_dim, hidden_dim, n_blocks, expansion, act)
                                        for _ in range(levels - 1))
        self.downsample_convs = nn.ModuleList(ConvNorm(hidden_dim, hidden_dim, 3, 2, act=act)
                                              for _ in range(levels - 1))
        self.pan_blocks = nn.ModuleList(CSPRepLayer(2 * hidden_dim, hidden_dim, n_blocks, expansion, act)
                                        for _ in range(levels - 1))

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        proj = [p(f) for p, f in zip(self.input_proj, feats)]
        for enc, idx in zip(self.encoder, self.use_encoder_idx):
            b, c, h, w = proj[idx].shape
            pos = sincos_pos_embed_2d(w, h, self.hidden_dim, self.pe_temperature, proj[idx].device)
            tokens = enc(proj[idx].flatten(2).transpose(1, 2), pos.to(proj[idx].dtype))
            proj[idx] = tokens.transpose(1, 2).reshape(b, c, h, w)
        # top-down: the coarser map is reduced by a lateral conv, upsampled and fused
        inner = [proj[-1]]
        for k, low in enumerate(reversed(proj[:-1])):
            high = self.lateral_convs[k](inner[0])
            inner[0] = high
            up = F.interpolate(high, scale_factor=2.0, mode="nearest")
            inner.insert(0, self.fpn_blocks[k](self._merge(up, low)))
        # bottom-up: the finer output is downsampled and fused with the next top-down map
        outs = [inner[0]]
        for k in range(len(inner) - 1):
            down = self.downsample_convs[k](outs[-1])
            outs.append(self.pan_blocks[k](self._merge(down, inner[k + 1])))
        return outs

    def _merge(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b if self.fuse_op == "sum" else torch.cat((a, b), 1)
