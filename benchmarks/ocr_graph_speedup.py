"""End-to-end predict time of ``ppocr`` with real weights on a page: eager against the captured
graph (``cuda_graph=True``), on a CUDA device, in one process.

The checkpoint is the PP-OCRv4 mobile conversion of ``scripts/convert_rapidocr.py`` (made on a
machine with the ``test`` extra, then carried); the page an image file with its text (one line per
line of the ``.txt`` beside it), e.g. ``tests/ocr_pages.py``'s dense page saved as PNG. Both arms
read the same lines (checked before timing); each arm runs ``--warmup`` times, then the arms take
turns ``--runs`` times, one call each; medians and the ratio eager / graph are printed as one JSON
line (and written to ``--json``).

    python benchmarks/ocr_graph_speedup.py --checkpoint ppocr-v4.pt --page dense.png --runs 30
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--page", type=Path, required=True, help="an RGB image; its text in the .txt beside it")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("ocr_graph_speedup.py: needs a CUDA device")

    import ocr_pages as P

    from libreyolo import LibreYOLO
    model = LibreYOLO(str(args.checkpoint), device="cuda")
    page = np.asarray(Image.open(args.page).convert("RGB"))
    truth_file = args.page.with_suffix(".txt")
    truth = truth_file.read_text().splitlines() if truth_file.is_file() else None

    def arm(graph: bool):
        def read():
            r = model(page, bgr=False, cuda_graph=graph)
            torch.cuda.synchronize()
            return (r[0] if isinstance(r, list) else r).texts.texts
        return read

    arms = {"eager": arm(False), "graph": arm(True)}
    texts = {}
    for name, run in arms.items():
        for _ in range(args.warmup):
            texts[name] = run()
    same = texts["eager"] == texts["graph"]
    times: dict[str, list[float]] = {k: [] for k in arms}
    for i in range(args.runs):
        for name in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
            t = time.perf_counter()
            arms[name]()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    row = {"page": args.page.name, "hw": list(page.shape[:2]), "lines_read": len(texts["graph"]),
           "same_text": same, "eager_ms": round(med["eager"], 2), "graph_ms": round(med["graph"], 2),
           "speedup": round(med["eager"] / med["graph"], 3), "runs": args.runs,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d")}
    if truth is not None:
        row["cer_graph"] = round(P.cer(texts["graph"], truth), 4)
        row["cer_eager"] = round(P.cer(texts["eager"], truth), 4)
    print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
