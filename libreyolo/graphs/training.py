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


class TrainStepRunner:
    """Runs ``loss, items = step(images, targets, mask)`` eager or captured.

    ``step`` must do forward, loss and ``backward()`` and return the detached loss and
    logging items; it must be fixed-shape and free of host syncs to be capturable.
    """

    def __init__(self, net: torch.nn.Module, step: Callable[..., tuple[torch.Tensor, torch.Tensor]], *,
                 enabled: bool, family: str, supported: bool, repeat: int = 3, max_graphs: int = 4,
                 capturer: Any | None = None, reason: str | None = None):
        self.net = net
        self.step = step
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

    def _signature(self, inputs) -> tuple:
        dev = inputs[0].device.type
        ac = torch.is_autocast_enabled(dev if dev in ("cuda", "cpu") else "cuda")
        return (tuple((tuple(x.shape), x.dtype) for x in inputs), ac,
                torch.get_autocast_dtype("cuda") if ac else None)

    def _ensure_grads(self) -> None:
        with torch.no_grad():
            for p in self.net.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.active and not self.capturer.can_capture(inputs[0].device):
            self._disable(f"inputs are on '{inputs[0].device}', CUDA graphs need a CUDA device")
        if not self.active:
            self.eager_steps += 1
            return self.step(*inputs)
        sig = self._signature(inputs)
        graph = self._graphs.get(sig)
        if graph is None:
            self._seen[sig] += 1
            if self._seen[sig] < self.repeat:
                self.eager_steps += 1
                return self.step(*inputs)
            self._ensure_grads()
            with_grad = [p for p in self.net.parameters() if p.grad is not None]
            saved = [p.grad.detach().clone() for p in with_grad]
            try:
                t0 = time.perf_counter()
                graph = self.capturer.capture(self.step, inputs, module=self.net)
                self.captures += 1
                log.info("libreyolo: captured a training step for %s in %.0f ms", self.family,
                         (time.perf_counter() - t0) * 1e3)
            except Exception as exc:  # optional optimization: never fatal
                graph = None
                failure = exc
            finally:
                # warm-up (and a failed capture) must leave the accumulated gradients as they were
                with torch.no_grad():
                    for p, g in zip(with_grad, saved):
                        p.grad.copy_(g)
            if graph is None:
                self._disable(f"capture failed: {type(failure).__name__}: {failure}")
                self.eager_steps += 1
                return self.step(*inputs)
            self._graphs[sig] = graph
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(sig)
        try:
            out = graph.replay(inputs, clone=True)
        except Exception as exc:
            self._disable(f"replay failed: {type(exc).__name__}: {exc}")
            self.eager_steps += 1
            return self.step(*inputs)
        self.replays += 1
        return out

    def info(self) -> dict:
        return {"active": self.active, "captures": self.captures, "replays": self.replays,
                "eager_steps": self.eager_steps, "graphs": len(self._graphs),
                "disabled_reason": self.disabled_reason}
