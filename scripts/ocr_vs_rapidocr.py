"""Character error rate and per-page time: LibreYOLO ``ppocr`` (PP-OCRv4 weights converted from the
``rapidocr_onnxruntime`` wheel) against RapidOCR's own onnxruntime pipeline, on the same rendered
pages, in one process.

Needs the ``test`` extra (rapidocr_onnxruntime 1.4.4, onnx, the Noto Sans CJK wheel). Each page
runs ``--warmup`` times, then ``--runs`` timed times per engine, alternating engines run by run;
the median is reported. Threads: torch and onnxruntime both get ``--threads`` (run with
``OMP_NUM_THREADS`` set to the same number).

    OMP_NUM_THREADS=2 python scripts/ocr_vs_rapidocr.py --threads 2 --runs 10
"""
from __future__ import annotations

import argparse
import importlib.util
import json
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
    for name, (page, truth) in pages.items():
        for _ in range(args.warmup):
            ours(page), theirs(page)
        t_ours, t_theirs = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            a = ours(page)
            t_ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = theirs(page)
            t_theirs.append(time.perf_counter() - t)
        row = {"page": name, "hw": list(page.shape[:2]), "lines": len(truth),
               "ours_lines": len(a), "rapid_lines": len(b),
               "ours_cer": round(P.cer(a, truth), 4) if truth else float(len(a)),
               "rapid_cer": round(P.cer(b, truth), 4) if truth else float(len(b)),
               "ours_ms": round(1000 * statistics.median(t_ours), 1),
               "rapid_ms": round(1000 * statistics.median(t_theirs), 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"torch": torch.__version__, "threads": args.threads, "runs": args.runs,
            "fused": not args.unfused, "date": time.strftime("%Y-%m-%d", time.gmtime())}
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
