"""Graphed forward time in the contiguous (NCHW) and channels_last (NHWC) layouts (GPU only).

    PYTHONPATH=. python3 scripts/layout_probe.py resnet18:224 yolo9t:640 --out layout.json

For each model:imgsz (untrained, seeded, batch 1 and --batch, fp32 with PyTorch's default TF32
convolutions): the network captured in a CUDA graph in each layout, replays timed (median), and
whether the NHWC replay equals NHWC eager bitwise (the parity contract holds per layout; the two
layouts differ by float rounding, reported as the max relative difference).
"""
from __future__ import annotations

import argparse
import json

import torch

from libreyolo import LibreYOLO
from libreyolo.benchmark import time_call
from libreyolo.graphs.capture import CudaGraphCapturer


def probe(spec: str, batch: int, runs: int) -> dict:
    name, imgsz = spec.split(":")
    model = LibreYOLO(name, device="cuda")
    net = model.model.eval()
    x0 = torch.rand((batch, 3, int(imgsz), int(imgsz)), generator=torch.Generator().manual_seed(0)).cuda()
    out = {"model": name, "imgsz": int(imgsz), "batch": batch}
    ref = None
    for layout, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        net.to(memory_format=fmt)
        x = x0.contiguous(memory_format=fmt)
        with torch.no_grad():
            eager = net(x)
            eager = eager if isinstance(eager, torch.Tensor) else torch.cat([t.flatten() for t in eager if isinstance(t, torch.Tensor)])
            g = CudaGraphCapturer().capture(lambda t: net(t), (x,), module=net)
            rep = g.replay((x,), clone=True)
            rep = rep if isinstance(rep, torch.Tensor) else torch.cat([t.flatten() for t in rep if isinstance(t, torch.Tensor)])
            out[layout] = {"eager_ms": time_call(lambda: net(x), x.device, runs, 20)["median_ms"],
                           "graph_ms": time_call(lambda: g.replay((x,), clone=False), x.device, runs, 20)["median_ms"],
                           "graph_equal_eager": bool(torch.equal(rep, eager))}
        if ref is None:
            ref = eager.float()
        else:
            out["nhwc_vs_nchw_max_rel"] = float((eager.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        g = None  # free the graph before the next layout
    out["graph_speedup_nhwc"] = out["nchw"]["graph_ms"] / out["nhwc"]["graph_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    for spec in a.specs:
        try:
            row = probe(spec, a.batch, a.runs)
        except Exception as e:  # one family's failure must not hide the others' figures
            row = {"model": spec, "error": f"{type(e).__name__}: {e}"[:300]}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
