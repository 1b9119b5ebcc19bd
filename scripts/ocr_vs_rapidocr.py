"""Character error rate and per-page time: LibreYOLO ``ppocr`` (PP-OCRv4 weights converted from the
``rapidocr_onnxruntime`` wheel) against RapidOCR's own onnxruntime pipeline, on the same rendered
pages, in one process.

Needs the ``test`` extra (rapidocr_onnxruntime 1.4.4, onnx, the Noto Sans CJK wheel). Each page
runs ``--warmup`` times, then ``--runs`` timed times per engine: the engines take turns in blocks
(each block one untimed lead-in run, then ``--block`` timed runs back to back), the order rotated
each round. An engine's worker threads keep spinning for a while after its run (onnxruntime's by
default, OpenMP's too), which slows whatever runs next on a 2-core machine; the lead-in run
absorbs that, so each engine is timed in its own steady state, as a user running one engine
page after page sees it. The median is reported, with the ratio ours / RapidOCR (on a shared machine compare the ratio,
not absolute times) and each engine's process CPU time per page (clean at one thread only: at two,
either engine's idle worker threads may still spin into the other's measurement). Threads: torch
and onnxruntime both get ``--threads`` (run with ``OMP_NUM_THREADS`` set to the same number).

``--baseline DIR``: another checkout's ``libreyolo`` (DIR/libreyolo, e.g. an older commit unpacked
with ``git archive``) runs as a third engine on the same checkpoint, alternating with the other two
run by run - a before/after comparison under the same load, which separate runs on a shared
machine cannot give.

    OMP_NUM_THREADS=2 python scripts/ocr_vs_rapidocr.py --threads 2 --runs 10
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import ocr_pages as P


def baseline_ppocr(root: Path):
    """The ``PPOCR`` class of the checkout at ``root``, imported as the package ``libreyolo_baseline``
    (a link in a temporary directory: its imports inside the package are relative)."""
    pkg = root.expanduser().resolve() / "libreyolo"
    if not (pkg / "models" / "ppocr" / "model.py").is_file():
        raise FileNotFoundError(f"--baseline {root}: no libreyolo/models/ppocr/model.py there")
    tmp = Path(tempfile.mkdtemp(prefix="ocr-baseline-"))
    (tmp / "libreyolo_baseline").symlink_to(pkg, target_is_directory=True)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("libreyolo_baseline.models.ppocr.model").PPOCR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--block", type=int, default=2, help="timed runs per engine turn (after one untimed lead-in)")
    ap.add_argument("--unfused", action="store_true", help="predict with the loaded (unfused) network")
    ap.add_argument("--baseline", type=Path, help="another checkout's root: its libreyolo as a third engine")
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
    ckpt = conv.convert()
    engines = {}
    model = PPOCR.from_checkpoint(ckpt, device="cpu", source="rapidocr v4 (converted)")
    model.predict_fused = not args.unfused
    if args.baseline is not None:
        base = baseline_ppocr(args.baseline).from_checkpoint(ckpt, device="cpu", source="rapidocr v4 (converted)")
        base.predict_fused = not args.unfused
    rapid = RapidOCR(intra_op_num_threads=args.threads, inter_op_num_threads=1)

    def libre(m):
        def read(page):
            r = m(page, bgr=False)
            return (r[0] if isinstance(r, list) else r).texts.texts
        return read

    def theirs(page):
        res, _ = rapid(np.ascontiguousarray(page[..., ::-1]))
        return [x[1] for x in (res or [])]

    engines["ours"] = libre(model)
    if args.baseline is not None:
        engines["base"] = libre(base)
    engines["rapid"] = theirs

    pages = {"english": P.english_page(), "dense": P.dense_page(), "rotated": P.rotated_page()}
    font = P.cjk_font_path()
    if font is not None:
        pages["chinese"] = P.chinese_page(font)
    pages["blank"] = (P.blank_page(), [])
    pages = {k: v for k, v in pages.items() if k in args.pages}

    rows = []
    load_before = round(os.getloadavg()[0], 2)
    for name, (page, truth) in pages.items():
        for _ in range(args.warmup):
            for run in engines.values():
                run(page)
        wall = {k: [] for k in engines}
        cpu = {k: [] for k in engines}
        texts = {}
        names = list(engines)
        block = max(1, args.block)
        for i in range(-(-args.runs // block)):
            for k in names[i % len(names):] + names[:i % len(names)]:
                run = engines[k]
                run(page)   # lead-in: the previous engine's spinning threads settle here
                for _ in range(min(block, args.runs - len(wall[k]))):
                    t, c = time.perf_counter(), time.process_time()
                    texts[k] = run(page)
                    wall[k].append(time.perf_counter() - t)
                    cpu[k].append(time.process_time() - c)
        row = {"page": name, "hw": list(page.shape[:2]), "lines": len(truth)}
        for k in engines:
            row[f"{k}_lines"] = len(texts[k])
            row[f"{k}_cer"] = round(P.cer(texts[k], truth), 4) if truth else float(len(texts[k]))
        for k in engines:
            row[f"{k}_ms"] = round(1000 * statistics.median(wall[k]), 1)
        for k in engines:
            if k != "rapid":
                row["ratio" if k == "ours" else f"{k}_ratio"] = round(
                    statistics.median(wall[k]) / statistics.median(wall["rapid"]), 3)
        if "base" in engines:
            row["ours_vs_base"] = round(statistics.median(wall["ours"]) / statistics.median(wall["base"]), 3)
        for k in engines:
            row[f"{k}_cpu_ms"] = round(1000 * statistics.median(cpu[k]), 1)
        row["load_after"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    import onnxruntime
    cpu_name = platform.processor()
    if Path("/proc/cpuinfo").exists():
        cpu_name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith("model name")), cpu_name)
    meta = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__, "threads": args.threads,
            "runs": args.runs, "warmup": args.warmup, "block": args.block, "fused": not args.unfused, "cpu": cpu_name,
            "cores": os.cpu_count(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
            "baseline": str(args.baseline) if args.baseline is not None else None,
            "load_before": load_before, "date": time.strftime("%Y-%m-%d", time.gmtime())}
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
