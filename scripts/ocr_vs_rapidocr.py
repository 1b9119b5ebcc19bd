"""Character error rate and per-page time: LibreYOLO ``ppocr`` (PP-OCRv4 weights converted from the
``rapidocr_onnxruntime`` wheel) against RapidOCR's own onnxruntime pipeline, on the same rendered
pages, in one process.

Needs the ``test`` extra (rapidocr_onnxruntime 1.4.4, onnx, the Noto Sans CJK wheel). Each page
runs ``--warmup`` times, then ``--runs`` timed times per engine, alternating engines run by run;
the median is reported, with the ratio ours / RapidOCR (on a shared machine compare the ratio,
not absolute times) and each engine's process CPU time per page (clean at one thread only: at two,
either engine's idle worker threads may still spin into the other's measurement). Threads: torch
and onnxruntime both get ``--threads`` (run with ``OMP_NUM_THREADS`` set to the same number).

    OMP_NUM_THREADS=2 python scripts/ocr_vs_rapidocr.py --threads 2 --runs 10
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import ocr_pages as P


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--unfused", action="store_true", help="predict with the loaded (unfused) network")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--pages", nargs="+", default=["english", "chinese", "dense", "rotated", "blank"],
                    help="which rendered pages (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    spec = importlib.util.spec_from_file_location("convert_rapidocr", ROOT / "scripts" / "convert_rapidocr.py")
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    from rapidocr_onnxruntime import RapidOCR

    from libreyolo.models.ppocr.model import PPOCR
    model = PPOCR.from_checkpoint(conv.convert(), device="cpu", source="rapidocr v4 (converted)")
    model.predict_fused = not args.unfused
    rapid = RapidOCR(intra_op_num_threads=args.threads, inter_op_num_threads=1)

    pages = {"english": P.english_page(), "dense": P.dense_page(), "rotated": P.rotated_page()}
    font = P.cjk_font_path()
    if font is not None:
        pages["chinese"] = P.chinese_page(font)
    pages["blank"] = (P.blank_page(), [])
    pages = {k: v for k, v in pages.items() if k in args.pages}

    def ours(page):
        r = model(page, bgr=False)
        return (r[0] if isinstance(r, list) else r).texts.texts

    def theirs(page):
        res, _ = rapid(np.ascontiguousarray(page[..., ::-1]))
        return [x[1] for x in (res or [])]

    rows = []
    load_before = round(os.getloadavg()[0], 2)
    for name, (page, truth) in pages.items():
        for _ in range(args.warmup):
            ours(page), theirs(page)
        t_ours, t_theirs, c_ours, c_theirs = [], [], [], []
        for _ in range(args.runs):
            t, c = time.perf_counter(), time.process_time()
            a = ours(page)
            t_ours.append(time.perf_counter() - t)
            c_ours.append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            b = theirs(page)
            t_theirs.append(time.perf_counter() - t)
            c_theirs.append(time.process_time() - c)
        row = {"page": name, "hw": list(page.shape[:2]), "lines": len(truth),
               "ours_lines": len(a), "rapid_lines": len(b),
               "ours_cer": round(P.cer(a, truth), 4) if truth else float(len(a)),
               "rapid_cer": round(P.cer(b, truth), 4) if truth else float(len(b)),
               "ours_ms": round(1000 * statistics.median(t_ours), 1),
               "rapid_ms": round(1000 * statistics.median(t_theirs), 1),
               "ratio": round(statistics.median(t_ours) / statistics.median(t_theirs), 3),
               "ours_cpu_ms": round(1000 * statistics.median(c_ours), 1),
               "rapid_cpu_ms": round(1000 * statistics.median(c_theirs), 1),
               "load_after": round(os.getloadavg()[0], 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    import onnxruntime
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    meta = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "threads": args.threads,
            "runs": args.runs, "warmup": args.warmup, "fused": not args.unfused, "cpu": cpu, "cores": os.cpu_count(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
            "load_before": load_before, "date": time.strftime("%Y-%m-%d", time.gmtime())}
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
