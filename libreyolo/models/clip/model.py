"""CLIP declarations: the zero-shot classifier and its ``embed`` variant (see family.py)."""
from __future__ import annotations

from ...ops.preprocess import Preprocess
from .family import ImageTextEmbedder, ImageTextModel
from .nn import CONFIGS, CLIPNet

#: OpenAI CLIP's normalization
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class CLIP(ImageTextModel):
    """CLIP (OpenCLIP's LAION-2B ViT-B/32, ViT-B/16, ViT-L/14 towers; LibreYOLO 1.6.0's LibreCLIP
    checkpoints), task ``classify``: zero-shot over text prompts, softmax of ``logit_scale.exp() *
    cos``. Preprocessing as CLIP's: the shorter side to 224 (PIL bicubic, antialiased, whole
    levels), the centre crop, CLIP's mean / std. Text: CLIP's BPE tokenizer, context 77."""

    FAMILY = "clip"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreCLIP"   # the LibreYOLO checkpoint names: LibreCLIPb32-cls.pt
    NET = CLIPNet
    TOKENIZER = "ClipTokenizer"
    PROBS = "softmax"
    TEXT_BUCKETS = (16, 32, 77)
    DEFAULT_IMGSZ = 224
    DEFAULT_IMGSZ_BY_SIZE = {s: c.image_size for s, c in CONFIGS.items()}
    PREPROCESS = Preprocess("crop", mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0, interpolation="bicubic",
                            antialias=True, quantize=True)
    SIGNATURE_KEYS = ("visual.conv1.weight", "visual.class_embedding", "text_projection", "logit_scale",
                      "token_embedding.weight")
    TASK_VARIANTS = {"embed": ".clip.model:CLIPEmbed"}


class CLIPEmbed(ImageTextEmbedder, CLIP):
    """CLIP under the ``embed`` task: ``Results.embedding``, contrastive training (CLIP's loss)."""

    TASK = "embed"
    TASK_VARIANTS: dict = {}
