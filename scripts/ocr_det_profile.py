"""Layer-by-layer CPU profile of the PP-OCR detector: LibreYOLO's fused eager network against
onnxruntime's session of the same ONNX file (PP-OCRv4 mobile from the ``rapidocr_onnxruntime``
wheel, converted by ``scripts/convert_rapidocr.py``), on the same input, in one process.

For each thread count the two engines alternate run by run (``--runs`` timed runs after
``--warmup``); the wall times are medians, and so is each operator category's time: torch's from
``torch.profiler`` (top-level operators' total CPU time), onnxruntime's from its own profiling
(node kernel times). Convolutions are split by kind (depthwise 3x3 / 5x5, pointwise 1x1, dense
kxk, transposed) from their weights' shapes on both sides.

    OMP_NUM_THREADS=2 python scripts/ocr_det_profile.py --threads 1 2 --runs 10 --hw 416 960
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def conv_kind(weight_shape: list[int], groups: int, transposed: bool = False) -> str:
    """A convolution's category from its weight shape (out, in/groups, kh, kw) and groups."""
    if transposed:
        return "conv transposed 2x2"
    k = weight_shape[-1]
    if groups > 1 and weight_shape[1] == 1:
        return f"conv depthwise {k}x{k}"
    return "conv pointwise 1x1" if k == 1 else f"conv dense {k}x{k}"


#: torch top-level operators -> category (anything else: its own name)
TORCH_OPS = {
    "aten::hardswish_": "hardswish", "aten::hardswish": "hardswish",
    "aten::addcmul": "affine (scale, bias)", "aten::mul": "mul (SE gate, affine)",
    "aten::add": "add", "aten::add_": "add",
    "aten::mean": "SE: global mean", "aten::hardsigmoid": "SE: gate", "aten::relu": "relu", "aten::relu_": "relu",
    "aten::clamp": "SE: gate", "aten::upsample_nearest2d": "FPN: nearest upsample",
    "aten::cat": "FPN: concat", "aten::sigmoid": "head: sigmoid",
    "aten::contiguous": "memory format conversion", "aten::clone": "memory format conversion",
    "aten::to": "memory format conversion", "aten::copy_": "memory format conversion",
}


def torch_categories(prof) -> dict[str, float]:
    """Milliseconds per category of one profiled forward (top-level operators only)."""
    out: dict[str, float] = collections.defaultdict(float)
    for e in prof.events():
        if e.cpu_parent is not None:
            continue
        name = e.name
        if name in ("aten::conv2d", "aten::conv_transpose2d", "mkldnn::_convolution_pointwise",
                    "mkldnn::_convolution_transpose_pointwise"):
            shapes = e.input_shapes
            w = shapes[1]
            groups = shapes[0][1] // w[1] if w and w[1] else 1
            transposed = "transpose" in name
            cat = conv_kind(w, 1 if transposed else groups, transposed=transposed)
        else:
            cat = TORCH_OPS.get(name, name)
        out[cat] += e.cpu_time_total / 1000.0
    return out


def ort_categories(profile_path: str) -> dict[str, float]:
    """Milliseconds per category of the last run in an onnxruntime profile file (a conv's kind from
    its weight's shape: the optimized graph's nodes carry new names)."""
    events = json.loads(Path(profile_path).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    last = runs[-1]
    t0, t1 = last["ts"], last["ts"] + last["dur"]
    out: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or not t0 <= e["ts"] <= t1:
            continue
        op = e["args"].get("op_name", "")
        shapes = e["args"].get("input_type_shape", [])
        if op in ("Conv", "FusedConv", "ConvTranspose") and len(shapes) > 1:
            w = list(shapes[1].values())[0]
            groups = 2 if w[1] == 1 and w[0] > 1 else 1
            cat = conv_kind(w, groups, transposed=op == "ConvTranspose")
        else:
            cat = {"Resize": "FPN: nearest upsample", "Concat": "FPN: concat", "Sigmoid": "head: sigmoid",
                   "HardSigmoid": "SE: gate", "GlobalAveragePool": "SE: global mean", "ReduceMean": "SE: global mean",
                   "Relu": "relu", "Add": "add", "Mul": "mul (SE gate, affine)", "HardSwish": "hardswish",
                   "Clip": "hardswish / SE gate (Clip)", "Div": "hardswish (Div)",
                   "ReorderInput": "memory format conversion", "ReorderOutput": "memory format conversion",
                   }.get(op, "ort " + op)
        out[cat] += e["dur"] / 1000.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hw", type=int, nargs=2, default=[416, 960], help="the detector input (multiples of 32)")
    ap.add_argument("--contiguous", action="store_true", help="our input in NCHW (default: channels-last)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()

    import onnxruntime as ort
    spec = importlib.util.spec_from_file_location("convert_rapidocr", ROOT / "scripts" / "convert_rapidocr.py")
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    from libreyolo.models.ppocr.model import PPOCR
    model = PPOCR.from_checkpoint(conv.convert(), device="cpu", source="rapidocr v4 (converted)")
    model._refresh_fused()
    net = model._net().det
    det_path, _ = conv.wheel_models()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, *args.hw, generator=g)
    xn = x.numpy().copy()
    xt = x if args.contiguous else x.contiguous(memory_format=torch.channels_last)
    report = {"meta": {"torch": torch.__version__, "onnxruntime": ort.__version__, "hw": args.hw,
                       "runs": args.runs, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                       "load": os.getloadavg()}, "threads": {}}
    for th in args.threads:
        torch.set_num_threads(th)
        tmp = tempfile.mkdtemp()
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = th, 1
        so.enable_cpu_mem_arena = False   # as RapidOCR sets it
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(det_path), so, providers=["CPUExecutionProvider"])
        so_p = ort.SessionOptions()
        so_p.intra_op_num_threads, so_p.inter_op_num_threads = th, 1
        so_p.enable_cpu_mem_arena = False
        so_p.enable_profiling, so_p.profile_file_prefix = True, os.path.join(tmp, "ort")
        sess_p = ort.InferenceSession(str(det_path), so_p, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: xn}
        with torch.inference_mode():
            for _ in range(args.warmup):
                net(xt)
                sess.run(None, feed)
                sess_p.run(None, feed)
            wall_t, wall_o, cats_t, cats_o = [], [], [], []
            for _ in range(args.runs):
                t = time.perf_counter()
                net(xt)
                wall_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                sess.run(None, feed)
                wall_o.append(time.perf_counter() - t)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
                    net(xt)
                cats_t.append(torch_categories(prof))
                sess_p.run(None, feed)
                path = sess_p.end_profiling()
                cats_o.append(ort_categories(path))
                sess_p = ort.InferenceSession(str(det_path), so_p, providers=["CPUExecutionProvider"])
                sess_p.run(None, feed)   # warm the new session (the profile keeps the last run only)

        def med(rows):
            keys = sorted({k for r in rows for k in r})
            return {k: round(statistics.median(r.get(k, 0.0) for r in rows), 2) for k in keys}

        rt, ro = med(cats_t), med(cats_o)
        entry = {"ours_ms": round(1000 * statistics.median(wall_t), 1),
                 "onnxruntime_ms": round(1000 * statistics.median(wall_o), 1),
                 "ours_categories_ms": rt, "onnxruntime_categories_ms": ro}
        report["threads"][th] = entry
        print(f"\n== {th} thread(s), input {args.hw}: ours {entry['ours_ms']} ms, onnxruntime "
              f"{entry['onnxruntime_ms']} ms (medians of {args.runs}; load {os.getloadavg()[0]:.1f})")
        keys = sorted(set(rt) | set(ro), key=lambda k: -max(rt.get(k, 0), ro.get(k, 0)))
        print(f"{'category':44s} {'ours ms':>9s} {'ort ms':>9s}")
        for k in keys:
            print(f"{k[:44]:44s} {rt.get(k, 0):9.2f} {ro.get(k, 0):9.2f}")
        print(f"{'sum':44s} {sum(rt.values()):9.2f} {sum(ro.values()):9.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
