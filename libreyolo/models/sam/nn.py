"""SAM (Segment Anything, ViT-B / L / H): transformers' SAM modules behind our two stages.

The network is Hugging Face transformers' SAM, module for module (``SamPositionalEmbedding``,
``SamVisionEncoder``, ``SamPromptEncoder``, ``SamMaskDecoder``), so its state dict is the one
``SamModel`` writes (and the LibreYOLO checkpoints hold): ``shared_image_embedding``,
``vision_encoder`` (ViT with windowed and global attention, relative positions, the neck),
``prompt_encoder`` (whose ``shared_embedding`` is the same module as ``shared_image_embedding``)
and ``mask_decoder``. We use transformers' modules rather than our own because they are the
reference layout the checkpoints were written from and they run without host synchronisation or
data-dependent shapes; what is ours is the split into the two stages prediction runs separately
(:meth:`SamNet.embed`, :meth:`SamNet.decode`) and the prompt layout of the task (one prompt of P
points and K boxes per image, as MobileSAM takes it).

The frame is fixed: the ViT adds a learned absolute position embedding of
``image_size / 16`` cells (64 at 1024), so every image is resized so its longer side is
``image_size``, normalized with ImageNet's mean / std and zero-padded (bottom / right) to the
square, as transformers' ``SamProcessor`` does; points and box corners are pixels of that frame.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

try:
    from transformers import SamConfig, SamMaskDecoderConfig, SamPromptEncoderConfig, SamVisionConfig
    from transformers.models.sam.modeling_sam import (
        SamMaskDecoder,
        SamPositionalEmbedding,
        SamPromptEncoder,
        SamVisionEncoder,
    )
except ImportError as exc:   # the optional extra
    raise ImportError("the SAM family runs transformers' SAM modules: pip install 'libreyolo-graphs[sam]' "
                      f"(transformers is missing or too old: {exc})") from exc

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD

PATCH = 16          # input pixels per image-embedding cell
EMBED_DIM = 256     # image embedding / prompt token width


@dataclass(frozen=True)
class SamSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    global_attn_indexes: tuple[int, ...]


#: the original releases' image encoders (ViT-B / L / H, 14-cell windows, four global blocks)
CONFIGS: dict[str, SamSize] = {
    "base": SamSize(768, 12, 12, (2, 5, 8, 11)),
    "large": SamSize(1024, 24, 16, (5, 11, 17, 23)),
    "huge": SamSize(1280, 32, 16, (7, 15, 23, 31)),
}

#: the attention kernels the modules are built with: torch's scaled_dot_product_attention
ATTN_IMPLEMENTATION = "sdpa"


def sam_config(size: str | SamSize, image_size: int = 1024, window_size: int = 14) -> SamConfig:
    """transformers' ``SamConfig`` of a size (a name of :data:`CONFIGS` or a :class:`SamSize`;
    tests build small ones) at a frame of ``image_size``."""
    s = CONFIGS[size] if isinstance(size, str) else size
    if image_size % PATCH:
        raise ValueError(f"SAM frame size must be a multiple of {PATCH}, got {image_size}")
    vision = SamVisionConfig(hidden_size=s.hidden_size, num_hidden_layers=s.num_hidden_layers,
                             num_attention_heads=s.num_attention_heads,
                             global_attn_indexes=list(s.global_attn_indexes), image_size=image_size,
                             window_size=window_size, output_channels=EMBED_DIM)
    prompt = SamPromptEncoderConfig(hidden_size=EMBED_DIM, image_size=image_size,
                                    image_embedding_size=image_size // PATCH)
    cfg = SamConfig(vision_config=vision.to_dict(), prompt_encoder_config=prompt.to_dict(),
                    mask_decoder_config=SamMaskDecoderConfig(hidden_size=EMBED_DIM).to_dict())
    for c in (cfg, cfg.vision_config, cfg.mask_decoder_config):
        c._attn_implementation = ATTN_IMPLEMENTATION
    return cfg


def _rel_pos_on_device(self, q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """``SamVisionAttention.get_rel_pos`` with its index built on ``rel_pos``'s device.

    transformers builds the relative-coordinate index with ``torch.arange`` on the CPU and indexes
    the (CUDA) table with it: a host-to-device copy of pageable memory, which CUDA-graph capture
    refuses. The same arithmetic on the table's device gives the same integers, so the same rows."""
    max_rel_dist = int(2 * max(q_size, k_size) - 1)
    table = F.interpolate(rel_pos.reshape(1, rel_pos.shape[0], -1).transpose(1, 2), size=max_rel_dist,
                          mode="linear").reshape(-1, max_rel_dist).permute(1, 0)
    dev = rel_pos.device
    q = torch.arange(q_size, device=dev)[:, None] * max(k_size / q_size, 1.0)
    k = torch.arange(k_size, device=dev)[None, :] * max(q_size / k_size, 1.0)
    return table[((q - k) + (k_size - 1) * max(q_size / k_size, 1.0)).long()]


class SamImageEncoder(SamVisionEncoder):
    """transformers' SAM ViT + neck returning the (B, 256, S/16, S/16) embedding itself (its
    ``last_hidden_state``), so the module's output is a tensor (forward hooks, graph outputs).
    Each attention's relative-position lookup builds its index on the GPU (capture-safe; see
    :func:`_rel_pos_on_device`)."""

    def __init__(self, config: SamVisionConfig):
        super().__init__(config)
        for module in self.modules():
            if hasattr(module, "get_rel_pos") and hasattr(module, "rel_pos_h"):
                module.get_rel_pos = types.MethodType(_rel_pos_on_device, module)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:   # type: ignore[override]
        return super().forward(pixel_values).last_hidden_state


class SamNet(nn.Module):
    """SAM in transformers' ``SamModel`` layout; the stages are :meth:`embed` (image ->
    embedding, once per image) and :meth:`decode` (embedding + prompt -> masks, per prompt)."""

    def __init__(self, config: SamConfig):
        super().__init__()
        self.config = config
        self.img_size = int(config.vision_config.image_size)
        self.shared_image_embedding = SamPositionalEmbedding(config.vision_config)
        self.vision_encoder = SamImageEncoder(config.vision_config)
        self.prompt_encoder = SamPromptEncoder(config)
        # SamModel ties the prompt encoder's Fourier matrix to the image's: one module, two names
        self.prompt_encoder.shared_embedding = self.shared_image_embedding
        self.mask_decoder = SamMaskDecoder(config.mask_decoder_config)
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    # ------------------------------------------------------------------------------ stages
    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """Zero-pad a normalized (B, 3, h, w) image bottom / right to the frame."""
        s = self.img_size
        h, w = x.shape[-2:]
        if h > s or w > s:
            raise ValueError(f"SAM input {h}x{w} is larger than its {s}x{s} frame; resize the longer side to {s}")
        return F.pad(x, (0, s - w, 0, s - h)) if (h, w) != (s, s) else x

    def embed(self, x01: torch.Tensor, img_size: int | None = None) -> torch.Tensor:
        """(B, 3, h, w) RGB in [0, 1], max(h, w) <= frame -> (B, 256, frame/16, frame/16)."""
        self.check_frame(img_size)
        return self.vision_encoder(self.pad((x01 - self.pixel_mean) / self.pixel_std))

    def check_frame(self, img_size: int | None) -> None:
        if img_size is not None and int(img_size) != self.img_size:
            raise ValueError(f"SAM's frame is fixed at {self.img_size} (its ViT's position embedding), got imgsz={img_size}")

    def image_pe(self, h: int, w: int) -> torch.Tensor:
        """(1, 256, h, w) positional encoding of the embedding grid's cell centres (SamModel's
        ``get_image_wide_positional_embeddings``, for any grid)."""
        g = self.shared_image_embedding.positional_embedding
        ones = torch.ones((h, w), device=g.device, dtype=g.dtype)
        y = (ones.cumsum(0) - 0.5) / h
        x = (ones.cumsum(1) - 0.5) / w
        return self.shared_image_embedding(torch.stack([x, y], dim=-1)).permute(2, 0, 1).unsqueeze(0)

    def sparse_tokens(self, points: torch.Tensor | None, labels: torch.Tensor | None,
                      boxes: torch.Tensor | None) -> torch.Tensor | None:
        """(B, 1, N, 256) prompt tokens of one prompt per image: the P points (a padding point
        appended when there is no box, as SAM does) then the two corners of each of the K boxes."""
        pe = self.prompt_encoder
        parts = []
        if points is not None:
            parts.append(pe._embed_points(points[:, None], labels[:, None].to(points.dtype), pad=boxes is None))
        if boxes is not None:
            b, k = boxes.shape[:2]
            parts.append(pe._embed_boxes(boxes).reshape(b, 1, 2 * k, -1))
        return torch.cat(parts, dim=2) if parts else None

    def decode(self, image_embeddings: torch.Tensor, points: torch.Tensor | None = None,
               labels: torch.Tensor | None = None, boxes: torch.Tensor | None = None,
               multimask: bool = True, img_size: int | None = None,
               mask_input: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings (B, 256, h, w) + one prompt per image (points (B, P, 2), labels (B, P),
        boxes (B, K, 4), pixels of the frame; ``mask_input`` (B, 1, 4h, 4w) low-resolution mask
        logits, as a previous call returns them) -> low-resolution mask logits (B, M, 4h, 4w)
        and predicted IoU (B, M): M = 3 (tokens 1-3) with ``multimask``, else 1 (token 0)."""
        self.check_frame(img_size)
        b, _, h, w = image_embeddings.shape
        sparse = self.sparse_tokens(points, labels, boxes)
        if mask_input is not None:
            dense = self.prompt_encoder.mask_embed(mask_input)
        else:
            dense = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(b, -1, h, w)
        pe = self.image_pe(h, w).expand(b, -1, -1, -1)
        masks, iou = self.mask_decoder(image_embeddings, pe, sparse, dense, multimask)
        return masks[:, 0], iou[:, 0]

    def forward(self, pixel_values: torch.Tensor, input_points: torch.Tensor | None = None,
                input_labels: torch.Tensor | None = None, input_boxes: torch.Tensor | None = None,
                multimask_output: bool = True) -> dict[str, torch.Tensor]:
        """The reference call: the normalized image ``pixel_values`` (padded to the frame here),
        ``input_points`` (B, 1, P, 2), ``input_labels`` (B, 1, P), ``input_boxes`` (B, K, 4) in
        the frame -> ``image_embeddings``, ``pred_masks`` (B, 1, M, 4h, 4w), ``iou_scores`` (B, 1, M)."""
        emb = self.vision_encoder(self.pad(pixel_values))
        pts = None if input_points is None else input_points.flatten(1, 2).to(emb.dtype)
        lab = None if input_labels is None else input_labels.flatten(1, 2)
        if pts is not None and lab is None:
            lab = torch.ones(pts.shape[:2], device=pts.device)
        boxes = None if input_boxes is None else input_boxes.to(emb.dtype)
        masks, iou = self.decode(emb, pts, lab, boxes, multimask_output)
        return {"image_embeddings": emb, "pred_masks": masks.unsqueeze(1), "iou_scores": iou.unsqueeze(1)}
