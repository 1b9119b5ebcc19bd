"""Training-step benchmark: eager vs captured forward+backward vs captured whole step.

    PYTHONPATH=. python3 benchmarks/train_step.py --arm eager --batch 8 --imgsz 640 --amp
    PYTHONPATH=. python3 benchmarks/train_step.py --all --json out.json   # each arm in its own process

One real batch of the task's built-in set (shapes, shapes-cls, shapes-seg, shapes-inst, shapes-pose,
shapes-obb) is replayed; ``--model`` also takes a task variant (``rtmdet-t-seg``). Every arm
runs the same step: forward, the family's loss, backward, gradient clipping, a fused SGD or AdamW
update (``--optim``, default the family's recipe) with a tensor learning rate (capturable) and an
in-place zero_grad. ``eager`` runs it all eagerly,
``fwd_bwd`` replays a graph of forward + loss + backward and runs the update eagerly,
``whole`` replays one graph of the entire step; ``seam`` (set-prediction families) replays
graphs of the backbone+encoder forward and backward, the decoder, matcher and loss eager. ``--amp`` means bfloat16 autocast (no
GradScaler, whose inf check reads a value on the host and so cannot be captured).
Medians over --runs after --warmup, the device synchronized around each step.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import torch

ARMS = ("eager", "fwd_bwd", "whole")
SEAM_ARMS = ("eager", "seam")


DEFAULT_DATA = {"detect": "shapes", "classify": "shapes-cls", "semantic": "shapes-seg", "segment": "shapes-inst",
                "pose": "shapes-pose", "obb": "shapes-obb"}


def run_arm(arm: str, spec: str, batch: int, imgsz: int, amp: bool, runs: int, warmup: int,
            optim: str | None = None, channels_last: bool | None = None, fp16: bool = False, profile: int = 0) -> dict:
    from libreyolo import LibreYOLO
    from libreyolo.benchmark import time_call
    from libreyolo.graphs.training import (
        TrainStepRunner,
        backward_into_grads,
        prime_optimizer_state,
        scaler_tensors,
        training_state,
    )

    if Path(spec).is_file():
        model = LibreYOLO(spec, device="cuda")
    else:
        from libreyolo.models.registry import parse_spec
        cls, size = parse_spec(spec)
        model = cls.new(size, device="cuda", seed=0)
    task = model.task_def
    data = task.resolve_data(DEFAULT_DATA[task.name])
    if data.nc != model.nc:
        model.reset_classes(data.nc, data.names)
    task.prepare_model(model, data)   # pose: the set's keypoint count, as the trainer does
    _, val, collate = task.datasets(data, imgsz, model, task.Options())   # unaugmented: one fixed batch
    imgs, *targets = collate([val[i % len(val)] for i in range(batch)])
    net = model.model.train()
    if channels_last is None:   # as the trainer on CUDA: the family's declaration
        channels_last = bool(model.CHANNELS_LAST)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net.to(memory_format=fmt)
    loss_fn = model.build_loss().cuda()
    params = [p for p in net.parameters() if p.requires_grad]
    optim = (optim or model.train_defaults().get("optimizer", "SGD")).lower()
    if optim == "adamw":
        opt = torch.optim.AdamW(params, lr=torch.tensor(1e-3, device="cuda"), weight_decay=0.05, fused=True, capturable=True)
    else:
        opt = torch.optim.SGD(params, lr=torch.tensor(1e-3, device="cuda"), momentum=0.9, nesterov=True, fused=True)
    prime_optimizer_state(opt)
    x = imgs.cuda().float().div_(255).contiguous(memory_format=fmt)
    targets = [t.cuda() for t in targets]
    prep = model.preprocess
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)   # float16: the trainer's GradScaler, graph-safe when fused
    scaler.scale(torch.zeros((), device="cuda"))
    dtype = torch.float16 if fp16 else torch.bfloat16

    def step(x, *t):
        with torch.autocast("cuda", dtype=dtype, enabled=amp or fp16, cache_enabled=False):
            loss, items = loss_fn(model.train_forward(net, prep.normalize(x), *t), *t)
        backward_into_grads(scaler.scale(loss), params)   # as the trainer's step
        return loss.detach(), items.detach()

    def update():
        if fp16:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, max_norm=10.0, foreach=True)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)

    def state():
        return training_state(params, opt, net.buffers(), scaler_tensors(scaler))

    seg = None
    if arm == "seam":
        from libreyolo.graphs.training import GraphedSegment
        seg = GraphedSegment(model.train_seam(net), name="backbone+encoder", repeat=1)
        model.set_train_seam(net, seg)
    runner = TrainStepRunner(net, step, enabled=arm in ("fwd_bwd", "whole"), family=model.FAMILY, supported=True,
                             repeat=1, update=update, state=state)
    opt.zero_grad(set_to_none=False)

    def one():
        if arm == "whole":
            runner(x, *targets, whole=True)
        else:
            runner(x, *targets)
            update()

    timing = time_call(one, torch.device("cuda"), runs, warmup)
    res = {"arm": arm, "optimizer": optim, "channels_last": channels_last, "median_ms": timing["median_ms"], "min_ms": timing["min_ms"], "runs": runs,
           "runner": runner.info() if seg is None else seg.info()}
    if profile:
        res["profile"] = kernel_profile(one, profile)
    return res


#: kernel-name fragments -> the groups of --profile's summary (first match wins)
KERNEL_GROUPS = (("nchwToNhwc", "layout"), ("nhwcToNchw", "layout"),   # cuDNN's own, before "cudnn"
                 ("batch_norm", "batchnorm"), ("bn_", "batchnorm"), ("conv", "convolution"), ("xmma", "convolution"),
                 ("cudnn", "convolution"), ("gemm", "gemm"), ("sm90", "gemm"), ("multi_tensor", "foreach"),
                 ("foreach", "foreach"), ("fused_sgd", "optimizer"), ("fused_adam", "optimizer"),
                 ("reduce", "reduction"), ("elementwise", "elementwise"),
                 ("copy", "copy"), ("sort", "sort/topk"), ("topk", "sort/topk"), ("scatter", "index"), ("gather", "index"),
                 ("index", "index"))


def kernel_profile(one, steps: int, top: int = 30) -> dict:
    """torch.profiler over ``steps`` calls of ``one``: the kernels per step, their summed time
    against the steps' wall (the rest: the device idle between kernels, launch-bound), and the
    kernels by group and the ``top`` by time (ms per step)."""
    import time

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            one()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]

    def ms(e) -> float:   # torch >= 2.4 names it device_time_total (us), older ones cuda_time_total
        return getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)

    groups: dict[str, list[float]] = {}
    for e in kernels:
        name = e.key.lower()
        group = next((g for frag, g in KERNEL_GROUPS if frag.lower() in name), "other")
        acc = groups.setdefault(group, [0.0, 0.0])
        acc[0] += ms(e) / 1e3 / steps
        acc[1] += e.count / steps
    kernels.sort(key=ms, reverse=True)
    return {"steps": steps, "wall_ms_per_step": wall * 1e3 / steps,
            "kernel_ms_per_step": sum(ms(e) for e in kernels) / 1e3 / steps,
            "kernels_per_step": sum(e.count for e in kernels) / steps,
            "groups": {g: {"ms": round(v[0], 3), "kernels": round(v[1], 1)}
                       for g, v in sorted(groups.items(), key=lambda kv: -kv[1][0])},
            "top": [{"kernel": e.key[:120], "ms": round(ms(e) / 1e3 / steps, 3), "per_step": e.count / steps}
                    for e in kernels[:top]]}


def run_in_processes(script: str, arms, args: list[str], error_lines: int = 1) -> dict:
    """Run ``script --arm <arm> *args`` once per arm, each in its own process; the last stdout
    line of each is its JSON result (or an ``error`` entry with the last stderr lines)."""
    out = {}
    for arm in arms:
        proc = subprocess.run([sys.executable, script, "--arm", arm, *args], capture_output=True, text=True)
        if proc.returncode != 0:
            out[arm] = {"arm": arm, "error": proc.stderr.strip().splitlines()[-error_lines:] or ["failed"]}
        else:
            out[arm] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def layout(a) -> bool | None:
    """--channels-last / --contiguous -> True / False; neither: None (the family's declaration)."""
    if a.channels_last and a.contiguous:
        raise SystemExit("--channels-last and --contiguous exclude each other")
    return True if a.channels_last else False if a.contiguous else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", choices=ARMS + ("seam",), default="eager")
    ap.add_argument("--model", default="yolo9t", help="family+size (untrained) or a checkpoint path")
    ap.add_argument("--all", action="store_true", help="run every arm, each in its own process")
    ap.add_argument("--arms", default=None, help="default: eager,fwd_bwd,whole (eager,seam for DETRs)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    ap.add_argument("--fp16", action="store_true", help="float16 autocast + GradScaler (instead of --amp)")
    ap.add_argument("--channels-last", action="store_true", help="network and input in channels_last "
                    "(default: the family's CHANNELS_LAST, as the trainer runs on CUDA)")
    ap.add_argument("--contiguous", action="store_true", help="network and input contiguous (NCHW) whatever the family declares")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--optim", choices=("sgd", "adamw"), default=None, help="default: the family's recipe")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark: cuDNN times its algorithms per shape and keeps the fastest")
    ap.add_argument("--profile", type=int, default=0, help="torch.profiler over N more steps: kernels per step, "
                                                            "their time against the wall, the top kernels")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    if not a.all:
        print(json.dumps(run_arm(a.arm, a.model, a.batch, a.imgsz, a.amp, a.runs, a.warmup, a.optim,
                                    layout(a), a.fp16, a.profile)))
        return
    if a.arms is None:
        from libreyolo.models.base import Model
        from libreyolo.models.registry import parse_spec
        has_seam = parse_spec(a.model)[0].train_seam is not Model.train_seam
        a.arms = ",".join(SEAM_ARMS if has_seam else ARMS)
    arms = run_in_processes(__file__, a.arms.split(","),
                            ["--model", a.model, "--batch", str(a.batch), "--imgsz", str(a.imgsz), "--runs",
                             str(a.runs), "--warmup", str(a.warmup)] + (["--amp"] if a.amp else [])
                            + (["--optim", a.optim] if a.optim else [])
                            + (["--channels-last"] if a.channels_last else []) + (["--contiguous"] if a.contiguous else [])
                            + (["--fp16"] if a.fp16 else [])
                            + (["--cudnn-benchmark"] if a.cudnn_benchmark else [])
                            + (["--profile", str(a.profile)] if a.profile else []))
    res = {"model": a.model, "batch": a.batch, "imgsz": a.imgsz, "amp": "fp16" if a.fp16 else "bf16" if a.amp else False,
           "channels_last": layout(a), "cudnn_benchmark": a.cudnn_benchmark, "arms": arms,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": dt.date.today().isoformat()}
    eager = arms.get("eager", {}).get("median_ms")
    for arm in arms:
        if arm != "eager" and eager and "median_ms" in arms[arm]:
            res[f"speedup_{arm}"] = eager / arms[arm]["median_ms"]
    print(json.dumps(res, indent=2))
    if a.json:
        from libreyolo.benchmark import write_json
        write_json(res, a.json)


if __name__ == "__main__":
    main()
