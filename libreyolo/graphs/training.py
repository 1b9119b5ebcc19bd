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
graph-safe (a fused optimizer with a tensor learning rate, no GradScaler, an EMA driven by
a device-side counter); the trainer only asks for it then. Warm-up runs the update too, so
every mutable tensor the caller lists through ``state`` (parameters, gradients, optimizer
buffers, EMA) is restored after capture: the captured run starts from the same state.

Failure policy: on the CPU, for a family not declared capturable, or when a capture or a
replay raises, one line is logged and the run continues eager; nothing is lost, because a
failed capture never touched the parameters and a replay that raised is redone eager.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from typing import Any, Callable

import torch

from .capture import CudaGraphCapturer

log = logging.getLogger("libreyolo")


def prime_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create an SGD optimizer's momentum buffers now (zeros) instead of at its first step.

    A whole-step capture must find every tensor the update writes already allocated, so
    that warm-up can be undone and the graph writes to tensors the optimizer keeps. SGD
    creates its momentum buffer lazily as a copy of the first gradient; a zero buffer gives
    the same first step bit for bit (``0 * momentum + grad == grad``). Other optimizers are
    left alone (the trainer captures whole steps for SGD only).
    """
    if not isinstance(opt, torch.optim.SGD):
        return
    for group in opt.param_groups:
        if not group.get("momentum"):
            continue
        for p in group["params"]:
            st = opt.state[p]
            if st.get("momentum_buffer") is None:
                st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class TrainStepRunner:
    """Runs ``loss, items = step(images, targets, mask)`` eager or captured.

    ``step`` must do forward, loss and ``backward()`` and return the detached loss and
    logging items; it must be fixed-shape and free of host syncs to be capturable.
    """

    def __init__(self, net: torch.nn.Module, step: Callable[..., tuple[torch.Tensor, torch.Tensor]], *,
                 enabled: bool, family: str, supported: bool, repeat: int = 3, max_graphs: int = 4,
                 capturer: Any | None = None, reason: str | None = None,
                 update: Callable[[], None] | None = None,
                 state: Callable[[], list[torch.Tensor]] | None = None):
        self.net = net
        self.step = step
        self.update = update
        self.state = state
        self.family = family
        self.repeat = max(1, repeat)
        self.max_graphs = max_graphs
        self.capturer = capturer if capturer is not None else CudaGraphCapturer(warmup=3)
        self._graphs: OrderedDict[tuple, Any] = OrderedDict()
        self._seen: Counter = Counter()
        self.captures = 0
        self.replays = 0
        self.eager_steps = 0
        self.disabled_reason: str | None = None
        self.active = False
        if enabled:
            if not supported:
                self._disable(reason or f"family '{family}' is not declared capturable for training")
            else:
                self.active = True

    def _disable(self, reason: str) -> None:
        if self.disabled_reason is None:
            log.warning("libreyolo: training %s eager, CUDA-graph capture off: %s", self.family, reason)
        self.disabled_reason = reason
        self.active = False
        self._graphs.clear()

    def release(self, why: str = "") -> None:
        """Drop the graphs (e.g. at a phase change that alters what the step computes)."""
        if self._graphs:
            log.info("libreyolo: released %d training graph(s)%s", len(self._graphs), f": {why}" if why else "")
        self._graphs.clear()
        self._seen.clear()
        reset = getattr(self.capturer, "reset_pool", None)
        if reset is not None:
            reset()

    def _signature(self, inputs, whole: bool) -> tuple:
        dev = inputs[0].device.type
        ac = torch.is_autocast_enabled(dev if dev in ("cuda", "cpu") else "cuda")
        return (tuple((tuple(x.shape), x.dtype) for x in inputs), ac,
                torch.get_autocast_dtype("cuda") if ac else None, whole)

    def _full_step(self, *inputs):
        out = self.step(*inputs)
        self.update()
        return out

    def _eager(self, fn, inputs):
        self.eager_steps += 1
        return fn(*inputs)

    def _ensure_grads(self) -> None:
        with torch.no_grad():
            for p in self.net.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)

    def __call__(self, *inputs: torch.Tensor, whole: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One step. With ``whole=True`` the update runs too (inside the graph once captured)."""
        if whole and self.update is None:
            raise ValueError("whole=True needs the runner to be built with an update callable")
        fn = self._full_step if whole else self.step
        if self.active and not self.capturer.can_capture(inputs[0].device):
            self._disable(f"inputs are on '{inputs[0].device}', CUDA graphs need a CUDA device")
        if not self.active:
            return self._eager(fn, inputs)
        sig = self._signature(inputs, whole)
        graph = self._graphs.get(sig)
        if graph is None:
            self._seen[sig] += 1
            if self._seen[sig] < self.repeat:
                return self._eager(fn, inputs)
            self._ensure_grads()
            tensors = [p.grad for p in self.net.parameters() if p.grad is not None]
            n_state = -1
            if whole and self.state is not None:
                state = [t for t in self.state() if t is not None]
                tensors, n_state = tensors + state, len(state)
            saved = [t.detach().clone() for t in tensors]
            failure = None
            try:
                t0 = time.perf_counter()
                graph = self.capturer.capture(fn, inputs, module=self.net)
                self.captures += 1
                log.info("libreyolo: captured a %s training step for %s in %.0f ms",
                         "whole" if whole else "forward+backward", self.family, (time.perf_counter() - t0) * 1e3)
            except Exception as exc:  # optional optimization: never fatal
                graph, failure = None, exc
            finally:
                # warm-up (and a failed capture) must leave gradients, weights, optimizer and
                # EMA state exactly as they were
                with torch.no_grad():
                    for t, v in zip(tensors, saved):
                        t.copy_(v)
            if graph is not None and n_state >= 0 and len([t for t in self.state() if t is not None]) != n_state:
                # the warm-up created state (e.g. lazy optimizer buffers) that cannot be put back
                graph, failure = None, RuntimeError("the update created new state during warm-up; "
                                                    "call prime_optimizer_state(opt) before training")
            if graph is None:
                self._disable(f"capture failed: {type(failure).__name__}: {failure}")
                return self._eager(fn, inputs)
            self._graphs[sig] = graph
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(sig)
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
                "disabled_reason": self.disabled_reason}
