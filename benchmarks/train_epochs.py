"""Whole-run benchmark: the same training run eager and with ``cuda_graph=True``.

    PYTHONPATH=. python3 benchmarks/train_epochs.py --epochs 20 --imgsz 320 --batch 16 --json out.json

Each arm is its own process (same seed, same data, same settings); the figure is the wall
time of ``model.train`` (data loading, training, per-epoch validation and checkpoints all
included) and the final mAP, with per epoch: the training loop, the part of it spent waiting for
the loader, validation, and what is left around them (overhead). Built-in shapes dataset (or,
with ``--n-train 2000``, a bigger generated one); an untrained yolo9-t by default.

The loop does not wait for each step (it reads a step's loss one step late), so the host's
times and the device's differ; per epoch, from ``results.csv``'s columns:
``loader_wait_s`` the host blocked in ``next(loader)`` (time/loader_wait_s; while it waits the
device may still run the previous step), ``sync_wait_s`` the host blocked on the device
(time/sync_wait_s: waiting for a step's loss), ``step_device_s`` the steps' spans on the device
(time/step_device_s, CUDA events from the batch's upload to the step's end; on the CPU the
step's host time). ``step_ms_mean`` is step_device_s per step; ``device_idle_s`` is the epoch
less the steps' spans: the time the device had no step to run (a loader wait the previous step
did not hide, host work between steps).

``--gpu-augment`` adds the arms ``eager+gpu_augment`` and ``graph+gpu_augment``: the same runs with
``gpu_augment=True`` (workers only decode and letterbox; mosaic, affine, HSV and flip run on the
GPU per batch), reporting besides the loader wait the mean time of the augmentation call
(``augment_ms_mean``: it ends with its one host read, so it spans its GPU work). ``--arms``
picks a subset, e.g. ``--arms graph,graph+gpu_augment``.

``+sync_loop`` on an arm (``--arms graph,graph+sync_loop``) runs the loop as it was before it went
asynchronous: each step's loss read at once (``loss_lag=0``, a device sync per step) and
each epoch's loader started at the epoch, not during the previous one's validation
(``prefetch_next_epoch=False``); the numbers are the same, the times are the comparison.
``+switch`` runs with ``switch_interval=0.0005`` (the thread switch interval: how soon the
loop gets the GIL back from the checkpoint writer and the plotter), ``+nofreeze`` with
``freeze_heap=False`` (the garbage collector's full collections walk the whole heap,
as by Python's default), ``+overlap`` with ``join_write_before_validation=False``
(the previous checkpoint write overlaps validation); each arm also reports train()'s ``timing`` (set-up, epochs, validation, checkpoint
waits, the epochs' ends, the end).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
import time

ARMS = ("eager", "graph")
GPU_AUGMENT = "+gpu_augment"
SYNC_LOOP = "+sync_loop"
#: levers of the epoch's host side, measured before they become defaults (the ``tune`` options):
#: a 0.5 ms thread switch interval, the checkpoint write overlapping validation
SWITCH = "+switch"
OVERLAP = "+overlap"
#: the garbage collector's default behaviour: the heap not frozen for the run (freeze_heap=False)
NOFREEZE = "+nofreeze"


def run_arm(arm: str, a) -> dict:
    from libreyolo.models.registry import parse_spec

    base, *mods = arm.split("+")
    unknown = set(mods) - {m[1:] for m in (GPU_AUGMENT, SYNC_LOOP, SWITCH, OVERLAP, NOFREEZE)}
    if base not in ARMS or unknown:
        raise SystemExit(f"unknown arm {arm!r}: {'/'.join(ARMS)} with any of +gpu_augment, +sync_loop, "
                         "+switch, +overlap")
    gpu_augment, sync_loop = GPU_AUGMENT[1:] in mods, SYNC_LOOP[1:] in mods
    tune: dict = {}   # the arm's tune options
    if sync_loop:
        tune.update(loss_lag=0, prefetch_next_epoch=False)
    if SWITCH[1:] in mods:
        tune["switch_interval"] = 0.0005
    if OVERLAP[1:] in mods:
        tune["join_write_before_validation"] = False
    if NOFREEZE[1:] in mods:
        tune["freeze_heap"] = False
    timed: list[float] = []
    if gpu_augment:   # time each augmentation call (it ends with its one host read of the batch)
        from libreyolo.data.gpu_augment import DeviceAugment
        real = DeviceAugment.__call__

        def call(self, *batch):
            t = time.perf_counter()
            out = real(self, *batch)
            timed.append(time.perf_counter() - t)
            return out

        DeviceAugment.__call__ = call
    cls, size = parse_spec(a.model)
    if base == "graph":
        cls.SUPPORTS_CUDA_GRAPH_TRAIN = cls.SUPPORTS_CUDA_GRAPH_TRAIN or a.force
    model = cls.new(size, device=a.device, seed=0)
    data = "shapes"
    if a.n_train:   # the bigger built-in set, so that start-up does not dominate
        from libreyolo.data.synthetic import make_shapes_dataset
        data = str(make_shapes_dataset(n_train=a.n_train, n_val=max(64, a.n_train // 10), imgsz=a.data_imgsz))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = model.train(data=data, epochs=a.epochs, batch=a.batch, imgsz=a.imgsz, workers=a.workers,
                          amp=a.amp, cuda_graph=base == "graph", project=tmp, plots=False, verbose=False, seed=0,
                          cache=a.cache, gpu_augment=gpu_augment, **tune)
        wall = time.perf_counter() - t0
    hist = res["history"]
    nb = res["cuda_graph"].get("replays", 0) + res["cuda_graph"].get("eager_steps", 0)
    per_epoch = {
        "train_s": [h["time/epoch_s"] for h in hist],
        "loader_wait_s": [h["time/loader_wait_s"] for h in hist],
        "sync_wait_s": [h["time/sync_wait_s"] for h in hist],
        "step_device_s": [h["time/step_device_s"] for h in hist],
        "val_s": [h["time/val_s"] for h in hist],
    }
    loop = sum(per_epoch["train_s"]) + sum(per_epoch["val_s"])
    device = sum(per_epoch["step_device_s"])
    return {"arm": arm, "wall_s": wall, "map50": res["map50"], "map50_95": res["map50_95"],
            "losses_last": res["losses"][-1], "cuda_graph": res["cuda_graph"], "per_epoch": per_epoch,
            "step_ms_mean": 1e3 * device / max(1, nb),
            "loader_wait_share": sum(per_epoch["loader_wait_s"]) / max(1e-9, sum(per_epoch["train_s"])),
            "device_idle_s": sum(per_epoch["train_s"]) - device,
            "overhead_s": wall - loop, "timing": res["timing"], "gpu_augment": gpu_augment, "sync_loop": sync_loop,
            "augment_ms_mean": 1e3 * sum(timed) / len(timed) if timed else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", help="one arm, in this process (eager / graph, with +gpu_augment, +sync_loop)")
    ap.add_argument("--gpu-augment", action="store_true", help="also run each arm with gpu_augment=True")
    ap.add_argument("--arms", default=None, help="comma-separated arms (default: eager,graph and, with "
                                                 "--gpu-augment, eager+gpu_augment,graph+gpu_augment)")
    ap.add_argument("--model", default="yolo9t")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--amp", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n-train", type=int, default=0, help="generate a shapes set of this many training images")
    ap.add_argument("--data-imgsz", type=int, default=640, help="long side of the generated set's images")
    ap.add_argument("--cache", default="auto", help="ram, disk, auto (the library's default) or false")
    ap.add_argument("--force", action="store_true", help="declare the family train-capturable for this run")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.arm:
        print(json.dumps(run_arm(a.arm, a)))
        return
    import torch
    from train_step import run_in_processes  # this folder is on sys.path when run as a script
    names = a.arms.split(",") if a.arms else [*ARMS, *((f"{x}{GPU_AUGMENT}" for x in ARMS) if a.gpu_augment else ())]
    arms = run_in_processes(__file__, names, [f"--{k}={v}" for k, v in
                            (("model", a.model), ("epochs", a.epochs), ("batch", a.batch), ("imgsz", a.imgsz),
                             ("workers", a.workers), ("amp", a.amp), ("device", a.device), ("n-train", a.n_train),
                             ("data-imgsz", a.data_imgsz), ("cache", a.cache))]
                            + (["--force"] if a.force else []), error_lines=3)
    res = {"model": a.model, "epochs": a.epochs, "batch": a.batch, "imgsz": a.imgsz, "amp": a.amp, "arms": arms,
           "device": torch.cuda.get_device_name(0) if a.device == "cuda" else a.device, "torch": torch.__version__, "date": dt.date.today().isoformat()}
    def ratio(slow: str, fast: str):
        if "wall_s" in arms.get(slow, {}) and "wall_s" in arms.get(fast, {}):
            return arms[slow]["wall_s"] / arms[fast]["wall_s"]
        return None

    res["speedup"] = ratio("eager", "graph")
    res["speedup_gpu_augment"] = {x: ratio(x, f"{x}{GPU_AUGMENT}") for x in ARMS}
    res["speedup_async_loop"] = {x: ratio(f"{x}{SYNC_LOOP}", x) for x in ARMS}   # the loop as it is vs +sync_loop
    print(json.dumps(res, indent=2))
    if a.json:
        from libreyolo.benchmark import write_json
        write_json(res, a.json)


if __name__ == "__main__":
    main()
