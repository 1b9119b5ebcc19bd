"""The SigLIP 2 network (fixed-resolution SigLIP 2 checkpoints: the SigLIP architecture).

State-dict keys, order and shapes are those of transformers' ``SiglipModel`` (SigLIP 2's
fixed-resolution releases reuse it): ``vision_model.*`` (a patch conv with bias and no class
token, learned positions, pre-LN blocks, ``post_layernorm`` and a multi-head attention pooling
head, ``head.probe`` / ``head.attention``), ``text_model.*`` (token and position embeddings,
bidirectional blocks, ``final_layer_norm``, a ``head`` linear), ``logit_scale`` and
``logit_bias``. That is the LibreYOLO 1.6.0 ``LibreSigLIP2`` checkpoint layout. MLPs use the
tanh-approximated GELU, LayerNorms eps 1e-6.

The text tower attends over every position (no padding mask) and pools the last one, so its
input is always the full context (64 tokens, zero padded): unlike CLIP's, the padding reaches
the pooled feature and the length cannot be bucketed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class SigLIP2Config:
    width: int
    layers: int
    heads: int
    mlp: int
    image_size: int
    patch_size: int
    context_length: int = 64
    vocab_size: int = 256000

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size


#: google/siglip2-base-patch16-256 and google/siglip2-so400m-patch14-384 (both towers alike)
CONFIGS: dict[str, SigLIP2Config] = {
    "b16": SigLIP2Config(width=768, layers=12, heads=12, mlp=3072, image_size=256, patch_size=16),
    "so400m": SigLIP2Config(width=1152, layers=27, heads=16, mlp=4304, image_size=384, patch_size=14),
}

EPS = 1e-6


class SelfAttention(nn.Module):
    """Separate q/k/v/out projections (checkpoint order k, v, q, out)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape

        def split(t):
            return t.view(b, n, self.heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class EncoderLayer(nn.Module):
    def __init__(self, c: SigLIP2Config):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(c.width, eps=EPS)
        self.self_attn = SelfAttention(c.width, c.heads)
        self.layer_norm2 = nn.LayerNorm(c.width, eps=EPS)
        self.mlp = Mlp(c.width, c.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class Encoder(nn.Module):
    def __init__(self, c: SigLIP2Config):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class VisionEmbeddings(nn.Module):
    def __init__(self, c: SigLIP2Config):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, c.width, c.patch_size, c.patch_size)
        self.position_embedding = nn.Embedding(c.grid * c.grid, c.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch_embedding(x).flatten(2).transpose(1, 2) + self.position_embedding.weight


class PoolingAttention(nn.Module):
    """The pooling head's cross-attention, with ``nn.MultiheadAttention``'s parameter names."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, query: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)
        q = F.linear(query, wq, bq).view(b, -1, self.heads, d // self.heads).transpose(1, 2)
        k = F.linear(x, wk, bk).view(b, n, self.heads, -1).transpose(1, 2)
        v = F.linear(x, wv, bv).view(b, n, self.heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, -1, d))


class PoolingHead(nn.Module):
    """Multi-head attention pooling (MAP): a learned probe attends over the tokens, then an MLP."""

    def __init__(self, c: SigLIP2Config):
        super().__init__()
        self.probe = nn.Parameter(torch.randn(1, 1, c.width))
        self.attention = PoolingAttention(c.width, c.heads)
        self.layernorm = nn.LayerNorm(c.width, eps=EPS)
        self.mlp = Mlp(c.width, c.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention(self.probe.to(x.dtype).expand(x.shape[0], -1, -1), x)
        return (h + self.mlp(self.layernorm(h)))[:, 0]


class VisionModel(nn.Module):
    def __init__(self, c: SigLIP2Config):
        super().__init__()
        self.image_size = c.image_size
        self.embeddings = VisionEmbeddings(c)
        self.encoder = Encoder(c)
        self.post_layernorm = nn.LayerNorm(c.width, eps=EPS)
        self.head = PoolingHead(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"the SigLIP 2 image tower takes {self.image_size}x{self.image_size} inputs (its "
                             f"position embedding is not interpolated), got {tuple(x.shape[-2:])}")
        return self.head(self.post_layernorm(self.encoder(self.embeddings(x))))


class TextEmbeddings(nn.Module):
    def __init__(self, c: SigLIP2Config):
        super().__init__()
        self.token_embedding = nn.Embedding(c.vocab_size, c.width)
        self.position_embedding = nn.Embedding(c.context_length, c.width)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.token_embedding(input_ids) + self.position_embedding.weight[:input_ids.shape[-1]]


class TextModel(nn.Module):
    def __init__(self, c: SigLIP2Config):
        super().__init__()
        self.context_length = c.context_length
        self.embeddings = TextEmbeddings(c)
        self.encoder = Encoder(c)
        self.final_layer_norm = nn.LayerNorm(c.width, eps=EPS)
        self.head = nn.Linear(c.width, c.width)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[-1] != self.context_length:
            raise ValueError(f"SigLIP 2 token ids must be (T, {self.context_length}) (zero padded: the tower "
                             f"pools the last position), got {tuple(input_ids.shape)}")
        x = self.final_layer_norm(self.encoder(self.embeddings(input_ids)))
        return self.head(x[:, -1])


class SigLIP2Net(nn.Module):
    """Both towers. ``forward(x)`` is the image tower; ``forward(x, input_ids)`` both features."""

    def __init__(self, size: str):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown SigLIP 2 size {size!r}; sizes: {', '.join(CONFIGS)}")
        c = self.config = CONFIGS[size]
        self.logit_scale = nn.Parameter(torch.full((1,), math.log(10.0)))
        self.logit_bias = nn.Parameter(torch.full((1,), -10.0))
        self.vision_model = VisionModel(c)
        self.text_model = TextModel(c)
        for m in self.modules():   # transformers' SigLIP initialization of linear layers (a fresh model trains)
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=m.in_features ** -0.5)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.text_model.embeddings.token_embedding.weight, std=0.02)

    @property
    def embed_dim(self) -> int:
        return self.config.width

    @property
    def context_length(self) -> int:
        return self.config.context_length

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return self.vision_model(x)

    def encode_text(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.text_model(input_ids)

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor | None = None):
        if input_ids is None:
            return self.encode_image(x)
        return {"image_features": self.encode_image(x), "text_features": self.encode_text(input_ids)}
