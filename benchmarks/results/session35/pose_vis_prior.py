"""Experiment driver (session 35, CPU): YOLO-NAS-Pose with its keypoint-visibility logits
initialised at 0 (probability 0.5) instead of the class rows' 1 % prior (VIS0=1), which the
head's ``cls_pred`` gives every row today: on ``shapes-pose`` most keypoints are labelled, so the
visibility focal loss starts far from its targets and pulls on the convolutions it shares with
the class logits. Then task_quality.py of the tree this file sits in, with the same arguments.
Run on the tree before that init became YOLO-NAS-Pose's own (session 35); after it, both arms are
the new default."""
import os
import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from libreyolo.models.yolonas.pose import YoloNASPose  # noqa: E402

_init = YoloNASPose.init_for_training


def init_for_training(self, net, prior: float = 0.01) -> int:
    touched = _init(self, net, prior)
    if os.environ.get("VIS0"):
        with torch.no_grad():
            for i in (1, 2, 3):
                head = getattr(net.heads, f"head{i}")
                head.cls_pred.bias[head.nc:] = 0.0
        print("visibility logits' bias set to 0", flush=True)
    return touched


YoloNASPose.init_for_training = init_for_training
sys.argv = ["task_quality.py"] + sys.argv[1:]
runpy.run_path(str(ROOT / "benchmarks" / "task_quality.py"), run_name="__main__")
