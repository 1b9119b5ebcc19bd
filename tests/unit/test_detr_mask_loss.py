"""DETR instance-segmentation loss (models/detr_common/mask_loss.py) and D-FINE-seg training."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.detr_common.loss import DetrLoss
from libreyolo.models.detr_common.mask import query_masks
from libreyolo.models.detr_common.mask_loss import DetrMaskLoss, mask_terms, matched_queries, set_mask_terms
from libreyolo.models.dfine.nn import DFineSegFront
from libreyolo.models.dfine.seg import DfineSeg
from libreyolo.results import Results


def _bce(x: float, t: float) -> float:
    return max(x, 0.0) - x * t + math.log1p(math.exp(-abs(x)))


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ----------------------------------------------------------------------------- the terms
LOGITS = [[2.0, -1.0], [0.0, 3.0]]
TARGET = [[1.0, 0.0], [1.0, 0.0]]


def test_mask_terms_by_hand():
    x, t = torch.tensor([LOGITS]), torch.tensor([TARGET])
    bce, dice = mask_terms(x, t, torch.ones(1))
    xs, ts = sum(LOGITS, []), sum(TARGET, [])
    p = [_sig(v) for v in xs]
    want_bce = sum(_bce(a, b) for a, b in zip(xs, ts)) / 4
    want_dice = 1 - (2 * sum(a * b for a, b in zip(p, ts)) + 1) / (sum(p) + sum(ts) + 1)
    assert bce.item() == pytest.approx(want_bce, rel=1e-6)
    assert dice.item() == pytest.approx(want_dice, rel=1e-6)
    # only the left column counted (the box's pixels)
    inside = torch.tensor([[[True, False], [True, False]]])
    bce, dice = mask_terms(x, t, torch.ones(1), inside)
    assert bce.item() == pytest.approx((_bce(2.0, 1.0) + _bce(0.0, 1.0)) / 2, rel=1e-6)
    assert dice.item() == pytest.approx(1 - (2 * (p[0] + p[2]) + 1) / (p[0] + p[2] + 2 + 1), rel=1e-6)
    # weights: a zero-weight mask is left out, a weight scales its terms
    two = mask_terms(torch.stack([x[0], -x[0]]), torch.cat([t, t]), torch.tensor([2.0, 0.0]))
    assert two[0].item() == pytest.approx(2 * want_bce, rel=1e-6)
    assert two[1].item() == pytest.approx(2 * want_dice, rel=1e-6)


def test_perfect_mask_costs_nothing_and_flipped_costs_most():
    t = torch.zeros(1, 8, 8)
    t[0, 2:6, 1:5] = 1
    perfect = mask_terms(30 * (2 * t - 1), t, torch.ones(1))
    flipped = mask_terms(-30 * (2 * t - 1), t, torch.ones(1))
    assert perfect[0].item() < 1e-6 and perfect[1].item() < 1e-6
    assert flipped[0].item() > 29 and flipped[1].item() > 0.98
    # an empty target with an empty prediction costs nothing (the smoothed dice)
    assert mask_terms(torch.full((1, 4, 4), -30.0), torch.zeros(1, 4, 4), torch.ones(1))[1].item() < 1e-6


def test_gradients_reach_the_logits_and_push_them_towards_the_target():
    x = torch.zeros(1, 4, 4, requires_grad=True)
    t = torch.zeros(1, 4, 4)
    t[0, :2] = 1
    bce, dice = mask_terms(x, t, torch.ones(1))
    (bce + dice).backward()
    assert (x.grad[0, :2] < 0).all() and (x.grad[0, 2:] > 0).all()


def test_matched_queries_come_first_in_query_order():
    match = torch.tensor([[-1, 2, -1, 0, -1], [-1, -1, -1, -1, 1]])
    sel, ok = matched_queries(match, 3)
    assert sel[:, :2].tolist() == [[1, 3], [4, 0]] and ok.tolist() == [[True, True, False], [True, False, False]]
    assert matched_queries(match, 0)[0].shape == (2, 0)


def _scene():
    """Two images of a 32x32 input: boxes (pixels) and their bitmaps at stride 4 (8x8)."""
    targets = torch.zeros(2, 3, 5)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    gm = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    targets[0, 0] = torch.tensor([0, 4, 8, 20, 24.0])
    gm[0, 0, 2:6, 1:5] = 1
    targets[0, 1] = torch.tensor([1, 16, 0, 32, 16.0])
    gm[0, 1, 0:4, 4:8] = 1
    targets[1, 0] = torch.tensor([1, 0, 0, 32, 32.0])
    gm[1, 0, 1:7, 1:7] = 1
    mask[0, :2] = True
    mask[1, 0] = True
    return targets, mask, gm


def test_set_terms_dense_logits_equal_embedding_factors_and_follow_the_match():
    g = torch.Generator().manual_seed(0)
    targets, _, gm = _scene()
    embed, feature = torch.randn(2, 5, 4, generator=g), torch.randn(2, 4, 8, 8, generator=g)
    outputs = {"mask_feature": feature}
    match = torch.tensor([[-1, 1, -1, 0, -1], [-1, -1, -1, -1, 0]])
    dense = set_mask_terms({"pred_masks": query_masks(embed, feature)}, outputs, match, 3, targets, gm, (32, 32))
    factors = set_mask_terms({"mask_embed": embed}, outputs, match, 3, targets, gm, (32, 32))
    torch.testing.assert_close(dense, factors)
    logits = query_masks(embed, feature)
    inside = torch.zeros(3, 8, 8, dtype=torch.bool)
    inside[0, 0:4, 4:8] = True     # image 0, query 1 -> row 1: box x 16-32, y 0-16 = grid x 4-8, y 0-4
    inside[1, 2:6, 1:5] = True     # image 0, query 3 -> row 0: box x 4-20, y 8-24 = grid x 1-5, y 2-6
    inside[2] = True               # image 1, query 4 -> row 0: the whole input
    want = mask_terms(torch.stack([logits[0, 1], logits[0, 3], logits[1, 4]]),
                      torch.stack([gm[0, 1], gm[0, 0], gm[1, 0]]).float(), torch.ones(3), inside)
    torch.testing.assert_close(torch.stack(dense), torch.stack(want))
    assert set_mask_terms({}, outputs, match, 3, targets, gm, (32, 32)) is None


def test_targets_on_a_finer_grid_are_resampled_to_the_masks_grid():
    g = torch.Generator().manual_seed(1)
    targets, _, gm = _scene()
    fine = gm.repeat_interleave(2, -1).repeat_interleave(2, -2)            # the same bitmaps at stride 2
    pm = {"pred_masks": torch.randn(2, 5, 8, 8, generator=g)}
    match = torch.tensor([[-1, 1, -1, 0, -1], [-1, -1, -1, -1, 0]])
    a = set_mask_terms(pm, {}, match, 3, targets, gm, (32, 32), crop=False)
    b = set_mask_terms(pm, {}, match, 3, targets, fine, (32, 32), crop=False)
    torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- D-FINE-seg
@pytest.fixture(scope="module")
def seg_model():
    return LibreYOLO.new("dfine", "n", task="segment", nc=3, device="cpu", seed=0)


def _forward(m, net, x, targets, mask, gm):
    torch.manual_seed(0)   # query denoising draws noise
    return m.train_forward(net, x, targets, mask, gm)


def test_criterion_keeps_the_detection_terms_and_adds_every_layers_masks(seg_model):
    m = seg_model
    net = m.model.train()
    targets, mask, gm = _scene()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    out = _forward(m, net, x, targets, mask, gm)
    crit = m.build_loss()
    assert isinstance(crit, DetrMaskLoss) and isinstance(crit.detection, DetrLoss) and crit.detection.fine
    assert crit.item_names == ("vfl", "bbox", "giou", "fgl", "ddf", "mask_bce", "mask_dice")
    assert all("mask_embed" in o for o in [out, *out["aux_outputs"], *out["dn_outputs"]])
    with torch.no_grad():
        loss, items = crit(out, targets, mask, gm)
        _, det_items = DetrLoss(3, fine=True)(out, targets, mask)
        assert torch.equal(items[:5], det_items) and loss == items.sum()
        # by hand: every matched and denoising set's dense masks, by its own assignment and norm
        _, asg = crit.detection.terms(out, targets, mask)
        assert len(asg.sets) == 5 and len(asg.dn_sets) == 3   # final, 2 aux, pre, enc; 3 denoising layers
        bce = dice = 0.0
        for sets, norm, limit in ((asg.sets, asg.num_boxes, 3), (asg.dn_sets, asg.num_dn, asg.dn_limit)):
            for o, match in sets:
                if "mask_embed" not in o:
                    continue
                dense = {"pred_masks": query_masks(o["mask_embed"], out["mask_feature"])}
                b, d = set_mask_terms(dense, out, match, limit, targets, gm, (32, 32))
                bce, dice = bce + b / norm, dice + d / norm
        torch.testing.assert_close(items[5:], torch.stack([bce, dice]))
        assert items[5] > 0 and items[6] > 0
        # padded target rows change nothing
        from libreyolo.tasks import get_task
        padded = get_task("segment").pad_target_rows([targets, mask, gm], 8)
        torch.testing.assert_close(crit(out, *padded)[1], items)
    with pytest.raises(ValueError, match="target rows"):
        crit(out, targets, mask, gm[:, :2])


def test_gradients_reach_the_mask_head_and_decoder_and_the_seam_changes_nothing(seg_model):
    m = seg_model
    targets, mask, gm = _scene()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    crit = m.build_loss()

    def grads(seam):
        net = m.model.train()
        net.zero_grad(set_to_none=True)
        m.set_train_seam(net, DFineSegFront(net) if seam else None)
        try:
            loss, _ = crit(_forward(m, net, x, targets, mask, gm), targets, mask, gm)
            loss.backward()
        finally:
            m.set_train_seam(net, None)
        return loss.detach(), {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}

    loss, g = grads(False)
    for k in ("decoder.mask_head.layers.0.weight", "decoder.mask_decoder.up_conv.weight",
              "decoder.mask_decoder.lateral.0.weight", "backbone.stem.stem1.conv.weight"):
        assert g[k].abs().sum() > 0, k
    loss_s, g_s = grads(True)
    assert torch.equal(loss, loss_s) and g.keys() == g_s.keys() and all(torch.equal(g[k], g_s[k]) for k in g)
    # the seam is declared (its GPU rows passed, docs/families.md); the whole step is not captured
    assert DfineSeg.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM and not DfineSeg.SUPPORTS_CUDA_GRAPH_TRAIN


def test_validation_loss_uses_the_training_format(seg_model):
    m = seg_model
    targets, mask, gm = _scene()
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    net = m.model.eval()
    with torch.no_grad():
        out = m.val_loss_outputs(net, None, x, targets, mask, gm)
        _, items = m.build_loss()(out, targets, mask, gm)
    assert "mask_feature" in out and "pred_masks" not in out and torch.isfinite(items).all()
    assert not net.training and not net.decoder.training


def _shapes_inst(tmp_path, n_train, reps):
    import shutil

    from libreyolo.tasks.segment.data import SHAPES_INST_NAMES, make_shapes_inst_dataset
    root = make_shapes_inst_dataset(tmp_path / "si", n_train=n_train, n_val=2, imgsz=64).parent
    for sub in ("images", "labels"):
        (root / sub / "rep").mkdir()
    for f in sorted((root / "images" / "train").glob("*.jpg")):
        for k in range(reps):
            shutil.copy(f, root / "images" / "rep" / f"{k}_{f.name}")
            shutil.copy(root / "labels" / "train" / f"{f.stem}.txt", root / "labels" / "rep" / f"{k}_{f.stem}.txt")
    yaml = root / "rep.yaml"
    yaml.write_text(f"path: .\ntrain: images/rep\nval: images/train\nnames: {list(SHAPES_INST_NAMES)}\n")
    return str(yaml), len(SHAPES_INST_NAMES)


def test_a_few_steps_on_one_batch_lower_the_mask_terms_and_the_trained_weights_round_trip(tmp_path):
    """Four AdamW steps on one shapes-inst batch through train_forward + build_loss (as the
    trainer's step): both mask terms fall; the trained model saves and loads back as D-FINE-seg
    with the same weights and the same predictions."""
    from libreyolo.tasks.segment.data import (
        SegmentDataset,
        collate_instances,
        make_shapes_inst_dataset,
        resolve_segment_data,
    )
    data = resolve_segment_data(str(make_shapes_inst_dataset(tmp_path / "si", n_train=4, n_val=1, imgsz=64)))
    m = LibreYOLO.new("dfine", "n", task="segment", nc=data.nc, device="cpu", seed=0)
    ds = SegmentDataset(data.train, 64, m.preprocess.resize, augment=False)
    imgs, targets, mask, gm = collate_instances([ds[i] for i in range(4)], bucket=8)
    x = imgs.float() / 255
    net = m.model.train()
    crit = m.build_loss()
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=2e-3)
    items = []
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        loss, it = crit(_forward(m, net, x, targets, mask, gm), targets, mask, gm)
        loss.backward()
        opt.step()
        items.append(it)
        assert torch.isfinite(it).all()
    assert items[-1][5] < items[0][5] and items[-1][6] < items[0][6], items
    net.eval()
    back = LibreYOLO(str(m.save(tmp_path / "trained.pt")), device="cpu")
    a, b = m.model.state_dict(), back.model.state_dict()
    assert type(back) is DfineSeg and list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    img = (imgs[0].permute(1, 2, 0).numpy()).copy()
    ra, rb = m(img, imgsz=64, conf=0.0, max_det=3), back(img, imgsz=64, conf=0.0, max_det=3)
    assert torch.equal(ra.boxes.data, rb.boxes.data) and torch.equal(ra.masks.data, rb.masks.data)


@pytest.mark.slow
def test_two_tiny_epochs_mask_loss_falls_and_the_checkpoint_loads_back(tmp_path):
    """The trainer end to end on shapes-inst (8 images, twice per epoch: 4 steps per epoch): the
    mask terms and the total fall; best.pt holds the returned model's weights and last.pt loads
    back as D-FINE-seg and predicts masks."""
    data, nc = _shapes_inst(tmp_path, 8, 2)
    m = LibreYOLO.new("dfine", "n", task="segment", nc=nc, device="cpu", seed=0)
    res = m.train(data=data, epochs=2, imgsz=64, batch=4, workers=0, optimizer="AdamW", lr0=2e-3, lrf=1.0,
                  warmup_epochs=0, ema=False, fliplr=0.0, seed=0, project=str(tmp_path), name="run",
                  verbose=False, plots=False)
    names = res["loss_names"]
    assert names == ["vfl", "bbox", "giou", "fgl", "ddf", "mask_bce", "mask_dice"]
    first, last = res["losses"][0], res["losses"][-1]
    assert all(math.isfinite(v) for row in res["losses"] for v in row)
    assert last[5] < first[5] and last[6] < first[6] and sum(last) < sum(first), res["losses"]
    assert {"mask_map50", "mask_map50_95"} <= set(res) and m.names[0] == "triangle"
    # the trained model holds best.pt's weights; both checkpoints load back as D-FINE-seg
    best = LibreYOLO(res["best"], device="cpu")
    a, b = m.model.state_dict(), best.model.state_dict()
    assert type(best) is DfineSeg and list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    back = LibreYOLO(res["last"], device="cpu")
    assert type(back) is DfineSeg and back.nc == nc and back.names == m.names
    r = back(np.zeros((48, 64, 3), np.uint8), imgsz=64, conf=0.0, max_det=2)
    assert isinstance(r, Results) and r.masks.shape == (2, 48, 64)


@pytest.mark.slow
def test_two_epochs_on_shapes_inst_lift_the_mask_map_and_lower_the_mask_loss(tmp_path):
    """Two epochs on 8 shapes-inst images (each ten times per epoch: 40 steps), as RTMDet-Ins's
    test: the mask terms fall epoch over epoch and the mask mAP50 on those images rises above the
    untrained model's."""
    data, nc = _shapes_inst(tmp_path, 8, 10)
    m = LibreYOLO.new("dfine", "n", task="segment", nc=nc, device="cpu", seed=0)
    before = m.val(data=data, imgsz=64, batch=8, workers=0)
    res = m.train(data=data, epochs=2, imgsz=64, batch=4, workers=0, optimizer="AdamW", lr0=2e-3, lrf=1.0,
                  warmup_epochs=0, ema=False, fliplr=0.0, seed=0, project=str(tmp_path), name="run",
                  verbose=False, plots=False)
    first, last = res["losses"][0], res["losses"][-1]
    assert last[5] < first[5] and last[6] < first[6], res["losses"]
    assert res["mask_map50"] > before["mask_map50"], (before, res)


def test_one_epoch_on_a_coco_segmentation_set(tmp_path):
    """A COCO dataset (a polygon and an RLE instance) trains through the same path: one epoch,
    finite losses, both mask terms positive, masks predicted."""
    import json

    from PIL import Image
    (tmp_path / "img").mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.jpg", "b.jpg"):
        Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(tmp_path / "img" / name)
    rle = np.zeros((64, 64), np.uint8)
    rle[30:50, 8:40] = 1
    flat, runs, last, count = rle.reshape(-1, order="F").tolist(), [], 0, 0   # COCO's uncompressed RLE
    for v in flat:
        if v != last:
            runs.append(count)
            last, count = v, 0
        count += 1
    runs.append(count)
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 64},
                      {"id": 2, "file_name": "b.jpg", "width": 64, "height": 64}],
           "categories": [{"id": 3, "name": "thing"}, {"id": 9, "name": "other"}],
           "annotations": [
               {"id": 1, "image_id": 1, "category_id": 3, "iscrowd": 0,
                "segmentation": [[4.0, 4.0, 28.0, 4.0, 28.0, 28.0, 4.0, 28.0]]},
               {"id": 2, "image_id": 2, "category_id": 9, "iscrowd": 0,
                "segmentation": {"size": [64, 64], "counts": runs}}]}
    (tmp_path / "ann.json").write_text(json.dumps(doc))
    yaml = tmp_path / "data.yaml"
    yaml.write_text("path: .\nformat: coco\ntrain: {images: img, annotations: ann.json}\n"
                    "val: {images: img, annotations: ann.json}\n")
    m = LibreYOLO.new("dfine", "n", task="segment", nc=2, device="cpu", seed=0)
    res = m.train(data=str(yaml), epochs=1, imgsz=64, batch=2, workers=0, warmup_epochs=0, ema=False, seed=0,
                  project=str(tmp_path), name="run", verbose=False, plots=False)
    row = res["losses"][0]
    assert all(math.isfinite(v) for v in row) and row[5] > 0 and row[6] > 0
    assert m.names == {0: "thing", 1: "other"} and math.isfinite(res["mask_map50"])
    r = m(np.zeros((32, 48, 3), np.uint8), imgsz=64, conf=0.0, max_det=2)
    assert r.masks.shape == (2, 32, 48)
