"""SigLIP 2 declarations: the zero-shot classifier and its ``embed`` variant (see clip/family.py)."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..clip.family import ImageTextEmbedder, ImageTextModel
from .nn import CONFIGS, SigLIP2Net


class SigLIP2(ImageTextModel):
    """SigLIP 2 (the fixed-resolution google/siglip2-base-patch16-256 and -so400m-patch14-384
    towers; LibreYOLO 1.6.0's LibreSigLIP2 checkpoints), task ``classify``: zero-shot over text
    prompts, each prompt's probability ``sigmoid(logit_scale.exp() * cos + logit_bias)`` on its
    own (they do not sum to 1: SigLIP's calibration; ``top1`` is still the best prompt).
    Preprocessing as SigLIP's: the image stretched to the square (PIL bilinear, antialiased,
    whole levels), mean / std 0.5 ([-1, 1]). Text: the Gemma SentencePiece tokenizer, lower-cased,
    end-of-sequence appended, padded to 64."""

    FAMILY = "siglip2"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreSigLIP2"   # the LibreYOLO checkpoint names: LibreSigLIP2b16-cls.pt
    NET = SigLIP2Net
    TOKENIZER = "GemmaTokenizer"
    PROBS = "sigmoid"
    TEXT_BUCKETS = (64,)
    DEFAULT_IMGSZ = 256
    DEFAULT_IMGSZ_BY_SIZE = {s: c.image_size for s, c in CONFIGS.items()}
    PREPROCESS = Preprocess("stretch", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bilinear",
                            antialias=True, quantize=True)
    SIGNATURE_KEYS = ("logit_bias", "vision_model.embeddings.patch_embedding.weight", "vision_model.head.probe",
                      "text_model.head.weight")
    TASK_VARIANTS = {"embed": ".siglip2.model:SigLIP2Embed"}

    def logits(self, image_emb: torch.Tensor, text_emb: torch.Tensor, net: nn.Module) -> torch.Tensor:
        """``logit_scale.exp() * cos + logit_bias`` (SigLIP's pairwise logits)."""
        return net.logit_scale.exp().float() * image_emb @ text_emb.T + net.logit_bias.float()


class SigLIP2Embed(ImageTextEmbedder, SigLIP2):
    """SigLIP 2 under the ``embed`` task: ``Results.embedding``, contrastive training (sigmoid loss)."""

    TASK = "embed"
    TASK_VARIANTS: dict = {}
