"""Task-generic predict loop: sources -> batches -> GPU preprocessing -> stage -> Results.

The uint8 images are uploaded once (for a call of several chunks on a copy stream, overlapping
the previous chunk's stage: :meth:`Predictor._steps`); the family's preprocessing
(``model.preprocess``: letterbox, stretch or resize+crop, then normalization) runs in torch on
the model's device. The stage - network, then the task's on-device post-processing
(:meth:`PredictPlan.finish`) - goes through the model's :class:`GraphRunner`, together with the
preprocessing when a batch's images share one size, so ``cuda_graph`` only changes *how* the
same ops run, never *what* they compute: eager numbers are the truth. The task turns the stage's
outputs into Results (:meth:`PredictPlan.results`).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..data.jpeg import gpu_decode_problem, parse_decode
from ..data.sources import STREAM_AHEAD, SourceItem, load_sources, parse_color, pending_sources, stream_sources
from ..data.video import VideoWriter, is_video_source, open_video_sources
from ..graphs.capture import to_host
from ..logs import info_shown
from ..options import check_imgsz, check_int, parse_amp, parse_bool
from ..results import Results
from ..tasks.base import PredictPlan
from ..threads import apply_threads
from .call_options import TRACK_CONF, PredictOptions
from .fastpath import HalfNetwork, arm_name, check_contract, half_network, is_current, resolve, to_float32
from .paths import UniqueNames, next_run_dir, save_folder, save_name, task_project
from .predict_video import Viewer, declared_frames, video_chunks, video_stem
from .sliced import SlicedPlan, sliced_plan
from .staging import Chunk, StagedUploads, chunked, reorder_bgr

log = logging.getLogger(__name__)
#: threads decoding image files on the CPU (PIL) before a predict call's first chunk
DECODE_WORKERS = min(8, os.cpu_count() or 1)
_NO_CONTEXT = contextlib.nullcontext()


def _amp_dtype(amp: Any, default: torch.dtype = torch.float16) -> torch.dtype | None:
    """``amp`` option -> autocast dtype; True means the family's ``AMP_DTYPE`` (``default``)."""
    return parse_amp(amp, default)


class Stage(NamedTuple):
    """What :meth:`Predictor.run_batch` launches for a plan at a size (:meth:`Predictor.stage`)."""

    net: Callable[..., Any]        # the stage from the preprocessed batch
    from_u8: Callable[..., Any]    # the stage from uint8 images (preprocessing inside)
    prep: Callable[..., Any]       # the preprocessing of the first, run before it
    key: tuple                     # graph key of from_u8
    net_key: tuple                 # graph key of net
    opts: dict                     # the runner's keywords (host copy, constant inputs)


#: the types of keyword values a repeat call is recognised by (immutable scalars, compared with their type)
_KEY_TYPES = frozenset({bool, int, float, str, type(None)})


def _call_key(options: dict[str, Any], source: Any) -> tuple | None:
    """What makes a predict call a repeat of another (:class:`Signature`): its keywords - names,
    types and values, in the order given, immutable scalars only - and its source's kind: one
    numpy array (type, shape, dtype, C-contiguity) or torch tensor (type, shape, dtype, device,
    contiguity). None for a call that is never a repeat (any other source, or another keyword
    value: a list, an array, an object)."""
    for v in options.values():
        if type(v) not in _KEY_TYPES:
            return None
    t = type(source)
    if t is np.ndarray:
        src: tuple = (t, source.shape, source.dtype, source.flags.c_contiguous)
    elif t is torch.Tensor:
        src = (t, tuple(source.shape), source.dtype, source.device, source.is_contiguous())
    else:
        return None
    return (src, *[(k, type(v), v) for k, v in options.items()])


@dataclass(eq=False)
class Signature:
    """A finished predict call, kept for a repeat of it: its key (:func:`_call_key`), what its
    options gave (the checked options, the plan, the size, the autocast dtype, the channel order,
    the stage) and the model's state they were made from. :meth:`serves` says whether a call may
    reuse them; :meth:`Predictor._repeat` runs it."""

    key: tuple
    options: PredictOptions
    plan: PredictPlan
    size: int
    mode: Any
    amp_dtype: Any
    bgr: bool | None
    stage: Stage
    # the model's state: any change makes the next call take the full path
    device: torch.device
    runner: Any
    net: Any
    preprocess: Any
    nc: int
    imgsz: int
    fused: bool

    @classmethod
    def of(cls, m, key: tuple, o: PredictOptions, plan: PredictPlan, size: int, amp_dtype: Any, bgr: bool | None,
           stage: Stage) -> Signature:
        return cls(key, o, plan, size, o.cuda_graph, amp_dtype, bgr, stage, m.device, m.runner, m.model,
                   m.preprocess, m.nc, m.imgsz, m.fused)

    def serves(self, m, key: tuple) -> bool:
        """Whether a call of ``key`` on model ``m`` is a repeat of this one: the same keywords and
        kind of source, on the same network, runner and preprocessing objects, device, class
        count, default size and fused state (weights reloaded in place keep them: the runner's
        stale-graph check, which every call runs, sees those)."""
        return (key == self.key and m.runner is self.runner and m.model is self.net
                and m.preprocess is self.preprocess and m.device == self.device and m.nc == self.nc
                and m.imgsz == self.imgsz and m.fused == self.fused)


class Predictor(StagedUploads):
    """Runs ``model.predict``; one per model (it keeps per-model policy state). How a chunk's
    images reach the device (uploads, the upload ring, the GPU decode) is its base's,
    :class:`~libreyolo.engine.staging.StagedUploads`."""

    def __init__(self, model):
        self.model = model
        self._raw_seen: Counter = Counter()
        self._pinned: set = set()          # net-stage keys captured by capture_graph (see capture)
        self._local = threading.local()  # per-thread pinned staging buffers (see _upload)
        self._tensor_cache: dict = {}
        self._track_state: tuple | None = None   # (tracker spec, {stream: TrackGlue}) of model.track

    # ---------------------------------------------------------------- stages
    def _stage_fns(self, size: int, plan: PredictPlan, half: HalfNetwork | None = None):
        """The two capturable stages: from a preprocessed batch, and from raw uint8 images.

        Both run the network (``model.infer``) and the task's post-processing
        (:meth:`PredictPlan.finish`, which also takes the plan's extra inputs); the one from uint8
        images then maps the outputs back to their size (:meth:`PredictPlan.to_source`). For a family that
        declares a seam (``model.PREDICT_SEAM``: a part of its network is not bitwise capturable)
        they end there: they run ``model.infer_front`` only, and :meth:`after_seam` runs the
        rest eager. With ``half`` (the half / fast path) the network is the model's half copy,
        the preprocessing writes its half NHWC input, and the outputs are cast to float32 before
        the post-processing.
        """
        model = self.model
        prep = model.preprocess

        if half is not None:
            def net(x, *extra):
                return plan.finish(to_float32(half(x)), *extra)

            def from_u8(u8, *extra):
                x = prep.to_input(u8, size, half.dtype, channels_last=True)
                return plan.to_source(net(x, *extra), (int(u8.shape[1]), int(u8.shape[2])))

            return net, from_u8
        if model.PREDICT_SEAM:
            def net(x, *extra):
                return model.infer_front(x)
        else:
            def net(x, *extra):
                return plan.finish(model.infer(x), *extra)

        def from_u8(u8, *extra):
            return plan.to_source(net(prep(u8, size), *extra), (int(u8.shape[1]), int(u8.shape[2])))

        return net, from_u8

    def _half(self, precision: str, fast: bool | str, verify: bool = True) -> HalfNetwork | None:
        """The half network of a call (None for fp32), after the family's contract check;
        ``verify=False``: the cached copy unchecked against the weights (see :func:`half_network`:
        the caller checks it after its launch)."""
        if precision == "fp32":
            return None
        m = self.model
        if m.PREDICT_SEAM:
            raise NotImplementedError(f"precision={precision!r} is not available for {m.FAMILY}: its predict "
                                      "stage has a seam (PREDICT_SEAM); use precision='fp32'")
        check_contract(m.FAMILY, precision, fast)
        return half_network(m, precision, fast, verify=verify)

    @staticmethod
    def _keys(size: int, plan: PredictPlan, half: HalfNetwork | None) -> tuple[tuple, tuple]:
        """(u8-stage key, net-stage key): the precision (and fast) is part of both, so a precision
        switch never replays another path's graph."""
        arm = "fp32" if half is None else arm_name(half.precision, half.fast)
        return ("u8", size, arm, *plan.tag), ("net", size, arm, *plan.tag)

    def after_seam(self, out: Any, plan: PredictPlan, extra: tuple) -> Any:
        """The stage's outputs as predict uses them. Without a seam: ``out`` itself. With one: the
        eager side - ``model.infer_back`` on the captured side's outputs, then the task's
        post-processing (all-eager predict computes exactly these ops in this order), then the
        host copy when ``plan.host``."""
        if not self.model.PREDICT_SEAM:
            return out
        out = plan.finish(self.model.infer_back(*out), *extra)
        return to_host(out) if plan.host else out

    def constant(self, kind: str, key: tuple, values) -> torch.Tensor:
        """A float32 device tensor of ``values()`` cached under (kind, key): stage inputs that stay
        the same from call to call (thresholds, letterbox geometry) are not copied again."""
        cache = self._tensor_cache
        key = (kind, *key, str(self.model.device))
        t = cache.get(key)
        if t is None:
            if len(cache) > 128:
                cache.clear()
            t = cache[key] = torch.tensor(values(), dtype=torch.float32, device=self.model.device)
        return t

    def _autocast(self, amp_dtype):
        dev = self.model.device.type
        if amp_dtype is None:  # shield the stage from a caller's autocast region, if any
            return torch.autocast(dev, enabled=False) if torch.is_autocast_enabled(dev) else _NO_CONTEXT
        if dev != "cuda":
            raise ValueError("amp=True needs a CUDA device; on the CPU predict runs in float32 (amp=False)")
        return torch.autocast("cuda", dtype=amp_dtype)

    def plan(self, size: int, **opts) -> PredictPlan:
        """The task's plan for one call with its predict options ``opts``."""
        return self.model.task_def.plan(self.model, size, self.constant, **opts)

    def stage(self, size: int, plan: PredictPlan, half: HalfNetwork | None = None) -> Stage:
        """What :meth:`run_batch` launches for ``plan`` at ``size``: the two stage functions, the
        preprocessing, their graph keys and the runner's options - built per call, or kept with
        a call's signature and reused by a repeat of it (:meth:`_repeat`)."""
        net, from_u8 = self._stage_fns(size, plan, half)
        prep = self.model.preprocess
        if half is not None:
            def prep(u8, size, _p=prep, _dt=half.dtype):  # noqa: E306 - the half NHWC input
                return _p.to_input(u8, size, _dt, channels_last=True)
        key, net_key = self._keys(size, plan, half)
        opts = {"host": plan.host and not self.model.PREDICT_SEAM, "constant": plan.constant}
        return Stage(net, from_u8, prep, key, net_key, opts)

    def run_batch(self, images: list[torch.Tensor], size: int, mode: Any, amp_dtype, plan: PredictPlan,
                  repeating: bool = False, half: HalfNetwork | None = None,
                  stacked: torch.Tensor | None = None, stage: Stage | None = None) -> Any:
        """uint8 HWC device tensors -> the stage's outputs (a HostCopy when ``plan.host``).

        ``repeating``: the caller knows this size repeats (video frames), so the uint8 stage
        (preprocessing inside the graph) is used from the first call instead of the second.
        ``half``: the half / fast path's network (None: fp32). ``stacked``: the same images
        already as one contiguous (B, H, W, 3) tensor (the staged upload lands them so), used
        instead of stacking them again: the same bytes, so the same stage outputs. ``stage``:
        :meth:`stage` of these ``size``, ``plan`` and ``half``, made earlier (None: made now)."""
        if isinstance(plan, SlicedPlan):   # tiles or augmented views, each pass through here (engine.sliced)
            return plan.run(self, images, size, mode, amp_dtype, repeating, half, stacked)
        runner = self.model.runner
        net, from_u8, prep, key, net_key, opts = self.stage(size, plan, half) if stage is None else stage
        shapes = tuple((int(im.shape[0]), int(im.shape[1])) for im in images)
        extra = plan.extra(shapes, size)
        same = len(set(shapes)) == 1
        with torch.no_grad(), self._autocast(amp_dtype):
            if same:
                if stacked is not None:
                    u8 = stacked
                else:
                    u8 = images[0].unsqueeze(0) if len(images) == 1 else torch.stack(images)
                # Preprocess inside the graph only for a raw size seen before or known to repeat
                # (a video, a camera, a fixed pipeline) - otherwise each new photo size would cost a
                # capture - and not when capture_graph pinned the network stage for this request.
                raw = (tuple(u8.shape), str(u8.device))
                inputs = (u8, *extra)
                sig = runner.signature(key, inputs) if mode is not False else None   # computed once, used twice
                use_u8 = sig is not None and (runner.has_graph(key, inputs, sig) or (
                    (repeating or self._raw_seen[raw] >= 1) and net_key not in self._pinned))
                self._raw_seen[raw] += 1
                if len(self._raw_seen) > 256:
                    self._raw_seen.clear()
                if use_u8:
                    return self.after_seam(runner(key, from_u8, inputs, mode, sig=sig, **opts), plan, extra)
                x = prep(u8, size)
            else:
                x = self.model.preprocess.batch([im.unsqueeze(0) for im in images], size, prep)
            return self.after_seam(runner(net_key, net, (x, *extra), mode, **opts), plan, extra)

    def capture(self, imgsz=None, batch=1, dtype=None, source=None, source_shape=None, bgr: bool | None = None,
                precision: Any = None, fast: Any = False, **opts) -> dict:
        """Capture what predict will replay for a request now (``model.capture_graph``).

        With a ``source`` (anything predict takes; its first ``batch`` images must share one size)
        or a ``source_shape`` (h, w), the whole uint8 stage for images of that size: a predict
        of such images then replays it from its first call. Without either, the stage from the
        preprocessed batch, pinned so that predict keeps replaying it for every image size
        (preprocessing eager) instead of capturing a uint8 stage when a size repeats.
        ``opts`` are the task's predict options (e.g. conf, iou, max_det for detection): pass
        the ones predict will use if they change what the stage computes. ``precision`` / ``fast``
        as predict takes them: the half / fast path's stage is captured (use the same in predict).
        """
        m = self.model
        size = check_imgsz(m.imgsz if imgsz is None else imgsz, m.STRIDE)
        batch = check_int("batch", batch, 1)
        plan = self.plan(size, **opts)
        amp_dtype = None if dtype in (None, torch.float32) else _amp_dtype(dtype, m.AMP_DTYPE)
        precision, fast = resolve(precision, fast, m.device)
        if precision != "fp32" and amp_dtype is not None:
            raise ValueError(f"capture_graph: dtype (autocast) and precision={precision!r} exclude each other")
        half = self._half(precision, fast)
        net, from_u8 = self._stage_fns(size, plan, half)
        u8_key, net_key = self._keys(size, plan, half)
        if source is not None:
            items = load_sources(source, bgr=bgr)[:int(batch)]
            shapes = {tuple(it.image.shape[:2]) for it in items}
            if len(shapes) != 1:
                raise ValueError(f"capture_graph(source=...): the first {batch} image(s) have different sizes "
                                 f"{sorted(shapes)}; a graph serves one size")
            source_shape = shapes.pop()
            batch = len(items)
        shapes = ((size, size) if source_shape is None else tuple(int(v) for v in source_shape),) * int(batch)
        extra = plan.extra(shapes, size)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad(), self._autocast(amp_dtype):
            if source_shape is None:
                x = torch.rand((batch, 3, size, size), generator=g).to(m.device)
                if half is not None:
                    x = x.to(half.dtype, memory_format=torch.channels_last)
                info = m.runner.capture(net_key, net, (x, *extra))
                self._pinned.add(net_key)
                return info
            h, w = shapes[0]
            u8 = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8).to(m.device)
            return m.runner.capture(u8_key, from_u8, (u8, *extra))

    # ------------------------------------------------------------------ call
    def __call__(self, source: Any, *, on_results: Callable[[Results, SourceItem], None] | None = None,
                 **options: Any) -> list[Results] | Iterator[Results]:
        """Predict on ``source`` and return one Results per image (per frame for a video).

        ``options`` are the fields of :class:`~libreyolo.engine.call_options.PredictOptions` (each
        declared there once, with its default, help and check; the CLI and docs/options.md are
        made from them): the ones below, and the task's own (detection: ``conf``...).

        ``source``: a path, directory, glob, PIL image, numpy array (BGR, OpenCV's order, unless
        ``bgr=False`` or ``color_format="rgb"``), torch tensor (RGB), or a list of them; or a video
        source (:mod:`libreyolo.data.video`): a
        video file, a camera index (``0``), an RTSP/RTMP/HTTP(S) URL, or a ``.streams``/``.txt``
        file listing several (one Results per source still running at each step).
        ``stream=True`` returns a generator that decodes, predicts and yields one step at a time
        (constant memory for any length: image files are decoded lazily, a few ahead in threads,
        so the first Results come before the later files are read); otherwise a list.
        An unreadable file found in a directory or by a glob pattern is skipped with a warning
        naming it, with or without ``stream`` (``strict=True``: raise instead); a file named
        directly always raises (after the Results before it, with ``stream=True``).
        ``vid_stride``: predict every N-th frame of a video. ``timeout``: seconds a camera or URL
        may take to open and to send each next piece of data. Video Results carry ``frame_index``,
        ``timestamp`` (seconds since the source's first frame) and ``stream`` (position in a ``.streams`` list); ``path`` is the
        source's name.

        ``cuda_graph``: False (eager), True (capture each new input signature; raises on an
        unsupported family or without CUDA) or "auto" (capture once a signature repeats,
        never raises; a video's frame size repeats, so its uint8 stage is captured at the second
        frame and replayed from the third). ``amp``: True for the family's autocast dtype
        (``AMP_DTYPE``: float16 unless the family says otherwise), "fp16" or "bf16" to choose
        (CUDA only).
        ``save`` writes annotated pictures to ``save_dir`` (default: a new ``runs/<task>/predict``,
        ``predict2``, ... per call, or ``predict`` itself with ``exist_ok=True``; ``Results.save_dir``
        names it, and one log line says it); inputs
        with the same file stem get distinct names (``a.jpg``, ``a_2.jpg``); a video source is
        written as one annotated ``<stem>.mp4`` (same size and frame rate divided by
        ``vid_stride``; :class:`~libreyolo.data.video.VideoWriter`). ``show`` opens a window per
        video (matplotlib) or the image viewer per image, where a display exists; else it warns
        once. ``on_results(result, item)`` is called for each Results before it is saved, shown
        or returned (``model.track`` attaches the tracker there).
        ``profile`` synchronizes the device between stages so that ``Results.speed``
        (ms per image: load, preprocess, inference, postprocess) is exact; without
        it the stages overlap and ``speed`` shows host time only.
        ``precision``: "fp32" (default: the bitwise path), "fp16" or "bf16" (a cached half copy of
        the network, BatchNorm folded, channels_last; post-processing in float32). ``fast=True``
        (CUDA only; precision fp16 unless bf16 is asked) also compiles that copy with inductor,
        captured with the pre- and post-processing when ``cuda_graph`` is on; ``fast="aot"``
        compiles it ahead of time instead (AOTInductor: a package per input shape and weights,
        cached on disk, so a later process starts without compiling). Each is refused for a
        family outside its measured fast-path contract (:mod:`libreyolo.engine.fastpath`).
        ``decode``: how image files are decoded - "cpu" (default: PIL, the pixels training and
        validation see), "gpu" (JPEG files batched on the GPU with nvjpeg, each chunk's files
        at a time, so only compressed bytes cross PCIe; other formats, CMYK JPEGs and files
        nvjpeg refuses on the CPU; raises where no GPU decoder exists) or "auto" (the GPU
        decode where it can run, else the CPU). nvjpeg's pixels can differ from PIL's by a few
        levels (size and EXIF orientation are the same): :mod:`libreyolo.data.jpeg`. With the
        GPU decode a corrupt file raises when its chunk is reached (the CPU decode reads every
        file before the first chunk). Video frames are always decoded by PyAV.
        Images are predicted chunk by chunk (``batch`` each); with more than one chunk the next
        chunk's upload or decode overlaps this chunk's stage (:meth:`_steps`), and the outputs
        are those of each chunk run alone.
        ``tiling=True`` (sliced inference of large images: ``tile``, ``overlap_ratio``,
        ``tile_full``, ``tile_merge``) and ``augment=True`` (test-time augmentation) run each
        chunk as several passes of the same stage, merged: :mod:`libreyolo.engine.sliced`
        (detection models).
        The task's own options (detection: ``conf``, ``iou``, ``max_det``, ``max_nms`` - the
        candidates per image that enter NMS -, ``classes``, ``agnostic_nms``) follow.
        """
        m = self.model
        call_key = _call_key(options, source) if self.reuse and on_results is None else None
        last, self._last = self._last, None
        if call_key is not None and last is not None and last.serves(m, call_key):
            self._last = last
            return self._repeat(last, source)
        o, task_opts = PredictOptions.build(m.task_def, options)
        if o.device is not None:   # LibreYOLO 1.6.0's predict(device=...): the model moves there first
            m.to(o.device)
        if o.half:
            log.warning("half=True is ignored, as in LibreYOLO 1.6.0; precision='fp16' runs the half network")
        apply_threads(o.threads, m.device)   # the CPU's intra-op threads (libreyolo.threads)
        mode = o.cuda_graph
        m.runner.check_mode(mode, m.device)   # before any source is read: an impossible request fails first
        batch, stream, strict = o.batch, o.stream, o.strict
        bgr = parse_color(o.bgr, o.color_format)
        size = check_imgsz(m.imgsz if o.imgsz is None else o.imgsz, m.STRIDE)
        plan = self.plan(size, **task_opts)
        amp_dtype = _amp_dtype(o.amp, m.AMP_DTYPE)
        plan.mode, plan.amp_dtype = mode, amp_dtype
        precision, fast = resolve(o.precision, o.fast, m.device)
        if precision != "fp32" and amp_dtype is not None:
            raise ValueError(f"amp and precision={precision!r} exclude each other: the half path runs a half "
                             "copy of the network without autocast; pass one of them")
        plan.half = self._half(precision, fast, verify=False)   # checked after the first launch (_steps)
        if o.tiling or o.augment:   # sliced inference / test-time augmentation around the task's plan
            plan = sliced_plan(self, plan, o, size)
        if not m.trained and not getattr(m, "_warned_untrained", False):
            log.warning("%s-%s is UNTRAINED (random weights): its predictions are meaningless",
                        m.FAMILY, m.size)
            m._warned_untrained = True
        if getattr(self._local, "busy", None):  # left by a call that failed mid-way: maybe still
            self._local.busy.clear()           # uploading, so to torch's allocator, not the free list
        decode = parse_decode(o.decode)
        gpu_decode = False
        if is_video_source(source):
            videos = open_video_sources(source, vid_stride=o.vid_stride, timeout=o.timeout)  # fails here, not later
            chunks: Iterator[list[Any]] = video_chunks(videos, int(batch))
            total = declared_frames(videos)
            t_load = None
        else:
            videos = None
            if decode != "cpu":
                problem = gpu_decode_problem(m.device)
                if problem is not None and decode == "gpu":
                    raise ValueError(f"decode='gpu' cannot run here: {problem}. Use decode='cpu' (PIL, the "
                                     "default) or decode='auto' (the GPU decoder where it can run)")
                gpu_decode = problem is None
            t_load = time.perf_counter()
            if gpu_decode:   # every check before any file is read; files are read and decoded per chunk
                items: Any = pending_sources(source, bgr=bgr)
                t_load = None
            elif stream:     # every check now; files decoded as the chunks are taken, a few ahead
                items = stream_sources(source, bgr=bgr, borrow=True, strict=strict,
                                       workers=min(DECODE_WORKERS, STREAM_AHEAD), ahead=STREAM_AHEAD)
                t_load = None
            else:
                items = load_sources(source, bgr=bgr, borrow=True,   # owned below, while the GPU works
                                     workers=DECODE_WORKERS, strict=strict, keep_bgr=self._keep_bgr())
                t_load = (time.perf_counter() - t_load) * 1e3 / max(1, len(items))
            chunks = chunked(items, int(batch))
            total = len(items)
        out_dir = None
        if o.save:
            if o.save_dir is not None and o.output_path is not None:
                raise ValueError("save_dir and output_path both say where the pictures go: pass one")
            where = o.save_dir if o.output_path is None else save_folder(o.output_path)
            out_dir = Path(where) if where else next_run_dir(task_project(m.task), "predict", o.exist_ok)
            out_dir.mkdir(parents=True, exist_ok=True)
        # Overlap needs a next chunk: a call of one chunk keeps the per-image uploads on the compute
        # stream (no cross-stream event on the batch-1 latency path), unless its files decode on the GPU.
        staged = videos is None and (gpu_decode or (self.overlap and total > int(batch)))
        run = self._run(chunks, videos, total, t_load, size, amp_dtype, plan, out_dir, o, on_results, staged)
        if stream:
            return run
        results = list(run)
        if (call_key is not None and videos is None and not gpu_decode and not staged and out_dir is None
                and plan.half is None and getattr(plan, "reusable", False) and o.device is None and not o.half
                and not (o.show or o.verbose or o.profile or o.tiling or o.augment)):
            self._last = Signature.of(m, call_key, o, plan, size, amp_dtype, bgr, self.stage(size, plan))
        return results

    #: a repeat call - the options and the kind of source of the previous call, on the same model
    #: (:class:`Signature`) - reuses that call's checked options, plan, stage functions and graph
    #: keys instead of building them again (:meth:`_repeat`); False: every call builds them (for
    #: comparisons: scripts/host_path_cpu.py)
    reuse: bool = True
    #: the previous call's signature, while a repeat of it may reuse it (None: the next call takes
    #: the full path)
    _last: Signature | None = None
    #: calls served by the previous call's signature (:meth:`_repeat`)
    repeats: int = 0

    def _repeat(self, sig: Signature, source: Any) -> list[Results]:
        """A call whose options and kind of source equal the previous call's (``sig``): what
        :meth:`__call__` checks and builds from the options alone is taken from ``sig``; what can
        change between two such calls runs as it does there - the CPU thread count, the mode's
        check, the untrained warning, the source's own checks and conversion
        (:func:`load_sources`), the upload, the stage through the runner (its graph lookup and
        stale-graph check) and the Results."""
        self.repeats += 1
        m, o = self.model, sig.options
        apply_threads(o.threads, m.device)
        m.runner.check_mode(sig.mode, m.device)
        if not m.trained and not getattr(m, "_warned_untrained", False):
            log.warning("%s-%s is UNTRAINED (random weights): its predictions are meaningless",
                        m.FAMILY, m.size)
            m._warned_untrained = True
        if getattr(self._local, "busy", None):
            self._local.busy.clear()
        t_load = time.perf_counter()
        items = load_sources(source, bgr=sig.bgr, borrow=True, workers=DECODE_WORKERS, strict=o.strict,
                             keep_bgr=self._keep_bgr())
        t_load = (time.perf_counter() - t_load) * 1e3 / max(1, len(items))
        run = self._run(chunked(items, int(o.batch)), None, len(items), t_load, sig.size, sig.amp_dtype, sig.plan,
                        None, o, None, False, stage=sig.stage)
        results = list(run)
        self._last = sig
        return results

    #: BGR arrays (OpenCV's frames) uploaded as they are and reordered to RGB on the device, the
    #: host's reorder made while the stage runs (:meth:`SourceItem.own`) instead of before the
    #: upload: None (the default) on CUDA, where the device's reorder costs microseconds against
    #: the host's 0.2-0.3 ms per 720p frame on the latency path; True / False: always / never
    #: (the tests run the device's way on the CPU). The stage sees the same RGB bytes either way.
    bgr_on_device: bool | None = None

    def _keep_bgr(self) -> bool:
        on = self.bgr_on_device
        return self.model.device.type == "cuda" if on is None else bool(on)

    #: images (not video frames) of a call with more than one chunk go through the overlapped loop:
    #: staged uploads on a copy stream, the next chunk prepared while this one's stage runs
    #: (:meth:`_steps`). False: the sequential loop of per-image uploads (what video frames and
    #: single-chunk calls take), for comparisons
    overlap: bool = True

    def _run(self, chunks, videos, total, t_load, size, amp_dtype, plan, out_dir, o: PredictOptions, on_results,
             staged: bool = False, stage: Stage | None = None) -> Iterator[Results]:
        """The predict loop behind :meth:`__call__` (``o``: the call's checked options): one chunk
        of items at a time, its Results yielded as soon as they are made; video writers and
        readers closed however it ends. ``stage``: :meth:`stage` of the call, kept from an
        earlier call (None: :meth:`run_batch` makes it)."""
        m = self.model
        mode, verbose, profile, show, vid_stride, strict = (o.cuda_graph, o.verbose, o.profile, o.show, o.vid_stride,
                                                            o.strict)
        progress = None
        many = videos is None and total > 32   # a bar for many images by default; for videos on verbose
        if verbose or many:
            from tqdm import tqdm
            progress = tqdm(total=total, desc=f"predict {m.FAMILY}-{m.size}",
                            unit="frame" if videos is not None else "img", disable=not (verbose or many))
        unique = UniqueNames()
        writers: dict[int, VideoWriter] = {}
        viewers: dict[int, Viewer] = {}
        images_saved = 0
        lookahead = staged and self.overlap and not profile
        steps = self._steps(chunks, size, mode, amp_dtype, plan, t_load, staged=staged, lookahead=lookahead,
                            profile=profile, repeating=videos is not None, strict=strict, stage=stage)
        try:
            for chunk, chunk_results in steps:
                for r, it in zip(chunk_results, chunk):
                    if on_results is not None:
                        on_results(r, it)
                    if videos is not None:
                        k = int(it.stream or 0)
                        if out_dir is not None:
                            if k not in writers:
                                src = videos.streams[k]
                                h, w = r.orig_shape
                                fps = src.fps / vid_stride if src.fps else None
                                writers[k] = VideoWriter(out_dir / unique(video_stem(src), ".mp4"), fps, w, h)
                            writers[k].write(r.plot())
                            r.saved_to, r.save_dir = str(writers[k].path), str(out_dir)
                        if show:
                            if k not in viewers:
                                viewers[k] = Viewer(videos.streams[k].name)
                            viewers[k].show(r)
                    else:
                        if out_dir is not None:
                            r.saved_to = r.save(out_dir / unique(*save_name(o.output_path, o.output_file_format, r)))
                            r.save_dir = str(out_dir)
                            images_saved += 1
                        if show:
                            r.show()
                if progress is not None:
                    progress.update(len(chunk))
                yield from chunk_results
        finally:
            steps.close()   # a chunk launched ahead is dropped with it
            if progress is not None:
                progress.close()
            for wr in writers.values():
                wr.close()  # frames already written are kept, like those already yielded
            for v in viewers.values():
                v.close()
            if videos is not None:
                videos.close()
            if out_dir is not None and images_saved:
                info_shown(log, "saved %d annotated image(s) to %s", images_saved, out_dir)
            for wr in writers.values():
                info_shown(log, "saved the annotated video %s (%d frames)", wr.path, wr.count)

    # ------------------------------------------------------------ the loop
    def _steps(self, chunks, size, mode, amp_dtype, plan, t_load, *, staged: bool, lookahead: bool,
               profile: bool, repeating: bool, strict: bool = True,
               stage: Stage | None = None) -> Iterator[tuple[list[SourceItem], list[Results]]]:
        """(items, Results) per chunk, in order, with ``Results.speed`` filled in.

        Per chunk: prepare (the images on the device: :meth:`_prepare_staged` - copy stream,
        GPU decode - or :meth:`_prepare_simple` - today's per-image uploads), launch (the stage,
        queued on the compute stream after the chunk's copies), finish (the task's Results,
        after the stage's outputs reached the host). With ``lookahead`` the order is launch i,
        prepare i+1, finish i-1: the upload or decode of the next chunk and the host work of
        the previous one run while chunk i's stage runs on the device. The stage sees the same
        uint8 batch in either order, so its outputs are the same. An error while reading or
        preparing a chunk is raised after the chunks before it have been yielded.
        ``profile``: the device is synchronized between the steps, so the speeds are exact.
        ``strict``: for files read in :meth:`_prepare_staged` (the GPU decode's pending items),
        False skips an unreadable file found in a directory or glob as the CPU decode does; a
        chunk left empty is passed over. ``stage``: the fp32 stage kept from an earlier call
        (:meth:`stage`; None: made for each chunk).
        """
        m = self.model
        sync = (lambda: torch.cuda.synchronize(m.device)) if profile and m.device.type == "cuda" else (lambda: None)
        half = getattr(plan, "half", None)
        checked = half is None   # the half copy is checked against the weights after the first launch
        prepare = (lambda raw: self._prepare_staged(raw, strict)) if staged else self._prepare_simple
        chunks = iter(chunks)
        error: list[BaseException] = []

        def fetch() -> Chunk | None:
            if error:
                return None
            t0 = time.perf_counter()
            try:
                ch = None
                while ch is None:   # None: every file of the chunk was skipped
                    raw = next(chunks, None)
                    if raw is None:
                        return None
                    t1 = time.perf_counter()
                    ch = prepare(raw)
            except Exception as exc:   # noqa: BLE001 - raised once the chunks before it are out
                error.append(exc)
                return None
            sync()
            n, decode_ms = len(ch.items), ch.load_ms   # decode_ms: files read and decoded in prepare
            ch.load_ms = t_load if t_load is not None else ((t1 - t0) * 1e3 + decode_ms) / n
            ch.prep_ms = ((time.perf_counter() - t1) * 1e3 - decode_ms) / n
            return ch

        def launch(ch: Chunk) -> tuple[Chunk, Any, float]:
            t1 = time.perf_counter()
            if ch.ready is not None:   # the compute stream waits for this chunk's copies only
                compute = torch.cuda.current_stream(m.device)
                compute.wait_event(ch.ready)
                for t in ch.owned:     # made on the copy stream, read on this one
                    t.record_stream(compute)
            reorder_bgr(ch)
            out = self.run_batch(ch.images, size, mode, amp_dtype, plan, repeating=repeating, half=half,
                                 stacked=ch.batch, stage=stage if half is None else None)
            if not checked:
                out = recheck(ch, out)
            for it in ch.items:  # the host copy of borrowed arrays overlaps with the queued GPU work
                it.own()
            sync()
            return ch, out, (time.perf_counter() - t1) * 1e3 / len(ch.items)

        def recheck(ch: Chunk, out: Any) -> Any:
            """The half copy the first chunk launched with, checked against the fp32 weights while the
            device runs it (the pass over every tensor is off the launch's critical path); made before
            the weights last changed, the chunk runs again on a rebuilt copy (which releases the
            graphs that read the old one)."""
            nonlocal half, checked
            checked = True
            if is_current(m, half):
                return out
            if m.device.type == "cuda":
                torch.cuda.synchronize(m.device)   # the stale run ends before its graph and buffers go
            half = plan.half = half_network(m, half.precision, half.fast)
            return self.run_batch(ch.images, size, mode, amp_dtype, plan, repeating=repeating, half=half,
                                  stacked=ch.batch)

        def finish(ch: Chunk, out: Any, inference_ms: float) -> tuple[list[SourceItem], list[Results]]:
            t2 = time.perf_counter()
            if ch.host_ready is not None:   # GPU-decoded images: their host copies for the Results
                ch.host_ready.synchronize()
                for pinned, arr in ch.downloads:
                    torch.from_numpy(arr).copy_(pinned)   # torch's multi-threaded copy
            speed = {"load": ch.load_ms, "preprocess": ch.prep_ms, "inference": inference_ms}
            chunk_results = plan.results(out, ch.items, size, speed)
            if not staged:
                self._release_staging()  # the outputs came after this chunk's uploads on the same stream
            post_ms = (time.perf_counter() - t2) * 1e3 / len(ch.items)
            for r, it in zip(chunk_results, ch.items):
                r.speed["postprocess"] = post_ms
                r.frame_index, r.timestamp, r.stream = it.frame_index, it.timestamp, it.stream
            return ch.items, chunk_results

        ch = fetch()
        launched = None
        while ch is not None:
            cur = launch(ch)
            if lookahead:
                ch = fetch()   # while chunk i's stage runs
                if launched is not None:
                    yield finish(*launched)
                launched = cur
            else:
                yield finish(*cur)
                ch = fetch()
        if launched is not None:
            yield finish(*launched)
        if error:
            raise error[0]

    # ----------------------------------------------------------------- track
    def track(self, source: Any, *, tracker: Any = "bytetrack", persist: bool = False,
              **kwargs) -> list[Results] | Iterator[Results]:
        """``model.track``: predict (every option of :meth:`__call__`) with a tracker after each
        frame (:mod:`libreyolo.engine.track`); one tracker per source of a ``.streams`` list.

        ``tracker``: ``"bytetrack"``, ``"botsort"``, ``"ocsort"``, ``"deepocsort"`` or a tracker
        object (:func:`~libreyolo.engine.track.make_tracker`). ``persist=True`` keeps the trackers (and their ids) from the previous
        ``track`` call, for feeding a stream frame by frame (``model.track(frame, persist=True)``
        in a loop); otherwise each call starts new tracks. ``conf`` defaults to
        :data:`TRACK_CONF`, below the trackers' threshold for starting a track, so that weaker
        detections can still extend the tracks they match (ByteTrack's second association).
        """
        from .track import TRACKERS, TrackGlue, check_trackable
        m = self.model
        check_trackable(m)
        if isinstance(tracker, str) and tracker.strip().lower().removesuffix(".yaml") not in TRACKERS:
            raise ValueError(f"unknown tracker {tracker!r}; available: {', '.join(TRACKERS)} (or pass a tracker "
                             "object of the trackers package)")
        persist = parse_bool("persist", persist)
        kwargs.setdefault("conf", TRACK_CONF)
        if (parse_bool("save", kwargs.get("save", False)) and not kwargs.get("save_dir")
                and kwargs.get("output_path") is None):   # runs/detect/track, ...
            kwargs["save_dir"] = next_run_dir(task_project(m.task), "track",
                                              parse_bool("exist_ok", kwargs.get("exist_ok", False)))
        state = self._track_state
        if not persist or state is None or state[0] is not tracker and state[0] != tracker:
            state = self._track_state = (tracker, {})
        glues: dict[int, TrackGlue] = state[1]

        def on_results(r: Results, it: SourceItem) -> None:
            k = int(it.stream or 0)
            glue = glues.get(k)
            if glue is None:  # a tracker object serves one source; further sources get copies
                spec = tracker if isinstance(tracker, str) or not glues else copy.deepcopy(tracker)
                glue = glues[k] = TrackGlue(spec, it.fps or 30.0)
            glue.update(r, it.image, it.timestamp)
        return self(source, on_results=on_results, **kwargs)
