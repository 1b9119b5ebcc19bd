"""Where a classifier's graphed end-to-end predict (batch 1) spends its time (GPU only).

    PYTHONPATH=. python3 scripts/classify_latency.py --model resnet 18 --out lat/

Medians of ``--runs`` calls after ``--warmup``: ``model(img, cuda_graph=True)`` for the 1280x720
sample and for a 224x224 copy of it; the network's forward captured alone (CUDA events), with
cuDNN's heuristic algorithms and with its timed search (``cudnn.benchmark``); the pinned upload
of the 720p frame. Then the timeline of ``--runs`` end-to-end calls without a profiler (host
clock stamps at the stage's entry, the replay's launch and return, the wait for the outputs and
the Results: medians per segment). Then ``--calls`` end-to-end calls under torch.profiler: per
call, the wall, the device's busy time (the union of its kernels and copies) and its idle gaps,
the kernels by total time; the Chrome trace is written to ``--out``. ``--tf32 on|off`` sets
cuDNN's and cuBLAS's TF32 for the whole process (default: PyTorch's settings).
``--fuse``: the model with its BatchNorms folded into the convolutions (``model.fuse()``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.profiler import ProfilerActivity, profile

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.benchmark import event_time_call


def wall_ms(fn, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def event_ms(fn, runs: int) -> float:
    return event_time_call(fn, runs, 0)["median_ms"]


def graphed_forward(net, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            net(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        net(x)
    return g


def timeline(m, img, imgsz: int, runs: int) -> dict:
    """Median host milliseconds per segment of ``m(img, cuda_graph=True)``, from clock stamps
    put around the predictor's stage, the graph's replay, the outputs' wait and the Results."""
    from libreyolo.engine.predictor import Predictor
    from libreyolo.graphs import capture
    from libreyolo.tasks.classify.task import ClassifyPlan
    stamps: dict[str, float] = {}
    wrapped = [(Predictor, "run_batch", "stage"), (capture.CapturedGraph, "replay", "replay"),
               (capture.HostCopy, "wait", "wait"), (ClassifyPlan, "results", "results")]
    saved = [(cls, name, getattr(cls, name)) for cls, name, _ in wrapped]

    def stamp(fn, tag):
        def inner(*a, **k):
            stamps.setdefault(tag + "_in", time.perf_counter())
            try:
                return fn(*a, **k)
            finally:
                stamps[tag + "_out"] = time.perf_counter()
        return inner
    for (cls, name, tag), (_, _, fn) in zip(wrapped, saved):
        setattr(cls, name, stamp(fn, tag))
    order = ["start", "stage_in", "replay_in", "replay_out", "stage_out", "wait_in", "wait_out",
             "results_out", "end"]
    seg: dict[str, list[float]] = {f"{a}->{b}": [] for a, b in zip(order, order[1:])}
    seg["total"] = []
    try:
        for i in range(runs + 20):
            stamps.clear()
            stamps["start"] = time.perf_counter()
            m(img, imgsz=imgsz, cuda_graph=True)
            stamps["end"] = time.perf_counter()
            if i < 20 or not all(k in stamps for k in order):
                continue
            for a, b in zip(order, order[1:]):
                seg[f"{a}->{b}"].append((stamps[b] - stamps[a]) * 1e3)
            seg["total"].append((stamps["end"] - stamps["start"]) * 1e3)
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    return {k: round(statistics.median(v), 4) for k, v in seg.items() if v}


def busy(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1e18
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs=2, default=["resnet", "18"])
    ap.add_argument("--imgsz", type=int, default=224)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tf32", choices=("default", "on", "off"), default="default")
    ap.add_argument("--fuse", action="store_true", help="BatchNorm folded into the convolutions (model.fuse())")
    a = ap.parse_args()
    if a.tf32 != "default":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = a.tf32 == "on"
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "-".join(a.model) + ("" if a.tf32 == "default" else f"-tf32{a.tf32}") + ("-fused" if a.fuse else "")
    m = LibreYOLO.new(*a.model, device="cuda", seed=0)
    if a.fuse:
        m.fuse()
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    big = np.asarray(pil)
    small = np.asarray(pil.resize((a.imgsz, a.imgsz)))
    rep = {"model": name, "imgsz": a.imgsz, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "tf32_cudnn": torch.backends.cudnn.allow_tf32}
    rep["e2e_graph_720p_ms"] = wall_ms(lambda: m(big, imgsz=a.imgsz, cuda_graph=True), a.runs, a.warmup)
    rep["e2e_graph_224_ms"] = wall_ms(lambda: m(small, imgsz=a.imgsz, cuda_graph=True), a.runs, a.warmup)
    rep["e2e_eager_720p_ms"] = wall_ms(lambda: m(big, imgsz=a.imgsz, cuda_graph=False), a.runs // 3, 10)
    net = m.model.eval()
    x = torch.rand(1, 3, a.imgsz, a.imgsz, device="cuda")
    for bench in (False, True):
        with torch.backends.cudnn.flags(enabled=True, benchmark=bench, deterministic=False,
                                        allow_tf32=torch.backends.cudnn.allow_tf32):
            g = graphed_forward(net, x)
            key = "cudnn_benchmark" if bench else "cudnn_heuristic"
            rep[f"forward_graph_{key}_event_ms"] = event_ms(g.replay, a.runs)
            rep[f"forward_graph_{key}_wall_ms"] = wall_ms(g.replay, a.runs, 20)
            with torch.no_grad():
                rep[f"forward_eager_{key}_wall_ms"] = wall_ms(lambda: net(x), a.runs // 3, 10)
            del g
    host = torch.from_numpy(np.ascontiguousarray(big)).pin_memory()
    dev = torch.empty(host.shape, dtype=torch.uint8, device="cuda")
    rep["upload_720p_pinned_event_ms"] = event_ms(lambda: dev.copy_(host, non_blocking=True), a.runs)
    for label, img in (("720p", big), ("224", small)):
        rep[f"timeline_{label}_ms"] = timeline(m, img, a.imgsz, a.runs)
    print(json.dumps(rep, indent=1), flush=True)

    for label, img in (("720p", big), ("224", small)):
        for _ in range(20):
            m(img, imgsz=a.imgsz, cuda_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(a.calls):
                with torch.profiler.record_function(f"call{i}"):
                    m(img, imgsz=a.imgsz, cuda_graph=True)
                torch.cuda.synchronize()
        trace = out_dir / f"trace-{name}-{label}.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
        calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e.get("name", "").startswith("call") and e.get("ph") == "X" and e.get("cat") == "user_annotation")
        dev_ev = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        per = []
        for s, e in calls:
            inside = [(d["ts"], d["ts"] + d["dur"]) for d in dev_ev if s <= d["ts"] < e]
            first = min((i[0] for i in inside), default=s)
            last = max((i[1] for i in inside), default=s)
            per.append({"wall_us": e - s, "busy_us": busy(inside), "first_device_us": first - s,
                        "after_device_us": e - last, "n_device": len(inside)})
        kern: dict[str, float] = {}
        for d in dev_ev:
            kern[d["name"][:90]] = kern.get(d["name"][:90], 0.0) + d["dur"] / max(len(calls), 1)
        rep[f"profile_{label}"] = {k: statistics.median(p[k] for p in per) for k in per[0]} if per else {}
        rep[f"profile_{label}"]["top_device_us_per_call"] = sorted(kern.items(), key=lambda kv: -kv[1])[:25]
        cpu = prof.key_averages()
        rep[f"profile_{label}"]["top_host_ops"] = [
            (e.key[:80], round(e.cpu_time_total / a.calls, 1)) for e in
            sorted(cpu, key=lambda e: -e.self_cpu_time_total)[:25]]
        print(label, json.dumps(rep[f"profile_{label}"], indent=1), flush=True)
    (out_dir / f"latency-{name}.json").write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
