"""BiRefNet (bilateral reference network) for high-resolution dichotomous segmentation / matting.

Layout follows the LibreYOLO checkpoints (pinned for size t by the ``birefnet-t`` fixture):

* ``bb``: a Swin Transformer v1 backbone in the original (Microsoft) layout - ``patch_embed``
  (4x4 stride-4 conv + LayerNorm), ``layers.i.blocks.j`` (``norm1``, ``attn`` with ``qkv``,
  ``proj``, ``relative_position_bias_table`` and the persistent ``relative_position_index``,
  ``norm2``, ``mlp.fc1`` / ``mlp.fc2``), ``layers.i.downsample`` (PatchMerging at the END of
  stages 0-2: LayerNorm of the 4C concatenation, then a bias-free 4C -> 2C linear) and one output
  LayerNorm per stage (``norm0`` ... ``norm3``). Size t is Swin-T (96 wide, depths 2-2-6-2, window
  7), size l Swin-L (192 wide, depths 2-2-18-2, window 12), as in BiRefNet's own configurations.
* ``squeeze_module.0`` and ``decoder.decoder_block{4..1}``: BasicDecBlk = 3x3 conv -> BN -> ReLU ->
  ASPPDeformable -> 3x3 conv -> BN, where ASPPDeformable runs a 1x1 and three deformable branches
  (kernel 1, 3, 7; offsets and a 2*sigmoid modulator predicted by plain convs, the sampling done
  by ``torchvision.ops.deform_conv2d``), a global-average-pool branch, concatenates the five
  256-channel maps and fuses them with a 1x1 conv -> BN -> ReLU (-> dropout, a no-op in eval).
* ``decoder.ipt_blk{5..1}``: two 3x3 convs over the input image cut into tiles the size of the
  decoder map they join, stacked along the channels (the "inward reference", :func:`image_patches`);
  ``lateral_block{4,3,2}`` 1x1 convs of the encoder maps; ``gdt_convs_*`` the gradient-attention
  branch (conv -> BN -> ReLU, then a 1x1 conv whose sigmoid gates the decoder map);
  ``conv_ms_spvn_*`` and ``gdt_convs_pred_*`` only produce training-time side outputs and are
  unused in inference (kept: they are part of the checkpoint).

Forward (eval): the backbone runs on the image and on the image bilinearly halved; each of the
four stage maps is concatenated with the half-scale one resized to it (``mul_scl_ipt='cat'``);
the deepest map is concatenated after the three shallower ones resized to it (the context) and
squeezed; the decoder then refines from 1/32 to full resolution and returns the matte logit
(B, 1, H, W), pre-sigmoid. Input: ImageNet-normalized RGB, H and W multiples of 32.

:meth:`BiRefNetNet.forward_encoder` / :meth:`BiRefNetNet.forward_decoder` split the forward where
the first deformable convolution starts (the squeeze module), so the encoder alone can be captured
in a CUDA graph while the deformable part runs eager (see ``model.py``). All shapes derive from
the input's static size: no host synchronisation and no data-dependent shapes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import deform_conv2d

from ..common.transformer import GeluMlp


@dataclass(frozen=True)
class SwinConfig:
    embed_dim: int
    depths: tuple[int, int, int, int]
    num_heads: tuple[int, int, int, int]
    window: int


CONFIGS: dict[str, SwinConfig] = {
    "t": SwinConfig(96, (2, 2, 6, 2), (3, 6, 12, 24), 7),
    "l": SwinConfig(192, (2, 2, 18, 2), (6, 12, 24, 48), 12),
}
MLP_RATIO = 4
DEC_INTER = 64        # inner width of every decoder block and input-patch block
ASPP_WIDTH = 256      # width of each ASPP branch
ASPP_KERNELS = (1, 3, 7)
GDT_WIDTH = 16        # width of the gradient-attention branch


def _interp(x: torch.Tensor, size) -> torch.Tensor:
    """BiRefNet's resize everywhere: bilinear, corners aligned."""
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=True)


# ------------------------------------------------------------------------------------ Swin v1
def _relative_position_index(window: int) -> torch.Tensor:
    """(w*w, w*w) index into the (2w-1)^2 bias table for every (query, key) pair of a window."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


class WindowAttention(nn.Module):
    """Multi-head self-attention inside each window, with a learned relative-position bias."""

    def __init__(self, dim: int, heads: int, window: int):
        super().__init__()
        self.heads = heads
        self.window = window
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        self.register_buffer("relative_position_index", _relative_position_index(window))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``x`` (B*nW, N, C) window tokens; ``mask`` (nW, N, N) additive (shifted windows) or None."""
        bw, n, c = x.shape
        qkv = self.qkv(x).reshape(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        bias = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
        bias = bias.reshape(n, n, self.heads).permute(2, 0, 1).unsqueeze(0)   # (1, heads, N, N)
        if mask is not None:
            nw = mask.shape[0]
            bias = bias + mask.unsqueeze(1)                                   # (nW, heads, N, N)
            if bw != nw:   # windows are batch-major: image b's window w is row b * nW + w
                bias = bias.repeat(bw // nw, 1, 1, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        return self.proj(out.transpose(1, 2).reshape(bw, n, c))


class SwinBlock(nn.Module):
    """Pre-norm (shifted-)window attention + MLP, each with a residual.

    As in the original implementation, the normalized map is zero-padded on the bottom/right to
    whole windows BEFORE the cyclic shift; the padded tokens take part in the attention (only the
    shifted-window regions are masked), and are cut off again afterwards.
    """

    def __init__(self, dim: int, heads: int, window: int, shift: int):
        super().__init__()
        self.window, self.shift = window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = GeluMlp(dim, dim * MLP_RATIO)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``x`` (B, H, W, C)."""
        b, h, w, c = x.shape
        ws = self.window
        y = self.norm1(x)
        pad_b, pad_r = (ws - h % ws) % ws, (ws - w % ws) % ws
        if pad_b or pad_r:
            y = F.pad(y, (0, 0, 0, pad_r, 0, pad_b))
        hp, wp = h + pad_b, w + pad_r
        if self.shift:
            y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = y.reshape(b, hp // ws, ws, wp // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        win = self.attn(win, mask if self.shift else None)
        y = win.reshape(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        if self.shift:
            y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        if pad_b or pad_r:
            y = y[:, :h, :w, :]
        x = x + y
        return x + self.mlp(self.norm2(x))


def shifted_window_mask(hp: int, wp: int, window: int, shift: int, device) -> torch.Tensor:
    """(nW, w*w, w*w) additive mask of the shifted windows on a padded (hp, wp) map: 0 between
    tokens of the same region, -100 across regions (the original's value). Built with Python
    scalars only (graph-safe: nothing is copied from the host)."""
    img = torch.zeros((hp, wp), device=device)
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    region = 0
    for hs in cuts:
        for wsl in cuts:
            img[hs, wsl] = region
            region += 1
    win = img.reshape(hp // window, window, wp // window, window).permute(0, 2, 1, 3).reshape(-1, window * window)
    diff = win.unsqueeze(1) - win.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill(diff != 0, -100.0)


class PatchMerging(nn.Module):
    """2x2 neighbourhood -> one token: concatenation (order (0,0), (1,0), (0,1), (1,1) as (row,
    col)), LayerNorm, bias-free linear 4C -> 2C. Odd sizes are zero-padded first."""

    def __init__(self, dim: int):
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        if h % 2 or w % 2:
            x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat((x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]), -1)
        return self.reduction(self.norm(x))


class SwinLayer(nn.Module):
    """One stage: blocks alternating plain and shifted windows, then (stages 0-2) PatchMerging."""

    def __init__(self, dim: int, depth: int, heads: int, window: int, downsample: bool):
        super().__init__()
        self.window = window
        self.shift = window // 2
        self.blocks = nn.ModuleList(
            SwinBlock(dim, heads, window, 0 if i % 2 == 0 else self.shift) for i in range(depth))
        self.downsample = PatchMerging(dim) if downsample else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, W, C) -> (this stage's output (B, H, W, C), the next stage's input)."""
        _, h, w, _ = x.shape
        ws = self.window
        mask = shifted_window_mask(-(-h // ws) * ws, -(-w // ws) * ws, ws, self.shift, x.device)
        for blk in self.blocks:
            x = blk(x, mask)
        return x, (self.downsample(x) if self.downsample is not None else x)


class PatchEmbed(nn.Module):
    def __init__(self, dim: int, patch: int = 4):
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(3, dim, patch, patch)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, H/4, W/4, C) (sizes padded up to a multiple of 4 first)."""
        h, w = x.shape[-2:]
        p = self.patch
        if h % p or w % p:
            x = F.pad(x, (0, (p - w % p) % p, 0, (p - h % p) % p))
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class SwinTransformer(nn.Module):
    """Swin v1 backbone returning the four stage maps (B, C_i, H/2^(i+2), W/2^(i+2)), each after
    its own LayerNorm."""

    def __init__(self, cfg: SwinConfig):
        super().__init__()
        d = cfg.embed_dim
        self.patch_embed = PatchEmbed(d)
        self.layers = nn.ModuleList(
            SwinLayer(d * 2 ** i, cfg.depths[i], cfg.num_heads[i], cfg.window, downsample=i < 3) for i in range(4))
        self.widths = tuple(d * 2 ** i for i in range(4))
        for i, c in enumerate(self.widths):
            self.add_module(f"norm{i}", nn.LayerNorm(c))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.patch_embed(x)
        outs = []
        for i, layer in enumerate(self.layers):
            out, x = layer(x)
            outs.append(getattr(self, f"norm{i}")(out).permute(0, 3, 1, 2).contiguous())
        return outs


# ------------------------------------------------------------------------------------ decoder
class DeformableConv2d(nn.Module):
    """Modulated deformable convolution (DCNv2): plain convs predict the sampling offsets and a
    modulator (2 * sigmoid); ``torchvision.ops.deform_conv2d`` samples and convolves with
    ``regular_conv``'s (bias-free) weight."""

    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__()
        self.padding = kernel // 2
        self.offset_conv = nn.Conv2d(cin, 2 * kernel * kernel, kernel, 1, self.padding)
        self.modulator_conv = nn.Conv2d(cin, kernel * kernel, kernel, 1, self.padding)
        self.regular_conv = nn.Conv2d(cin, cout, kernel, 1, self.padding, bias=False)
        for m in (self.offset_conv, self.modulator_conv):   # start as a regular conv
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset = self.offset_conv(x)
        modulator = 2.0 * torch.sigmoid(self.modulator_conv(x))
        return deform_conv2d(x, offset, self.regular_conv.weight, None, padding=self.padding, mask=modulator)


class ASPPBranch(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__()
        self.atrous_conv = DeformableConv2d(cin, cout, kernel)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.atrous_conv(x)))


class ASPPDeformable(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        w = ASPP_WIDTH
        self.aspp1 = ASPPBranch(cin, w, 1)
        self.aspp_deforms = nn.ModuleList(ASPPBranch(cin, w, k) for k in ASPP_KERNELS)
        self.global_avg_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, w, 1, bias=False),
                                             nn.BatchNorm2d(w), nn.ReLU())
        self.conv1 = nn.Conv2d(w * (2 + len(ASPP_KERNELS)), cin, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.aspp1(x)
        pooled = _interp(self.global_avg_pool(x), first.shape[2:])
        y = torch.cat((first, *[b(x) for b in self.aspp_deforms], pooled), 1)
        return self.dropout(F.relu(self.bn1(self.conv1(y))))


class BasicDecBlk(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv_in = nn.Conv2d(cin, DEC_INTER, 3, 1, 1)
        self.dec_att = ASPPDeformable(DEC_INTER)
        self.conv_out = nn.Conv2d(DEC_INTER, cout, 3, 1, 1)
        self.bn_in = nn.BatchNorm2d(DEC_INTER)
        self.bn_out = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn_in(self.conv_in(x)))
        return self.bn_out(self.conv_out(self.dec_att(x)))


class SimpleConvs(nn.Module):
    """Two 3x3 convs without an activation between them."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, DEC_INTER, 3, 1, 1)
        self.conv_out = nn.Conv2d(DEC_INTER, cout, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.conv1(x))


class LateralBlk(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def image_patches(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, C * (H/h) * (W/w), h, w): the image cut into an (H/h) x (W/w) grid of
    h x w tiles stacked along the channels, channel-major then row-major (tile (row r, column c)
    of channel k at channel ``(k * H/h + r) * W/w + c``), as the LibreYOLO checkpoints expect."""
    b, ch, hh, ww = x.shape
    rows, cols = hh // h, ww // w
    return x.reshape(b, ch, rows, h, cols, w).permute(0, 1, 2, 4, 3, 5).reshape(b, ch * rows * cols, h, w)


def _gdt(c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, GDT_WIDTH, 3, 1, 1), nn.BatchNorm2d(GDT_WIDTH), nn.ReLU())


def _head(c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, 1, 1))


class Decoder(nn.Module):
    """``channels`` = the four (doubled) encoder widths, deepest first (t: 1536, 768, 384, 192)."""

    def __init__(self, channels: tuple[int, int, int, int]):
        super().__init__()
        c0, c1, c2, c3 = channels
        self.ipt_blk5 = SimpleConvs(2 ** 10 * 3, c0 // 8)
        self.ipt_blk4 = SimpleConvs(2 ** 8 * 3, c0 // 8)
        self.ipt_blk3 = SimpleConvs(2 ** 6 * 3, c1 // 8)
        self.ipt_blk2 = SimpleConvs(2 ** 4 * 3, c2 // 8)
        self.ipt_blk1 = SimpleConvs(2 ** 0 * 3, c3 // 8)
        self.decoder_block4 = BasicDecBlk(c0 + c0 // 8, c1)
        self.decoder_block3 = BasicDecBlk(c1 + c0 // 8, c2)
        self.decoder_block2 = BasicDecBlk(c2 + c1 // 8, c3)
        self.decoder_block1 = BasicDecBlk(c3 + c2 // 8, c3 // 2)
        self.conv_out1 = _head(c3 // 2 + c3 // 8)
        self.lateral_block4 = LateralBlk(c1)
        self.lateral_block3 = LateralBlk(c2)
        self.lateral_block2 = LateralBlk(c3)
        self.conv_ms_spvn_4 = nn.Conv2d(c1, 1, 1)
        self.conv_ms_spvn_3 = nn.Conv2d(c2, 1, 1)
        self.conv_ms_spvn_2 = nn.Conv2d(c3, 1, 1)
        self.gdt_convs_4, self.gdt_convs_3, self.gdt_convs_2 = _gdt(c1), _gdt(c2), _gdt(c3)
        self.gdt_convs_pred_4, self.gdt_convs_pred_3, self.gdt_convs_pred_2 = (_head(GDT_WIDTH) for _ in range(3))
        self.gdt_convs_attn_4, self.gdt_convs_attn_3, self.gdt_convs_attn_2 = (_head(GDT_WIDTH) for _ in range(3))

    @staticmethod
    def _ref(blk: nn.Module, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``like`` concatenated with the image patches' features at ``like``'s size. (The patches
        already have that size, so the reference's bilinear resize of them is the identity.)"""
        return torch.cat((like, blk(image_patches(x, *like.shape[2:]))), 1)

    def forward(self, x: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor,
                x4: torch.Tensor) -> torch.Tensor:
        p4 = self.decoder_block4(self._ref(self.ipt_blk5, x, x4))
        p4 = p4 * self.gdt_convs_attn_4(self.gdt_convs_4(p4)).sigmoid()
        p3 = _interp(p4, x3.shape[2:]) + self.lateral_block4(x3)
        p3 = self.decoder_block3(self._ref(self.ipt_blk4, x, p3))
        p3 = p3 * self.gdt_convs_attn_3(self.gdt_convs_3(p3)).sigmoid()
        p2 = _interp(p3, x2.shape[2:]) + self.lateral_block3(x2)
        p2 = self.decoder_block2(self._ref(self.ipt_blk3, x, p2))
        p2 = p2 * self.gdt_convs_attn_2(self.gdt_convs_2(p2)).sigmoid()
        p1 = _interp(p2, x1.shape[2:]) + self.lateral_block2(x1)
        p1 = self.decoder_block1(self._ref(self.ipt_blk2, x, p1))
        p1 = _interp(p1, x.shape[2:])
        return self.conv_out1(torch.cat((p1, self.ipt_blk1(x)), 1))


def swin_depths(state_dict) -> tuple[int, ...]:
    """The number of blocks of each backbone stage a checkpoint in this layout holds (``bb.layers.i.
    blocks.j``), read from its keys: the one thing that tells BiRefNet's and FeyNobg's layouts apart."""
    depth: dict[int, int] = {}
    for key in state_dict:
        parts = key.split(".")
        if len(parts) > 4 and parts[:2] == ["bb", "layers"] and parts[3] == "blocks" \
                and parts[2].isdigit() and parts[4].isdigit():
            i = int(parts[2])
            depth[i] = max(depth.get(i, 0), int(parts[4]) + 1)
    return tuple(depth.get(i, 0) for i in range(max(depth, default=-1) + 1))


# ------------------------------------------------------------------------------------ network
class BiRefNetNet(nn.Module):
    """The whole network (see the module docstring); ``forward`` = decoder(encoder(x)).

    ``size``: one of :data:`CONFIGS`, or a :class:`SwinConfig` (a family built on this network
    with a backbone of its own, such as FeyNobg's deeper Swin-L; or a tiny one for tests)."""

    def __init__(self, size: str | SwinConfig):
        super().__init__()
        if isinstance(size, SwinConfig):
            cfg = size
        elif size in CONFIGS:
            cfg = CONFIGS[size]
        else:
            raise ValueError(f"unknown BiRefNet size {size!r}; sizes: {', '.join(CONFIGS)}")
        self.bb = SwinTransformer(cfg)
        channels = tuple(2 * c for c in reversed(self.bb.widths))   # both scales concatenated
        context = sum(channels[1:])
        self.squeeze_module = nn.Sequential(BasicDecBlk(channels[0] + context, channels[0]))
        self.decoder = Decoder(channels)

    def forward_encoder(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, 3, H, W) -> (x, x1, x2, x3, x4): the input and the four two-scale encoder maps,
        the deepest one with the context of the others (before the squeeze module)."""
        h, w = x.shape[-2:]
        full = self.bb(x)
        half = self.bb(_interp(x, (h // 2, w // 2)))
        x1, x2, x3, x4 = (torch.cat((f, _interp(g, f.shape[2:])), 1) for f, g in zip(full, half))
        x4 = torch.cat((*[_interp(f, x4.shape[2:]) for f in (x1, x2, x3)], x4), 1)
        return x, x1, x2, x3, x4

    def forward_decoder(self, x: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor,
                        x4: torch.Tensor) -> torch.Tensor:
        """The encoder's outputs -> matte logit (B, 1, H, W): squeeze module, then the decoder
        (every deformable convolution is on this side)."""
        return self.decoder(x, x1, x2, x3, self.squeeze_module(x4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_decoder(*self.forward_encoder(x))
