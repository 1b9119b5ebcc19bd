"""The training loop's reading of the step's loss: :class:`LossFold` folds each step's loss
items into the epoch's mean one step late, so the loop never waits for the step it launched.
"""
from __future__ import annotations

import time
from typing import Any

import torch


class LossFold:
    """An epoch's mean loss items, folded on the host one step late, so that the loop never waits
    for the step it has just launched.

    :meth:`push` takes a step's items (and the progress bar's counts) as device tensors, queues
    their copy into pinned host memory behind the step on its stream and records an event;
    :meth:`fold`, called once the next step is launched, waits for that event - the device is
    then still busy with the next step, and the loader already fetching the one after - and folds
    the values in exactly as a synchronous loop does: ``mloss = (mloss * i + items) / (i + 1)``
    in float32 on the host, so the epoch's mean is the same bit for bit. A non-finite loss is
    counted (``nonfinite``) and the first one named (``first_nonfinite``: epoch, batch, items); it
    makes the epoch's mean non-finite, which the trainer acts on (:meth:`Trainer._check_finite`).

    Timing, for the per-epoch accounting: ``sync_s`` is the host time blocked waiting for a step's
    results; ``device_s`` the steps' spans on the device (CUDA events from before the batch's
    upload to after the step; elsewhere, where the step is synchronous, its host time).
    """

    def __init__(self, n_items: int, device: torch.device, epoch: int):
        self.cuda = device.type == "cuda"
        # the events go on the step's stream (its device's current one, which need not be the
        # current device's: a run on cuda:1 in a process whose current device is cuda:0)
        self.stream = torch.cuda.current_stream(device) if self.cuda else None
        self.epoch = epoch
        self.mloss = torch.zeros(n_items)
        self.pending: list[tuple] = []
        self.counts: dict[str, int] = {}   # the last folded batch's progress-bar fields
        self.nonfinite = 0                  # batches whose loss was not finite
        self.first_nonfinite: str | None = None   # the first of them, named (epoch, batch, items)
        self.sync_s = self.device_s = 0.0

    def start(self) -> Any:
        """Before a step's batch is uploaded: the mark its device span starts from."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(self.stream)
            return ev
        return time.perf_counter()

    def push(self, i: int, start: Any, items: torch.Tensor, counts: dict[str, Any]) -> None:
        """Batch ``i``'s items (float32, on the step's device) and progress fields (device
        scalars or ints), not waited for."""
        if self.cuda:
            host = torch.empty(items.shape, dtype=items.dtype, pin_memory=True)
            host.copy_(items, non_blocking=True)
            fields = {}
            for k, v in counts.items():
                if isinstance(v, torch.Tensor):
                    v = torch.empty(v.shape, dtype=v.dtype, pin_memory=True).copy_(v, non_blocking=True)
                fields[k] = v
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.stream)
        else:   # the step ran synchronously (another accelerator's values are read now, as before)
            host = items.cpu()
            fields = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in counts.items()}
            end = time.perf_counter()
            self.device_s += end - start
        self.pending.append((i, start, end, host, fields))

    def fold(self) -> None:
        """Fold the oldest pushed batch in (waiting for its step to finish on the device)."""
        i, start, end, items, fields = self.pending.pop(0)
        if self.cuda:
            t0 = time.perf_counter()
            end.synchronize()
            self.sync_s += time.perf_counter() - t0
            self.device_s += start.elapsed_time(end) / 1e3
        if not torch.isfinite(items).all():
            self.nonfinite += 1
            if self.first_nonfinite is None:
                self.first_nonfinite = f"non-finite loss at epoch {self.epoch + 1} batch {i}: {items.tolist()}"
        self.mloss = (self.mloss * i + items) / (i + 1)
        self.counts = {k: int(v) for k, v in fields.items()}

    def drain(self) -> None:
        while self.pending:
            self.fold()
