"""LingBot-Vision: sizes and parameter counts, the RoPE tables and the key-masked qkv bias, the
patch grid, predict, the recipe and training through the shared trainer. The fixture
reproduction is a row of ``rows.FIXTURES`` (tests/unit/test_fixtures.py); ONNX export a row of
``rows.ONNX_MODELS``."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.cli import main
from libreyolo.models.lingbotvision.nn import CONFIGS, LingBotVisionNet, RopePositionEmbedding, _rope
from libreyolo.ops.interpolate import resize_bilinear
from libreyolo.tasks.semantic.maps import resize_nearest
from libreyolo.tasks.semantic.synthetic import make_shapes_seg_dataset

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

# Computed from this implementation with nc=150 (ADE20K); s is the fixture's num_parameters, g the
# reference's 1.1 B teacher.
PARAMS_150 = {"s": 21_658_902, "b": 85_784_982, "l": 303_307_926, "g": 1_134_705_302}


@pytest.mark.parametrize("size", sorted(CONFIGS))
def test_every_size_builds_with_expected_parameter_count(size):
    with torch.device("meta"):
        net = LingBotVisionNet(size, 150)
    sd = net.state_dict()
    assert sum(p.numel() for p in net.parameters()) == PARAMS_150[size]
    assert sd["backbone.rope_embed.periods"].shape == (16,)   # head width 64 for every size
    assert "mean" not in sd and "std" not in sd
    # g: SwiGLU MLP and a qkv without bias (so no bias_mask), as the reference's teacher
    assert ("backbone.blocks.0.mlp.w1.weight" in sd) == (size == "g")
    assert ("backbone.blocks.0.attn.qkv.bias_mask" in sd) == (size != "g")


def test_rope_tables_follow_the_formula():
    rope = RopePositionEmbedding(384, 6)
    assert torch.allclose(rope.periods, 100.0 ** (torch.arange(16) / 16.0))
    sin, cos = rope(2, 3)
    assert sin.shape == cos.shape == (6, 64)
    # patch (row 1, column 2) of a 2 x 3 grid: normalised centres ((1.5 / 2) * 2 - 1, (2.5 / 3) * 2 - 1)
    y, x = 0.5, 2 / 3
    angles = torch.cat([2 * math.pi * y / rope.periods, 2 * math.pi * x / rope.periods])
    assert torch.allclose(sin[5], torch.sin(angles).repeat(2), atol=1e-6)
    assert torch.allclose(cos[5], torch.cos(angles).repeat(2), atol=1e-6)


def test_key_bias_is_masked_and_prefix_tokens_are_not_rotated():
    torch.manual_seed(0)
    net = LingBotVisionNet("s", 3).eval()
    x = torch.rand(1, 3, 32, 48)
    qkv = net.backbone.blocks[0].attn.qkv
    assert qkv.bias_mask[:384].eq(1).all() and qkv.bias_mask[384:768].eq(0).all() and qkv.bias_mask[768:].eq(1).all()
    with torch.no_grad():
        ref = net(x)["semantic_logits"]
        qkv.bias[384:768] += 5.0                  # the key bias: masked, no effect
        assert torch.equal(net(x)["semantic_logits"], ref)
        qkv.bias[:384] += 0.5                     # the query bias counts
        assert not torch.equal(net(x)["semantic_logits"], ref)
    # the rotation applies to the patch tokens only: the class and storage tokens pass as they are
    q = torch.randn(1, 2, 5 + 6, 64)
    sin, cos = RopePositionEmbedding(128, 2)(2, 3)
    rotated = _rope(q, sin, cos)
    assert torch.equal(rotated[:, :, :5], q[:, :, :5]) and not torch.allclose(rotated[:, :, 5:], q[:, :, 5:])
    assert torch.allclose(rotated.norm(dim=-1), q.norm(dim=-1), atol=1e-5)   # a rotation keeps lengths


def test_patch_grid_outputs_and_input_checks():
    torch.manual_seed(0)
    net = LingBotVisionNet("s", 5).eval()
    with torch.no_grad():
        out = net(torch.rand(2, 3, 48, 80))["semantic_logits"]
    assert out.shape == (2, 5, 3, 5) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="multiples of the 16-pixel patch"):
        net(torch.rand(1, 3, 40, 48))
    with pytest.raises(ValueError, match="'h'"):
        LingBotVisionNet("h", 5)
    net.train()
    loss = F.cross_entropy(resize_bilinear(net(torch.rand(2, 3, 32, 32))["semantic_logits"], (32, 32)),
                           torch.randint(0, 5, (2, 32, 32)))
    loss.backward()
    # every parameter learns but the mask token (masked-image pretraining only)
    missing = [n for n, p in net.named_parameters() if p.grad is None]
    assert missing == ["backbone.mask_token"], missing


def test_predict_stretches_and_maps_the_argmax_back():
    m = LibreYOLO.new("lingbotvision", "s", nc=4, device="cpu", seed=0)
    img = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    r = m(img, imgsz=64, color_format="rgb")
    x = m.preprocess(torch.from_numpy(img)[None], 64)
    with torch.no_grad():
        logits = m.infer(x)
        raw = m.model(x)["semantic_logits"]
    assert m.preprocess.resize == "stretch" and m.preprocess.mean is None
    assert raw.shape == (1, 4, 4, 4) and torch.equal(logits, F.interpolate(raw, size=(64, 64), mode="bilinear"))
    assert torch.equal(r.masks.data, resize_nearest(logits.argmax(1)[0].to(torch.uint8), 50, 70))


def test_recipe_is_the_linear_probe_for_trained_weights_only():
    m = LibreYOLO.new("lingbotvision", "s", nc=6, device="cpu")
    d = m.train_defaults()
    assert d["optimizer"] == "AdamW" and d["lr0"] == 1e-3 and "freeze" not in d and d["cos_lr"]
    m.trained = True
    d = m.train_defaults()
    assert d["lr0"] == 1e-3 and d["freeze"] == "backbone" and d["color_jitter"] == 0.0


@pytest.mark.slow
def test_two_epochs_on_shapes_seg_beat_the_untrained_model(tmp_path):
    """Two epochs of cross-entropy on the upsampled logits: the validation mIoU
    rises above the untrained model's; the checkpoint loads and predicts."""
    yaml = make_shapes_seg_dataset(tmp_path / "ds", n_train=16, n_val=8, imgsz=64, seed=0)
    m = LibreYOLO.new("lingbotvision", "s", nc=6, device="cpu", seed=0)
    before = m.val(data=str(yaml), imgsz=64, batch=8, workers=0)["miou"]
    res = m.train(data=str(yaml), epochs=2, batch=8, imgsz=64, workers=0, project=str(tmp_path), name="run",
                  plots=False, verbose=False)
    after = m.val(data=str(yaml), imgsz=64, batch=8, workers=0)["miou"]
    assert after > before, (before, after)
    assert res["loss_names"] == ["ce"] and res["losses"][1][0] < res["losses"][0][0]
    best = LibreYOLO(res["best"], device="cpu")
    assert (best.FAMILY, best.size, best.nc) == ("lingbotvision", "s", 6)
    assert best(SAMPLE_IMAGE, imgsz=64).masks.shape == (720, 1280)


@pytest.mark.slow
def test_linear_probe_from_trained_weights_leaves_the_backbone_and_cli_runs(tmp_path, capsys):
    """A trained checkpoint fine-tunes with the recipe's frozen backbone (the head alone moves);
    the CLI trains, validates and predicts."""
    yaml = make_shapes_seg_dataset(tmp_path / "ds", n_train=4, n_val=2, imgsz=32, seed=0)
    src = LibreYOLO.new("lingbotvision", "s", nc=6, device="cpu", seed=0).save(tmp_path / "start.pt")
    args = [f"model={src}", f"data={yaml}", "imgsz=32", "batch=4", "workers=0", "device=cpu"]
    assert main(["train", *args, "epochs=1", f"project={tmp_path}", "name=r", "plots=false"]) == 0
    assert "mIoU" in capsys.readouterr().out
    start = LibreYOLO(str(src), device="cpu").model.state_dict()
    tuned = LibreYOLO(str(tmp_path / "r" / "weights" / "last.pt"), device="cpu").model.state_dict()
    assert all(torch.equal(start[k], tuned[k]) for k in start if k.startswith("backbone."))
    assert not torch.equal(start["predict.weight"], tuned["predict.weight"])
    best = tmp_path / "r" / "weights" / "best.pt"
    assert main(["val", f"model={best}", *args[1:]]) == 0
    assert main(["predict", f"model={best}", f"source={SAMPLE_IMAGE}", "imgsz=32", "device=cpu",
                 f"save_dir={tmp_path / 'p'}"]) == 0
