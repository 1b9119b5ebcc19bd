"""Training BatchNorm on CUDA: torch's native kernels against cuDNN's, per dtype and layout.

    PYTHONPATH=. python3 scripts/bn_probe.py [--batch 16] [--imgsz 640] [--json FILE]

For yolo9-t-like activation shapes (the stride-2..32 maps of a 640 frame), one training
BatchNorm forward + backward: ``F.batch_norm`` (torch picks its backend; bf16 never gets cuDNN)
against ``torch.cudnn_batch_norm`` called directly (cuDNN's persistent NHWC kernels on
channels_last input). Reports median ms (CUDA events over 50 runs), whether cuDNN accepted the
dtype, and the largest differences of output, input gradient, weight/bias gradients and running
stats between the two; and whether two cuDNN runs give the same bits.
"""
import argparse
import json

import torch
import torch.nn.functional as F

from libreyolo.benchmark import event_time_call

SHAPES = [(16, 320), (32, 160), (64, 160), (64, 80), (128, 80), (128, 40), (256, 20)]


def timed(fn, runs=50, warmup=10) -> float:
    return event_time_call(fn, runs, warmup)["median_ms"]


def run(kind, x, g, w, b, rm, rv, momentum=0.03, eps=1e-3):
    xi = x.detach().requires_grad_(True)
    wi, bi = w.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    rmi, rvi = rm.clone(), rv.clone()
    if kind == "native":
        y = F.batch_norm(xi, rmi, rvi, wi, bi, True, momentum, eps)
    else:
        y = torch.cudnn_batch_norm(xi, wi, bi, rmi, rvi, True, momentum, eps)[0]
    y.backward(g)
    return y.detach(), xi.grad, wi.grad, bi.grad, rmi, rvi


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for c, s in SHAPES:
            s = s * a.imgsz // 640
            gen = torch.Generator(device=dev).manual_seed(0)
            x = (torch.randn(a.batch, c, s, s, device=dev, generator=gen) * 2 + 0.5).to(dtype)
            x = x.contiguous(memory_format=torch.channels_last)
            g = torch.randn(x.shape, device=dev, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
            w = torch.rand(c, device=dev, generator=gen) + 0.5
            b = torch.randn(c, device=dev, generator=gen) * 0.1
            rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
            row = {"dtype": str(dtype).split(".")[-1], "shape": list(x.shape)}
            row["native_ms"] = timed(lambda: run("native", x, g, w, b, rm, rv))
            try:
                ref = run("native", x, g, w, b, rm, rv)
                got = run("cudnn", x, g, w, b, rm, rv)
                again = run("cudnn", x, g, w, b, rm, rv)
                row["cudnn_ms"] = timed(lambda: run("cudnn", x, g, w, b, rm, rv))
                names = ["y", "dx", "dw", "db", "running_mean", "running_var"]
                row["max_abs_diff"] = {n: float((p.float() - q.float()).abs().max()) for n, p, q in zip(names, ref, got)}
                row["cudnn_same_bits_twice"] = all(torch.equal(p, q) for p, q in zip(got, again))
                row["native_same_bits_twice"] = all(torch.equal(p, q) for p, q in
                                                    zip(ref, run("native", x, g, w, b, rm, rv)))
                row["dx_layout_channels_last"] = bool(got[1].is_contiguous(memory_format=torch.channels_last))
            except Exception as e:  # noqa: BLE001 - the probe reports what cuDNN refused
                row["cudnn_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    tot = {}
    for r in rows:
        d = tot.setdefault(r["dtype"], {"native_ms": 0.0, "cudnn_ms": 0.0})
        d["native_ms"] += r["native_ms"]
        d["cudnn_ms"] += r.get("cudnn_ms", float("nan"))
    out = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "device": torch.cuda.get_device_name(), "batch": a.batch, "imgsz": a.imgsz, "rows": rows, "sum": tot}
    print(json.dumps(tot))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
