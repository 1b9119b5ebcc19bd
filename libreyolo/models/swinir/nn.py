"""SwinIR (Liang et al., 2021; Apache-2.0) for 4x super-resolution, in the LibreYOLO layout
(upstream's module names, so its released weights load key for key).

Shallow conv -> residual Swin transformer blocks (RSTB: ``depth`` Swin blocks in 8x8 windows, every
second one shifted by 4, then a conv, as one residual) -> norm -> conv + long residual -> the
upsampler: ``pixelshuffledirect`` (one conv to 3 * 16 channels and PixelShuffle(4): size s, the
lightweight model) or ``nearest+conv`` (two nearest 2x steps with convs: sizes m and l, the
real-world models). The input is reflect-padded to a multiple of the window and has the RGB mean
buffer subtracted; the output has it added back and is cropped to 4x the input.

The shifted-window masks (0 within a region, -100 across regions) depend only on the padded input
size: they are computed on the input's device at each forward (a few small ops, no host copy, so
capture-safe). The ``attn_mask`` buffers of the shifted blocks are kept for the checkpoint layout
(upstream stores them, for its 64x64 training size) but not read.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import stochastic_depth

#: size -> (embed dim, depths, heads, upsampler, residual connection): the reference's sizes
#: (s: lightweight SwinIR x4; m: real-world SwinIR-M x4; l: real-world SwinIR-L x4)
CONFIGS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...], str, str]] = {
    "s": (60, (6, 6, 6, 6), (6, 6, 6, 6), "pixelshuffledirect", "1conv"),
    "m": (180, (6,) * 6, (6,) * 6, "nearest+conv", "1conv"),
    "l": (240, (6,) * 9, (8,) * 9, "nearest+conv", "3conv"),
}
WINDOW = 8
SCALE = 4
IMG_SIZE = 64              # upstream's training size (its stored attn_mask buffers are for it)
MLP_RATIO = 2.0
DROP_PATH = 0.1            # stochastic depth rate of the last block (training only)
RGB_MEAN = (0.4488, 0.4371, 0.4040)


def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * nW, ws, ws, C)."""
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, ws, ws, c)


def window_reverse(windows: torch.Tensor, ws: int, h: int, w: int) -> torch.Tensor:
    """(B * nW, ws, ws, C) -> (B, H, W, C)."""
    c = windows.shape[-1]
    x = windows.view(-1, h // ws, w // ws, ws, ws, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, c)


def shift_mask(h: int, w: int, ws: int, shift: int, device=None) -> torch.Tensor:
    """(nW, ws*ws, ws*ws) additive mask of shifted-window attention on an h x w map: 0 between
    tokens of one region of the rolled map, -100 between tokens of different regions."""
    img = torch.zeros((1, h, w, 1), device=device)
    count = 0
    for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img[:, hs, wsl, :] = count
            count += 1
    win = window_partition(img, ws).view(-1, ws * ws)
    diff = win.unsqueeze(1) - win.unsqueeze(2)
    return torch.where(diff != 0, torch.full_like(diff, -100.0), torch.zeros_like(diff))


def relative_position_index(ws: int) -> torch.Tensor:
    """(ws*ws, ws*ws) index into the (2ws-1)^2 relative position bias table."""
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += ws - 1
    rel[:, :, 1] += ws - 1
    rel[:, :, 0] *= 2 * ws - 1
    return rel.sum(-1)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class WindowAttention(nn.Module):
    """Multi-head self-attention within windows, with the learned relative position bias."""

    def __init__(self, dim: int, ws: int, heads: int):
        super().__init__()
        self.ws, self.heads = ws, heads
        self.scale = (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1) ** 2, heads))
        self.register_buffer("relative_position_index", relative_position_index(ws))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        bw, n, c = x.shape
        q, k, v = self.qkv(x).reshape(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, -1)
        attn_mask = bias.permute(2, 0, 1).unsqueeze(0).to(q.dtype)            # (1, heads, n, n)
        if mask is not None:                                                  # (nW, n, n), batch-major windows
            nw = mask.shape[0]
            attn_mask = (attn_mask + mask.to(q.dtype).unsqueeze(1)).repeat(bw // nw, 1, 1, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
        return self.proj(out.transpose(1, 2).reshape(bw, n, c))


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ws: int, shift: int, drop_path: float):
        super().__init__()
        self.ws, self.shift, self.drop_path = ws, shift, drop_path
        if shift:   # upstream's buffer (its 64x64 training size), kept for the checkpoint layout
            self.register_buffer("attn_mask", shift_mask(IMG_SIZE, IMG_SIZE, ws, shift))
        else:
            self.attn_mask = None
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, ws, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * MLP_RATIO))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return stochastic_depth(x, self.drop_path, "row", self.training) if self.drop_path else x

    def forward(self, x: torch.Tensor, hw: tuple[int, int], mask: torch.Tensor | None) -> torch.Tensor:
        h, w = hw
        b, _, c = x.shape
        y = self.norm1(x).view(b, h, w, c)
        if self.shift:
            y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = window_partition(y, self.ws).view(-1, self.ws * self.ws, c)
        win = self.attn(win, mask if self.shift else None).view(-1, self.ws, self.ws, c)
        y = window_reverse(win, self.ws, h, w)
        if self.shift:
            y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + self._drop(y.reshape(b, h * w, c))
        return x + self._drop(self.mlp(self.norm2(x)))


class BasicLayer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, drop_path: list[float]):
        super().__init__()
        self.blocks = nn.ModuleList([SwinTransformerBlock(dim, heads, WINDOW, 0 if i % 2 == 0 else WINDOW // 2,
                                                          drop_path[i]) for i in range(depth)])

    def forward(self, x: torch.Tensor, hw: tuple[int, int], mask: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x, hw, mask)
        return x


def _resi_conv(dim: int, kind: str) -> nn.Module:
    if kind == "1conv":
        return nn.Conv2d(dim, dim, 3, 1, 1)
    return nn.Sequential(nn.Conv2d(dim, dim // 4, 3, 1, 1), nn.LeakyReLU(0.2), nn.Conv2d(dim // 4, dim // 4, 1),
                         nn.LeakyReLU(0.2), nn.Conv2d(dim // 4, dim, 3, 1, 1))


class RSTB(nn.Module):
    """Residual Swin transformer block: the Swin blocks, then a conv on the map, plus the input."""

    def __init__(self, dim: int, depth: int, heads: int, drop_path: list[float], resi: str):
        super().__init__()
        self.residual_group = BasicLayer(dim, depth, heads, drop_path)
        self.conv = _resi_conv(dim, resi)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], mask: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        y = self.residual_group(x, hw, mask).transpose(1, 2).reshape(b, c, *hw)
        return self.conv(y).flatten(2).transpose(1, 2) + x


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, H*W, C), then LayerNorm (patch size 1)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.flatten(2).transpose(1, 2))


class SwinIRNet(nn.Module):
    """SwinIR x4 (see the module docstring): RGB in [0, 1] (B, 3, H, W) -> (B, 3, 4H, 4W), pre-clamp."""

    def __init__(self, size: str = "s"):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown SwinIR size {size!r}; sizes: {', '.join(CONFIGS)}")
        dim, depths, heads, upsampler, resi = CONFIGS[size]
        self.upsampler = upsampler
        self.register_buffer("mean", torch.tensor(RGB_MEAN).view(1, 3, 1, 1), persistent=False)
        self.conv_first = nn.Conv2d(3, dim, 3, 1, 1)
        self.patch_embed = PatchEmbed(dim)
        n = sum(depths)
        dpr = [DROP_PATH * i / (n - 1) for i in range(n)]   # torch.linspace(0, DROP_PATH, n), host-side
        self.layers = nn.ModuleList()
        for i, (d, nh) in enumerate(zip(depths, heads)):
            start = sum(depths[:i])
            self.layers.append(RSTB(dim, d, nh, dpr[start:start + d], resi))
        self.norm = nn.LayerNorm(dim)
        self.conv_after_body = _resi_conv(dim, resi)
        if upsampler == "pixelshuffledirect":
            self.upsample = nn.Sequential(nn.Conv2d(dim, 3 * SCALE * SCALE, 3, 1, 1), nn.PixelShuffle(SCALE))
        else:
            feat = 64
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(dim, feat, 3, 1, 1), nn.LeakyReLU())
            self.conv_up1 = nn.Conv2d(feat, feat, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(feat, feat, 3, 1, 1)
            self.conv_hr = nn.Conv2d(feat, feat, 3, 1, 1)
            self.conv_last = nn.Conv2d(feat, 3, 3, 1, 1)
            self.lrelu = nn.LeakyReLU(0.2)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        mask = shift_mask(h, w, WINDOW, WINDOW // 2, x.device)
        t = self.patch_embed(x)
        for layer in self.layers:
            t = layer(t, (h, w), mask)
        return self.norm(t).transpose(1, 2).reshape(b, c, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[-2]), int(x.shape[-1])
        ph, pw = (WINDOW - h % WINDOW) % WINDOW, (WINDOW - w % WINDOW) % WINDOW
        if ph or pw:
            mode = "reflect" if h > 1 and w > 1 and ph < h and pw < w else "replicate"
            x = F.pad(x, (0, pw, 0, ph), mode=mode)
        mean = self.mean.to(x.dtype)
        x = self.conv_first(x - mean)
        x = self.conv_after_body(self.forward_features(x)) + x
        if self.upsampler == "pixelshuffledirect":
            x = self.upsample(x)
        else:
            x = self.conv_before_upsample(x)
            x = self.lrelu(self.conv_up1(F.interpolate(x, scale_factor=2.0, mode="nearest")))
            x = self.lrelu(self.conv_up2(F.interpolate(x, scale_factor=2.0, mode="nearest")))
            x = self.conv_last(self.lrelu(self.conv_hr(x)))
        return (x + mean)[..., :h * SCALE, :w * SCALE]
