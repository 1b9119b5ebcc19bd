"""YOLOv1: Darknet's layers, the decode, the fixed 448 input, checkpoints, the sum-squared loss
and training (the fixture rows are in tests/rows.py FIXTURES)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loss_cases import (
    ROWS,
    assert_autocast_computes_in_float32,
    assert_fixed_shapes_and_finite_backward,
    assert_no_host_sync,
    fit_maps,
    padded_targets,
)
from PIL import Image
from test_fixtures import load_fixture

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.models.registry import parse_spec
from libreyolo.models.yolo1 import loss as loss_module
from libreyolo.models.yolo1.loss import Yolo1Loss
from libreyolo.models.yolo1.model import Yolo1, decode
from libreyolo.models.yolo1.nn import VOC_NAMES, ConvBN, DarknetBatchNorm2d, Local, Yolo1Net

NC, S = 3, 7
#: loss_cases' rows are for a 64x64 input: the loss tests use imgsz=64 with them, or these at 448
ROWS448 = [[[r[0], *(v * 7 for v in r[1:])] for r in img] for img in ROWS]


@pytest.fixture(scope="module")
def fixture_model():
    """yolo1-t with the fixture's weights (outputs of a useful spread), on the CPU."""
    _, _, sd = load_fixture("yolo1-t")
    m = LibreYOLO.new("yolo1", "t", device="cpu", seed=0)
    m.load_state_dict(sd)
    return m


# -- layers ------------------------------------------------------------------------------------
def test_darknet_batchnorm_is_darknets_rule_and_keeps_no_counter():
    bn = DarknetBatchNorm2d(4)
    g = torch.Generator().manual_seed(0)
    for t in (bn.weight, bn.bias, bn.running_mean):
        t.data = torch.randn(4, generator=g)
    bn.running_var = torch.rand(4, generator=g) + 0.1
    x = torch.randn(2, 4, 3, 3, generator=g)
    want = (x - bn.running_mean.view(1, -1, 1, 1)) / (bn.running_var.sqrt() + 1e-6).view(1, -1, 1, 1) \
        * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(bn.eval()(x), want, rtol=0, atol=0)
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var"]
    fresh = DarknetBatchNorm2d(4)
    fresh.load_state_dict(dict(bn.state_dict()), strict=True)   # a plain dict (no version metadata)
    # training: batch statistics, running statistics moved by Darknet's 0.01
    before = bn.running_mean.clone()
    out = bn.train()(x)
    torch.testing.assert_close(out.mean((0, 2, 3)), bn.bias, atol=1e-5, rtol=0)
    torch.testing.assert_close(bn.running_mean, 0.99 * before + 0.01 * x.mean((0, 2, 3)))


def test_local_layer_is_a_convolution_without_weight_sharing():
    """Each output location multiplies its own (filters, C*k*k) matrix with its 3x3 patch
    (channel, kernel row, kernel column order: Darknet's im2col), plus its own bias."""
    g = torch.Generator().manual_seed(1)
    layer = Local(3, 4, 3, 5)
    x = torch.randn(2, 3, 5, 5, generator=g)
    pad = F.pad(x, (1, 1, 1, 1))
    want = torch.empty(2, 4, 5, 5)
    for r in range(5):
        for c in range(5):
            patch = pad[:, :, r:r + 3, c:c + 3].reshape(2, -1)                   # (N, C*3*3)
            want[:, :, r, c] = patch @ layer.weight[r * 5 + c].T + layer.bias[:, r * 5 + c]
    torch.testing.assert_close(layer(x), F.leaky_relu(want, 0.1))


def test_size_b_is_the_layout_of_darknets_published_yolov1_weights():
    """24 convolutions, the 3x3 local layer (256 filters), dropout, the connected layer to
    7*7*(20 + 2*5) = 1470; indices as the cfg numbers its layers. Its state dict holds
    194,254,718 floats: with Darknet's 16-byte header, 777,018,888 bytes, the size of the
    published yolov1.weights (the reference's test pins that size)."""
    with torch.device("meta"):
        net = Yolo1Net("b", 20)
    layers = net.yolo1.layers
    assert sum(isinstance(m, ConvBN) for m in layers) == 24 and len(layers) == 31
    assert sum(p.numel() for p in net.parameters()) == 194_228_350
    sd = net.state_dict()
    assert 16 + 4 * sum(v.numel() for v in sd.values()) == 777_018_888
    assert sd["yolo1.layers.0.conv.weight"].shape == (64, 3, 7, 7)
    assert sd["yolo1.layers.28.weight"].shape == (49, 256, 1024 * 9) and sd["yolo1.layers.28.bias"].shape == (256, 49)
    assert sd["yolo1.layers.30.linear.weight"].shape == (1470, 7 * 7 * 256)
    assert not any("num_batches_tracked" in k for k in sd)
    assert Yolo1.nc_from_state_dict(sd) == 20 and Yolo1.owns_state_dict(sd)
    assert Yolo1.sniff_size(sd, 20) == "b"
    with torch.device("meta"):
        assert Yolo1.nc_from_state_dict(Yolo1Net("t", 20).state_dict()) == 20


def test_names_and_specs():
    assert parse_spec("LibreYOLO1b.pt") == (Yolo1, "b") and parse_spec("yolo1-t") == (Yolo1, "t")
    assert parse_spec("yolo11n.pt") is None and parse_spec("yolo10n") is None
    assert Yolo1.default_names(20) == dict(enumerate(VOC_NAMES)) and Yolo1.default_names(3)[0] == "class0"


# -- decode and predict ------------------------------------------------------------------------
def _darknet_boxes(out, nc, n, side, size):
    """Darknet's get_detection_boxes, literally: per cell i = row * side + col and box j."""
    boxes, scores, classes = [], [], []
    for i in range(side * side):
        row, col = divmod(i, side)
        for j in range(n):
            p = out[side * side * nc + i * n + j]
            k = side * side * (nc + n) + (i * n + j) * 4
            x, y = (out[k] + col) / side * size, (out[k + 1] + row) / side * size
            w, h = out[k + 2] ** 2 * size, out[k + 3] ** 2 * size
            probs = [p * out[i * nc + c] for c in range(nc)]
            best = max(range(nc), key=lambda c: probs[c])
            boxes.append([x - w / 2, y - h / 2, x + w / 2, y + h / 2])
            scores.append(probs[best])
            classes.append(best)
    return torch.tensor(boxes), torch.tensor(scores), torch.tensor(classes)


@pytest.mark.parametrize("boxes_per_cell", [2, 3])
def test_decode_is_darknets(boxes_per_cell):
    n = boxes_per_cell
    out = torch.randn(2, 49 * (NC + 5 * n), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    boxes, scores, cls = decode(out, NC, n, 7, 448)
    assert boxes.shape == (2, 49 * n, 4)
    for b in range(2):
        want = _darknet_boxes(out[b].tolist(), NC, n, 7, 448)
        torch.testing.assert_close(boxes[b], want[0].double())
        torch.testing.assert_close(scores[b], want[1].double())
        assert torch.equal(cls[b], want[2])


def test_predict_on_the_sample_image_is_the_decoded_network_after_nms(fixture_model):
    """predict = stretch to 448 + network + decode + class-aware NMS, boxes scaled back per axis."""
    import torchvision
    m = fixture_model
    r = m(SAMPLE_IMAGE, conf=0.05, iou=0.45)
    assert 0 < len(r) <= 98 and r.boxes.data.shape[1] == 6
    img = np.array(Image.open(SAMPLE_IMAGE).convert("RGB"))
    h, w = img.shape[:2]
    with torch.no_grad():
        x = m.preprocess(torch.from_numpy(img)[None], 448)
        boxes, scores, cls = (t[0] for t in m.infer(x))
    keep = scores > 0.05
    boxes, scores, cls = boxes[keep], scores[keep], cls[keep]
    order = torchvision.ops.batched_nms(boxes, scores, cls, 0.45)
    want = boxes[order].clone()
    want[:, 0::2] = (want[:, 0::2] / (448 / w)).clip(0, w)
    want[:, 1::2] = (want[:, 1::2] / (448 / h)).clip(0, h)
    torch.testing.assert_close(r.boxes.xyxy, want, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(r.boxes.conf, scores[order])
    assert torch.equal(r.boxes.cls.long(), cls[order])
    assert r.names[int(r.boxes.cls[0])] in VOC_NAMES


def test_checkpoint_round_trip(fixture_model, tmp_path):
    m = fixture_model
    path = m.save(tmp_path / "LibreYOLO1t.pt")
    raw = torch.load(path, weights_only=True)
    assert (raw["model_family"], raw["size"], raw["nc"], raw["imgsz"]) == ("yolo1", "t", 20, 448)
    assert raw["names"][14] == "person" and raw["preprocess"]["resize"] == "stretch"
    back = LibreYOLO(str(path), device="cpu")
    assert type(back) is Yolo1 and back.trained and back.imgsz == 448
    for (k, a), (k2, b) in zip(m.model.state_dict().items(), back.model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    r1, r2 = m(SAMPLE_IMAGE, conf=0.05), back(SAMPLE_IMAGE, conf=0.05)
    assert len(r1) > 0 and torch.equal(r1.boxes.data, r2.boxes.data)


def test_fuse_keeps_the_outputs(fixture_model):
    import copy
    _, pt, _ = load_fixture("yolo1-t")
    net = fixture_model.model
    fused = copy.deepcopy(net).fuse().eval()
    with torch.no_grad():
        torch.testing.assert_close(fused(pt["input"])[0], net(pt["input"])[0], rtol=1e-4, atol=1e-5)
    assert not any(isinstance(mod, DarknetBatchNorm2d) for mod in fused.modules())


# -- the fixed input size ----------------------------------------------------------------------
def test_any_other_imgsz_is_refused_clearly(fixture_model, tmp_path):
    m = fixture_model
    message = "YOLOv1 takes a fixed 448x448 input"
    for imgsz in (640, 320):
        with pytest.raises(ValueError, match=message):
            m(SAMPLE_IMAGE, imgsz=imgsz)
    with pytest.raises(ValueError, match=message):
        m.capture_graph(imgsz=640)
    with pytest.raises(ValueError, match=message):
        LibreYOLO.new("yolo1", "t", device="cpu", imgsz=640)
    with pytest.raises(ValueError, match=message):
        m.imgsz = 416
    # train and val refuse before the data is looked at (this path does not exist)
    with pytest.raises(ValueError, match=message):
        m.train(data=str(tmp_path / "nowhere.yaml"), imgsz=640, epochs=1)
    with pytest.raises(ValueError, match=message):
        m.val(data=str(tmp_path / "nowhere.yaml"), imgsz=320)
    with pytest.raises(ValueError, match=message):
        m.export(file=str(tmp_path / "m.onnx"), imgsz=640)
    with pytest.raises(ValueError, match="dynamic=True"):
        m.export(file=str(tmp_path / "m.onnx"), dynamic=True)
    with pytest.raises(ValueError, match=message):
        m.model(torch.zeros(1, 3, 640, 640))
    assert m.imgsz == 448 and m(SAMPLE_IMAGE, imgsz=448, conf=0.05) is not None


# -- the loss ----------------------------------------------------------------------------------
def _out(b: int, boxes: int = 2, seed: int = 0, scale: float = 0.5) -> torch.Tensor:
    return torch.randn(b, 49 * (NC + 5 * boxes), generator=torch.Generator().manual_seed(seed)) * scale


def _reference_loss(out, rows, nc, n, side, imgsz, l_coord=5.0, l_noobj=0.5):
    """Darknet's forward_detection_layer as loops (first object per cell; IoU, else RMSE, picks
    the responsible box) with the paper's squared terms; per image."""
    items = torch.zeros(4, dtype=torch.float64)
    for b, objs in enumerate(rows):
        o = out[b].double()
        probs = o[:side * side * nc].view(side * side, nc)
        conf = o[side * side * nc:side * side * (nc + n)].view(side * side, n)
        coords = o[side * side * (nc + n):].view(side * side, n, 4)
        cell_obj = {}
        for cls, x1, y1, x2, y2 in objs:
            cx, cy, w, h = (x1 + x2) / 2 / imgsz, (y1 + y2) / 2 / imgsz, (x2 - x1) / imgsz, (y2 - y1) / imgsz
            col, row = min(int(cx * side), side - 1), min(int(cy * side), side - 1)
            cell_obj.setdefault(row * side + col, (int(cls), cx * side - col, cy * side - row, w, h))
        for i in range(side * side):
            resp = None
            if i in cell_obj:
                cls, tx, ty, tw, th = cell_obj[i]
                truth = torch.tensor([tx / side, ty / side, tw, th], dtype=torch.float64)
                best_iou, best_rmse = 0.0, 20.0
                for j in range(n):
                    p = coords[i, j]
                    box = torch.stack((p[0] / side, p[1] / side, p[2] ** 2, p[3] ** 2))
                    a = torch.cat((box[:2] - box[2:] / 2, box[:2] + box[2:] / 2))
                    t = torch.cat((truth[:2] - truth[2:] / 2, truth[:2] + truth[2:] / 2))
                    inter = (torch.minimum(a[2:], t[2:]) - torch.maximum(a[:2], t[:2])).clamp_min(0).prod()
                    iou = float(inter / (box[2] * box[3] + tw * th - inter + 1e-16))
                    rmse = float((box - truth).square().sum().sqrt())
                    if best_iou > 0 or iou > 0:
                        if iou > best_iou:
                            best_iou, resp = iou, j
                    elif rmse < best_rmse:
                        best_rmse, resp = rmse, j
                target = torch.tensor([tx, ty, math.sqrt(tw), math.sqrt(th)], dtype=torch.float64)
                items[0] += l_coord * (coords[i, resp] - target).square().sum()
                items[1] += (conf[i, resp] - best_iou) ** 2
                items[3] += (probs[i] - F.one_hot(torch.tensor(cls), nc).double()).square().sum()
            for j in range(n):
                if j != resp:
                    items[2] += l_noobj * conf[i, j] ** 2
    return items / len(rows)


@pytest.mark.parametrize("boxes", [2, 3])
def test_loss_matches_darknet_loops(boxes):
    """Random outputs; objects include two whose centres share cell (2, 3) (the first one counts)
    and one whose centre is the image's far corner (the last cell)."""
    rows = [ROWS448[0] + [[1, 40, 45, 70, 60], [1, 150, 190, 160, 200]], [],
            [[2, 0, 0, 448, 448], [0, 400, 400, 448, 448]]]
    for seed in range(3):
        out = _out(3, boxes, seed, scale=0.7)
        loss, items = Yolo1Loss(NC, boxes)(out, *padded_targets(rows, 8))
        want = _reference_loss(out, rows, NC, boxes, S, 448)
        torch.testing.assert_close(items.double(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss, items.sum())


def test_perfect_prediction_and_each_weight_by_hand():
    """One object in cell (col 2, row 3): box 0 predicts it exactly with confidence 1 and the
    cell's class probabilities are one-hot: the loss is 0. Then one error at a time: each term
    with its weight (lambda_coord 5, lambda_noobj 0.5)."""
    crit = Yolo1Loss(NC, 2)
    cx, cy, w, h = (2 + 0.25) / 7, (3 + 0.5) / 7, 0.16, 0.09
    targets, mask = padded_targets([[[1, (cx - w / 2) * 448, (cy - h / 2) * 448, (cx + w / 2) * 448,
                                      (cy + h / 2) * 448]]], 4)
    out = torch.zeros(1, 49 * (NC + 10))
    probs, conf, coords = out[:, :49 * NC].view(49, NC), out[:, 49 * NC:49 * (NC + 2)].view(49, 2), \
        out[:, 49 * (NC + 2):].view(49, 2, 4)
    cell = 3 * 7 + 2
    probs[cell, 1] = 1.0
    conf[cell, 0] = 1.0
    coords[cell, 0] = torch.tensor([0.25, 0.5, 0.4, 0.3])
    coords[cell, 1] = torch.tensor([0.5, 0.5, 0.01, 0.01])        # a tiny box inside the object: IoU ~0
    _, items = crit(out, targets, mask)
    assert items.abs().max() < 1e-6, items
    conf[cell, 1] = 0.4                                           # the other box's confidence: noobj
    coords[cell, 0, 0] += 0.1                                     # box 0 off by 0.1 in x: coord
    probs[cell, 0] = 0.5                                          # a wrong class probability: cls
    _, items = crit(out, targets, mask)
    iou = (0.16 - 0.1 / 7) / (0.16 + 0.1 / 7)                     # equal boxes, x shifted by 0.1 / 7
    torch.testing.assert_close(items, torch.tensor([5 * 0.01, (1 - iou) ** 2, 0.5 * 0.16, 0.25]))


def test_responsible_box_is_the_best_overlap_else_the_least_rmse():
    crit = Yolo1Loss(NC, 3)
    coords = torch.zeros(1, 49, 3, 4)
    # an object filling cell 0: centre offset (0.5, 0.5), w = h = 1/7 of the image
    targets, mask = padded_targets([[[0, 0, 0, 64, 64]]], 1)
    cell = math.sqrt(1 / 7)
    coords[0, 0, 0] = torch.tensor([0.9, 0.9, 0.05, 0.05])                        # a sliver of overlap
    coords[0, 0, 1] = torch.tensor([0.5, 0.5, cell * math.sqrt(0.5), cell * math.sqrt(0.5)])   # inside: IoU 1/4
    coords[0, 0, 2] = torch.tensor([0.6, 0.5, cell, cell])                        # shifted by 0.1 cell: 0.9 / 1.1
    has_obj, resp, _, iou = crit.assign(coords, targets, mask)
    assert has_obj[0].nonzero().flatten().tolist() == [0]
    assert resp[0, 0].tolist() == [False, False, True] and not resp[0, 1:].any()
    torch.testing.assert_close(iou[0, 0, 1:], torch.tensor([0.25, 0.9 / 1.1]))
    # a small object (offset (0.125, 0.125), w = h = 1/28) that no box overlaps: the least RMSE
    targets, mask = padded_targets([[[0, 0, 0, 16, 16]]], 1)
    coords[0, 0] = torch.tensor([[0.9, 0.9, 0.01, 0.01], [0.5, 0.3, 0.01, 0.01], [0.6, 0.6, 0.01, 0.01]])
    _, resp, _, iou = crit.assign(coords, targets, mask)
    assert (iou[0, 0] == 0).all() and resp[0, 0].tolist() == [False, True, False]


def test_padded_targets_give_the_unpadded_loss_bit_for_bit():
    crit = Yolo1Loss(NC, 2)
    out = _out(3, seed=4)
    n = max(len(r) for r in ROWS448)
    loss0, items0 = crit(out, *padded_targets(ROWS448, n, garbage=False))
    for m in (4, 16, 64):
        loss, items = crit(out, *padded_targets(ROWS448, m, garbage=True))
        assert torch.equal(loss, loss0) and torch.equal(items, items0), m
    empty0 = crit(out, torch.zeros(3, 0, 5), torch.zeros(3, 0, dtype=torch.bool))
    empty16 = crit(out, *padded_targets([[]] * 3, 16))
    assert torch.equal(empty0[0], empty16[0]) and torch.equal(empty0[1], empty16[1])
    assert empty0[1][[0, 1, 3]].abs().sum() == 0 and empty0[1][2] > 0   # confidences only


def test_loss_per_image_and_terms():
    crit = Yolo1Loss(NC, 2)
    out = _out(1, seed=5)
    one = crit(out, *padded_targets(ROWS448[:1], 4))
    two = crit(torch.cat((out, out)), *padded_targets(ROWS448[:1] * 2, 4))
    torch.testing.assert_close(two[0], one[0])
    torch.testing.assert_close(two[1], one[1])
    assert crit.item_names == ("coord", "obj", "noobj", "cls") and (one[1] > 0).all()


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_gradients_flow_and_shapes_are_fixed():
    out = _out(3, seed=6).requires_grad_()
    crit = Yolo1Loss(NC, 2)
    assert_fixed_shapes_and_finite_backward(lambda t, m: crit(out, t, m), [out], 4,
                                            row_sets=(ROWS448, [[[1, 140, 140, 210, 280]], [], ROWS448[0]]))
    probs, conf, coords = out.grad[:, :49 * NC], out.grad[:, 49 * NC:49 * (NC + 2)], out.grad[:, 49 * (NC + 2):]
    assert probs.abs().sum() > 0 and conf.abs().sum() > 0 and coords.abs().sum() > 0


def test_autocast_computes_in_float32_and_graph_safe_source():
    assert_autocast_computes_in_float32(Yolo1Loss(NC, 2), [_out(3, seed=7)], padded_targets(ROWS448, 4))
    assert_no_host_sync(loss_module)


def test_loss_trains_the_outputs():
    """Optimising the output vectors directly drives the loss down (the responsible boxes follow)."""
    losses = fit_maps(Yolo1Loss(NC, 2, imgsz=64), [_out(2, seed=8)])
    assert losses[-1] < 0.05 * losses[0], losses


# -- training ----------------------------------------------------------------------------------
def test_model_hooks_and_one_training_step():
    """The family's loss and a training step of the real network at 448: every parameter gets a
    gradient, BatchNorm statistics move by Darknet's momentum."""
    m = LibreYOLO.new("yolo1", "t", nc=NC, device="cpu", seed=0)
    crit = m.build_loss()
    assert isinstance(crit, Yolo1Loss) and (crit.nc, crit.boxes, crit.imgsz) == (NC, 2, 448)
    assert m.train_defaults()["imgsz"] == 448 and m.train_defaults()["mosaic"] == 0.0
    net = m.model.train()
    x = torch.rand(2, 3, 448, 448, generator=torch.Generator().manual_seed(0))
    bn = net.yolo1.layers[0].bn
    before = bn.running_var.clone()
    loss, items = crit(m.train_forward(net, x), *padded_targets([ROWS448[0], ROWS448[2]], 4))
    loss.backward()
    assert torch.isfinite(items).all()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    assert not torch.equal(bn.running_var, before)
    net.eval()


@pytest.mark.slow
def test_family_trains_two_tiny_epochs(tmp_path):
    """As tests/unit/test_trainer.py's TRAIN_MODELS rows, at the fixed 448: two epochs on the
    built-in shapes set through the shared trainer (validation on), each term of the loss finite
    and active under its name, weights updated and saved, the checkpoint loads back."""
    from libreyolo.data.synthetic import make_shapes_dataset
    data = str(make_shapes_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64, seed=0))
    model = LibreYOLO.new("yolo1", "t", device="cpu", seed=0)
    res = model.train(data=data, epochs=2, batch=4, workers=0, project=str(tmp_path), name="run", warmup_epochs=0,
                      verbose=False, seed=0, nbs=4, plots=False)
    assert res["epochs"] == 2 and res["loss_names"] == list(model.build_loss().item_names)
    assert all(math.isfinite(v) and v > 0 for epoch in res["losses"] for v in epoch), res["losses"]
    trained = LibreYOLO(res["last"], device="cpu")
    assert trained.imgsz == 448 and trained.nc == model.nc
    before = LibreYOLO.new("yolo1", "t", nc=trained.nc, device="cpu", seed=0).model.state_dict()
    assert any(not torch.equal(v, before[k]) for k, v in trained.model.state_dict().items()
               if v.is_floating_point() and "running" not in k)


@pytest.mark.slow
def test_size_b_runs_and_decodes():
    m = LibreYOLO.new("yolo1", "b", device="cpu", seed=0)
    with torch.no_grad():
        out = m.model(torch.rand(1, 3, 448, 448))
        boxes, scores, cls = m.infer(torch.rand(1, 3, 448, 448))
    assert out[0].shape == (1, 1470) and boxes.shape == (1, 98, 4) and scores.shape == cls.shape == (1, 98)


@pytest.mark.slow
def test_onnx_export_matches_eager_predict(tmp_path):
    """As tests/unit/test_export_onnx.py's rows, at the fixed 448 (static: dynamic=True is
    refused): the fixtures' fill of the model's layout, four images, the same detections."""
    from export_parity import compare, filled_model, parity_images
    m = filled_model("yolo1", "t", 448)
    o = LibreYOLO(str(m.export(file=tmp_path / "m.onnx")), device="cpu")
    assert (o.FAMILY, o.size, o.imgsz) == ("yolo1", "t", 448)
    assert all(r["n"] > 0 for r in compare(m, o, parity_images(), 448))
