"""What a training capture's bookkeeping costs: before the warm-up the runner copies every
tensor the warm-up may write (the gradients, the parameters, the optimizer's momentum, the EMA
weights: the whole step's state), and puts them back after the capture; the capturer does the
same for the BatchNorm buffers.

    PYTHONPATH=. python3 benchmarks/capture_restore.py --channels-last --busy

Arms, side by side in one process (medians of ``--runs`` copy + restore round trips, ms):

* ``per_tensor``: a clone per tensor and a ``copy_`` back per tensor (the runner before);
* ``flat``: :class:`libreyolo.graphs.capture.FlatCopy` (one concatenation per device and dtype,
  one split and one ``torch._foreach_copy_`` back);
* each again beside a busy Python thread (``--busy``; the checkpoint writer or a loader's
  pin-memory thread in a run): every operator call gives up the GIL and waits to get it back.
"""
from __future__ import annotations

import sys

import torch
from checkpoint_snapshot import parse_args, report, run_arms, setup


def whole_step_state(net, ema, opt) -> list[torch.Tensor]:
    """The tensors TrainStepRunner copies for a whole step: gradients, then parameters,
    optimizer state and EMA tensors (as the trainer's ``mutable_state``)."""
    params = list(net.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [p.grad for p in params] + params + state + list(ema.state_dict().values())


def per_tensor(tensors) -> None:
    saved = [t.detach().clone() for t in tensors]
    with torch.no_grad():
        for t, v in zip(tensors, saved):
            t.copy_(v)


def flat(tensors) -> None:
    from libreyolo.graphs.capture import FlatCopy
    FlatCopy(tensors).restore()


def main() -> None:
    a = parse_args(__doc__)
    _, net, ema, opt = setup(a.family, a.size, a.device, a.channels_last)
    tensors = whole_step_state(net, ema, opt)
    before = [t.detach().clone() for t in tensors]
    res = {"model": f"{a.family}-{a.size}", "device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu",
           "torch": torch.__version__, "tensors": len(tensors), "runs": a.runs, "channels_last": a.channels_last}
    arms = (("per_tensor", per_tensor), ("flat", flat))
    run_arms(arms, (tensors,), a, res)
    # the round trips put back what they copied: the state is what it was
    res["state_unchanged"] = all(torch.equal(t, b) for t, b in zip(tensors, before))
    report(res, a.json)


if __name__ == "__main__":
    sys.exit(main())
