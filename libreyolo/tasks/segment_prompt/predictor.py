"""Promptable-segmentation predict: an image stage once per image, a prompt stage per prompt.

Image stage (``model.set_image(img)``, or the first half of ``model(img, points=...)``): the
uint8 image is uploaded, resized on the device so its longer side is ``imgsz`` and embedded
(``model.infer``); one graph per input image size (``cuda_graph``), images of one size may be
stacked (``batch``). The embedding stays on the device as the current image.

Prompt stage (``model(points=..., labels=..., boxes=...)``): the prompt is checked and mapped
into the network's frame on the host (:mod:`.prompts`), uploaded as one small float32 row, and
the stage - prompt encoder, mask decoder, SAM's mask post-processing (bilinear to the frame, crop
to the resized image, bilinear to the original size, threshold 0) - runs on the device; one
graph per (image size, number of points, number of boxes, multimask). Prompts are not padded to
bucketed counts: SAM's padding point (label -1) is a real token that every other token attends
to, so a padded prompt gives other masks, not only other bits
(tests/unit/test_segment_prompt.py shows it); each count keeps its own graph instead.

The masks and scores of the Results stay on the model's device (``Results.masks.cpu()`` brings
them to the host), so an interactive prompt call costs no device-to-host copy of full-size masks.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...data.sources import SourceItem, load_sources, parse_color
from ...graphs.runner import normalize_mode
from ...options import check_imgsz, check_int, parse_amp, parse_bool
from .prompts import Prompt, pack, parse_prompt, unpack

MASK_THRESHOLD = 0.0   # SAM's: a pixel is in the mask where its logit is above 0
#: a binary mask prompt as logits: inside +10, outside -10 (SAM 2's ``_use_mask_as_output``: the
#: mask scaled by 20 and shifted by -10, sigmoid(-10) = 4.5e-05)
MASK_SCALE, MASK_BIAS = 20.0, -10.0


def takes_mask_prompts(model: Any) -> bool:
    """Whether ``model``'s family takes mask prompts (``MASK_PROMPTS``: its prompt encoder has a
    mask input; SAM, SAM 2, EdgeTAM)."""
    return bool(getattr(model, "MASK_PROMPTS", False))


def check_mask_family(model: Any) -> None:
    """A clear error for a family whose prompt stage takes no mask."""
    if not takes_mask_prompts(model):
        raise ValueError(f"{model.FAMILY}-{model.size} takes no mask prompts (mask_input): its prompt stage takes "
                         "points and boxes only; mask prompts are SAM's, SAM 2's and EdgeTAM's (sam, sam2, edgetam)")


def load_mask_input(mask: Any) -> np.ndarray | torch.Tensor:
    """``mask_input`` as an array: a tensor or array as given; a path: a ``.npy`` array, or an
    image file whose non-zero pixels are the mask (a binary mask of the image)."""
    if isinstance(mask, (str, Path)):
        path = Path(mask)
        if not path.is_file():
            raise FileNotFoundError(f"mask_input file {str(path)!r} does not exist")
        if path.suffix.lower() == ".npy":
            return np.load(path, allow_pickle=False)
        from PIL import Image
        with Image.open(path) as im:
            return np.asarray(im.convert("L")) > 0
    if isinstance(mask, (torch.Tensor, np.ndarray)):
        return mask
    raise ValueError(f"mask_input must be an array, a tensor or a file (.npy, or an image of the binary mask), "
                     f"got {type(mask).__name__}")


def low_res_side(size: int, stride: int) -> int:
    """The side of the low-resolution mask logits: 4x the image embedding's (size / stride) - size/4
    for SAM and SAM 2 (stride 16), 4 x size/14 for SAM 3."""
    return 4 * (size // stride)


def mask_prompt_logits(mask: Any, size: int, resized: tuple[int, int], hw: tuple[int, int],
                       device: torch.device, stride: int = 16) -> torch.Tensor:
    """A mask prompt -> (1, 1, s, s) float32 low-resolution logits in the network's frame
    (s = :func:`low_res_side`), what SAM's prompt encoder embeds (``mask_input``):

    * a float array of shape (s, s), (1, s, s) or (1, 1, s, s): low-resolution
      logits as a previous call returns them (``Results.masks.logits[i]``), taken as they are;
    * a bool (or integer 0/1) array of the image's (h, w) (or (1, h, w)): a binary mask of the
      image, placed in the frame as the image is (resized to ``resized`` with antialiased
      bilinear, zero-padded bottom / right to the square), made logits (+10 inside, -10 outside:
      :data:`MASK_SCALE`, :data:`MASK_BIAS`) and brought to s x s with antialiased bilinear, as
      SAM 2 turns a mask into low-resolution logits (``_use_mask_as_output``)."""
    m = torch.as_tensor(np.ascontiguousarray(mask) if isinstance(mask, np.ndarray) else mask)
    s = low_res_side(size, stride)
    binary = m.dtype == torch.bool or not (m.is_floating_point() or m.is_complex())
    if binary:
        if m.dtype != torch.bool and not bool(((m == 0) | (m == 1)).all()):
            raise ValueError("an integer mask_input is a binary mask of the image: its values must be 0 or 1 "
                             "(low-resolution logits are float)")
        while m.ndim > 2 and m.shape[0] == 1:
            m = m[0]
        if tuple(m.shape) != tuple(hw):
            raise ValueError(f"a binary mask_input is a mask of the image: shape {hw[0]}x{hw[1]} (h, w) expected, "
                             f"got {tuple(m.shape)}")
        x = m.to(device, torch.float32)[None, None]
        if tuple(resized) != tuple(hw):
            x = F.interpolate(x, resized, mode="bilinear", align_corners=False, antialias=True)
        x = F.pad(x, (0, size - resized[1], 0, size - resized[0])) * MASK_SCALE + MASK_BIAS
        if tuple(resized) != (size, size):   # the padding is outside the image: logit MASK_BIAS
            x[..., resized[0]:, :] = MASK_BIAS
            x[..., :, resized[1]:] = MASK_BIAS
        return F.interpolate(x, (s, s), mode="bilinear", align_corners=False, antialias=True)
    if not m.is_floating_point():
        raise ValueError(f"mask_input must be float low-resolution logits or a bool mask of the image, got {m.dtype}")
    while m.ndim > 2 and m.shape[0] == 1:
        m = m[0]
    if tuple(m.shape) != (s, s):
        raise ValueError(f"float mask_input is low-resolution logits in the network's {size}x{size} frame: shape "
                         f"({s}, {s}) (or (1, {s}, {s}), as Results.masks.logits[i][None]) expected, got "
                         f"{tuple(torch.as_tensor(mask).shape)}; a binary mask of the image is a bool array")
    if not bool(torch.isfinite(m).all()):
        raise ValueError("mask_input logits must be finite")
    return m.to(device, torch.float32)[None, None]


@dataclass
class ImageState:
    """The current image of a predictor: its embedding on the device and its geometry."""

    item: SourceItem
    embedding: Any               # (1, 256, size/16, size/16), or a tuple of such maps (SAM 2: + skip features)
    size: int                    # the network's frame
    hw: tuple[int, int]          # original (h, w)
    resized: tuple[int, int]     # (h', w') in the frame
    amp_dtype: torch.dtype | None


def _parts(embedding: Any) -> tuple:
    """An image embedding as the tuple of tensors a stage takes (one map, or SAM 2's three)."""
    return tuple(embedding) if isinstance(embedding, (tuple, list)) else (embedding,)


def _whole(parts: tuple) -> Any:
    """The inverse of :func:`_parts`: one map stays a tensor."""
    return parts[0] if len(parts) == 1 else tuple(parts)


#: the two under the names other modules use (the automatic masks' grid stage takes an embedding so)
embedding_parts, embedding_whole = _parts, _whole


def upscale_logits(low: torch.Tensor, size: int, resized: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
    """(B, M, s, s) low-resolution logits -> (B, M, h, w) logits of the original image (SAM's
    post-processing: bilinear to the frame, crop the resized image, bilinear to (h, w))."""
    x = F.interpolate(low, (size, size), mode="bilinear", align_corners=False)
    x = x[..., :resized[0], :resized[1]]
    return F.interpolate(x, hw, mode="bilinear", align_corners=False)


def postprocess_masks(low: torch.Tensor, size: int, resized: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
    """(B, M, s, s) low-resolution logits -> (B, M, h, w) bool masks of the original image
    (:func:`upscale_logits`, then > 0)."""
    return upscale_logits(low, size, resized, hw) > MASK_THRESHOLD


class PromptPredictor:
    """``model.predict`` / ``model.set_image`` / ``model.capture_graph`` of a segment-prompt model."""

    def __init__(self, model):
        self.model = model
        self.current: ImageState | None = None

    # ---------------------------------------------------------------- stages
    def encoder_stage(self, size: int):
        """uint8 (B, H, W, 3) -> (B, 256, size/16, size/16) image embeddings."""
        model, prep = self.model, self.model.preprocess

        def from_u8(u8):
            return model.infer(prep(u8, size))
        return from_u8

    def prompt_stage(self, size: int, resized: tuple[int, int], hw: tuple[int, int], n_points: int,
                     n_boxes: int, multimask: bool, mask: bool = False):
        """(embeddings (B, 256, s, s), packed prompts (B, 3P + 4K)[, mask prompt (B, 1, S/4, S/4)
        logits]) -> (masks (B, M, h, w) bool, scores (B, M) float32[, low-resolution logits
        (B, M, S/4, S/4) float32]). The mask prompt and the logits belong to the families with
        mask prompts (:func:`takes_mask_prompts`); MobileSAM's stage is the two-output one."""
        model = self.model
        # a family whose image is stretched to the frame (SAM 2) upsamples its logits its own way
        post = getattr(model, "postprocess_masks", postprocess_masks)
        if not takes_mask_prompts(model):
            if mask:
                check_mask_family(model)

            def stage(*args):
                *embedding, packed = args
                pts, lab, boxes = unpack(packed, n_points, n_boxes)
                low, iou = model.decode(_whole(tuple(embedding)), pts, lab, boxes, multimask, size)
                return post(low, size, resized, hw), iou.float()
            return stage

        def stage_with_logits(*args):
            args, mask_input = (args[:-1], args[-1]) if mask else (args, None)
            *embedding, packed = args
            pts, lab, boxes = unpack(packed, n_points, n_boxes)
            low, iou = model.decode(_whole(tuple(embedding)), pts, lab, boxes, multimask, size, mask_input=mask_input)
            return post(low, size, resized, hw), iou.float(), low.float()
        return stage_with_logits

    @staticmethod
    def _encoder_key(size: int) -> tuple:
        return ("sam-image", size)

    @staticmethod
    def _prompt_key(size, resized, hw, counts, multimask, mask: bool = False) -> tuple:
        return ("sam-prompt", size, *resized, *hw, *counts, bool(multimask)) + (("mask",) if mask else ())

    def _autocast(self, amp_dtype):
        dev = self.model.device.type
        if amp_dtype is None:
            return torch.autocast(dev, enabled=False) if torch.is_autocast_enabled(dev) else contextlib.nullcontext()
        if dev != "cuda":
            raise ValueError("amp=True needs a CUDA device; on the CPU predict runs in float32 (amp=False)")
        return torch.autocast("cuda", dtype=amp_dtype)

    def _upload(self, image) -> torch.Tensor:
        dev = self.model.device
        if isinstance(image, torch.Tensor):
            return image.to(dev)
        return torch.from_numpy(np.ascontiguousarray(image)).to(dev)

    # ---------------------------------------------------------------- images
    def _size(self, imgsz) -> int:
        m = self.model
        return check_imgsz(m.imgsz if imgsz is None else imgsz, m.STRIDE)

    def encode(self, items: list[SourceItem], size: int, mode, amp_dtype) -> list[ImageState]:
        """Embed ``items`` (images of one size are embedded together); one state per image."""
        states: list[ImageState] = []
        fn = self.encoder_stage(size)
        key = self._encoder_key(size)
        start = 0
        while start < len(items):
            hw = tuple(int(v) for v in items[start].image.shape[:2])
            end = start + 1
            while end < len(items) and tuple(int(v) for v in items[end].image.shape[:2]) == hw:
                end += 1
            group = items[start:end]
            u8 = torch.stack([self._upload(it.image) for it in group])
            with torch.no_grad(), self._autocast(amp_dtype):
                emb = self.model.runner(key, fn, (u8,), mode)
            resized = self.model.preprocess.input_hw(hw[0], hw[1], size)
            states += [ImageState(it, _whole(tuple(e[i:i + 1] for e in _parts(emb))), size, hw, resized, amp_dtype)
                       for i, it in enumerate(group)]
            start = end
        return states

    def _warn_untrained(self) -> None:
        """One warning per model, as the other families give: an untrained MobileSAM's masks mean nothing."""
        m = self.model
        if not m.trained and not getattr(m, "_warned_untrained", False):
            import logging
            logging.getLogger(__name__).warning(
                "%s-%s is UNTRAINED (random weights): its masks are meaningless", m.FAMILY, m.size)
            m._warned_untrained = True

    def set_image(self, source: Any, *, imgsz: int | None = None, cuda_graph: Any = False, amp: Any = False,
                  bgr: Any = None, color_format: Any = None) -> ImageState:
        """Embed one image and make it the current one (prompt calls without an image use it)."""
        items = load_sources(source, bgr=parse_color(bgr, color_format))
        if len(items) != 1:
            raise ValueError(f"set_image takes one image, got {len(items)}; call it once per image")
        m = self.model
        self._warn_untrained()
        self.current = self.encode(items, self._size(imgsz), normalize_mode(cuda_graph), parse_amp(amp, m.AMP_DTYPE))[0]
        return self.current

    # ---------------------------------------------------------------- prompts
    def prompt(self, state: ImageState, prompt: Prompt, multimask: bool, mode, speed: dict, mask_input: Any = None):
        """Run the prompt stage on ``state`` (with ``mask_input``, a mask prompt:
        :func:`mask_prompt_logits`); returns the Results."""
        from ...results import Results
        from .results import PromptMasks
        t0 = time.perf_counter()
        h, w = state.hw
        p = prompt.for_image(h, w)
        counts = (len(p.points), len(p.boxes))
        packed = torch.from_numpy(pack(p, h, w, *state.resized)).to(self.model.device)
        has_mask = mask_input is not None
        extra = (mask_prompt_logits(mask_input, state.size, state.resized, state.hw, self.model.device,
                                     int(self.model.STRIDE)),) if has_mask else ()
        fn = self.prompt_stage(state.size, state.resized, state.hw, *counts, multimask, has_mask)
        key = self._prompt_key(state.size, state.resized, state.hw, counts, multimask, has_mask)
        with torch.no_grad(), self._autocast(state.amp_dtype):
            parts = _parts(state.embedding)
            out = self.model.runner(key, fn, (*parts, packed, *extra), mode, constant=tuple(range(len(parts))))
        masks, scores = out[0], out[1]
        logits = out[2][0] if len(out) > 2 else None
        speed = {**speed, "prompt": (time.perf_counter() - t0) * 1e3}
        return Results(state.item.image, state.item.name, self.model.names, None, speed=speed,
                       masks=PromptMasks(masks[0], scores[0], p.points, p.labels, p.boxes, logits))

    # ------------------------------------------------------------------ call
    def __call__(self, source: Any = None, *, imgsz: int | None = None, batch: int = 1, cuda_graph: Any = False,
                 amp: Any = False, bgr: Any = None, color_format: Any = None, verbose: bool = False,
                 profile: bool = False, points: Any = None, labels: Any = None, boxes: Any = None,
                 multimask: Any = True, strict: Any = False, prompts: Any = None, points_per_side: Any = 32,
                 points_per_batch: Any = 64, pred_iou_thresh: Any = 0.88, stability_score_thresh: Any = 0.95,
                 box_nms_thresh: Any = 0.7, mask_input: Any = None) -> list:
        """Masks for one prompt on each image of ``source`` (which also becomes the current image:
        the last one), or on the current image (``model.set_image``) when ``source`` is None.

        ``points`` [[x, y], ...] with ``labels`` [1, 0, ...] (1 foreground, 0 background; default
        all 1) and/or ``boxes`` [[x1, y1, x2, y2], ...], in the image's pixels; ``points="center"``
        is one foreground point at each image's centre. ``multimask``: three candidate masks
        (SAM's default, for ambiguous prompts) or one. ``batch``: images of one size embedded
        together. An unreadable file found in a directory or by a glob pattern is skipped with a
        warning naming it (``strict=True``: raise instead). ``profile`` synchronizes the device
        between the stages so ``Results.speed`` (ms per image: load, encode, prompt) is exact. Saving annotated images is the model's
        (``model.predict(..., save=True)``).

        ``mask_input`` (SAM, SAM 2, EdgeTAM; alone or with points / boxes): a mask prompt, as
        SAM's predictor takes it - the low-resolution logits of a previous call
        (``r.masks.logits[r.masks.best]``, float (S/4, S/4)), or a binary mask of the image (bool
        (H, W)), or a file of either (``.npy``, or an image whose non-zero pixels are the mask);
        see :func:`mask_prompt_logits`. ``Results.masks.logits`` holds each mask's
        low-resolution logits for the next call. MobileSAM and PicoSAM3 refuse it by name.

        No prompt at all, or ``prompts="grid"``: automatic mask generation (:mod:`.amg`, SAM's
        ``points_per_side``, ``points_per_batch``, ``pred_iou_thresh``,
        ``stability_score_thresh``, ``box_nms_thresh``); ``Results.masks`` is then
        :class:`~.amg.AutoMasks` (every mask found, with areas and scores).
        """
        m = self.model
        from .amg import GRID, AMGOptions, check_family, generate
        if prompts is not None and prompts != GRID:
            raise ValueError(f"prompts must be {GRID!r} (automatic mask generation) or left out, got {prompts!r}")
        grid = prompts == GRID or (points is None and labels is None and boxes is None and mask_input is None)
        if grid and (points is not None or labels is not None or boxes is not None or mask_input is not None):
            raise ValueError(f"prompts={GRID!r} makes its own point grid: leave points, labels, boxes and mask_input out")
        if grid:
            check_family(m)
        amg = AMGOptions.parse(points_per_side, points_per_batch, pred_iou_thresh, stability_score_thresh,
                               box_nms_thresh) if grid else None
        if mask_input is not None:
            check_mask_family(m)
            mask_input = load_mask_input(mask_input)
        if grid:
            prompt = None
        elif mask_input is not None and points is None and labels is None and boxes is None:
            prompt = Prompt(np.zeros((0, 2)), np.zeros(0, np.int64), np.zeros((0, 4)))   # the mask alone
        else:
            prompt = parse_prompt(points, labels, boxes)
        multimask = parse_bool("multimask", multimask)
        strict = parse_bool("strict", strict)
        mode = normalize_mode(cuda_graph)
        batch = check_int("batch", batch, 1)
        sync = (torch.cuda.synchronize if profile and m.device.type == "cuda" else (lambda: None))
        if source is None:
            st = self.current
            if st is None:
                raise ValueError("no image: pass one (model(image, points=...)) or call model.set_image(image) first")
            if imgsz is not None and self._size(imgsz) != st.size:
                raise ValueError(f"the current image was embedded at imgsz={st.size}, not {imgsz}: call "
                                 "set_image again with the new size")
            results = [generate(self, st, amg, mode, {}) if grid
                       else self.prompt(st, prompt, multimask, mode, {}, mask_input)]
            sync()
        else:
            size = self._size(imgsz)
            amp_dtype = parse_amp(amp, m.AMP_DTYPE)
            t0 = time.perf_counter()
            items = load_sources(source, bgr=parse_color(bgr, color_format), strict=strict)
            load = (time.perf_counter() - t0) * 1e3 / max(1, len(items))
            self._warn_untrained()
            results = []
            for start in range(0, len(items), batch):
                chunk = items[start:start + batch]
                t1 = time.perf_counter()
                states = self.encode(chunk, size, mode, amp_dtype)
                sync()
                enc = (time.perf_counter() - t1) * 1e3 / len(chunk)
                for st in states:
                    speed = {"load": load, "encode": enc}
                    results.append(generate(self, st, amg, mode, speed) if grid
                                   else self.prompt(st, prompt, multimask, mode, speed, mask_input))
                    sync()
                self.current = states[-1]
        return results

    def capture(self, imgsz=None, batch=1, dtype=None, source=None, source_shape=None, bgr: bool | None = None,
                points: Any = None, labels: Any = None, boxes: Any = None, multimask: Any = True) -> dict:
        """Capture the image stage for images of ``source``'s (or ``source_shape``'s, default the
        square frame's) size now; with a prompt, also that prompt's stage on such an image."""
        m = self.model
        size = self._size(imgsz)
        amp_dtype = None if dtype in (None, torch.float32) else parse_amp(dtype, m.AMP_DTYPE)
        if source is not None:
            items = load_sources(source, bgr=bgr)[:check_int("batch", batch, 1)]
            hw = tuple(items[0].image.shape[:2])
        else:
            hw = (size, size) if source_shape is None else tuple(int(v) for v in source_shape)
        g = torch.Generator().manual_seed(0)
        u8 = torch.randint(0, 256, (int(batch), *hw, 3), generator=g, dtype=torch.uint8).to(m.device)
        with torch.no_grad(), self._autocast(amp_dtype):
            info = {"image": m.runner.capture(self._encoder_key(size), self.encoder_stage(size), (u8,))}
            if points is not None or boxes is not None:
                emb = self.encoder_stage(size)(u8[:1])
                resized = m.preprocess.input_hw(hw[0], hw[1], size)
                p = parse_prompt(points, labels, boxes).for_image(*hw)
                counts = (len(p.points), len(p.boxes))
                packed = torch.from_numpy(pack(p, *hw, *resized)).to(m.device)
                mm = parse_bool("multimask", multimask)
                info["prompt"] = m.runner.capture(self._prompt_key(size, resized, hw, counts, mm),
                                                   self.prompt_stage(size, resized, hw, *counts, mm), (*_parts(emb), packed))
        return info
