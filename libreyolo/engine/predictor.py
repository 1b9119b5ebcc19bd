"""Task-generic predict loop: sources -> batches -> GPU letterbox -> stage -> Results.

The uint8 images are uploaded once; letterbox and normalization run in torch on the
model's device. The network stage (and, for batches whose images share one size, the
letterbox too) goes through the model's :class:`GraphRunner`, so ``cuda_graph`` only
changes *how* the same ops run, never *what* they compute: eager numbers are the truth.
Post-processing is one batched NMS for the whole batch and one copy to the host.
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
from ..ops.letterbox import geometry_rows, inverse_params, letterbox, unletterbox_boxes, unletterbox_packed
from ..ops import nms_graph
from ..ops.nms import nms_per_image, top_candidates
from ..ops.nms_graph import select_packed
from ..results import Boxes, Results

log = logging.getLogger("libreyolo")
_NO_CONTEXT = contextlib.nullcontext()


def _amp_dtype(amp: Any, default: torch.dtype = torch.float16) -> torch.dtype | None:
    """``amp`` option -> autocast dtype; True means the family's ``AMP_DTYPE`` (``default``)."""
    if amp in (None, False, 0, "false", "False", "0", ""):
        return None
    if amp is True or amp in ("true", "True", "1"):
        return default
    if amp in ("fp16", "float16", "half", torch.float16):
        return torch.float16
    if amp in ("bf16", "bfloat16", torch.bfloat16):
        return torch.bfloat16
    raise ValueError(f"amp must be False, True (the family's autocast dtype), 'fp16' or 'bf16', got {amp!r}")


def check_imgsz(imgsz: Any, stride: int) -> int:
    """An int imgsz rounded up to the stride (with one log line when it changes)."""
    if isinstance(imgsz, (list, tuple)):
        if len(set(imgsz)) != 1:
            raise ValueError(f"imgsz must be square (one int), got {imgsz!r}")
        imgsz = imgsz[0]
    try:
        size = int(imgsz)
    except (TypeError, ValueError):
        raise ValueError(f"imgsz must be a positive int, got {imgsz!r}") from None
    if size <= 0:
        raise ValueError(f"imgsz must be a positive int, got {imgsz!r}")
    aligned = -(-size // stride) * stride
    if aligned != size:
        log.warning("libreyolo: imgsz=%d is not a multiple of the stride %d; using %d", size, stride, aligned)
    return aligned


# The GPU upload reads a borrowed numpy image through a tensor view and never writes it; torch
# warns about views of read-only arrays (PIL images) all the same.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=r"libreyolo\.engine\.predictor")


class Predictor:
    """Runs ``model.predict``; one per model (it keeps per-model policy state)."""

    def __init__(self, model):
        self.model = model
        self._raw_seen: Counter = Counter()
        self._local = threading.local()  # per-thread pinned staging buffers (see _upload)

    # ---------------------------------------------------------------- stages
    def _stage_fns(self, size: int, max_nms: int, post: tuple | None = None):
        """The two capturable stages: from a letterboxed batch, and from raw uint8 images.

        Both end with the fixed-shape top-``max_nms`` candidate selection. With ``post =
        (max_det, agnostic)`` (CUDA with Triton) they also run NMS and the final selection
        (:mod:`libreyolo.ops.nms_graph`) and map the boxes back to each image's pixels, and
        return one packed (B, max_det * 6 + 1) tensor, so the whole predict is one graph and
        one copy to the host; the extra stage inputs are the [conf, iou] device tensor and the
        (B, 3, 4) letterbox geometry (:meth:`_geometry`). Otherwise NMS runs eager on the
        candidates.
        """
        model = self.model
        resize = model.RESIZE
        if post is None:
            def finish(cand):
                return cand
        else:
            max_det, agnostic = post

            def finish(cand, thr, geo):
                packed = select_packed(*cand, thr, max_det, nms=model.NMS, agnostic=agnostic)
                return unletterbox_packed(packed, geo, max_det)

        def net(x, *extra):
            return finish(top_candidates(*model.infer(x), max_nms), *extra)

        def from_u8(u8, *extra):
            return net(letterbox(u8, size, resize), *extra)

        return net, from_u8

    @staticmethod
    def _stage_args(post: tuple | None, thr: torch.Tensor | None, geo: torch.Tensor | None) -> tuple[tuple, tuple]:
        """The stage's extra inputs after the images and the tag its graph keys carry."""
        return ((), ()) if post is None else ((thr, geo), ("post", *post))

    def _thresholds(self, conf: float, iou: float) -> torch.Tensor:
        """The [conf, iou] device tensor a post-processing stage reads (cached: no copy per call)."""
        return self._cached_tensor("thr", (float(conf), float(iou)), lambda: [conf, iou])

    def _geometry(self, shapes: tuple, size: int) -> torch.Tensor:
        """The (B, 3, 4) letterbox geometry of images of ``shapes`` ((h, w) each) that a
        post-processing stage maps boxes back with (cached per shapes: no copy per call)."""
        resize = self.model.RESIZE
        return self._cached_tensor("geo", (shapes, size, resize), lambda: geometry_rows(shapes, size, resize))

    def _cached_tensor(self, kind: str, key: tuple, values) -> torch.Tensor:
        cache = self.__dict__.setdefault("_tensor_cache", {})
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

    def run_batch(self, images: list[torch.Tensor], size: int, mode: Any, amp_dtype,
                  max_nms: int = 1000, post: tuple | None = None, thr: torch.Tensor | None = None,
                  host: bool = False) -> tuple:
        """uint8 HWC device tensors -> the stage's outputs.

        With ``post`` the outputs' boxes are already in each image's pixels; without, they are
        on the canvas (:func:`~libreyolo.ops.letterbox.inverse_params` maps them back). ``host=True``: the
        outputs come as a :class:`~libreyolo.graphs.capture.HostCopy` (``wait()`` gives them in
        host memory; see :meth:`GraphRunner.__call__`).
        """
        runner = self.model._runner
        net, from_u8 = self._stage_fns(size, max_nms, post)
        resize = self.model.RESIZE
        shapes = tuple((int(im.shape[0]), int(im.shape[1])) for im in images)
        geo = None if post is None else self._geometry(shapes, size)
        extra, tag = self._stage_args(post, thr, geo)
        opts = {"host": host, "constant": (1, 2) if extra else ()}  # the cached thresholds and geometry
        same = len(set(shapes)) == 1
        with torch.no_grad(), self._autocast(amp_dtype):
            if same:
                u8 = images[0].unsqueeze(0) if len(images) == 1 else torch.stack(images)
                key = ("u8", size, max_nms, *tag)
                # Letterbox inside the graph only for a raw size seen before (a video, a camera,
                # a fixed pipeline): otherwise each new photo size would cost a capture.
                raw = (tuple(u8.shape), str(u8.device))
                use_u8 = mode is not False and (self._raw_seen[raw] >= 1 or runner.has_graph(key, (u8, *extra)))
                self._raw_seen[raw] += 1
                if len(self._raw_seen) > 256:
                    self._raw_seen.clear()
                if use_u8:
                    return runner(key, from_u8, (u8, *extra), mode, **opts)
                x = letterbox(u8, size, resize)
            else:
                x = torch.cat([letterbox(im.unsqueeze(0), size, resize) for im in images])
            return runner(("net", size, max_nms, *tag), net, (x, *extra), mode, **opts)

    def _post(self, max_det: int, agnostic: bool, classes) -> tuple | None:
        """Whether NMS + selection run inside the stage (CUDA with Triton, no class filter)."""
        if classes is not None or not nms_graph.available(self.model.device):
            return None
        return int(max_det), bool(agnostic)

    def capture(self, imgsz=None, batch=1, dtype=None, source_shape=None, max_nms: int = 1000,
                max_det: int = 300, agnostic: bool = False) -> dict:
        m = self.model
        size = check_imgsz(imgsz or m.imgsz, m.STRIDE)
        post = self._post(max_det, agnostic, None)
        net, from_u8 = self._stage_fns(size, max_nms, post)
        shapes = ((size, size) if source_shape is None else tuple(int(v) for v in source_shape),) * int(batch)
        extra, tag = self._stage_args(post, None if post is None else self._thresholds(0.25, 0.45),
                                      None if post is None else self._geometry(shapes, size))
        amp_dtype = None if dtype in (None, torch.float32) else _amp_dtype(dtype, m.AMP_DTYPE)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad(), self._autocast(amp_dtype):
            if source_shape is None:
                x = torch.rand((batch, 3, size, size), generator=g).to(m.device)
                return m._runner.capture(("net", size, max_nms, *tag), net, (x, *extra))
            h, w = source_shape
            u8 = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8).to(m.device)
            return m._runner.capture(("u8", size, max_nms, *tag), from_u8, (u8, *extra))

    # ------------------------------------------------------------------ call
    def __call__(self, source: Any, *, conf: float = 0.25, iou: float = 0.45, imgsz: int | None = None,
                 batch: int = 1, cuda_graph: Any = False, max_det: int = 300, max_nms: int = 1000,
                 classes: list[int] | None = None, agnostic_nms: bool = False, amp: Any = False,
                 bgr: bool = False, save: bool = False, save_dir: str | Path | None = None,
                 verbose: bool = False, profile: bool = False) -> list[Results]:
        """Predict on ``source`` (path, directory, glob, PIL, numpy RGB - or BGR with
        ``bgr=True`` -, torch tensor, or a list of them) and return one Results per image.

        ``cuda_graph``: False (eager), True (capture each new input signature; raises on an
        unsupported family or without CUDA) or "auto" (capture once a signature repeats,
        never raises). ``amp``: True for the family's autocast dtype (``AMP_DTYPE``: float16 unless
        the family says otherwise), "fp16" or "bf16" to choose (CUDA only).
        ``save`` writes annotated pictures to ``save_dir`` (default runs/predict).
        ``max_nms`` caps the candidates per image that enter NMS (the best-scoring ones).
        ``profile`` synchronizes the device between stages so that ``Results.speed``
        (ms per image: load, preprocess, inference, postprocess) is exact; without
        it the stages overlap and ``speed`` shows host time only.
        """
        m = self.model
        mode = normalize_mode(cuda_graph)
        if not 0.0 <= float(conf) <= 1.0:
            raise ValueError(f"conf must be in [0, 1], got {conf}")
        if not 0.0 <= float(iou) <= 1.0:
            raise ValueError(f"iou must be in [0, 1], got {iou}")
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if int(max_det) < 1:
            raise ValueError(f"max_det must be >= 1, got {max_det}")
        if int(max_nms) < int(max_det):
            raise ValueError(f"max_nms ({max_nms}) must be >= max_det ({max_det})")
        if classes is not None:
            classes = [int(c) for c in ([classes] if isinstance(classes, int) else classes)]
            bad = [c for c in classes if not 0 <= c < m.nc]
            if bad:
                raise ValueError(f"classes {bad} out of range for a model with {m.nc} classes")
        size = check_imgsz(imgsz or m.imgsz, m.STRIDE)
        amp_dtype = _amp_dtype(amp, m.AMP_DTYPE)
        if not m.trained and not getattr(m, "_warned_untrained", False):
            log.warning("libreyolo: %s is UNTRAINED (random weights): its detections are meaningless", m)
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
            out_dir = Path(save_dir or "runs/predict")
            out_dir.mkdir(parents=True, exist_ok=True)
        for start in range(0, len(items), int(batch)):
            chunk = items[start:start + int(batch)]
            t0 = time.perf_counter()
            dev_images = [self._upload(it.image) for it in chunk]
            sync()
            t1 = time.perf_counter()
            post = self._post(max_det, agnostic_nms, classes)
            thr = None if post is None else self._thresholds(conf, iou)
            out = self.run_batch(dev_images, size, mode, amp_dtype, int(max_nms), post, thr, host=post is not None)
            for it in chunk:  # the host copy of borrowed arrays overlaps with the queued GPU work
                it.own()
            sync()
            t2 = time.perf_counter()
            # The rest is host work on a few hundred numbers: numpy, whose small-array calls cost
            # about a microsecond where a CPU torch op costs several.
            if post is None:
                dets = nms_per_image(*out, conf=float(conf), iou=float(iou), max_det=int(max_det),
                                     classes=classes, agnostic=agnostic_nms, nms_free=not m.NMS).numpy()
                img_col = dets[:, 0]
                per_image = [dets[img_col == i, 1:] for i in range(len(chunk))]
            else:  # one copy: (B, max_det * 6 + 1) = detections in score order + count per image
                host = out.wait().numpy()
                counts = host[:, -1].astype(np.int64).tolist()
                per_image = [host[i, :n * 6].reshape(n, 6).copy() for i, n in enumerate(counts)]
            self._release_staging()  # the outputs came after this chunk's uploads on the same stream
            t3 = time.perf_counter()
            speed = {"load": t_load, "preprocess": (t1 - t0) * 1e3 / len(chunk),
                     "inference": (t2 - t1) * 1e3 / len(chunk), "postprocess": (t3 - t2) * 1e3 / len(chunk)}
            for i, it in enumerate(chunk):
                d = per_image[i]
                h, w = int(it.image.shape[0]), int(it.image.shape[1])
                if post is None:  # the post stage mapped its boxes back on the device
                    sx, sy, px, py = inverse_params(h, w, size, m.RESIZE)
                    unletterbox_boxes(d, sx, sy, h, w, px, py)
                d = torch.from_numpy(d)
                r = Results(it.image, it.name, m.names, Boxes(d, (h, w)), speed=dict(speed))
                if out_dir is not None:
                    r.save(out_dir / f"{Path(it.name).stem}.jpg")
                results.append(r)
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
