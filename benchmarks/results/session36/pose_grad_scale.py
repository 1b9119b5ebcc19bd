"""Session 36: YOLO-NAS-Pose with the keypoint branch's gradient into the shared neck scaled by
``KPT_GRAD`` (environment; default 0.25): each level's ``pose_stem`` reads the neck's features
through an identity whose backward multiplies the gradient, so the keypoint terms still train
the keypoint branch fully but pull on the features the boxes and classes share less. Everything
else as ``benchmarks/task_quality.py`` (whose arguments this takes).

    KPT_GRAD=0.25 PYTHONPATH=. python3 benchmarks/results/session36/pose_grad_scale.py \
        --models yolonas-n-pose --epochs 30 --imgsz 160 --batch 16 --device cpu --seed 0
"""
import os
import runpy
import sys
from pathlib import Path

import torch

from libreyolo.models.yolonas import pose_nn

SCALE = float(os.environ.get("KPT_GRAD", "0.25"))


class _GradScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * SCALE


def forward(self, x):
    box = self.bbox_stem(x)
    cls = self.cls_pred(self.cls_convs(box))
    return (cls[:, :self.nc], self.reg_pred(self.reg_convs(box)),
            self.pose_pred(self.pose_convs(self.pose_stem(_GradScale.apply(x)))), cls[:, self.nc:])


pose_nn.PoseDFLHead.forward = forward
sys.argv[0] = str(Path(__file__).parents[2] / "task_quality.py")
runpy.run_path(sys.argv[0], run_name="__main__")
