"""Experiment driver (session 34, CPU): the trainer's autocast forced to bfloat16 on the CPU
(AMP_CPU=1; the trainer autocasts on CUDA only), optionally with YOLO-NAS-Pose's anchor points and
strides in float32 instead of the logits' dtype (ANCHOR32=1: the keypoints and anchor pixels the
loss reads then stay float32); then task_quality.py of the tree this file sits in, with the same
arguments. Prints the dtypes of the first training forward's outputs."""
import os
import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from libreyolo.engine import setup as su

_orig = su.device_settings
def ds(model, cfg):
    d, a, cl = _orig(model, cfg)
    return d, torch.bfloat16, cl
if os.environ.get("AMP_CPU"):
    su.device_settings = ds
    import libreyolo.engine.trainer as tr
    if hasattr(tr, "device_settings"): tr.device_settings = ds
if os.environ.get("ANCHOR32"):
    from libreyolo.models.yolonas import pose_nn
    _ag = pose_nn.anchor_grid
    pose_nn.anchor_grid = lambda hw, strides, dtype, device: _ag(hw, strides, torch.float32, device)
from libreyolo.models.yolonas import pose_nn as _pn

_fw = _pn.PoseDFLHeads.forward
_seen = []
def _fwd(self, feats):
    out = _fw(self, feats)
    if len(_seen) < 1 and self.training:
        _seen.append(1); print("train dtypes: logits", out[1][0].dtype, "kpts", out[1][2].dtype, "points_px", out[1][5].dtype, flush=True)
    return out
_pn.PoseDFLHeads.forward = _fwd
print("amp_cpu", bool(os.environ.get("AMP_CPU")), "anchor32", bool(os.environ.get("ANCHOR32")), flush=True)
sys.argv = ["task_quality.py"] + sys.argv[1:]
runpy.run_path(str(ROOT / "benchmarks" / "task_quality.py"), run_name="__main__")
