"""Two-graph ONNX export of the transformers promptable families (SAM, SAM 2, EdgeTAM, SAM 3):
``x.onnx`` (the image stage: one map, or SAM 2-style the two high-resolution skip features and the
embedding) and ``x.decoder.onnx`` (every map + points, labels, boxes -> the multimask and the
single-mask answers); ``LibreYOLO("x.onnx")`` runs the task's predictor with onnxruntime and gives
eager predict's masks and scores. Small configs at 112-128 frames (the families' own unit tests'),
input-sensitive weights; SAM 3 (the smallest) is the fast row, the others are slow (an export traces the image
network and two decoder passes: several seconds each on one core)."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the sam extra (pip install 'libreyolo-graphs[sam]')")
pytest.importorskip("onnxruntime")

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.engine.verify import input_sensitive  # noqa: E402
from libreyolo.export.onnx import read_metadata  # noqa: E402
from libreyolo.export.twostage import OnnxPromptModel  # noqa: E402

#: pixels whose logit is within float rounding of 0 may land on either side
MASK_PIXELS_TOL = 1e-3


def _sam():
    from libreyolo.models.sam.model import SAM
    from libreyolo.models.sam.nn import SamNet, SamSize, sam_config
    torch.manual_seed(0)
    net = SamNet(sam_config(SamSize(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, global_attn_indexes=(1,)),
                            image_size=128, window_size=4))
    return input_sensitive(SAM(net, size="base", imgsz=128, device="cpu", trained=False), seed=1)


def _sam2(family, size):
    def build():
        from libreyolo.models.registry import get_family
        return input_sensitive(get_family(family).new(size, device="cpu", imgsz=128, seed=0, video=False), seed=1)
    return build


def _sam3():
    from libreyolo.models.sam3 import nn as sam3_nn
    from libreyolo.models.sam3.model import Sam3
    small = sam3_nn.Sam3ViT(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            window_size=4, global_attn_indexes=(1,), pretrain_image_size=56)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sam3_nn.VIT, "large", small)
        m = Sam3.new("large", device="cpu", imgsz=112, seed=0, video=False)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():   # input-sensitive weights (transformers' init leaves the no-memory embedding at zero)
        for p in m.model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 / max(1, p[0].numel()) ** 0.5 if p.dim() > 1 else 0.1))
    return m


FAMILIES = {"sam": (_sam, 1), "sam2": (_sam2("sam2", "tiny"), 3), "edgetam": (_sam2("edgetam", "edge"), 3),
            "sam3": (_sam3, 3)}
PARAMS = [pytest.param("sam3", id="sam3"),
          *(pytest.param(f, id=f, marks=pytest.mark.slow) for f in ("sam", "sam2", "edgetam"))]


@pytest.fixture(scope="module")
def image():
    g = np.random.default_rng(0)
    img = np.full((90, 160, 3), 30, np.uint8)
    img[20:70, 30:100] = (220, 40, 40)
    return np.clip(img + g.integers(0, 30, img.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module", params=PARAMS)
def exported(request, tmp_path_factory):
    build, maps = FAMILIES[request.param]
    m = build()
    path = m.export(format="onnx", file=tmp_path_factory.mktemp(request.param) / "m.onnx")
    return m, LibreYOLO(str(path)), maps


PROMPTS = [{"points": [[60, 45]], "labels": [1]},
           {"boxes": [[30, 20, 100, 70]]},
           {"points": [[60, 45], [5, 5], [120, 80]], "labels": [1, 0, 1], "boxes": [[30, 20, 100, 70]],
            "multimask": False},
           {"points": [[60, 45], [140, 10]], "labels": [1, 1], "multimask": False}]


def test_two_graphs_with_every_map(exported):
    m, o, maps = exported
    assert isinstance(o, OnnxPromptModel) and o.decoder_path.name == "m.decoder.onnx"
    assert [x.name for x in o.session.get_outputs()][-1] == "embeddings" and len(o.session.get_outputs()) == maps
    names = [i.name for i in o.decoder_session.get_inputs()]
    assert names[:maps] == [x.name for x in o.session.get_outputs()] and names[maps:] == ["points", "labels", "boxes"]
    assert read_metadata(o.decoder_path)["family"] == m.FAMILY


def test_masks_and_scores_match_eager_predict(exported, image):
    """Eager predict and the exported pair on the same image and prompts (any number of points;
    a box alone; points with a box; multimask and not): masks equal on >= 99.9 % of pixels,
    scores within 1e-4; the eager masks are neither empty nor full (the check can fail)."""
    m, o, _ = exported
    mixed = False
    for kw in PROMPTS:
        e, r = m(image, bgr=False, **kw).masks, o(image, bgr=False, **kw).masks
        assert e.data.shape == r.data.shape and e.data.shape[1:] == image.shape[:2]
        assert (e.data != r.data).float().mean() <= MASK_PIXELS_TOL
        assert np.abs(e.scores.numpy() - r.scores.numpy()).max() <= 1e-4
        mixed |= bool(0.01 < e.data.float().mean() < 0.99)
    assert mixed


def test_prompts_on_the_set_image(exported, image):
    m, o, _ = exported
    m.set_image(image, bgr=False)
    o.set_image(image, bgr=False)
    e, r = m(points=[[70, 50]]).masks, o(points=[[70, 50]]).masks
    assert (e.data != r.data).float().mean() <= MASK_PIXELS_TOL
    assert np.abs(e.scores.numpy() - r.scores.numpy()).max() <= 1e-4


def test_bad_prompts_get_the_families_errors(exported, image):
    """A SAM 2-style family pairs one box with the points (its error, from the loader too); mask
    prompts need the PyTorch model (the exported decoder has no mask input)."""
    m, o, maps = exported
    if maps == 3:
        with pytest.raises(ValueError, match="at most one box"):
            o(image, boxes=[[0, 0, 20, 20], [30, 30, 60, 60]])
    with pytest.raises(ValueError, match="mask"):
        o(image, points=[[60, 45]], mask_input=np.zeros(image.shape[:2], bool))


def test_a_family_without_a_prompt_decoder_is_refused_by_name(tmp_path):
    """PicoSAM3 runs one network per cropped box: no image embedding, no decoder to export."""
    from libreyolo.export.onnx import OnnxExportError
    m = LibreYOLO.new("picosam3", "pico", device="cpu", seed=0)
    with pytest.raises(OnnxExportError, match="picosam3-pico has no segment-prompt ONNX export.*no prompt encoder"):
        m.export(format="onnx", file=tmp_path / "p.onnx")
    assert not (tmp_path / "p.onnx").exists() and not (tmp_path / "p.decoder.onnx").exists()


def test_an_operator_without_onnx_export_is_refused_naming_family_and_operator(tmp_path, monkeypatch):
    """An image stage that calls an operator ONNX has no export for (a Bessel function here, in
    place of a real one) gives one error naming the family and the operator; neither graph is left."""
    from libreyolo.export.onnx import OnnxExportError
    from libreyolo.models.sam.nn import SamNet
    m = _sam()
    embed = SamNet.embed
    monkeypatch.setattr(SamNet, "embed", lambda self, x, size=None: torch.special.bessel_j0(embed(self, x, size)))
    with pytest.raises(OnnxExportError, match=r"sam-base cannot be exported to ONNX .*operator aten::special_bessel_j0"):
        m.export(format="onnx", file=tmp_path / "s.onnx")
    assert not (tmp_path / "s.onnx").exists() and not (tmp_path / "s.decoder.onnx").exists()
