"""Video propagation of prompted objects (SAM 2, EdgeTAM, SAM 3): ``model.track(clip, points=..., frame=0)``.

Each prompted object is followed through the clip by SAM 2's memory: on a frame with a prompt for
it (points, one box, or a mask) the network segments it without memory (a conditioning frame);
on every later frame the memory attention fuses the frame's features with the object's memory
bank, the mask decoder predicts its mask, and the memory encoder turns that frame and mask into
a new memory. This is transformers' ``Sam2VideoModel`` in streaming mode (frames arrive one at a
time, as from a camera), frame for frame: the same memory selection, the same order, the same
modules (``tests/unit/test_sam_video.py`` compares the two on a clip).

The memory bank of an object (:class:`ObjectBank`) holds every conditioning frame (SAM 2.1 attends
to them all: ``max_cond_frame_num=-1``; SAM 3's tracker to the four closest), the last ``num_maskmem - 1`` tracked frames' memories (6)
and the last ``max_object_pointers_in_encoder - 1`` tracked frames' object pointers (15); older
tracked frames are dropped as the clip goes on (the bank fills, then rolls). The per-frame step is
two stages, each a tensor-in/tensor-out function run through the model's graph runner: the image
stage (image encoder, one per frame, shared by the objects) and the object step (memory attention
+ prompt encoder + mask decoder + object pointer + memory encoder). The tracked objects of a frame
whose banks give the step the same shapes and pointer offsets (objects prompted on the same frames)
share one object step: the memory attention runs on them as one batch; the mask decoder and the
memory encoder run per object inside it (``VideoMixin.track_step`` says why: transformers'
best-mask selection is written for one object, and batched strided convolutions change the bits),
so each object's numbers are those of tracking it alone, bit for bit on the CPU. The object step's
shapes are fixed by the bank's fill level (frames remembered, pointers held): once the bank is
full they repeat every frame, and ``cuda_graph="auto"`` captures at the first repeat; while it
fills, each fill level is its own graph (no padding: a padded memory slot is a key the attention
softmax sees, so padding would change the numbers, not only the bits).

Prompts: one object with ``points`` / ``labels`` / ``boxes`` / ``mask`` on ``frame`` (id
``obj_id``, default 1), or several with ``prompts=[{"frame": 0, "id": 1, "points": ...}, ...]``;
a prompt for an object on a later frame makes that frame a new conditioning frame (it refines
the object). Bad input gets one error naming it: a point or box outside the frame, a prompt frame
the clip does not reach, an object id prompted twice on one frame, a video that does not decode.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from ...graphs.runner import normalize_mode
from ...options import check_int, parse_bool
from .prompts import Prompt, parse_prompt
from .results import PromptMasks

log = logging.getLogger(__name__)

#: the colours of object ids (cycled)
ID_COLORS = ((30, 144, 255), (255, 99, 71), (60, 179, 113), (238, 130, 238), (255, 215, 0), (0, 206, 209),
             (244, 164, 96), (147, 112, 219))


# ------------------------------------------------------------------------------------- results
def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class TrackMasks(PromptMasks):
    """The tracked objects on one frame: ``data`` (N, H, W) bool masks (one per object, in id
    order), ``ids`` (N,) their object ids, ``scores`` (N,) the object-presence probability
    (sigmoid of the object-score logit; a mask is empty where the object is judged absent)."""

    def __init__(self, data: torch.Tensor | np.ndarray, scores: torch.Tensor | np.ndarray, ids: Any):
        super().__init__(data, scores)
        self.ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(self.ids) != len(self):
            raise ValueError(f"TrackMasks ids must be ({len(self)},), one per mask, got {self.ids.shape}")

    def _with(self, data, scores, logits=None) -> TrackMasks:
        return TrackMasks(data, scores, self.ids)

    def __repr__(self) -> str:
        return f"TrackMasks(objects={len(self)}, ids={self.ids.tolist()}, shape={self.orig_shape})"

    def summary(self, names: dict[int, str] | None = None, decimals: int = 5) -> list[dict[str, Any]]:
        rows = super().summary(names, decimals)
        for row, i in zip(rows, self.ids):
            row["name"], row["id"] = f"object{int(i)}", int(i)
        return rows

    def plot_on(self, image: np.ndarray, names: dict[int, str] | None = None, alpha: float = 0.5,
                index: int | None = None) -> np.ndarray:
        """``image`` with every object's mask blended in its id's colour and its id written at
        the mask's top-left corner."""
        if tuple(image.shape[:2]) != self.orig_shape:
            raise ValueError(f"image of shape {tuple(image.shape)} does not match the masks {self.orig_shape}")
        out = image.copy()
        masks = _np(self._data).astype(bool)
        for m, i in zip(masks, self.ids):
            color = np.array(ID_COLORS[int(i) % len(ID_COLORS)], dtype=np.float32)
            out[m] = np.clip(np.rint(out[m].astype(np.float32) * (1 - alpha) + color * alpha), 0, 255).astype(np.uint8)
        pil = Image.fromarray(out)
        draw = ImageDraw.Draw(pil)
        for m, i in zip(masks, self.ids):
            ys, xs = np.nonzero(m)
            if len(ys):
                draw.text((int(xs.min()), int(ys.min())), f"id {int(i)}", fill=(255, 255, 255))
        return np.array(pil, dtype=np.uint8)


# ------------------------------------------------------------------------------------- prompts
@dataclass
class ObjectPrompt:
    """One prompt of one object on one frame: points / boxes (:class:`Prompt`) or a mask."""

    frame: int
    obj_id: int
    prompt: Prompt | None = None
    mask: np.ndarray | None = None


def _one(frame: Any, obj_id: Any, points: Any, labels: Any, boxes: Any, mask: Any) -> ObjectPrompt:
    frame = check_int("frame", frame, 0)
    obj_id = check_int("obj_id", obj_id, 0)
    if mask is not None:
        if points is not None or boxes is not None or labels is not None:
            raise ValueError(f"object {obj_id}, frame {frame}: a mask prompt stands alone (no points, labels or boxes)")
        m = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
        if m.ndim != 2:
            raise ValueError(f"object {obj_id}, frame {frame}: mask must be an (H, W) array of the frame's size, "
                             f"got shape {m.shape}")
        return ObjectPrompt(frame, obj_id, mask=m.astype(bool))
    p = parse_prompt(points, labels, boxes)
    if p.center or p.center_box:
        raise ValueError("'center' prompts are for images; give the object's points or box in the frame's pixels")
    if len(p.boxes) > 1:
        raise ValueError(f"object {obj_id}, frame {frame}: one box per object and frame, got {len(p.boxes)}: "
                         "give each object its own prompt (prompts=[...])")
    return ObjectPrompt(frame, obj_id, prompt=p)


def parse_track_prompts(points: Any = None, labels: Any = None, boxes: Any = None, mask: Any = None,
                        frame: Any = 0, obj_id: Any = 1, prompts: Any = None) -> list[ObjectPrompt]:
    """The prompts of a ``track`` call, checked (everything that needs no frame)."""
    single = any(v is not None for v in (points, labels, boxes, mask))
    if prompts is not None and single:
        raise ValueError("give either prompts=[...] or one object's points/labels/boxes/mask, not both")
    if prompts is None:
        if not single:
            raise ValueError("track needs a prompt: points=[[x, y]] (labels=[1]), boxes=[[x1, y1, x2, y2]] or a "
                             "mask, on frame= (default 0); several objects: prompts=[{'frame': 0, 'id': 1, ...}]")
        out = [_one(frame, obj_id, points, labels, boxes, mask)]
    else:
        if isinstance(prompts, dict) or not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts must be a non-empty list of dicts with frame, id and points/labels/boxes/mask")
        out = []
        for i, d in enumerate(prompts):
            if not isinstance(d, dict):
                raise ValueError(f"prompts[{i}] must be a dict, got {type(d).__name__}")
            bad = set(d) - {"frame", "id", "points", "labels", "boxes", "mask"}
            if bad:
                raise ValueError(f"prompts[{i}] has unknown keys {sorted(bad)}: use frame, id, points, labels, boxes, mask")
            out.append(_one(d.get("frame", 0), d.get("id", 1), d.get("points"), d.get("labels"), d.get("boxes"),
                            d.get("mask")))
    seen: set[tuple[int, int]] = set()
    for p in out:
        if (p.obj_id, p.frame) in seen:
            raise ValueError(f"object id {p.obj_id} is prompted twice on frame {p.frame}: give one prompt per object "
                             "and frame (several points go in one prompt), or another id for another object")
        seen.add((p.obj_id, p.frame))
    return sorted(out, key=lambda p: (p.frame, p.obj_id))


# -------------------------------------------------------------------------------- memory bank
@dataclass
class Memory:
    """What one frame leaves in an object's bank: memory tokens (T, 1, 64), their spatial
    positional encoding, and the object pointer (1, 256)."""

    memory: torch.Tensor
    memory_pos: torch.Tensor
    pointer: torch.Tensor


def select_cond_frames(frame: int, cond: dict[int, Memory], limit: int) -> tuple[dict[int, Memory], dict[int, Memory]]:
    """(selected, left out) of an object's conditioning frames for ``frame``, at most ``limit``
    of them (-1: all): the closest before, the closest at or after, then the temporally closest -
    ``Sam2VideoModel._select_closest_cond_frames`` (SAM 2.1 keeps all; SAM 3's tracker four),
    in its order (the order the memories are concatenated in)."""
    if limit == -1 or len(cond) <= limit:
        return cond, {}
    selected: dict[int, Memory] = {}
    before = max((t for t in cond if t < frame), default=None)
    if before is not None:
        selected[before] = cond[before]
    after = min((t for t in cond if t >= frame), default=None)
    if after is not None:
        selected[after] = cond[after]
    rest = sorted((t for t in cond if t not in selected), key=lambda t: abs(t - frame))[:limit - len(selected)]
    selected.update((t, cond[t]) for t in rest)
    return selected, {t: m for t, m in cond.items() if t not in selected}


@dataclass
class ObjectBank:
    """One object's memory: conditioning frames (prompted) and the recent tracked frames."""

    obj_id: int
    cond: dict[int, Memory] = field(default_factory=dict)
    recent: dict[int, Memory] = field(default_factory=dict)

    def add(self, frame: int, mem: Memory, conditioning: bool, keep: int) -> None:
        """Store a frame's memory; tracked frames more than ``keep`` frames back are dropped."""
        (self.cond if conditioning else self.recent)[frame] = mem
        for f in [f for f in self.recent if f <= frame - keep]:
            del self.recent[f]

    def gather(self, frame: int, net) -> tuple[torch.Tensor, ...]:
        """The bank as the step's tensors for ``frame``: (memory, memory_pos, pointers, offsets),
        selected as ``Sam2VideoModel._gather_memory_frame_outputs`` / ``_get_object_pointers`` do
        in streaming mode: the conditioning frames (temporal slot 0; at most the config's
        ``max_cond_frame_num``, :func:`select_cond_frames`), the tracked frames 1..6 back; the
        pointers of the conditioning frames and of the tracked frames 1..15 back."""
        cfg = net.config
        temporal = net.memory_temporal_positional_encoding
        cond, unselected = select_cond_frames(frame, self.cond, getattr(cfg, "max_cond_frame_num", -1))
        picked = [(0, m) for m in cond.values()]
        for off in range(net.num_maskmem - 1, 0, -1):   # a conditioning frame left out counts as a tracked one
            m = self.recent.get(frame - off, unselected.get(frame - off))
            if m is not None:
                picked.append((off, m))
        memory = torch.cat([m.memory for _, m in picked], 0)
        memory_pos = torch.cat([m.memory_pos + temporal[off - 1] for off, m in picked], 0)
        offsets = [frame - t for t in self.cond if t <= frame]
        pointers = [m.pointer for t, m in self.cond.items() if t <= frame]
        for d in range(1, cfg.max_object_pointers_in_encoder):
            if frame - d in self.recent:
                offsets.append(d)
                pointers.append(self.recent[frame - d].pointer)
        ptr = torch.stack(pointers, 0)
        return memory, memory_pos, ptr, torch.tensor(offsets, dtype=torch.float32, device=ptr.device)

    @property
    def fill(self) -> tuple[int, int]:
        """(conditioning frames, tracked frames) held now: the bank's fill level."""
        return len(self.cond), len(self.recent)


# --------------------------------------------------------------------------------- propagator
class VideoPropagator:
    """Tracks the prompted objects frame by frame (see the module docstring); :meth:`step` takes
    one frame (its index and HxWx3 uint8 RGB) and returns that frame's masks."""

    def __init__(self, model, prompts: list[ObjectPrompt], cuda_graph: Any = False, batch_objects: bool = True):
        self.model, self.net = model, model.model
        self.prompts = prompts
        self.mode = normalize_mode(cuda_graph)
        #: run the tracked objects of one frame whose banks have the same shape and offsets as
        #: one batch (False: one object at a time; the numbers are the same, see :meth:`step`)
        self.batch_objects = bool(batch_objects)
        self.banks: dict[int, ObjectBank] = {}
        self.size = int(self.net.frame)
        cfg = self.net.config
        self.keep = max(cfg.max_object_pointers_in_encoder - 1, cfg.num_maskmem - 1)
        self.track_multimask = bool(cfg.multimask_output_in_sam and cfg.multimask_output_for_tracking
                                    and cfg.multimask_min_pt_num <= 0 <= cfg.multimask_max_pt_num)

    # ---- stages (tensor in, tensor out: what the runner captures)
    def _frame_stage(self):
        net, prep, size = self.net, self.model.preprocess, self.size

        def stage(u8):
            return net.frame_features(prep(u8, size))
        return stage

    def _track_stage(self):
        net, mm = self.net, self.track_multimask

        def stage(s0, s1, feats, pos, memory, memory_pos, pointers, offsets):
            return net.track_step(s0, s1, feats, pos, memory, memory_pos, pointers, offsets, None, None, mm)
        return stage

    def _prompt_stage(self, multimask: bool):
        net = self.net

        def stage(s0, s1, feats, pos, points, labels):
            return net.track_step(s0, s1, feats, pos, None, None, None, None, points, labels, multimask)
        return stage

    def _mask_stage(self):
        net = self.net

        def stage(s0, s1, feats, mask):
            return net.mask_step(s0, s1, feats, mask)
        return stage

    def _run(self, key: tuple, fn, inputs: tuple) -> Any:
        return self.model.runner(("sam2-video", self.model.FAMILY, *key), fn, inputs, self.mode)

    # ---- one frame
    def _prompt_inputs(self, p: ObjectPrompt, h: int, w: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
        """Points (1, P, 2) and labels (1, P) in the network's frame: a box as its two corners
        (labels 2, 3) before the points, as transformers' video processor gives them."""
        try:
            q = p.prompt.for_image(h, w)
        except ValueError as e:
            raise ValueError(f"object {p.obj_id}, frame {p.frame}: {e}") from None
        scale = np.array([self.size / w, self.size / h])
        pts = [q.boxes.reshape(-1, 2) * scale] if len(q.boxes) else []
        lab = [np.array([2, 3])] if len(q.boxes) else []
        pts.append(q.points.reshape(-1, 2) * scale)
        lab.append(q.labels)
        points = torch.from_numpy(np.concatenate(pts).astype(np.float32))[None].to(dev)
        labels = torch.from_numpy(np.concatenate(lab).astype(np.int64))[None].to(dev)
        return points, labels

    def step(self, index: int, image: np.ndarray) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Frame ``index`` (HxWx3 uint8 RGB) -> (object ids, (N, H, W) bool masks, (N,) object
        probabilities), the objects prompted on this frame or before, in id order."""
        dev, net = self.model.device, self.net
        h, w = image.shape[:2]
        u8 = torch.from_numpy(np.ascontiguousarray(image)).to(dev)[None]
        s0, s1, feats, pos = self._run(("frame", h, w), self._frame_stage(), (u8,))
        todo = {p.obj_id: p for p in self.prompts if p.frame == index}
        out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # tracked objects (no prompt on this frame) whose banks give the step the same shapes and
        # pointer offsets (objects prompted on the same frames: the usual case) form one batch
        groups: dict[tuple, list[tuple[int, tuple[torch.Tensor, ...]]]] = {}
        for obj_id in sorted(set(self.banks) | set(todo)):
            bank = self.banks.setdefault(obj_id, ObjectBank(obj_id))
            p = todo.get(obj_id)
            if p is None:
                gathered = bank.gather(index, net)
                key = ((tuple(gathered[0].shape), tuple(gathered[2].shape), tuple(gathered[3].tolist()))
                       if self.batch_objects else (obj_id,))
                groups.setdefault(key, []).append((obj_id, gathered))
                continue
            if p.mask is not None:
                if p.mask.shape != (h, w):
                    raise ValueError(f"object {obj_id}, frame {index}: the mask is {p.mask.shape[1]}x{p.mask.shape[0]}, "
                                     f"the frame {w}x{h}")
                m = torch.from_numpy(p.mask).to(dev, torch.float32)[None, None]
                res = self._run(("mask", h, w), self._mask_stage(), (s0, s1, feats, m))
            else:
                points, labels = self._prompt_inputs(p, h, w, dev)
                c = net.config
                mm = bool(c.multimask_output_in_sam and c.multimask_min_pt_num <= points.shape[1] <= c.multimask_max_pt_num)
                res = self._run(("prompt", points.shape[1], mm), self._prompt_stage(mm),
                                (s0, s1, feats, pos, points, labels))
            low, score, pointer, memory, memory_pos = res
            bank.add(index, Memory(memory, memory_pos, pointer), True, self.keep)
            out[obj_id] = (low, score)
        for members in groups.values():
            ids_in = [obj_id for obj_id, _ in members]
            if len(members) == 1:
                memory, memory_pos, pointers, offsets = members[0][1]
            else:   # the banks side by side: (tokens, N, C), (pointers, N, ...)
                memory, memory_pos, pointers = (torch.cat([g[k] for _, g in members], 1) for k in range(3))
                offsets = members[0][1][3]
            low, score, pointer, memory, memory_pos = self._run(
                ("track", len(members)), self._track_stage(), (s0, s1, feats, pos, memory, memory_pos, pointers, offsets))
            for i, obj_id in enumerate(ids_in):
                one = slice(i, i + 1)
                self.banks[obj_id].add(index, Memory(memory[:, one], memory_pos[:, one], pointer[one]), False, self.keep)
                out[obj_id] = (low[one], score[one])
        ids = sorted(out)
        if not ids:
            return [], torch.zeros((0, h, w), dtype=torch.bool, device=dev), torch.zeros(0, device=dev)
        low = torch.cat([out[i][0] for i in ids]).float()
        masks = F.interpolate(low, (h, w), mode="bilinear", align_corners=False)[:, 0] > 0.0
        scores = torch.sigmoid(torch.cat([out[i][1] for i in ids]).float().reshape(-1))
        return ids, masks, scores


# ------------------------------------------------------------------------------------ frames
def _frames(source: Any, vid_stride: int) -> tuple[Iterator[tuple[int, np.ndarray]], str, float | None, int | None, Any]:
    """(frames as (index, RGB uint8), name, fps, declared frame count, closer) of a clip: a video
    file / camera / URL (the library's PyAV sources), or a list / (T, H, W, 3) array of RGB frames."""
    from ...data.video import is_video_source, open_video_sources
    if isinstance(source, (list, tuple)) or (isinstance(source, np.ndarray) and source.ndim == 4):
        frames = [np.asarray(f) for f in source]
        for i, f in enumerate(frames):
            if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
                raise ValueError(f"frame {i} of the clip must be an HxWx3 uint8 RGB array, got {f.dtype} {f.shape}")
        return iter(enumerate(frames[::vid_stride])), "clip", None, len(frames), None
    if not is_video_source(source):
        raise ValueError(f"track takes a video (a file, camera, URL) or a list of HxWx3 uint8 RGB frames, got "
                         f"{source!r}; for one image use predict (model(image, points=...))")
    sources = open_video_sources(source, vid_stride=vid_stride)
    if len(sources) != 1:
        sources.close()
        raise ValueError(f"track follows objects through one video, got {len(sources)} streams")
    s = sources.streams[0]
    return ((f.index, f.image) for f in s), s.name, s.fps, s.frames, sources


def track_video(model, source: Any, *, points: Any = None, labels: Any = None, boxes: Any = None, mask: Any = None,
                frame: Any = 0, obj_id: Any = 1, prompts: Any = None, stream: Any = False, save: Any = False,
                save_dir: str | Path | None = None, exist_ok: bool = False, cuda_graph: Any = False,
                vid_stride: Any = 1, verbose: bool = False, **kwargs: Any) -> Any:
    """``model.track`` of a SAM 2-style family (see the module docstring): one Results per frame,
    ``Results.masks`` a :class:`TrackMasks`; a generator with ``stream=True``; ``save=True``
    writes the overlaid video (``runs/segment-prompt/track``, ``Results.save_dir``)."""
    if kwargs:
        raise TypeError(f"track got unexpected option(s) {sorted(kwargs)}: its options are points, labels, boxes, "
                        "mask, frame, obj_id, prompts, stream, save, save_dir, cuda_graph, vid_stride, verbose")
    if not getattr(model, "has_video", False):
        raise ValueError(f"{model.FAMILY}-{model.size} holds the image network only (a LibreYOLO 1.6.0 checkpoint "
                         "layout): tracking needs the memory attention and memory encoder; load a checkpoint with "
                         f"them (the released video models) or build one with LibreYOLO.new({model.FAMILY!r}, ...)")
    parsed = parse_track_prompts(points, labels, boxes, mask, frame, obj_id, prompts)
    stride = check_int("vid_stride", vid_stride, 1)
    frames, name, fps, count, closer = _frames(source, stride)
    last = max(p.frame for p in parsed)
    if count is not None and last >= count:
        if closer is not None:
            closer.close()
        raise ValueError(f"a prompt is on frame {last}, but '{name}' has {count} frames (0..{count - 1})")
    gen = _track(model, parsed, frames, name, fps, closer, parse_bool("save", save), save_dir, exist_ok,
                 cuda_graph, stride)
    return gen if parse_bool("stream", stream) else list(gen)


def _track(model, prompts, frames, name, fps, closer, save, save_dir, exist_ok, cuda_graph, stride):
    from ...results import Results
    model.get_predictor()._warn_untrained()
    prop = VideoPropagator(model, prompts, cuda_graph)
    writer, out_dir, seen = None, None, -1
    wanted = {p.frame for p in prompts}
    try:
        with torch.no_grad():
            for index, image in frames:
                if any(f < index and f > seen and f % stride for f in wanted):
                    missed = sorted(f for f in wanted if seen < f < index)
                    raise ValueError(f"prompt frame(s) {missed} are skipped by vid_stride={stride}")
                seen = index
                t0 = time.perf_counter()
                ids, masks, scores = prop.step(index, image)
                res = Results(image, str(name), model.names, None,
                              speed={"track": (time.perf_counter() - t0) * 1e3},
                              masks=TrackMasks(masks, scores, ids))
                # as predict's video Results: the source as the path, the frame's index and time
                res.frame_index, res.timestamp = index, (index / fps if fps else None)
                if save:
                    if writer is None:
                        from ...data.video import VideoWriter
                        from ...engine.paths import next_run_dir, task_project
                        out_dir = Path(save_dir) if save_dir else next_run_dir(task_project(model.TASK), "track", exist_ok)
                        stem = Path(str(name)).stem or "clip"
                        writer = VideoWriter(out_dir / f"{stem}.mp4", fps, image.shape[1], image.shape[0])
                    writer.write(res.plot())
                    res.save_dir = str(out_dir)
                yield res
        missing = sorted(f for f in wanted if f > seen)
        if missing:
            raise ValueError(f"a prompt is on frame {missing[0]}, but '{name}' ended at frame {seen}")
        if writer is not None:
            path = writer.close()
            writer = None
            from ...logs import info_shown
            info_shown(log, "saved the tracked video to %s", path)
    finally:
        if writer is not None:
            writer.abort()
        if closer is not None:
            closer.close()
