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
import dataclasses
import logging
import os
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ..data.jpeg import decode_files, gpu_decode_problem, is_jpeg_path, parse_decode, probe
from ..data.sources import (STREAM_AHEAD, PendingItem, SourceItem, load_sources, parse_color, pending_sources,
                            stream_sources)
from ..data.video import VideoSources, VideoStream, VideoWriter, is_video_source, open_video_sources
from ..graphs.capture import to_host
from ..options import check_imgsz, check_int, parse_amp, parse_bool
from ..results import Results, display_problem
from ..tasks.base import PredictPlan
from .call_options import TRACK_CONF, PredictOptions
from .fastpath import HalfNetwork, arm_name, check_contract, half_network, is_current, resolve, to_float32
from .paths import UniqueNames, next_run_dir, save_folder, save_name

log = logging.getLogger(__name__)
#: threads decoding image files on the CPU (PIL) before a predict call's first chunk
DECODE_WORKERS = min(8, os.cpu_count() or 1)
_NO_CONTEXT = contextlib.nullcontext()


def _amp_dtype(amp: Any, default: torch.dtype = torch.float16) -> torch.dtype | None:
    """``amp`` option -> autocast dtype; True means the family's ``AMP_DTYPE`` (``default``)."""
    return parse_amp(amp, default)


# The GPU upload reads a borrowed numpy image through a tensor view and never writes it; torch
# warns about views of read-only arrays (PIL images) all the same.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=r"libreyolo\.engine\.predictor")


class Predictor:
    """Runs ``model.predict``; one per model (it keeps per-model policy state)."""

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

    def run_batch(self, images: list[torch.Tensor], size: int, mode: Any, amp_dtype, plan: PredictPlan,
                  repeating: bool = False, half: HalfNetwork | None = None,
                  stacked: torch.Tensor | None = None) -> Any:
        """uint8 HWC device tensors -> the stage's outputs (a HostCopy when ``plan.host``).

        ``repeating``: the caller knows this size repeats (video frames), so the uint8 stage
        (preprocessing inside the graph) is used from the first call instead of the second.
        ``half``: the half / fast path's network (None: fp32). ``stacked``: the same images
        already as one contiguous (B, H, W, 3) tensor (the staged upload lands them so), used
        instead of stacking them again: the same bytes, so the same stage outputs."""
        runner = self.model.runner
        net, from_u8 = self._stage_fns(size, plan, half)
        prep = self.model.preprocess
        if half is not None:
            def prep(u8, size, _p=prep, _dt=half.dtype):  # noqa: E306 - the half NHWC input
                return _p.to_input(u8, size, _dt, channels_last=True)
        key, net_key = self._keys(size, plan, half)
        shapes = tuple((int(im.shape[0]), int(im.shape[1])) for im in images)
        extra = plan.extra(shapes, size)
        opts = {"host": plan.host and not self.model.PREDICT_SEAM, "constant": plan.constant}
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
                use_u8 = mode is not False and (runner.has_graph(key, (u8, *extra)) or (
                    (repeating or self._raw_seen[raw] >= 1) and net_key not in self._pinned))
                self._raw_seen[raw] += 1
                if len(self._raw_seen) > 256:
                    self._raw_seen.clear()
                if use_u8:
                    return self.after_seam(runner(key, from_u8, (u8, *extra), mode, **opts), plan, extra)
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
        ``save`` writes annotated pictures to ``save_dir`` (default: a new ``runs/predict``,
        ``runs/predict2``, ... per call, or ``runs/predict`` itself with ``exist_ok=True``); inputs
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
        The task's own options (detection: ``conf``, ``iou``, ``max_det``, ``max_nms`` - the
        candidates per image that enter NMS -, ``classes``, ``agnostic_nms``) follow.
        """
        m = self.model
        o, task_opts = PredictOptions.build(m.task_def, options)
        if o.device is not None:   # LibreYOLO 1.6.0's predict(device=...): the model moves there first
            m.to(o.device)
        if o.half:
            log.warning("half=True is ignored, as in LibreYOLO 1.6.0; precision='fp16' runs the half network")
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
            chunks: Iterator[list[Any]] = _video_chunks(videos, int(batch))
            total = _declared_frames(videos)
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
                                     workers=DECODE_WORKERS, strict=strict)
                t_load = (time.perf_counter() - t_load) * 1e3 / max(1, len(items))
            chunks = _chunked(items, int(batch))
            total = len(items)
        out_dir = None
        if o.save:
            if o.save_dir is not None and o.output_path is not None:
                raise ValueError("save_dir and output_path both say where the pictures go: pass one")
            where = o.save_dir if o.output_path is None else save_folder(o.output_path)
            out_dir = Path(where) if where else next_run_dir("runs", "predict", o.exist_ok)
            out_dir.mkdir(parents=True, exist_ok=True)
        # Overlap needs a next chunk: a call of one chunk keeps the per-image uploads on the compute
        # stream (no cross-stream event on the batch-1 latency path), unless its files decode on the GPU.
        staged = videos is None and (gpu_decode or (self.overlap and total > int(batch)))
        run = self._run(chunks, videos, total, t_load, size, amp_dtype, plan, out_dir, o, on_results, staged)
        return run if stream else list(run)

    #: images (not video frames) of a call with more than one chunk go through the overlapped loop:
    #: staged uploads on a copy stream, the next chunk prepared while this one's stage runs
    #: (:meth:`_steps`). False: the sequential loop of per-image uploads (what video frames and
    #: single-chunk calls take), for comparisons
    overlap: bool = True

    def _run(self, chunks, videos, total, t_load, size, amp_dtype, plan, out_dir, o: PredictOptions, on_results,
             staged: bool = False) -> Iterator[Results]:
        """The predict loop behind :meth:`__call__` (``o``: the call's checked options): one chunk
        of items at a time, its Results yielded as soon as they are made; video writers and
        readers closed however it ends."""
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
        viewers: dict[int, _Viewer] = {}
        images_saved = 0
        lookahead = staged and self.overlap and not profile
        steps = self._steps(chunks, size, mode, amp_dtype, plan, t_load, staged=staged, lookahead=lookahead,
                            profile=profile, repeating=videos is not None, strict=strict)
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
                                writers[k] = VideoWriter(out_dir / unique(_video_stem(src), ".mp4"), fps, w, h)
                            writers[k].write(r.plot())
                            r.saved_to = str(writers[k].path)
                        if show:
                            if k not in viewers:
                                viewers[k] = _Viewer(videos.streams[k].name)
                            viewers[k].show(r)
                    else:
                        if out_dir is not None:
                            r.saved_to = r.save(out_dir / unique(*save_name(o.output_path, o.output_file_format, r)))
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
                log.info("saved %d annotated image(s) to %s", images_saved, out_dir)
            for wr in writers.values():
                log.info("saved the annotated video %s (%d frames)", wr.path, wr.count)

    # ------------------------------------------------------------ the loop
    def _steps(self, chunks, size, mode, amp_dtype, plan, t_load, *, staged: bool, lookahead: bool,
               profile: bool, repeating: bool, strict: bool = True) -> Iterator[tuple[list[SourceItem], list[Results]]]:
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
        chunk left empty is passed over.
        """
        m = self.model
        sync = (lambda: torch.cuda.synchronize(m.device)) if profile and m.device.type == "cuda" else (lambda: None)
        half = getattr(plan, "half", None)
        checked = half is None   # the half copy is checked against the weights after the first launch
        prepare = (lambda raw: self._prepare_staged(raw, strict)) if staged else self._prepare_simple
        chunks = iter(chunks)
        error: list[BaseException] = []

        def fetch() -> _Chunk | None:
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

        def launch(ch: _Chunk) -> tuple[_Chunk, Any, float]:
            t1 = time.perf_counter()
            if ch.ready is not None:   # the compute stream waits for this chunk's copies only
                compute = torch.cuda.current_stream(m.device)
                compute.wait_event(ch.ready)
                for t in ch.owned:     # made on the copy stream, read on this one
                    t.record_stream(compute)
            out = self.run_batch(ch.images, size, mode, amp_dtype, plan, repeating=repeating, half=half,
                                 stacked=ch.batch)
            if not checked:
                out = recheck(ch, out)
            for it in ch.items:  # the host copy of borrowed arrays overlaps with the queued GPU work
                it.own()
            sync()
            return ch, out, (time.perf_counter() - t1) * 1e3 / len(ch.items)

        def recheck(ch: _Chunk, out: Any) -> Any:
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

        def finish(ch: _Chunk, out: Any, inference_ms: float) -> tuple[list[SourceItem], list[Results]]:
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

    def _prepare_simple(self, items: list[SourceItem]) -> _Chunk:
        """A chunk's images on the device one by one (:meth:`_upload`, the current stream);
        the stage stacks them. Video frames take this path."""
        return _Chunk(items, [self._upload(it.image) for it in items])

    def _prepare_staged(self, raw: list[Any], strict: bool = True) -> _Chunk | None:
        """A chunk's images on the device without holding up the compute stream.

        ``raw``: SourceItems, or PendingItems (the GPU decode): JPEG files among them are read
        and decoded on the device in one batched call (:mod:`libreyolo.data.jpeg`), the rest
        loaded as :func:`load_sources` would. On CUDA the host images are copied into one of two
        pinned staging buffers and uploaded on this thread's copy stream (:class:`_UploadRing`);
        the decode runs there too. All of a chunk lands in one device buffer, which is the
        stacked (B, H, W, 3) batch when the sizes agree, and an event marks it complete: the
        compute stream waits for that event only (:meth:`_steps`). GPU-decoded images are
        copied back to pinned host memory on the copy stream for the Results. On the CPU: the
        images as they are. ``strict=False``: an unreadable file found in a directory or glob is
        skipped with a warning (None when the whole chunk was).
        """
        m = self.model
        dev = m.device
        t0 = time.perf_counter()
        decoded: dict[int, Any] = {}
        items: list[SourceItem | None] = []
        ring = self._ring()
        files: list[tuple[int, PendingItem, Any]] = []
        kept: list[Any] = []
        for it in raw:
            if isinstance(it, PendingItem):
                gpu = ring is not None and it.path is not None and is_jpeg_path(it.path)
                f = probe(it.path) if gpu else None
                if f is None:
                    loaded = it.load(borrow=True, strict=strict)
                    if loaded is None:   # skipped, with a warning naming it
                        continue
                    items.append(loaded)
                else:
                    files.append((len(items), it, f))
                    items.append(None)
            else:
                items.append(it)
            kept.append(it)
        if not kept:
            return None
        raw = kept
        if files:
            # nvjpeg writes its outputs on its own stream into blocks the allocator gives out on the
            # current one (the copy stream): the copy stream's earlier work - the previous chunk's
            # stack and host copy, reading blocks freed since - must be over first. The decode
            # blocks the host until it is done anyway, and that work was queued a chunk ago.
            ring.stream.synchronize()
            with torch.cuda.stream(ring.stream):
                for (j, it, f), img in zip(files, decode_files([f for _, _, f in files], dev)):
                    if isinstance(img, np.ndarray):   # refused by nvjpeg, decoded on the CPU
                        items[j] = SourceItem(it.name, img)
                    else:
                        decoded[j] = img
        load_ms = (time.perf_counter() - t0) * 1e3
        if ring is None:
            return _Chunk(items, [self._upload(it.image) for it in items], load_ms=load_ms)
        images: list[Any] = [None] * len(raw)
        host_j = [j for j in range(len(raw)) if j not in decoded and _on_host(items[j].image)]
        owned: list[torch.Tensor] = []
        if host_j:
            views, base = ring.upload([_host_tensor(items[j].image) for j in host_j])
            owned.append(base)
            for j, v in zip(host_j, views):
                images[j] = v
        for j in range(len(raw)):
            if images[j] is None and j not in decoded:   # a CUDA tensor input: as today
                im = items[j].image
                images[j] = im if im.device == dev else im.to(dev, non_blocking=True)
        batch = None
        shapes = {tuple(int(s) for s in (decoded[j] if j in decoded else images[j]).shape) for j in range(len(raw))}
        if len(host_j) == len(raw) and len(shapes) == 1:
            batch = base.view(len(raw), *shapes.pop())   # the uploads landed back to back
        elif decoded:
            with torch.cuda.stream(ring.stream):
                if len(shapes) == 1 and len(decoded) + len(host_j) == len(raw):
                    batch = torch.stack([decoded[j] if j in decoded else images[j] for j in range(len(raw))])
                    owned.append(batch)
                    for j in decoded:
                        images[j] = batch[j]
                else:
                    for j, img in decoded.items():
                        images[j] = img.contiguous()
                        owned.append(images[j])
                # the decoded pixels back to the host for the Results, into a pinned download
                # buffer; finish() copies them into each item's own array once they arrived
                order = sorted(decoded)
                pinned = ring.download([images[j] for j in order])
                downloads = []
                for j, view in zip(order, pinned):
                    items[j] = SourceItem(raw[j].name, np.empty(tuple(view.shape), np.uint8))
                    downloads.append((view, items[j].image))
                host_ready = torch.cuda.Event()
                host_ready.record(ring.stream)
        ready = torch.cuda.Event()
        ready.record(ring.stream)
        ch = _Chunk(items, images, batch, ready, tuple(owned), load_ms=load_ms)
        if decoded:
            ch.host_ready, ch.downloads = host_ready, downloads
        return ch

    def _ring(self) -> "_UploadRing | None":
        """This thread's upload ring for the model's device (None off CUDA)."""
        if self.model.device.type != "cuda":
            return None
        local = self._local
        ring = getattr(local, "ring", None)
        if ring is None or ring.device != self.model.device:
            ring = local.ring = _UploadRing(self.model.device)
        return ring

    # ----------------------------------------------------------------- track
    def track(self, source: Any, *, tracker: Any = "bytetrack", persist: bool = False,
              **kwargs) -> list[Results] | Iterator[Results]:
        """``model.track``: predict (every option of :meth:`__call__`) with a tracker after each
        frame (:mod:`libreyolo.engine.track`); one tracker per source of a ``.streams`` list.

        ``tracker``: ``"bytetrack"``, ``"botsort"`` or a tracker object of the ``trackers``
        package. ``persist=True`` keeps the trackers (and their ids) from the previous
        ``track`` call, for feeding a stream frame by frame (``model.track(frame, persist=True)``
        in a loop); otherwise each call starts new tracks. ``conf`` defaults to
        :data:`TRACK_CONF`, below the trackers' threshold for starting a track, so that weaker
        detections can still extend the tracks they match (ByteTrack's second association).
        """
        from .track import TRACKERS, TrackGlue
        m = self.model
        if m.TASK != "detect":
            raise ValueError(f"model.track needs a detection model; {m.FAMILY}-{m.size} is a {m.TASK} model")
        if isinstance(tracker, str) and tracker.strip().lower().removesuffix(".yaml") not in TRACKERS:
            raise ValueError(f"unknown tracker {tracker!r}; available: {', '.join(TRACKERS)} (or pass a tracker "
                             "object of the trackers package)")
        persist = parse_bool("persist", persist)
        kwargs.setdefault("conf", TRACK_CONF)
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

    #: numpy images are staged through pinned memory by torch's parallel copy when torch may use at
    #: least this many threads; with fewer the driver's own staging is faster (see :meth:`_upload`)
    STAGE_MIN_THREADS = 2

    def _upload(self, image: Any) -> torch.Tensor:
        """Host image -> device uint8 tensor.

        On CUDA a host image is copied into a pinned buffer by torch's multi-threaded copy and
        uploaded asynchronously: the host goes on queuing the stage while the bytes travel.
        The buffer is this thread's: taken from its free list (or allocated) and kept busy
        until :meth:`_release_staging`, which the predict loop calls once it has waited for
        the chunk's outputs - queued after the upload on the same stream, so the upload has
        arrived by then. A caller that never releases just gets fresh buffers from torch's
        pinned allocator, which reuses a block only after its copies have finished. With a
        single torch thread the copy into pinned memory is slower than the driver staging the
        array itself, so the array is then uploaded straight from its own memory (the call
        returns once the driver has staged the bytes). Measured per 1280x720 frame on an
        H200: docs/benchmarks.md, sessions 4 and 5.
        """
        dev = self.model.device
        if isinstance(image, torch.Tensor):
            if image.device.type != "cpu" or dev.type != "cuda" or not image.is_contiguous():
                return image.to(dev, non_blocking=True)
            src = image
        else:
            arr = np.ascontiguousarray(image)
            if dev.type != "cuda":  # read-only arrays (np.asarray of a PIL image) are copied: torch needs writable
                return torch.from_numpy(arr if arr.flags.writeable else arr.copy())
            src = torch.from_numpy(arr)  # only read: a read-only array is fine
        if torch.get_num_threads() < self.STAGE_MIN_THREADS:
            return src.to(dev, non_blocking=True)
        local = self._local
        if not hasattr(local, "free"):
            local.free, local.busy = {}, []
        if len(local.busy) >= 64:  # uploads never released (not from predict): torch's allocator keeps them safe
            del local.busy[:32]
        key = (tuple(src.shape), src.dtype)
        free = local.free.get(key)
        buf = free.pop() if free else torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        local.busy.append((key, buf))
        buf.copy_(src)
        return buf.to(dev, non_blocking=True)

    def _release_staging(self) -> None:
        """Return this thread's busy staging buffers to its free list: call only once the work
        queued after their uploads (on the same stream) has been waited for."""
        local = self._local
        busy = getattr(local, "busy", None)
        if not busy:
            return
        if len(local.free) > 16:  # many image sizes: let torch's allocator have the idle buffers
            local.free.clear()
        for key, buf in busy:
            local.free.setdefault(key, []).append(buf)
        busy.clear()


# ---------------------------------------------------------------------------------------- staging


@dataclass
class _Chunk:
    """One chunk of a predict call on its way through :meth:`Predictor._steps`."""

    items: list[SourceItem]
    images: list[torch.Tensor]            # uint8 HWC on the model's device, one per item
    batch: torch.Tensor | None = None     # the same images as one contiguous (B, H, W, 3) tensor
    ready: Any = None                     # CUDA event on the copy stream: the images are complete
    owned: tuple = ()                     # device tensors made on the copy stream
    host_ready: Any = None                # CUDA event: GPU-decoded images are in `downloads`
    downloads: list = dataclasses.field(default_factory=list)   # (pinned view, the item's array)
    load_ms: float = 0.0
    prep_ms: float = 0.0


def _on_host(image: Any) -> bool:
    return isinstance(image, np.ndarray) or image.device.type == "cpu"


def _host_tensor(image: Any) -> torch.Tensor:
    """A host image as a CPU tensor sharing its memory (only read: read-only arrays are fine)."""
    return torch.from_numpy(np.ascontiguousarray(image)) if isinstance(image, np.ndarray) else image


class _UploadRing:
    """Host images -> the device, off the compute stream: two pinned staging buffers used in
    turn, a copy stream, and an event per buffer (and three pinned download buffers for the
    GPU-decoded images on their way back: :meth:`download`).

    :meth:`upload` waits (on the host) only until the buffer it is about to fill has finished
    its previous upload - two chunks back, long done when the device keeps up - copies the
    images into it (torch's multi-threaded copy), and queues one host-to-device copy per image
    on the copy stream, into one device buffer allocated there: image j's copy travels while
    the host fills image j+1. The caller makes the compute stream wait for :meth:`upload`'s
    event and records the device buffer on the compute stream (``record_stream``), so the
    allocator reuses it only after the stage has read it.
    """

    SLOTS = 2
    #: host buffers in page-locked memory (what makes the copies asynchronous; a CPU test's
    #: stand-in ring turns it off)
    PINNED = True

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self._host: list[torch.Tensor | None] = [None] * self.SLOTS
        self._copied: list[Any] = [None] * self.SLOTS
        self._next = 0

    #: images of different sizes start at multiples of this many bytes in the device buffer, as
    #: separate allocations would (the caching allocator's granularity); images of one size lie
    #: back to back, as ``torch.stack`` would lay them: the stage reads the layout it always read
    ALIGN = 512

    def upload(self, images: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """CPU uint8 tensors -> (device views of the same shapes, the device buffer holding them),
        queued on the copy stream."""
        k = self._next
        self._next = (k + 1) % self.SLOTS
        if self._copied[k] is not None:
            self._copied[k].synchronize()   # never overwrite a staging buffer still being copied
        sizes = [t.numel() for t in images]
        step = 1 if len({tuple(t.shape) for t in images}) == 1 else self.ALIGN
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += -(-n // step) * step
        host = self._host[k]
        if host is None or host.numel() < total:
            self._host[k] = None
            host = self._host[k] = torch.empty(total, dtype=torch.uint8, pin_memory=self.PINNED)
        views = []
        with torch.cuda.stream(self.stream):
            dev = torch.empty(total, dtype=torch.uint8, device=self.device)
            for t, n, off in zip(images, sizes, offsets):
                staged = host[off:off + n].view(t.shape)
                staged.copy_(t)
                d = dev[off:off + n].view(t.shape)
                d.copy_(staged, non_blocking=True)
                views.append(d)
        done = torch.cuda.Event()
        done.record(self.stream)
        self._copied[k] = done
        return views, dev

    #: download buffers: one being filled, one waiting for its chunk's Results, one spare - the
    #: loop prepares chunk i+1 before it finishes chunk i-1
    DOWNLOAD_SLOTS = 3

    def download(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        """Contiguous device tensors -> pinned host views of the same shapes, the copies queued
        on the copy stream (the caller records an event after them and waits for it before it
        reads the views, which stay valid until this slot comes round again)."""
        if not hasattr(self, "_down"):
            self._down: list[torch.Tensor | None] = [None] * self.DOWNLOAD_SLOTS
            self._down_next = 0
        k = self._down_next
        self._down_next = (k + 1) % self.DOWNLOAD_SLOTS
        total = sum(t.numel() for t in images)
        buf = self._down[k]
        if buf is None or buf.numel() < total:
            self._down[k] = None
            buf = self._down[k] = torch.empty(total, dtype=torch.uint8, pin_memory=self.PINNED)
        views, off = [], 0
        with torch.cuda.stream(self.stream):
            for t in images:
                v = buf[off:off + t.numel()].view(t.shape)
                v.copy_(t, non_blocking=True)
                views.append(v)
                off += t.numel()
        return views


def _chunked(items: Any, batch: int) -> Iterator[list[Any]]:
    """Consecutive lists of ``batch`` items (the last may be shorter), taking ``items`` - a list,
    or a lazily decoding :class:`~libreyolo.data.sources.SourceStream` - only as far as the
    chunks are asked for."""
    chunk: list[Any] = []
    source = iter(items)
    try:
        for it in source:
            chunk.append(it)
            if len(chunk) == batch:
                yield chunk
                chunk = []
        if chunk:
            yield chunk
    finally:   # a call stopped early: the decode threads of a SourceStream stop now
        close = getattr(source, "close", None)
        if close is not None:
            close()


# ------------------------------------------------------------------------------------------ video


def _video_chunks(videos: VideoSources, batch: int) -> Iterator[list[SourceItem]]:
    """Video frames as predict chunks: ``batch`` consecutive frames of a single source, or one
    frame of each running source of a ``.streams`` list per step."""
    def item(f) -> SourceItem:
        src = videos.streams[f.stream]
        return SourceItem(src.name, f.image, frame_index=f.index, timestamp=f.timestamp, stream=f.stream,
                          fps=src.fps)
    if len(videos) > 1:
        for step in videos.steps():
            yield [item(f) for f in step]
        return
    chunk: list[SourceItem] = []
    for step in videos.steps():
        chunk.append(item(step[0]))
        if len(chunk) == batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _declared_frames(videos: VideoSources) -> int | None:
    """The frames predict will yield when every source declares its length, else None."""
    counts = [s.frames for s in videos.streams]
    if any(c is None for c in counts):
        return None
    return sum(-(-c // s.vid_stride) for c, s in zip(counts, videos.streams))


def _video_stem(src: VideoStream) -> str:
    """The annotated video's file stem: the file's stem, ``camera0``, or a URL's last path part."""
    if src.kind == "file":
        return Path(src.name).stem or "video"
    if src.kind == "camera":
        return "camera" + "".join(ch for ch in src.name if ch.isdigit())
    tail = src.name.split("://", 1)[-1].split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(tail).stem)
    return stem or f"stream{src.stream}"


_warned_no_window = False


class _Viewer:
    """A window showing one video's annotated frames as they come (matplotlib), where a display
    and an interactive backend exist; elsewhere one warning per process and nothing else."""

    def __init__(self, title: str):
        self.title, self.fig, self.im = title, None, None
        problem = display_problem()
        if problem is None:
            import matplotlib
            backend = matplotlib.get_backend().lower()
            if backend in ("agg", "pdf", "ps", "svg", "cairo", "template") or backend.startswith("module://"):
                problem = f"matplotlib's backend '{matplotlib.get_backend()}' cannot open windows"
        self.problem = problem
        if problem is not None:
            global _warned_no_window
            if not _warned_no_window:
                _warned_no_window = True
                log.warning("show=True cannot open a window: %s; use save=True to write the annotated "
                            "video instead (this warning is shown once)", problem)

    def show(self, r: Results) -> None:
        if self.problem is not None:
            return
        import matplotlib.pyplot as plt
        frame = r.plot()
        if self.fig is None or not plt.fignum_exists(self.fig.number):
            self.fig = plt.figure(self.title)
            ax = self.fig.add_axes((0, 0, 1, 1))
            ax.set_axis_off()
            self.im = ax.imshow(frame)
            plt.show(block=False)
        else:
            self.im.set_data(frame)
        plt.pause(0.001)  # lets the GUI draw; the window keeps up as fast as frames come

    def close(self) -> None:
        if self.fig is not None:
            import matplotlib.pyplot as plt
            plt.close(self.fig)
            self.fig = None
