"""Task-generic predict loop: sources -> batches -> GPU preprocessing -> stage -> Results.

The uint8 images are uploaded once; the family's preprocessing (``model.preprocess``: letterbox,
stretch or resize+crop, then normalization) runs in torch on the model's device. The stage -
network, then the task's on-device post-processing (:meth:`PredictPlan.finish`) - goes through
the model's :class:`GraphRunner`, together with the preprocessing when a batch's images share
one size, so ``cuda_graph`` only changes *how* the same ops run, never *what* they compute:
eager numbers are the truth. The task turns the stage's outputs into Results
(:meth:`PredictPlan.results`).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.sources import load_sources
from ..graphs.runner import normalize_mode
from ..options import check_imgsz, check_int, parse_amp, parse_bool
from ..results import Results
from ..tasks.base import PredictPlan
from .fastpath import HalfNetwork, arm_name, check_contract, half_network, resolve, to_float32
from .paths import UniqueNames, next_run_dir

log = logging.getLogger("libreyolo")
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

    # ---------------------------------------------------------------- stages
    def _stage_fns(self, size: int, plan: PredictPlan, half: HalfNetwork | None = None):
        """The two capturable stages: from a preprocessed batch, and from raw uint8 images.

        Both run the network (``model.infer``) and the task's post-processing
        (:meth:`PredictPlan.finish`, which also takes the plan's extra inputs). With ``half`` (the
        half / fast path) the network is the model's half copy, the preprocessing writes its half
        NHWC input, and the outputs are cast to float32 before the post-processing.
        """
        model = self.model
        prep = model.preprocess
        if half is None:
            def net(x, *extra):
                return plan.finish(model.infer(x), *extra)

            def from_u8(u8, *extra):
                return net(prep(u8, size), *extra)
        else:
            def net(x, *extra):
                return plan.finish(to_float32(half(x)), *extra)

            def from_u8(u8, *extra):
                return net(prep.to_input(u8, size, half.dtype, channels_last=True), *extra)

        return net, from_u8

    def _half(self, precision: str, fast: bool) -> HalfNetwork | None:
        """The half network of a call (None for fp32), after the family's contract check."""
        if precision == "fp32":
            return None
        check_contract(self.model.FAMILY, precision, fast)
        return half_network(self.model, precision, fast)

    @staticmethod
    def _keys(size: int, plan: PredictPlan, half: HalfNetwork | None) -> tuple[tuple, tuple]:
        """(u8-stage key, net-stage key): the precision (and fast) is part of both, so a precision
        switch never replays another path's graph."""
        arm = "fp32" if half is None else arm_name(half.precision, half.fast)
        return ("u8", size, arm, *plan.tag), ("net", size, arm, *plan.tag)

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
        return self.model.task.plan(self.model, size, self.constant, **opts)

    def run_batch(self, images: list[torch.Tensor], size: int, mode: Any, amp_dtype, plan: PredictPlan,
                  half: HalfNetwork | None = None) -> Any:
        """uint8 HWC device tensors -> the stage's outputs (a HostCopy when ``plan.host``)."""
        runner = self.model._runner
        net, from_u8 = self._stage_fns(size, plan, half)
        prep = self.model.preprocess
        if half is not None:
            def prep(u8, size, _p=prep, _dt=half.dtype):  # noqa: E306 - the half NHWC input
                return _p.to_input(u8, size, _dt, channels_last=True)
        key, net_key = self._keys(size, plan, half)
        shapes = tuple((int(im.shape[0]), int(im.shape[1])) for im in images)
        extra = plan.extra(shapes, size)
        opts = {"host": plan.host, "constant": plan.constant}
        same = len(set(shapes)) == 1
        with torch.no_grad(), self._autocast(amp_dtype):
            if same:
                u8 = images[0].unsqueeze(0) if len(images) == 1 else torch.stack(images)
                # Preprocess inside the graph only for a raw size seen before (a video, a camera,
                # a fixed pipeline) - otherwise each new photo size would cost a capture - and not
                # when capture_graph pinned the network stage for this request.
                raw = (tuple(u8.shape), str(u8.device))
                use_u8 = mode is not False and (runner.has_graph(key, (u8, *extra)) or (
                    self._raw_seen[raw] >= 1 and net_key not in self._pinned))
                self._raw_seen[raw] += 1
                if len(self._raw_seen) > 256:
                    self._raw_seen.clear()
                if use_u8:
                    return runner(key, from_u8, (u8, *extra), mode, **opts)
                x = prep(u8, size)
            else:
                x = torch.cat([prep(im.unsqueeze(0), size) for im in images])
            return runner(net_key, net, (x, *extra), mode, **opts)

    def capture(self, imgsz=None, batch=1, dtype=None, source=None, source_shape=None, bgr: bool = False,
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
                info = m._runner.capture(net_key, net, (x, *extra))
                self._pinned.add(net_key)
                return info
            h, w = shapes[0]
            u8 = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8).to(m.device)
            return m._runner.capture(u8_key, from_u8, (u8, *extra))

    # ------------------------------------------------------------------ call
    def __call__(self, source: Any, *, imgsz: int | None = None, batch: int = 1, cuda_graph: Any = False,
                 amp: Any = False, bgr: bool = False, save: bool = False, save_dir: str | Path | None = None,
                 exist_ok: bool = False, verbose: bool = False, profile: bool = False,
                 precision: Any = None, fast: Any = False, **task_opts) -> list[Results]:
        """Predict on ``source`` (path, directory, glob, PIL, numpy RGB - or BGR with
        ``bgr=True`` -, torch tensor, or a list of them) and return one Results per image.

        ``cuda_graph``: False (eager), True (capture each new input signature; raises on an
        unsupported family or without CUDA) or "auto" (capture once a signature repeats,
        never raises). ``amp``: True for the family's autocast dtype (``AMP_DTYPE``: float16 unless
        the family says otherwise), "fp16" or "bf16" to choose (CUDA only).
        ``save`` writes annotated pictures to ``save_dir`` (default: a new ``runs/predict``,
        ``runs/predict2``, ... per call, or ``runs/predict`` itself with ``exist_ok=True``); inputs
        with the same file stem get distinct names (``a.jpg``, ``a_2.jpg``).
        ``profile`` synchronizes the device between stages so that ``Results.speed``
        (ms per image: load, preprocess, inference, postprocess) is exact; without
        it the stages overlap and ``speed`` shows host time only.
        ``precision``: "fp32" (default: the bitwise path), "fp16" or "bf16" (a cached half copy of
        the network, BatchNorm folded, channels_last; post-processing in float32). ``fast=True``
        (CUDA only; precision fp16 unless bf16 is asked) also compiles that copy with inductor,
        captured with the pre- and post-processing when ``cuda_graph`` is on. Both are refused
        for a family outside the measured fast-path contract (:mod:`libreyolo.engine.fastpath`).
        The task's own options (detection: ``conf``, ``iou``, ``max_det``, ``max_nms`` - the
        candidates per image that enter NMS -, ``classes``, ``agnostic_nms``) follow.
        """
        m = self.model
        mode = normalize_mode(cuda_graph)
        unknown = sorted(set(task_opts) - set(m.task.predict_defaults))
        if unknown:
            raise TypeError(f"unknown predict option(s) {', '.join(unknown)} for a {m.TASK} model; "
                            f"known: imgsz, batch, cuda_graph, amp, bgr, save, save_dir, exist_ok, verbose, profile, "
                            "precision, fast, "
                            + ", ".join(m.task.predict_defaults))
        batch = check_int("batch", batch, 1)
        save, bgr = parse_bool("save", save), parse_bool("bgr", bgr)
        size = check_imgsz(m.imgsz if imgsz is None else imgsz, m.STRIDE)
        plan = self.plan(size, **task_opts)
        amp_dtype = _amp_dtype(amp, m.AMP_DTYPE)
        precision, fast = resolve(precision, fast, m.device)
        if precision != "fp32" and amp_dtype is not None:
            raise ValueError(f"amp and precision={precision!r} exclude each other: the half path runs a half "
                             "copy of the network without autocast; pass one of them")
        half = self._half(precision, fast)
        if not m.trained and not getattr(m, "_warned_untrained", False):
            log.warning("libreyolo: %s-%s is UNTRAINED (random weights): its predictions are meaningless",
                        m.FAMILY, m.size)
            m._warned_untrained = True
        sync = (torch.cuda.synchronize if profile and m.device.type == "cuda" else (lambda: None))
        t_load = time.perf_counter()
        if getattr(self._local, "busy", None):  # left by a call that failed mid-way: maybe still
            self._local.busy.clear()           # uploading, so to torch's allocator, not the free list
        items = load_sources(source, bgr=bgr, borrow=True)  # owned below, while the GPU works
        t_load = (time.perf_counter() - t_load) * 1e3 / max(1, len(items))
        results: list[Results] = []
        progress = None
        if verbose or len(items) > 32:
            from tqdm import tqdm
            progress = tqdm(total=len(items), desc=f"predict {m.FAMILY}-{m.size}", unit="img",
                            disable=not verbose and len(items) <= 32)
        out_dir = None
        if save:
            out_dir = Path(save_dir) if save_dir else next_run_dir("runs", "predict", exist_ok)
            out_dir.mkdir(parents=True, exist_ok=True)
            unique = UniqueNames()
        for start in range(0, len(items), int(batch)):
            chunk = items[start:start + int(batch)]
            t0 = time.perf_counter()
            dev_images = [self._upload(it.image) for it in chunk]
            sync()
            t1 = time.perf_counter()
            out = self.run_batch(dev_images, size, mode, amp_dtype, plan, half)
            for it in chunk:  # the host copy of borrowed arrays overlaps with the queued GPU work
                it.own()
            sync()
            t2 = time.perf_counter()
            speed = {"load": t_load, "preprocess": (t1 - t0) * 1e3 / len(chunk),
                     "inference": (t2 - t1) * 1e3 / len(chunk)}
            chunk_results = plan.results(out, chunk, size, speed)
            self._release_staging()  # the outputs came after this chunk's uploads on the same stream
            post_ms = (time.perf_counter() - t2) * 1e3 / len(chunk)
            for r in chunk_results:
                r.speed["postprocess"] = post_ms
                if out_dir is not None:
                    r.saved_to = r.save(out_dir / unique(Path(r.path).stem))
            results.extend(chunk_results)
            if progress is not None:
                progress.update(len(chunk))
        if progress is not None:
            progress.close()
        if out_dir is not None:
            log.info("libreyolo: saved %d annotated image(s) to %s", len(results), out_dir)
        return results

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
