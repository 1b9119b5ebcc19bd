"""The D-FINE decoder: query selection + Fine-grained Distribution Refinement (FDR).

Data flow (eval): the encoder maps are flattened into one memory sequence; each token gets an
anchor (grid centre, size 0.05 * 2**level, in logit space; tokens too close to the border are
invalid and their memory is zeroed for the selection). ``enc_output`` + ``enc_score_head`` score
every token, the top ``num_queries`` by max class logit become the queries (content = their
memory, reference box = ``enc_bbox_head`` + anchor). Each decoder layer refines the queries
(self-attention, multi-scale deformable cross-attention whose sampling offsets scale with the
reference box and ``1 / points-per-level``, a gated residual, a feed-forward). After the first
layer ``pre_bbox_head`` fixes the initial boxes; every layer then predicts, per box edge, a
distribution over ``reg_max + 1`` bins whose values come from the non-uniform weighting
function W(n) (set by ``up`` and ``reg_scale``). The expected value of that distribution is the
edge's distance from the initial box, and the distributions are refined residually layer to
layer. The class logits of the evaluated layer get a localization-quality term (LQE) computed
from the top-4 probabilities of each edge distribution.

Layout (checkpoint keys): ``up``, ``reg_scale`` (also registered, tied, under ``decoder.``),
``anchors`` / ``valid_mask`` (precomputed for ``eval_size``; used only at exactly that size),
``input_proj``, ``decoder.{layers, lqe_layers}``, ``denoising_class_embed``,
``query_pos_head``, ``enc_output.{proj, norm}``, ``enc_score_head``, ``enc_bbox_head``,
``dec_score_head``, ``pre_bbox_head``, ``dec_bbox_head`` (the order of these modules is a
constructor option, because the checkpoint key order of the later DEIM variants differs).

Everything in eval mode has fixed shapes and no host synchronisation (CUDA-graph capturable).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import layers
from .deformable import deformable_sample
from .denoising import contrastive_denoising, split_denoising_outputs
from .layers import activation, inverse_sigmoid
from .rtdetr_decoder import generate_anchors

#: registration (= checkpoint key) order of the decoder's sub-modules in D-FINE / DEIM / RT-DETRv4
DFINE_MODULE_ORDER = ("input_proj", "decoder", "denoising_class_embed", "query_pos_head", "enc_output",
                      "enc_score_head", "enc_bbox_head", "dec_score_head", "pre_bbox_head", "dec_bbox_head")
#: the same in DEIMv2 and EdgeCrafter's ECDet (whose ``enc_output`` is absent: an identity)
DEIMV2_MODULE_ORDER = ("input_proj", "decoder", "denoising_class_embed", "enc_output", "enc_score_head",
                       "enc_bbox_head", "query_pos_head", "pre_bbox_head", "dec_score_head", "dec_bbox_head")


MLP = layers.MLP  # with its ``act`` option (D-FINE-style heads choose theirs)


def weighting_function(reg_max: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """W(n), the ``reg_max + 1`` bin values of the edge-offset distribution.

    Symmetric around 0 (the centre bin), growing geometrically towards both ends so the bins
    are fine near 0 and coarse far away; the outermost bins sit at +-2 * |up| * |reg_scale|.
    Built from tensor ops only (no ``.item()``), so it can run inside a CUDA graph.
    """
    bound = up.abs() * reg_scale.abs()                          # (1,)
    step = (bound + 1) ** (2 / (reg_max - 2))
    exps = torch.arange(1, reg_max // 2, device=up.device, dtype=up.dtype)
    right = step ** exps - 1                                    # step**1 - 1 ... step**(R/2-1) - 1
    left = 1 - step ** exps.flip(0)
    return torch.cat([-2 * bound, left, torch.zeros_like(bound), right, 2 * bound])


def integral(corners: torch.Tensor, project: torch.Tensor, reg_max: int) -> torch.Tensor:
    """(..., 4 * (reg_max + 1)) edge logits -> (..., 4) expected offsets under softmax, in W(n) units."""
    prob = F.softmax(corners.reshape(*corners.shape[:-1], 4, reg_max + 1), dim=-1)
    return F.linear(prob, project)


def distance_to_box(ref: torch.Tensor, dist: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """Reference boxes (cx, cy, w, h) + edge offsets (l, t, r, b) -> boxes (cx, cy, w, h).

    Edge e of the box lies at ``centre +- (reg_scale / 2 + d_e) * size / reg_scale``: an offset
    of 0 reproduces the reference box.
    """
    rs = reg_scale.abs()
    half = 0.5 * rs
    cx, cy, w, h = ref.unbind(-1)
    x1 = cx - (half + dist[..., 0]) * (w / rs)
    y1 = cy - (half + dist[..., 1]) * (h / rs)
    x2 = cx + (half + dist[..., 2]) * (w / rs)
    y2 = cy + (half + dist[..., 3]) * (h / rs)
    return torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1)


class FDRDeformableAttention(nn.Module):
    """Deformable cross-attention over reference boxes, without value/output projections.

    Offsets are scaled by the box size, by ``offset_scale`` and by ``num_points_scale``
    (1 / points of the sampled level, a buffer), so each level spreads its points over the box.
    """

    def __init__(self, dim: int, heads: int, points: Sequence[int], offset_scale: float = 0.5):
        super().__init__()
        self.heads = heads
        self.points = tuple(int(p) for p in points)
        self.offset_scale = offset_scale
        total = sum(self.points)
        self.register_buffer("num_points_scale",
                             torch.tensor([1.0 / p for p in self.points for _ in range(p)], dtype=torch.float32))
        self.sampling_offsets = nn.Linear(dim, heads * total * 2)
        self.attention_weights = nn.Linear(dim, heads * total)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.heads, dtype=torch.float32) * (2.0 * math.pi / self.heads)
        dirs = torch.stack([angles.cos(), angles.sin()], -1)
        dirs = dirs / dirs.abs().max(-1, keepdim=True).values
        reach = torch.cat([torch.arange(1, p + 1, dtype=torch.float32) for p in self.points])
        with torch.no_grad():
            self.sampling_offsets.bias.copy_((dirs[:, None, :] * reach[None, :, None]).flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)

    def forward(self, query: torch.Tensor, ref: torch.Tensor, value: torch.Tensor,
                shapes: list[tuple[int, int]]) -> torch.Tensor:
        """query (B, Q, C); ref (B, Q, 1, 4) cxcywh in [0, 1]; value (B, sum(h*w), heads, C / heads)."""
        b, q, _ = query.shape
        total = sum(self.points)
        offsets = self.sampling_offsets(query).reshape(b, q, self.heads, total, 2)
        weights = self.attention_weights(query).reshape(b, q, self.heads, total).softmax(-1)
        scale = self.num_points_scale.to(query.dtype).unsqueeze(-1)                # (P, 1)
        loc = ref[:, :, None, :, :2] + offsets * scale * ref[:, :, None, :, 2:] * self.offset_scale
        return deformable_sample(value, shapes, loc, weights, list(self.points))


class Gate(nn.Module):
    """Gated residual: sigmoid gates (from both inputs) weight each input, then LayerNorm."""

    def __init__(self, dim: int):
        super().__init__()
        self.gate = nn.Linear(2 * dim, 2 * dim)
        self.norm = nn.LayerNorm(dim)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        g1, g2 = torch.sigmoid(self.gate(torch.cat([x, y], -1))).chunk(2, -1)
        return self.norm(g1 * x + g2 * y)


class FDRDecoderLayer(nn.Module):
    """Self-attention (post-norm) -> deformable cross-attention merged by a :class:`Gate` ->
    feed-forward (post-norm, clamped to the fp16 range before the norm).

    ``out_norm`` is the checkpoint name of the last LayerNorm ("norm3" in D-FINE / DEIM,
    "norm2" in EdgeCrafter's ECDet).
    """

    def __init__(self, dim: int, heads: int, ffn: int, points: Sequence[int], act: str = "relu",
                 out_norm: str = "norm3"):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = FDRDeformableAttention(dim, heads, points)
        self.gateway = Gate(dim)
        self.linear1 = nn.Linear(dim, ffn)
        self.linear2 = nn.Linear(ffn, dim)
        self.out_norm = out_norm
        self.add_module(out_norm, nn.LayerNorm(dim))
        self.act = activation(act)
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(self, x: torch.Tensor, ref: torch.Tensor, value: torch.Tensor, shapes: list[tuple[int, int]],
                attn_mask: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor:
        q = x + pos
        x = self.norm1(x + self.self_attn(q, q, x, attn_mask=attn_mask, need_weights=False)[0])
        x = self.gateway(x, self.cross_attn(x + pos, ref, value, shapes))
        x = x + self.linear2(self.act(self.linear1(x)))
        return getattr(self, self.out_norm)(x.clamp(-65504, 65504))


class LQE(nn.Module):
    """Localization-quality estimate: top-k bin probabilities (+ their mean) per edge -> MLP -> added
    to the class logits."""

    def __init__(self, k: int, hidden: int, num_layers: int, reg_max: int, act: str = "relu"):
        super().__init__()
        self.k = k
        self.reg_max = reg_max
        self.reg_conf = MLP(4 * (k + 1), hidden, 1, num_layers, act)
        nn.init.zeros_(self.reg_conf.layers[-1].weight)
        nn.init.zeros_(self.reg_conf.layers[-1].bias)

    def forward(self, scores: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
        b, q, _ = corners.shape
        prob = F.softmax(corners.reshape(b, q, 4, self.reg_max + 1), dim=-1)
        top = prob.topk(self.k, dim=-1).values
        stat = torch.cat([top, top.mean(-1, keepdim=True)], -1).reshape(b, q, -1)
        return scores + self.reg_conf(stat)


class FDRLayers(nn.Module):
    """Container of the refinement stack (checkpoint prefix ``decoder.decoder``): the decoder
    layers, one LQE per layer, and the shared ``up`` / ``reg_scale`` parameters (tied)."""

    def __init__(self, layers: list[nn.Module], lqe_layers: list[nn.Module], up: nn.Parameter,
                 reg_scale: nn.Parameter):
        super().__init__()
        self.up = up
        self.reg_scale = reg_scale
        self.layers = nn.ModuleList(layers)
        self.lqe_layers = nn.ModuleList(lqe_layers)


class DFineDecoder(nn.Module):
    """The D-FINE decoder (see the module docstring).

    Constructor options (the defaults are D-FINE's):
    ``num_layers`` decoder layers, evaluated up to ``eval_idx`` (-1: the last);
    ``num_points`` per level (int or one per level); ``activation`` of the decoder layers' FFN
    and of the LQE MLPs; ``mlp_act`` of the box / query-position MLPs (D-FINE: both "relu";
    DEIM and RT-DETRv4: both "silu"); ``query_pos_layers`` / ``query_pos_hidden`` (depth and
    width of ``query_pos_head``; width default ``2 * hidden_dim``); ``enc_output`` (whether the
    Linear + LayerNorm before query selection exists); ``module_order`` (registration order =
    checkpoint key order of the sub-modules); ``layer_factory(i)`` to build a different decoder
    layer (same call signature as :class:`FDRDecoderLayer`); ``eval_size`` (h, w) for which the
    ``anchors`` / ``valid_mask`` buffers are precomputed (None: no buffers);
    ``query_pos_per_layer`` (D-FINE re-embeds the refined boxes before every layer; DEIMv2 and
    ECDet embed the initial boxes once); ``share_bbox_head`` (one ``dec_bbox_head`` module for
    every layer, listed under each index: DEIMv2's smallest sizes).
    """

    #: segmentation variants set this to get the evaluated layer's queries back (``"queries"``; in
    #: training, every layer's, so ``aux_outputs`` / ``dn_outputs`` carry them too)
    return_queries = False

    def __init__(self, num_classes: int = 80, hidden_dim: int = 256, num_queries: int = 300,
                 feat_channels: Sequence[int] = (256, 256, 256), feat_strides: Sequence[int] = (8, 16, 32),
                 num_levels: int = 3, num_points: int | Sequence[int] = 4, heads: int = 8,
                 num_layers: int = 6, dim_feedforward: int = 1024, activation: str = "relu",
                 mlp_act: str = "relu", num_denoising: int = 100, eval_size: tuple[int, int] | None = (640, 640),
                 eval_idx: int = -1, eps: float = 1e-2, reg_max: int = 32, reg_scale: float = 4.0,
                 query_pos_layers: int = 2, query_pos_hidden: int | None = None, enc_output: bool = True,
                 module_order: Sequence[str] = DFINE_MODULE_ORDER,
                 layer_factory: Callable[[int], nn.Module] | None = None,
                 query_pos_per_layer: bool = True, share_bbox_head: bool = False):
        super().__init__()
        feat_strides = list(feat_strides)
        if len(feat_channels) > num_levels or len(feat_strides) != len(feat_channels):
            raise ValueError("feat_channels / feat_strides must have one entry per input level (<= num_levels)")
        while len(feat_strides) < num_levels:
            feat_strides.append(feat_strides[-1] * 2)
        points = [int(num_points)] * num_levels if isinstance(num_points, int) else [int(p) for p in num_points]
        if len(points) != num_levels:
            raise ValueError(f"num_points needs one entry per level ({num_levels}), got {points}")
        self.hidden_dim = hidden_dim
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.num_levels = num_levels
        self.feat_strides = tuple(feat_strides)
        self.heads = heads
        self.reg_max = reg_max
        self.eps = eps
        self.eval_idx = eval_idx if eval_idx >= 0 else num_layers + eval_idx
        self.eval_size = tuple(eval_size) if eval_size else None
        self.query_pos_per_layer = query_pos_per_layer
        # query denoising settings (training with targets; see denoising.py), not in the state dict
        self.num_denoising, self.label_noise_ratio, self.box_noise_scale = num_denoising, 0.5, 1.0
        self.dn_pad_to: int | None = None

        self.up = nn.Parameter(torch.tensor([0.5]), requires_grad=False)
        self.reg_scale = nn.Parameter(torch.tensor([float(reg_scale)]), requires_grad=False)
        if self.eval_size:
            anchors, valid = generate_anchors(self._eval_shapes(), eps=eps)
            self.register_buffer("anchors", anchors)
            self.register_buffer("valid_mask", valid)
        else:
            self.anchors = self.valid_mask = None

        make_layer = layer_factory or (lambda i: FDRDecoderLayer(hidden_dim, heads, dim_feedforward, points,
                                                                 activation))
        pos_hidden = query_pos_hidden or 2 * hidden_dim
        bins = 4 * (reg_max + 1)
        modules: dict[str, nn.Module] = {
            "input_proj": self._input_proj(list(feat_channels)),
            "decoder": FDRLayers([make_layer(i) for i in range(num_layers)],
                                 [LQE(4, 64, 2, reg_max, activation) for _ in range(num_layers)],
                                 self.up, self.reg_scale),
            "denoising_class_embed": (nn.Embedding(num_classes + 1, hidden_dim, padding_idx=num_classes)
                                      if num_denoising > 0 else nn.Identity()),
            "query_pos_head": MLP(4, pos_hidden, hidden_dim, query_pos_layers, mlp_act),
            "enc_output": (nn.Sequential(OrderedDict(proj=nn.Linear(hidden_dim, hidden_dim),
                                                     norm=nn.LayerNorm(hidden_dim)))
                           if enc_output else nn.Identity()),
            "enc_score_head": nn.Linear(hidden_dim, num_classes),
            "enc_bbox_head": MLP(hidden_dim, hidden_dim, 4, 3, mlp_act),
            "dec_score_head": nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_layers)),
            "pre_bbox_head": MLP(hidden_dim, hidden_dim, 4, 3, mlp_act),
            "dec_bbox_head": nn.ModuleList(
                [MLP(hidden_dim, hidden_dim, bins, 3, mlp_act)] * num_layers if share_bbox_head
                else [MLP(hidden_dim, hidden_dim, bins, 3, mlp_act) for _ in range(num_layers)]),
        }
        if sorted(module_order) != sorted(modules):
            raise ValueError(f"module_order must list exactly: {', '.join(modules)}")
        for name in module_order:
            self.add_module(name, modules[name])
        self._reset_parameters()

    # ------------------------------------------------------------------ construction
    def _input_proj(self, feat_channels: list[int]) -> nn.ModuleList:
        """1x1 conv + BN per input level whose width differs from ``hidden_dim`` (else identity);
        extra levels beyond the inputs are 3x3/2 conv + BN of the previous one."""
        def conv_bn(c_in: int, k: int, s: int) -> nn.Module:
            return nn.Sequential(OrderedDict(conv=nn.Conv2d(c_in, self.hidden_dim, k, s, (k - 1) // 2, bias=False),
                                             norm=nn.BatchNorm2d(self.hidden_dim)))
        projs = [nn.Identity() if c == self.hidden_dim else conv_bn(c, 1, 1) for c in feat_channels]
        c = feat_channels[-1]
        for _ in range(self.num_levels - len(feat_channels)):
            projs.append(nn.Identity() if c == self.hidden_dim else conv_bn(c, 3, 2))
            c = self.hidden_dim
        return nn.ModuleList(projs)

    def _reset_parameters(self) -> None:
        prior = -math.log((1 - 0.01) / 0.01)
        nn.init.constant_(self.enc_score_head.bias, prior)
        for mlp in (self.enc_bbox_head, self.pre_bbox_head, *self.dec_bbox_head):
            nn.init.zeros_(mlp.layers[-1].weight)
            nn.init.zeros_(mlp.layers[-1].bias)
        for head in self.dec_score_head:
            nn.init.constant_(head.bias, prior)
        if isinstance(self.enc_output, nn.Sequential):
            nn.init.xavier_uniform_(self.enc_output.proj.weight)
        for layer in self.query_pos_head.layers:
            nn.init.xavier_uniform_(layer.weight)
        if isinstance(self.denoising_class_embed, nn.Embedding):
            nn.init.normal_(self.denoising_class_embed.weight[:-1])

    def _eval_shapes(self) -> list[tuple[int, int]]:
        h, w = self.eval_size
        return [(int(h / s), int(w / s)) for s in self.feat_strides]

    # ------------------------------------------------------------------ forward
    def _flatten(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        maps = [proj(f) for proj, f in zip(self.input_proj, feats)]
        for i in range(len(feats), self.num_levels):
            maps.append(self.input_proj[i](feats[-1] if i == len(feats) else maps[-1]))
        shapes = [(m.shape[2], m.shape[3]) for m in maps]
        return torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1), shapes

    def _anchors(self, shapes: list[tuple[int, int]], device: torch.device,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        if self.anchors is not None and not self.training and shapes == self._eval_shapes():
            return self.anchors, self.valid_mask
        anchors, valid = generate_anchors(shapes, eps=self.eps, device=device)
        # in the activations' dtype, as the native-size buffers are in a half copy (fp32: no-op)
        return anchors.to(dtype), valid

    def _select_queries(self, memory: torch.Tensor, shapes: list[tuple[int, int]]):
        """Top ``num_queries`` tokens by max encoder class logit -> (content, box logits, enc logits, enc boxes)."""
        b, n, c = memory.shape
        anchors, valid = self._anchors(shapes, memory.device, memory.dtype)
        selected = self.enc_output(valid.to(memory.dtype) * memory)
        logits = self.enc_score_head(selected)
        k = min(self.num_queries, n)
        index = logits.max(-1).values.topk(k, dim=1).indices                       # (B, K)
        pick = index.unsqueeze(-1)
        content = selected.gather(1, pick.expand(-1, -1, c))
        box_unact = self.enc_bbox_head(content) + anchors.expand(b, -1, -1).gather(1, pick.expand(-1, -1, 4))
        enc_logits = logits.gather(1, pick.expand(-1, -1, logits.shape[-1])) if self.training else None
        return content.detach(), box_unact.detach(), enc_logits, box_unact

    def forward(self, feats: list[torch.Tensor], targets=None) -> dict:
        """Encoder maps -> {"pred_logits": (B, Q, nc), "pred_boxes": (B, Q, 4) cxcywh in [0, 1]}.

        In training mode every layer runs and the dict also carries the per-layer outputs
        (``aux_outputs``), the first-layer boxes (``pre_outputs``), the selected encoder
        proposals (``enc_outputs``) and the edge distributions. With ``targets`` (``{"labels",
        "boxes" (normalised cxcywh), "mask"}``) training adds the denoising queries (see
        :mod:`.denoising`): their outputs come back as ``dn_outputs`` (every layer),
        ``dn_pre_outputs`` and ``dn_meta``.
        """
        memory, shapes = self._flatten(feats)
        b, n, c = memory.shape
        x, ref_unact, enc_logits, enc_box_unact = self._select_queries(memory, shapes)
        dn = None
        if self.training and targets is not None and self.num_denoising > 0:
            dn = contrastive_denoising(targets, self.num_classes, x.shape[1], self.denoising_class_embed,
                                       self.decoder.layers[0].self_attn.num_heads, num_denoising=self.num_denoising,
                                       label_noise_ratio=self.label_noise_ratio,
                                       box_noise_scale=self.box_noise_scale, pad_to=self.dn_pad_to)
        if dn is not None:  # denoising queries first: [denoising | matching]
            x = torch.cat([dn.content.to(x.dtype), x], 1)
            ref_unact = torch.cat([dn.ref_unact.to(ref_unact.dtype), ref_unact], 1)
        attn_mask = dn.attn_mask if dn is not None else None
        value = memory.reshape(b, n, self.heads, c // self.heads)

        stack: FDRLayers = self.decoder
        project = weighting_function(self.reg_max, self.up, self.reg_scale)
        ref = ref_unact.sigmoid()
        prev_x: torch.Tensor | float = 0.0
        prev_corners: torch.Tensor | float = 0.0
        outs = []
        pos = self.query_pos_head(ref).clamp(-10, 10)
        for i, layer in enumerate(stack.layers):
            if i > 0 and self.query_pos_per_layer:
                pos = self.query_pos_head(ref).clamp(-10, 10)
            x = layer(x, ref.unsqueeze(2), value, shapes, attn_mask, pos)
            if i == 0:
                first_boxes = torch.sigmoid(self.pre_bbox_head(x) + inverse_sigmoid(ref))
                first_logits = self.dec_score_head[0](x)
                initial = first_boxes.detach()
            corners = self.dec_bbox_head[i](x + prev_x) + prev_corners
            boxes = distance_to_box(initial, integral(corners, project, self.reg_max), self.reg_scale)
            if self.training or i == self.eval_idx:
                logits = stack.lqe_layers[i](self.dec_score_head[i](x), corners)
                outs.append({"pred_logits": logits, "pred_boxes": boxes, "pred_corners": corners,
                             "ref_points": initial})
                if self.return_queries:   # every layer's (segment variants' mask loss supervises each)
                    outs[-1]["queries"] = x
                if not self.training:
                    break
            prev_corners = corners
            ref = boxes.detach()
            prev_x = x.detach()

        last = outs[-1]
        if not self.training:
            keep = ("pred_logits", "pred_boxes", "queries") if self.return_queries else ("pred_logits", "pred_boxes")
            return {k: last[k] for k in keep}
        return split_denoising_outputs(
            {**last, "up": self.up, "reg_scale": self.reg_scale, "aux_outputs": outs[:-1],
             "pre_outputs": {"pred_logits": first_logits, "pred_boxes": first_boxes},
             "enc_outputs": {"pred_logits": enc_logits, "pred_boxes": enc_box_unact.sigmoid()}}, dn)
