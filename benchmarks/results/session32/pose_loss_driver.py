"""Experiment driver (session 32, CPU): YOLO-NAS-Pose loss defaults from the environment (PL_<name>=value), then task_quality.py; sys.path points at an archive of the tree (/tmp/qsrc)."""
import inspect
import os
import runpy
import sys

sys.path.insert(0, "/tmp/qsrc")
from libreyolo.models.yolonas import pose_loss as pl

sig = inspect.signature(pl.YoloNASPoseLoss.__init__)
names = [p for p in sig.parameters if sig.parameters[p].default is not inspect._empty]
defaults = list(pl.YoloNASPoseLoss.__init__.__defaults__)
for i, n in enumerate(names):
    v = os.environ.get("PL_" + n)
    if v is not None:
        defaults[i] = type(defaults[i])(eval(v))
        print("loss default", n, "=", defaults[i], flush=True)
pl.YoloNASPoseLoss.__init__.__defaults__ = tuple(defaults)
sys.argv = ["task_quality.py"] + sys.argv[1:]
runpy.run_path("/tmp/qsrc/benchmarks/task_quality.py", run_name="__main__")
