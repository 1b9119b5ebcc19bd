"""Darknet networks (YOLOv2, YOLOv3, YOLOv4) built from their cfg layer lists, and their decode.

Checkpoint layout (LibreYOLO's): ``<family>.layers.<i>.conv.weight`` and
``<family>.layers.<i>.bn.{weight, bias, running_mean, running_var}`` for the i-th cfg layer when it
is a batch-normalized ``[convolutional]``; ``<family>.layers.<i>.conv.{weight, bias}`` for the
linear 1x1 conv before each head. The BatchNorms hold no ``num_batches_tracked``.

Numerics, as Darknet computes them:

* BatchNorm in eval mode: ``(x - mean) / (sqrt(var) + 1e-6) * weight + bias`` (Darknet's
  ``normalize_cpu``: the epsilon is added to the standard deviation). Training normalizes with
  the batch statistics as ``nn.BatchNorm2d`` does (``sqrt(var + 1e-6)``; the two differ by less
  than 1e-4 relative for any variance above 1e-4) and updates the running statistics with
  momentum 0.03, as the library's other YOLO families train (Darknet's own is 0.01);
* ``leaky`` is LeakyReLU(0.1), ``mish`` is x * tanh(softplus(x));
* ``[maxpool]`` pads ``size - 1`` cells, ``(size - 1) // 2`` of them before and the rest after,
  with -infinity (the size-2 stride-1 pool of the tiny models pads one cell right and below);
* ``[reorg]`` stride s: output channel ``(dy * s + dx) * C + c`` at (i, j) is input channel c at
  (i * s + dy, j * s + dx) (the passthrough order of the reference implementation);
* ``[upsample]`` is nearest-neighbour, ``[shortcut]`` a plain sum.

``forward`` returns the raw head maps in cfg order, each (B, A * (5 + nc), H / stride,
W / stride), per anchor the channel group [tx, ty, tw, th, to, class logits], in eval and train
mode alike. :meth:`DarknetDetector.decode` turns them into boxes and scores.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..common.assign import cached, prior_grid
from .cfgs import DarknetCfg

#: Darknet's BatchNorm epsilon, added to the standard deviation (``src/blas.c``)
DARKNET_BN_EPS = 1e-6
BN_MOMENTUM = 0.03
LEAKY_SLOPE = 0.1


# ---------------------------------------------------------------------------------- blocks
class DarknetBatchNorm2d(nn.BatchNorm2d):
    """A BatchNorm2d that normalizes as Darknet does in eval mode and has no
    ``num_batches_tracked`` buffer (the LibreYOLO Darknet checkpoints hold none)."""

    def __init__(self, num_features: int):
        super().__init__(num_features, eps=DARKNET_BN_EPS, momentum=BN_MOMENTUM)
        self.register_buffer("num_batches_tracked", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return super().forward(x)
        scale = self.weight / (self.running_var.sqrt() + self.eps)
        shift = self.bias - self.running_mean * scale
        return x * scale.to(x.dtype).view(1, -1, 1, 1) + shift.to(x.dtype).view(1, -1, 1, 1)

    def folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, shift) of the eval-mode normalization: ``y = x * scale + shift`` per channel."""
        scale = self.weight / (self.running_var.sqrt() + self.eps)
        return scale, self.bias - self.running_mean * scale

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # nn.BatchNorm2d's loader adds a ``num_batches_tracked`` entry to version-less state dicts,
        # which a strict load of this buffer-less module would then refuse
        nn.Module._load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                                        unexpected_keys, error_msgs)


def _activation(name: str) -> nn.Module:
    if name == "leaky":
        return nn.LeakyReLU(LEAKY_SLOPE)
    if name == "mish":
        return nn.Mish()
    if name == "linear":
        return nn.Identity()
    raise ValueError(f"unknown Darknet activation {name!r}")


class DarknetConv(nn.Module):
    """``[convolutional]``: Conv2d (``pad=1``: padding size // 2) -> BatchNorm -> activation, or,
    without BatchNorm (the heads' 1x1), a linear Conv2d with bias."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, act: str = "leaky", bn: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, bias=not bn)
        self.bn = DarknetBatchNorm2d(c_out) if bn else None
        self.act = _activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.act(x)

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution (inference only)."""
        if self.bn is None:
            return
        scale, shift = self.bn.folded()
        c = self.conv
        conv = nn.Conv2d(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, bias=True)
        conv.to(device=c.weight.device, dtype=c.weight.dtype)
        conv.weight.copy_(c.weight * scale.view(-1, 1, 1, 1))
        conv.bias.copy_(shift)
        conv.requires_grad_(False)
        self.conv, self.bn = conv, None


class MaxPool(nn.Module):
    """``[maxpool]``: Darknet pads ``size - 1`` cells with -infinity, ``(size - 1) // 2`` before."""

    def __init__(self, size: int, stride: int):
        super().__init__()
        self.size, self.stride = size, stride
        self.before = (size - 1) // 2
        self.after = size - 1 - self.before

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.before == self.after:      # symmetric: the pool's own (implicit -inf) padding
            return F.max_pool2d(x, self.size, self.stride, self.before)
        if self.size == self.stride:       # 2/2: one cell after, reached only by an odd side
            return F.max_pool2d(x, self.size, self.stride, ceil_mode=True)
        # the lowest finite value, not -inf: the same maximum, and exporters accept it
        pad = (self.before, self.after, self.before, self.after)
        return F.max_pool2d(F.pad(x, pad, value=torch.finfo(x.dtype).min), self.size, self.stride)


class Route(nn.Module):
    """``[route]``: the sources' channels concatenated (each source's ``group_id``-th of
    ``groups`` channel chunks)."""

    def __init__(self, groups: int = 1, group_id: int = 0):
        super().__init__()
        self.groups, self.group_id = groups, group_id

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        if self.groups > 1:
            xs = [x.chunk(self.groups, 1)[self.group_id] for x in xs]
        return xs[0] if len(xs) == 1 else torch.cat(xs, 1)


class Shortcut(nn.Module):
    """``[shortcut]`` (linear): the previous layer's output plus another layer's."""

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return xs[0] + xs[1]


class Upsample(nn.Module):
    def __init__(self, stride: int = 2):
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=float(self.stride), mode="nearest")


class Reorg(nn.Module):
    """``[reorg]`` (YOLOv2's passthrough): space to depth, channel ``(dy * s + dx) * C + c``."""

    def __init__(self, stride: int = 2):
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stride
        b, c, h, w = x.shape
        if h % s or w % s:
            raise ValueError(f"reorg stride {s} needs a feature map whose sides divide by {s}, got {h}x{w}")
        x = x.reshape(b, c, h // s, s, w // s, s).permute(0, 3, 5, 1, 2, 4)
        return x.reshape(b, s * s * c, h // s, w // s)


class HeadLayer(nn.Module):
    """``[yolo]`` / ``[region]``: passes its input (the raw head map) through; the network
    collects it. It holds no parameters."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return self.kind


class HeadSpec(NamedTuple):
    """One detection head: its raw map is layer ``layer``'s output."""
    layer: int
    stride: int
    #: (w, h) of each anchor in input pixels
    anchors: tuple[tuple[float, float], ...]
    #: index of its first anchor in the cfg's anchor list (its anchors are consecutive there)
    first_anchor: int
    scale_x_y: float


# ---------------------------------------------------------------------------------- network
class DarknetNet(nn.Module):
    """The layers of one Darknet cfg for ``nc`` classes (``layers.<i>`` = the cfg's i-th layer)."""

    def __init__(self, cfg: DarknetCfg, nc: int):
        super().__init__()
        self.layers = nn.ModuleList()
        self._sources: list[list[int] | None] = []     # route / shortcut: absolute source indices
        heads: list[HeadSpec] = []
        channels: list[int] = []
        strides: list[int] = []
        for i, layer in enumerate(cfg.layers):
            kind = layer[0]
            c_prev = channels[-1] if channels else 3
            s_prev = strides[-1] if strides else 1
            sources = None
            if kind == "conv":
                _, filters, size, stride, act = layer
                m, c, s = DarknetConv(c_prev, filters, size, stride, act), filters, s_prev * stride
            elif kind == "head":
                nxt = cfg.layers[i + 1]
                na = len(nxt[1]) if nxt[0] == "yolo" else len(cfg.anchors)
                m, c, s = DarknetConv(c_prev, na * (5 + nc), 1, 1, "linear", bn=False), na * (5 + nc), s_prev
            elif kind == "maxpool":
                m, c, s = MaxPool(layer[1], layer[2]), c_prev, s_prev * layer[2]
            elif kind == "route":
                _, refs, groups, group_id = layer
                sources = [r + i if r < 0 else r for r in refs]
                m = Route(groups, group_id)
                c, s = sum(channels[j] // groups for j in sources), strides[sources[0]]
            elif kind == "shortcut":
                sources = [i - 1, layer[1] + i if layer[1] < 0 else layer[1]]
                m, c, s = Shortcut(), c_prev, s_prev
            elif kind == "upsample":
                m, c, s = Upsample(layer[1]), c_prev, s_prev // layer[1]
            elif kind == "reorg":
                m, c, s = Reorg(layer[1]), c_prev * layer[1] ** 2, s_prev * layer[1]
            elif kind in ("yolo", "region"):
                if cfg.layers[i - 1][0] != "head":
                    raise ValueError(f"{cfg.name}: layer {i} ({kind}) must follow a head conv")
                if kind == "yolo":
                    mask, scale_x_y = layer[1], layer[2]
                    if list(mask) != list(range(mask[0], mask[0] + len(mask))):
                        raise ValueError(f"{cfg.name}: the anchors of a head must be consecutive, got {mask}")
                    anchors = tuple(tuple(float(v) for v in cfg.anchors[a]) for a in mask)
                    first = mask[0]
                else:           # [region]: anchors in cells of this map
                    anchors = tuple((float(w) * s_prev, float(h) * s_prev) for w, h in cfg.anchors)
                    first, scale_x_y = 0, 1.0
                heads.append(HeadSpec(i - 1, s_prev, anchors, first, scale_x_y))
                m, c, s = HeadLayer(kind), c_prev, s_prev
            else:
                raise ValueError(f"{cfg.name}: unknown layer kind {kind!r}")
            self.layers.append(m)
            self._sources.append(sources)
            channels.append(c)
            strides.append(s)
        self.heads = tuple(heads)
        used = {j for src in self._sources if src for j in src} | {h.layer for h in heads}
        self._keep = [i in used for i in range(len(self.layers))]
        self._head_layers = {h.layer for h in heads}

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs: list[torch.Tensor | None] = []
        maps = []
        for i, (m, sources, keep) in enumerate(zip(self.layers, self._sources, self._keep)):
            if sources is not None:
                x = m([x if j == i - 1 else outs[j] for j in sources])
            else:
                x = m(x)
            if i in self._head_layers:
                maps.append(x)
            outs.append(x if keep else None)
        return maps


class DarknetDetector(nn.Module):
    """A Darknet detector under its family's checkpoint prefix: ``<family>.layers.<i>.*``.

    ``forward`` returns the raw head maps (cfg order); :meth:`decode` gives boxes and scores.
    """

    def __init__(self, family: str, cfg: DarknetCfg, nc: int):
        super().__init__()
        self.family, self.cfg, self.nc = family, cfg, int(nc)
        self.add_module(family, DarknetNet(cfg, self.nc))
        self.heads: tuple[HeadSpec, ...] = self.body.heads
        self.region = cfg.region
        self.stride = tuple(h.stride for h in self.heads)
        self._grid_cache: dict = {}

    @property
    def body(self) -> DarknetNet:
        return getattr(self, self.family)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.body(x)

    def tables(self, hw, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Per prediction, in (head, anchor, row, column) order: the cell (col, row) (1, N, 2),
        the stride (1, N, 1), the anchor in pixels (1, N, 2) and the centre's scale and offset
        (1, N, 1) each (``scale_x_y`` and (scale_x_y - 1) / 2); cached per map size."""
        return head_tables(self.heads, hw, dtype, device, self._grid_cache)

    def decode(self, maps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw maps -> boxes (B, N, 4) xyxy in input pixels (float32), score = objectness x best
        class probability (B, N) and class (B, N); N = the heads' anchors x cells, in (head,
        anchor, row, column) order.

        cx = (sigmoid(tx) * s - (s - 1) / 2 + col) * stride (s = scale_x_y, 1 except YOLOv4),
        w = anchor_w * exp(tw); objectness sigmoid; classes sigmoid ([yolo]) or softmax
        ([region]).
        """
        y = join_heads(maps, self.heads, self.nc)
        grid, stride, anchor, scale, offset = self.tables(tuple(tuple(p.shape[-2:]) for p in maps),
                                                          y.dtype, y.device)
        cxcy = ((y[..., 0:2].sigmoid() * scale - offset + grid) * stride).float()
        half = (0.5 * y[..., 2:4].exp() * anchor).float()
        logits = y[..., 5:]
        probs = logits.softmax(-1) if self.region else logits.sigmoid()
        best, cls = probs.max(-1)
        score = y[..., 4].sigmoid().float() * best.float()
        return torch.cat((cxcy - half, cxcy + half), -1), score, cls

    @torch.no_grad()
    def initialize_biases(self, prior_prob: float = 0.01) -> int:
        """Objectness biases (and, for the sigmoid classes of ``[yolo]`` heads, class biases) to
        ``logit(prior_prob)``; box biases untouched. Not applied at construction."""
        logit = math.log(prior_prob / (1.0 - prior_prob))
        for h in self.heads:
            bias = self.body.layers[h.layer].conv.bias.view(len(h.anchors), 5 + self.nc)
            bias[:, 4] = logit
            if not self.region:
                bias[:, 5:] = logit
        return len(self.heads)

    def fuse(self) -> DarknetDetector:
        """Fold every BatchNorm into its convolution (inference only)."""
        for m in self.modules():
            if isinstance(m, DarknetConv):
                m.fuse()
        return self


def join_heads(maps: list[torch.Tensor], heads, nc: int) -> torch.Tensor:
    """Per-head (B, A * (5 + nc), H, W) maps -> (B, N, 5 + nc) in (head, anchor, row, column) order."""
    b, no = maps[0].shape[0], 5 + nc
    if len(maps) != len(heads):
        raise ValueError(f"expected {len(heads)} head maps, got {len(maps)}")
    for p, h in zip(maps, heads):
        if p.shape[1] != len(h.anchors) * no:
            raise ValueError(f"a head map has {p.shape[1]} channels, expected {len(h.anchors)}*(5+{nc})")
    return torch.cat([p.reshape(b, len(h.anchors), no, *p.shape[-2:]).permute(0, 1, 3, 4, 2).reshape(b, -1, no)
                      for p, h in zip(maps, heads)], 1)


def head_tables(heads, hw, dtype: torch.dtype, device: torch.device, cache: dict) -> tuple[torch.Tensor, ...]:
    """See :meth:`DarknetDetector.tables`."""
    def build():
        grids, strides, anchors, scales = [], [], [], []
        for (h, w), head in zip(hw, heads):
            na = len(head.anchors)
            g, st = prior_grid([(h, w)], [head.stride], 0.0, False, dtype, device)
            grids.append(g.repeat(na, 1))
            strides.append(st.repeat(na, 1))
            # fill kernels from host scalars (no host-to-device copy: a miss may happen under capture)
            anchors.append(torch.cat([torch.stack((torch.full((h * w,), aw, dtype=dtype, device=device),
                                                   torch.full((h * w,), ah, dtype=dtype, device=device)), -1)
                                      for aw, ah in head.anchors]))
            scales.append(torch.full((na * h * w, 1), head.scale_x_y, dtype=dtype, device=device))
        scale = torch.cat(scales)
        return (torch.cat(grids)[None], torch.cat(strides)[None], torch.cat(anchors)[None], scale[None],
                ((scale - 1.0) / 2.0)[None])
    return cached(cache, (tuple(hw), dtype, device), build, limit=32)
