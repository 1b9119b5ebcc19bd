"""The D-FINE hybrid encoder: AIFI transformer on the coarsest level + GELAN-style FPN/PAN.

Same data flow as RT-DETR's :class:`~.hybrid_encoder.HybridEncoder` (its ``forward`` is
inherited), with other fusion blocks: the FPN/PAN blocks are :class:`RepNCSPELAN4` (CSP-ELAN
whose two branches are RT-DETR's CSPRepLayer + a 3x3 ConvNorm) where RT-DETR has plain
CSPRepLayers, the downsampling is a separable :class:`SCDown` where RT-DETR has a 3x3/2 conv,
and the lateral 1x1 convs have no activation.

Layout (attribute names are checkpoint keys):
``input_proj.<i>.{conv, norm}`` (1x1 projection of backbone level i to ``hidden_dim``),
``encoder.<j>.layers.<k>`` (AIFI on each level of ``use_encoder_idx``), ``lateral_convs`` +
``fpn_blocks`` (top-down), ``downsample_convs.<i>.0`` (an SCDown) + ``pan_blocks`` (bottom-up).
"""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from .hybrid_encoder import CSPRepLayer, HybridEncoder, RepVggBlock, TransformerEncoder
from .layers import ConvNorm


class SCDown(nn.Module):
    """Separable downsample: 1x1 ConvNorm then a depthwise k x k / s ConvNorm (no activations)."""

    def __init__(self, c_in: int, c_out: int, k: int = 3, s: int = 2):
        super().__init__()
        self.cv1 = ConvNorm(c_in, c_out, 1)
        self.cv2 = ConvNorm(c_out, c_out, k, s, groups=c_out)   # depthwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))


class CSPRepLayer2(nn.Module):
    """One 1x1 ConvNorm to twice the width, split in halves; the second half runs through ``n``
    RepVGG blocks and is added to the first (YOLO's RepC3; DEIMv2's and ECDet's "csp2")."""

    def __init__(self, c_in: int, c_out: int, n: int = 3, expansion: float = 1.0, act: str = "silu"):
        super().__init__()
        hidden = int(c_out * expansion)
        self.conv1 = ConvNorm(c_in, 2 * hidden, 1, 1, act=act)
        self.bottlenecks = nn.Sequential(*[RepVggBlock(hidden, hidden, act) for _ in range(n)])
        self.conv3 = ConvNorm(hidden, c_out, 1, 1, act=act) if hidden != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.conv1(x).chunk(2, 1)
        return self.conv3(a + self.bottlenecks(b))


class RepNCSPELAN4(nn.Module):
    """CSP-ELAN: 1x1 to ``c3`` split in halves; the second half runs through two chained
    (CSP layer -> 3x3 ConvNorm) branches of width ``c4``; the four parts are concatenated
    and projected by a 1x1 to ``c2``.

    ``csp``: "csp" (:class:`CSPRepLayer`, D-FINE) or "csp2" (:class:`CSPRepLayer2`, DEIMv2 / ECDet);
    ``tail``: whether each branch ends with the 3x3 ConvNorm (False: DEIMv2's "deim" encoder
    version and ECDet, whose branches are the CSP layer alone).
    """

    def __init__(self, c1: int, c2: int, c3: int, c4: int, n: int, act: str = "silu", csp: str = "csp",
                 tail: bool = True):
        super().__init__()
        if csp not in ("csp", "csp2"):
            raise ValueError(f"unknown CSP layer {csp!r} (expected 'csp' or 'csp2')")
        layer = CSPRepLayer if csp == "csp" else CSPRepLayer2

        def branch(c_in: int) -> nn.Sequential:
            parts = [layer(c_in, c4, n, 1.0, act)]
            if tail:
                parts.append(ConvNorm(c4, c4, 3, act=act))
            return nn.Sequential(*parts)

        self.half = c3 // 2
        self.cv1 = ConvNorm(c1, c3, 1, act=act)
        self.cv2 = branch(c3 // 2)
        self.cv3 = branch(c4)
        self.cv4 = ConvNorm(c3 + 2 * c4, c2, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).split((self.half, self.half), 1)
        c = self.cv2(b)
        d = self.cv3(c)
        return self.cv4(torch.cat([a, b, c, d], 1))


class DFineHybridEncoder(HybridEncoder):
    """Multi-level features (B, C_i, H_i, W_i) -> one (B, hidden_dim, H_i, W_i) map per level.

    ``expansion`` and ``depth_mult`` size the RepNCSPELAN4 blocks (branch width
    ``round(expansion * hidden_dim // 2)``, ``round(3 * depth_mult)`` RepVGG blocks per CSP layer).

    Options for the later variants of the line (defaults are D-FINE's): ``csp_type`` and
    ``elan_tail`` (see :class:`RepNCSPELAN4`), ``fuse_op`` ("cat" or "sum", see
    :class:`~.hybrid_encoder.HybridEncoder`), ``identity_proj`` (no projection, hence no
    checkpoint keys, for input levels already ``hidden_dim`` wide: DEIMv2 and ECDet).
    """

    def __init__(self, in_channels: tuple[int, ...], hidden_dim: int = 256, *, nhead: int = 8,
                 dim_feedforward: int = 1024, enc_act: str = "gelu", use_encoder_idx: tuple[int, ...] = (2,),
                 num_encoder_layers: int = 1, pe_temperature: float = 10000.0, expansion: float = 1.0,
                 depth_mult: float = 1.0, act: str = "silu", csp_type: str = "csp", elan_tail: bool = True,
                 fuse_op: str = "cat", identity_proj: bool = False):
        nn.Module.__init__(self)  # same attributes and forward as HybridEncoder, other blocks
        if fuse_op not in ("cat", "sum"):
            raise ValueError(f"unknown fuse_op {fuse_op!r} (expected 'cat' or 'sum')")
        self.fuse_op = fuse_op
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = tuple(use_encoder_idx)
        self.pe_temperature = pe_temperature
        levels = len(in_channels)
        self.input_proj = nn.ModuleList(
            nn.Identity() if identity_proj and c == hidden_dim else
            nn.Sequential(OrderedDict(conv=nn.Conv2d(c, hidden_dim, 1, bias=False), norm=nn.BatchNorm2d(hidden_dim)))
            for c in in_channels)
        self.encoder = nn.ModuleList(
            TransformerEncoder(num_encoder_layers, hidden_dim, nhead, dim_feedforward, enc_act)
            for _ in self.use_encoder_idx)
        branch = round(expansion * hidden_dim // 2)
        depth = round(3 * depth_mult)

        def elan() -> RepNCSPELAN4:
            c_in = hidden_dim if fuse_op == "sum" else hidden_dim * 2
            return RepNCSPELAN4(c_in, hidden_dim, hidden_dim * 2, branch, depth, act, csp_type, elan_tail)

        self.lateral_convs = nn.ModuleList(ConvNorm(hidden_dim, hidden_dim, 1) for _ in range(levels - 1))
        self.fpn_blocks = nn.ModuleList(elan() for _ in range(levels - 1))
        self.downsample_convs = nn.ModuleList(nn.Sequential(SCDown(hidden_dim, hidden_dim, 3, 2))
                                              for _ in range(levels - 1))
        self.pan_blocks = nn.ModuleList(elan() for _ in range(levels - 1))
