"""A predict call's images on their way to the device: the per-image uploads through pinned
buffers, the staged uploads of the overlapped loop (:class:`UploadRing`: two pinned staging buffers,
a copy stream, an event per buffer), the GPU JPEG decode of a chunk's files, and the chunks
themselves (:class:`Chunk`, :func:`chunked`).

:class:`StagedUploads` is :class:`~libreyolo.engine.predictor.Predictor`'s base: the methods that
prepare a chunk (:meth:`StagedUploads._prepare_simple`, :meth:`StagedUploads._prepare_staged`),
called by the predict loop (``Predictor._steps``).
"""
from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data.jpeg import decode_files, is_jpeg_path, probe
from ..data.sources import PendingItem, SourceItem

# The GPU upload reads a borrowed numpy image through a tensor view and never writes it; torch
# warns about views of read-only arrays (PIL images) all the same.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=r"libreyolo\.engine\.(predictor|staging)")


class StagedUploads:
    """The host-to-device side of a predict call; the predictor sets ``model`` and ``_local`` (a
    ``threading.local``: each thread's pinned staging buffers and upload ring)."""

    model: Any
    _local: threading.local

    def _prepare_simple(self, items: list[SourceItem]) -> Chunk:
        """A chunk's images on the device one by one (:meth:`_upload`, the current stream);
        the stage stacks them. Video frames take this path."""
        return Chunk(items, [self._upload(it.image) for it in items])

    def _prepare_staged(self, raw: list[Any], strict: bool = True) -> Chunk | None:
        """A chunk's images on the device without holding up the compute stream.

        ``raw``: SourceItems, or PendingItems (the GPU decode): JPEG files among them are read
        and decoded on the device in one batched call (:mod:`libreyolo.data.jpeg`), the rest
        loaded as :func:`load_sources` would. On CUDA the host images are copied into one of two
        pinned staging buffers and uploaded on this thread's copy stream (:class:`UploadRing`);
        the decode runs there too. All of a chunk lands in one device buffer, which is the
        stacked (B, H, W, 3) batch when the sizes agree, and an event marks it complete: the
        compute stream waits for that event only (``Predictor._steps``). GPU-decoded images are
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
                for (j, it, _), img in zip(files, decode_files([f for _, _, f in files], dev)):
                    if isinstance(img, np.ndarray):   # refused by nvjpeg, decoded on the CPU
                        items[j] = SourceItem(it.name, img)
                    else:
                        decoded[j] = img
        load_ms = (time.perf_counter() - t0) * 1e3
        if ring is None:
            return Chunk(items, [self._upload(it.image) for it in items], load_ms=load_ms)
        images: list[Any] = [None] * len(raw)
        host_j = [j for j in range(len(raw)) if j not in decoded and on_host(items[j].image)]
        owned: list[torch.Tensor] = []
        if host_j:
            views, base = ring.upload([host_tensor(items[j].image) for j in host_j])
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
        ch = Chunk(items, images, batch, ready, tuple(owned), load_ms=load_ms)
        if decoded:
            ch.host_ready, ch.downloads = host_ready, downloads
        return ch

    def _ring(self) -> UploadRing | None:
        """This thread's upload ring for the model's device (None off CUDA)."""
        if self.model.device.type != "cuda":
            return None
        local = self._local
        ring = getattr(local, "ring", None)
        if ring is None or ring.device != self.model.device:
            ring = local.ring = UploadRing(self.model.device)
        return ring

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
        returns once the driver has staged the bytes); the copy and upload times per 1280x720
        frame by thread count are in benchmarks/results/history.md ("Upload through pinned
        memory").
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


# ---------------------------------------------------------------------------------------- chunks


@dataclass
class Chunk:
    """One chunk of a predict call on its way through ``Predictor._steps``."""

    items: list[SourceItem]
    images: list[torch.Tensor]            # uint8 HWC on the model's device, one per item
    batch: torch.Tensor | None = None     # the same images as one contiguous (B, H, W, 3) tensor
    ready: Any = None                     # CUDA event on the copy stream: the images are complete
    owned: tuple = ()                     # device tensors made on the copy stream
    host_ready: Any = None                # CUDA event: GPU-decoded images are in `downloads`
    downloads: list = dataclasses.field(default_factory=list)   # (pinned view, the item's array)
    load_ms: float = 0.0
    prep_ms: float = 0.0


def reorder_bgr(ch: Chunk) -> None:
    """The chunk's BGR images (items lent with :attr:`SourceItem.bgr`: the caller's arrays
    uploaded as they were) made RGB on the device - the channel axis flipped, the same bytes as
    the host's reorder - in ``ch.images`` and ``ch.batch``, before the stage reads them."""
    flips = [j for j, it in enumerate(ch.items) if it.bgr]
    if not flips:
        return
    if ch.batch is not None and len(flips) == len(ch.items):
        ch.batch = ch.batch.flip(-1)
        ch.images = list(ch.batch.unbind(0))
        return
    for j in flips:
        ch.images[j] = ch.images[j].flip(-1)
    ch.batch = None   # stacked again from the images by the stage


def on_host(image: Any) -> bool:
    return isinstance(image, np.ndarray) or image.device.type == "cpu"


def host_tensor(image: Any) -> torch.Tensor:
    """A host image as a CPU tensor sharing its memory (only read: read-only arrays are fine)."""
    return torch.from_numpy(np.ascontiguousarray(image)) if isinstance(image, np.ndarray) else image


class UploadRing:
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


def chunked(items: Any, batch: int) -> Iterator[list[Any]]:
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
