"""CLIP and SigLIP 2: tower parity with the fixtures, zero-shot classify, the embed task (predict,
CLI, training, validation), ONNX export of both towers, bad input.

The full fixture rows (both towers loaded through the factory) are slow (rows.SLOW_FIXTURES); the
parity tests here fill only the entries of the tower they run. Everything else runs a tiny
configuration of each family (one block per tower, 32 px) registered for the test.
"""
import json

import numpy as np
import pytest
import torch
from conftest import FIXTURES_DIR
from fill import fill_state_dict

from libreyolo import SAMPLE_IMAGE
from libreyolo.models.clip import nn as clip_nn
from libreyolo.models.clip.model import CLIP, CLIPEmbed
from libreyolo.models.siglip2 import nn as siglip_nn
from libreyolo.models.siglip2.model import SigLIP2, SigLIP2Embed
from libreyolo.tasks.embed.data import make_builtin

FAMILIES = {"clip": (CLIP, CLIPEmbed), "siglip2": (SigLIP2, SigLIP2Embed)}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def tower_fixture(name, prefix):
    fx = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    pt = torch.load(FIXTURES_DIR / f"{name}.pt", weights_only=True)
    layout = [row for row in fx["layout"] if row[0].startswith(prefix)]
    return fill_state_dict(layout), pt


def test_clip_image_tower_reproduces_fixture():
    """The CLIP image tower against clip-b32 (built and filled alone)."""
    sd, pt = tower_fixture("clip-b32", "visual.")
    vis = clip_nn.VisionTransformer(clip_nn.CONFIGS["b32"])
    vis.load_state_dict({k[len("visual."):]: v for k, v in sd.items()}, strict=True)
    with torch.no_grad():
        assert rel(vis.eval()(pt["input"]), pt["outputs"]["image_features"]) <= 1e-4


def test_clip_text_tower_reproduces_fixture():
    """The CLIP text tower against clip-b32 (the image tower left out), and the bucketed token
    length gives the full-length text features."""
    pt = torch.load(FIXTURES_DIR / "clip-b32.pt", weights_only=True)
    fx = json.loads((FIXTURES_DIR / "clip-b32.json").read_text())
    text_sd = fill_state_dict([r for r in fx["layout"] if not r[0].startswith("visual.")])
    with torch.device("meta"):
        net = clip_nn.CLIPNet("b32")
    net.visual = torch.nn.Identity()
    net = net.to_empty(device="cpu")
    net.causal_mask = torch.full((77, 77), float("-inf")).triu_(1)
    net.load_state_dict(text_sd, strict=True)
    ids = pt["extra_inputs"]["input_ids"]
    with torch.no_grad():
        full = net.eval().encode_text(ids)
        assert rel(full, pt["outputs"]["text_features"]) <= 1e-4
        assert rel(net.encode_text(ids[:, :16]), full) <= 1e-5   # the 16-token bucket


def test_siglip2_image_tower_reproduces_fixture():
    """The SigLIP 2 image tower against siglip2-b16 (its text tower: the slow fixture rows)."""
    sd, pt = tower_fixture("siglip2-b16", "vision_model.")
    vis = siglip_nn.VisionModel(siglip_nn.CONFIGS["b16"])
    vis.load_state_dict({k[len("vision_model."):]: v for k, v in sd.items()}, strict=True)
    with torch.no_grad():
        assert rel(vis.eval()(pt["input"]), pt["outputs"]["image_features"]) <= 1e-4


@pytest.fixture(scope="module", autouse=True)
def tiny_sizes():
    """A 'tiny' size of each family for the fast tests (the classes' SIZES extended for this module)."""
    clip_nn.CONFIGS["tiny"] = clip_nn.CLIPConfig(embed_dim=32, image_size=32, patch_size=16, vision_width=64,
                                                 vision_layers=1, text_width=32, text_heads=2, text_layers=1)
    siglip_nn.CONFIGS["tiny"] = siglip_nn.SigLIP2Config(width=32, layers=1, heads=2, mlp=64, image_size=32,
                                                        patch_size=16)
    saved = {c: (c.SIZES, c.DEFAULT_IMGSZ_BY_SIZE) for pair in FAMILIES.values() for c in pair}
    for c in saved:
        c.SIZES = (*c.SIZES, "tiny")
        c.DEFAULT_IMGSZ_BY_SIZE = {**c.DEFAULT_IMGSZ_BY_SIZE, "tiny": 32}
    yield
    for c, (sizes, imgsz) in saved.items():
        c.SIZES, c.DEFAULT_IMGSZ_BY_SIZE = sizes, imgsz
    del clip_nn.CONFIGS["tiny"], siglip_nn.CONFIGS["tiny"]


def tiny(family, task=None):
    return FAMILIES[family][0].new("tiny", device="cpu", seed=0, task=task)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_shot_probs_over_prompts(family):
    m = tiny(family)
    m.set_classes(["a cat", "a dog", "a red circle"])
    r = m(SAMPLE_IMAGE)
    assert m.names == {0: "a cat", 1: "a dog", 2: "a red circle"} and len(r.probs) == 3
    img = m.embed(SAMPLE_IMAGE)
    txt = m.embed_text(["a cat", "a dog", "a red circle"])
    logits = m.logits(img, txt, m.model)[0]
    ref = logits.softmax(-1) if family == "clip" else logits.sigmoid()
    assert torch.allclose(r.probs.data, ref, atol=1e-5)
    assert r.probs.top1 == int(ref.argmax())
    if family == "clip":
        assert abs(float(r.probs.data.sum()) - 1) < 1e-5
    # prompts= (the CLI's option) sets the same classes; a template wraps them
    r2 = m(SAMPLE_IMAGE, prompts="a cat,a dog")
    assert len(r2.probs) == 2 and m.names == {0: "a cat", 1: "a dog"}
    m.set_classes(["cat", "dog"], template="a photo of a {}.")
    assert m.prompts() == ["a photo of a cat.", "a photo of a dog."]


@pytest.mark.parametrize("family", FAMILIES)
def test_embeddings_are_normalized_and_match_predict(family):
    m = tiny(family, task="embed")
    r = m([SAMPLE_IMAGE, np.zeros((40, 50, 3), np.uint8)])
    assert [type(x.embedding).__name__ for x in r] == ["Embedding", "Embedding"]
    e = torch.stack([x.embedding.data for x in r])
    assert torch.allclose(e.norm(dim=1), torch.ones(2), atol=1e-5)
    assert torch.allclose(m.embed([SAMPLE_IMAGE]), e[:1], atol=1e-6)
    t = m.embed_text("a cat")
    assert t.shape == (1, m.model.embed_dim) and abs(float(t.norm()) - 1) < 1e-5
    summary = json.loads(r[0].to_json())
    assert summary["dim"] == m.model.embed_dim and len(summary["embedding"]) == m.model.embed_dim
    assert r[0].numpy().embedding.data.dtype == np.float32


def test_cli_writes_embeddings_and_zero_shot(tmp_path, monkeypatch):
    from libreyolo.cli import main
    m = tiny("clip", task="embed")
    ckpt = m.save(tmp_path / "clip-tiny-embed.pt")
    out = tmp_path / "emb.json"
    assert main(["predict", f"model={ckpt}", f"source={SAMPLE_IMAGE}", f"json={out}"]) in (0, None)
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and len(rows[0]["detections"]["embedding"]) == 32
    c = tiny("clip")
    ckpt = c.save(tmp_path / "clip-tiny.pt")
    out = tmp_path / "zs.json"
    assert main(["predict", f"model={ckpt}", f"source={SAMPLE_IMAGE}", "prompts=a cat,a dog", f"json={out}"]) in (0, None)
    top = json.loads(out.read_text())[0]["detections"]
    assert {t["name"] for t in top} == {"a cat", "a dog"}


@pytest.mark.parametrize("family,lr", [("clip", 2e-3), ("siglip2", 2e-3)])
def test_contrastive_training_beats_untrained(tmp_path, family, lr):
    """Two epochs on a small shapes-captions set: zero-shot top-1 above the untrained model's."""
    data = make_builtin(n_train=96, n_val=48, side=32)
    m = tiny(family, task="embed")
    before = m.val(data=data, batch=16, workers=0)
    assert set(before) >= {"top1", "top5", "recall@1", "recall@5", "text_recall@1"}
    # SigLIP 2's 256,000-token embedding stays frozen here: AdamW over it is most of a CPU step
    freeze = "text_model.embeddings.token_embedding" if family == "siglip2" else None
    res = m.train(data=data, epochs=2, batch=16, lr0=lr, workers=0, project=str(tmp_path), name="run",
                  plots=False, verbose=False, freeze=freeze)
    after = m.val(data=data, batch=16, workers=0)
    assert after["top1"] > before["top1"], (before, after)
    assert after["top1"] == pytest.approx(res["best_metrics"]["top1"]) if "best_metrics" in res else True
    assert m.names[0] == "a red circle"


def test_zero_shot_validation_on_a_classification_set(tmp_path):
    from libreyolo.data.shapes_cls import make_shapes_cls_dataset
    yaml = make_shapes_cls_dataset(tmp_path / "cls", n_train=6, n_val=12)
    m = tiny("clip")
    metrics = m.val(data=str(yaml), batch=6, workers=0)
    assert 0.0 <= metrics["top1"] <= 1.0 and m.nc == 6
    assert m.prompts()[0] == "a photo of a circle."
    # fine-tuning the classify model: cross-entropy of each image against the class prompts
    res = m.train(data=str(yaml), epochs=1, batch=6, lr0=1e-3, workers=0, project=str(tmp_path), name="cls",
                  plots=False, verbose=False)
    assert 0.0 <= res["best_metrics"]["top1"] <= 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_export_of_both_towers_matches_eager(tmp_path, family):
    ort = pytest.importorskip("onnxruntime")
    m = tiny(family)
    path = m.export(file=tmp_path / "towers.onnx")
    text = tmp_path / "towers-text.onnx"
    x = torch.rand(2, 3, 32, 32)
    ref = m.image_embedding(m.preprocess.normalize(x)).detach()
    got = ort.InferenceSession(str(path)).run(None, {"images": x.numpy()})[0]
    assert np.abs(got - ref.numpy()).max() < 1e-5
    ids = m.tokenize(["a red circle", "a much longer prompt about a small blue triangle"])
    got_t = ort.InferenceSession(str(text)).run(None, {"input_ids": ids.numpy()})[0]
    assert np.abs(got_t - m.embed_text(["a red circle", "a much longer prompt about a small blue triangle"])
                  .numpy()).max() < 1e-5
    if family == "clip":   # the text graph takes every bucketed length
        full = m.tokenizer(["a red circle"])
        got_f = ort.InferenceSession(str(text)).run(None, {"input_ids": full.numpy()})[0]
        assert np.abs(got_f - got_t[:1]).max() < 1e-5
    import onnx
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["family"] == family and float(meta["logit_scale"]) > 0
    with pytest.raises(ValueError, match="ONNX only"):
        m.export("torchscript")
    with pytest.raises(ValueError, match="32x32 images only"):
        m.export(file=tmp_path / "x.onnx", imgsz=64)


def test_bad_input_is_refused():
    m = tiny("clip")
    with pytest.raises(TypeError, match="list of prompts"):
        m.set_classes("a cat")
    with pytest.raises(ValueError, match="at least one prompt"):
        m.set_classes([])
    with pytest.raises(ValueError, match="placeholder"):
        m.set_classes(["cat"], template="a photo")
    with pytest.raises(ValueError, match="takes 32x32 inputs"):
        m.model(torch.rand(1, 3, 64, 64))
    with pytest.raises(TypeError, match="int64 tensor"):
        m.encode_text_ids(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="token ids must be"):
        tiny("siglip2").model.encode_text(torch.zeros(1, 10, dtype=torch.long))
    with pytest.raises(ValueError, match="text tower"):
        from libreyolo import LibreYOLO
        LibreYOLO.new("resnet", "18", nc=3, device="cpu")(SAMPLE_IMAGE, prompts="a cat")
    from libreyolo.options import OptionError
    with pytest.raises(OptionError, match="without EMA"):
        tiny("clip", task="embed").train(data="shapes-captions", epochs=1, ema=True)
    with pytest.raises(ValueError, match="embed data"):
        tiny("clip", task="embed").val(data="no-such-dataset")


def test_checkpoint_round_trip_keeps_task_and_loads_by_name(tmp_path):
    from libreyolo import LibreYOLO
    from libreyolo.models.registry import parse_spec
    m = tiny("siglip2", task="embed")
    path = m.save(tmp_path / "s.pt")
    back = LibreYOLO(str(path), device="cpu")
    assert type(back) is SigLIP2Embed
    assert torch.equal(back.embed(SAMPLE_IMAGE), m.embed(SAMPLE_IMAGE))
    assert parse_spec("LibreCLIPb32-cls.pt") == (CLIP, "b32")
    assert parse_spec("LibreSigLIP2so400m.pt") == (SigLIP2, "so400m")
    assert parse_spec("clip-b16-embed") == (CLIPEmbed, "b16")
