"""ONNX export of depth, matte, OCR and promptable segmentation: ``LibreYOLO("x.onnx")`` gives eager
predict's Results (CPU, fp32, onnxruntime).

Depth and matte export the network (``RawGraph``) and run the task's own resize back on the host;
OCR exports the detector and, beside it, the recognizer (``<stem>.rec.onnx``), with the DB boxes,
crops and CTC decode on the host; MobileSAM exports the image encoder and, beside it, the prompt
decoder (``<stem>.decoder.onnx``), with the prompt mapping and mask post-processing on the host
(libreyolo/export/twostage.py). Weights: ``engine.verify.input_sensitive`` (outputs that depend on
the input). Asserted: depth maps and alphas within 1e-5 of their scale, OCR lines (polygons, texts)
equal and confidences within 1e-5, SAM's low-resolution logits within 1e-4 (masks: at most 1e-4 of
the pixels differ) and IoU scores within 1e-5.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.export.onnx import OnnxExportError, read_metadata
from libreyolo.export.onnx_model import OnnxModel
from libreyolo.export.twostage import OnnxOcrModel, OnnxPromptModel

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

RNG = np.random.default_rng(0)
#: relative tolerance of float maps (depth, alpha): float32 rounding of the same network
MAP_TOL = 1e-5
#: SAM masks: share of pixels that may differ (a logit within float rounding of the threshold)
MASK_PIXELS_TOL = 1e-4


def sensitive(family: str, size: str, imgsz: int, **kw):
    from libreyolo.engine.verify import input_sensitive
    return input_sensitive(LibreYOLO.new(family, size, device="cpu", imgsz=imgsz, **kw))


def square_images() -> list[np.ndarray]:
    """Square images (a static graph of an aspect-keeping resize serves square inputs): noise,
    a gradient with shapes, and a flat grey one."""
    noise = RNG.integers(0, 256, (90, 90, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:130, 0:130]
    shapes = np.stack([(xx * 1.7) % 256, (yy * 2.0) % 256, ((xx + yy) * 0.9) % 256], -1).astype(np.uint8)
    shapes[20:70, 30:90] = (230, 30, 30)
    return [noise, shapes, np.full((64, 64, 3), 128, np.uint8)]


# ------------------------------------------------------------------------------------- depth
@pytest.fixture(scope="module")
def zipdepth(tmp_path_factory):
    m = sensitive("zipdepth", "b", 64)
    path = m.export(file=tmp_path_factory.mktemp("depth") / "zipdepth.onnx")
    return m, LibreYOLO(path)


def test_depth_maps_match_eager(zipdepth):
    m, o = zipdepth
    assert type(o) is OnnxModel and o.task == "depth"
    for img in square_images():
        e, r = m.predict(img).depth.data.numpy(), o.predict(img).depth.data.numpy()
        assert e.shape == r.shape == img.shape[:2]
        assert np.abs(e - r).max() <= MAP_TOL * max(1.0, np.abs(e).max())


def test_static_depth_graph_refuses_other_aspect_ratios(zipdepth):
    """Depth's "cover" resize keeps the aspect ratio: a static graph serves one input shape."""
    _, o = zipdepth
    with pytest.raises(ValueError, match="exported static at 64x64.*dynamic=True"):
        o.predict(RNG.integers(0, 256, (60, 90, 3), dtype=np.uint8))


def test_depth_family_that_bakes_its_size_refuses_dynamic(zipdepth, tmp_path):
    """ZipDepth's adaptive pooling needs a constant output size: dynamic=True is refused, no file."""
    m, _ = zipdepth
    with pytest.raises(OnnxExportError, match="zipdepth-b"):
        m.export(file=tmp_path / "d.onnx", dynamic=True)
    assert not (tmp_path / "d.onnx").exists()


@pytest.mark.slow
def test_depth_anything_static_matches_eager(tmp_path):
    """Depth Anything's position-embedding resize (bicubic, sizes from the input's shape) exports
    static as a constant of the traced size; dynamic=True is refused."""
    m = sensitive("depth_anything", "s", 56)
    o = LibreYOLO(m.export(file=tmp_path / "da.onnx"))
    for img in square_images():
        e, r = m.predict(img).depth.data.numpy(), o.predict(img).depth.data.numpy()
        assert np.abs(e - r).max() <= MAP_TOL * max(1.0, np.abs(e).max())
    with pytest.raises(OnnxExportError, match="dynamic=True does not hold"):
        m.export(file=tmp_path / "dad.onnx", dynamic=True)


# ------------------------------------------------------------------------------------- matte
def toy_birefnet():
    """BiRefNet's network (Swin encoder, the decoder's deformable convolutions) with a one-block,
    24-wide Swin: the matte export's path in seconds (size t: 18 s of export, 173 MB)."""
    from libreyolo.models.birefnet.model import BiRefNet
    from libreyolo.models.birefnet.nn import SwinConfig

    class ToyBiRefNet(BiRefNet):
        FAMILY = "toybirefnet"
        CONFIGS = {"x": SwinConfig(24, (1, 1, 1, 1), (1, 1, 1, 1), 4)}
        SIZES = ("x",)
    from libreyolo.engine.verify import input_sensitive
    return input_sensitive(ToyBiRefNet.new("x", nc=1, device="cpu", imgsz=128))


def test_matte_alpha_matches_eager(tmp_path):
    """The deformable convolutions export as ONNX DeformConv (opset 19, chosen for the network)."""
    m = toy_birefnet()
    path = m.export(file=tmp_path / "matte.onnx")
    meta = read_metadata(path)
    assert meta["opset"] == "19" and meta["task"] == "matte"
    assert any(n.op_type == "DeformConv" for n in onnx.load(str(path)).graph.node)
    o = LibreYOLO(path)
    for img in [RNG.integers(0, 256, (90, 120, 3), dtype=np.uint8), *square_images()[1:2]]:
        e, r = m.predict(img).alpha.data.numpy(), o.predict(img).alpha.data.numpy()
        assert e.shape == r.shape == img.shape[:2]
        assert np.abs(e - r).max() <= MAP_TOL


def test_deform_conv_below_opset_19_is_refused(tmp_path):
    m = toy_birefnet()
    with pytest.raises(OnnxExportError, match="opset 17"):
        m.export(file=tmp_path / "m.onnx", opset=17)


# --------------------------------------------------------------------------------------- OCR
def gap_threshold(values: np.ndarray, near: float, gap: float = 1e-4) -> float:
    """A threshold near ``near`` half-way across a gap of at least ``gap`` between two of
    ``values``: a runtime's float differences cannot move a pixel across it."""
    v = np.unique(values.astype(np.float64).ravel())
    gaps = np.flatnonzero(np.diff(v) >= gap)
    mids = (v[gaps] + v[gaps + 1]) / 2
    return float(mids[np.argmin(np.abs(mids - near))])


@pytest.fixture(scope="module")
def ppocr(tmp_path_factory):
    m = sensitive("ppocr", "t", 160)
    path = m.export(file=tmp_path_factory.mktemp("ocr") / "ocr.onnx", dynamic=True)
    return m, LibreYOLO(path), path


def test_ocr_exports_two_graphs(ppocr):
    m, o, path = ppocr
    assert isinstance(o, OnnxOcrModel) and o.task == "ocr"
    assert json.loads(read_metadata(path)["parts"]) == {"rec": "ocr.rec.onnx"}
    assert o.rec_path == path.with_name("ocr.rec.onnx") and o.charset == list(m.charset)


def test_ocr_lines_match_eager(ppocr):
    from libreyolo.tasks.ocr.synthetic import text_page
    m, o, _ = ppocr
    page = text_page(4, width=224)
    x = m.preprocess.resize_images(torch.from_numpy(page)[None], 160)
    with torch.no_grad():
        prob = m.infer(x).numpy()
    opts = {"det_thresh": gap_threshold(prob, float(np.median(prob))), "box_thresh": 0.0, "max_lines": 20}
    for img in (page, square_images()[1]):
        e, r = m.predict(img, **opts).texts, o.predict(img, **opts).texts
        assert len(e) > 0 and e.texts == r.texts
        assert torch.equal(torch.as_tensor(e.polygons), torch.as_tensor(r.polygons))
        assert np.abs(np.asarray(e.conf) - np.asarray(r.conf)).max() <= 1e-5


def test_ocr_without_its_recognizer_is_refused(ppocr, tmp_path):
    _, _, path = ppocr
    lone = tmp_path / "ocr.onnx"
    lone.write_bytes(path.read_bytes())
    with pytest.raises(FileNotFoundError, match="ocr.rec.onnx"):
        LibreYOLO(lone)


# ----------------------------------------------------------------------- promptable segmentation
@pytest.fixture(scope="module")
def mobilesam(tmp_path_factory):
    m = sensitive("mobilesam", "tiny", 256)
    path = m.export(file=tmp_path_factory.mktemp("sam") / "sam.onnx")
    return m, LibreYOLO(path)


PROMPTS = [{"points": [[50, 60]]}, {"boxes": [[10, 10, 100, 80]]},
           {"points": [[50, 60], [20, 30]], "labels": [1, 0], "boxes": [[10, 10, 100, 80]], "multimask": False}]


def test_prompt_masks_match_eager(mobilesam):
    m, o = mobilesam
    assert isinstance(o, OnnxPromptModel) and read_metadata(o.path)["dynamic"] == "true"
    for img in (RNG.integers(0, 256, (120, 160, 3), dtype=np.uint8), RNG.integers(0, 256, (200, 120, 3), dtype=np.uint8)):
        for kw in PROMPTS:
            e, r = m(img, **kw).masks, o(img, **kw).masks
            assert e.data.shape == r.data.shape
            # a pixel whose logit is within float rounding of 0 may land on either side
            assert (e.data != r.data).float().mean() <= MASK_PIXELS_TOL
            assert np.abs(e.scores.numpy() - r.scores.numpy()).max() <= 1e-5


def test_prompt_decoder_logits_match_eager(mobilesam):
    """The decoder graph's low-resolution logits against ``MobileSAM.decode`` on one embedding:
    points with SAM's padding point, a box alone (no point tokens), points and boxes, batch 2."""
    m, o = mobilesam
    g = torch.Generator().manual_seed(3)
    emb = torch.randn((2, 256, 16, 16), generator=g)
    pts, lab = 256 * torch.rand((2, 2, 2), generator=g), torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    boxes = torch.tensor([[[10.0, 20.0, 200.0, 150.0]], [[0.0, 0.0, 90.0, 250.0]]])
    for args in ((pts, lab, None), (None, None, boxes), (pts, lab, boxes)):
        for multimask in (True, False):
            with torch.no_grad():
                le, ie = m.decode(emb, *args, multimask, 256)
            lo, io = o.decode(emb, *args, multimask, 256)
            assert le.shape == lo.shape and (le - lo).abs().max() <= 1e-4
            assert (ie - io).abs().max() <= 1e-5


def test_prompt_on_the_set_image_and_fixed_frame(mobilesam):
    m, o = mobilesam
    img = RNG.integers(0, 256, (100, 140, 3), dtype=np.uint8)
    m.set_image(img)
    o.set_image(img)
    assert torch.equal(m(points=[[70, 50]]).masks.data, o(points=[[70, 50]]).masks.data)
    with pytest.raises(ValueError, match="256 frame"):
        o(img, points=[[1, 1]], imgsz=320)
    with pytest.raises(NotImplementedError, match="cuda_graph"):
        o(img, points=[[1, 1]], cuda_graph=True)
