"""EoMT network: an Encoder-only Mask Transformer (a DINOv2-style ViT whose last blocks also carry
learned queries; masks from the patch tokens, classes from the queries).

Layout: the raw Hugging Face ``EomtForUniversalSegmentation`` state dict, which is what LibreYOLO
1.6.0's EoMT checkpoints hold (no wrapper prefix): ``attn_mask_probs`` (one masked-attention
probability per query block), ``embeddings`` (``cls_token``, 4 ``register_tokens``,
``patch_embeddings.projection`` a 16 x 16 stride-16 conv, ``position_embeddings`` one row per patch
of the native grid), the closing ``layernorm``, ``query`` (the learned queries), ``layers.N`` (pre-norm
ViT blocks: ``norm1``, ``attention.{k,v,q,out}_proj``, ``layer_scale1``, ``norm2``, ``mlp.fc1/fc2``,
``layer_scale2``), ``upscale_block.block.{0,1}`` (2x transposed conv, GELU, depthwise 3x3, channel
LayerNorm: stride 16 -> 4), ``mask_head.fc1..3`` (GELU MLP on the queries), ``class_predictor``
(``nc + 1`` logits, the last = no object) and ``criterion.empty_weight`` (the class weights of the
training loss: 1, and 0.1 for no object).

Why not timm's ViT: the blocks are DINOv2's (timm's ``vit_*_reg4_dinov2`` has the same maths), but
timm fuses q/k/v into one ``qkv`` Linear and names LayerScale ``ls1.gamma``; the checkpoints keep
HF's separate projections, so timm's modules would need a weight conversion at every load and its
inverse at every save, and the query injection and masked attention would wrap timm's forward
anyway. The ~100 lines below hold the checkpoint's layout as it is.

Forward (HF EoMT's): the [0, 1] RGB input is normalized with the ImageNet mean / std (non-persistent
buffers); patch tokens + position embedding (no interpolation: the input size is fixed by the
checkpoint's grid), then ``[cls, registers, patches]``. Before the last ``blocks`` layers the
queries are prepended: ``[queries, cls, registers, patches]``. In those layers, while training (and
in eval for a block whose ``attn_mask_probs`` entry is > 0, a model whose mask annealing did not
finish) the intermediate prediction of the normalized tokens restricts each query's attention to
the patches its mask (bilinearly resized to the patch grid) covers (logit > 0); each query row is
freed with probability ``1 - p``. Every output then comes from ``layernorm`` of the final tokens:
class logits ``class_predictor(queries)``, mask embeddings ``mask_head(queries)``, the stride-4
mask feature ``upscale_block(patch grid)`` and the mask logits ``<embedding, feature>``.

Shapes depend only on the input's static size; the masked-attention decision reads a host copy of
``attn_mask_probs`` (:attr:`EomtNet.mask_active`, refreshed when the buffer is loaded or set), so
no forward reads a device value on the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PATCH = 16
#: the mask feature's stride (two 2x upscaling layers on the stride-16 grid)
MASK_STRIDE = 4
#: the no-object class's weight in the class loss (``criterion.empty_weight``'s last entry)
NO_OBJECT_WEIGHT = 0.1


@dataclass(frozen=True)
class EomtConfig:
    dim: int
    depth: int
    heads: int
    #: the last ``blocks`` layers carry the queries
    blocks: int
    queries: int = 100
    registers: int = 4
    upscale: int = 2


#: s is pinned by the fixtures (DINOv2 ViT-S/16, 100 queries in the last 3 of 12 blocks); b and l
#: use DINOv2's ViT-B and ViT-L widths and depths, with the query blocks of the EoMT releases
#: (3 for the 12-block encoders, 4 for ViT-L's 24 blocks: HF EomtConfig's default).
CONFIGS: dict[str, EomtConfig] = {
    "s": EomtConfig(384, 12, 6, 3),
    "b": EomtConfig(768, 12, 12, 3),
    "l": EomtConfig(1024, 24, 16, 4),
}


class PatchEmbeddings(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.projection = nn.Conv2d(3, dim, PATCH, PATCH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x).flatten(2).transpose(1, 2)


class Embeddings(nn.Module):
    """Patch tokens + position embedding, then ``[cls, registers, patches]``."""

    def __init__(self, cfg: EomtConfig, grid: int):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, cfg.registers, cfg.dim))
        self.patch_embeddings = PatchEmbeddings(cfg.dim)
        self.position_embeddings = nn.Embedding(grid * grid, cfg.dim)
        self.grid = grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embeddings(x) + self.position_embeddings.weight.unsqueeze(0)
        b = tokens.shape[0]
        return torch.cat((self.cls_token.expand(b, -1, -1), self.register_tokens.expand(b, -1, -1), tokens), 1)


class Attention(nn.Module):
    """Multi-head self-attention with separate q/k/v projections (HF's names and creation order)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = (p(x).view(b, n, self.heads, c // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, c))


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float = 1e-5):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.lambda1


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    """DINOv2's pre-norm block with LayerScale (LayerNorm eps 1e-6, GELU MLP of 4x width)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attention = Attention(dim, heads)
        self.layer_scale1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)
        self.layer_scale2 = LayerScale(dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.layer_scale1(self.attention(self.norm1(x), mask))
        return x + self.layer_scale2(self.mlp(self.norm2(x)))


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2)


class ScaleLayer(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(dim, dim, 2, 2)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.layernorm2d = LayerNorm2d(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layernorm2d(self.conv2(F.gelu(self.conv1(x))))


class ScaleBlock(nn.Module):
    def __init__(self, dim: int, n: int):
        super().__init__()
        self.block = nn.ModuleList(ScaleLayer(dim) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x


class MaskHead(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)
        self.fc3 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


class CriterionWeights(nn.Module):
    """``criterion.empty_weight``: the class weights of the training loss, kept in the checkpoint."""

    def __init__(self, nc: int):
        super().__init__()
        w = torch.ones(nc + 1)
        w[-1] = NO_OBJECT_WEIGHT
        self.register_buffer("empty_weight", w)


@dataclass
class EomtParts:
    """One forward's outputs before any resizing: class logits (B, Q, nc + 1), mask embeddings
    (B, Q, D), the stride-4 mask feature (B, D, H/4, W/4), and (training) the intermediate
    (class logits, mask logits) of every query block."""

    class_logits: torch.Tensor
    mask_embed: torch.Tensor
    feature: torch.Tensor
    aux: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def mask_logits(self) -> torch.Tensor:
        return torch.einsum("bqc,bchw->bqhw", self.mask_embed, self.feature)


class EomtNet(nn.Module):
    """EoMT for ``nc`` classes at a fixed ``imgsz`` (a multiple of 16; see the module docstring).

    ``forward(x)`` in eval mode returns the reference wrapper's dict (the fixtures' outputs):
    ``class_queries_logits`` (B, Q, nc + 1), ``masks_queries_logits`` (B, Q, H, W) mask logits
    bilinearly upsampled to the input size, and ``semantic_logits`` (B, nc, H, W) =
    ``sum_q softmax(class)[:nc] * sigmoid(mask)``. In training mode it returns the loss's dict:
    ``pred_logits``, ``pred_masks`` (stride 4, logits) and ``aux`` (the query blocks' intermediate
    predictions). ``forward(x, raw=True)`` (:meth:`parts`) gives the raw outputs (what the tasks'
    stages use).
    """

    def __init__(self, cfg: EomtConfig, nc: int, imgsz: int):
        super().__init__()
        if imgsz % PATCH:
            raise ValueError(f"EoMT's input size must be a multiple of {PATCH}, got {imgsz}")
        self.cfg, self.nc, self.imgsz, self.grid = cfg, int(nc), int(imgsz), int(imgsz) // PATCH
        self.register_buffer("attn_mask_probs", torch.ones(cfg.blocks))
        self.embeddings = Embeddings(cfg, self.grid)
        self.layernorm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.query = nn.Embedding(cfg.queries, cfg.dim)
        self.layers = nn.ModuleList(Layer(cfg.dim, cfg.heads) for _ in range(cfg.depth))
        self.upscale_block = ScaleBlock(cfg.dim, cfg.upscale)
        self.mask_head = MaskHead(cfg.dim)
        self.class_predictor = nn.Linear(cfg.dim, nc + 1)
        self.criterion = CriterionWeights(nc)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        #: host copy of ``attn_mask_probs > 0`` (which query blocks mask their attention in eval)
        self.mask_active: list[bool] = [True] * cfg.blocks
        self.register_load_state_dict_post_hook(lambda module, keys: module.refresh_mask_active())
        self._init_weights()

    def _init_weights(self) -> None:
        """HF EoMT's initialisation: normal(0.02) weights, zero biases, LayerScale 1e-5."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.trunc_normal_(m.weight, std=0.02)
        nn.init.trunc_normal_(self.embeddings.cls_token, std=0.02)

    # ------------------------------------------------------------------ mask annealing
    def refresh_mask_active(self) -> None:
        self.mask_active = [bool(p > 0) for p in self.attn_mask_probs.detach().cpu().tolist()]

    def set_mask_probs(self, probs) -> None:
        """Set ``attn_mask_probs`` (one probability per query block) and its host copy."""
        with torch.no_grad():
            self.attn_mask_probs.copy_(torch.as_tensor(probs, dtype=self.attn_mask_probs.dtype))
        self.refresh_mask_active()

    # ------------------------------------------------------------------ forward
    def _predict(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalized tokens -> class logits, mask embeddings, stride-4 mask feature."""
        q = self.cfg.queries
        queries = tokens[:, :q]
        patches = tokens[:, q + 1 + self.cfg.registers:].transpose(1, 2)
        patches = patches.reshape(patches.shape[0], -1, self.grid, self.grid)
        return self.class_predictor(queries), self.mask_head(queries), self.upscale_block(patches)

    def _attention_mask(self, mask_logits: torch.Tensor, n: int, block: int) -> torch.Tensor:
        """The additive (B, 1, n, n) mask of one query block: query rows see the patches where
        their mask (resized to the patch grid) is > 0, each row freed with probability 1 - p."""
        b, q = mask_logits.shape[:2]
        start = q + 1 + self.cfg.registers
        small = F.interpolate(mask_logits, size=(self.grid, self.grid), mode="bilinear").flatten(2) > 0
        free = torch.rand(b, q, device=mask_logits.device) > self.attn_mask_probs[block]
        allowed = torch.ones(b, n, n, dtype=torch.bool, device=mask_logits.device)
        allowed[:, :q, start:] = small | free[..., None]
        return torch.zeros(allowed.shape, dtype=mask_logits.dtype, device=allowed.device).masked_fill(
            ~allowed, -1e9).unsqueeze(1)

    def parts(self, x: torch.Tensor) -> EomtParts:
        """(B, 3, S, S) RGB in [0, 1] -> :class:`EomtParts`."""
        if x.shape[-2:] != (self.imgsz, self.imgsz):
            raise ValueError(f"this EoMT network takes {self.imgsz}x{self.imgsz} inputs (its position embeddings "
                             f"are fixed to a {self.grid}x{self.grid} patch grid), got {tuple(x.shape[-2:])}")
        h = self.embeddings((x - self.mean) / self.std)
        first = self.cfg.depth - self.cfg.blocks
        mask = None
        aux: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, layer in enumerate(self.layers):
            if i == first:
                h = torch.cat((self.query.weight.unsqueeze(0).expand(h.shape[0], -1, -1), h), 1)
            if i >= first and (self.training or self.mask_active[i - first]):
                cls, embed, feature = self._predict(self.layernorm(h))
                masks = torch.einsum("bqc,bchw->bqhw", embed, feature)
                aux.append((cls, masks))
                mask = self._attention_mask(masks, h.shape[1], i - first)
            h = layer(h, mask)
        cls, embed, feature = self._predict(self.layernorm(h))
        return EomtParts(cls, embed, feature, aux)

    def forward(self, x: torch.Tensor, raw: bool = False) -> dict | EomtParts:
        p = self.parts(x)
        if raw:   # the tasks' stages call the network this way (forward hooks see the call)
            return p
        if self.training:
            return {"pred_logits": p.class_logits, "pred_masks": p.mask_logits, "aux": p.aux}
        masks = F.interpolate(p.mask_logits, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return {"semantic_logits": semantic_scores(p.class_logits, masks),
                "class_queries_logits": p.class_logits, "masks_queries_logits": masks}


def semantic_scores(class_logits: torch.Tensor, mask_logits: torch.Tensor) -> torch.Tensor:
    """(B, Q, nc + 1) class logits and (B, Q, H, W) mask logits -> (B, nc, H, W) per-class scores
    ``sum_q softmax(class)[:nc] * sigmoid(mask)`` (EoMT's semantic inference)."""
    probs = class_logits.softmax(-1)[..., :-1]
    return torch.einsum("bqc,bqhw->bchw", probs, mask_logits.sigmoid())
