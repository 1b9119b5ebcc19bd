"""Layer-by-layer CPU profile of the PP-OCR detector: LibreYOLO's fused eager network against
onnxruntime's session of the same ONNX file (PP-OCRv4 mobile from the ``rapidocr_onnxruntime``
wheel, converted by ``scripts/convert_rapidocr.py``), on the same input, in one process.

For each thread count the engines alternate run by run, the order rotated each run, each timed
or profiled run after an untimed lead-in run of the same engine (``--runs`` timed runs after
``--warmup``; the lead-in absorbs the previous engine's still-spinning worker threads); the wall times are medians, and so is each operator category's time: torch's from
``torch.profiler`` (top-level operators' total CPU time), onnxruntime's from its own profiling
(node kernel times). Convolutions are split by kind (depthwise 3x3 / 5x5, pointwise 1x1, dense
kxk, transposed) from their weights' shapes on both sides. ``--baseline DIR``: another checkout's
fused detector (DIR/libreyolo, as in ``ocr_vs_rapidocr.py``) timed and profiled in the same
alternation (before/after under the same load).

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
    ap.add_argument("--baseline", type=Path, help="another checkout's root: its fused detector as a third engine")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()

    import onnxruntime as ort
    spec = importlib.util.spec_from_file_location("convert_rapidocr", ROOT / "scripts" / "convert_rapidocr.py")
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    from libreyolo.models.ppocr.model import PPOCR
    ckpt = conv.convert()
    model = PPOCR.from_checkpoint(ckpt, device="cpu", source="rapidocr v4 (converted)")
    model._refresh_fused()
    nets = {"ours": model._net().det}
    if args.baseline is not None:
        spec = importlib.util.spec_from_file_location("ocr_vs_rapidocr", ROOT / "scripts" / "ocr_vs_rapidocr.py")
        ovr = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ovr)
        base = ovr.baseline_ppocr(args.baseline).from_checkpoint(ckpt, device="cpu", source="rapidocr v4 (converted)")
        base._refresh_fused()
        nets["base"] = base._net().det
    det_path, _ = conv.wheel_models()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, *args.hw, generator=g)
    xn = x.numpy().copy()
    xt = x if args.contiguous else x.contiguous(memory_format=torch.channels_last)
    report = {"meta": {"torch": torch.__version__, "onnxruntime": ort.__version__, "hw": args.hw,
                       "runs": args.runs, "baseline": str(args.baseline) if args.baseline else None,
                       "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
                       "date": time.strftime("%Y-%m-%d", time.gmtime()), "load": os.getloadavg()}, "threads": {}}
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
                for net in nets.values():
                    net(xt)
                sess.run(None, feed)
                sess_p.run(None, feed)
            wall = {k: [] for k in [*nets, "onnxruntime"]}
            cats = {k: [] for k in [*nets, "onnxruntime"]}
            calls = {**{k: (lambda n=net: n(xt)) for k, net in nets.items()},
                     "onnxruntime": lambda: sess.run(None, feed)}
            names = list(calls)
            for i in range(args.runs):
                for k in names[i % len(names):] + names[:i % len(names)]:   # no engine always after another
                    calls[k]()   # lead-in
                    t = time.perf_counter()
                    calls[k]()
                    wall[k].append(time.perf_counter() - t)
                for k in names[i % len(names):] + names[:i % len(names)]:   # the profiled runs, rotated too
                    calls[k]()   # lead-in
                    if k == "onnxruntime":
                        sess_p.run(None, feed)
                        cats[k].append(ort_categories(sess_p.end_profiling()))
                        sess_p = ort.InferenceSession(str(det_path), so_p, providers=["CPUExecutionProvider"])
                        sess_p.run(None, feed)   # warm the new session (the profile keeps the last run only)
                        continue
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                record_shapes=True) as prof:
                        nets[k](xt)
                    cats[k].append(torch_categories(prof))

        def med(rows):
            keys = sorted({k for r in rows for k in r})
            return {k: round(statistics.median(r.get(k, 0.0) for r in rows), 2) for k in keys}

        entry = {f"{k}_ms": round(1000 * statistics.median(v), 1) for k, v in wall.items()}
        entry.update({f"{k}_categories_ms": med(v) for k, v in cats.items()})
        entry["load_after"] = round(os.getloadavg()[0], 2)
        report["threads"][th] = entry
        engines = list(wall)
        print(f"\n== {th} thread(s), input {args.hw}: " + ", ".join(f"{k} {entry[k + '_ms']} ms" for k in engines)
              + f" (medians of {args.runs}; load {os.getloadavg()[0]:.1f})")
        tabs = [entry[f"{k}_categories_ms"] for k in engines]
        keys = sorted(set().union(*tabs), key=lambda c: -max(t.get(c, 0) for t in tabs))
        print(f"{'category':44s}" + "".join(f" {k[:12]:>12s}" for k in engines))
        for c in keys:
            print(f"{c[:44]:44s}" + "".join(f" {t.get(c, 0):12.2f}" for t in tabs))
        print(f"{'sum':44s}" + "".join(f" {sum(t.values()):12.2f}" for t in tabs))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
