"""Pose datasets (YOLO-pose labels, shapes-pose, flip by flip_idx, bad labels named by file and
line) and the OKS mAP metric."""
import numpy as np
import pytest
import torch

from libreyolo.tasks.pose.data import (
    PoseDataset,
    bucket_rows,
    collate_pose,
    flip_keypoints,
    parse_pose_labels,
    random_affine,
    resolve_pose_data,
)
from libreyolo.tasks.pose.metrics import oks_map
from libreyolo.tasks.pose.synthetic import make_shapes_pose_dataset


@pytest.fixture(scope="module")
def shapes_pose(tmp_path_factory):
    return make_shapes_pose_dataset(tmp_path_factory.mktemp("sp") / "set", n_train=6, n_val=3, imgsz=96, seed=0)


def test_shapes_pose_labels_are_quad_corners_with_visibility(shapes_pose):
    cfg = resolve_pose_data(shapes_pose)
    assert cfg.kpt_shape == (4, 3) and cfg.flip_idx == (1, 0, 3, 2) and cfg.nc == 1
    assert cfg.skeleton == ((0, 1), (1, 2), (2, 3), (3, 0)) and len(cfg.train) == 6 and len(cfg.val) == 3
    kpts = np.concatenate([s.kpts for s in cfg.train])
    assert set(np.unique(kpts[..., 2]).tolist()) <= {1.0, 2.0} and (kpts[..., 2] == 2).any()
    boxes = np.concatenate([s.boxes for s in cfg.train])
    # the box is the corners' extent
    lo, hi = kpts[..., :2].min(1), kpts[..., :2].max(1)
    assert np.allclose((lo + hi) / 2, boxes[:, :2], atol=1e-5) and np.allclose(hi - lo, boxes[:, 2:], atol=1e-5)
    # tl is left of tr, bl left of br (the roles a flip swaps)
    assert (kpts[:, 0, 0] < kpts[:, 1, 0]).all() and (kpts[:, 3, 0] < kpts[:, 2, 0]).all()


def test_flip_swaps_left_and_right_by_flip_idx(shapes_pose):
    cfg = resolve_pose_data(shapes_pose)
    s = cfg.train[0]
    flipped = flip_keypoints(s.kpts, cfg.flip_idx)
    assert np.allclose(flipped[:, 0, 0], 1 - s.kpts[:, 1, 0]) and np.allclose(flipped[:, 0, 1], s.kpts[:, 1, 1])
    assert (flipped[:, 0, 0] < flipped[:, 1, 0]).all()       # still top-left, top-right
    ds = PoseDataset(cfg.train, 64, cfg.flip_idx, augment=True, fliplr=1.0)
    plain = PoseDataset(cfg.train, 64, cfg.flip_idx)
    img_f, _, box_f, kp_f = ds[0]
    img, _, box, kp = plain[0]
    assert torch.equal(img_f, img.flip(-1))
    assert torch.allclose(box_f[:, 0], 1 - box[:, 0]) and torch.allclose(kp_f, torch.from_numpy(flipped))


def test_random_affine_moves_image_boxes_and_keypoints_together():
    """A zoom and shift keeps each pixel, box and keypoint in register (a white quad's corners stay
    on its corners), clamps boxes, drops instances mostly outside, unlabels keypoints that leave."""
    img = torch.full((3, 64, 64), 30, dtype=torch.uint8)
    img[:, 16:32, 8:40] = 250                                      # rows 16-31, columns 8-39
    boxes = torch.tensor([[24 / 64, 24 / 64, 32 / 64, 16 / 64], [61.75 / 64, 61.75 / 64, 3.5 / 64, 3.5 / 64]])
    kpts = torch.tensor([[[8, 16, 2], [40, 16, 2], [40, 32, 1], [8, 32, 0]],
                         [[60, 60, 2], [63.5, 60, 2], [63.5, 63.5, 2], [60, 63.5, 2]]], dtype=torch.float32)
    kpts[..., :2] /= 64
    torch.manual_seed(0)
    seen_drop = seen_unlabel = False
    for _ in range(40):
        out_img, cls, b, k = random_affine(img, torch.tensor([0, 0]), boxes, kpts, scale=0.5, translate=0.2)
        assert out_img.shape == img.shape and out_img.dtype == torch.uint8
        assert len(cls) == len(b) == len(k) and (b[:, 2:] > 0).all()
        x1y1, x2y2 = (b[:, :2] - b[:, 2:] / 2) * 64, (b[:, :2] + b[:, 2:] / 2) * 64
        assert (x1y1 >= -1e-4).all() and (x2y2 <= 64 + 1e-4).all()   # clamped to the image
        seen_drop |= len(cls) < 2
        if len(cls) and b[0, 2] * 64 > 6 and b[0, 3] * 64 > 6:    # the quad kept and not tiny
            c = (b[0, :2] * 64).long()
            if 0 <= c[0] < 64 and 0 <= c[1] < 64:
                assert out_img[0, c[1], c[0]] > 200                 # its box centre still on the quad
            tl = k[0, 0]
            if tl[2] > 0:                                           # the top-left corner at the box's
                assert torch.allclose(tl[:2] * 64, x1y1[0], atol=1e-3)
            seen_unlabel |= bool((k[0, :3, 2] == 0).any())
        assert (k[0, 3] == 0).all() if len(cls) else True            # unlabelled stays unlabelled
    assert seen_drop and seen_unlabel
    # no zoom, no shift: the sample itself
    same = random_affine(img, torch.tensor([0, 0]), boxes, kpts, scale=0.0, translate=0.0)
    assert torch.equal(same[0], img) and torch.allclose(same[2], boxes) and torch.allclose(same[3][:, :3], kpts[:, :3])


def test_pose_dataset_applies_the_affine_only_when_asked(shapes_pose):
    cfg = resolve_pose_data(shapes_pose)
    plain = PoseDataset(cfg.train, 64, cfg.flip_idx, augment=True, fliplr=0.0)
    moved = PoseDataset(cfg.train, 64, cfg.flip_idx, augment=True, fliplr=0.0, scale=0.5, translate=0.1)
    torch.manual_seed(1)
    a = [plain[i][0] for i in range(len(cfg.train))]
    b = [moved[i][0] for i in range(len(cfg.train))]
    assert all(torch.equal(x, PoseDataset(cfg.train, 64, cfg.flip_idx)[i][0]) for i, x in enumerate(a))
    assert any(not torch.equal(x, y) for x, y in zip(a, b))


def test_collate_pads_instances_to_a_bucketed_count(shapes_pose):
    cfg = resolve_pose_data(shapes_pose)
    ds = PoseDataset(cfg.train, 64, cfg.flip_idx)
    images, cls, boxes, kpts, mask = collate_pose([ds[0], ds[1]], bucket=4)
    n = max(len(cfg.train[0].cls), len(cfg.train[1].cls))
    assert images.shape == (2, 3, 64, 64) and mask.shape[1] == bucket_rows(n, 4) and kpts.shape[2:] == (4, 3)
    assert mask.sum().item() == len(cfg.train[0].cls) + len(cfg.train[1].cls)
    assert bucket_rows(5, 4) == 8 and bucket_rows(1, 4) == 4 and bucket_rows(17, 4) == 32


def test_bad_pose_labels_are_reported_together_naming_file_and_line(tmp_path):
    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "labels" / "train").mkdir(parents=True)
    from PIL import Image
    for i in range(2):
        Image.new("RGB", (32, 32)).save(tmp_path / "images" / "train" / f"a{i}.jpg")
    good = "0 0.5 0.5 0.2 0.2 0.4 0.4 2 0.6 0.4 2"
    (tmp_path / "labels" / "train" / "a0.txt").write_text(good + "\n" + good + " 0.7 0.7 2\n")
    (tmp_path / "labels" / "train" / "a1.txt").write_text("0 0.5 0.5 0.2 0.2 1.4 0.4 2 0.6 0.4 2\n")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [thing]\n"
                                        "kpt_shape: [2, 3]\nflip_idx: [1, 0]\n")
    with pytest.raises(ValueError) as e:
        resolve_pose_data(tmp_path / "data.yaml")
    msg = str(e.value)
    assert "labels/train/a0.txt:2" in msg and "3 keypoints" in msg
    assert "labels/train/a1.txt:1" in msg and "keypoint 0 at (1.4, 0.4) is outside the image" in msg
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [thing]\n")
    with pytest.raises(ValueError, match="kpt_shape"):
        resolve_pose_data(tmp_path / "data.yaml")


def test_two_value_keypoints_are_visible_and_unlabelled_ones_ignored(tmp_path):
    lab = tmp_path / "a.txt"
    lab.write_text("0 0.5 0.5 0.2 0.2 0.4 0.4 5.0 5.0\n")
    cls, boxes, kpts, problems = parse_pose_labels(lab, 1, (2, 2), "a.txt")
    assert problems and "outside the image" in problems[0]
    lab.write_text("0 0.5 0.5 0.2 0.2 0.4 0.4 2 5.0 5.0 0\n")
    cls, boxes, kpts, problems = parse_pose_labels(lab, 1, (2, 3), "a.txt")
    assert not problems and kpts[0].tolist() == [[pytest.approx(0.4), pytest.approx(0.4), 2.0], [0.0, 0.0, 0.0]]


def test_oks_map_rewards_accurate_keypoints():
    gk = np.array([[[10, 10, 2], [50, 10, 2], [50, 60, 2], [10, 60, 1]]], float)
    gt = [{"boxes": np.array([[10, 10, 50, 60]], float), "kpts": gk, "cls": np.array([0])}]

    def pred(offset):
        return [{"boxes": np.array([[10, 10, 50, 60]], float), "scores": np.array([0.9]),
                 "kpts": gk[:, :, :2] + offset}]

    exact, close, far = (oks_map(pred(o), gt, [0.05] * 4) for o in (0.0, 2.0, 40.0))
    assert exact == {"oks_map50": 1.0, "oks_map50_95": 1.0, "map50": 1.0, "map50_95": 1.0}
    assert close["oks_map50"] == 1.0 and 0.0 < close["oks_map50_95"] < 1.0
    assert far["oks_map50"] == 0.0 and far["oks_map50_95"] == 0.0
    # the boxes are exact in all three: the box mAP tells the instances from their keypoints
    assert close["map50_95"] == far["map50_95"] == 1.0


def test_box_map_of_pose_predictions_follows_the_boxes():
    gk = np.array([[[10, 10, 2], [50, 10, 2], [50, 60, 2], [10, 60, 2]]], float)
    gt = [{"boxes": np.array([[10, 10, 50, 60]], float), "kpts": gk, "cls": np.array([0])}]
    shifted = [{"boxes": np.array([[30, 10, 70, 60]], float), "scores": np.array([0.9]), "kpts": gk[:, :, :2]}]
    m = oks_map(shifted, gt, [0.05] * 4)   # IoU 1/3: a box miss, the keypoints exact
    assert m["oks_map50"] == 1.0 and m["map50"] == 0.0 and m["map50_95"] == 0.0


def test_missing_data_lists_the_built_in_pose_set():
    with pytest.raises(ValueError, match="'shapes-pose'"):
        resolve_pose_data(None)
