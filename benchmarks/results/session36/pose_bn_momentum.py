"""Session 36: YOLO-NAS-Pose trained with its BatchNorms' running statistics updated at momentum
``BN_MOM`` (environment; default 0.1) instead of the network's 0.03, everything else as
``benchmarks/task_quality.py`` (whose arguments this takes).

    BN_MOM=0.1 PYTHONPATH=. python3 benchmarks/results/session36/pose_bn_momentum.py \
        --models yolonas-n-pose --epochs 30 --imgsz 160 --batch 16 --device cpu --seed 0

The momentum only sets how fast the running statistics (what evaluation and predict normalise
with) follow the batches' statistics; training's own forward uses the batch statistics either
way. Every BatchNorm2d built in this process gets it (the pose task rebuilds the network for the
dataset's keypoints, so it is set at construction).
"""
import os
import runpy
import sys
from pathlib import Path

import torch

MOM = float(os.environ.get("BN_MOM", "0.1"))
_init = torch.nn.BatchNorm2d.__init__


def _init_with_momentum(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.momentum = MOM


torch.nn.BatchNorm2d.__init__ = _init_with_momentum
sys.argv[0] = str(Path(__file__).parents[2] / "task_quality.py")
runpy.run_path(sys.argv[0], run_name="__main__")
