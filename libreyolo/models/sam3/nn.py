"""SAM 3 networks (the visual-prompt path): transformers' ``Sam3TrackerModel`` / ``Sam3TrackerVideoModel``
with SAM 2's entry points.

SAM 3's tracker is SAM 2's prompt encoder, two-way mask decoder and video memory on a new image
encoder: a Perception-Encoder ViT (patch 14, 32 blocks of width 1024 with 2-D rotary attention,
windows of 24 x 24 patches and four global blocks, a 24 x 24 position embedding tiled over the
patch grid) and a four-level FPN neck (x4, x2, x1, x0.5 of the stride-14 grid). transformers'
modules are used as they are (subclassed: the state dict is theirs, key for key), as for SAM 2;
the image stage, prompt stage and fixed-shape video step are :mod:`libreyolo.models.sam2.nn`'s
mixins. Text (concept) prompts are SAM 3's detector (``Sam3Model``), not this network.

Two details of transformers' models this follows exactly:

* the image network (``Sam3TrackerModel``, the LibreYOLO 1.6.0 layout and the ``sam3-large``
  fixture) adds its no-memory embedding to the fourth FPN level (x0.5), which the prompt stage
  then leaves out, so the stride-14 embedding reaches the mask decoder without it;
  :meth:`Sam3Promptable.embed` computes the same maps on both networks (the video network's own
  image forward would add it to the stride-14 map instead), so one set of weights gives one
  image prediction whichever network holds it;
* the video network (``Sam3TrackerVideoModel``) drops the fourth level in its image features and
  adds the no-memory embedding to the stride-14 map on a frame without memory (its own tracking
  loop, which :meth:`VideoMixin.track_step` reproduces), and keeps at most four conditioning
  frames in an object's memory (``max_cond_frame_num``; SAM 2.1 keeps them all).

The frame is fixed by the config (``image_size``, 1008 = 72 patches as released); any multiple of
14 builds (the CPU tests use small ones), the feature sizes derive from it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Sam3TrackerConfig, Sam3TrackerModel, Sam3TrackerVideoConfig, Sam3TrackerVideoModel
from transformers.models.sam3.configuration_sam3 import Sam3VisionConfig, Sam3ViTConfig

from ..sam2.nn import PromptableMixin, VideoMixin

#: input pixels per ViT patch (the stride of the image embedding)
PATCH = 14
#: the frame as released (72 x 72 patches)
FRAME = 1008


@dataclass(frozen=True)
class Sam3ViT:
    """The Perception-Encoder ViT of a size: width, MLP width, blocks, heads, window (patches),
    global-attention blocks, and the pretraining image size whose patch grid the learned position
    embedding covers (tiled over larger grids)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    window_size: int
    global_attn_indexes: tuple[int, ...]
    pretrain_image_size: int


#: SAM 3's release (facebook/sam3, transformers' default Sam3ViTConfig): 458.26 M parameters in the
#: image network, the fixture's count. Tests swap in a small ViT here to run the same code quickly.
VIT: dict[str, Sam3ViT] = {
    "large": Sam3ViT(1024, 4736, 32, 16, 24, (7, 15, 23, 31), 336),
}


def check_frame(size: int) -> int:
    """The network's square frame: a multiple of the 14-pixel patch, at least 4 patches (the FPN's
    x0.5 level pools the patch grid by 2)."""
    size = int(size)
    if size < 4 * PATCH or size % PATCH:
        raise ValueError(f"SAM 3 frames are multiples of {PATCH} pixels (its ViT patch), at least {4 * PATCH} "
                         f"({FRAME} as released), got imgsz={size}")
    return size


def sam3_config(size: str = "large", frame: int = FRAME, video: bool = False) -> Sam3TrackerConfig | Sam3TrackerVideoConfig:
    """transformers' config of SAM 3's tracker (``size`` a key of :data:`VIT`) at a ``frame`` x
    ``frame`` input; ``video``: with the memory (``Sam3TrackerVideoConfig``)."""
    v = VIT[size]
    frame = check_frame(frame)
    p = frame // PATCH
    vit = Sam3ViTConfig(hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
                        num_hidden_layers=v.num_hidden_layers, num_attention_heads=v.num_attention_heads,
                        window_size=v.window_size, global_attn_indexes=list(v.global_attn_indexes),
                        pretrain_image_size=v.pretrain_image_size, image_size=frame, patch_size=PATCH)
    vision = Sam3VisionConfig(backbone_config=vit, backbone_feature_sizes=[[4 * p] * 2, [2 * p] * 2, [p] * 2])
    prompt = {"image_size": frame, "patch_size": PATCH}
    if video:
        return Sam3TrackerVideoConfig(vision_config=vision, prompt_encoder_config=prompt, image_size=frame)
    return Sam3TrackerConfig(vision_config=vision, prompt_encoder_config=prompt)


class Sam3Promptable(PromptableMixin):
    """SAM 2's image and prompt stages on SAM 3's image encoder."""

    def embed(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) normalized frames -> (stride-3.5 skip (B, 32, 4p, 4p) after ``conv_s0``,
        stride-7 skip (B, 64, 2p, 2p) after ``conv_s1``, the stride-14 embedding (B, 256, p, p)),
        p = S / 14: what ``Sam3TrackerModel.forward`` hands its mask decoder (module docstring)."""
        f = self.vision_encoder(pixel_values, return_dict=True).fpn_hidden_states
        return self.mask_decoder.conv_s0(f[0]), self.mask_decoder.conv_s1(f[1]), f[2]


class Sam3ImageNet(Sam3Promptable, Sam3TrackerModel):
    """SAM 3's tracker on images (transformers' ``Sam3TrackerModel``): the LibreYOLO 1.6.0 layout."""

    def __init__(self, size: str = "large", frame: int = FRAME):
        super().__init__(sam3_config(size, frame))
        self.image_size = frame


class Sam3VideoNet(VideoMixin, Sam3Promptable, Sam3TrackerVideoModel):
    """SAM 3's tracker with its memory (transformers' ``Sam3TrackerVideoModel``); its image-network
    entries are those of :class:`Sam3ImageNet`, key for key."""

    def __init__(self, size: str = "large", frame: int = FRAME):
        super().__init__(sam3_config(size, frame, video=True))

    forward = PromptableMixin.forward
