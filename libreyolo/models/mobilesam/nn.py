"""MobileSAM network: TinyViT image encoder + neck, SAM's prompt encoder and two-way mask decoder.

Layout follows the LibreYOLO checkpoints (the MobileSAM/SAM parameter names):

* ``image_encoder``: ``patch_embed.seq`` (conv-BN, GELU, conv-BN; both 3x3 stride 2), ``layers.0``
  (MBConv blocks ``conv1`` 1x1 expand x4 -> ``conv2`` 3x3 depthwise -> ``conv3`` 1x1, GELU after
  each and after the residual add), ``layers.1-3`` (TinyViT blocks: windowed attention with a
  learned bias per relative offset, a 3x3 depthwise ``local_conv``, an MLP), ``downsample``
  (patch merging: 1x1, 3x3 depthwise stride 2 - stride 1 into the 320-wide last stage, as
  MobileSAM keeps the 1/16 resolution -, 1x1), then ``neck`` (1x1 conv, LayerNorm2d, 3x3 conv,
  LayerNorm2d) to the 256-channel image embedding. ``norm_head`` / ``head`` (TinyViT's
  ImageNet classifier) are kept so checkpoints load strictly, but are never run.
* ``prompt_encoder``: random-Fourier positional encoding (``pe_layer``), the learned embeddings
  of a background / foreground point and of the two box corners (``point_embeddings.0-3``), of a
  padding point (``not_a_point_embed``) and of "no mask" (``no_mask_embed``);
  ``mask_downscaling`` is in the layout (mask prompts) but no mask prompt is taken.
* ``mask_decoder``: a two-layer two-way transformer (token self-attention, token->image and
  image->token cross-attention at half width, a 2048-wide ReLU MLP), an IoU token and four
  mask tokens, the transposed-conv upscaling to 1/4 of the padded input, one hypernetwork MLP
  per mask token and the IoU head.

The network takes RGB on a 0-255 scale whose longer side is at most ``img_size`` (1024), subtracts
SAM's mean, divides by its std and zero-pads (bottom/right) to ``img_size`` x ``img_size`` itself.
Points and box corners are pixel coordinates in that ``img_size`` frame. Every shape derives from
the inputs' static shapes and every label test is a ``torch.where``: no host synchronisation and
no data-dependent shape, so each stage can be captured in a CUDA graph.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: SAM's normalization of the 0-255 input (RGB)
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)

#: prompt labels: background / foreground point, the two box corners, and padding ("not a point")
LABEL_BG, LABEL_FG, LABEL_PAD = 0, 1, -1


@dataclass(frozen=True)
class MobileSAMConfig:
    embed_dims: tuple[int, int, int, int]
    depths: tuple[int, int, int, int]
    num_heads: tuple[int, int, int, int]
    window_sizes: tuple[int, int, int, int]


CONFIGS: dict[str, MobileSAMConfig] = {
    # MobileSAM's TinyViT-5M image encoder (the only size MobileSAM ships)
    "tiny": MobileSAMConfig((64, 128, 160, 320), (2, 2, 6, 2), (2, 4, 5, 10), (7, 7, 14, 7)),
}

EMBED_DIM = 256          # image embedding / prompt token width
MLP_RATIO = 4.0          # TinyViT MLP and MBConv expansion
PATCH_STRIDE = 16        # input pixels per image-embedding cell


# ------------------------------------------------------------------------------ image encoder
class ConvBN(nn.Sequential):
    """Conv (no bias) + BatchNorm, named ``c`` / ``bn`` as in TinyViT."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, pad: int = 0, groups: int = 1):
        super().__init__()
        self.add_module("c", nn.Conv2d(cin, cout, k, stride, pad, groups=groups, bias=False))
        self.add_module("bn", nn.BatchNorm2d(cout))


class PatchEmbed(nn.Module):
    def __init__(self, cin: int, dim: int):
        super().__init__()
        self.seq = nn.Sequential(ConvBN(cin, dim // 2, 3, 2, 1), nn.GELU(), ConvBN(dim // 2, dim, 3, 2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand, 3x3 depthwise, 1x1 project, GELU after each and the sum."""

    def __init__(self, dim: int, expand: float):
        super().__init__()
        hidden = int(dim * expand)
        self.conv1 = ConvBN(dim, hidden, 1)
        self.conv2 = ConvBN(hidden, hidden, 3, 1, 1, groups=hidden)
        self.conv3 = ConvBN(hidden, dim, 1)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.conv1(x))
        y = self.act(self.conv2(y))
        return self.act(self.conv3(y) + x)


class PatchMerging(nn.Module):
    """(B, C, H, W) -> tokens (B, H'W', C') with H' = ceil(H / stride): 1x1, 3x3 dw, 1x1."""

    def __init__(self, dim: int, out_dim: int, stride: int):
        super().__init__()
        self.conv1 = ConvBN(dim, out_dim, 1)
        self.conv2 = ConvBN(out_dim, out_dim, 3, stride, 1, groups=out_dim)
        self.conv3 = ConvBN(out_dim, out_dim, 1)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.conv1(x))
        x = self.act(self.conv2(x))
        return self.conv3(x)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside a ``ws`` x ``ws`` window, pre-LayerNorm, with a learned
    bias per head and per relative (|dy|, |dx|) offset (``attention_biases``)."""

    def __init__(self, dim: int, num_heads: int, ws: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        points = list(itertools.product(range(ws), range(ws)))
        offsets: dict[tuple[int, int], int] = {}
        idxs = []
        for p1 in points:
            for p2 in points:
                off = (abs(p1[0] - p2[0]), abs(p1[1] - p2[1]))
                idxs.append(offsets.setdefault(off, len(offsets)))
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, len(offsets)))
        self.register_buffer("bias_idx", torch.tensor(idxs, dtype=torch.long).view(len(points), len(points)),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(self.norm(x)).view(b, n, self.num_heads, 3 * self.head_dim).permute(0, 2, 1, 3)
        q, k, v = qkv.split(self.head_dim, dim=3)
        attn = (q @ k.transpose(-2, -1)) * self.scale + self.attention_biases[:, self.bias_idx]
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, -1)
        return self.proj(out)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


class TinyViTBlock(nn.Module):
    """Windowed attention (windows zero-padded at the bottom/right edges) + residual, a 3x3
    depthwise conv on the token map, MLP + residual."""

    def __init__(self, dim: int, num_heads: int, ws: int):
        super().__init__()
        self.ws = ws
        self.attn = WindowAttention(dim, num_heads, ws)
        self.mlp = Mlp(dim, int(dim * MLP_RATIO))
        self.local_conv = ConvBN(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        h, w = hw
        b, n, c = x.shape
        ws = self.ws
        if h == ws and w == ws:
            y = self.attn(x)
        else:
            y = x.view(b, h, w, c)
            pb, pr = (ws - h % ws) % ws, (ws - w % ws) % ws
            if pb or pr:
                y = F.pad(y, (0, 0, 0, pr, 0, pb))
            ph, pw = h + pb, w + pr
            nh, nw = ph // ws, pw // ws
            y = y.view(b, nh, ws, nw, ws, c).transpose(2, 3).reshape(b * nh * nw, ws * ws, c)
            y = self.attn(y)
            y = y.view(b, nh, nw, ws, ws, c).transpose(2, 3).reshape(b, ph, pw, c)
            if pb or pr:
                y = y[:, :h, :w].contiguous()
            y = y.view(b, n, c)
        x = x + y
        x = self.local_conv(x.transpose(1, 2).reshape(b, c, h, w)).view(b, c, n).transpose(1, 2)
        return x + self.mlp(x)


class ConvStage(nn.Module):
    def __init__(self, dim: int, depth: int, out_dim: int):
        super().__init__()
        self.blocks = nn.ModuleList(MBConv(dim, MLP_RATIO) for _ in range(depth))
        self.downsample = PatchMerging(dim, out_dim, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.downsample(x)


class ViTStage(nn.Module):
    def __init__(self, dim: int, depth: int, num_heads: int, ws: int, out_dim: int | None, stride: int):
        super().__init__()
        self.blocks = nn.ModuleList(TinyViTBlock(dim, num_heads, ws) for _ in range(depth))
        self.downsample = PatchMerging(dim, out_dim, stride) if out_dim is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C', H', W')."""
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)
        for blk in self.blocks:
            t = blk(t, (h, w))
        x = t.transpose(1, 2).reshape(b, c, h, w)
        return x if self.downsample is None else self.downsample(x)


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of a (B, C, H, W) map (eps 1e-6, as SAM's)."""

    def __init__(self, c: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class TinyViTEncoder(nn.Module):
    """Normalized, padded (B, 3, S, S) image -> (B, 256, S/16, S/16) image embedding."""

    def __init__(self, cfg: MobileSAMConfig):
        super().__init__()
        d = cfg.embed_dims
        self.patch_embed = PatchEmbed(3, d[0])
        self.layers = nn.ModuleList([ConvStage(d[0], cfg.depths[0], d[1])])
        for i in range(1, 4):
            out = d[i + 1] if i < 3 else None
            stride = 1 if i == 2 else 2     # MobileSAM keeps 1/16 into the last stage
            self.layers.append(ViTStage(d[i], cfg.depths[i], cfg.num_heads[i], cfg.window_sizes[i], out, stride))
        self.norm_head = nn.LayerNorm(d[3])          # TinyViT's classifier: in the layout, unused
        self.head = nn.Linear(d[3], 1000)
        self.neck = nn.Sequential(nn.Conv2d(d[3], EMBED_DIM, 1, bias=False), LayerNorm2d(EMBED_DIM),
                                  nn.Conv2d(EMBED_DIM, EMBED_DIM, 3, padding=1, bias=False), LayerNorm2d(EMBED_DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.neck(x)


# ----------------------------------------------------------------------------- prompt encoder
class RandomFourierPE(nn.Module):
    """Positional encoding of (x, y) in [0, 1]: sin / cos of 2 pi (2 p - 1) G with a fixed random G."""

    def __init__(self, num_feats: int = EMBED_DIM // 2):
        super().__init__()
        self.register_buffer("positional_encoding_gaussian_matrix", torch.randn(2, num_feats))

    def encode(self, coords: torch.Tensor) -> torch.Tensor:
        c = (2 * coords - 1) @ self.positional_encoding_gaussian_matrix
        c = 2 * math.pi * c
        return torch.cat([torch.sin(c), torch.cos(c)], dim=-1)

    def grid(self, h: int, w: int) -> torch.Tensor:
        """(C, h, w) encoding of the centres of an h x w grid."""
        g = self.positional_encoding_gaussian_matrix
        ones = torch.ones((h, w), device=g.device, dtype=g.dtype)
        y = (ones.cumsum(0) - 0.5) / h
        x = (ones.cumsum(1) - 0.5) / w
        return self.encode(torch.stack([x, y], dim=-1)).permute(2, 0, 1)

    def points(self, coords: torch.Tensor, size: int) -> torch.Tensor:
        """(..., 2) pixel coordinates in the size x size frame -> (..., C)."""
        return self.encode(coords / size)


class PromptEncoder(nn.Module):
    def __init__(self, mask_in_chans: int = 16):
        super().__init__()
        self.pe_layer = RandomFourierPE()
        self.point_embeddings = nn.ModuleList(nn.Embedding(1, EMBED_DIM) for _ in range(4))
        self.not_a_point_embed = nn.Embedding(1, EMBED_DIM)
        self.mask_downscaling = nn.Sequential(
            nn.Conv2d(1, mask_in_chans // 4, 2, 2), LayerNorm2d(mask_in_chans // 4), nn.GELU(),
            nn.Conv2d(mask_in_chans // 4, mask_in_chans, 2, 2), LayerNorm2d(mask_in_chans), nn.GELU(),
            nn.Conv2d(mask_in_chans, EMBED_DIM, 1))
        self.no_mask_embed = nn.Embedding(1, EMBED_DIM)

    def forward(self, points: torch.Tensor | None, labels: torch.Tensor | None, boxes: torch.Tensor | None,
                batch: int, size: int) -> torch.Tensor:
        """Sparse prompt tokens (B, N, 256).

        ``points`` (B, P, 2) pixel (x, y) in the size x size frame, ``labels`` (B, P) integers (1
        foreground, 0 background, -1 padding); ``boxes`` (B, K, 4) x1, y1, x2, y2. Without boxes
        one padding point is appended (as SAM does). Coordinates are pixel centres (+0.5).
        """
        w = self.pe_layer.positional_encoding_gaussian_matrix
        tokens = []
        if points is not None:
            pts, lab = points + 0.5, labels
            if boxes is None:
                pts = torch.cat([pts, torch.zeros_like(pts[:, :1])], dim=1)
                lab = torch.cat([lab, torch.full_like(lab[:, :1], LABEL_PAD)], dim=1)
            pe = self.pe_layer.points(pts, size)
            lab = lab[..., None]
            emb = torch.where(lab == LABEL_PAD, self.not_a_point_embed.weight, pe)
            emb = torch.where(lab == LABEL_BG, pe + self.point_embeddings[0].weight, emb)
            emb = torch.where(lab == LABEL_FG, pe + self.point_embeddings[1].weight, emb)
            tokens.append(emb)
        if boxes is not None:
            corners = (boxes + 0.5).reshape(boxes.shape[0], -1, 2, 2)
            pe = self.pe_layer.points(corners, size)
            pe = torch.stack([pe[:, :, 0] + self.point_embeddings[2].weight,
                              pe[:, :, 1] + self.point_embeddings[3].weight], dim=2)
            tokens.append(pe.reshape(boxes.shape[0], -1, EMBED_DIM))
        if not tokens:
            return w.new_zeros((batch, 0, EMBED_DIM))
        return torch.cat(tokens, dim=1)


# ------------------------------------------------------------------------------- mask decoder
class Attention(nn.Module):
    """SAM's attention: q/k/v projections to ``dim // downsample`` channels, heads, out_proj."""

    def __init__(self, dim: int, num_heads: int, downsample: int = 1):
        super().__init__()
        inner = dim // downsample
        self.num_heads = num_heads
        self.q_proj = nn.Linear(dim, inner)
        self.k_proj = nn.Linear(dim, inner)
        self.v_proj = nn.Linear(dim, inner)
        self.out_proj = nn.Linear(inner, dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    #: keys per partial product when a few queries attend to many keys (tokens -> image): the
    #: weighted sum over the keys is cut into runs of this many, multiplied as one batch and the
    #: partial sums added. As one matmul (7 queries x 4096 keys x 16 channels a head) cuBLAS picks a
    #: kernel that walks the 4096 keys in sequence: three such products took a fifth of a prompt
    #: call's device time (scripts/sam_prompt_profile.py). None: always one matmul.
    SPLIT_KEYS: int | None = 256

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(q)), self._heads(self.k_proj(k)), self._heads(self.v_proj(v))
        attn = ((q @ k.permute(0, 1, 3, 2)) / math.sqrt(q.shape[-1])).softmax(-1)
        out = self._weighted_sum(attn, v)
        b, h, n, c = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, h * c))


    def _weighted_sum(self, attn: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``attn @ v`` for (B, H, Lq, Lk) weights and (B, H, Lk, C) values; in runs of
        :attr:`SPLIT_KEYS` keys when Lk is many of them and Lq is few."""
        run, lq, lk = self.SPLIT_KEYS, attn.shape[-2], v.shape[-2]
        if run is None or lq > 64 or lk < 4 * run or lk % run:
            return attn @ v
        parts = lk // run
        a = attn.unflatten(-1, (parts, run)).transpose(-3, -2)   # (B, H, parts, Lq, run)
        return (a @ v.unflatten(-2, (parts, run))).sum(-3)


class MLPBlock(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.lin1 = nn.Linear(dim, hidden)
        self.lin2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(F.relu(self.lin1(x)))


class TwoWayBlock(nn.Module):
    """Token self-attention, token->image cross-attention, MLP on the tokens, image->token
    cross-attention; post-norm after each. The first block's self-attention sees no positional
    encoding and replaces (does not add to) the tokens."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, first: bool):
        super().__init__()
        self.first = first
        self.self_attn = Attention(dim, num_heads)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn_token_to_image = Attention(dim, num_heads, 2)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLPBlock(dim, mlp_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.norm4 = nn.LayerNorm(dim)
        self.cross_attn_image_to_token = Attention(dim, num_heads, 2)

    def forward(self, queries, keys, query_pe, key_pe):
        if self.first:
            queries = self.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)
        queries = self.norm1(queries)
        q, k = queries + query_pe, keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(q, k, keys))
        queries = self.norm3(queries + self.mlp(queries))
        q, k = queries + query_pe, keys + key_pe
        keys = self.norm4(keys + self.cross_attn_image_to_token(k, q, queries))
        return queries, keys


class TwoWayTransformer(nn.Module):
    def __init__(self, dim: int = EMBED_DIM, depth: int = 2, num_heads: int = 8, mlp_dim: int = 2048):
        super().__init__()
        self.layers = nn.ModuleList(TwoWayBlock(dim, num_heads, mlp_dim, i == 0) for i in range(depth))
        self.final_attn_token_to_image = Attention(dim, num_heads, 2)
        self.norm_final_attn = nn.LayerNorm(dim)

    def forward(self, image: torch.Tensor, image_pe: torch.Tensor, tokens: torch.Tensor):
        keys = image.flatten(2).permute(0, 2, 1)
        key_pe = image_pe.flatten(2).permute(0, 2, 1)
        queries = tokens
        for layer in self.layers:
            queries, keys = layer(queries, keys, tokens, key_pe)
        q, k = queries + tokens, keys + key_pe
        queries = self.norm_final_attn(queries + self.final_attn_token_to_image(q, k, keys))
        return queries, keys


class MLP(nn.Module):
    def __init__(self, cin: int, hidden: int, cout: int, depth: int):
        super().__init__()
        dims = [cin] + [hidden] * (depth - 1) + [cout]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


class MaskDecoder(nn.Module):
    NUM_MASK_TOKENS = 4   # one single-mask output + three multimask outputs

    def __init__(self, dim: int = EMBED_DIM):
        super().__init__()
        self.transformer = TwoWayTransformer(dim)
        self.iou_token = nn.Embedding(1, dim)
        self.mask_tokens = nn.Embedding(self.NUM_MASK_TOKENS, dim)
        self.output_upscaling = nn.Sequential(
            nn.ConvTranspose2d(dim, dim // 4, 2, 2), LayerNorm2d(dim // 4), nn.GELU(),
            nn.ConvTranspose2d(dim // 4, dim // 8, 2, 2), nn.GELU())
        self.output_hypernetworks_mlps = nn.ModuleList(MLP(dim, dim, dim // 8, 3) for _ in range(self.NUM_MASK_TOKENS))
        self.iou_prediction_head = MLP(dim, 256, self.NUM_MASK_TOKENS, 3)

    def forward(self, src: torch.Tensor, image_pe: torch.Tensor, sparse: torch.Tensor):
        """(B, 256, h, w) image embeddings plus the dense prompt, (1, 256, h, w) PE, (B, N, 256)
        prompt tokens -> mask logits (B, 4, 4h, 4w) and predicted IoU (B, 4), all four tokens."""
        out_tokens = torch.cat([self.iou_token.weight, self.mask_tokens.weight], dim=0)
        tokens = torch.cat([out_tokens.unsqueeze(0).expand(sparse.shape[0], -1, -1), sparse], dim=1)
        pos = image_pe.expand(src.shape[0], -1, -1, -1)
        b, c, h, w = src.shape
        hs, src = self.transformer(src, pos, tokens)
        iou_out = hs[:, 0]
        mask_out = hs[:, 1:1 + self.NUM_MASK_TOKENS]
        up = self.output_upscaling(src.transpose(1, 2).reshape(b, c, h, w))
        hyper = torch.stack([mlp(mask_out[:, i]) for i, mlp in enumerate(self.output_hypernetworks_mlps)], dim=1)
        b, c, h, w = up.shape
        masks = (hyper @ up.view(b, c, h * w)).view(b, -1, h, w)
        return masks, self.iou_prediction_head(iou_out)


# ------------------------------------------------------------------------------------ network
class MobileSAMNet(nn.Module):
    """The whole network; the two stages prediction runs separately are :meth:`embed` (image ->
    embedding, once per image) and :meth:`decode` (embedding + prompts -> masks, per prompt).

    ``img_size``: the square frame an image is padded to (1024, as MobileSAM was trained); a
    call may name another multiple of 16 (the embedding grid is frame / 16).
    """

    def __init__(self, size: str = "tiny", img_size: int = 1024):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown MobileSAM size {size!r}; sizes: {', '.join(CONFIGS)}")
        self.img_size = check_frame(img_size)
        self.image_encoder = TinyViTEncoder(CONFIGS[size])
        self.prompt_encoder = PromptEncoder()
        self.mask_decoder = MaskDecoder()
        self.register_buffer("pixel_mean", torch.tensor(PIXEL_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(PIXEL_STD).view(1, 3, 1, 1), persistent=False)

    def embed(self, pixel_values: torch.Tensor, img_size: int | None = None) -> torch.Tensor:
        """(B, 3, h, w) RGB 0-255, max(h, w) <= frame -> (B, 256, frame/16, frame/16)."""
        s = self.img_size if img_size is None else check_frame(img_size)
        h, w = pixel_values.shape[-2:]
        if h > s or w > s:
            raise ValueError(f"MobileSAM input {h}x{w} is larger than its {s}x{s} frame; resize the longer side to {s}")
        x = (pixel_values - self.pixel_mean) / self.pixel_std
        if (h, w) != (s, s):
            x = F.pad(x, (0, s - w, 0, s - h))
        return self.image_encoder(x)

    def decode(self, image_embeddings: torch.Tensor, points: torch.Tensor | None = None,
               labels: torch.Tensor | None = None, boxes: torch.Tensor | None = None,
               multimask: bool = True, img_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings (B, 256, h, w) + prompts of each image (points (B, P, 2), labels (B, P),
        boxes (B, K, 4), pixels of the frame) -> low-resolution mask logits (B, M, 4h, 4w) and
        predicted IoU (B, M): M = 3 (tokens 1-3) with ``multimask``, else 1 (token 0)."""
        s = self.img_size if img_size is None else check_frame(img_size)
        b, _, h, w = image_embeddings.shape
        sparse = self.prompt_encoder(points, labels, boxes, b, s)
        # the dense prompt ("no mask"), added here rather than passed in: a parameter view as a
        # module input trips FlopCounterMode's module tracker (model.info())
        src = image_embeddings + self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(b, -1, h, w)
        pe = self.prompt_encoder.pe_layer.grid(h, w).unsqueeze(0)
        masks, iou = self.mask_decoder(src, pe, sparse)
        sel = slice(1, None) if multimask else slice(0, 1)
        return masks[:, sel], iou[:, sel]

    def forward(self, pixel_values: torch.Tensor, input_points: torch.Tensor | None = None,
                input_labels: torch.Tensor | None = None, input_boxes: torch.Tensor | None = None,
                multimask_output: bool = True) -> dict[str, torch.Tensor]:
        """The LibreYOLO call: ``input_points`` (B, 1, P, 2), ``input_labels`` (B, 1, P),
        ``input_boxes`` (B, K, 4) in the ``img_size`` frame -> ``image_embeddings``,
        ``pred_masks`` (B, 1, M, 4h, 4w) and ``iou_scores`` (B, 1, M)."""
        emb = self.embed(pixel_values)
        pts = None if input_points is None else input_points.flatten(1, 2).to(emb.dtype)
        lab = None if input_labels is None else input_labels.flatten(1, 2)
        if pts is not None and lab is None:
            lab = torch.ones(pts.shape[:2], dtype=torch.long, device=pts.device)
        boxes = None if input_boxes is None else input_boxes.to(emb.dtype)
        masks, iou = self.decode(emb, pts, lab, boxes, multimask_output)
        return {"image_embeddings": emb, "pred_masks": masks.unsqueeze(1), "iou_scores": iou.unsqueeze(1)}


def check_frame(size: int) -> int:
    """The frame size as an int, a positive multiple of 16 (else a ValueError naming it)."""
    if int(size) != size or size <= 0 or int(size) % PATCH_STRIDE:
        raise ValueError(f"MobileSAM frame size (imgsz) must be a positive multiple of {PATCH_STRIDE}, got {size}")
    return int(size)
