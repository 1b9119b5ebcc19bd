"""Batched predict throughput on a GPU: images/s of eager, graph and fast predict at batch 32 (the
1280x720 sample), from decoded arrays and from JPEG files on disk (decode included: nvjpeg with
decode="gpu", PIL with decode="cpu"), beside the graphed forward of the same batch.

    python scripts/batch_predict.py [--models yolox-n yolo9-t] [--batch 32] [--chunks 4] [--runs 20]
                                    [--no-fast] [--json out.json]

Each arm is one ``model.predict`` call over ``chunks * batch`` images (so chunk i+1's upload or
decode overlaps chunk i's stage), warmed up once (captures, compiles), then timed ``runs`` times
with a device synchronize after each call; medians are printed with the ratios the targets name:
graph / eager images/s (target >= 1.3) and graph ms per batch / graphed forward (target <= 1.25).
``sequential`` arms run the loop without the overlap (``Predictor.overlap = False``) for the
comparison. The fast arm runs under ``fastpath.measuring()`` (the contract is not checked here:
this measures speed, not the tolerance).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libreyolo import SAMPLE_IMAGE, LibreYOLO  # noqa: E402
from libreyolo.benchmark import _sync, device_name, time_call  # noqa: E402
from libreyolo.data.sources import decode_image  # noqa: E402
from libreyolo.engine.fastpath import measuring  # noqa: E402
from libreyolo.engine.verify import input_sensitive  # noqa: E402
from libreyolo.graphs.capture import CudaGraphCapturer  # noqa: E402


def forward_graph_ms(model, batch: int, imgsz: int, runs: int) -> float:
    net = model.model.eval()
    x = torch.rand((batch, 3, imgsz, imgsz), generator=torch.Generator().manual_seed(0)).to(model.device)
    with torch.no_grad():
        graph = CudaGraphCapturer().capture(lambda t: net(t), (x,), module=net)
        timing = time_call(lambda: graph.replay((x,), clone=False), model.device, max(runs, 50), 10)
    graph = None   # its pool goes back before the predict arms
    model.release_graphs()
    return timing["median_ms"]


def arm(model, source, n: int, batch: int, imgsz: int, runs: int, overlap: bool = True, **kw) -> dict:
    p = model.get_predictor()
    p.overlap = overlap
    try:
        model.release_graphs()

        def call():
            return model.predict(source, imgsz=imgsz, batch=batch, conf=0.25, **kw)
        t0 = time.perf_counter()
        call()
        _sync(model.device)
        first_s = time.perf_counter() - t0
        t = time_call(call, model.device, runs, 2)
    finally:
        p.overlap = True
        model.release_graphs()
    return {**t, "images": n, "images_per_s": n * 1e3 / t["median_ms"], "ms_per_batch": t["median_ms"] * batch / n,
            "first_call_s": first_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["yolox-n", "yolo9-t"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cpu-decode-runs", type=int, default=5, help="runs of the PIL-decode arms (slow)")
    ap.add_argument("--no-fast", action="store_true", help="skip the fast arms (inductor compile: minutes)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    n = args.batch * args.chunks
    tmp = Path(tempfile.mkdtemp(prefix="batch_predict_"))
    for i in range(n):   # the sample's own JPEG bytes, n files
        shutil.copy(SAMPLE_IMAGE, tmp / f"{i:04d}.jpg")
    arrays = [decode_image(SAMPLE_IMAGE)] * n
    report = {"device": device_name(torch.device("cuda")), "torch": torch.__version__, "batch": args.batch,
              "chunks": args.chunks, "imgsz": args.imgsz, "image_hw": list(arrays[0].shape[:2]), "models": {}}
    try:
        for name in args.models:
            family, size = name.split("-")
            model = input_sensitive(LibreYOLO.new(family, size, device="cuda", seed=0))
            res: dict = {"forward_graph_ms": forward_graph_ms(model, args.batch, args.imgsz, args.runs)}
            kinds = [("eager", {"cuda_graph": False}), ("graph", {"cuda_graph": True})]
            if not args.no_fast:
                kinds.append(("fast", {"cuda_graph": True, "precision": "fp16", "fast": True}))
            sources = [("arrays", arrays, {}, args.runs), ("jpeg_gpu_decode", str(tmp), {"decode": "gpu"}, args.runs),
                       ("jpeg_cpu_decode", str(tmp), {"decode": "cpu"}, args.cpu_decode_runs)]
            for src_name, src, extra, runs in sources:
                todo = [(f"{src_name}/{kind}", kw, True) for kind, kw in kinds]
                if src_name == "arrays":
                    todo += [(f"{src_name}/{kind}/sequential", kw, False) for kind, kw in kinds[:2]]
                for key, kw, overlap in todo:
                    try:
                        with measuring():
                            res[key] = arm(model, src, n, args.batch, args.imgsz, runs, overlap=overlap, **kw, **extra)
                    except Exception as exc:   # an arm that cannot run here is a result, not the end
                        res[key] = {"error": f"{type(exc).__name__}: {exc}"}
            fg = res["forward_graph_ms"]
            print(f"\n{name}: batch {args.batch} x {args.chunks} chunks, {report['image_hw'][1]}x"
                  f"{report['image_hw'][0]} -> {args.imgsz}, {report['device']}, torch {torch.__version__}")
            print(f"  graphed forward: {fg:.2f} ms per batch")
            print(f"  {'arm':40s} {'images/s':>9s} {'ms/batch':>9s} {'x eager':>8s} {'/ fwd':>6s}")
            for key, a in res.items():
                if not isinstance(a, dict):
                    continue
                if "error" in a:
                    print(f"  {key:40s} failed: {a['error'][:200]}")
                    continue
                eager = res.get(f"{key.split('/')[0]}/eager", {})
                x_eager = a["images_per_s"] / eager["images_per_s"] if "images_per_s" in eager else float("nan")
                print(f"  {key:40s} {a['images_per_s']:9.0f} {a['ms_per_batch']:9.2f} {x_eager:8.2f} "
                      f"{a['ms_per_batch'] / fg:6.2f}")

            def ratio(a: str, b: str, field: str = "images_per_s") -> float | None:
                ra, rb = res.get(a, {}), res.get(b, {})
                return ra[field] / rb[field] if field in ra and field in rb else None
            g = res.get("arrays/graph", {})
            res["ratios"] = {"graph_over_eager_images_per_s": ratio("arrays/graph", "arrays/eager"),
                             "graph_ms_per_batch_over_forward_graph": (g["ms_per_batch"] / fg
                                                                       if "ms_per_batch" in g else None),
                             "graph_overlapped_over_sequential": ratio("arrays/graph", "arrays/graph/sequential"),
                             "jpeg_gpu_graph_over_eager": ratio("jpeg_gpu_decode/graph", "jpeg_gpu_decode/eager"),
                             "jpeg_gpu_over_cpu_decode_graph": ratio("jpeg_gpu_decode/graph", "jpeg_cpu_decode/graph")}
            print("  ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in res["ratios"].items() if v is not None))
            print("  targets (arrays): graph / eager images/s >= 1.3, graph ms per batch / graphed forward <= 1.25")
            report["models"][name] = res
            del model
            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
