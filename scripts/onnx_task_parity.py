"""Export the segment, obb and pose variants to ONNX and compare them with eager predict through
onnxruntime (CPU, fp32): the measurements of docs/export.md's task table.

    PYTHONPATH=$PWD python scripts/onnx_task_parity.py [family-size-task ...]

The same weights, images, thresholds and assertions as tests/unit/test_export_onnx_tasks.py
(its ``task_model`` and ``compare_task``); prints one row per variant: dynamic?, instances
compared per image, the largest box (obb: corner) difference in canvas pixels, the largest
score difference, keypoints or masks (the graph's mask logits against the family's, pixels
compared, pixels that differ, the smallest instance IoU), and the seconds export and comparison took.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "fixtures"), str(ROOT / "tests" / "unit")]

from export_parity import parity_images  # noqa: E402
from test_export_onnx_tasks import IMGSZ, ROWS, compare_task, task_model  # noqa: E402

from libreyolo import LibreYOLO  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    want = set(sys.argv[1:])
    out = Path("/tmp/libreyolo-onnx-task-parity")
    out.mkdir(parents=True, exist_ok=True)
    print("| variant | dynamic (compared at) | instances | max box / corner diff canvas px | max score diff "
          "| keypoints / masks | export s | compare s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for fam, size, task, dynamic in ROWS:
        name = f"{fam}-{size}-{task}"
        if want and name not in want:
            continue
        m = task_model(fam, size, task)
        t0 = time.perf_counter()
        path = m.export(file=out / f"{name}.onnx", dynamic=dynamic)
        t1 = time.perf_counter()
        o = LibreYOLO(str(path), device="cpu")
        imgsz = IMGSZ + 32 if dynamic else IMGSZ
        rows = [compare_task(m, o, img, imgsz) for img in parity_images()]
        t2 = time.perf_counter()
        box = max(r.get("box_canvas", r.get("corner_canvas", 0.0)) for r in rows)
        score = max(r["score"] for r in rows)
        if task == "pose":
            extra = f"keypoints {max(r['kpt_canvas'] for r in rows):.1e} px"
        elif task == "segment":
            extra = (f"mask logits {max(r['logit_gap'] for r in rows):.1e}; {sum(r['mask_pixels'] for r in rows)} "
                     f"mask px, {sum(r['mask_differ'] for r in rows)} differ, "
                     f"min IoU {min(r['min_iou'] for r in rows):.4f}")
        else:
            extra = "-"
        print(f"| {name} | {'yes' if dynamic else 'no'} ({imgsz}) | {' + '.join(str(r['n']) for r in rows)} "
              f"| {box:.1e} | {score:.1e} | {extra} | {t1 - t0:.1f} | {t2 - t1:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
