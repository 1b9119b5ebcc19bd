"""Export every family to ONNX and compare it with eager predict through onnxruntime (CPU, fp32).

    PYTHONPATH=$PWD python scripts/onnx_parity.py [--imgsz 160] [--json out.json] [family-size ...]

The same weights, images, thresholds and matching as tests/unit/test_export_onnx.py
(tests/export_parity.py); prints one row per family: exported?, detections (or top-5 classes,
or pixels) compared, the largest box difference in canvas and image pixels, the largest score
difference, and the seconds export and comparison took. docs/export.md keeps the table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "fixtures")]

from export_parity import compare, filled_model, parity_images  # noqa: E402
from rows import ONNX_MODELS  # noqa: E402

from libreyolo import LibreYOLO  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="family-size (default: every row of tests/rows.py ONNX_MODELS)")
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--dynamic", action="store_true", help="export dynamic and compare at imgsz + 32")
    ap.add_argument("--out", default="/tmp/libreyolo-onnx-parity")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [tuple(m.split("-", 1)) for m in args.models] or ONNX_MODELS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = []
    print("| family | exported | compared | max box diff canvas px (image px) | max score diff | export s | compare s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for fam, size in rows:
        m = filled_model(fam, size, args.imgsz)
        t0 = time.perf_counter()
        row = {"family": f"{fam}-{size}", "task": m.TASK}
        try:
            path = m.export(file=out / f"{fam}-{size}.onnx", dynamic=args.dynamic)
            row["export_s"] = time.perf_counter() - t0
            o = LibreYOLO(str(path), device="cpu")
            t1 = time.perf_counter()
            res = compare(m, o, parity_images(), args.imgsz + (32 if args.dynamic else 0))
            row.update(compare_s=time.perf_counter() - t1, exported=True, per_image=res, ok=True)
        except Exception as exc:   # a row of the table, not a crash: say what failed
            row.update(exported=row.get("export_s") is not None, ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
        table.append(row)
        print(_line(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))
    return 0 if all(r["ok"] for r in table) else 1


def _line(r: dict) -> str:
    if not r["ok"]:
        return f"| {r['family']} | {'yes' if r['exported'] else 'no'} | FAILED: {r['error']} | | | | |"
    res = r["per_image"]
    if r["task"] == "detect":
        what = " + ".join(str(x["n"]) for x in res) + " detections"
        swaps = sum(x["tie_swaps"] for x in res)
        if swaps:
            what += f" ({swaps} equal-score NMS tie{'s' if swaps > 1 else ''})"
        box = f"{max(x['box_canvas'] for x in res):.1e} ({max(x['box_image'] for x in res):.1e})"
        score = f"{max(x['score'] for x in res):.1e}"
    elif r["task"] == "classify":
        what, box, score = f"top-5 of {len(res)} images", "-", f"{max(x['score'] for x in res):.1e}"
    else:
        what = f"{sum(x['n'] for x in res)} pixels, {sum(x['mismatch'] for x in res)} differ"
        box, score = "-", "-"
    return f"| {r['family']} | yes | {what} | {box} | {score} | {r['export_s']:.1f} | {r['compare_s']:.1f} |"


if __name__ == "__main__":
    sys.exit(main())
