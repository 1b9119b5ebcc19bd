"""The CLIP network (OpenAI CLIP's ViT towers, the layout of OpenCLIP's LAION-2B checkpoints).

State-dict keys, order and shapes are OpenCLIP's ``CLIP`` (``visual.*`` image tower with a class
token, ``transformer.*`` causal text tower, ``token_embedding``, ``positional_embedding``,
``ln_final``, ``text_projection``, ``logit_scale``), which is the LibreYOLO 1.6.0 ``LibreCLIP``
checkpoint layout. The activations are the exact GELU (OpenCLIP's LAION models; OpenAI's own
weights used QuickGELU), the LayerNorms torch's (eps 1e-5).

Attention is computed here from the packed ``in_proj_weight`` (the checkpoint names of
``nn.MultiheadAttention``) with :func:`torch.nn.functional.scaled_dot_product_attention`, which
traces to plain ONNX operators (the module's inference fast path has no ONNX export).

The text tower is causal and pools the end-of-text token (the largest id of each row), so the
tokens after it never reach the pooled feature: :meth:`CLIPNet.encode_text` takes any token
length up to the context (77), and the family runs prompts at a bucketed length (16, 32 or 77),
which gives the full-length result up to float rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class CLIPConfig:
    """One size: the image tower (patch, width, depth), the text tower, the embedding width."""

    embed_dim: int
    image_size: int
    patch_size: int
    vision_width: int
    vision_layers: int
    text_width: int = 512
    text_heads: int = 8
    text_layers: int = 12
    context_length: int = 77
    vocab_size: int = 49408

    @property
    def vision_heads(self) -> int:
        return self.vision_width // 64   # OpenCLIP: head width 64


#: OpenCLIP's ViT-B-32, ViT-B-16 and ViT-L-14 (224 px)
CONFIGS: dict[str, CLIPConfig] = {
    "b32": CLIPConfig(embed_dim=512, image_size=224, patch_size=32, vision_width=768, vision_layers=12),
    "b16": CLIPConfig(embed_dim=512, image_size=224, patch_size=16, vision_width=768, vision_layers=12),
    "l14": CLIPConfig(embed_dim=768, image_size=224, patch_size=14, vision_width=1024, vision_layers=24,
                      text_width=768, text_heads=12),
}


class Attention(nn.Module):
    """Multi-head self-attention holding ``nn.MultiheadAttention``'s parameters (``in_proj_weight``,
    ``in_proj_bias``, ``out_proj``), computed with scaled_dot_product_attention."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).view(b, n, 3, self.heads, -1).permute(
            2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class ResidualAttentionBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(dim, hidden))
        self.mlp.add_module("gelu", nn.GELU())
        self.mlp.add_module("c_proj", nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int):
        super().__init__()
        self.resblocks = nn.ModuleList(ResidualAttentionBlock(width, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.resblocks:
            x = block(x, mask)
        return x


class VisionTransformer(nn.Module):
    """Patch conv (no bias) + class token + learned positions, pre-LN, blocks, post-LN on the
    class token, projection. The input size is fixed by the positional embedding."""

    def __init__(self, c: CLIPConfig):
        super().__init__()
        w, grid = c.vision_width, c.image_size // c.patch_size
        scale = w ** -0.5
        self.image_size, self.patch_size = c.image_size, c.patch_size
        self.class_embedding = nn.Parameter(scale * torch.randn(w))
        self.positional_embedding = nn.Parameter(scale * torch.randn(grid * grid + 1, w))
        self.proj = nn.Parameter(scale * torch.randn(w, c.embed_dim))
        self.conv1 = nn.Conv2d(3, w, c.patch_size, c.patch_size, bias=False)
        self.ln_pre = nn.LayerNorm(w)
        self.transformer = Transformer(w, c.vision_layers, c.vision_heads)
        self.ln_post = nn.LayerNorm(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"the CLIP image tower takes {self.image_size}x{self.image_size} inputs (its "
                             f"positional embedding is not interpolated), got {tuple(x.shape[-2:])}")
        x = self.conv1(x).flatten(2).transpose(1, 2)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat((cls, x), 1) + self.positional_embedding.to(x.dtype)
        x = self.transformer(self.ln_pre(x))
        return self.ln_post(x[:, 0]) @ self.proj


class CLIPNet(nn.Module):
    """Both towers. ``forward(x)`` is the image tower (the captured network of predict);
    ``forward(x, input_ids)`` returns both features as the fixtures record them."""

    def __init__(self, size: str):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown CLIP size {size!r}; sizes: {', '.join(CONFIGS)}")
        c = self.config = CONFIGS[size]
        # parameters in the checkpoint's order: own ones, then the towers
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(c.context_length, c.text_width))
        self.text_projection = nn.Parameter(c.text_width ** -0.5 * torch.randn(c.text_width, c.embed_dim))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.visual = VisionTransformer(c)
        self.transformer = Transformer(c.text_width, c.text_layers, c.text_heads)
        self.token_embedding = nn.Embedding(c.vocab_size, c.text_width)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        self.ln_final = nn.LayerNorm(c.text_width)
        mask = torch.full((c.context_length, c.context_length), float("-inf")).triu_(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    @property
    def embed_dim(self) -> int:
        return self.config.embed_dim

    @property
    def context_length(self) -> int:
        return self.config.context_length

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalized images -> (B, embed_dim) features, not normalized."""
        return self.visual(x)

    def encode_text(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T, L) token ids (L <= 77; SOT ... EOT, zero padded) -> (T, embed_dim), not normalized."""
        n = input_ids.shape[-1]
        if input_ids.dim() != 2 or not 1 <= n <= self.context_length:
            raise ValueError(f"CLIP token ids must be (T, L) with L <= {self.context_length}, got "
                             f"{tuple(input_ids.shape)}")
        x = self.token_embedding(input_ids) + self.positional_embedding[:n]
        x = self.ln_final(self.transformer(x, self.causal_mask[:n, :n].to(x.dtype)))
        pooled = x[torch.arange(x.shape[0], device=x.device), input_ids.argmax(-1)]
        return pooled @ self.text_projection

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor | None = None):
        if input_ids is None:
            return self.encode_image(x)
        return {"image_features": self.encode_image(x), "text_features": self.encode_text(input_ids)}
