"""OCR with real trained weights: PP-OCRv4 mobile from the ``rapidocr_onnxruntime`` wheel (the
``test`` extra), converted to our layout by ``scripts/convert_rapidocr.py``, reading rendered
pages side by side with RapidOCR's own pipeline on the same pages.

Skipped where the wheel is not installed. The Chinese page needs the Noto Sans CJK wheel
(``rinoh-typeface-notosanscjk``, also in the ``test`` extra) and is skipped without it.
"""
import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("rapidocr_onnxruntime")
pytest.importorskip("onnx")

import ocr_pages as P  # tests/ is on the path (conftest)

from libreyolo import LibreYOLO
from libreyolo.tasks.ocr.postprocess import crop_line, db_boxes, resize_line

ROOT = Path(__file__).resolve().parents[2]


def _converter():
    spec = importlib.util.spec_from_file_location("convert_rapidocr", ROOT / "scripts" / "convert_rapidocr.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def conv():
    return _converter()


@pytest.fixture(scope="module")
def ckpt_path(conv, tmp_path_factory):
    from libreyolo.weights import save_checkpoint
    return save_checkpoint(conv.convert(), tmp_path_factory.mktemp("ppocr-v4") / "LibrePPOCRt-v4-ocr.pt")


@pytest.fixture(scope="module")
def model(ckpt_path):
    return LibreYOLO(str(ckpt_path), device="cpu")


@pytest.fixture(scope="module")
def rapid():
    from rapidocr_onnxruntime import RapidOCR
    return RapidOCR(intra_op_num_threads=2)


@pytest.fixture(scope="module")
def sessions(conv):
    import onnxruntime as ort
    det, rec = conv.wheel_models()
    return (ort.InferenceSession(str(det), providers=["CPUExecutionProvider"]),
            ort.InferenceSession(str(rec), providers=["CPUExecutionProvider"]))


def first(results):
    """The one Results of a single-image predict (a list of one, or the Results itself)."""
    return results[0] if isinstance(results, (list, tuple)) else results


def read(model, page, **opts):
    return first(model(page, bgr=False, **opts)).texts.texts


def rapid_read(rapid, page):
    res, _ = rapid(np.ascontiguousarray(page[..., ::-1]))
    return [r[1] for r in (res or [])]


def rapid_det_boxes(rapid, page):
    boxes, _ = rapid.text_det(np.ascontiguousarray(page[..., ::-1]))
    return 0 if boxes is None else len(boxes)


# ------------------------------------------------------------------------------ conversion
def test_converted_networks_equal_the_onnx_files(model, sessions):
    det, rec = sessions
    g = np.random.default_rng(0)
    x = g.standard_normal((1, 3, 96, 160)).astype(np.float32)
    xr = (g.random((2, 3, 48, 200)) * 2 - 1).astype(np.float32)
    with torch.no_grad():
        ours_det = model.model.det(torch.from_numpy(x)).numpy()
        ours_rec = model.model.rec(torch.from_numpy(xr)).numpy()
    ref_det, ref_rec = det.run(None, {"x": x})[0], rec.run(None, {"x": xr})[0]
    assert ours_det.shape == ref_det.shape and np.abs(ours_det - ref_det).max() < 1e-5
    # a rendered page too: random input leaves the sigmoid map near 0 everywhere, which would not
    # tell two neck levels of equal shape loaded in the wrong order from the right one
    page, _ = P.english_page()
    xp = torch.from_numpy(np.ascontiguousarray(page[..., ::-1])).permute(2, 0, 1)[None].float() / 127.5 - 1
    xp = torch.nn.functional.interpolate(xp, size=(224, 512), mode="bilinear").numpy()
    with torch.no_grad():
        ours_page = model.model.det(torch.from_numpy(xp)).numpy()
    ref_page = det.run(None, {"x": xp})[0]
    assert (ref_page > 0.3).mean() > 0.02   # text found: the comparison covers the text regions
    assert np.abs(ours_page - ref_page).max() < 1e-4
    assert ours_rec.shape == ref_rec.shape == (2, 25, 6625)
    assert np.abs(ours_rec - ref_rec).max() < 1e-4 and np.array_equal(ours_rec.argmax(-1), ref_rec.argmax(-1))


def test_a_v4_checkpoint_loads_with_its_own_charset(model, ckpt_path):
    assert model.version == "v4" and len(model.charset) == 6625
    assert model.charset[0] == "" and model.charset[-1] == " "
    assert model.model.rec.head.ctc_head.fc.out_features == 6625
    ck = torch.load(ckpt_path, weights_only=False)
    ck["charset"] = ck["charset"][:-1]
    from libreyolo.models.ppocr.model import PPOCR
    with pytest.raises(ValueError, match="6625 CTC classes but x.pt's 'charset' metadata has 6624 entries"):
        PPOCR.from_checkpoint(ck, device="cpu", source="x.pt")
    default = LibreYOLO.new("ppocr", "t", device="cpu")   # PP-OCRv5 mobile stays the default
    assert default.version == "v5" and len(default.charset) == 18385


# ---------------------------------------------------------------------------------- fuse
def test_fused_network_equals_the_loaded_one_within_fp32_rounding(model):
    page, _ = P.english_page()
    x = torch.from_numpy(page).permute(2, 0, 1)[None].float() / 255
    x = torch.nn.functional.interpolate(x, size=(448, 1088), mode="bilinear")
    fused = copy.deepcopy(model.model).fuse()
    assert not any(type(m).__name__ == "BatchNorm2d" for m in fused.rec.backbone.modules())
    lines = torch.rand(3, 3, 48, 320, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        a, b = model.model.det(x), fused.det(x)
        ra, rb = model.model.rec(lines), fused.rec(lines)
    # float32 rounding of a differently ordered sum, amplified where the sigmoid map is steep
    assert (a - b).abs().max().item() < 1e-3
    assert ((a > 0.3) != (b > 0.3)).float().mean().item() < 1e-5
    assert (ra - rb).abs().max().item() < 1e-4 and torch.equal(ra.argmax(-1), rb.argmax(-1))


def test_predict_runs_the_fused_copy_and_the_model_still_saves(model, tmp_path):
    page, truth = P.english_page()
    assert model.predict_fused
    fused = read(model, page)
    assert model._net() is not model.model and not model.fused   # the copy; the model keeps its layout
    assert model.save(tmp_path / "again.pt").is_file()
    model.predict_fused = False
    try:
        plain = read(model, page)
        assert model._net() is model.model
    finally:
        model.predict_fused = True
    assert fused == plain == truth


# ------------------------------------------------------------------------- DB post-process
@pytest.mark.parametrize("dilate,mode,ratio,box", [(True, "fast", 1.6, 0.5), (False, "fast", 1.5, 0.6),
                                                   (False, "slow", 2.0, 0.6)])
def test_boxes_equal_rapidocr_on_the_same_maps(rapid, dilate, mode, ratio, box):
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess
    det = rapid.text_det
    for page, _ in (P.english_page(), P.dense_page(), P.rotated_page(7.0)):
        bgr = np.ascontiguousarray(page[..., ::-1])
        pred = det.infer(det.get_preprocess(max(bgr.shape[:2]))(bgr))[0]
        ref_boxes, ref_scores = DBPostProcess(thresh=0.3, box_thresh=box, unclip_ratio=ratio, use_dilation=dilate,
                                              score_mode=mode)(pred, bgr.shape[:2])
        ref = det.filter_tag_det_res(ref_boxes, bgr.shape[:2])
        p = pred[0, 0]
        ours = db_boxes((p > 0.3).astype(np.uint8), p, bgr.shape[:2], box, ratio, 1000, dilate=dilate,
                        score_mode=mode)
        assert len(ref) > 0 and np.array_equal(ours.quads, ref.astype(np.float32))
        assert np.allclose(ours.scores, np.asarray(ref_scores, np.float32))


# ---------------------------------------------------------------------------- recognition
def test_a_line_reads_the_same_alone_and_in_a_batch(model):
    page, truth = P.dense_page()
    r = first(model(page, bgr=False))
    lines = [resize_line(crop_line(page, q), model.REC_BUCKETS) for q in r.texts.numpy().polygons]
    plan = model.get_predictor().plan(960)
    batched, _ = plan.recognize(lines)
    assert batched == r.texts.texts and len(lines) == len(truth)
    for i in (0, 7, 19, 29):
        alone, _ = plan.recognize([lines[i]])
        assert alone == [batched[i]]


def test_detection_runs_at_the_page_aspect(model):
    page, _ = P.english_page()   # 1100 x 610: the longer side shrunk to 960, each side a multiple of 32
    h, w = model.preprocess.input_hw(page.shape[0], page.shape[1], model.imgsz)
    assert (h % 32, w % 32) == (0, 0) and w == 960 and h < 600


# ------------------------------------------------------------------ reading, side by side
PAGES = {"english": P.english_page, "dense": P.dense_page, "rotated": P.rotated_page}


# the dense and rotated pages are the slow ones (two engines over many lines): marked slow, so
# the suite's fast subset reads one English and one Chinese page
@pytest.mark.parametrize("name", ["english", pytest.param("dense", marks=pytest.mark.slow),
                                  pytest.param("rotated", marks=pytest.mark.slow), "chinese"])
def test_reads_a_rendered_page_at_least_as_well_as_rapidocr(model, rapid, name):
    if name == "chinese":
        font = P.cjk_font_path()
        if font is None:
            pytest.skip("no CJK font (pip install rinoh-typeface-notosanscjk: the test extra)")
        page, truth = P.chinese_page(font)
    else:
        page, truth = PAGES[name]()
    ours, theirs = read(model, page), rapid_read(rapid, page)
    assert len(ours) == len(truth) == rapid_det_boxes(rapid, page)   # the same lines found
    assert P.cer(ours, truth) <= P.cer(theirs, truth), (ours, theirs)
    assert P.cer(ours, truth) < 0.03


def test_a_blank_page_reads_nothing(model, rapid):
    page = P.blank_page()
    assert read(model, page) == [] and rapid_read(rapid, page) == []
