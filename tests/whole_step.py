"""The whole-step set-up the GPU training tests share (tests/gpu/test_training_gpu.py for the
detection families, tests/gpu/test_tasks_gpu.py for the other tasks): a capturable update around a
net's fwd+bwd step, and step 0 run eager and captured whole from two identically seeded set-ups.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from libreyolo.graphs.training import TrainStepRunner, prime_optimizer_state, scaler_tensors, training_state


class Whole(NamedTuple):
    """A whole-step set-up: the net, its fwd+bwd step, the capturable update, the runner's state
    callable and the GradScaler (None without float16)."""

    net: torch.nn.Module
    step: Callable
    update: Callable
    state: Callable
    scaler: torch.amp.GradScaler | None


def whole_step(net: torch.nn.Module, step: Callable, optim: str = "sgd",
               scaler: torch.amp.GradScaler | None = None) -> Whole:
    """``net`` and its ``step`` with a capturable update: zeroed grads, fused SGD (nesterov) or
    fused capturable AdamW with a tensor lr and primed state, clip + step + zero_grad. With a
    GradScaler (the one ``step`` scales the loss with): unscale, clip, the scaler's step and update,
    and its tensors in the state, as the trainer builds it."""
    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    if optim == "adamw":
        opt = torch.optim.AdamW(params, lr=torch.tensor(1e-3, device="cuda"), weight_decay=0.05, fused=True,
                                capturable=True)
    else:
        opt = torch.optim.SGD(params, lr=torch.tensor(0.01, device="cuda"), momentum=0.9, nesterov=True, fused=True)
    prime_optimizer_state(opt)
    if scaler is not None:
        scaler.scale(torch.zeros((), device="cuda"))   # creates its scale and growth tracker on the device

    def update():
        if scaler is not None:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, max_norm=10.0, foreach=True)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=False)

    def state():
        extra = () if scaler is None else (scaler_tensors(scaler),)
        return training_state(params, opt, net.buffers(), *extra)

    return Whole(net, step, update, state, scaler)


def step0_eager_and_whole(make: Callable[[], Whole], inputs: tuple):
    """Step 0 from two set-ups ``make()`` builds alike (seeded): eager (step, then update), and
    captured whole by a TrainStepRunner (repeat=1: captured and replayed at once).
    -> (eager Whole, its loss, captured Whole, its loss, the runner)."""
    e = make()
    loss_e, _ = e.step(*inputs)
    e.update()
    g = make()
    runner = TrainStepRunner(g.net, g.step, enabled=True, family="test", supported=True, repeat=1,
                             update=g.update, state=g.state)
    loss_g, _ = runner(*inputs, whole=True)
    torch.cuda.synchronize()
    return e, loss_e, g, loss_g, runner
