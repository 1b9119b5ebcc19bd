"""SAM 2 networks: Hugging Face transformers' ``Sam2Model`` / ``Sam2VideoModel`` with our entry points.

The issue that brought SAM 2 here names transformers' modeling code as the reference layout, and
its modules are used as they are (subclassed, so the state dict is transformers' own, key for
key): the Hiera image encoder and FPN neck (``vision_encoder``), the prompt encoder, the two-way
mask decoder and, in the video network, the memory attention, memory encoder and object-pointer
projection. What is ours is only the plumbing around them:

* :meth:`PromptableMixin.embed` / :meth:`PromptableMixin.decode`: the image stage (normalized
  frame -> the stride-4 / stride-8 skip features after ``conv_s0`` / ``conv_s1`` and the stride-16
  embedding plus the no-memory embedding) and the prompt stage (embeddings + points / labels /
  one box / a mask prompt -> low-resolution mask logits, predicted IoUs, object-score logit), the
  two halves of ``Sam2Model.forward`` so that an image is embedded once and prompted many times;
* :class:`VideoMixin`: the per-frame tracking step of ``Sam2VideoModel`` written with fixed shapes
  (memory bank and object pointers passed in as tensors, temporal offsets as a tensor) so that it
  can be captured once its shapes repeat, where transformers' own loop keeps the bank in Python
  dictionaries of its inference session (see :mod:`libreyolo.tasks.segment_prompt.video`).

The network's frame is fixed by its config (``image_size``, 1024 as released; the feature sizes
derive from it): :func:`sam2_config` builds the config of a size at any frame that is a multiple
of 64 (the small frames the CPU tests use).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import Sam2Config, Sam2Model, Sam2VideoConfig, Sam2VideoModel
from transformers.models.sam2.configuration_sam2 import Sam2HieraDetConfig, Sam2VisionConfig
from transformers.models.sam2_video.modeling_sam2_video import get_1d_sine_pe

#: the four SAM 2.1 releases (sam2.1_hiera_{t,s,b+,l}.yaml): Hiera embed dim, heads of stage 1,
#: blocks per stage, global-attention blocks, window positional-embedding background, windows
HIERA = {
    "tiny": (96, 1, [1, 2, 7, 2], [5, 7, 9], [7, 7], [8, 4, 14, 7]),
    "small": (96, 1, [1, 2, 11, 2], [7, 10, 13], [7, 7], [8, 4, 14, 7]),
    "base-plus": (112, 2, [2, 3, 16, 3], [12, 16, 20], [14, 14], [8, 4, 14, 7]),
    "large": (144, 2, [2, 6, 36, 4], [23, 33, 43], [7, 7], [8, 4, 16, 8]),
}

#: SAM's "no object" logit (transformers' NO_OBJ_SCORE): masks of frames where the object is absent
NO_OBJECT_SCORE = -1024.0


def check_frame(size: int) -> int:
    """The network's square frame: a multiple of 64 (stride 16 of the embedding, 4 of Hiera's
    windowed stages)."""
    size = int(size)
    if size < 64 or size % 64:
        raise ValueError(f"SAM 2 / EdgeTAM frames are multiples of 64 (1024 as released), got imgsz={size}")
    return size


def frame_kwargs(frame: int) -> dict[str, Any]:
    """The config fields that follow the frame size (feature maps at strides 4, 8, 16)."""
    return {"backbone_feature_sizes": [[frame // 4] * 2, [frame // 8] * 2, [frame // 16] * 2]}


def sam2_config(size: str, frame: int = 1024, video: bool = False) -> Sam2Config | Sam2VideoConfig:
    """transformers' config of SAM 2.1 ``size`` at a ``frame`` x ``frame`` input."""
    d, h, stages, glob, bkg, windows = HIERA[size]
    frame = check_frame(frame)
    backbone = Sam2HieraDetConfig(hidden_size=d, num_attention_heads=h, blocks_per_stage=stages,
                                  embed_dim_per_stage=[d, 2 * d, 4 * d, 8 * d],
                                  num_attention_heads_per_stage=[h, 2 * h, 4 * h, 8 * h],
                                  global_attention_blocks=glob, window_positional_embedding_background_size=bkg,
                                  window_size_per_stage=windows, image_size=[frame, frame])
    vision = Sam2VisionConfig(backbone_config=backbone, backbone_channel_list=[8 * d, 4 * d, 2 * d, d],
                              **frame_kwargs(frame))
    prompt = {"image_size": frame}
    if video:
        return Sam2VideoConfig(vision_config=vision, prompt_encoder_config=prompt, image_size=frame,
                               memory_attention_rope_feat_sizes=[frame // 16] * 2)
    return Sam2Config(vision_config=vision, prompt_encoder_config=prompt)


class PromptableMixin:
    """Image stage and prompt stage of a SAM 2-style transformers model (``self`` is one)."""

    image_size: int

    @property
    def frame(self) -> int:
        return int(self.prompt_encoder.input_image_size)

    def embed(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) normalized frames -> (stride-4 skip (B, 32, S/4, S/4), stride-8 skip
        (B, 64, S/8, S/8), embedding + no-memory embedding (B, 256, S/16, S/16)): what
        ``Sam2Model.forward`` computes before the prompt encoder."""
        b = pixel_values.shape[0]
        feats = list(self.get_image_features(pixel_values, return_dict=True).fpn_hidden_states)
        feats[-1] = feats[-1] + self.no_memory_embedding
        return tuple(f.permute(1, 2, 0).reshape(b, -1, *s) for f, s in zip(feats, self.backbone_feature_sizes))

    def decode(self, s0: torch.Tensor, s1: torch.Tensor, embedding: torch.Tensor, points: torch.Tensor | None,
               labels: torch.Tensor | None, boxes: torch.Tensor | None, multimask: bool,
               masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Embeddings + one prompt per image -> mask logits (B, M, S/4, S/4), predicted IoU (B, M)
        and the object-score logit (B, 1). ``points`` (B, P, 2) and ``boxes`` (B, 1, 4) are pixels
        of the S frame, ``labels`` (B, P) 1 / 0 (any number type); ``masks`` (B, 1, S/4, S/4) mask
        logits as a dense prompt. M = 3 with ``multimask``, else 1."""
        if boxes is not None and boxes.shape[1] != 1:
            raise ValueError(f"{type(self).__name__} takes at most one box per prompt (its prompt encoder pairs "
                             f"one box with the points), got {boxes.shape[1]}: prompt each box in its own call")
        b = embedding.shape[0]
        pe = self.get_image_wide_positional_embeddings().repeat(b, 1, 1, 1)
        pts = None if points is None else points[:, None]
        lab = None if labels is None else labels[:, None].to(torch.int64)
        if pts is None and boxes is None:   # only a mask: SAM 2's empty point (label -1)
            pts = embedding.new_zeros(b, 1, 1, 2)
            lab = -torch.ones(b, 1, 1, dtype=torch.int64, device=embedding.device)
        sparse, dense = self.prompt_encoder(input_points=pts, input_labels=lab, input_boxes=boxes, input_masks=masks)
        low, iou, _, obj = self.mask_decoder(image_embeddings=embedding, image_positional_embeddings=pe,
                                             sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                             multimask_output=multimask, high_resolution_features=[s0, s1])
        return low[:, 0], iou[:, 0], obj

    def forward(self, pixel_values: torch.Tensor, input_points: torch.Tensor | None = None,
                input_labels: torch.Tensor | None = None, input_boxes: torch.Tensor | None = None,
                multimask_output: bool = True, **_: Any) -> dict[str, Any]:
        """The fixtures' call: ``pixel_values`` zero-padded (bottom/right) to the frame, points
        (B, 1, P, 2) and labels (B, 1, P) as transformers takes them; outputs in
        ``Sam2ImageSegmentationOutput`` order."""
        h, w = pixel_values.shape[-2:]
        x = F.pad(pixel_values, (0, self.frame - w, 0, self.frame - h))
        s0, s1, emb = self.embed(x)
        pts = None if input_points is None else input_points[:, 0]
        lab = None if input_labels is None else input_labels[:, 0]
        low, iou, obj = self.decode(s0, s1, emb, pts, lab, input_boxes, bool(multimask_output))
        return {"iou_scores": iou[:, None], "pred_masks": low[:, None], "object_score_logits": obj,
                "image_embeddings": [s0, s1, emb]}


class VideoMixin:
    """SAM 2's per-frame tracking step with fixed shapes (``self`` is a transformers video model).

    The memory bank of one object is passed in as tensors: ``memory`` (N * HW, B, 64) and its
    positional encoding ``memory_pos`` (spatial + temporal, same shape) of the N remembered frames,
    ``pointers`` (K, B, 256) the object pointers of K frames and ``pointer_offsets`` (K,) their
    temporal distance to this frame. With N, K and the batch fixed the step is fixed-shape.
    """

    def frame_features(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Normalized frame (B, 3, S, S) -> (skip s0, skip s1, features (HW, B, 256), their
        positional encoding (HW, B, 256)): the image-encoder half of every step."""
        out = self.get_image_features(pixel_values, return_dict=True)
        feats, pos = out.fpn_hidden_states, out.fpn_position_encoding
        b = pixel_values.shape[0]
        s0, s1 = (f.permute(1, 2, 0).reshape(b, -1, *s) for f, s in zip(feats[:2], self.backbone_feature_sizes[:2]))
        return s0, s1, feats[-1], pos[-1]

    def _grid(self, flat: torch.Tensor) -> torch.Tensor:
        """(HW, B, C) -> (B, C, H, W) at the stride-16 level."""
        return flat.permute(1, 2, 0).reshape(flat.shape[1], self.hidden_dim, *self.backbone_feature_sizes[-1])

    def memory_attention_options(self, memory: torch.Tensor) -> dict[str, Any]:
        """Extra arguments of the memory attention for this bank (EdgeTAM: its frame count)."""
        return {}

    def memory_tokens(self, memory: torch.Tensor, memory_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The memory encoder's output as (tokens, B, C) rows of the bank (SAM 2's already is)."""
        return memory, memory_pos

    def pointer_embedding(self, pointers: torch.Tensor, pointer_offsets: torch.Tensor, b: int) -> tuple[torch.Tensor, ...]:
        """Object pointers (K, B, ..., 256) of a batch of ``b`` objects and their offsets (K,) ->
        memory tokens (K * 4, B, 64) and their positional encoding:
        ``Sam2VideoModel._process_object_pointers`` with the offsets a tensor (its own builds them
        from a Python list)."""
        c = pointers.shape[-1]
        max_diff = float(self.config.max_object_pointers_in_encoder - 1)
        sine = get_1d_sine_pe(pointer_offsets.to(torch.float32) / max_diff, dim=c).to(pointers.dtype)
        pos = self.temporal_positional_encoding_projection_layer(sine).unsqueeze(1).expand(-1, b, self.mem_dim)
        splits = c // self.mem_dim
        tokens = pointers.reshape(-1, b, splits, self.mem_dim).permute(0, 2, 1, 3).flatten(0, 1)
        return tokens, pos.repeat_interleave(splits, dim=0)

    def conditioned_features(self, feats: torch.Tensor, pos: torch.Tensor, memory: torch.Tensor | None,
                             memory_pos: torch.Tensor | None, pointers: torch.Tensor | None,
                             pointer_offsets: torch.Tensor | None) -> torch.Tensor:
        """The frame's stride-16 features fused with the memory bank (memory attention), or plus
        the no-memory embedding on a conditioning frame (``memory`` None): (B, 256, H, W)."""
        if memory is None:
            return self._grid(feats + self.no_memory_embedding)
        mem, mem_pos, n_ptr = [memory], [memory_pos], 0
        if pointers is not None:
            tokens, tokens_pos = self.pointer_embedding(pointers, pointer_offsets, feats.shape[1])
            mem.append(tokens)
            mem_pos.append(tokens_pos)
            n_ptr = tokens.shape[0]
        out = self.memory_attention(current_vision_features=feats, current_vision_position_embeddings=pos,
                                    memory=torch.cat(mem, 0).to(feats.dtype), memory_posision_embeddings=torch.cat(mem_pos, 0),
                                    num_object_pointer_tokens=n_ptr, **self.memory_attention_options(memory))
        # (1, B, HW, C) -> (B, C, H, W): the objects stay apart for any batch of objects
        return out.flatten(0, 1).transpose(1, 2).reshape(feats.shape[1], self.hidden_dim, *self.backbone_feature_sizes[-1])

    def track_step(self, s0: torch.Tensor, s1: torch.Tensor, feats: torch.Tensor, pos: torch.Tensor,
                   memory: torch.Tensor | None, memory_pos: torch.Tensor | None, pointers: torch.Tensor | None,
                   pointer_offsets: torch.Tensor | None, points: torch.Tensor | None, labels: torch.Tensor | None,
                   multimask: bool) -> tuple[torch.Tensor, ...]:
        """N objects on one frame (N = the memory's batch: the bank of each object side by side,
        ``memory`` (T, N, 64), ``pointers`` (K, N, ...), one ``pointer_offsets`` for all; 1 on a
        conditioning frame, ``memory`` None): memory attention (or none), prompt encoder (the
        points, or SAM 2's empty point), mask decoder, object pointer, memory encoder. The
        frame's features (batch 1) serve every object. Returns (low-res mask logits (N, 1, S/4,
        S/4), object-score logit (N, 1), object pointer (N, 256), new memory (HW, N, 64), its
        spatial positional encoding (HW, N, 64)): what ``Sam2VideoModel._run_single_frame_inference``
        and ``_encode_new_memory`` compute for each object.

        The memory attention runs on the N objects at once (each object's rows equal its own
        run's bit for bit on the CPU); the prompt encoder and mask decoder
        (``_single_frame_forward``) run once per object, because its best-of-three mask selection
        indexes for one object (with N > 1 its indices broadcast to N x N); so does the memory
        encoder, because its strided convolutions give other bits for a batch of masks than for
        one on the CPU (and EdgeTAM's spatial perceiver, in transformers, takes one object: its
        2-D latents are ``view``-ed after an expand). ``tests/unit/test_sam_track_cli.py::
        test_batched_objects_equal_one_at_a_time`` checks the whole step's outputs per object."""
        n = 1 if memory is None else int(memory.shape[1])
        if n > 1 and points is not None:
            raise ValueError("a prompted (conditioning) step takes one object")
        feats_n, pos_n = (feats, pos) if n == 1 else (feats.expand(-1, n, -1), pos.expand(-1, n, -1))
        pix = self.conditioned_features(feats_n, pos_n, memory, memory_pos, pointers, pointer_offsets)
        pts = None if points is None else points[:, None]
        lab = None if labels is None else labels[:, None].to(torch.int64)
        outs = []
        for i in range(n):
            sam = self._single_frame_forward(input_points=pts, input_labels=lab,
                                             image_embeddings=[s0, s1, pix if n == 1 else pix[i:i + 1]],
                                             multimask_output=multimask)
            mem, mem_pos = self._encode_new_memory(current_vision_feats=feats, pred_masks_high_res=sam.high_res_masks,
                                                   object_score_logits=sam.object_score_logits,
                                                   is_mask_from_pts=points is not None)
            outs.append((sam.pred_masks, sam.object_score_logits, sam.object_pointer, *self.memory_tokens(mem, mem_pos)))
        if n == 1:
            return outs[0]
        return tuple(torch.cat([o[k] for o in outs], 1 if k >= 3 else 0) for k in range(5))

    def mask_step(self, s0: torch.Tensor, s1: torch.Tensor, feats: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A mask prompt (B, 1, S, S), 1 inside, on a conditioning frame: taken as the output
        (``Sam2VideoModel._use_mask_as_output``) and encoded into memory; returns as
        :meth:`track_step`."""
        sam = self._use_mask_as_output(self._grid(feats), [s0, s1], mask)
        mem, mem_pos = self._encode_new_memory(current_vision_feats=feats, pred_masks_high_res=sam.high_res_masks,
                                               object_score_logits=sam.object_score_logits, is_mask_from_pts=True)
        return (sam.pred_masks, sam.object_score_logits, sam.object_pointer, *self.memory_tokens(mem, mem_pos))


class Sam2ImageNet(PromptableMixin, Sam2Model):
    """SAM 2's image network (transformers' ``Sam2Model``): the LibreYOLO 1.6.0 checkpoint layout."""

    def __init__(self, size: str = "tiny", frame: int = 1024):
        super().__init__(sam2_config(size, frame))
        self.image_size = frame


class Sam2VideoNet(VideoMixin, PromptableMixin, Sam2VideoModel):
    """SAM 2 with its memory (transformers' ``Sam2VideoModel``): the released checkpoints' layout;
    its image-network entries are those of :class:`Sam2ImageNet`, key for key."""

    def __init__(self, size: str = "tiny", frame: int = 1024):
        super().__init__(sam2_config(size, frame, video=True))

    forward = PromptableMixin.forward
