"""YOLOv7 network in the LibreYOLO checkpoint layout.

The checkpoint is a flat, numbered graph: ``layers.<i>.*`` where ``i`` is the position
of a node in the network description below (parameter-free nodes - concatenation,
max-pool, up-sampling - also take a position, so their numbers are absent from the
state dict). Node ``i`` writes slot ``i + 1`` of a list whose slot 0 is the input;
each node reads one slot (or several, for a concatenation or the head).

Blocks: ``ConvBN`` (conv without bias, BatchNorm eps 1e-3 / momentum 0.03, SiLU),
two-branch ``RepConvN`` before the head, an SPP-CSP block (``pre_conv`` /
``short_conv`` / ``post_conv`` / ``merge_conv``; its three max-pools 5, 9, 13 are
applied one after another) and the implicit-knowledge head (``implicit_a`` added
before a 1x1 conv, ``implicit_m`` multiplied after it).

Sizes: ``b`` is the LibreYOLO (MultimediaTechLab v7) graph pinned by the ``yolo7-b``
fixture: SiLU, RepConv before the head, SPP-CSP with chained pools. ``tiny`` is the
original YOLOv7-tiny graph in the same node convention: LeakyReLU 0.1, plain 3x3 convs
before the head, SPP with parallel pools built from free nodes.

In eval and train mode alike ``forward`` returns the list of three raw head maps
(strides 8, 16, 32), each (B, 3*(5+nc), H/s, W/s), anchor-major. :meth:`Yolo7Net.decode`
turns them into boxes and scores.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..common.assign import cached, prior_grid
from ..common.blocks import ConvBN, RepConvN, fuse_modules

STRIDES = (8, 16, 32)
# Anchor (w, h) in input pixels, per level (stride 8, 16, 32), three per level.
ANCHORS = (
    ((12, 16), (19, 36), (40, 28)),
    ((36, 75), (76, 55), (72, 146)),
    ((142, 110), (192, 243), (459, 401)),
)

# ----------------------------------------------------------------- description
# A node is (kind, sources, args[, name]). ``sources`` holds slot references: a negative
# number is relative to the node's own output slot (-1 = the previous node), a
# non-negative number is an absolute slot (0 = the input), a string is a named node.


def _conv(c: int, k: int = 1, s: int = 1, src=-1):
    return ("conv", src, (c, k, s))


def _stem(widths):
    """Stride-4 stem: 3x3, 3x3/2, 3x3, 3x3/2."""
    a, b, c = widths
    return [_conv(a, 3, 1, 0), _conv(b, 3, 2), _conv(b, 3), _conv(c, 3, 2)]


def _elan(c: int, c_out: int, cat_name: str | None = None):
    """Backbone ELAN: two 1x1 branches, four chained 3x3, concat of 4 taps, 1x1.

    ``cat_name`` names the concatenation (the checkpoint's graph reads the P3 route
    from there, not from the 1x1 after it)."""
    cat = ("cat", [-1, -3, -5, -6], None) + ((cat_name,) if cat_name else ())
    return [_conv(c), _conv(c, src=-2), _conv(c, 3), _conv(c, 3), _conv(c, 3), _conv(c, 3),
            cat, _conv(c_out)]


def _elan_head(c: int, c_mid: int, c_out: int):
    """Neck ELAN: two 1x1 branches, four chained 3x3 of half width, concat of all 6."""
    return [_conv(c), _conv(c, src=-2), _conv(c_mid, 3), _conv(c_mid, 3), _conv(c_mid, 3),
            _conv(c_mid, 3), ("cat", [-1, -2, -3, -4, -5, -6], None), _conv(c_out)]


def _down(c: int, extra=None):
    """Two-path stride-2 transition: max-pool + 1x1, and 1x1 + 3x3/2, concatenated."""
    taps = [-1, -3] + ([extra] if extra else [])
    return [("pool", -1, None), _conv(c), _conv(c, src=-3), _conv(c, 3, 2), ("cat", taps, None)]


def _tag(nodes, name):
    """Give the last node of ``nodes`` a name (appended as the 4th field)."""
    kind, src, args = nodes[-1][:3]
    nodes[-1] = (kind, src, args, name)
    return nodes


def _base_description():
    d = []
    d += _stem((32, 64, 128))
    d += _elan(64, 256)                                  # 1/4
    d += _down(128)
    d += _elan(128, 512, cat_name="B3")                  # 1/8
    d += _down(256)
    d += _elan(256, 1024)
    d = _tag(d, "B4")                                    # 1/16
    d += _down(512)
    d += _elan(256, 1024)
    d = _tag(d, "B5")                                    # 1/32
    d += [("sppcsp", -1, 512, "N3")]
    # top-down
    d += [_conv(256), ("up", -1, None), _conv(256, src="B4"), ("cat", [-1, -2], None)]
    d += _elan_head(256, 128, 256)
    d = _tag(d, "N2")
    d += [_conv(128), ("up", -1, None), _conv(128, src="B3"), ("cat", [-1, -2], None)]
    d += _elan_head(128, 64, 128)
    d = _tag(d, "P3")
    # bottom-up
    d += _down(128, "N2")
    d += _elan_head(256, 128, 256)
    d = _tag(d, "P4")
    d += _down(256, "N3")
    d += _elan_head(512, 256, 512)
    d = _tag(d, "P5")
    d += [("rep", "P3", 256), ("rep", "P4", 512), ("rep", "P5", 1024)]
    d += [("detect", [-3, -2, -1], None)]
    return d


def _tiny_elan(c: int, c_out: int):
    """Tiny ELAN: two 1x1 branches, two chained 3x3, concat of all 4, 1x1."""
    return [_conv(c), _conv(c, src=-2), _conv(c, 3), _conv(c, 3),
            ("cat", [-1, -2, -3, -4], None), _conv(c_out)]


def _tiny_description():
    """The original YOLOv7-tiny graph (no RepConv, parallel SPP, plain 3x3 before the head)."""
    d = [_conv(32, 3, 2, 0), _conv(64, 3, 2)]             # 1/4
    d += _tiny_elan(32, 64)
    d += [("pool", -1, None)] + _tiny_elan(64, 128)       # 1/8
    d = _tag(d, "B3")
    d += [("pool", -1, None)] + _tiny_elan(128, 256)      # 1/16
    d = _tag(d, "B4")
    d += [("pool", -1, None)] + _tiny_elan(256, 512)      # 1/32
    # SPP-CSP (tiny): 1x1 | 1x1 -> pools 5, 9, 13 in parallel -> 1x1, concat, 1x1
    d += [_conv(256), _conv(256, src=-2), ("pool", -1, 5), ("pool", -2, 9), ("pool", -3, 13),
          ("cat", [-1, -2, -3, -4], None), _conv(256), ("cat", [-1, -7], None), _conv(256)]
    d = _tag(d, "N3")
    d += [_conv(128), ("up", -1, None), _conv(128, src="B4"), ("cat", [-1, -2], None)]
    d += _tiny_elan(64, 128)
    d = _tag(d, "N2")
    d += [_conv(64), ("up", -1, None), _conv(64, src="B3"), ("cat", [-1, -2], None)]
    d += _tiny_elan(32, 64)
    d = _tag(d, "P3")
    d += [_conv(128, 3, 2), ("cat", [-1, "N2"], None)] + _tiny_elan(64, 128)
    d = _tag(d, "P4")
    d += [_conv(256, 3, 2), ("cat", [-1, "N3"], None)] + _tiny_elan(128, 256)
    d = _tag(d, "P5")
    d += [_conv(128, 3, src="P3"), _conv(256, 3, src="P4"), _conv(512, 3, src="P5")]
    d += [("detect", [-3, -2, -1], None)]
    return d


# size -> (node description, activation of every ConvBN / RepConv)
DESCRIPTIONS = {"b": (_base_description, "silu"), "tiny": (_tiny_description, "leaky")}


def _act(conv: nn.Module, act: str) -> nn.Module:
    """Give a ConvBN / RepConvN the size's activation (the shared blocks default to SiLU)."""
    if act == "leaky":
        conv.act = nn.LeakyReLU(0.1)
    return conv


# ----------------------------------------------------------------------- blocks
class SPPCSP(nn.Module):
    """SPP-CSP: 1x1-3x3-1x1 then three chained max-pools (5, 9, 13), concat, 1x1-3x3;
    a 1x1 shortcut of the input; both merged by a 1x1."""

    def __init__(self, c_in: int, c_out: int, pools=(5, 9, 13)):
        super().__init__()
        c = c_out
        self.pre_conv = nn.Sequential(ConvBN(c_in, c, 1), ConvBN(c, c, 3), ConvBN(c, c, 1))
        self.short_conv = ConvBN(c_in, c, 1)
        self.post_conv = nn.Sequential(ConvBN(4 * c, c, 1), ConvBN(c, c, 3))
        self.merge_conv = ConvBN(2 * c, c_out, 1)
        self.pools = tuple(pools)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = [self.pre_conv(x)]
        for k in self.pools:
            taps.append(F.max_pool2d(taps[-1], k, 1, k // 2))
        y = self.post_conv(torch.cat(taps, 1))
        return self.merge_conv(torch.cat((y, self.short_conv(x)), 1))


class Implicit(nn.Module):
    """A learned per-channel tensor (1, C, 1, 1): added (``mode="add"``) or multiplied."""

    def __init__(self, c: int, mode: str):
        super().__init__()
        self.mode = mode
        init = torch.zeros if mode == "add" else torch.ones
        self.implicit = nn.Parameter(init(1, c, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.implicit if self.mode == "add" else x * self.implicit


class LevelHead(nn.Module):
    """One level of the implicit head: (x + a) -> 1x1 conv -> * m."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.head_conv = nn.Conv2d(c_in, c_out, 1)
        self.implicit_a = Implicit(c_in, "add")
        self.implicit_m = Implicit(c_out, "mul")
        self.folded = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded:
            return self.head_conv(x)
        return self.implicit_m(self.head_conv(self.implicit_a(x)))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold both implicit tensors into the 1x1 conv (inference only)."""
        if self.folded:
            return
        w = self.head_conv.weight                        # (O, I, 1, 1)
        a = self.implicit_a.implicit.reshape(-1)         # (I,)
        m = self.implicit_m.implicit.reshape(-1)         # (O,)
        b = self.head_conv.bias + w[:, :, 0, 0] @ a
        self.head_conv.weight.copy_(w * m.reshape(-1, 1, 1, 1))
        self.head_conv.bias.copy_(b * m)
        del self.implicit_a, self.implicit_m
        self.folded = True


class Detect(nn.Module):
    """Three implicit level heads, each emitting (B, na*(5+nc), H, W)."""

    def __init__(self, channels, nc: int, na: int = 3):
        super().__init__()
        self.heads = nn.ModuleList(LevelHead(c, na * (5 + nc)) for c in channels)

    def forward(self, feats):
        return [h(f) for h, f in zip(self.heads, feats)]


class _Free(nn.Module):
    """A parameter-free node (concat / pool / upsample); it only holds a list position."""

    def __init__(self, kind: str, k: int | None = None):
        super().__init__()
        self.kind, self.k = kind, k

    def forward(self, x):
        if self.kind == "cat":
            return torch.cat(x, 1)
        if self.kind == "pool":
            if self.k is None:              # stride-2 downsample
                return F.max_pool2d(x, 2, 2)
            return F.max_pool2d(x, self.k, 1, self.k // 2)
        return F.interpolate(x, scale_factor=2.0, mode="nearest")


# ---------------------------------------------------------------------- network
class Yolo7Net(nn.Module):
    """The whole YOLOv7 network for one size, built from its node description."""

    def __init__(self, size: str = "b", nc: int = 80):
        super().__init__()
        if size not in DESCRIPTIONS:
            raise ValueError(f"unknown yolo7 size {size!r}; choose one of {sorted(DESCRIPTIONS)}")
        self.size, self.nc, self.na = size, int(nc), len(ANCHORS[0])
        self.stride = STRIDES
        self.layers = nn.ModuleList()
        self._reads: list = []          # per node: one slot (int) or a list of slots
        names: dict[str, int] = {}
        width = [3]                     # channels of every slot; slot 0 is the input

        def slot(ref, own: int) -> int:
            if isinstance(ref, str):
                return names[ref]
            return own + ref if ref < 0 else ref

        describe, act = DESCRIPTIONS[size]
        for i, node in enumerate(describe()):
            kind, src, args = node[:3]
            own = i + 1
            reads = [slot(r, own) for r in src] if isinstance(src, list) else slot(src, own)
            if kind == "conv":
                c, k, s = args
                m, c_out = _act(ConvBN(width[reads], c, k, s), act), c
            elif kind == "rep":
                m, c_out = _act(RepConvN(width[reads], args), act), args
            elif kind == "sppcsp":
                m, c_out = SPPCSP(width[reads], args), args
            elif kind == "detect":
                m, c_out = Detect([width[r] for r in reads], self.nc, self.na), 0
            elif kind == "cat":
                m, c_out = _Free("cat"), sum(width[r] for r in reads)
            else:                       # pool / up
                m, c_out = _Free(kind, args), width[reads]
            self.layers.append(m)
            self._reads.append(reads)
            width.append(c_out)
            if len(node) > 3 and node[3]:
                names[node[3]] = own
        # Only the slots that a later node reads are kept during forward.
        used = set()
        for r in self._reads:
            used.update(r if isinstance(r, list) else [r])
        self._keep = [i + 1 in used for i in range(len(self.layers))]
        anchors = torch.tensor(ANCHORS, dtype=torch.float32)           # (levels, na, 2)
        self.register_buffer("anchors", anchors, persistent=False)
        self._grid_cache: dict = {}

    def forward(self, x: torch.Tensor):
        slots: list = [x]
        out = x
        for m, reads, keep in zip(self.layers, self._reads, self._keep):
            inp = [slots[r] for r in reads] if isinstance(reads, list) else (
                out if reads == len(slots) - 1 else slots[reads])
            out = m(inp)
            slots.append(out if keep else None)
        return out

    # ------------------------------------------------------------------ decode
    def _tables(self, hw, dtype, device) -> tuple[torch.Tensor, ...]:
        """Per anchor, in (level, anchor, row, column) order: cell (col, row) (1, N, 2), stride
        (1, N, 1) and anchor size in pixels (1, N, 2); cached per input size."""
        def build():
            grids, strides, sizes = [], [], []
            for level, ((h, w), s) in enumerate(zip(hw, STRIDES)):
                g, st = prior_grid([(h, w)], [s], 0.0, False, dtype, device)
                grids.append(g.repeat(self.na, 1))
                strides.append(st.repeat(self.na, 1))
                sizes.append(self.anchors[level].to(device, dtype).repeat_interleave(h * w, 0))
            return tuple(torch.cat(t)[None] for t in (grids, strides, sizes))
        return cached(self._grid_cache, (hw, dtype, device), build, limit=32)

    def decode(self, maps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw maps -> boxes (B, N, 4) xyxy in input pixels (float32), score = objectness * best
        class probability (B, N) and class (B, N); N = sum over levels of na*H*W (level, anchor,
        row, column order).

        cx = (2 sig(tx) - 0.5 + col) * stride, w = (2 sig(tw))^2 * anchor_w (in the maps' dtype).
        The levels are joined before the element-wise work (per-anchor tables, cached): about
        18 kernels instead of 38, the same operations on the same numbers as level by level.
        """
        b, no = maps[0].shape[0], 5 + self.nc
        y = torch.cat([p.view(b, self.na, no, *p.shape[-2:]).permute(0, 1, 3, 4, 2).reshape(b, -1, no)
                       for p in maps], 1).sigmoid()
        grid, stride, anchor = self._tables(tuple(tuple(p.shape[-2:]) for p in maps), y.dtype, y.device)
        cxcy = ((y[..., 0:2] * 2.0 - 0.5 + grid) * stride).float()
        half = 0.5 * ((y[..., 2:4] * 2.0) ** 2 * anchor).float()
        best, cls = y[..., 5:].max(-1)
        return torch.cat((cxcy - half, cxcy + half), -1), y[..., 4].float() * best.float(), cls

    @torch.no_grad()
    def initialize_biases(self, prior_prob: float = 0.01) -> None:
        """Set every objectness and class logit bias to ``logit(prior_prob)`` (box biases
        untouched). 0.01 is the usual from-scratch training prior; not applied at
        construction, so an untrained network keeps PyTorch's default head init."""
        logit = math.log(prior_prob / (1.0 - prior_prob))
        for head in self.layers[-1].heads:
            head.head_conv.bias.view(self.na, 5 + self.nc)[:, 4:] = logit

    def fuse(self) -> Yolo7Net:
        """Fold BatchNorm, re-parameterize the RepConvs and fold the implicit tensors."""
        fuse_modules(self)
        for m in self.modules():
            if isinstance(m, LevelHead):
                m.fuse()
        return self
