"""ECPose network: the ECDet backbone and hybrid encoder with a DETRPose-style keypoint decoder.

EdgeCrafter's pose model keeps ECDet's ECViT backbone and hybrid encoder and replaces the box
decoder with a keypoint decoder after DETRPose:

* Query selection (two-stage): the flattened encoder memory (cells too close to the border are
  zeroed) goes through ``enc_output`` + ``enc_output_norm``; ``enc_out_class_embed`` scores every
  cell and the top ``num_queries`` cells by max logit become the instances. ``enc_pose_embed``
  predicts each instance's K keypoints as offsets (logit space) from its cell centre.
* Each query is a group of K + 1 tokens: an instance token (``instance_embedding``) then one token
  per keypoint (``keypoint_embedding`` + the learned ``tgt_embed`` content of the query). The
  reference points are the instance centre (mean of the keypoints) then the keypoints.
* Each decoder layer runs self-attention within an instance (over its K + 1 tokens), self-attention
  across instances (the same token of every query), multi-scale deformable cross-attention (each
  token samples around its own reference point), a gated residual and a feed-forward. The
  position embedding (a sine embedding of the reference point through ``half_pose_ref_point_head``)
  is added to the keypoint tokens only.
* After the first layer ``pre_pose_embed`` fixes the initial keypoints; every layer then predicts,
  per keypoint coordinate, a distribution over ``reg_max + 1`` bins (the FDR weighting function,
  as D-FINE); its expected value / ``reg_scale`` is the offset from the initial keypoint, refined
  residually layer to layer. The instance token's class logits get a quality term (``lqe_embed``)
  from the top-4 channel values of the stride-8 map sampled at each predicted keypoint.

The original adds the position embedding to the keypoint tokens in place, so the attention values,
the residuals, the gate input and the next layer's refinement input all carry it; this module
computes the same values out of place (no aliasing, differentiable).

Layout (checkpoint keys): ``backbone.*`` and ``encoder.*`` as ECDet; ``decoder.{up, reg_scale,
anchors, valid_mask}`` (anchors are cell centres in logit space for the native 640 input; the
stored ``valid_mask`` marks the cells to zero), ``decoder.decoder.{dim_t, layers,
half_pose_ref_point_head}``, ``decoder.{keypoint_embedding, instance_embedding, tgt_embed,
label_enc, pose_enc, enc_output, enc_output_norm, class_embed, lqe_embed, pose_embed,
pre_pose_embed, enc_pose_embed, enc_out_class_embed}``. ``label_enc`` / ``pose_enc`` are the
original's query-denoising embeddings, kept so its checkpoints load.

Eval output: ``{"pred_logits": (B, Q, 2) pre-sigmoid (the last logit is the person score),
"pred_keypoints": (B, Q, 2K) x1, y1, ..., xK, yK normalised to the input}``. Every shape is fixed
and nothing syncs with the host. Training mode adds, in the same format, every earlier layer's
outputs (``aux_outputs``), the first layer's initial keypoints (``pre_outputs``) and the selected
encoder proposals (``enc_outputs``), each supervised by the set criterion (:mod:`.pose_loss`).
Query denoising (the original's ``label_enc`` / ``pose_enc`` groups) is not used in training here.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..detr_common.dfine_decoder import Gate, weighting_function
from ..detr_common.dfine_encoder import DFineHybridEncoder
from ..detr_common.layers import MLP, inverse_sigmoid
from .backbone import ECBackbone
from .nn import INPUT_SIZE, STRIDES, ECConfig

#: decoder layers, queries, deformable points per level and feed-forward width of ECPose
POSE_LAYERS = 3
POSE_QUERIES = 60
POSE_POINTS = 4
POSE_FFN = 512
#: keypoints of the COCO person skeleton the released checkpoints predict
COCO_KEYPOINTS = 17


def pose_offsets(value: torch.Tensor, shapes: list[tuple[int, int]], loc: torch.Tensor,
                 weights: torch.Tensor) -> torch.Tensor:
    """Weighted bilinear sampling of multi-level values at per-token locations.

    value (B, N, heads, c) with N = sum(h * w); loc (B, L, heads, levels, points, 2) in [0, 1];
    weights (B, L, heads, levels, points). Returns (B, L, heads * c). Sampling runs in float32.
    """
    dtype = value.dtype
    value, loc, weights = value.float(), loc.float(), weights.float()
    b, _, heads, c = value.shape
    lq = loc.shape[1]
    per_level = value.permute(0, 2, 3, 1).flatten(0, 1).split([h * w for h, w in shapes], dim=-1)
    grids = (2.0 * loc - 1.0).transpose(1, 2).flatten(0, 1)                  # (B*heads, L, levels, P, 2)
    sampled = [F.grid_sample(v.reshape(b * heads, c, h, w), grids[:, :, i], mode="bilinear",
                             padding_mode="zeros", align_corners=False)
               for i, (v, (h, w)) in enumerate(zip(per_level, shapes))]    # each (B*heads, c, L, P)
    w = weights.transpose(1, 2).reshape(b * heads, 1, lq, -1)
    out = (torch.cat(sampled, -1) * w).sum(-1)                             # (B*heads, c, L)
    return out.reshape(b, heads * c, lq).transpose(1, 2).to(dtype)


class PoseDeformableAttention(nn.Module):
    """Deformable cross-attention around reference points (no value/output projections): per
    head, level and point an offset in cells of that level and a softmax weight."""

    def __init__(self, dim: int, levels: int, heads: int, points: int):
        super().__init__()
        self.levels, self.heads, self.points = levels, heads, points
        self.sampling_offsets = nn.Linear(dim, heads * levels * points * 2)
        self.attention_weights = nn.Linear(dim, heads * levels * points)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.heads, dtype=torch.float32) * (2.0 * math.pi / self.heads)
        dirs = torch.stack([angles.cos(), angles.sin()], -1)
        dirs = dirs / dirs.abs().max(-1, keepdim=True).values
        reach = (torch.arange(self.points, dtype=torch.float32) % 4 + 1)
        grid = dirs[:, None, None, :] * reach[None, None, :, None]
        grid = grid.expand(self.heads, self.levels, self.points, 2)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.reshape(-1) if self.points % 4 == 0 else 0.0 * grid.reshape(-1))
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)

    def forward(self, query: torch.Tensor, ref: torch.Tensor, value: torch.Tensor,
                shapes: list[tuple[int, int]]) -> torch.Tensor:
        """query (B, L, C); ref (B, L, 2) x, y in [0, 1]; value (B, N, heads, C / heads)."""
        b, lq, _ = query.shape
        offsets = self.sampling_offsets(query).reshape(b, lq, self.heads, self.levels, self.points, 2)
        weights = self.attention_weights(query).reshape(b, lq, self.heads, self.levels * self.points)
        weights = weights.softmax(-1).reshape(b, lq, self.heads, self.levels, self.points)
        # offsets are in cells of each level: divide by (w, h), written by fill_ kernels on the device:
        # torch.tensor(..., device=cuda) or an item assignment copies from pageable host memory,
        # which a CUDA-graph capture refuses
        norm = query.new_empty(len(shapes), 2)
        for i, (h, w) in enumerate(shapes):
            norm[i, 0].fill_(w)
            norm[i, 1].fill_(h)
        loc = ref[:, :, None, None, None, :] + offsets / norm[None, None, None, :, None, :]
        return pose_offsets(value, shapes, loc, weights)


class PoseDecoderLayer(nn.Module):
    """Within-instance self-attention -> across-instance self-attention -> deformable
    cross-attention merged by a :class:`Gate` -> feed-forward (post-norm)."""

    def __init__(self, dim: int, heads: int, ffn: int, levels: int, points: int):
        super().__init__()
        self.within_attn = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.within_norm = nn.LayerNorm(dim)
        self.across_attn = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.across_norm = nn.LayerNorm(dim)
        self.cross_attn = PoseDeformableAttention(dim, levels, heads, points)
        self.gateway = Gate(dim)
        self.linear1 = nn.Linear(dim, ffn)
        self.linear2 = nn.Linear(ffn, dim)
        self.norm2 = nn.LayerNorm(dim)
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)

    @staticmethod
    def with_pos(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``pos`` (B, Q, K, C) added to the last K tokens of ``x`` (B, Q, K + 1, C)."""
        k = pos.shape[2]
        return torch.cat([x[:, :, :-k], x[:, :, -k:] + pos], dim=2)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, ref: torch.Tensor, value: torch.Tensor,
                shapes: list[tuple[int, int]], attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, Q, T, C) tokens; pos (B, Q, T - 1, C); ref (B, Q, T, 2); value as the attention's."""
        b, q, t, c = x.shape
        x = self.with_pos(x, pos)
        flat = x.flatten(0, 1)
        x = self.within_norm(x + self.within_attn(flat, flat, flat, need_weights=False)[0].reshape(b, q, t, c))
        y = x.transpose(1, 2).flatten(0, 1)                                   # (B*T, Q, C)
        y = self.across_norm(y + self.across_attn(y, y, y, attn_mask=attn_mask, need_weights=False)[0])
        x = self.with_pos(y.reshape(b, t, q, c).transpose(1, 2), pos)
        sampled = self.cross_attn(x.flatten(1, 2), ref.flatten(1, 2), value, shapes).reshape(b, q, t, c)
        x = self.gateway(x, sampled)
        x = x + self.linear2(F.relu(self.linear1(x)))
        return self.norm2(x.clamp(-65504, 65504))


class PoseLayers(nn.Module):
    """The refinement stack (checkpoint prefix ``decoder.decoder``) and its position-embedding head."""

    def __init__(self, dim: int, heads: int, ffn: int, levels: int, points: int, num_layers: int):
        super().__init__()
        d = dim // 2
        exps = torch.arange(d, dtype=torch.float32)
        self.register_buffer("dim_t", 10000 ** (2 * torch.div(exps, 2, rounding_mode="floor") / d))
        self.layers = nn.ModuleList(PoseDecoderLayer(dim, heads, ffn, levels, points) for _ in range(num_layers))
        self.half_pose_ref_point_head = MLP(dim, dim, dim, 2)

    def sine_embedding(self, pts: torch.Tensor) -> torch.Tensor:
        """(..., 2) points in [0, 1] -> (..., dim) sine embedding (y half first, then x)."""
        emb = []
        for i in (1, 0):
            p = pts[..., i:i + 1] * (2 * math.pi) / self.dim_t
            emb.append(torch.stack((p[..., 0::2].sin(), p[..., 1::2].cos()), -1).flatten(-2))
        return torch.cat(emb, -1)


class LQEPose(nn.Module):
    """Localization-quality term: the stride-8 map sampled at each predicted keypoint, its top-k
    channel values (+ their mean) per keypoint -> MLP -> added to the class logits."""

    def __init__(self, k: int, hidden: int, num_layers: int, num_keypoints: int):
        super().__init__()
        self.k = k
        self.num_keypoints = num_keypoints
        self.reg_conf = MLP(num_keypoints * (k + 1), hidden, 1, num_layers)
        nn.init.zeros_(self.reg_conf.layers[-1].weight)
        nn.init.zeros_(self.reg_conf.layers[-1].bias)

    def forward(self, scores: torch.Tensor, kpts: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """scores (B, Q, n); kpts (B, Q, K, 2) in [0, 1]; feat (B, C, H, W)."""
        b, q = kpts.shape[:2]
        grid = (2 * kpts - 1).to(feat.dtype)
        sampled = F.grid_sample(feat, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        top = sampled.permute(0, 2, 3, 1).topk(self.k, dim=-1).values                 # (B, Q, K, k)
        stat = torch.cat([top, top.mean(-1, keepdim=True)], -1).reshape(b, q, -1)
        return scores + self.reg_conf(stat.to(scores.dtype))


class ECPoseDecoder(nn.Module):
    """Query selection + the keypoint refinement decoder (see the module docstring)."""

    def __init__(self, dim: int = 192, num_queries: int = POSE_QUERIES, num_keypoints: int = COCO_KEYPOINTS,
                 num_layers: int = POSE_LAYERS, heads: int = 8, ffn: int = POSE_FFN, points: int = POSE_POINTS,
                 strides: tuple[int, ...] = STRIDES, eval_size: int = INPUT_SIZE, reg_max: int = 32,
                 reg_scale: float = 4.0, num_classes: int = 2):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.num_queries, self.num_keypoints, self.reg_max = num_queries, num_keypoints, reg_max
        self.strides = tuple(strides)
        self.eval_size = eval_size
        self.up = nn.Parameter(torch.tensor([0.5]), requires_grad=False)
        self.reg_scale = nn.Parameter(torch.tensor([reg_scale]), requires_grad=False)
        shapes = [(eval_size // s, eval_size // s) for s in self.strides]
        anchors, invalid = self.generate_anchors(shapes)
        self.register_buffer("anchors", anchors)
        self.register_buffer("valid_mask", invalid)
        self.decoder = PoseLayers(dim, heads, ffn, len(self.strides), points, num_layers)
        self.keypoint_embedding = nn.Embedding(num_keypoints, dim)
        self.instance_embedding = nn.Embedding(1, dim)
        self.tgt_embed = nn.Embedding(num_queries, dim)
        self.label_enc = nn.Embedding(80 + 1, dim)
        self.pose_enc = nn.Embedding(num_keypoints, dim)
        self.enc_output = nn.Linear(dim, dim)
        self.enc_output_norm = nn.LayerNorm(dim)
        self.class_embed = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(num_layers))
        self.lqe_embed = nn.ModuleList(LQEPose(4, 256, 2, num_keypoints) for _ in range(num_layers))
        self.pose_embed = nn.ModuleList(MLP(dim, dim, 2 * (reg_max + 1), 3) for _ in range(num_layers))
        self.pre_pose_embed = MLP(dim, dim, 2, 3)
        self.enc_pose_embed = MLP(dim, 2 * dim, 2 * num_keypoints, 4)
        self.enc_out_class_embed = nn.Linear(dim, num_classes)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        prior = -math.log((1 - 0.01) / 0.01)
        for head in [*self.class_embed, self.enc_out_class_embed]:
            nn.init.constant_(head.bias, prior)
        for mlp in [*self.pose_embed, self.pre_pose_embed, self.enc_pose_embed,
                    *(lqe.reg_conf for lqe in self.lqe_embed)]:
            nn.init.zeros_(mlp.layers[-1].weight)
            nn.init.zeros_(mlp.layers[-1].bias)
        for m in self.modules():
            if isinstance(m, PoseDeformableAttention):
                m._reset_parameters()
            elif isinstance(m, Gate):
                nn.init.zeros_(m.gate.weight)
                nn.init.zeros_(m.gate.bias)

    @staticmethod
    def generate_anchors(shapes: list[tuple[int, int]], device: torch.device | None = None,
                         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell centres of every level in logit space (1, N, 2) and the mask (1, N, 1) of cells
        not strictly inside (0.01, 0.99), whose memory is zeroed before the query selection."""
        per_level = []
        for h, w in shapes:
            ys = (torch.arange(h, dtype=dtype, device=device) + 0.5) / h
            xs = (torch.arange(w, dtype=dtype, device=device) + 0.5) / w
            gy, gx = torch.meshgrid(ys, xs, indexing="ij")
            per_level.append(torch.stack((gx, gy), -1).reshape(1, h * w, 2))
        anchors = torch.cat(per_level, 1)
        inside = ((anchors > 0.01) & (anchors < 0.99)).all(-1, keepdim=True)
        return torch.log(anchors / (1 - anchors)), ~inside

    def _anchors(self, shapes: list[tuple[int, int]], ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.training and shapes == [(self.eval_size // s, self.eval_size // s) for s in self.strides]:
            return self.anchors.to(ref.dtype), self.valid_mask
        return self.generate_anchors(shapes, ref.device, ref.dtype)

    def forward(self, feats: list[torch.Tensor], targets=None) -> dict:
        b = feats[0].shape[0]
        k, nq, dim = self.num_keypoints, self.num_queries, self.dim
        shapes = [(int(f.shape[2]), int(f.shape[3])) for f in feats]
        memory = torch.cat([f.flatten(2).transpose(1, 2) for f in feats], 1)       # (B, N, C)
        anchors, invalid = self._anchors(shapes, memory)
        enc = self.enc_output_norm(self.enc_output(memory.masked_fill(invalid, 0.0)))
        enc_logits = self.enc_out_class_embed(enc)
        idx = enc_logits.max(-1).values.topk(nq, dim=1).indices                     # (B, Q)
        top_mem = enc.gather(1, idx.unsqueeze(-1).expand(-1, -1, dim))
        top_anchor = anchors.expand(b, -1, -1).gather(1, idx.unsqueeze(-1).expand(-1, -1, 2))
        enc_kpts = torch.sigmoid(self.enc_pose_embed(top_mem).reshape(b, nq, k, 2) + top_anchor.unsqueeze(2))
        ref = torch.cat([enc_kpts.mean(2, keepdim=True), enc_kpts], 2).detach()   # (B, Q, K + 1, 2)

        content = self.tgt_embed.weight.unsqueeze(0).unsqueeze(2)                   # (1, Q, 1, C)
        tokens = torch.cat([self.instance_embedding.weight.expand(b, nq, 1, dim),
                            (self.keypoint_embedding.weight[None, None] + content).expand(b, nq, k, dim)], 2)

        value = memory.reshape(b, memory.shape[1], self.heads, dim // self.heads)
        project = weighting_function(self.reg_max, self.up, self.reg_scale)
        layers = self.decoder
        x = tokens
        prev_pose = None            # the previous layer's keypoint tokens (with this layer's position added)
        corners = None
        initial = None
        logits = kpts = None
        feat_lqe = feats[0]
        per_layer = []              # training: every layer's (logits, keypoints)
        pre = None
        last = len(layers.layers) - 1
        for i, layer in enumerate(layers.layers):
            pos = layers.half_pose_ref_point_head(layers.sine_embedding(ref[:, :, 1:]))
            if prev_pose is not None:
                prev_pose = prev_pose + pos
            x = layer(x, pos, ref, value, shapes)
            out_pose, out_inst = x[:, :, 1:], x[:, :, 0]
            if i == 0:
                pre_kpts = torch.sigmoid(self.pre_pose_embed(out_pose) + inverse_sigmoid(ref[:, :, 1:]))
                initial = pre_kpts.detach()
                if self.training:
                    pre = (self.class_embed[0](out_inst), pre_kpts.flatten(-2))
            step = self.pose_embed[i](out_pose if prev_pose is None else out_pose + prev_pose)
            corners = step if corners is None else step + corners
            prob = F.softmax(corners.reshape(b, nq, k, 2, self.reg_max + 1), -1)
            kpts = initial + F.linear(prob, project) / self.reg_scale.abs()
            ref = torch.cat([kpts.mean(2, keepdim=True), kpts], 2)
            if self.training or i == last:
                logits = self.lqe_embed[i](self.class_embed[i](out_inst), kpts, feat_lqe)
                per_layer.append((logits, kpts.flatten(-2)))
            if self.training:       # each layer refines from the previous one's detached state
                ref = ref.detach()
                prev_pose = out_pose.detach()
            else:
                prev_pose = out_pose
        out = {"pred_logits": logits, "pred_keypoints": kpts.flatten(-2)}
        if self.training:
            out["aux_outputs"] = [{"pred_logits": lg, "pred_keypoints": kp} for lg, kp in per_layer[:-1]]
            out["pre_outputs"] = {"pred_logits": pre[0], "pred_keypoints": pre[1]}
            enc_top = enc_logits.gather(1, idx.unsqueeze(-1).expand(-1, -1, enc_logits.shape[-1]))
            out["enc_outputs"] = {"pred_logits": enc_top, "pred_keypoints": enc_kpts.flatten(-2)}
        return out


class ECPoseNet(nn.Module):
    """Backbone -> hybrid encoder -> keypoint decoder; eval ``forward(x)`` -> dict."""

    def __init__(self, cfg: ECConfig, nc: int = 1, num_keypoints: int = COCO_KEYPOINTS):
        super().__init__()
        self.backbone = ECBackbone(cfg.embed_dim, cfg.num_heads, cfg.proj_dim, cfg.ffn_ratio)
        self.encoder = DFineHybridEncoder(tuple(self.backbone.out_channels), cfg.hidden_dim,
                                          dim_feedforward=cfg.enc_ffn, enc_act="silu", use_encoder_idx=(2,),
                                          expansion=cfg.expansion, depth_mult=cfg.depth_mult, csp_type="csp2",
                                          elan_tail=False, fuse_op="sum", identity_proj=True)
        self.decoder = ECPoseDecoder(cfg.hidden_dim, num_keypoints=num_keypoints, num_classes=nc + 1)
        self.cfg = cfg

    def forward(self, x: torch.Tensor, targets=None) -> dict:
        return self.decoder(self.encoder(self.backbone(x)), targets)
