"""NAFNet (Chen et al., "Simple Baselines for Image Restoration", 2022; MIT): the plain
convolutional U-Net of NAF blocks, in the LibreYOLO layout (upstream's module names).

Each NAF block: LayerNorm over the channels, 1x1 expand, 3x3 depthwise, SimpleGate (the two
channel halves multiplied), simplified channel attention (a pooled 1x1 conv), 1x1 project, scaled
residual (``beta``); then the gated feed-forward with its own scaled residual (``gamma``). The
U-Net predicts a residual added to its (padded) input.

Test-time local converter (TLC, as the reference's ``NAFNetLocal``): the channel attention's global
average pool becomes a local one whose window is 1.5 times the feature size the network was trained
at (``train_size``; a level's window ``(T >> level) * int(1.5 T) // T``). Where the window covers
the whole feature map - every input up to 1.5 ``train_size``, tiles of the train size included -
it is the global average exactly. Training uses the global pool (the patches are the train size).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: size -> (width, middle blocks, encoder blocks per level, decoder blocks per level): NAFNet's
#: GoPro deblurring configurations, width 32 (s) and 64 (l) - the reference's
CONFIGS: dict[str, tuple[int, int, tuple[int, ...], tuple[int, ...]]] = {
    "s": (32, 1, (1, 1, 1, 28), (1, 1, 1, 1)),
    "l": (64, 1, (1, 1, 1, 28), (1, 1, 1, 1)),
}

#: the train size the TLC windows derive from when none is given (the reference's 256 crops)
DEFAULT_TRAIN_SIZE = 256


class LayerNorm2d(nn.Module):
    """LayerNorm over the channel axis of an NCHW tensor (eps 1e-6, NAFNet's)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(1, keepdim=True)
        var = (x - mu).pow(2).mean(1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + self.eps)
        return y * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


class SimpleGate(nn.Module):
    """The two halves of the channels multiplied."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return a * b


class LocalAvgPool(nn.Module):
    """TLC's pool: the mean over a ``kernel`` x ``kernel`` window at every position (summed-area
    table, the output edge-replicated back to the input's size), or the global mean when the window
    covers the map (or ``kernel`` is None). Parameter-free: the state dict is upstream's."""

    def __init__(self, kernel: int | None = None):
        super().__init__()
        self.kernel = kernel

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[-2]), int(x.shape[-1])
        k = self.kernel
        if k is None or (k >= h and k >= w):
            return x.mean((-2, -1), keepdim=True)
        k1, k2 = min(h, k), min(w, k)
        s = F.pad(x.cumsum(-1).cumsum(-2), (1, 0, 1, 0))
        out = (s[..., k1:, k2:] + s[..., :-k1, :-k2] - s[..., :-k1, k2:] - s[..., k1:, :-k2]) / (k1 * k2)
        oh, ow = int(out.shape[-2]), int(out.shape[-1])
        pad = ((w - ow) // 2, (w - ow + 1) // 2, (h - oh) // 2, (h - oh + 1) // 2)
        return F.pad(out, pad, mode="replicate")


class NAFBlock(nn.Module):
    """One NAF block (see the module docstring); ``c`` channels, expansions 2."""

    def __init__(self, c: int, dw_expand: int = 2, ffn_expand: int = 2):
        super().__init__()
        dw = c * dw_expand
        self.conv1 = nn.Conv2d(c, dw, 1)
        self.conv2 = nn.Conv2d(dw, dw, 3, padding=1, groups=dw)
        self.conv3 = nn.Conv2d(dw // 2, c, 1)
        self.sca = nn.Sequential(LocalAvgPool(), nn.Conv2d(dw // 2, dw // 2, 1))
        self.sg = SimpleGate()
        ffn = ffn_expand * c
        self.conv4 = nn.Conv2d(c, ffn, 1)
        self.conv5 = nn.Conv2d(ffn // 2, c, 1)
        self.norm1 = LayerNorm2d(c)
        self.norm2 = LayerNorm2d(c)
        self.beta = nn.Parameter(torch.zeros((1, c, 1, 1)))
        self.gamma = nn.Parameter(torch.zeros((1, c, 1, 1)))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.sg(self.conv2(self.conv1(self.norm1(inp))))
        x = self.conv3(x * self.sca(x))
        y = inp + x * self.beta
        x = self.conv5(self.sg(self.conv4(self.norm2(y))))
        return y + x * self.gamma


class NAFNetNet(nn.Module):
    """NAFNet for RGB in [0, 1] -> restored RGB (pre-clamp) of the same size; any input size (zero
    padded to a multiple of 2^levels inside, the output cropped back)."""

    def __init__(self, size: str = "s", train_size: int = DEFAULT_TRAIN_SIZE):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown NAFNet size {size!r}; sizes: {', '.join(CONFIGS)}")
        width, middle, enc, dec = CONFIGS[size]
        self.intro = nn.Conv2d(3, width, 3, padding=1)
        self.ending = nn.Conv2d(width, 3, 3, padding=1)
        # registered in upstream's order (the checkpoint's key order): middle_blks after decoders
        self.encoders, self.decoders = nn.ModuleList(), nn.ModuleList()
        self.middle_blks = nn.Sequential()
        self.ups, self.downs = nn.ModuleList(), nn.ModuleList()
        chan = width
        for n in enc:
            self.encoders.append(nn.Sequential(*[NAFBlock(chan) for _ in range(n)]))
            self.downs.append(nn.Conv2d(chan, 2 * chan, 2, 2))
            chan *= 2
        for _ in range(middle):
            self.middle_blks.append(NAFBlock(chan))
        for n in dec:
            self.ups.append(nn.Sequential(nn.Conv2d(chan, chan * 2, 1, bias=False), nn.PixelShuffle(2)))
            chan //= 2
            self.decoders.append(nn.Sequential(*[NAFBlock(chan) for _ in range(n)]))
        self.padder_size = 2 ** len(self.encoders)
        self.set_train_size(train_size)

    def set_train_size(self, train_size: int | None) -> None:
        """Set the TLC windows from the size the weights were trained at (None: global pooling)."""
        self.train_size = None if train_size is None else int(train_size)
        levels = [(blk, i) for i, stage in enumerate(self.encoders) for blk in stage]
        levels += [(blk, len(self.encoders)) for blk in self.middle_blks]
        levels += [(blk, len(self.decoders) - 1 - i) for i, stage in enumerate(self.decoders) for blk in stage]
        for blk, level in levels:
            t = self.train_size
            blk.sca[0].kernel = None if t is None else (t >> level) * int(1.5 * t) // t

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = int(inp.shape[-2]), int(inp.shape[-1])
        p = self.padder_size
        ph, pw = (p - h % p) % p, (p - w % p) % p
        x_in = F.pad(inp, (0, pw, 0, ph)) if ph or pw else inp
        x = self.intro(x_in)
        skips = []
        for encoder, down in zip(self.encoders, self.downs):
            x = encoder(x)
            skips.append(x)
            x = down(x)
        x = self.middle_blks(x)
        for decoder, up, skip in zip(self.decoders, self.ups, skips[::-1]):
            x = decoder(up(x) + skip)
        x = self.ending(x) + x_in
        return x[..., :h, :w]
