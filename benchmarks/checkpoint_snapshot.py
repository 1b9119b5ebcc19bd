"""What an epoch's checkpoint snapshot costs: the training checkpoint of a network (its weights,
the EMA weights, an SGD optimizer's momentum) copied to host memory, the way the trainer's
CheckpointHook does it before handing it to the writer thread.

    PYTHONPATH=. python3 benchmarks/checkpoint_snapshot.py --family yolo9 --size t --channels-last --busy

Arms, side by side in one process (medians of ``--runs`` calls, milliseconds):

* ``per_tensor``: each tensor copied on its own (``.cpu().clone()`` of the two state dicts, then
  ``host_snapshot``'s copy of everything once more: the trainer before the batched copy);
* ``packed``: what the trainer does now on the training thread, ``weights.PackedSnapshot`` of
  the dict of the network's own tensors (a few transfers per dtype, no operator call per tensor);
* ``unpack``: the rest, in the writer thread: the packed buffers split into the checkpoint's tensors;
* each again with a busy Python thread beside it (``--busy``), as the loader's pin-memory thread
  or a plot being drawn would be: the snapshot's operator calls then wait for the GIL.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import threading
import time

import torch


def setup(family: str, size: str, device: str, channels_last: bool):
    from libreyolo import LibreYOLO
    m = LibreYOLO.new(family, size, nc=5, device=device, seed=0)
    net = m.model.train()
    if channels_last:
        net.to(memory_format=torch.channels_last)
    ema = copy.deepcopy(net).eval()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    return m, net, ema, opt


def per_tensor(m, net, ema, opt):
    from libreyolo.weights import host_snapshot
    ck = {"model": {k: v.detach().cpu().clone(memory_format=torch.contiguous_format) for k, v in ema.state_dict().items()},
          "train_state": {"model_raw": {k: v.detach().cpu().clone(memory_format=torch.contiguous_format)
                                        for k, v in net.state_dict().items()}, "optimizer": opt.state_dict()}}
    return host_snapshot(ck)


def packed(m, net, ema, opt):
    from libreyolo.models.base import _weights
    from libreyolo.weights import PackedSnapshot
    ck = m.checkpoint_of(ema, host=False)
    ck["train_state"] = {"model_raw": _weights(net, False), "optimizer": opt.state_dict()}
    return PackedSnapshot(ck, contiguous=("model", "train_state.model_raw"))   # as CheckpointHook




@contextlib.contextmanager
def busy_thread():
    """A Python thread spinning beside the caller for the block (a loader's pin-memory thread,
    the checkpoint writer, a plot being drawn): pure Python, it holds the GIL until the
    interpreter's switch interval each time it gets it."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    th = threading.Thread(target=spin, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def timed(fn, args, runs: int, device: str) -> float:
    fn(*args)
    times = []
    for _ in range(runs):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def parse_args(doc: str | None) -> argparse.Namespace:
    """The options of this benchmark and of capture_restore.py."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="yolo9")
    ap.add_argument("--size", default="t")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--channels-last", action="store_true", help="the network in channels_last (the trainer's CUDA default)")
    ap.add_argument("--busy", action="store_true", help="each arm again beside a busy Python thread")
    ap.add_argument("--json", default=None)
    return ap.parse_args()


def main() -> None:
    a = parse_args(__doc__)
    args = setup(a.family, a.size, a.device, a.channels_last)
    n = sum(len(x) for x in (args[1].state_dict(), args[2].state_dict())) + len(args[3].state_dict()["state"])
    res = {"model": f"{a.family}-{a.size}", "device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu",
           "torch": torch.__version__, "tensors": n, "runs": a.runs, "channels_last": a.channels_last}
    snapshot = packed(*args)   # what the writer thread unpacks
    arms = (("per_tensor", per_tensor), ("packed", packed), ("unpack", lambda *_: snapshot.unpack()))
    run_arms(arms, args, a, res)
    report(res, a.json)


def run_arms(arms, args, a, res: dict) -> None:
    """Each arm's median into ``res`` (``<arm>_ms``), and with ``--busy`` again beside a busy
    thread (``<arm>_busy_ms``)."""
    for name, fn in arms:
        res[f"{name}_ms"] = timed(fn, args, a.runs, a.device)
    if a.busy:
        with busy_thread():
            for name, fn in arms:
                res[f"{name}_busy_ms"] = timed(fn, args, a.runs, a.device)


def report(res: dict, path: str | None) -> None:
    """One JSON line on stdout, and into ``path`` when given."""
    line = json.dumps(res)
    print(line)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
