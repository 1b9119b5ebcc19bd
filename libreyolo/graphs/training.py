"""Training through CUDA graphs: graphed forward + loss + backward, with eager fallbacks.

The general path (DESIGN.md, engine contract 7): once a batch signature (image, target and
mask shapes, dtype, autocast) has repeated ``repeat`` times, the step "forward -> loss ->
scaled backward" is captured with ``torch.cuda.graph(..., capture_error_mode="thread_local")``
directly (no torch class is replaced) and replayed for every later batch of that signature.
Up to ``max_graphs`` signatures are kept (LRU), so multi-scale training and a smaller last
batch do not disable capture.

Gradients accumulate *inside* the graph: before capture every parameter gets a zero
``.grad`` outside the graph pool, the captured backward adds into it, and the optimizer
must clear gradients in place (``zero_grad(set_to_none=False)``) so their addresses stay
the ones the graph writes to. BatchNorm statistics touched by the warm-up are restored, so
the captured run is the same arithmetic as the eager one.

Whole step: when the caller also hands an ``update`` (gradient clipping, the optimizer
step, zeroing the gradients in place, the EMA update) and asks for ``whole=True``, the
graph holds forward, loss, backward AND the update. That needs every update op to be
graph-safe (a fused optimizer with a tensor learning rate, an EMA driven by a device-side
counter; a GradScaler only with a fused optimizer, which takes its inf flag on the device and
skips itself - the scaler's scale and growth tracker then belong to ``state``, see
:func:`scaler_tensors`); the trainer only asks for it then. Warm-up runs the update too, so
every mutable tensor the caller lists through ``state`` (parameters, gradients, optimizer
buffers, EMA) is restored after capture: the captured run starts from the same state.

Failure policy: on the CPU, for a family not declared capturable, or when a capture or a
replay raises, one line is logged and the run continues eager; nothing is lost, because a
failed capture never touched the parameters and a replay that raised is redone eager.

Distributed runs hand an ``agree`` callable (a collective over the ranks): after every capture
attempt each rank says whether its capture succeeded, and a graph is kept only when all did,
so every rank runs the same collectives in the same order (a step's eager run and its replay
issue the same ones).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from .cache import GraphCache, signature
from .capture import CAPTURE_LOCK, CudaGraphCapturer, FlatCopy, no_gc

log = logging.getLogger(__name__)


def prime_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create an SGD or Adam/AdamW optimizer's state now (zeros) instead of at its first step.

    A whole-step capture must find every tensor the update writes already allocated, so
    that warm-up can be undone and the graph writes to tensors the optimizer keeps. SGD
    creates its momentum buffer lazily as a copy of the first gradient; a zero buffer gives
    the same first step bit for bit (``0 * momentum + grad == grad``). Adam and AdamW create
    zero moments and a zero step count at their first step, exactly what is made here (the
    step count as a device tensor, as their fused and capturable implementations keep it).
    Other optimizers are left alone (the trainer captures whole steps for these only).
    """
    if isinstance(opt, torch.optim.SGD):
        for group in opt.param_groups:
            if not group.get("momentum"):
                continue
            for p in group["params"]:
                st = opt.state[p]
                if st.get("momentum_buffer") is None:
                    st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    elif isinstance(opt, torch.optim.Adam):   # AdamW subclasses Adam
        for group in opt.param_groups:
            on_device = bool(group.get("fused") or group.get("capturable"))
            for p in group["params"]:
                st = opt.state[p]
                if len(st) != 0:
                    continue
                st["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if on_device
                              else torch.tensor(0.0, dtype=torch.float32))
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def training_state(params, optimizer: torch.optim.Optimizer, *extra) -> list[torch.Tensor]:
    """Every tensor a captured whole step writes: weights, their grads, the optimizer's state
    tensors, then ``extra`` (buffers, EMA tensors). A runner's ``state`` callable returns this;
    the runner snapshots it around warm-up and capture and restores it after."""
    params = list(params)
    out = [p.data for p in params] + [p.grad for p in params if p.grad is not None]
    for st in optimizer.state.values():
        out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    for group in extra:
        out += list(group)
    return out


def scaler_tensors(scaler: torch.amp.GradScaler) -> list[torch.Tensor]:
    """The device tensors a GradScaler's ``update()`` writes (scale, growth tracker), for a whole
    step's ``state``; empty when the scaler is off or not initialized yet. GradScaler has no
    public accessor for them, hence the private attributes (present since torch 1.6)."""
    if not scaler.is_enabled():
        return []
    return [t for t in (getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None))
            if isinstance(t, torch.Tensor)]


def backward_into_grads(loss: torch.Tensor, params: list[torch.Tensor]) -> None:
    """``loss.backward()`` for the leaf tensors ``params``, with their gradients added into
    ``.grad`` by one foreach call per group of matching layouts instead of one add per parameter.

    ``backward()`` accumulates each parameter's gradient with its own in-place add (autograd's
    AccumulateGrad): one small kernel per parameter, hundreds a step for a YOLO.
    Here autograd returns the gradients and ``torch._foreach_add_`` adds them: each element is
    ``grad + g`` once, in the gradient's dtype, as before, so the sums are the same bits. A
    parameter without a ``.grad`` gets a copy of ``g`` in its own layout (what backward stores for
    a first gradient, never an alias of autograd's buffer: a graphed segment's backward hands out
    static buffers). A parameter the loss does not reach keeps its ``.grad``, as with backward.
    Only ``params``' gradients are computed."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    fast_into: list[torch.Tensor] = []
    fast_from: list[torch.Tensor] = []
    with torch.no_grad():
        for p, g in zip(params, grads):
            if g is None:
                continue
            if p.grad is None:
                p.grad = torch.empty_like(p).copy_(g)
            elif p.grad.stride() == g.stride() and p.grad.dtype == g.dtype and p.grad.device == g.device:
                fast_into.append(p.grad)
                fast_from.append(g)
            else:   # another layout (an expanded gradient): foreach would take its slow path for all
                p.grad.add_(g)
        if fast_into:
            torch._foreach_add_(fast_into, fast_from)


def ensure_grads(module: torch.nn.Module) -> None:
    """Give every trainable parameter of ``module`` a zero ``.grad`` where it has none.

    Before a capture: the graph's gradient accumulation then writes into tensors that exist and
    stay. Before a graphed backward (:class:`GraphedSegment`): that backward hands autograd its
    *static* gradient buffers, and a parameter whose ``.grad`` is None would adopt that buffer
    (autograd steals an unshared incoming gradient); the next replay would overwrite it before
    adding to it - two micro-batches would sum to twice the second. With a ``.grad`` present,
    autograd adds in place, exactly as in eager training.
    """
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


class TrainStepRunner:
    """Runs ``loss, items = step(images, targets, mask)`` eager or captured.

    ``step`` must do forward, loss and ``backward()`` and return the detached loss and
    logging items; it must be fixed-shape and free of host syncs to be capturable.
    """

    #: warm-up iterations before a capture (on a side stream, then undone)
    CAPTURE_WARMUP = 1

    def __init__(self, net: torch.nn.Module, step: Callable[..., tuple[torch.Tensor, torch.Tensor]], *,
                 enabled: bool, family: str, supported: bool, repeat: int = 3, max_graphs: int = 8,
                 capturer: Any | None = None, reason: str | None = None,
                 update: Callable[[], None] | None = None,
                 state: Callable[[], list[torch.Tensor]] | None = None,
                 agree: Callable[[bool], bool] | None = None):
        self.net = net
        self.agree = agree
        self.step = step
        self.update = update
        self.state = state
        self.family = family
        # One warm-up iteration: by the time a signature is captured it has run eagerly (``repeat``
        # sightings), so the lazy set-up a first call does (cuDNN/cuBLAS handles, the primed
        # optimizer state, GradScaler's tensors) is done, and each further iteration is one more
        # eager step (most of a capture's time) whose effects are then undone.
        self.capturer = capturer if capturer is not None else CudaGraphCapturer(warmup=self.CAPTURE_WARMUP)
        self._graphs = GraphCache(max_graphs, repeat=repeat, on_evict=self._evicted, recount_evicted=True)
        self.captures = 0
        self.replays = 0
        self.eager_steps = 0
        self.disabled_reason: str | None = None
        # set when the cache thrashes: signatures without a graph then run eager (see _evicted)
        self.captures_stopped: str | None = None
        self._evictions_before = 0   # evictions before the last release
        self.active = False
        if enabled:
            if not supported:
                self._disable(reason or f"family '{family}' is not declared capturable for training")
            else:
                self.active = True

    def _disable(self, reason: str) -> None:
        if self.disabled_reason is None:
            log.warning("training %s eager, CUDA-graph capture off: %s", self.family, reason)
        self.disabled_reason = reason
        self.active = False
        self._graphs.clear()

    max_graphs = property(lambda self: self._graphs.max_graphs,
                          lambda self, value: setattr(self._graphs, "max_graphs", int(value)))
    repeat = property(lambda self: self._graphs.repeat)

    def _evicted(self, evictions: int) -> None:
        """A capture costs hundreds of steps' worth of host time when it replaces a graph that the
        next batches need again: once as many graphs were evicted as the cache holds (since the
        last release), shapes without a graph train eager, with one log line, and the graphs
        kept go on replaying."""
        n = evictions - self._evictions_before
        if n >= self.max_graphs and self.captures_stopped is None:
            self.captures_stopped = (f"{n} graphs evicted (cap {self.max_graphs}): the batches keep changing "
                                     "shape")
            log.warning("the training step's CUDA-graph cache of %s is thrashing (%s); batch shapes "
                        "without a graph train eager from now on (fix the batch's shapes or raise max_graphs)",
                        self.family, self.captures_stopped)

    def release(self, why: str = "") -> None:
        """Drop the graphs (e.g. at a phase change that alters what the step computes)."""
        if self._graphs:
            log.info("released %d training graph(s)%s", len(self._graphs), f": {why}" if why else "")
        self._graphs.clear()
        self._evictions_before, self.captures_stopped = self._graphs.evictions, None
        reset = getattr(self.capturer, "reset_pool", None)
        if reset is not None:
            reset()

    def _full_step(self, *inputs):
        out = self.step(*inputs)
        self.update()
        return out

    def _eager(self, fn, inputs):
        self.eager_steps += 1
        return fn(*inputs)

    def __call__(self, *inputs: torch.Tensor, whole: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One step. With ``whole=True`` the update runs too (inside the graph once captured)."""
        if whole and self.update is None:
            raise ValueError("whole=True needs the runner to be built with an update callable")
        fn = self._full_step if whole else self.step
        if self.active and not self.capturer.can_capture(inputs[0].device):
            self._disable(f"inputs are on '{inputs[0].device}', CUDA graphs need a CUDA device")
        if not self.active:
            return self._eager(fn, inputs)
        sig = signature("whole" if whole else "step", inputs)
        graph = self._graphs.get(sig)
        if graph is None:
            if self.captures_stopped is not None or not self._graphs.note(sig):
                return self._eager(fn, inputs)
            ensure_grads(self.net)
            tensors = [p.grad for p in self.net.parameters() if p.grad is not None]
            n_state = -1
            if whole and self.state is not None:
                state = [t for t in self.state() if t is not None]
                tensors, n_state = tensors + state, len(state)
            saved = FlatCopy(tensors)
            failure = None
            try:
                t0 = time.perf_counter()
                graph = self.capturer.capture(fn, inputs, module=self.net)
                self.captures += 1
                phases = getattr(graph, "meta", {}).get("phases_ms", {})
                log.info("captured a %s training step for %s in %.0f ms%s",
                         "whole" if whole else "forward+backward", self.family, (time.perf_counter() - t0) * 1e3,
                         " (" + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()) + ")" if phases else "")
            except Exception as exc:  # optional optimization: never fatal
                graph, failure = None, exc
            finally:
                # warm-up (and a failed capture) must leave gradients, weights, optimizer and
                # EMA state exactly as they were
                saved.restore()
            if graph is not None and n_state >= 0 and len([t for t in self.state() if t is not None]) != n_state:
                # the warm-up created state (e.g. lazy optimizer buffers) that cannot be put back
                graph, failure = None, RuntimeError("the update created new state during warm-up; "
                                                    "call prime_optimizer_state(opt) before training")
            if self.agree is not None and not self.agree(graph is not None) and graph is not None:
                graph, failure = None, RuntimeError("the capture failed on another rank (all ranks train eager)")
            if graph is None:
                self._disable(f"capture failed: {type(failure).__name__}: {failure}")
                return self._eager(fn, inputs)
            self._graphs.insert(sig, graph)
        try:
            out = graph.replay(inputs, clone=True)
        except Exception as exc:
            self._disable(f"replay failed: {type(exc).__name__}: {exc}")
            return self._eager(fn, inputs)
        self.replays += 1
        return out

    def info(self) -> dict:
        return {"active": self.active, "captures": self.captures, "replays": self.replays,
                "eager_steps": self.eager_steps, "graphs": len(self._graphs),
                "evictions": self._graphs.evictions, "captures_stopped": self.captures_stopped,
                "disabled_reason": self.disabled_reason}


class GraphedSegment(torch.nn.Module):
    """A front part of a network whose forward AND backward replay CUDA graphs, inside an
    otherwise eager training step (the seam of DESIGN.md, engine contract 1 and 7).

    For families whose full step cannot be one graph (DETR: Hungarian matching on the host, a
    decoder whose token count follows the batch's ground truth), the fixed-shape front part
    (backbone + encoder) is captured with ``torch.cuda.make_graphed_callables``: its graphed
    forward and backward compose with eager autograd around it, so the decoder, matcher and
    loss stay eager and gradients flow through unchanged. One graph pair per input signature
    (shape, dtype, autocast), captured after ``repeat`` repeats, at most ``max_graphs`` kept.
    BatchNorm statistics touched by the warm-up are restored. A failed capture logs one line
    and the segment runs eager from then on. ``module`` is held by reference, never registered
    on the owning network, so checkpoints are unchanged.
    """

    def __init__(self, module: torch.nn.Module, *, name: str = "segment", repeat: int = 3, max_graphs: int = 4):
        super().__init__()
        self.__dict__["inner"] = module   # not a registered submodule (no state-dict keys)
        self.name = name
        self._graphs = GraphCache(max_graphs, repeat=repeat)
        self.captures = 0
        self.replays = 0
        self.disabled_reason: str | None = None

    @staticmethod
    def _capturable(x: torch.Tensor) -> bool:
        return x.device.type == "cuda"

    def forward(self, x: torch.Tensor):
        inner = self.inner
        if self.disabled_reason is not None or not inner.training or not self._capturable(x) \
                or not torch.is_grad_enabled():
            return inner(x)
        sig = signature(self.name, (x,))
        graphed = self._graphs.get(sig)
        if graphed is None:
            if not self._graphs.note(sig):
                return inner(x)
            graphed = self._capture(x)
            if graphed is None:
                return inner(x)
            self._graphs.insert(sig, graphed)
        ensure_grads(self.inner)
        self.replays += 1
        return graphed(x)

    def _capture(self, x: torch.Tensor):
        import inspect

        inner = self.inner
        saved = FlatCopy([b for b in inner.buffers()])
        params = list(inner.parameters())
        old = [p.grad for p in params]
        grads = FlatCopy([g for g in old if g is not None])

        class _Thin(torch.nn.Module):  # a fresh wrapper per signature: its forward gets graphed
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, t):
                return self.m(t)

        kwargs = {}
        if "capture_error_mode" in inspect.signature(torch.cuda.make_graphed_callables).parameters:
            kwargs["capture_error_mode"] = "thread_local"  # a pin-memory thread must not break it
        t0 = time.perf_counter()
        try:
            with CAPTURE_LOCK, no_gc():
                graphed = torch.cuda.make_graphed_callables(_Thin(inner), (x.detach().requires_grad_(x.requires_grad),),
                                                            **kwargs)
        except Exception as exc:  # optional optimization: never fatal
            self.disabled_reason = f"capture failed: {type(exc).__name__}: {exc}"
            log.warning("%s runs eager, CUDA-graph capture off: %s", self.name, self.disabled_reason)
            return None
        finally:
            # warm-up ran forward/backward: undo its BatchNorm and .grad effects
            saved.restore()
            grads.restore()   # into the gradient tensors the parameters had
            for p, g in zip(params, old):
                if p.grad is not g:   # warm-up created (or replaced) a gradient
                    p.grad = g
        self.captures += 1
        log.info("captured %s forward+backward for input %s in %.0f ms", self.name,
                 tuple(x.shape), (time.perf_counter() - t0) * 1e3)
        return graphed

    def info(self) -> dict:
        return {"segment": self.name, "captures": self.captures, "replays": self.replays,
                "graphs": len(self._graphs), "disabled_reason": self.disabled_reason}
