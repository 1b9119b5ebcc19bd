"""Inference through CUDA graphs: the policy around the act of capturing.

A :class:`GraphRunner` belongs to one model. Callers hand it a *stage*: a key naming
what the function computes (everything the function closes over that changes its
result must be in the key), the function and its tensor inputs. The runner decides,
per call, whether to run eager, capture, or replay:

* ``mode=False``  - eager, always.
* ``mode=True``   - capture on the first use of each signature, replay afterwards. An
  unsupported family raises ``NotImplementedError`` naming it; non-CUDA inputs raise
  :class:`GraphUnavailableError`.
* ``mode="auto"`` - capture once a signature repeats; never raises: on the CPU, for an
  unsupported family, or when a capture fails it runs eager and records why.

The signature of a call is (key, every input's shape/dtype/device, autocast state, grad
mode). Parameters and buffers are fingerprinted (device, dtype, data pointer, version
counter, and the number of tensors): moving the model, loading weights, fusing or
quantizing it releases every stale graph automatically. A runner built with
``watch_versions=False`` leaves the version counters out: its graphs are meant to replay
weights that change in place (training's EMA network, read by validation), which a graph
sees as it reads them by address; only moved, replaced or re-registered tensors make it stale. The cache is an LRU with a cap;
eviction is counted and thrashing is reported once. All lookups, captures and replays
of one runner are serialized by its lock, so several threads may predict at once.

The capturing itself is delegated to ``capturer`` (:class:`CudaGraphCapturer` by
default), so the whole policy is testable on a CPU with a stand-in capturer.
"""
from __future__ import annotations

import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from .cache import GraphCache, signature
from .capture import CudaGraphCapturer, to_host

log = logging.getLogger(__name__)

MODES = (False, True, "auto")

# Bumped whenever any nn.Module anywhere registers a submodule, parameter or buffer (fusing
# or quantizing replaces modules): runners then re-collect their tensors. Between bumps the
# fingerprint is a cheap pass over a cached tensor list instead of a module-tree traversal.
_STRUCTURE_GENERATION = [0]


def _bump_structure(*_args) -> None:
    _STRUCTURE_GENERATION[0] += 1


torch.nn.modules.module.register_module_module_registration_hook(_bump_structure)
torch.nn.modules.module.register_module_parameter_registration_hook(_bump_structure)
torch.nn.modules.module.register_module_buffer_registration_hook(_bump_structure)


# the fingerprint's version read, called by map() without a Python frame per tensor
_VERSION = operator.attrgetter("_version")


class GraphUnavailableError(RuntimeError):
    """``cuda_graph=True`` was asked for where no CUDA graph can run (e.g. on the CPU)."""


def normalize_mode(mode: Any) -> bool | str:
    """Accept False/True/"auto" and their common spellings ("0", "false", "on", None...)."""
    if mode is None:
        return False
    if isinstance(mode, str):
        m = mode.strip().lower()
        if m == "auto":
            return "auto"
        if m in ("1", "true", "yes", "on"):
            return True
        if m in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"cuda_graph must be False, True or 'auto', got {mode!r}")
    if isinstance(mode, bool):
        return mode
    if isinstance(mode, int) and mode in (0, 1):
        return bool(mode)
    raise ValueError(f"cuda_graph must be False, True or 'auto', got {mode!r}")


def _describe(sig: tuple) -> dict:
    key, shapes, ac, grad = sig
    return {"stage": key if isinstance(key, str) else repr(key),
            "inputs": [f"{tuple(s)}:{str(d).replace('torch.', '')}@{dev}" for s, d, dev in shapes],
            "autocast": str(ac[1]).replace("torch.", "") if ac[0] else None,
            "grad": grad}


class _Entry:
    __slots__ = ("graph", "signature", "created", "last_used", "held")

    def __init__(self, graph, signature, held=()):
        self.graph = graph
        self.signature = signature
        self.created = time.time()
        self.last_used = self.created
        # The storages of every parameter and buffer at capture, kept alive while the graph lives:
        # a replay launched before the stale-graph check can then only read memory that is ours.
        self.held = held


class GraphRunner:
    """Caches and replays CUDA graphs of a model's inference stages."""

    def __init__(self, module: torch.nn.Module, family: str, supported: bool, *,
                 max_graphs: int = 8, capture_after: int = 2,
                 capturer: Any | None = None, unsupported_reason: str | None = None,
                 watch_versions: bool = True):
        self.module = module
        self.watch_versions = bool(watch_versions)
        self.family = family
        self.supported = bool(supported)
        self.unsupported_reason = unsupported_reason or (
            "it has not passed the CUDA-graph parity protocol")
        self.capturer = capturer if capturer is not None else CudaGraphCapturer()
        self._lock = threading.RLock()
        # ``capture_after`` applies to mode "auto"; mode True captures on first use
        self._graphs = GraphCache(max_graphs, repeat=capture_after, on_evict=self._evicted)
        self._failed: dict[tuple, str] = {}
        self._fallbacks: Counter = Counter()
        self._fingerprint: tuple | None = None
        self._tensors: list[torch.Tensor] | None = None
        self._tensors_gen = -1
        self.last_mode: bool | str = False
        self.captures = 0
        self.invalidations = 0
        self.eager_calls = 0
        self._thrash_warned = False

    @property
    def max_graphs(self) -> int:
        return self._graphs.max_graphs

    @max_graphs.setter
    def max_graphs(self, value: int) -> None:
        self._graphs.max_graphs = int(value)

    @property
    def capture_after(self) -> int:
        return self._graphs.repeat

    @property
    def evictions(self) -> int:
        return self._graphs.evictions

    def _evicted(self, evictions: int) -> None:
        if evictions >= self.max_graphs and not self._thrash_warned:
            self._thrash_warned = True
            log.warning("the CUDA-graph cache of %s is thrashing (%d evictions, cap %d): "
                        "inputs keep changing shape; fix imgsz/batch or raise max_graphs",
                        self.family, evictions, self.max_graphs)

    # ------------------------------------------------------------------ policy
    def fingerprint(self) -> tuple:
        """Identity of every parameter and buffer the graphs may have baked in.

        A graph reads weights by address, so what makes it stale is a tensor that moved
        (new storage: ``.to()``, a dtype change, a replaced parameter) or a changed module
        tree (``fuse()``); version counters are included as well, so an in-place reload is
        treated as a change too (unless ``watch_versions`` is off: see the module docstring).
        """
        gen = _STRUCTURE_GENERATION[0]
        if self._tensors is None or self._tensors_gen != gen:
            self._tensors = [*self.module.parameters(), *self.module.buffers()]
            self._tensors_gen = gen
        ts = self._tensors
        versions = tuple(map(_VERSION, ts)) if self.watch_versions else ()
        return (len(ts), tuple([t.data_ptr() for t in ts]), versions)

    signature = staticmethod(signature)

    def _check_fingerprint(self) -> None:
        fp = self.fingerprint()
        if self._fingerprint is not None and fp != self._fingerprint and self._graphs:
            n = len(self._graphs)
            self._release_locked()
            self.invalidations += 1
            log.info("released %d CUDA graph(s) of %s: parameters moved, changed or were replaced",
                     n, self.family)
        self._fingerprint = fp

    def _note_fallback(self, reason: str) -> None:
        if reason not in self._fallbacks:
            log.info("cuda_graph='auto' runs %s eager: %s", self.family, reason)
        self._fallbacks[reason] += 1

    def _eager(self, fn, inputs, host: bool = False):
        self.eager_calls += 1
        out = fn(*inputs)
        return to_host(out) if host else out

    @staticmethod
    def _replay(entry: _Entry, inputs, clone: bool, host: bool, constant: Sequence[int]):
        out = entry.graph.replay(inputs, clone=clone and not host, constant=constant)
        # The host copy is queued under the lock: before any later replay overwrites the outputs.
        return to_host(out) if host else out

    def __call__(self, key: Hashable, fn: Callable[..., Any], inputs: Sequence[torch.Tensor],
                 mode: Any = "auto", clone: bool = True, host: bool = False, constant: Sequence[int] = (),
                 sig: tuple | None = None) -> Any:
        """Run stage ``key`` = ``fn(*inputs)`` eager, captured or replayed per ``mode``.

        ``host=True`` returns a :class:`~libreyolo.graphs.capture.HostCopy` of the outputs (its
        ``wait()`` gives them in host memory) instead of device tensors: a replay's outputs are
        then copied straight from the graph's buffers, without a device clone. ``constant``:
        positions of inputs the caller never modifies in place (see ``CapturedGraph.replay``).
        ``sig``: :meth:`signature` of ``(key, inputs)``, when the caller has just computed it
        (in the same autocast and grad state); None: computed here.
        """
        mode = normalize_mode(mode)
        inputs = tuple(inputs)
        self.last_mode = mode
        if mode is False:
            return self._eager(fn, inputs, host)
        if not self.supported:
            if mode is True:
                raise self._unsupported_error()
            with self._lock:
                self._note_fallback(f"family '{self.family}' is not graph-capturable: {self.unsupported_reason}")
            return self._eager(fn, inputs, host)
        dev = inputs[0].device if inputs else torch.device("cpu")
        if not self.capturer.can_capture(dev):
            if mode is True:
                raise self._unavailable_error(dev)
            with self._lock:
                self._note_fallback(f"inputs are on '{dev}', CUDA graphs need a CUDA device")
            return self._eager(fn, inputs, host)
        if sig is None:
            sig = self.signature(key, inputs)
        with self._lock:
            entry = self._graphs.get(sig)
            if entry is not None and self._fingerprint is not None:
                # The common case: launch first, then run the stale-graph check on the host while
                # the device works (it reads every parameter's address and version, which is on the
                # critical path when it runs first). Held storages make a stale
                # replay harmless; its output is dropped and the stage runs again below.
                entry.last_used = time.time()
                out = self._replay(entry, inputs, clone, host, constant)
                if self.fingerprint() == self._fingerprint:
                    return out
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)  # the stale replay ends before its graph is dropped
            self._check_fingerprint()
            entry = self._graphs.get(sig)
            if entry is None:
                if sig in self._failed:
                    return self._eager(fn, inputs, host)
                if not self._graphs.note(sig) and mode == "auto":
                    return self._eager(fn, inputs, host)
                try:
                    graph = self.capturer.capture(fn, inputs, module=self.module)
                except Exception as exc:  # capture failure: raise for True, eager for auto
                    if mode is True:
                        raise
                    reason = f"capture of {_describe(sig)['stage']} failed: {type(exc).__name__}: {exc}"
                    self._failed[sig] = reason
                    self._note_fallback(reason)
                    return self._eager(fn, inputs, host)
                self.captures += 1
                self._fingerprint = self.fingerprint()  # capture may bump buffer versions
                entry = self._insert(sig, graph)
            entry.last_used = time.time()
            return self._replay(entry, inputs, clone, host, constant)

    def _unsupported_error(self) -> NotImplementedError:
        return NotImplementedError(
            f"cuda_graph=True is not supported for the '{self.family}' family: "
            f"{self.unsupported_reason}. Use cuda_graph=False or 'auto' (which runs eager).")

    def _unavailable_error(self, dev: torch.device) -> GraphUnavailableError:
        return GraphUnavailableError(
            f"cuda_graph=True needs the model on a CUDA device, but it runs on '{dev}'"
            + ("" if torch.cuda.is_available() else " and this machine has no CUDA GPU")
            + ". Move it with model.to('cuda'), or use cuda_graph='auto' (eager where graphs cannot run).")

    def check_mode(self, mode: Any, device: torch.device) -> None:
        """Raise now what a call in ``mode`` would raise for inputs on ``device`` (an unsupported
        family, or no CUDA under ``cuda_graph=True``): for a caller with work to do before its
        first stage (predict reads and decodes its sources), so such a request fails before it."""
        if normalize_mode(mode) is not True:
            return
        if not self.supported:
            raise self._unsupported_error()
        if not self.capturer.can_capture(torch.device(device)):
            raise self._unavailable_error(torch.device(device))

    def _insert(self, sig: tuple, graph) -> _Entry:
        held = tuple(t.untyped_storage() for t in self._tensors or ())
        return self._graphs.insert(sig, _Entry(graph, sig, held))

    # ----------------------------------------------------------------- control
    def has_graph(self, key: Hashable, inputs: Sequence[torch.Tensor], sig: tuple | None = None) -> bool:
        """Whether a graph of stage ``key`` for these inputs is cached (``sig``: their
        :meth:`signature`, when the caller has it)."""
        if sig is None:
            sig = self.signature(key, inputs)
        with self._lock:
            return sig in self._graphs

    def capture(self, key: Hashable, fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> dict:
        """Capture stage ``key`` now (``model.capture_graph``); returns its description."""
        inputs = tuple(inputs)
        if not self.supported:
            raise NotImplementedError(f"CUDA-graph capture is not supported for the '{self.family}' "
                                      f"family: {self.unsupported_reason}")
        if not inputs or not self.capturer.can_capture(inputs[0].device):
            raise GraphUnavailableError("capture_graph needs the model on a CUDA device"
                                        + ("" if torch.cuda.is_available() else " (this machine has no CUDA GPU)"))
        sig = self.signature(key, inputs)
        with self._lock:
            self._check_fingerprint()
            if sig not in self._graphs:
                graph = self.capturer.capture(fn, inputs, module=self.module)
                self.captures += 1
                self._fingerprint = self.fingerprint()
                self._insert(sig, graph)
            e = self._graphs[sig]
            return {**_describe(sig), "capture_ms": round(e.graph.capture_ms, 3)}

    def _release_locked(self) -> int:
        n = self._graphs.clear()
        self._failed.clear()
        reset = getattr(self.capturer, "reset_pool", None)
        if reset is not None:
            reset()
        return n

    def release(self) -> int:
        """Drop every graph (their memory returns to the allocator); returns how many."""
        with self._lock:
            n = self._release_locked()
            self._fingerprint = None
        if n and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return n

    def info(self) -> dict:
        """Statistics behind ``model.graph_info()``."""
        with self._lock:
            graphs = []
            for sig, e in self._graphs.items():
                d = _describe(sig)
                d.update(capture_ms=round(e.graph.capture_ms, 3), replays=e.graph.replays,
                         pool_bytes=getattr(e.graph, "pool_bytes", 0))
                graphs.append(d)
            return {
                "family": self.family,
                "supported": self.supported,
                "unsupported_reason": None if self.supported else self.unsupported_reason,
                "mode": self.last_mode,
                "graphs": graphs,
                "captures": self.captures,
                "replays": sum(g["replays"] for g in graphs),
                "eager_calls": self.eager_calls,
                "evictions": self.evictions,
                "invalidations": self.invalidations,
                "max_graphs": self.max_graphs,
                "fallbacks": [{"reason": r, "count": c} for r, c in self._fallbacks.items()],
                "failed_captures": list(self._failed.values()),
                "pool_bytes": sum(g["pool_bytes"] for g in graphs),
            }
