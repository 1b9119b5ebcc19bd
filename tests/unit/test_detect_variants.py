"""YOLOv9-P2, YOLOv9-E2E and PP-YOLOE: their heads, post-processing and losses on the CPU, the
command line, and two training epochs on the built-in shapes set.

The fixture tests (tests/unit/test_fixtures.py) pin the networks; these pin what the fixtures
do not: the NMS-free selection, the two-head loss, the stride-4 level in the loss, PP-YOLOE's
loss on padded targets and its fused network."""
import pytest
import torch
from loss_cases import fit_one_batch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.models.registry import get_family
from libreyolo.models.yolo9.loss import Yolo9Loss
from libreyolo.models.yolo9_e2e.model import one2one_topk


def _targets():
    """Two images at 64 px: two objects in the first, one in the second (one padding row)."""
    targets = torch.tensor([[[0, 4, 6, 30, 28], [2, 34, 30, 60, 62]],
                            [[1, 10, 12, 40, 50], [0, 0, 0, 0, 0]]], dtype=torch.float32)
    return targets, torch.tensor([[True, True], [True, False]])


def _train_outputs(family, size, nc=3, seed=0):
    torch.manual_seed(seed)
    m = LibreYOLO.new(family, size, nc=nc, device="cpu", seed=seed)
    net = m.model.train()
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    return m, net, x


# ---- YOLOv9-E2E -------------------------------------------------------------------------------

def test_e2e_selection_is_yolov10s_two_step_topk():
    """Top-K anchors by best class score, then the K best (anchor, class) pairs among them."""
    g = torch.Generator().manual_seed(0)
    b, nc, n, k = 2, 5, 40, 7
    pred = torch.cat((torch.rand(b, 4, n, generator=g) * 100, torch.rand(b, nc, n, generator=g)), 1)
    boxes, scores, cls = one2one_topk(pred, k)
    assert boxes.shape == (b, k, 4) and scores.shape == (b, k) and cls.shape == (b, k)
    for i in range(b):
        probs = pred[i, 4:].T                                            # (N, nc)
        anchors = probs.amax(1).argsort(descending=True)[:k]
        pairs = sorted(((float(probs[a, c]), int(a), c) for a in anchors.tolist() for c in range(nc)),
                       reverse=True)[:k]
        assert scores[i].tolist() == pytest.approx([p[0] for p in pairs])
        assert cls[i].tolist() == [p[2] for p in pairs]
        assert torch.equal(boxes[i], pred[i, :4].T[[p[1] for p in pairs]])
    # fewer anchors than K: K shrinks to the anchor count
    assert one2one_topk(pred[..., :3], 300)[1].shape == (b, 3)


def test_e2e_predict_is_nms_free_and_keeps_overlapping_boxes():
    m = LibreYOLO.new("yolo9_e2e", "t", device="cpu", seed=0)
    assert m.NMS is False
    r = m(SAMPLE_IMAGE, imgsz=160, conf=0.0)
    r = r[0] if isinstance(r, list) else r
    assert len(r.boxes) == m.NUM_TOP   # every pair kept: no NMS thinned them


def test_e2e_loss_is_both_heads_and_one2one_sees_detached_features():
    m, net, x = _train_outputs("yolo9_e2e", "t")
    out = net(x)
    assert set(out) == {"one2many", "one2one"} and len(out["one2one"]) == 3
    targets, mask = _targets()
    loss, items = m.build_loss()(out, targets, mask)
    many, many_items = Yolo9Loss(3, topk=10)(out["one2many"], targets, mask)
    one, one_items = Yolo9Loss(3, topk=1)(out["one2one"], targets, mask)
    assert torch.allclose(loss, many + one) and torch.allclose(items, many_items + one_items)
    # the one-to-one loss trains only its own towers (YOLOv10: detached neck features)
    net.zero_grad()
    one.backward()
    assert all(p.grad is None or not p.grad.any() for n, p in net.named_parameters() if not n.startswith("head.one2one"))
    assert any(p.grad is not None and p.grad.any() for n, p in net.named_parameters() if n.startswith("head.one2one"))


def test_e2e_validation_loss_uses_both_heads():
    m = LibreYOLO.new("yolo9_e2e", "t", nc=3, device="cpu", seed=0)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        out = m.model.eval()(x)
        val = m.val_loss_outputs(m.model, out, x)
    assert set(val) == {"one2many", "one2one"} and not m.model.training
    assert torch.equal(val["one2one"][0], out["raw_outputs"][0])


# ---- YOLOv9-P2 --------------------------------------------------------------------------------

def test_p2_trains_on_four_levels_from_stride_4():
    m, net, x = _train_outputs("yolo9_p2", "t")
    maps = net(x)
    assert [tuple(t.shape[-2:]) for t in maps] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    loss_fn = m.build_loss()
    assert loss_fn.strides == (4, 8, 16, 32)
    targets, mask = _targets()
    loss, items = loss_fn(maps, targets, mask)
    assert torch.isfinite(loss) and (items > 0).all()
    loss.backward()
    assert net.neck.elan_up3.cv1.conv.weight.grad.abs().sum() > 0


def test_yolo9_state_dicts_are_told_apart_from_their_variants():
    for family in ("yolo9", "yolo9_p2", "yolo9_e2e"):
        sd = get_family(family).build_network("t", 80).state_dict()
        owners = [f for f in ("yolo9", "yolo9_p2", "yolo9_e2e") if get_family(f).owns_state_dict(sd)]
        assert owners == [family]


# ---- PP-YOLOE ---------------------------------------------------------------------------------

def test_ppyoloe_loss_ignores_padding_rows_and_empty_batches():
    m, net, x = _train_outputs("ppyoloe", "s")
    raw = net(x)
    targets, mask = _targets()
    loss_fn = m.build_loss()
    loss, items = loss_fn(raw, targets, mask)
    assert torch.isfinite(loss) and (items > 0).all()
    extra = torch.cat((targets, torch.tensor([[[1, 5, 5, 50, 50]], [[2, 3, 3, 9, 9]]])), 1)
    padded, padded_items = loss_fn(raw, extra, torch.cat((mask, torch.zeros(2, 1, dtype=torch.bool)), 1))
    assert torch.allclose(loss, padded, rtol=1e-6) and torch.allclose(items, padded_items, rtol=1e-6)
    empty, _ = loss_fn(raw, targets[:, :0], mask[:, :0])
    assert torch.isfinite(empty) and empty > 0   # the VFL of the negatives alone


def test_ppyoloe_validation_loss_reads_the_eval_pass():
    m = LibreYOLO.new("ppyoloe", "s", nc=3, device="cpu", seed=0)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        out = m.model.eval()(x)
    raw = m.val_loss_outputs(m.model, out, x)
    assert raw[0].shape == (1, 4 + 16 + 64, 3) and raw[4] == [4, 16, 64]


def test_ppyoloe_fuse_keeps_the_outputs():
    m = LibreYOLO.new("ppyoloe", "s", device="cpu", seed=0)
    for mod in m.model.modules():   # non-trivial BatchNorm statistics and head weights
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
        elif isinstance(mod, torch.nn.Conv2d) and mod.weight.abs().sum() == 0:
            torch.nn.init.normal_(mod.weight, std=0.01)
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        (boxes, scores), _ = m.model.eval()(x)
        m.fuse()
        (fboxes, fscores), _ = m.model(x)
    assert torch.allclose(boxes, fboxes, atol=1e-3) and torch.allclose(scores, fscores, atol=1e-5)


# ---- every new family -------------------------------------------------------------------------

@pytest.mark.parametrize("family,size", [("yolo9_p2", "t"), ("yolo9_e2e", "t"), ("ppyoloe", "s")])
def test_loss_fits_one_batch(family, size):
    """The loss learns: the network fits one batch (as tests/unit/test_yolo9_loss.py's YOLOv9 does;
    the bar is as loose: a loss that does not train stays near 1x)."""
    crit = LibreYOLO.new(family, size, nc=3, device="cpu", seed=0).build_loss()
    losses, _ = fit_one_batch(lambda: get_family(family).build_network(size, 3), crit,
                              lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), 30, seed=1)
    assert min(losses[-5:]) < 0.7 * losses[0], losses


def test_cli_predicts_with_each_new_family(capsys):
    from libreyolo.cli import main
    for name in ("ppyoloe-s", "yolo9_p2-t", "yolo9_e2e-t"):
        assert main(["predict", f"model={name}", f"source={SAMPLE_IMAGE}", "save=false", "imgsz=96"]) == 0
    out = capsys.readouterr()
    assert (out.out + out.err).count("1280x720") == 3   # one summary line per run


@pytest.mark.slow
@pytest.mark.parametrize("family,size", [("yolo9_p2", "t"), ("yolo9_e2e", "t"), ("ppyoloe", "s")])
def test_two_epochs_on_shapes_improve_on_untrained(tmp_path, family, size):
    """Two CPU epochs on the built-in shapes set (96 images at 160 px, YOLOv9's falling-loss recipe
    of tests/unit/test_trainer.py): the training loss falls and the validation mAP50 is at least
    the untrained model's. Its 24 steps do not lift the scores of these detectors over the
    validation threshold (their mAP50 stays 0), so the falling loss is the measure, as it is for
    YOLOv9."""
    from libreyolo.data.synthetic import make_shapes_dataset
    data = str(make_shapes_dataset(tmp_path / "ds", n_train=96, n_val=8, imgsz=160, seed=0))
    untrained = LibreYOLO.new(family, size, nc=5, device="cpu", seed=0)
    before = untrained.val(data=data, imgsz=160, batch=8, workers=0)["map50"]
    model = LibreYOLO.new(family, size, device="cpu", seed=0)
    res = model.train(data=data, epochs=2, batch=8, imgsz=160, workers=0, project=str(tmp_path), name="run",
                      close_mosaic=0, warmup_epochs=0.5, verbose=False, seed=0, nbs=8, plots=False)
    total = [sum(epoch) for epoch in res["losses"]]
    assert total[-1] < total[0], res["losses"]
    assert res["map50"] >= before
    back = LibreYOLO(res["last"], device="cpu")
    assert (back.FAMILY, back.size, back.nc) == (family, size, 5)
