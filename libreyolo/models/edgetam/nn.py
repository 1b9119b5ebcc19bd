"""EdgeTAM networks: transformers' ``EdgeTamModel`` / ``EdgeTamVideoModel`` with SAM 2's entry points.

EdgeTAM is SAM 2 with a timm RepViT-M1 image encoder (``repvit_m1.dist_in1k``, features only),
a two-layer memory attention whose keys carry their own rotary grid, and a perceiver resampler
(``spatial_perceiver``) that compresses each remembered frame to 512 tokens. transformers' modules
are used as they are (subclassed: the state dict is theirs, key for key); the image and prompt
stages and the fixed-shape tracking step are :mod:`libreyolo.models.sam2.nn`'s mixins, with the
two places where EdgeTAM's memory differs overridden here.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import EdgeTamConfig, EdgeTamModel, EdgeTamVideoConfig, EdgeTamVideoModel, TimmWrapperConfig
from transformers.models.edgetam.configuration_edgetam import EdgeTamVisionConfig

from ..sam2.nn import PromptableMixin, VideoMixin, check_frame, frame_kwargs

#: the image encoder: timm's RepViT-M1, its four stages as features (EdgeTAM's release)
BACKBONE = "repvit_m1.dist_in1k"


def edgetam_config(frame: int = 1024, video: bool = False) -> EdgeTamConfig | EdgeTamVideoConfig:
    """transformers' EdgeTAM config at a ``frame`` x ``frame`` input. The backbone is named
    explicitly: transformers' default spells its ``architecture`` key wrongly and would build
    another timm network (built without pretrained weights: no download)."""
    frame = check_frame(frame)
    if video and frame % 256:   # the memory perceiver pools the stride-16 map in 16 x 16 windows
        raise ValueError(f"EdgeTAM's video network takes frames that are multiples of 256 (1024 as released), "
                         f"got imgsz={frame}")
    backbone = TimmWrapperConfig(architecture=BACKBONE,
                                 model_args={"in_chans": 3, "features_only": True, "out_indices": [0, 1, 2, 3]})
    vision = EdgeTamVisionConfig(backbone_config=backbone, **frame_kwargs(frame))
    prompt = {"image_size": frame}
    if video:
        return EdgeTamVideoConfig(vision_config=vision, prompt_encoder_config=prompt, image_size=frame,
                                  memory_attention_rope_feat_sizes=[frame // 16] * 2)
    return EdgeTamConfig(vision_config=vision, prompt_encoder_config=prompt)


class EdgeTamImageNet(PromptableMixin, EdgeTamModel):
    """EdgeTAM's image network (transformers' ``EdgeTamModel``): the LibreYOLO 1.6.0 layout."""

    def __init__(self, size: str = "edge", frame: int = 1024):
        super().__init__(edgetam_config(frame))
        self.image_size = frame


class EdgeTamVideoNet(VideoMixin, PromptableMixin, EdgeTamVideoModel):
    """EdgeTAM with its memory (transformers' ``EdgeTamVideoModel``)."""

    def __init__(self, size: str = "edge", frame: int = 1024):
        super().__init__(edgetam_config(frame, video=True))

    forward = PromptableMixin.forward

    #: memory tokens one remembered frame gives (the perceiver's 1-D and 2-D latents)
    @property
    def tokens_per_frame(self) -> int:
        c = self.config
        return int(c.perceiver_resampler_num_latents + c.perceiver_resampler_num_latents_2d)

    def memory_attention_options(self, memory: torch.Tensor) -> dict[str, Any]:
        """EdgeTAM's keys repeat their rotary grid once per remembered frame."""
        return {"num_spatial_memory_tokens": int(memory.shape[0]) // self.tokens_per_frame}

    def memory_tokens(self, memory: torch.Tensor, memory_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The perceiver's (B, T, C) output as (T, B, C) rows (``EdgeTamVideoModel._build_memory_attention_inputs``)."""
        return memory.permute(1, 0, 2), memory_pos.squeeze(1).permute(1, 0, 2)
