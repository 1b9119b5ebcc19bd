"""Validation's device stage: the network and the evaluator's on-device part on fixed-shape batches,
run eager or replayed from a CUDA graph.

The stage of one validation batch is ``evaluator.finish(model.infer(x))`` on the normalized
batch ``x`` - what predict's captured stage is for inference (network + the task's device
post-processing), with the evaluator's :meth:`~libreyolo.tasks.base.Evaluator.finish` as the
post-processing (detection: the top candidates per image and, on CUDA with Triton, predict's
fixed-shape NMS; the matching follows on the host). Every batch has one shape: a last partial
batch is padded with zero images up to the fixed batch (the validation batch, or the whole split
when it is smaller) and the padding's outputs are dropped - eager and graph run the very same
shapes, so a replay computes what eager computes, bit for bit, and one graph serves the whole split.

With graphs on, the stage goes through a :class:`~libreyolo.graphs.runner.GraphRunner` of its own
over the evaluated network, built with ``watch_versions=False``: training updates that network
(the EMA copy) in place between epochs, and a graph reads its weights by address, so the next
epoch's replays see the new weights without a new capture. Moving or replacing the network's
tensors still releases the graph (the runner's address check).

The validation loss needs the network's own eval-mode output (``Model.val_loss_outputs``); the
stage returns it beside its outputs when asked (recorded by a forward hook while the stage runs).
For a padded batch the loss takes it from an eager pass over the real images instead, so that
no output tree has to be cut at the batch size.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..graphs.runner import GraphRunner

log = logging.getLogger(__name__)


def graph_validation(model, cuda_graph: bool, device: torch.device, capturer: Any) -> tuple[bool, str]:
    """(whether validation goes through graphs, why not if it does not) for ``model`` on ``device``.
    ``capturer``: the capturer the stage would use (None: CUDA graphs)."""
    if not cuda_graph:
        return False, "cuda_graph is off"
    if not model.SUPPORTS_CUDA_GRAPH:
        return False, f"the {model.FAMILY} family is not declared capturable (SUPPORTS_CUDA_GRAPH)"
    if model.PREDICT_SEAM:
        return False, f"the {model.FAMILY} family's predict stage has a seam (PREDICT_SEAM)"
    if capturer is None:
        if device.type != "cuda" or not torch.cuda.is_available():
            return False, f"the run is on '{device}', CUDA graphs need a CUDA device"
    elif not capturer.can_capture(device):
        return False, f"the capturer cannot capture on '{device}'"
    return True, ""


def _layout(x: torch.Tensor) -> torch.memory_format:
    """The memory format ``x`` is in (channels_last batches stay channels_last when padded)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


class ValidationStage:
    """The device stage of validation for one network (see the module docstring).

    ``batch``: the fixed batch every call is padded to; ``graphs``: replay a captured stage
    (``capturer``: how it is captured, None for CUDA graphs) instead of running it eager.
    """

    def __init__(self, model, net: nn.Module, batch: int, graphs: bool, capturer: Any = None):
        self.model, self.net, self.batch = model, net, int(batch)
        self.infer = model.infer_with(net)
        self.evaluator = None
        self.with_raw = False
        self.recorded: list = []
        self.runner = None
        if graphs:
            # "auto" with capture_after=1: captured at the first batch; a failed capture runs the
            # stage eager from then on (the runner logs why) instead of stopping the training
            self.runner = GraphRunner(net, model.FAMILY, model.SUPPORTS_CUDA_GRAPH, capturer=capturer,
                                      max_graphs=4, capture_after=1, watch_versions=False)

    def _stage(self, x: torch.Tensor):
        """The captured function: stage outputs and, with ``with_raw``, the network's output."""
        self.recorded.clear()
        out = self.evaluator.finish(self.infer(x))
        return out, (self.recorded[-1] if self.with_raw else None)

    def record(self, _module, _inputs, output) -> None:
        """Forward hook on :attr:`net`: keeps the network's output of the current pass."""
        self.recorded.append(output)

    def __call__(self, x: torch.Tensor, evaluator, with_raw: bool) -> tuple[Any, Any]:
        """The stage on ``x`` (at most :attr:`batch` images): (outputs of its images, the
        network's output on them when ``with_raw``, else None). Call with :meth:`record`
        registered as a forward hook on the network when ``with_raw``."""
        n = int(x.shape[0])
        if n > self.batch:
            raise ValueError(f"validation batch of {n} images, the stage's fixed batch is {self.batch}")
        self.evaluator, self.with_raw = evaluator, bool(with_raw)
        xp = x
        if n < self.batch:   # zero images up to the fixed batch: one shape for every batch
            pad = x.new_zeros((self.batch - n, *x.shape[1:]))
            xp = torch.cat([x, pad]).contiguous(memory_format=_layout(x))
        if self.runner is None:
            out, raw = self._stage(xp)
        else:
            key = ("val", type(evaluator).__qualname__, evaluator.stage_tag, self.with_raw)
            out, raw = self.runner(key, self._stage, (xp,), mode="auto")
        if n < self.batch:
            out = tree_map(lambda t: t[:n] if isinstance(t, torch.Tensor) else t, out)
            if with_raw:   # the loss's input from the real images alone (eager, as without padding)
                self.recorded.clear()
                self.infer(x)
                raw = self.recorded[-1]
        return out, raw

    def info(self) -> dict | None:
        """The runner's statistics (None without graphs)."""
        return None if self.runner is None else self.runner.info()
