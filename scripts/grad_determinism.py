"""Which parameters' gradients differ between identical eager training steps (GPU only).

    PYTHONPATH=. python3 scripts/grad_determinism.py segformer b0 --runs 3 --out det.json
    PYTHONPATH=. python3 scripts/grad_determinism.py segformer b0 --upsample torch --sdpa math

From one seeded network and one batch of the task's built-in set, forward + loss + backward runs
``--runs`` times under cuDNN's deterministic kernels; per dtype (fp32, bf16 autocast) it reports
whether the losses and every gradient were the same bits, the largest gradient gap and the first
parameters (in module order, deepest first being where a backward starts) whose gradients differ,
plus the ops torch's deterministic-algorithms check names in that step (warn_only). It then times
the step (median ms). ``--upsample torch`` swaps SegFormer's deterministic bilinear backward
(``ops.interpolate.resize_bilinear``) back to ``F.interpolate``'s; ``--sdpa`` pins
``scaled_dot_product_attention`` to one backend."""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from libreyolo import LibreYOLO

DATA = {"classify": "shapes-cls", "semantic": "shapes-seg"}


def torch_upsample(x, size):
    return F.interpolate(x, size=(int(size[0]), int(size[1])), mode="bilinear", align_corners=False)


def sdpa_context(name: str):
    if name == "default":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("family")
    ap.add_argument("size")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--upsample", choices=("det", "torch"), default="det")
    ap.add_argument("--sdpa", choices=("default", "math", "efficient", "flash", "cudnn"), default="default")
    ap.add_argument("--time-runs", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.upsample == "torch":
        import libreyolo.models.segformer.nn as seg
        seg.resize_bilinear = torch_upsample
    model = LibreYOLO.new(a.family, a.size, device=a.device, seed=0)
    task = model.task_def
    data = task.resolve_data(DATA[task.name])
    _, val, collate = task.datasets(data, a.imgsz, model, task.Options())
    model = LibreYOLO.new(a.family, a.size, device=a.device, seed=0, nc=data.nc)
    imgs, *targets = collate([val[j] for j in range(a.batch)])
    x = imgs.to(a.device).float().div_(255)
    targets = [t.to(a.device) for t in targets]
    net = model.model.train()
    loss_fn = model.build_loss().to(a.device)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    names = [n for n, p in net.named_parameters() if p.requires_grad]
    report = {"model": f"{a.family}-{a.size}", "upsample": a.upsample, "sdpa": a.sdpa, "imgsz": a.imgsz,
              "batch": a.batch, "torch": torch.__version__, "device": torch.cuda.get_device_name() if a.device == "cuda" else a.device}

    def sync():
        if x.is_cuda:
            torch.cuda.synchronize()

    def step(amp):
        net.load_state_dict(start)
        for p in net.parameters():
            p.grad = None
        torch.manual_seed(0)
        with sdpa_context(a.sdpa), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            loss, _ = loss_fn(model.train_forward(net, model.preprocess.normalize(x), *targets), *targets)
        with sdpa_context(a.sdpa):
            loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in net.parameters() if p.requires_grad]

    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                    allow_tf32=torch.backends.cudnn.allow_tf32):
        for amp in (False, True):
            key = "bf16" if amp else "fp32"
            torch.use_deterministic_algorithms(True, warn_only=True)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step(amp)
            torch.use_deterministic_algorithms(False)
            ops = sorted({str(w.message).split(" does not have a deterministic")[0][:160] for w in caught
                          if "determinis" in str(w.message)})
            runs = [step(amp) for _ in range(a.runs)]
            sync()
            diff = {}
            for i, n in enumerate(names):
                gap = max((r[1][i] - runs[0][1][i]).abs().max().item() for r in runs[1:])
                if gap > 0:
                    diff[n] = gap
            ms = []
            for _ in range(a.time_runs):
                sync()
                t0 = time.perf_counter()
                step(amp)
                sync()
                ms.append((time.perf_counter() - t0) * 1e3)
            report[key] = {
                "losses_equal": all(torch.equal(r[0], runs[0][0]) for r in runs[1:]),
                "grads_equal": not diff, "params_differing": len(diff), "params": len(names),
                "largest_gap": max(diff.values(), default=0.0),
                "last_differing": list(diff.items())[-8:],   # the backward reaches these first
                "nondeterministic_ops_reported": ops, "step_ms_median": statistics.median(ms),
            }
            print(key, json.dumps(report[key], indent=1), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
