"""Depth Anything 3 (DA3-Mono) on the CPU. Size l is 334 M parameters, so the fast tests run a
tiny configuration of the same code (the same classes, fewer and narrower blocks); what needs
the real size is marked slow. The fixture reproduction itself is a row of ``rows.FIXTURES``
(marked slow there: each row fills and loads ~1.3 GB)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libreyolo.models.depth_anything.nn import DepthAnythingConfig
from libreyolo.models.depth_anything3.model import DepthAnything3
from libreyolo.models.depth_anything3.nn import (
    INVERSE_DEPTH_EPS,
    SKY_FAR_QUANTILE,
    DepthAnything3Net,
    sky_to_far,
)
from libreyolo.models.registry import parse_spec
from libreyolo.tasks.depth.synthetic import make_shapes_depth_dataset

#: the same code at toy widths: 4 blocks of width 32, DPT features 16
TINY = DepthAnythingConfig(embed_dim=32, depth=4, heads=2, layers=(0, 1, 2, 3), features=16,
                           out_channels=(8, 16, 32, 32))
SIZE = 42   # a 3 x 3 patch grid


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return DepthAnything3(DepthAnything3Net(cfg=TINY), size="l", trained=False, device="cpu",
                          source="tiny depth_anything3")


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _image(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------ network

def test_size_l_is_the_fixtures_count_and_layout_on_meta():
    with torch.device("meta"):
        net = DepthAnything3Net("l")
    sd = net.state_dict()
    assert sum(p.numel() for p in net.parameters()) == 334_171_394
    fx = json.loads((__import__("conftest").FIXTURES_DIR / "depth_anything3-l.json").read_text())
    assert [(k, list(v.shape)) for k, v in sd.items()] == [(n, s) for n, s, _ in fx["layout"]]
    with pytest.raises(ValueError, match="unknown Depth Anything 3 size 's'; sizes: l"):
        DepthAnything3Net("s")


def test_differences_from_v2_are_in_the_module_tree(model):
    net = model.model
    vit, scratch = net.backbone.pretrained, net.head.scratch
    assert not hasattr(vit, "mask_token")
    assert vit.norm.eps == 1e-5 and all(b.norm1.eps == 1e-6 and b.norm2.eps == 1e-6 for b in vit.blocks)
    assert not hasattr(scratch.refinenet4, "resConfUnit1") and hasattr(scratch.refinenet3, "resConfUnit1")
    assert len(scratch.output_conv2) == 3 and len(scratch.sky_output_conv2) == 3   # no closing ReLU
    keys = list(scratch.refinenet1.state_dict())
    assert keys[0].startswith("resConfUnit1") and keys[-1].startswith("out_conv")   # DA3's order


def test_output_is_the_inverse_of_the_exp_of_the_depth_branch(model):
    """Without the sky step the network returns 1 / max(exp(output_conv2), 1e-6)."""
    net = model.model
    x = torch.rand(2, 3, SIZE, 56)
    with torch.no_grad():
        got = net(x, sky=False)
        xn = (x - net.mean) / net.std
        feat = net.head.features(net.backbone.pretrained(xn, TINY.layers), 3, 4)
        ref = 1 / torch.exp(net.head.scratch.output_conv2(feat)).clamp_min(INVERSE_DEPTH_EPS)
    assert got.shape == (2, 1, SIZE, 56) and got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="multiples of 14, got 40x42"):
        net(torch.rand(1, 3, 40, 42))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\) batch, got shape \(3, 42, 42\)"):
        net(torch.rand(3, 42, 42))


def test_sky_step_by_hand():
    """Per image: sky pixels (score >= 0.3) take the 0.99 quantile of the other depths when there
    are more than 10 of each; otherwise the image is left as it is."""
    g = torch.Generator().manual_seed(0)
    depth = torch.rand(3, 1, 8, 9, generator=g) * 5 + 1
    sky = torch.zeros(3, 1, 8, 9)
    sky[0, 0, :2] = 0.9            # 18 sky pixels: replaced
    sky[1, 0, 0, :10] = 0.5        # 10 sky pixels: too few, left alone
    sky[2] = 1.0                   # all sky: no other depth to take, left alone
    sky[0, 0, 2, 0] = 0.29         # just under the threshold: not sky
    out = sky_to_far(depth, sky)
    clear = sky[0, 0] < 0.3
    far = np.quantile(depth[0, 0][clear].numpy().astype(np.float64), SKY_FAR_QUANTILE)
    assert torch.allclose(out[0, 0][~clear], torch.tensor(far, dtype=torch.float32))
    assert torch.equal(out[0, 0][clear], depth[0, 0][clear])
    assert torch.equal(out[1:], depth[1:])


def test_the_sky_step_runs_in_predict_not_in_training():
    """Predict (infer) is the network with DA3's sky step; the training forward leaves it out."""
    m = tiny_model(1)
    net, sc = m.model, m.model.head.scratch
    x = torch.rand(1, 3, SIZE, SIZE)
    with torch.no_grad():
        feat = net.head.features(net.backbone.pretrained((x - net.mean) / net.std, TINY.layers), 3, 3)
        sc.sky_output_conv2[2].bias += 0.3 - sc.sky_output_conv2(feat).median()   # about half the pixels sky
        sky = torch.relu(sc.sky_output_conv2(feat))
        assert 10 < int((sky >= 0.3).sum()) < SIZE * SIZE - 10
        ref = 1 / sky_to_far(torch.exp(sc.output_conv2(feat)), sky).clamp_min(INVERSE_DEPTH_EPS)
        got = m.infer(x)
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
        assert torch.equal(got, net(x))
        plain = net(x, sky=False)
        assert torch.equal(m.train_forward(net, x), plain) and not torch.equal(got, plain)
        assert torch.equal(got[sky < 0.3], plain[sky < 0.3])   # only the sky pixels change


# ------------------------------------------------------------------------------------------ predict

def test_declarations(model):
    p = model.preprocess
    assert (p.resize, p.interpolation, p.multiple, p.mean) == ("cover", "bicubic", 14, None)
    assert p.input_hw(480, 640, 504) == (504, 672)
    assert (model.TASK, model.nc, model.imgsz, model.STRIDE) == ("depth", 1, 504, 14)
    assert model.SUPPORTS_CUDA_GRAPH and not model.SUPPORTS_CUDA_GRAPH_TRAIN   # predict proven on a GPU
    assert parse_spec("depth_anything3-l")[0] is DepthAnything3
    assert parse_spec("LibreDepthAnything3l.pt")[0] is DepthAnything3
    assert parse_spec("depth_anything-l")[0] is not DepthAnything3


def test_predict_maps_back_and_equals_the_network(model):
    img = _image(50, 70, 0)
    r = model(img, imgsz=SIZE, color_format="rgb")
    with torch.no_grad():
        ref = model.model(model.preprocess(torch.from_numpy(img)[None], SIZE))
    ref = F.interpolate(ref, size=(50, 70), mode="bilinear", align_corners=True)[0, 0]
    assert r.depth.shape == (50, 70) and torch.equal(r.depth.data, ref) and bool((ref > 0).all())


def test_onnx_export_is_refused_naming_the_operator(model, tmp_path):
    """The depth task exports (tests/unit/test_export_task_graphs.py); Depth Anything 3's network
    uses an operator ONNX lacks: one error naming it."""
    from libreyolo.export.onnx import OnnxExportError
    with pytest.raises(OnnxExportError, match="depth_anything3-l cannot be exported to ONNX .*aten::nanquantile"):
        model.export("onnx", file=str(tmp_path / "d.onnx"), imgsz=SIZE)


# ----------------------------------------------------------------------------------------- training

def test_val_and_one_step_of_the_task_loss(model, tmp_path):
    data = make_shapes_depth_dataset(tmp_path / "sd", n_train=2, n_val=3, imgsz=48)
    m = model.val(data=str(data), imgsz=SIZE, batch=2, workers=0)
    assert 0 <= m["delta1"] <= 1 and m["abs_rel"] >= 0
    net = DepthAnything3Net(cfg=TINY).train()
    x = torch.rand(2, 3, 28, 28)
    loss, _ = model.build_loss()(model.train_forward(net, x), torch.rand(2, 28, 28) + 0.1,
                                 torch.ones(2, 28, 28, dtype=torch.bool))
    loss.backward()
    assert torch.isfinite(loss)
    unused = {n for n, p in net.named_parameters() if p.grad is None}
    # the sky branch is inference post-processing: the only weights the loss does not reach
    assert all(n.startswith("head.scratch.sky_output_conv2") for n in unused), unused


@pytest.mark.slow   # about 10 s on one core: the trainer's two epochs with validation and checkpoints
def test_two_epochs_on_shapes_depth(tmp_path):
    data = make_shapes_depth_dataset(tmp_path / "sd", n_train=4, n_val=2, imgsz=48)
    m = tiny_model()
    res = m.train(data=str(data), epochs=2, imgsz=28, batch=2, workers=0, project=str(tmp_path / "runs"),
                  plots=False)
    assert len(res["losses"]) == 2 and all(np.isfinite(v) for row in res["losses"] for v in row)
    assert 0 <= res["delta1"] <= 1 and res["abs_rel"] >= 0
    ckpt = torch.load(res["best"], weights_only=True)
    assert ckpt["model_family"] == "depth_anything3" and "head.scratch.sky_output_conv2.2.weight" in ckpt["model"]


@pytest.mark.slow   # builds the 334 M-parameter network (about 15 s)
def test_cli_predict_with_size_l(tmp_path, monkeypatch):
    from PIL import Image

    from libreyolo.cli import main
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.png"
    Image.fromarray(_image(30, 40, 7)).save(src)
    out = tmp_path / "pred.json"
    assert main(["predict", "model=depth_anything3-l", f"source={src}", f"imgsz={SIZE}", "device=cpu",
                 f"json={out}", f"save_dir={tmp_path / 'pics'}"]) == 0
    assert json.loads(out.read_text())[0]["detections"]["shape"] == [30, 40]
