"""The pose task: the EC pose variant's predict (top-k, keypoints back in image pixels), the
Keypoints result field (plot, json) and the task-variant selection of the factory."""
import json

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.ec.pose import ECPose, pose_postprocess
from libreyolo.results import Results
from libreyolo.tasks.pose import COCO_SKELETON, Keypoints
from libreyolo.tasks.pose.task import unletterbox_keypoints


@pytest.fixture(scope="module")
def pose_model():
    return LibreYOLO.new("ec", "s", task="pose", device="cpu", seed=0)


def test_postprocess_top_k_boxes_are_keypoint_extents():
    logits = torch.tensor([[[0.0, -3.0], [0.0, 2.0], [0.0, 0.5]]])            # person score = last logit
    kpts = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.25, 0.75], [0.9, 0.1, 0.8, 0.2]]])
    boxes, scores, cls, pts = pose_postprocess(logits, kpts, width=200, height=100, num_top=2)
    assert torch.allclose(scores, torch.sigmoid(torch.tensor([[2.0, 0.5]])))
    assert cls.tolist() == [[0, 0]]
    assert torch.allclose(pts[0, 0], torch.tensor([[100.0, 50.0], [50.0, 75.0]]))
    assert torch.allclose(boxes[0, 0], torch.tensor([50.0, 50.0, 100.0, 75.0]))
    assert torch.allclose(boxes[0, 1], torch.tensor([160.0, 10.0, 180.0, 20.0]))


def test_keypoints_map_back_to_image_pixels():
    pts = np.array([[[32.0, 16.0], [0.0, 64.0]]], np.float32)
    unletterbox_keypoints(pts, sx=0.5, sy=0.25, pad_x=0, pad_y=0)
    assert pts.tolist() == [[[64.0, 64.0], [0.0, 256.0]]]


def test_predict_gives_keypoints_per_instance_in_original_pixels(pose_model, monkeypatch):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (96, 160, 3), dtype=np.uint8)
    seen = []
    infer = pose_model.infer
    monkeypatch.setattr(pose_model, "infer", lambda x: seen.append(infer(x)) or seen[-1])
    r = pose_model(image, conf=0.0, imgsz=128)   # one image: its one Results
    assert isinstance(r, Results)
    n = len(r.boxes)
    assert n == ECPose.NUM_TOP
    assert r.keypoints.xy.shape == (n, 17, 2) and r.keypoints.conf.shape == (n, 17)
    # the canvas keypoints (128 x 128, stretched) scaled back to the 160 x 96 image
    canvas = seen[-1][3][0]
    assert torch.allclose(r.keypoints.xy, canvas * torch.tensor([160 / 128, 96 / 128]), atol=1e-3)
    xy = r.keypoints.xy
    assert torch.all(torch.isfinite(xy))
    extent = torch.cat((xy.amin(1), xy.amax(1)), -1).clamp(min=0)
    extent[:, 0::2] = extent[:, 0::2].clamp(max=160)
    extent[:, 1::2] = extent[:, 1::2].clamp(max=96)
    assert torch.allclose(r.boxes.xyxy, extent, atol=1e-3)
    assert torch.equal(r.keypoints.conf, r.boxes.conf[:, None].expand(-1, 17))
    rows = json.loads(r.to_json())
    assert len(rows) == n and len(rows[0]["keypoints"]) == 17
    assert set(rows[0]["keypoints"][0]) == {"x", "y", "conf"}
    assert r.plot().shape == (96, 160, 3)


def test_keypoints_plot_draws_the_skeleton():
    data = torch.zeros(1, 17, 3)
    data[0, :, 0] = torch.linspace(10, 90, 17)
    data[0, :, 1] = 50
    data[0, :, 2] = 1.0
    kp = Keypoints(data, (100, 100))
    assert kp.skeleton == COCO_SKELETON
    blank = np.zeros((100, 100, 3), np.uint8)
    drawn = kp.plot_on(blank, {0: "person"})
    assert drawn[50, 10].any() and drawn[50, 90].any() and not drawn[5, 5].any()
    low = Keypoints(data * torch.tensor([1.0, 1.0, 0.1]), (100, 100))      # below the drawing confidence
    assert not low.plot_on(blank, {0: "person"}).any()
    assert kp[0].shape == (1, 17, 3) and kp.xyn.max() <= 1.0


def test_keypoints_reject_a_bad_shape():
    with pytest.raises(ValueError, match=r"\(n, K, 3\)"):
        Keypoints(torch.zeros(2, 17, 2), (10, 10))


def test_task_variant_is_chosen_by_task_and_by_checkpoint(tmp_path, pose_model):
    assert isinstance(pose_model, ECPose) and pose_model.TASK == "pose" and pose_model.names == {0: "person"}
    assert type(LibreYOLO.new("ec", "s", device="cpu")).__name__ == "EC"
    with pytest.raises(ValueError, match="serves the tasks detect, pose"):
        LibreYOLO.new("ec", "s", task="obb", device="cpu")
    path = pose_model.save(tmp_path / "pose.pt")
    loaded = LibreYOLO(str(path), device="cpu")
    assert isinstance(loaded, ECPose) and loaded.task == "pose" and loaded.task_def.name == "pose"
    x = torch.rand(1, 3, 128, 128)
    with torch.no_grad():
        a, b = pose_model.model(x), loaded.model(x)
    assert torch.equal(a["pred_keypoints"], b["pred_keypoints"])


def _pose_batch(bucket):
    from libreyolo.tasks.pose.data import PoseDataset, PoseSample, collate_pose
    samples = []
    for n in (1, 3):
        kp = np.zeros((n, 17, 3), np.float32)
        kp[..., 0] = np.linspace(0.2, 0.8, 17)
        kp[..., 1] = np.linspace(0.3, 0.6, n)[:, None]
        kp[..., 2] = 2.0
        kp[:, 5, 2] = 0.0
        boxes = np.tile(np.array([[0.5, 0.45, 0.6, 0.3]], np.float32), (n, 1))
        samples.append(PoseSample(None, (64, 64), np.zeros(n, np.int64), boxes, kp))
    ds = PoseDataset(samples, 64, tuple(range(17)))
    items = [(torch.zeros(3, 64, 64, dtype=torch.uint8), torch.from_numpy(s.cls), torch.from_numpy(s.boxes),
              torch.from_numpy(s.kpts)) for s in ds.samples]
    return collate_pose(items, bucket=bucket)


def test_pose_loss_ignores_padding_and_trains_every_output(pose_model):
    net = pose_model.model
    loss_fn = pose_model.build_loss()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    net.train()
    try:
        out = pose_model.train_forward(net, x)
        small, large = _pose_batch(4), _pose_batch(16)
        assert small[1].shape[1] == 4 and large[1].shape[1] == 16
        loss_a, items_a = loss_fn(out, *small[1:])
        loss_b, items_b = loss_fn(out, *large[1:])
        assert torch.equal(items_a, items_b) and torch.isfinite(loss_a)
        assert len(out["aux_outputs"]) == 2 and "pre_outputs" in out and "enc_outputs" in out
        loss_a.backward()
        for name in ("decoder.class_embed.2.weight", "decoder.pose_embed.0.layers.2.weight",
                     "decoder.enc_pose_embed.layers.3.weight", "backbone.backbone.blocks.0.attn.qkv.weight"):
            g = net.get_parameter(name).grad
            assert g is not None and g.abs().sum() > 0, name
    finally:
        net.zero_grad(set_to_none=True)
        net.eval()


def test_val_on_shapes_pose_reports_oks_map(tmp_path):
    from libreyolo.tasks.pose.synthetic import make_shapes_pose_dataset
    data = make_shapes_pose_dataset(tmp_path / "sp", n_train=2, n_val=2, imgsz=64, seed=0)
    model = LibreYOLO.new("ec", "s", task="pose", device="cpu", seed=0)
    metrics = model.val(data=str(data), imgsz=64, batch=2, workers=0)
    assert set(metrics) >= {"oks_map50", "oks_map50_95"} and model.num_keypoints == 4
    assert model.meta["flip_idx"] == [1, 0, 3, 2] and model.meta["kpt_shape"] == [4, 3]


def test_yolonas_pose_ranks_nan_scores_last():
    """A NaN score (an overflowing network) sorts after every real one, as -inf: the in-stage NMS
    walk reads the candidates above conf as a prefix of each row, so a NaN at the head would
    hide every real instance behind it."""
    m = LibreYOLO.new("yolonas", "n", task="pose", seed=0)
    net = m.model.eval()
    real = net.forward

    def with_nans(x):
        (boxes, scores, kpts, vis), aux = real(x)
        scores = scores.clone()
        scores[:, :7] = float("nan")
        return (boxes, scores, kpts, vis), aux

    net.forward = with_nans
    boxes, scores, *_ = m.infer(torch.rand(2, 3, 96, 96))
    k = scores.shape[1]
    assert torch.isfinite(scores[:, : k - 7]).all()
    assert torch.equal(scores[:, k - 7:], torch.full((2, 7), float("-inf")))
    assert (scores[:, :-1] >= scores[:, 1:]).all()


def test_yolonas_pose_keypoint_gradient_scale_touches_only_the_keypoint_branch_backward():
    """kpt_grad multiplies exactly the keypoint branch's gradient into the shared features; the
    forward, the box branch's gradient and a no-grad call are unchanged."""
    from libreyolo.models.yolonas.pose_nn import PoseDFLHead
    torch.manual_seed(0)
    head = PoseDFLHead(16, 16, 16, 2, nc=1, num_keypoints=4).train()
    x = torch.randn(2, 16, 6, 6)
    w = [torch.randn(2, c, 6, 6) for c in (1, 68, 8, 4)]

    def grads(scale: float, which: tuple[int, ...]):
        head.kpt_grad = scale
        xi = x.clone().requires_grad_()
        out = head(xi)
        sum((out[i] * w[i]).sum() for i in which).backward()
        return out, xi.grad

    out1, g_pose1 = grads(1.0, (2,))
    out4, g_pose4 = grads(0.25, (2,))
    assert all(torch.equal(a, b) for a, b in zip(out1, out4))
    assert torch.allclose(g_pose4, g_pose1 * 0.25, rtol=0, atol=0)   # a power of two: exact
    assert torch.equal(grads(1.0, (0, 1, 3))[1], grads(0.25, (0, 1, 3))[1])   # classes, boxes, visibility
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(head(x), out1))


def test_kpt_grad_option_reaches_the_heads_and_is_refused_where_no_branch_exists():
    from libreyolo.options import OptionError
    from libreyolo.tasks.pose.task import PoseOptions, PoseTask
    model = LibreYOLO.new("yolonas", "n", task="pose", device="cpu", seed=0)
    scales = lambda: {m.kpt_grad for m in model.model.modules() if hasattr(m, "kpt_grad")}  # noqa: E731
    PoseTask().prepare_training(model, model.model, PoseOptions(kpt_grad=0.25))
    assert scales() == {0.25}
    PoseTask().prepare_training(model, model.model, PoseOptions())   # a later run: the family's default
    assert scales() == {model.KPT_GRAD}
    with pytest.raises(OptionError, match="kpt_grad"):
        PoseOptions(kpt_grad=0.0)
    ec = LibreYOLO.new("ec", "s", task="pose", device="cpu", seed=0)
    PoseTask().prepare_training(ec, ec.model, PoseOptions())   # nothing to do
    with pytest.raises(OptionError, match="no separate keypoint branch"):
        PoseTask().prepare_training(ec, ec.model, PoseOptions(kpt_grad=0.5))
