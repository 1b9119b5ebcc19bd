"""How one CUDA graph is captured.

The recipe (DESIGN.md, engine contract 4): warm up on a side stream so that cuDNN /
cuBLAS handles and workspaces exist before capture, synchronize, capture with
``capture_error_mode="thread_local"`` (another thread - e.g. a DataLoader pin-memory
thread calling cudaHostAlloc - must not invalidate the capture) into the pool shared by
all graphs of one model, under one process-wide lock. Buffers that warm-up may touch
(BatchNorm running statistics, counters) are restored afterwards. Under autocast the
capture runs with the autocast weight cache disabled: cached casts are freed when the
autocast region exits, and a graph that recorded them would replay freed memory.
"""
from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

#: One capture at a time in the whole process: two concurrent captures into shared
#: pools, or a capture racing another's warm-up, are the classic source of corrupted graphs.
CAPTURE_LOCK = threading.RLock()


def autocast_state(device_type: str = "cuda") -> tuple[bool, torch.dtype | None]:
    """(enabled, dtype) of autocast for ``device_type`` in this thread."""
    enabled = torch.is_autocast_enabled(device_type)
    return enabled, (torch.get_autocast_dtype(device_type) if enabled else None)


def _no_cache_autocast(device_type: str = "cuda"):
    enabled, dtype = autocast_state(device_type)
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype, cache_enabled=False)


class FlatCopy:
    """The values of many tensors, kept in one flat buffer per device and dtype, and put back
    with one copy per buffer.

    A capture's warm-up must leave gradients, optimizer state and BatchNorm statistics as it
    found them: thousands of tensors for a training step. A clone and a copy per tensor are two
    operator calls each, and every call gives up the GIL; beside a busy Python thread (the
    checkpoint writer, a loader's pin-memory thread) getting it back can take the
    interpreter's switch interval each time. Here taking the copy is one concatenation per
    buffer, putting it back one split and one ``torch._foreach_copy_``. The values round-trip
    exactly (copies only), into each tensor's own layout.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]):
        from torch._utils import _flatten_dense_tensors
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        seen: set[int] = set()
        for t in tensors:   # each tensor once (a whole step's state lists the gradients again)
            if id(t) not in seen:
                seen.add(id(t))
                groups.setdefault((t.device, t.dtype), []).append(t)
        with torch.no_grad():
            self._groups = []
            for ts in groups.values():
                flat = _flatten_dense_tensors(ts)
                if len(ts) == 1:   # a lone tensor's "flattening" is a view of it, not a copy
                    flat = flat.clone()
                self._groups.append((ts, flat))

    def __len__(self) -> int:
        return sum(len(ts) for ts, _ in self._groups)

    @torch.no_grad()
    def restore(self, changed_only: bool = False) -> None:
        """Put the values back; with ``changed_only`` only into the tensors whose values differ
        now (found in one comparison per buffer and one host read), so the others keep their
        version counters. Values, not version counters, say what changed: BatchNorm's kernels
        update the running statistics without moving their counters."""
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        for ts, flat in self._groups:
            values = _unflatten_dense_tensors(flat, ts)
            if changed_only:
                diff = _flatten_dense_tensors(ts) != flat   # NaN != NaN: a NaN is put back too
                sizes = torch.tensor([t.numel() for t in ts], device=flat.device)
                owner = torch.repeat_interleave(torch.arange(len(ts), device=flat.device), sizes)
                hits = torch.zeros(len(ts), device=flat.device).index_add_(0, owner, diff.float())
                keep = (hits > 0).tolist()
                if not any(keep):
                    continue
                ts = [t for t, k in zip(ts, keep) if k]
                values = [v for v, k in zip(values, keep) if k]
            torch._foreach_copy_(list(ts), list(values))


def snapshot_buffers(module: torch.nn.Module | None) -> FlatCopy:
    """A copy of every buffer of ``module`` (BatchNorm statistics, counters)."""
    return FlatCopy([] if module is None else [b for b in module.buffers()])


def restore_buffers(saved: FlatCopy) -> None:
    """Put back the buffers that changed since :func:`snapshot_buffers` (the others keep their
    version counters)."""
    saved.restore(changed_only=True)


@dataclass
class CapturedGraph:
    """A captured graph with its static input and output tensors.

    ``writes_inputs`` says whether the captured function wrote into its inputs (their version
    counters moved during warm-up or capture); only a graph that never does may skip the copy
    of an input that is the very tensor it copied last time (see :meth:`replay`).
    """

    graph: Any
    static_inputs: tuple[torch.Tensor, ...]
    static_outputs: Any
    capture_ms: float
    pool_bytes: int = 0
    replays: int = 0
    meta: dict = field(default_factory=dict)
    writes_inputs: bool = True
    _copied: dict = field(default_factory=dict, repr=False)  # input position -> (tensor, version) copied last

    def replay(self, inputs: Sequence[torch.Tensor], clone: bool = True, constant: Sequence[int] = ()) -> Any:
        """Copy ``inputs`` into the static buffers, replay, return the outputs.

        With ``clone`` the outputs are fresh tensors that stay valid after the next
        replay; without it they are the static buffers (borrowed until the next replay).
        ``constant``: positions of inputs the caller never modifies in place (a cached
        thresholds tensor, say); such an input is not copied again when it is the same tensor
        object, at the same version, as the one copied last time and the graph never writes
        its inputs (one copy and its launch fewer per replay).
        """
        for i, (dst, src) in enumerate(zip(self.static_inputs, inputs)):
            if dst.data_ptr() == src.data_ptr():
                continue
            if i in constant and not self.writes_inputs:
                last = self._copied.get(i)
                if last is not None and last[0] is src and last[1] == src._version:
                    continue
                self._copied[i] = (src, src._version)
            else:
                self._copied.pop(i, None)
            dst.copy_(src, non_blocking=True)
        self.graph.replay()
        self.replays += 1
        if clone:
            return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.static_outputs)
        return self.static_outputs


class HostCopy:
    """Outputs on their way to the host (see :func:`to_host`): :meth:`wait` returns them."""

    __slots__ = ("_outputs", "_event")

    def __init__(self, outputs: Any, event: Any = None):
        self._outputs = outputs
        self._event = event

    def wait(self) -> Any:
        """The outputs as host tensors, once their copies have arrived."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._outputs


def to_host(outputs: Any) -> HostCopy:
    """Queue copies of the CUDA tensors in ``outputs`` (a tensor or a tree of them) into pinned
    host memory, on their device's current stream, and return at once.

    Queued right after a replay (under the runner's lock), the copy is ordered before any later
    replay of the same graph, so the static outputs can be read without cloning them on the
    device first; and the caller waits on one event instead of a synchronous copy to pageable
    memory, which costs more host time. Host tensors are passed through.
    """
    if isinstance(outputs, torch.Tensor):   # one tensor (classification's packed rows): no tree to walk
        if not outputs.is_cuda:
            return HostCopy(outputs)
        host = torch.empty(outputs.shape, dtype=outputs.dtype, pin_memory=True).copy_(outputs, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(outputs.device))
        return HostCopy(host, event)
    leaves, _ = tree_flatten(outputs)
    dev = next((t.device for t in leaves if isinstance(t, torch.Tensor) and t.is_cuda), None)
    if dev is None:
        return HostCopy(outputs)

    def copy(t):
        if not (isinstance(t, torch.Tensor) and t.is_cuda):
            return t
        # torch's pinned allocator hands this block out again only after the copy has finished
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
    host = tree_map(copy, outputs)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(dev))
    return HostCopy(host, event)


@contextlib.contextmanager
def no_gc():
    """No Python garbage collection while a capture runs. A collection inside the capture can
    free pinned host tensors of an earlier DataLoader (or CUDA events with them), and the host
    allocator's event query from the capturing thread invalidates the capture; torch.cuda.graph
    collects once before it starts, so nothing is postponed for long."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CudaGraphCapturer:
    """Captures callables into CUDA graphs that share one memory pool."""

    def __init__(self, warmup: int = 3):
        self.warmup = warmup
        self._pool = None

    @property
    def pool(self):
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    @staticmethod
    def can_capture(device: torch.device) -> bool:
        """Whether graphs can run for tensors on ``device``."""
        return device.type == "cuda" and torch.cuda.is_available()

    def reset_pool(self) -> None:
        """Forget the pool (after every graph using it was released)."""
        self._pool = None

    def capture(self, fn: Callable[..., Any], inputs: Sequence[torch.Tensor],
                module: torch.nn.Module | None = None) -> CapturedGraph:
        """Warm up ``fn`` on a side stream, then capture ``fn(*static_inputs)``."""
        device = inputs[0].device
        if device.type != "cuda":
            raise RuntimeError(f"CUDA-graph capture needs CUDA tensors, got {device}")
        with CAPTURE_LOCK, torch.cuda.device(device):
            t0 = time.perf_counter()
            static_inputs = tuple(x.detach().clone() for x in inputs)
            versions = [x._version for x in static_inputs]
            saved = snapshot_buffers(module)
            rng = torch.cuda.get_rng_state(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            try:
                with torch.cuda.stream(side), _no_cache_autocast():
                    for _ in range(self.warmup):
                        fn(*static_inputs)
                torch.cuda.current_stream(device).wait_stream(side)
                torch.cuda.synchronize(device)
            finally:
                restore_buffers(saved)
                torch.cuda.set_rng_state(rng, device)
            t1 = time.perf_counter()
            before = torch.cuda.memory_reserved(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), _no_cache_autocast(), \
                    no_gc():
                t2 = time.perf_counter()
                static_outputs = fn(*static_inputs)
                t3 = time.perf_counter()
            torch.cuda.synchronize(device)
            t4 = time.perf_counter()
            pool_bytes = max(0, torch.cuda.memory_reserved(device) - before)
            leaves, _ = tree_flatten(static_outputs)
            if not any(isinstance(t, torch.Tensor) for t in leaves):
                raise RuntimeError("the captured function returned no tensor")
            # where the capture's time went (ms): the warm-up with its save and restore, the
            # graph context's entry (a device sync, the allocator's caches emptied), recording
            # the function, and the capture's end (the graph instantiated) with a sync
            phases = {"warmup": (t1 - t0) * 1e3, "entry": (t2 - t1) * 1e3, "record": (t3 - t2) * 1e3,
                      "end": (t4 - t3) * 1e3}
            return CapturedGraph(graph, static_inputs, static_outputs, (t4 - t0) * 1e3, pool_bytes,
                                 writes_inputs=[x._version for x in static_inputs] != versions,
                                 meta={"phases_ms": phases})
