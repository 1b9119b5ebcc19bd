"""Two CPU epochs of the EC pose variant on the built-in shapes-pose set lift its OKS mAP on the
held-out split above the untrained model's."""
import torch

from libreyolo import LibreYOLO
from libreyolo.tasks.pose.synthetic import make_shapes_pose_dataset


def test_two_epochs_on_shapes_pose_raise_oks_map(tmp_path):
    torch.manual_seed(0)
    data = str(make_shapes_pose_dataset(tmp_path / "sp", n_train=32, n_val=8, imgsz=64, seed=0))
    model = LibreYOLO.new("ec", "s", task="pose", device="cpu", seed=0)
    before = model.val(data=data, imgsz=64, batch=4, workers=0, verbose=False)
    # optimizer steps every batch (nbs = batch), from the first step (no warm-up), raw weights (no EMA)
    model.train(data=data, epochs=2, imgsz=64, batch=4, workers=0, lr0=1e-3, warmup_epochs=0, ema=False, nbs=4,
                seed=0, project=str(tmp_path / "runs"), name="pose", verbose=False, plots=False)
    after = model.val(data=data, imgsz=64, batch=4, workers=0, verbose=False)
    assert after["oks_map50"] > before["oks_map50"] and after["oks_map50_95"] > before["oks_map50_95"]
    reloaded = LibreYOLO(str(tmp_path / "runs" / "pose" / "weights" / "last.pt"), device="cpu")
    assert reloaded.TASK == "pose" and reloaded.num_keypoints == 4 and reloaded.meta["flip_idx"] == [1, 0, 3, 2]
