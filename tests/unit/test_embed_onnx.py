"""CLIP and SigLIP 2 exports loaded back: ``LibreYOLO("x.onnx")`` runs the two towers through
onnxruntime behind the PyTorch model's API (set_classes + predict -> Results.probs, embed,
embed_text), against eager on the tiny configuration of tests/unit/test_embed.py."""
import json

import numpy as np
import pytest
from test_embed import FAMILIES, tiny, tiny_sizes  # noqa: F401  (tiny_sizes: the module's autouse fixture)

from libreyolo import SAMPLE_IMAGE, LibreYOLO

pytest.importorskip("onnxruntime")

PROMPTS = ["a red circle", "a photo of a dog", "a much longer prompt about a small blue triangle on grey"]


def images():
    g = np.random.default_rng(0)
    return [SAMPLE_IMAGE, g.integers(0, 256, (40, 50, 3), dtype=np.uint8)]


@pytest.mark.parametrize("family", FAMILIES)
def test_classify_export_loads_back_and_matches_eager(tmp_path, family):
    m = tiny(family)
    m.set_classes(PROMPTS[:2], template="{}, a picture")
    path = m.export(file=tmp_path / "zs.onnx")
    o = LibreYOLO(str(path), device="cpu")
    assert type(o).__name__ == "OnnxImageTextModel" and o.TASK == "classify" and o.text_path.name == "zs-text.onnx"
    # the exported classes come back with the file
    assert o.names == m.names and o.prompts() == m.prompts()
    # then new prompts: tokenized here, encoded by the text graph
    m.set_classes(PROMPTS)
    o.set_classes(PROMPTS)
    assert o.names == m.names == dict(enumerate(PROMPTS))
    assert (o.class_head() - m.class_head()).abs().max() < 1e-5
    want, got = m(images(), topk=2), o(images(), topk=2)
    for a, b in zip(want, got):
        assert (a.probs.data - b.probs.data).abs().max() < 1e-5
        assert a.probs.top5 == b.probs.top5 and len(b.probs.top5) == 2
    r = o(SAMPLE_IMAGE, prompts="a cat,a dog")   # prompts= as for the PyTorch model
    assert len(r.probs) == 2 and o.names == {0: "a cat", 1: "a dog"}
    # embeddings through the same file
    assert (o.embed(images()) - m.embed(images())).abs().max() < 1e-5
    assert (o.embed_text(PROMPTS) - m.embed_text(PROMPTS)).abs().max() < 1e-5
    assert o.logits(o.embed(SAMPLE_IMAGE), o.embed_text(PROMPTS)).shape == (1, 3)


def test_embed_export_loads_back_with_embeddings(tmp_path):
    m = tiny("clip", task="embed")
    path = m.export(file=tmp_path / "e.onnx", dynamic=False)
    o = LibreYOLO(str(path), device="cpu", task="embed")
    rs = o(images())
    want = m(images())
    assert [type(r.embedding).__name__ for r in rs] == ["Embedding", "Embedding"]
    for a, b in zip(want, rs):
        assert (a.embedding.data - b.embedding.data).abs().max() < 1e-5
    assert json.loads(rs[0].to_json())["dim"] == 32
    long = ["x " * 40]   # CLIP's 77-token bucket: the text graph's length is symbolic
    assert (o.embed_text(long) - m.embed_text(long)).abs().max() < 1e-5


def test_bad_calls_are_refused(tmp_path):
    m = tiny("clip")
    path = m.export(file=tmp_path / "c.onnx")
    o = LibreYOLO(str(path), device="cpu")
    with pytest.raises(TypeError, match="list of prompts"):
        o.set_classes("a cat")
    with pytest.raises(ValueError, match="32x32 images only"):
        o(SAMPLE_IMAGE, imgsz=64)
    with pytest.raises(NotImplementedError, match="PyTorch engine"):
        o.embed_text(["a cat"], cuda_graph=True)
    with pytest.raises(NotImplementedError, match="training"):
        o.train(data="shapes-captions")
    assert o.embedder().to("cpu").TASK == "embed"
    other = tiny("clip", task="embed").export(file=tmp_path / "other" / "e.onnx")
    (tmp_path / "c-text.onnx").write_bytes(other.with_name("e-text.onnx").read_bytes())
    with pytest.raises(ValueError, match="not the text graph of c.onnx"):
        LibreYOLO(str(path), device="cpu")
    (tmp_path / "c-text.onnx").unlink()
    with pytest.raises(FileNotFoundError, match="c-text.onnx"):
        LibreYOLO(str(path), device="cpu")
