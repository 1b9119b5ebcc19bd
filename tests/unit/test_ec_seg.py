"""EC instance segmentation (task ``segment``: ECSeg, ``ec-s-seg``): variant resolution, predict
(masks mapped from the fixed 160 x 160 grid to the image), CLI, round trip, val, training (the
shared DETR mask loss on every decoder and denoising layer's masks).

The fixture reproduction is a row of ``rows.FIXTURES`` (tests/unit/test_fixtures.py).
"""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from test_fixtures import assert_reproduces, load_fixture, run_fixture
from torchvision.ops import box_convert

from libreyolo import LibreYOLO, cli
from libreyolo.models.ec.model import EC
from libreyolo.models.ec.pose import ECPose
from libreyolo.models.ec.seg import SEG_HEAD_KEY, ECSeg
from libreyolo.models.registry import parse_spec
from libreyolo.results import Results
from libreyolo.tasks.segment import InstanceMasks


@pytest.fixture(scope="module")
def seg_model():
    return LibreYOLO.new("ec", "s", task="segment", nc=3, device="cpu", seed=0)


def test_ec_serves_detect_pose_and_segment():
    assert EC.for_task("segment") is ECSeg and ECSeg.for_task("detect") is EC
    assert ECSeg.for_task("pose") is ECPose and ECPose.for_task("segment") is ECSeg
    assert parse_spec("ec-s-seg") == (ECSeg, "s")
    assert cli._task_of("ec-s-seg").name == "segment"
    with pytest.raises(ValueError, match="sizes: s"):
        LibreYOLO.new("ec", "m", task="segment", device="cpu")


def test_mask_parts_equal_the_networks_masks_on_the_fixed_grid(seg_model):
    """Predict's (embedding, feature) factors of each picked (query, class) give the network's mask
    logits, on the 160 x 160 grid whatever the input size."""
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    net = seg_model.model.eval()
    with torch.no_grad():
        out = net(x)
        boxes, scores, cls, embed, feature = seg_model.infer(x)
    assert out["pred_masks"].shape == (1, 300, 160, 160)
    assert embed.shape == (1, 300, 192) and feature.shape == (1, 192, 160, 160)
    query = out["pred_logits"].sigmoid().flatten(1).topk(300, dim=1).indices // 3
    logits = seg_model.mask_logits(feature[0], embed[0])
    torch.testing.assert_close(logits, out["pred_masks"][0][query[0]], rtol=1e-5, atol=1e-4)


def test_predict_maps_the_grid_masks_to_the_image_and_boxes(seg_model):
    """Each kept instance's mask is the network's grid logits resized to the image (the stretch
    inverted), above 0, cut to its box; the result plots and serialises."""
    rgb = (np.random.default_rng(0).random((90, 120, 3)) * 255).astype(np.uint8)
    x = seg_model.preprocess(torch.from_numpy(rgb)[None], 128)
    bias = seg_model.model.mask_head.bias
    saved = bias.detach().clone()
    try:
        with torch.no_grad():   # the untrained logits centred on 0 in the best pair's box: masks neither empty nor full
            first = seg_model.model.eval()(x)
            q = int(first["pred_logits"][0].sigmoid().flatten().argmax()) // 3
            x1, y1, x2, y2 = (box_convert(first["pred_boxes"][0, q], "cxcywh", "xyxy") * 160).round().int().tolist()
            bias.sub_(first["pred_masks"][0, q, y1:y2, x1:x2].median())
            out = seg_model.model(x)
        r = seg_model(Image.fromarray(rgb), imgsz=128, conf=0.0, max_det=5)
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    assert isinstance(r, Results) and isinstance(r.masks, InstanceMasks) and len(r.boxes) == 5
    assert r.masks.shape == (5, 90, 120) and r.masks.data.dtype == torch.bool
    assert r.masks.cls.tolist() == r.boxes.cls.to(torch.int64).tolist()
    scores, index = out["pred_logits"].sigmoid().flatten(1).topk(5, dim=1)
    torch.testing.assert_close(r.boxes.conf, scores[0], rtol=1e-5, atol=1e-6)
    full = F.interpolate(out["pred_masks"][0][index[0] // 3][:, None], size=(90, 120), mode="bilinear",
                         align_corners=False)[:, 0] > 0
    xs, ys = torch.arange(120) + 0.5, torch.arange(90) + 0.5
    b = r.boxes.xyxy
    inside = ((ys[None, :, None] >= b[:, 1, None, None]) & (ys[None, :, None] <= b[:, 3, None, None])
              & (xs[None, None, :] >= b[:, 0, None, None]) & (xs[None, None, :] <= b[:, 2, None, None]))
    expected = full & inside
    assert expected.any() and (inside & ~full).any()
    assert (expected != r.masks.data).sum() <= 0.01 * inside.sum()     # pixels whose logit is ~0 may flip
    rows = json.loads(r.to_json())
    assert len(rows) == 5 and {"box", "area", "polygons"} <= set(rows[0])
    assert r.plot().shape == (90, 120, 3)


def test_saved_segment_model_loads_back_as_segment(tmp_path, seg_model):
    back = LibreYOLO(str(seg_model.save(tmp_path / "seg.pt")), device="cpu")
    assert type(back) is ECSeg and back.nc == 3 and back.task == "segment"
    a, b = seg_model.model.state_dict(), back.model.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    torch.save({"model": a}, tmp_path / "anonymous.pt")        # no metadata: the mask head's keys decide
    assert type(LibreYOLO(str(tmp_path / "anonymous.pt"), device="cpu")) is ECSeg


def test_cli_predicts_masks_with_a_segment_checkpoint(tmp_path, seg_model, capsys):
    path = seg_model.save(tmp_path / "seg.pt")
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(tmp_path / "a.jpg")
    out = tmp_path / "det.json"
    assert cli.main(["predict", f"model={path}", f"source={tmp_path / 'a.jpg'}", "imgsz=64", "conf=0", "max_det=2",
                     "device=cpu", "save=false", f"json={out}"]) == 0
    rows = json.loads(out.read_text())[0]["detections"]
    assert len(rows) == 2 and {"area", "polygons"} <= set(rows[0])


def test_val_on_shapes_inst_gives_box_and_mask_map(tmp_path, seg_model):
    from libreyolo.tasks.segment.data import SHAPES_INST_NAMES, make_shapes_inst_dataset
    yaml = make_shapes_inst_dataset(tmp_path / "si", n_train=1, n_val=4, imgsz=64)
    m = LibreYOLO.new("ec", "s", task="segment", nc=len(SHAPES_INST_NAMES), device="cpu", seed=0)
    res = m.val(data=str(yaml), imgsz=64, batch=4, workers=0)
    assert {"map50", "map50_95", "mask_map50", "mask_map50_95"} <= set(res)
    assert all(0.0 <= res[k] <= 1.0 for k in ("map50", "map50_95", "mask_map50", "mask_map50_95"))


# ----------------------------------------------------------------------------- training
#: the fast training tests' mask grid: the head's full 160 x 160 grid costs about 4 s a step on one
#: core; the grid side is the head's constructor argument (``ECSegHead.mask_size``), no weight's
#: shape depends on it, and the loss resamples the bitmaps to whatever grid the masks are on
GRID = 40


def _scene():
    """Two images of a 32x32 input: boxes (pixels) and their bitmaps at stride 4 (8x8)."""
    targets = torch.zeros(2, 3, 5)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    gm = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    targets[0, 0] = torch.tensor([0, 4, 8, 20, 24.0])
    gm[0, 0, 2:6, 1:5] = 1
    targets[0, 1] = torch.tensor([1, 16, 0, 32, 16.0])
    gm[0, 1, 0:4, 4:8] = 1
    targets[1, 0] = torch.tensor([2, 0, 0, 32, 32.0])
    gm[1, 0, 1:7, 1:7] = 1
    mask[0, :2] = True
    mask[1, 0] = True
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return x, targets, mask, gm


def _new(nc=3, grid=GRID):
    m = LibreYOLO.new("ec", "s", task="segment", nc=nc, device="cpu", seed=0)
    m.model.mask_head.mask_size = grid
    return m


@pytest.fixture(scope="module")
def train_model():
    return _new()


def _forward(m, net, x, targets, mask, gm):
    torch.manual_seed(0)   # query denoising draws noise
    return m.train_forward(net, x, targets, mask, gm)


def test_training_output_has_every_layers_masks_and_the_loss_supervises_each(train_model):
    """Training format: every decoder layer (final, aux) and denoising layer carries its queries'
    mask embeddings and its own grid feature (layer i: after head blocks 0..i, a denoising layer
    sharing its decoder layer's), plus the head's bias; the criterion keeps the detector's items
    and adds each set's mask terms, as computed by hand from the sets' dense logits."""
    from libreyolo.models.detr_common.loss import DetrLoss
    from libreyolo.models.detr_common.mask_loss import DetrMaskLoss, set_mask_terms
    m = train_model
    net = m.model.train()
    head = net.mask_head
    x, targets, mask, gm = _scene()
    with torch.no_grad():
        out = _forward(m, net, x, targets, mask, gm)
        layers, dn = [*out["aux_outputs"], out], out["dn_outputs"]
        assert len(layers) == len(dn) == len(head.blocks) == 4
        f0 = net.encoder(net.backbone(x))[0]
        for i, (o, d) in enumerate(zip(layers, dn)):
            assert "queries" not in o and "queries" not in d
            assert o["mask_embed"].shape == (*o["pred_logits"].shape[:2], 192)
            assert d["mask_embed"].shape == (*d["pred_logits"].shape[:2], 192)
            assert d["mask_feature"] is o["mask_feature"]
            torch.testing.assert_close(o["mask_feature"], head.spatial(f0, i + 1), rtol=1e-5, atol=1e-5)
        assert out["mask_feature"].shape == (2, 192, GRID, GRID) and out["mask_bias"] is head.bias
        assert not torch.allclose(layers[0]["mask_feature"], layers[-1]["mask_feature"])
        crit = m.build_loss()
        assert isinstance(crit, DetrMaskLoss) and crit.detection.fine
        assert crit.item_names == ("vfl", "bbox", "giou", "fgl", "ddf", "mask_bce", "mask_dice")
        loss, items = crit(out, targets, mask, gm)
        assert torch.equal(items[:5], DetrLoss(3, fine=True)(out, targets, mask)[1]) and loss == items.sum()
        _, asg = crit.detection.terms(out, targets, mask)
        bce = dice = 0.0
        for sets, norm, limit in ((asg.sets, asg.num_boxes, 3), (asg.dn_sets, asg.num_dn, asg.dn_limit)):
            for o, match in sets:
                if "mask_embed" not in o:
                    continue
                dense = {"pred_masks": head.logits(o["mask_embed"], o["mask_feature"])}
                b, d = set_mask_terms(dense, {}, match, limit, targets, gm, (32, 32))
                bce, dice = bce + b / norm, dice + d / norm
        torch.testing.assert_close(items[5:], torch.stack([bce, dice]))
        assert items[5] > 0 and items[6] > 0


def test_gradients_reach_every_head_block_and_the_seam_changes_nothing(train_model):
    """The loss's gradients reach every block of the mask head (which only the mask terms use:
    block i through the masks of layer i and later), its bias and projections, the decoder and the
    backbone; the training seam (backbone + encoder + the head's spatial side) gives the same loss
    and gradients bit for bit, and its eval output equals the network's."""
    m = train_model
    x, targets, mask, gm = _scene()
    crit = m.build_loss()

    def grads(seam):
        net = m.model.train()
        net.zero_grad(set_to_none=True)
        m.set_train_seam(net, m.train_seam(net) if seam else None)
        try:
            loss, _ = crit(_forward(m, net, x, targets, mask, gm), targets, mask, gm)
            loss.backward()
            with torch.no_grad():
                ev = net.eval()(x)
        finally:
            m.set_train_seam(net, None)
        return loss.detach(), {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}, ev

    loss, g, _ = grads(False)
    pre = "decoder.decoder.segmentation_head."
    for k in ("bias", "blocks.0.dwconv.weight", "blocks.3.pwconv1.weight", "spatial_features_proj.weight",
              "query_features_block.layers.0.weight", "query_features_proj.weight"):
        assert g[pre + k].abs().sum() > 0, k
    for k in ("decoder.decoder.layers.0.linear1.weight", "decoder.decoder.layers.3.linear1.weight",
              "backbone.projector.0.conv.weight"):
        assert g[k].abs().sum() > 0, k
    loss_s, g_s, ev_s = grads(True)
    assert torch.equal(loss, loss_s) and g.keys() == g_s.keys() and all(torch.equal(g[k], g_s[k]) for k in g)
    with torch.no_grad():
        ev = m.model.eval()(x)      # the same weights and BatchNorm statistics, no seam
    assert ev.keys() == ev_s.keys() and all(torch.equal(ev[k], ev_s[k]) for k in ev)
    assert not ECSeg.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM and not ECSeg.SUPPORTS_CUDA_GRAPH_TRAIN
    # a captured forward+backward differentiates every parameter the seam holds: each must be
    # reached by its outputs (the GPU capture failed while the head's query side was in it)
    front = m.train_seam(m.model.train())
    out = front(x)
    params = list(front.parameters())
    reached = torch.autograd.grad(sum(o.float().sum() for o in out), params, allow_unused=True)
    assert all(r is not None for r in reached), [n for (n, _), r in zip(front.named_parameters(), reached) if r is None]


def test_validation_loss_uses_the_training_format(train_model):
    m = train_model
    x, targets, mask, gm = _scene()
    net = m.model.eval()
    with torch.no_grad():
        out = m.val_loss_outputs(net, None, x, targets, mask, gm)
        _, items = m.build_loss()(out, targets, mask, gm)
    assert "pred_masks" not in out and all("mask_feature" in o for o in [out, *out["aux_outputs"], *out["dn_outputs"]])
    assert torch.isfinite(items).all() and items[5] > 0 and items[6] > 0
    assert not net.training and not net.decoder.training


def _batch(tmp_path, m, n=2, imgsz=32):
    """``n`` shapes-inst training images as the trainer's step gets them: the normalised input and
    the segment collate's (boxes, mask, bitmaps)."""
    from libreyolo.tasks.segment.data import (
        SegmentDataset,
        collate_instances,
        make_shapes_inst_dataset,
        resolve_segment_data,
    )
    data = resolve_segment_data(str(make_shapes_inst_dataset(tmp_path / "si", n_train=n, n_val=1, imgsz=imgsz)))
    ds = SegmentDataset(data.train, imgsz, m.preprocess.resize, augment=False)
    imgs, targets, mask, gm = collate_instances([ds[i] for i in range(n)], bucket=8)
    return imgs, m.preprocess.normalize(imgs.float() / 255), targets, mask, gm


def _steps(m, params, x, targets, mask, gm, n, lr):
    net = m.model.train()
    crit = m.build_loss()
    opt = torch.optim.AdamW(params, lr=lr)
    items = []
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        loss, it = crit(_forward(m, net, x, targets, mask, gm), targets, mask, gm)
        loss.backward()
        opt.step()
        items.append(it)
        assert torch.isfinite(it).all()
    return torch.stack(items)


def test_a_few_adamw_steps_on_one_batch_lower_the_mask_terms_at_every_step(tmp_path):
    """Four AdamW steps (the recipe's lr) on one shapes-inst batch through train_forward +
    build_loss (as the trainer's step), training the mask head with the rest frozen, so the
    detection's matching and therefore the supervised queries stay put: both mask terms fall at
    every step and the detection terms do not move. (From random weights the whole net's matching
    moves from step to step, and the mask terms with it; the whole net trains in the trainer test
    below.)"""
    from libreyolo.tasks.segment.data import SHAPES_INST_NAMES
    m = _new(len(SHAPES_INST_NAMES))
    _, x, targets, mask, gm = _batch(tmp_path, m)
    head = m.model.mask_head
    for p in m.model.parameters():
        p.requires_grad_(False)
    for p in head.parameters():
        p.requires_grad_(True)
    items = _steps(m, list(head.parameters()), x, targets, mask, gm, 4, ECSeg.TRAIN_DEFAULTS["lr0"])
    assert (items[1:, 5:] < items[:-1, 5:]).all(), items
    assert torch.equal(items[1:, :5], items[:-1, :5]), items


def test_trained_weights_round_trip_through_a_checkpoint(tmp_path):
    """Two AdamW steps of the whole network (every parameter moves), then: the model saves and
    loads back as ECSeg with the same weights and the same predictions (boxes and masks, on the
    full 160 x 160 grid)."""
    from libreyolo.tasks.segment.data import SHAPES_INST_NAMES
    m = _new(len(SHAPES_INST_NAMES))
    imgs, x, targets, mask, gm = _batch(tmp_path, m)
    before = {k: v.clone() for k, v in m.model.state_dict().items()}
    _steps(m, [p for p in m.model.parameters() if p.requires_grad], x, targets, mask, gm, 2, 1e-4)
    assert not torch.equal(before[SEG_HEAD_KEY], m.model.state_dict()[SEG_HEAD_KEY])
    m.model.eval().mask_head.mask_size = 160
    back = LibreYOLO(str(m.save(tmp_path / "trained.pt")), device="cpu")
    a, b = m.model.state_dict(), back.model.state_dict()
    assert type(back) is ECSeg and list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    img = imgs[0].permute(1, 2, 0).numpy().copy()
    ra, rb = m(img, imgsz=32, conf=0.0, max_det=3), back(img, imgsz=32, conf=0.0, max_det=3)
    assert torch.equal(ra.boxes.data, rb.boxes.data) and torch.equal(ra.masks.data, rb.masks.data)


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


@pytest.mark.slow
def test_two_tiny_epochs_mask_loss_falls_and_the_checkpoint_loads_back(tmp_path):
    """The trainer end to end on shapes-inst at the full 160 x 160 grid (8 images, twice per
    epoch: 4 steps per epoch) at the recipe's lr (1e-4: the head's mask logits are unscaled
    192-channel dot products, and at D-FINE-seg's test lr of 2e-3 the BCE overshoots upward in
    these few steps): the mask terms fall; best.pt holds the returned model's weights and last.pt
    loads back as ECSeg and predicts masks."""
    data, nc = _shapes_inst(tmp_path, 8, 2)
    m = LibreYOLO.new("ec", "s", task="segment", nc=nc, device="cpu", seed=0)
    res = m.train(data=data, epochs=2, imgsz=64, batch=4, workers=0, optimizer="AdamW", lr0=1e-4, lrf=1.0,
                  warmup_epochs=0, ema=False, fliplr=0.0, seed=0, project=str(tmp_path), name="run",
                  verbose=False, plots=False)
    assert res["loss_names"] == ["vfl", "bbox", "giou", "fgl", "ddf", "mask_bce", "mask_dice"]
    first, last = res["losses"][0], res["losses"][-1]
    assert all(np.isfinite(v) for row in res["losses"] for v in row)
    assert last[5] < first[5] and last[6] < first[6], res["losses"]
    assert {"mask_map50", "mask_map50_95"} <= set(res)
    best = LibreYOLO(res["best"], device="cpu")
    a, b = m.model.state_dict(), best.model.state_dict()
    assert type(best) is ECSeg and list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    back = LibreYOLO(res["last"], device="cpu")
    assert type(back) is ECSeg and back.nc == nc and back.names == m.names
    r = back(np.zeros((48, 64, 3), np.uint8), imgsz=64, conf=0.0, max_det=2)
    assert isinstance(r, Results) and r.masks.shape == (2, 48, 64)


def test_fixture_masks_compare_order_free_on_their_sample():
    """The fixture stores pred_masks as a sample of flat indices; with our queries in another order
    the order-free rule still pairs each sampled value with its matched query's mask, and a wrong
    mask in one query fails it."""
    fx, pt, sd = load_fixture("ec-s-seg")
    assert "pred_masks" in pt["outputs_sampled"] and "pred_masks" not in pt["outputs"]
    net = ECSeg.build_network("s", 80)
    net.load_state_dict(sd, strict=True)
    out = run_fixture(net.eval(), pt)
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(0))
    shuffled = {k: v[:, perm] for k, v in out.items()}
    assert_reproduces(shuffled, pt["outputs"], fx, pt["outputs_sampled"])
    shuffled["pred_masks"] = shuffled["pred_masks"].clone()
    hit = int((perm == pt["outputs_sampled"]["pred_masks"]["idx"][0].item() // (160 * 160)).nonzero())
    shuffled["pred_masks"][0, hit] += 100.0
    with pytest.raises(AssertionError, match="order-free, sampled"):
        assert_reproduces(shuffled, pt["outputs"], fx, pt["outputs_sampled"])
