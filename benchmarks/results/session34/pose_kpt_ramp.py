"""Experiment driver (session 34, CPU, eager): YOLO-NAS-Pose's keypoint terms (visibility, OKS, L1)
ramped linearly from 0 to their weights over the first PR_STEPS optimizer steps (counted as the
loss's calls with autograd on), so the shared trunk first learns the boxes; then task_quality.py
of the tree this file sits in, with the same arguments."""
import os
import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from libreyolo.models.yolonas import pose_loss as pl

STEPS = int(os.environ.get("PR_STEPS", "120"))
_orig = pl.YoloNASPoseLoss._compute


def _ramped(self, *args, **kwargs):
    items = _orig(self, *args, **kwargs)
    if torch.is_grad_enabled():
        n = getattr(self, "_calls", 0)
        self._calls = n + 1
        f = min(1.0, n / STEPS)
        items = torch.cat((items[:3], items[3:] * f))
    return items


pl.YoloNASPoseLoss._compute = _ramped
print("keypoint terms ramped over", STEPS, "steps", flush=True)
sys.argv = ["task_quality.py"] + sys.argv[1:]
runpy.run_path(str(ROOT / "benchmarks" / "task_quality.py"), run_name="__main__")
