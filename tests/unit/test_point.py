"""The point task and the FOMO family on the CPU: the network's sizes and padding, the peak stage,
mapping back to the image, Results.points, labels (points and YOLO boxes) and their errors, the
centroid grid, the loss, the metrics' matching, predict through Python and the CLI, val, ONNX,
and two training epochs on the built-in set. The fixture reproduction is a row of
``rows.FIXTURES`` (tests/unit/test_fixtures.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.models.fomo.nn import CONFIGS, FomoNet, make_divisible, same_padding
from libreyolo.tasks.point.data import centroid_grid, collate_point, parse_point_labels, resolve_point_data
from libreyolo.tasks.point.metrics import match_points, point_counts, prf
from libreyolo.tasks.point.results import Points
from libreyolo.tasks.point.synthetic import make_shapes_point_dataset
from libreyolo.tasks.point.task import CentroidLoss, point_candidates

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def model():
    """fomo-s with 3 classes, the fixtures' deterministic fill (spread-out scores) and a seeded head."""
    from fill import fill_state_dict
    m = LibreYOLO.new("fomo", "s", nc=3, device="cpu")
    layout = [[k, list(v.shape), str(v.dtype)] for k, v in m.model.state_dict().items()]
    m.load_state_dict(fill_state_dict(layout))
    # a seeded head on the features' deviation from their mean over a calibration image: under the
    # fill alone the features barely vary across the image and one class wins every cell
    head = m.model.head
    with torch.no_grad():
        x = m.preprocess(torch.from_numpy(np.array(Image.open(SAMPLE_IMAGE).convert("RGB")))[None], 96)
        feats = m.model.backbone(x)
        w = torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0)) / feats.std()
        head.weight.copy_(w)
        head.bias.copy_(-(w[:, :, 0, 0] @ feats.mean((0, 2, 3))))
    return m


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_shapes_point_dataset(tmp_path_factory.mktemp("sp") / "set", n_train=96, n_val=32, seed=0)


def _logits(h, w, nc, peaks, low=-4.0):
    """(1, 1 + nc, h, w) logits: background everywhere, ``peaks`` {(row, col): (class, logit)}."""
    x = torch.full((1, 1 + nc, h, w), low)
    x[:, 0] = 4.0
    for (r, c), (k, v) in peaks.items():
        x[0, 1 + k, r, c] = v
    return x


# ------------------------------------------------------------------------------------------ network

def test_sizes_are_librefomos():
    """s / m / l: MobileNetV2 at alpha 0.35 / 0.5 / 1.0 cut at block_6_expand, native 96 / 192 / 224."""
    counts = {s: sum(p.numel() for p in FomoNet(s, 1).parameters()) for s in CONFIGS}
    assert counts == {"s": 16_034, "m": 21_922, "l": 62_402}   # s: the fixture's count
    assert {s: c.imgsz for s, c in CONFIGS.items()} == {"s": 96, "m": 192, "l": 224}
    assert [make_divisible(v) for v in (11.2, 5.6, 8.4, 12.0, 32.0)] == [16, 8, 8, 16, 32]
    assert FomoNet("l", 1).head.in_channels == 192 and FomoNet("m", 4).head.out_channels == 5
    with torch.no_grad():   # each size at its native input: a 1/8 grid
        for s, side in (("m", 192), ("l", 224)):
            assert FomoNet(s, 2).eval()(torch.rand(1, 3, side, side)).shape == (1, 3, side // 8, side // 8)
    with pytest.raises(ValueError, match="unknown FOMO size 'x'"):
        FomoNet("x")


def test_padding_is_tensorflows_same():
    """A stride-2 3x3 on an even side pads 0 before and 1 after (PyTorch's padding=1 would not)."""
    assert same_padding(96, 3, 2) == (0, 1) and same_padding(95, 3, 2) == (1, 1)
    assert same_padding(12, 3, 1) == (1, 1) and same_padding(12, 1, 1) == (0, 0)
    net = FomoNet("s", 1).eval()
    conv = net.backbone.conv1[0]
    x = torch.randn(1, 3, 16, 16)
    ref = F.conv2d(F.pad(x, (0, 1, 0, 1)), conv.conv.weight, stride=2)
    assert torch.equal(conv(x), ref)
    assert not torch.allclose(conv(x), F.conv2d(x, conv.conv.weight, stride=2, padding=1))


def test_network_needs_multiples_of_8(model):
    with pytest.raises(ValueError, match="multiples of 8, got 100x96"):
        model.model(torch.rand(1, 3, 100, 96))
    with torch.no_grad():
        assert model.model(torch.rand(2, 3, 64, 128)).shape == (2, 4, 8, 16)


def test_declarations(model):
    assert (model.TASK, model.STRIDE, model.imgsz, model.FILE_PREFIX) == ("point", 8, 96, "LibreFOMO")
    assert model.SUPPORTS_CUDA_GRAPH and model.SUPPORTS_CUDA_GRAPH_TRAIN   # both proven on a GPU (docs/families.md)
    p = model.preprocess
    assert (p.resize, p.mean, p.std, p.antialias, p.quantize) == ("stretch", (0.5,) * 3, (0.5,) * 3, True, True)
    assert LibreYOLO.new("fomo", "l", device="cpu").imgsz == 224
    assert model.train_defaults()["imgsz"] == 96


# ------------------------------------------------------------------------------------------ peak stage

def test_peaks_are_cell_centres_sorted_with_radius_suppression():
    x = _logits(6, 8, 2, {(1, 2): (0, 6.0), (1, 3): (0, 5.0), (4, 6): (1, 7.0), (4, 0): (0, 3.0)})
    xy, score, cls = point_candidates(x, 10, 1, 8)
    assert xy.shape == (1, 10, 2) and score.shape == (1, 10) and cls.dtype == torch.int64
    real = score[0] >= 0.5
    # (1, 3) is next to the stronger (1, 2) of its class: suppressed; (4, 0) is a peak of its own
    assert xy[0][real].tolist() == [[52.0, 36.0], [20.0, 12.0]]
    assert cls[0][real].tolist() == [1, 0]
    assert (score[0][:2].diff() <= 0).all()
    xy0, score0, _ = point_candidates(x, 10, 0, 8)   # radius 0: every cell
    assert [28.0, 12.0] in xy0[0][score0[0] >= 0.5].tolist()
    _, s_all, _ = point_candidates(x, 1000, 1, 8)
    assert s_all.shape == (1, 48)   # k is capped by the cells
    # a neighbour of another class does not suppress: the peaks are per class
    y = _logits(4, 4, 2, {(1, 1): (0, 6.0), (1, 2): (1, 5.0)})
    _, sy, cy = point_candidates(y, 4, 1, 8)
    assert sorted(cy[0][sy[0] >= 0.5].tolist()) == [0, 1]


def test_predict_maps_points_back_to_the_image(model):
    """A stretched 200x100 image: canvas x * 200 / 96, y * 100 / 96; conf, classes and max_det filter."""
    img = np.random.default_rng(0).integers(0, 256, (100, 200, 3), dtype=np.uint8)
    r = model(img, conf=0.0, max_det=50, bgr=False)
    pts = r.points
    assert isinstance(pts, Points) and 0 < len(pts) <= 50 and pts.data.shape[1] == 4
    with torch.no_grad():
        x = model.preprocess(torch.from_numpy(img)[None], 96)
        xy, score, cls = point_candidates(model.infer(x), 50, 1, 8)
    keep = score[0] >= 0
    assert np.allclose(pts.xy.numpy(), (xy[0][keep] * torch.tensor([200 / 96, 100 / 96])).numpy(), atol=1e-4)
    assert np.array_equal(pts.cls.numpy(), cls[0][keep].float().numpy())
    assert ((pts.xy[:, 0] > 0) & (pts.xy[:, 0] < 200) & (pts.xy[:, 1] > 0) & (pts.xy[:, 1] < 100)).all()
    conf = float(pts.conf.median())
    assert (model(img, conf=conf).points.conf >= conf).all()
    present = sorted(set(int(c) for c in pts.cls.tolist()))
    assert len(present) > 1   # the fill gives more than one class: the filter has work to do
    assert set(model(img, conf=0.0, classes=[present[-1]]).points.cls.tolist()) == {float(present[-1])}
    assert set(model(img, conf=0.0, classes=f"class{present[0]}").points.cls.tolist()) == {float(present[0])}
    assert len(model(img, conf=0.0, max_det=3).points) == 3
    wider = model(img, conf=0.0, nms_radius=2, max_det=300)
    assert len(wider.points) < len(model(img, conf=0.0, max_det=300).points)


def test_bad_predict_options_are_named(model):
    img = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(Exception, match="nms_radius"):
        model(img, nms_radius=-1)
    with pytest.raises(Exception, match="conf"):
        model(img, conf=1.5)
    with pytest.raises(TypeError, match="unknown predict option.*iou"):
        model(img, iou=0.5)


# ------------------------------------------------------------------------------------------ results

def test_points_result_plot_save_json(model, tmp_path):
    img = np.full((60, 80, 3), 40, np.uint8)
    data = torch.tensor([[10.0, 20.0, 0.9, 0.0], [60.0, 30.0, 0.5, 2.0]])
    from libreyolo.results import Results, class_color
    r = Results(img, "a.png", {0: "a", 1: "b", 2: "c"}, None, points=Points(data, (60, 80)))
    drawn = r.plot()
    assert tuple(drawn[20, 10]) == class_color(0) and tuple(drawn[30, 60]) == class_color(2)
    assert tuple(drawn[5, 70]) == (40, 40, 40)
    summary = json.loads(r.to_json())
    assert summary == [{"name": "a", "class": 0, "confidence": 0.9, "point": {"x": 10.0, "y": 20.0}},
                       {"name": "c", "class": 2, "confidence": 0.5, "point": {"x": 60.0, "y": 30.0}}]
    assert r.points.summary(r.names, normalize=True)[1]["point"] == {"x": 0.75, "y": 0.5}
    assert np.allclose(r.points.xyn.numpy(), [[0.125, 1 / 3], [0.75, 0.5]])
    path = r.save(tmp_path / "p.png")
    assert Image.open(path).size == (80, 60)
    assert len(r) == 2 and len(r.points[0]) == 1 and isinstance(r.numpy().points.data, np.ndarray) and len(r.cpu().points) == 2
    with pytest.raises(ValueError, match=r"\(n, 4\)"):
        Points(torch.zeros(2, 3), (1, 1))
    live = model(SAMPLE_IMAGE, conf=0.5)
    assert live.points.orig_shape == live.orig_shape and "points=Points" in repr(live)


# ------------------------------------------------------------------------------------------ data

def test_labels_points_boxes_and_mixed(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("0 0.5 0.25\n1 0.2 0.4 0.1 0.2\n\n2 1 0\n")
    cls, pts, problems = parse_point_labels(f, 3, "a.txt")
    assert problems == [] and cls.tolist() == [0, 1, 2]
    assert np.allclose(pts, [[0.5, 0.25], [0.2, 0.4], [1.0, 0.0]])
    cls, pts, problems = parse_point_labels(tmp_path / "missing.txt", 3, "missing.txt")
    assert problems == [] and cls.shape == (0,) and pts.shape == (0, 2)


def test_bad_label_rows_reported_together(tmp_path):
    root = tmp_path / "ds"
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        Image.new("RGB", (40, 30)).save(root / "images" / split / "a.png")
    (root / "labels" / "train" / "a.txt").write_text(
        "0 0.5 0.5\n0 0.5\n5 0.1 0.1\nx 0.1 0.1\n0 1.5 0.2\n0 0.5 0.5 0 0.1\n0 nan 0.5\n1 0.1 0.2 0.3 0.4 0.5 0.6\n")
    (root / "images" / "val" / "b.jpg").write_bytes(b"not an image")
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a, b]\n")
    with pytest.raises(ValueError) as err:
        resolve_point_data(str(root / "data.yaml"))
    text = str(err.value)
    assert "has 8 problems" in text
    for want in ("labels/train/a.txt:2: 2 values", "a.txt:3: class 5 is not an integer in [0, 1]",
                 "a.txt:4: a value is not a number", "a.txt:5: the point (1.5, 0.2) is outside the image",
                 "a.txt:6: the box", "a.txt:7: a value is not finite", "a.txt:8: 7 values",
                 "images/val/b.jpg: cannot read image"):
        assert want in text, want
    with pytest.raises(ValueError, match="data is required"):
        resolve_point_data(None)
    with pytest.raises(FileNotFoundError, match="shapes-point"):
        resolve_point_data(str(tmp_path / "nowhere.yaml"))
    (root / "coco.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a]\nformat: coco\n")
    with pytest.raises(ValueError, match="YOLO-style label files"):
        resolve_point_data(str(root / "coco.yaml"))


def test_builtin_set_and_collate(dataset, model):
    data = resolve_point_data(str(dataset))
    assert data.nc == 2 and data.names == {0: "disc", 1: "square"} and len(data.train) == 96
    assert sum(len(s.cls) for s in data.val) > 0
    train, val, collate = model.task_def.datasets(data, 96, model, model.task_def.Options())
    images, grid, cls, pts, mask = collate([val[i] for i in range(4)])
    assert images.shape == (4, 3, 96, 96) and images.dtype == torch.uint8 and grid.shape == (4, 12, 12)
    assert cls.shape[1] % 16 == 0 and pts.shape == (*cls.shape, 2) and mask.sum() == sum(len(s.cls) for s in
                                                                                         data.val[:4])
    for i in range(4):   # every point's cell holds 1 + its class (the shapes keep 16 px apart)
        p = pts[i][mask[i]]
        cells = grid[i][(p[:, 1] * 12).long(), (p[:, 0] * 12).long()]
        assert torch.equal(cells, cls[i][mask[i]] + 1)
    assert int((grid > 0).sum()) == int(mask.sum())


def test_centroid_grid_cells():
    g = centroid_grid(torch.tensor([0, 1, 2]), torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.51, 0.26]]), 4, 4)
    assert g[0, 0] == 1 and g[3, 3] == 2 and g[1, 2] == 3 and int((g > 0).sum()) == 3
    _, grid, *_ = collate_point([(torch.zeros(3, 16, 24, dtype=torch.uint8), torch.zeros(0, dtype=torch.long),
                                  torch.zeros(0, 2))])
    assert grid.shape == (1, 2, 3) and not grid.any()


# ------------------------------------------------------------------------------------------ loss, metrics

def test_loss_is_fomos_weighted_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    grid = torch.zeros(2, 4, 4, dtype=torch.long)
    grid[0, 1, 2], grid[1, 3, 0] = 1, 2
    loss, items = CentroidLoss(100.0)(logits, grid)
    ce = F.cross_entropy(logits, grid, reduction="none")
    assert torch.allclose(loss, (ce * (1 + 99 * (grid > 0))).mean()) and items.shape == (1,)
    loss.backward()
    assert logits.grad is not None
    with pytest.raises(ValueError, match="grid"):
        CentroidLoss()(logits, grid[:, :2])


def test_matching_is_the_optimal_assignment_within_the_radius():
    # greedy nearest-first would pair p0 with g1 (0.9 away) and leave g0 unmatched; the assignment
    # matches both
    pred = np.array([[1.0, 0.0], [2.5, 0.0]])
    gt = np.array([[0.0, 0.0], [1.9, 0.0]])
    i, j = match_points(pred, gt, 1.0)
    assert sorted(zip(i.tolist(), j.tolist())) == [(0, 0), (1, 1)]
    assert len(match_points(pred, gt, 0.5)[0]) == 0
    assert len(match_points(np.zeros((0, 2)), gt, 1.0)[0]) == 0
    tp, fp, fn, dist = point_counts(np.array([[0.0, 0.0], [5.0, 5.0], [9.0, 9.0]]), np.array([0, 0, 1]),
                                    np.array([[1.0, 0.0], [9.0, 9.0]]), np.array([0, 0]), 2.0, 2)
    assert tp.tolist() == [1, 0] and fp.tolist() == [1, 1] and fn.tolist() == [1, 0] and dist == 1.0
    assert prf(1, 1, 1) == (0.5, 0.5, 0.5) and prf(0, 0, 0) == (0.0, 0.0, 0.0)


# ------------------------------------------------------------------------------------------ checkpoints, CLI

def test_checkpoint_round_trip_and_cli_predict(model, tmp_path, capsys):
    from libreyolo import cli
    path = model.save(tmp_path / "LibreFOMOs-point.pt")
    back = LibreYOLO(str(path), device="cpu")
    assert (back.FAMILY, back.size, back.TASK, back.nc) == ("fomo", "s", "point", 3)
    img = tmp_path / "img.png"
    Image.open(SAMPLE_IMAGE).convert("RGB").resize((160, 90)).save(img)
    assert torch.equal(back(str(img), conf=0.3).points.data, model(str(img), conf=0.3).points.data)
    # (a bare state dict, sniffed by its keys: test_fixtures.py's fomo-s row)
    capsys.readouterr()
    rc = cli.main(["predict", f"model={path}", f"source={img}", "conf=0.3", "nms_radius=2", "save=true",
                   f"save_dir={tmp_path / 'out'}"])
    assert rc in (0, None)
    assert (tmp_path / "out" / "img.jpg").is_file()
    assert "img.png: 160x90" in capsys.readouterr().out
    assert cli.main(["predict", f"model={path}", f"source={img}", "nms_radius=-1"]) not in (0, None)
    assert "nms_radius" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ ONNX

def test_onnx_export_matches_eager(model, tmp_path):
    """The network's logits in the graph; the loader runs the task's own peak stage: the same points,
    and conf / max_det / nms_radius stay predict-time options. (The dynamic export at another size:
    the fomo-s row of rows.ONNX_MODELS in tests/unit/test_export_onnx.py.)"""
    from libreyolo.export.onnx import read_metadata
    path = model.export(file=tmp_path / "m.onnx")
    assert read_metadata(path)["task"] == "point"
    o = LibreYOLO(str(path), device="cpu")
    for img in (SAMPLE_IMAGE, np.asarray(Image.open(SAMPLE_IMAGE).convert("RGB").resize((333, 517)))):
        e, g = model(img, conf=0.3).points.data, o(img, conf=0.3).points.data
        assert len(e) > 0 and e.shape == g.shape
        assert torch.equal(e[:, [0, 1, 3]], g[:, [0, 1, 3]]) and (e[:, 2] - g[:, 2]).abs().max() <= 1e-5
    assert len(o(SAMPLE_IMAGE, conf=0.0, nms_radius=0, max_det=7).points) == 7


# ------------------------------------------------------------------------------------------ training

def test_one_short_epoch_writes_a_point_run(dataset, tmp_path):
    """The run's files: one epoch of two batches; the checkpoint, results.csv's columns."""
    root = make_shapes_point_dataset(tmp_path / "tiny", n_train=16, n_val=8, seed=1)
    m = LibreYOLO.new("fomo", "s", nc=2, device="cpu", seed=0)
    out = m.train(data=str(root), epochs=1, batch=8, workers=0, project=str(tmp_path / "runs"), name="t",
                  verbose=False, plots=False)
    run = tmp_path / "runs" / "t"
    header = (run / "results.csv").read_text().splitlines()[0]
    assert all(f"metrics/{k}" in header for k in ("f1", "precision", "recall", "mean_distance")), header
    assert (run / "weights" / "best.pt").is_file() and m.trained
    assert "f1" in json.dumps(out, default=str)


def test_two_epochs_on_shapes_point_raise_f1(dataset, tmp_path):
    torch.manual_seed(0)
    data = str(dataset)
    m = LibreYOLO.new("fomo", "s", nc=2, device="cpu", seed=0)
    before = m.val(data=data, batch=16, workers=0)
    assert set(before) >= {"f1", "precision", "recall", "mean_distance"}
    # an optimizer step every batch (nbs = batch), raw weights (no EMA): 48 steps
    m.train(data=data, epochs=2, batch=4, nbs=4, lr0=5e-3, ema=False, workers=0, seed=0,
            project=str(tmp_path / "runs"), name="p", verbose=False, plots=False)
    after = m.val(data=data, batch=16, workers=0)
    assert after["f1"] > before["f1"] + 0.1, (before, after)
    assert after["precision"] > before["precision"] and after["recall"] > 0
    ckpt = LibreYOLO(str(tmp_path / "runs" / "p" / "weights" / "best.pt"), device="cpu")
    assert ckpt.TASK == "point" and ckpt.names == {0: "disc", 1: "square"}
    with pytest.raises(ValueError, match="3 classes|2 classes"):
        LibreYOLO.new("fomo", "s", nc=3, device="cpu").val(data=data, workers=0)
