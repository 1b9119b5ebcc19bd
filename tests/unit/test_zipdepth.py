"""ZipDepth on the CPU: the multi-branch blocks against their fused form (on the fixture's
weights and by hand), predict through the fused copy, the checkpoint keeping the multi-branch
layout, the preprocessing declared as data, validation, two training epochs, the CLI and the
refusals. The fixture reproduction itself is a row of ``rows.FIXTURES`` (tests/unit/test_fixtures.py)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_fixtures import load_fixture, rel_err, run_fixture

from libreyolo import LibreYOLO
from libreyolo.models.zipdepth.nn import CONFIGS, ConvBNReLU, RepBlock, ZipDepthNet
from libreyolo.tasks.depth.synthetic import make_shapes_depth_dataset

SIZE = 64   # two multiples of the 32 px stride: the network at its cheapest


@pytest.fixture(scope="module")
def model():
    return LibreYOLO.new("zipdepth", "b", device="cpu", seed=0)


@pytest.fixture(scope="module")
def fixture_net():
    fx, pt, sd = load_fixture("zipdepth-b")
    net = ZipDepthNet("b")
    net.load_state_dict(sd, strict=True)
    return fx, pt, net.eval()


def _image(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _redraw_bn(net, seed=0):
    """Non-trivial BatchNorm statistics and affine terms, so that folding them is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return net


# ------------------------------------------------------------------------------------------ network

def test_parameter_count_is_the_fixtures():
    net = ZipDepthNet("b")
    assert sum(p.numel() for p in net.parameters()) == 6_788_254
    assert list(CONFIGS) == ["b"]
    with pytest.raises(ValueError, match="unknown ZipDepth size 's'; sizes: b"):
        ZipDepthNet("s")


@pytest.mark.parametrize("c_in,c_out,stride", [(8, 8, 1), (8, 16, 2), (8, 8, 2)])
def test_rep_block_fuses_to_one_conv(c_in, c_out, stride):
    """3x3 + 1x1 (+ identity where channels and stride allow) == one 3x3 conv with the BNs folded."""
    block = _redraw_bn(RepBlock(c_in, c_out, stride)).eval()
    assert block.identity == (c_in == c_out and stride == 1)
    x = torch.randn(2, c_in, 10, 12)
    with torch.no_grad():
        ref = block(x)
        block.fuse()
        got = block(x)
    assert isinstance(block.fused, torch.nn.Conv2d) and not hasattr(block, "branch_3x3")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    block.fuse()   # idempotent
    torch.testing.assert_close(block(x), got)


def test_conv_bn_relu_fuses():
    m = _redraw_bn(ConvBNReLU(3, 6, 3, 2)).eval()
    x = torch.randn(1, 3, 9, 9)
    with torch.no_grad():
        ref = m(x)
        m.fuse()
        got = m(x)
    assert m.bn is None and m.conv.bias is not None
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_fused_network_reproduces_the_fixture(fixture_net):
    """The fixture runs the multi-branch network; the fused one reproduces it within the
    fixture's bound on every pinned output (the ReLU'd map, the half-resolution head and the
    convex weights' logits), and differs from the multi-branch one by float32 rounding only."""
    import copy
    fx, pt, net = fixture_net
    unfused = run_fixture(net, pt)
    fused = run_fixture(copy.deepcopy(net).fuse(), pt)
    for path, ref in pt["outputs"].items():
        assert rel_err(fused[path], ref) <= 1e-4, path
        assert rel_err(fused[path], unfused[path]) <= 1e-4, path
    assert not all(torch.equal(fused[p], unfused[p]) for p in pt["outputs"])   # really another computation


def test_network_needs_multiples_of_32(model):
    with pytest.raises(ValueError, match="multiples of 32, got 64x48"):
        model.model(torch.rand(1, 3, 64, 48))
    with torch.no_grad():
        out = model.model(torch.rand(2, 3, 32, 96))   # non-square works
    assert out.shape == (2, 1, 32, 96) and bool((out >= 0).all())


# ------------------------------------------------------------------------------------------ predict

def test_preprocess_is_zipdepths_own_resize(model):
    p = model.preprocess
    assert (p.resize, p.interpolation, p.multiple, p.quantize, p.mean) == ("cover", "bilinear", 32, True, None)
    assert p.input_hw(480, 640, 384) == (384, 512)     # shorter side to imgsz, sides to multiples of 32
    assert p.input_hw(720, 1280, 384) == (384, 672)    # 682.7 -> the nearest multiple
    assert model.imgsz == 384 and model.STRIDE == 32


def test_predict_runs_the_fused_copy_and_maps_back(model):
    img = _image(50, 70, 0)
    r = model(img, imgsz=SIZE, color_format="rgb")
    fused = model._net()
    assert fused is not model.model and model.model.encoder.stage1[0].fused is None   # own network untouched
    assert all(b.fused is not None for b in fused.modules() if isinstance(b, RepBlock))
    x = model.preprocess(torch.from_numpy(img)[None], SIZE)
    with torch.no_grad():
        ref = F.interpolate(fused(x), size=(50, 70), mode="bilinear", align_corners=True)[0, 0]
        multi = F.interpolate(model.model(x), size=(50, 70), mode="bilinear", align_corners=True)[0, 0]
    assert r.depth.shape == (50, 70) and torch.equal(r.depth.data, ref)
    assert rel_err(r.depth.data, multi) < 1e-4
    model.predict_fused = False
    try:
        assert torch.equal(model(img, imgsz=SIZE, color_format="rgb").depth.data, multi)
    finally:
        model.predict_fused = True


def test_the_fused_copy_follows_new_weights(model):
    """Weights loaded after a predict: the next predict fuses them afresh."""
    img = _image(40, 40, 1)
    before = model(img, imgsz=SIZE).depth.data
    sd = {k: v.clone() for k, v in model.model.state_dict().items()}
    sd["decoder.head_half.bias"] += 0.25
    model.load_state_dict(sd)
    try:
        after = model(img, imgsz=SIZE).depth.data
        assert not torch.equal(before, after)
        assert model._net().decoder.head_half.bias.item() == pytest.approx(model.model.decoder.head_half.bias.item())
    finally:
        sd["decoder.head_half.bias"] -= 0.25
        model.load_state_dict(sd)


def test_checkpoint_keeps_the_multi_branch_layout(model, tmp_path):
    model(_image(30, 30, 2), imgsz=SIZE)   # a fused copy exists
    path = model.save(tmp_path / "LibreZipDepthb-depth.pt")
    ckpt = torch.load(path, weights_only=True)
    assert "encoder.stage1.0.branch_3x3.0.weight" in ckpt["model"]
    assert not any(".fused." in k for k in ckpt["model"])
    back = LibreYOLO(str(path), device="cpu")
    assert (back.FAMILY, back.size, back.TASK, back.nc, back.imgsz) == ("zipdepth", "b", "depth", 1, 384)
    img = _image(30, 30, 3)
    assert torch.equal(back(img, imgsz=SIZE).depth.data, model(img, imgsz=SIZE).depth.data)


def test_cli_predict(tmp_path, monkeypatch):
    from PIL import Image

    from libreyolo.cli import main
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.png"
    Image.fromarray(_image(30, 40, 7)).save(src)
    out = tmp_path / "pred.json"
    assert main(["predict", "model=zipdepth-b", f"source={src}", f"imgsz={SIZE}", "device=cpu",
                 f"save_dir={tmp_path / 'pics'}", f"json={out}"]) == 0
    assert Image.open(tmp_path / "pics" / "in.jpg").size[1] == 30
    assert json.loads(out.read_text())[0]["detections"]["shape"] == [30, 40]


# ----------------------------------------------------------------------------------------- training

def test_val_reports_the_depth_metrics(model, tmp_path):
    data = make_shapes_depth_dataset(tmp_path / "sd", n_train=2, n_val=3, imgsz=64)
    m = model.val(data=str(data), imgsz=SIZE, batch=2, workers=0)
    assert 0 <= m["delta1"] <= 1 and m["abs_rel"] >= 0


def test_a_batch_of_one_is_refused_in_training(model):
    net = ZipDepthNet("b").train()
    with pytest.raises(ValueError, match="at least 2 images"):
        model.train_forward(net, torch.rand(1, 3, SIZE, SIZE))


def test_one_step_of_the_task_loss_reaches_every_weight(model):
    """The multi-branch network in training mode under the depth task's loss: finite, and every
    parameter gets a gradient (the fused form is never trained)."""
    net = ZipDepthNet("b").train()
    x = torch.rand(2, 3, SIZE, SIZE)
    target, valid = torch.rand(2, SIZE, SIZE) + 0.1, torch.ones(2, SIZE, SIZE, dtype=torch.bool)
    loss, items = model.build_loss()(model.train_forward(net, x), target, valid)
    loss.backward()
    assert torch.isfinite(loss) and items.shape == (1,)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.slow   # 10-17 s on one core: the trainer's two epochs with validation and checkpoints
def test_two_epochs_on_shapes_depth_then_the_checkpoint_predicts(tmp_path):
    """The shared trainer, the family's recipe (AdamW 5e-4, cosine): finite losses, the metrics,
    best.pt in the multi-branch layout loads and predicts through its fused copy."""
    data = make_shapes_depth_dataset(tmp_path / "sd", n_train=4, n_val=2, imgsz=48)
    m = LibreYOLO.new("zipdepth", "b", device="cpu", seed=0)
    res = m.train(data=str(data), epochs=2, imgsz=32, batch=2, workers=0, project=str(tmp_path / "runs"),
                  plots=False)
    assert len(res["losses"]) == 2 and all(np.isfinite(v) for row in res["losses"] for v in row)
    assert 0 <= res["delta1"] <= 1 and res["abs_rel"] >= 0
    best = LibreYOLO(res["best"], device="cpu")
    assert best.FAMILY == "zipdepth" and best.trained
    assert best(_image(20, 30, 0), imgsz=SIZE).depth.shape == (20, 30)
    assert best._net() is not best.model
