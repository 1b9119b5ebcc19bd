"""OCR task and the PP-OCR family on the CPU: alphabet, DB post-process, CTC decoding, the
recognition stage's padding, predict end to end, empty results and bad options.

The models are untrained (their text is noise); what is tested is the pipeline's contract.
Recognition widths are shrunk to (64, 128) on the test model so that a CPU forward is cheap.
"""
import json

import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.models.ppocr.charset import bundled_charset, load_charset
from libreyolo.tasks.ocr.postprocess import (
    REC_BUCKETS,
    bucket_of,
    crop_line,
    db_boxes,
    padded_width,
    reading_order,
    rec_batches,
    rec_width,
)
from libreyolo.tasks.ocr.results import TextLines
from libreyolo.tasks.ocr.synthetic import text_page
from libreyolo.tasks.ocr.task import ctc_greedy

SIZE = 128


@pytest.fixture(scope="module")
def model():
    # random weights give denormals, which are slow on some CPUs; the switch is process-wide
    # (flush-to-zero), so it is turned off again for the tests that come after this module
    torch.set_flush_denormal(True)
    m = LibreYOLO.new("ppocr", "t", device="cpu", seed=0)
    m.REC_BUCKETS = (64, 128)
    try:
        yield m
    finally:
        torch.set_flush_denormal(False)


@pytest.fixture(scope="module")
def page():
    return text_page(3, width=SIZE)


# ----------------------------------------------------------------------------------- alphabet
def test_bundled_charset_is_blank_dictionary_space_and_fits_the_fixture_head():
    fx = json.loads((__import__("conftest").FIXTURES_DIR / "ppocr-t-rec.json").read_text())
    cs = bundled_charset()
    assert len(cs) == fx["outputs"]["output"]["shape"][-1] == 18385
    assert cs[0] == "" and cs[-1] == " " and cs[1] == "\u3000" and cs[2] == "一"
    assert len(set(cs[1:-1])) == 18383          # one character per line, none lost to splitting


def test_checkpoint_charset_must_match_the_head():
    assert load_charset(["<blank>", "a", "b"], 3)[1:] == ("a", "b")
    with pytest.raises(ValueError, match="3 CTC classes but x.pt's 'charset' metadata has 2 entries"):
        load_charset(["<blank>", "a"], 3, "x.pt")
    with pytest.raises(ValueError, match="must be a list of strings"):
        load_charset("abc", 3)


def test_size_l_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="size 'l'.*only size t's LibreYOLO checkpoint layout"):
        LibreYOLO.new("ppocr", "l", device="cpu")
    from libreyolo.models.ppocr.model import PPOCR
    with pytest.raises(ValueError, match="size 'l'"):
        PPOCR.from_checkpoint({"model": {}, "size": "l"}, device="cpu")


# -------------------------------------------------------------------------------- CTC decoding
def test_ctc_greedy_drops_blanks_repeats_and_steps_past_the_width():
    # steps: a a _ a b b | c (past the width: 6 steps = 48 columns)
    seq = [1, 1, 0, 1, 2, 2, 3]
    probs = torch.full((2, 7, 4), 0.1)
    for t, c in enumerate(seq):
        probs[0, t, c] = 0.5 + 0.05 * t
    probs[1] = probs[0]
    ids, keep, score = ctc_greedy(probs, torch.tensor([41, 0]))
    assert ids[0].tolist() == seq[:6] + [0] and ids.dtype == torch.int32
    assert ids[0][keep[0]].tolist() == [1, 1, 2]               # "a a b": the blank separates the two a's
    assert score[0].item() == pytest.approx((0.5 + 0.65 + 0.70) / 3)   # steps 0, 3, 4
    assert not keep[1].any() and score[1].item() == 0.0        # an empty row (width 0)


# ------------------------------------------------------------------------------------ fuse()
def _randomized_net(seed=0):
    """A PP-OCR network whose BatchNorm statistics, affines and biases are all non-trivial, so that
    every fold of fuse() changes numbers."""
    from libreyolo.models.ppocr.nn import Affine, PPOCRNet
    torch.manual_seed(seed)
    net = PPOCRNet("t", num_classes=97).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.normal_(1, 0.2)
                m.bias.normal_(0, 0.2)
            elif isinstance(m, Affine):
                m.scale.uniform_(0.6, 1.4)
                m.bias.normal_(0, 0.2)
            elif isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) and m.bias is not None:
                m.bias.normal_(0, 0.1)
    return net


@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_network_equals_the_unfused_one_within_fp32_rounding(channels_last):
    import copy

    from libreyolo.models.ppocr.nn import ConvAct
    net = _randomized_net()
    fused = copy.deepcopy(net).fuse()
    assert fused.fuse() is fused   # idempotent
    assert not any(isinstance(m, (torch.nn.BatchNorm2d, torch.nn.ConvTranspose2d)) for m in fused.modules())
    assert sum(isinstance(m, ConvAct) for m in fused.modules()) > 50
    g = torch.Generator().manual_seed(1)
    x, lines = torch.randn(2, 3, 64, 96, generator=g), torch.randn(2, 3, 48, 64, generator=g)
    if channels_last:
        fused = fused.to(memory_format=torch.channels_last)
        x, lines = (t.contiguous(memory_format=torch.channels_last) for t in (x, lines))
    with torch.no_grad():
        a, b = net.det(x), fused.det(x)
        ra, rb = net.rec(lines), fused.rec(lines)
    assert a.shape == b.shape == (2, 1, 64, 96) and ra.shape == rb.shape
    assert (a - b).abs().max().item() < 1e-5 and 0.01 < a.std().item()   # a map that varies
    # float32 rounding of differently ordered sums, through the SVTR blocks and a softmax
    assert (ra - rb).abs().max().item() < 1e-4 and torch.equal(ra.argmax(-1), rb.argmax(-1))


def test_the_fused_network_also_runs_with_autograd_on():
    """Outside no_grad (a caller's own ``model.infer``) the fused network runs out of place and
    gives what it gives without autograd."""
    import copy
    fused = copy.deepcopy(_randomized_net()).fuse()
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(5))
    lines = torch.randn(2, 3, 48, 64, generator=torch.Generator().manual_seed(6))
    a, ra = fused.det(x), fused.rec(lines)   # autograd on: no in-place / out= on recorded tensors
    with torch.no_grad():
        b, rb = fused.det(x), fused.rec(lines)
    # float32 rounding of differently ordered sums in the recognizer, as in the test above
    assert a.requires_grad and (a - b).abs().max().item() < 1e-5
    assert (ra - rb).abs().max().item() < 1e-4 and torch.equal(ra.argmax(-1), rb.argmax(-1))


@pytest.mark.parametrize("channels_last", [False, True])
def test_fpn_without_autograd_equals_its_reference_operators(channels_last):
    """The FPN's one-pass form (no materialized upsampling, RSE products written once) computes
    what RSE + interpolate + add + cat compute (the form autograd runs)."""
    from libreyolo.models.ppocr.nn import RSEFPN
    torch.manual_seed(3)
    fpn = RSEFPN([16, 24, 56, 480], 96).eval()
    feats = [torch.randn(2, c, 64 // s, 96 // s) for c, s in zip([16, 24, 56, 480], [4, 8, 16, 32])]
    if channels_last:
        feats = [f.contiguous(memory_format=torch.channels_last) for f in feats]
    ref = fpn(feats)   # autograd on: the reference operators
    with torch.no_grad():
        out = fpn(feats)
    assert ref.requires_grad and out.shape == ref.shape == (2, 96, 16, 24)
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert (out - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


@pytest.mark.parametrize("k,stride,groups,hw", [(3, 2, 8, (12, 20)), (5, 2, 8, (13, 21)), (5, 2, 8, (12, 20)),
                                               (3, 1, 1, (7, 9)), (5, 1, 8, (6, 5)), (3, 2, 1, (2, 3))])
def test_an_input_affine_folds_into_a_zero_padded_conv_with_its_border(k, stride, groups, hw):
    """conv(pad0(s x + t)) == conv_sW(pad0 x) + t sum(W) + PaddedInputAffine's border term."""
    import torch.nn.functional as F

    from libreyolo.models.ppocr.nn import PaddedInputAffine
    g = torch.Generator().manual_seed(k * 10 + stride)
    x = torch.randn(2, 8, *hw, generator=g, dtype=torch.float64)
    w = torch.randn(8, 8 // groups, k, k, generator=g, dtype=torch.float64)
    b = torch.randn(8, generator=g, dtype=torch.float64)
    s, t = torch.tensor([0.7], dtype=torch.float64), torch.tensor([-1.3], dtype=torch.float64)
    p = k // 2
    ref = F.conv2d(s * x + t, w, b, stride, p, 1, groups)
    out = F.conv2d(x, w * s, b + t * w.sum((1, 2, 3)), stride, p, 1, groups)
    assert (out - ref).abs().max().item() > 0.1   # the border term is needed
    PaddedInputAffine(t * w.sum(1), (stride, stride), (p, p))(out, hw)
    assert (out - ref).abs().max().item() < 1e-10


def test_conv_act_onednn_path_equals_the_plain_conv_then_activation():
    import copy

    from libreyolo.models.ppocr.nn import ConvAct, _onednn_ops
    g = torch.Generator().manual_seed(2)
    cases = [(torch.nn.Conv2d(8, 8, 5, 2, 2, groups=8), "hardswish"), (torch.nn.Conv2d(8, 16, 1), "swish"),
             (torch.nn.Conv2d(8, 4, 3, padding=1), "relu"), (torch.nn.ConvTranspose2d(8, 4, 2, 2), "sigmoid"),
             (torch.nn.Conv2d(8, 8, 3, padding=1), "none")]
    x = torch.randn(2, 8, 12, 20, generator=g)
    for conv, act in cases:
        m = ConvAct(conv.requires_grad_(False), act)
        m64 = ConvAct(copy.deepcopy(conv).double(), act)
        with torch.no_grad():
            fast = m(x)   # oneDNN's primitive with the activation as a post-op where this torch has it
            slow = m64(x.double()).float()   # float64: the plain conv, then the activation
        assert fast.shape == slow.shape and (fast - slow).abs().max().item() < 1e-5, act
    assert _onednn_ops() is None or len(_onednn_ops()) == 2
    with pytest.raises(ValueError, match="unknown activation"):
        ConvAct(torch.nn.Conv2d(1, 1, 1), "gelu6")


# ----------------------------------------------------------------------------- DB post-process
def _map_with_rects(rects, h=64, w=96):
    prob = np.full((h, w), 0.05, np.float32)
    for y0, y1, x0, x1 in rects:
        prob[y0:y1, x0:x1] = 0.9
    return prob


def test_db_boxes_find_unclip_and_map_back_each_region():
    prob = _map_with_rects([(10, 20, 10, 60), (40, 48, 20, 80)])
    boxes = db_boxes((prob > 0.3).astype(np.uint8), prob, (128, 192), 0.6, 1.5, 1000)
    assert boxes.quads.shape == (2, 4, 2) and np.all(boxes.scores > 0.85)
    order = reading_order(boxes.quads)
    first = boxes.quads[order[0]]
    # the 10x50 region grows by area * 1.5 / perimeter ~ 6.25 px on each side, then x2 to the original
    assert first[0, 0] < 20 and first[0, 1] < 20 and first[2, 0] > 118 and first[2, 1] > 38
    assert np.all(boxes.quads[..., 0] <= 192) and np.all(boxes.quads[..., 1] <= 128)
    assert len(db_boxes((prob > 0.3).astype(np.uint8), prob, (128, 192), 0.6, 1.5, 1).quads) == 1   # max_lines


def test_db_boxes_drop_low_scores_and_tiny_regions_and_empty_maps():
    prob = _map_with_rects([(10, 20, 10, 60), (40, 42, 20, 80)])   # the second is 2 px high
    assert len(db_boxes((prob > 0.3).astype(np.uint8), prob, (64, 96), 0.6, 1.5, 1000).quads) == 1
    assert len(db_boxes((prob > 0.3).astype(np.uint8), prob, (64, 96), 0.95, 1.5, 1000).quads) == 0
    empty = np.zeros((64, 96), np.uint8)
    out = db_boxes(empty, prob, (64, 96), 0.6, 1.5, 1000)
    assert out.quads.shape == (0, 4, 2) and out.scores.shape == (0,)


def _reference_db_boxes(bitmap, prob, orig_hw, box_thresh, unclip_ratio, max_lines, dilate=False, mode="fast"):
    """The DB post-process one contour at a time, each step as PaddleOCR writes it (the reference
    the batched implementation must equal)."""
    import cv2

    from libreyolo.tasks.ocr.postprocess import MIN_SIZE, box_score, contour_score, mini_box, unclip
    if dilate:
        bitmap = cv2.dilate(bitmap, np.ones((2, 2), np.uint8))
    mh, mw = bitmap.shape
    oh, ow = orig_hw
    contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    quads, scores = [], []
    for contour in contours:
        if len(quads) >= max_lines:
            break
        quad, short = mini_box(contour)
        if short < MIN_SIZE:
            continue
        score = box_score(prob, quad) if mode == "fast" else contour_score(prob, contour)
        if box_thresh > score:
            continue
        grown = unclip(quad, unclip_ratio)
        if grown is None:
            continue
        quad, short = mini_box(grown)
        if short < MIN_SIZE + 2:
            continue
        quad[:, 0] = np.clip(np.round(quad[:, 0] / mw * ow), 0, ow)
        quad[:, 1] = np.clip(np.round(quad[:, 1] / mh * oh), 0, oh)
        pts = quad.astype(np.int32).astype(np.float32)
        pts = pts[np.argsort(pts[:, 0], kind="stable")]
        left, right = pts[:2], pts[2:]
        tl, bl = left[np.argsort(left[:, 1], kind="stable")]
        tr, br = right[np.argsort(right[:, 1], kind="stable")]
        quad = np.stack([tl, tr, br, bl]).astype(np.float32)
        quad[:, 0] = np.minimum(np.maximum(quad[:, 0], 0), ow - 1).astype(np.int32)
        quad[:, 1] = np.minimum(np.maximum(quad[:, 1], 0), oh - 1).astype(np.int32)
        if int(np.linalg.norm(quad[0] - quad[1])) <= MIN_SIZE or int(np.linalg.norm(quad[0] - quad[3])) <= MIN_SIZE:
            continue
        quads.append(quad)
        scores.append(score)
    if not quads:
        return np.zeros((0, 4, 2), np.float32), np.zeros((0,), np.float32)
    return np.stack(quads).astype(np.float32), np.asarray(scores, np.float32)


def _known_map(seed, h=160, w=224):
    """A probability map with rotated bars, blobs, thin and tiny regions and regions cut by the
    border: every branch of the post-process is taken."""
    import cv2
    g = np.random.default_rng(seed)
    prob = (g.random((h, w)) * 0.2).astype(np.float32)
    for _ in range(14):
        cx, cy = g.uniform(-10, w + 10), g.uniform(-10, h + 10)
        size = (g.uniform(1, 70), g.uniform(1, 16))
        pts = cv2.boxPoints(((cx, cy), size, g.uniform(-30, 30))).astype(np.int32)
        cv2.fillPoly(prob, [pts], float(g.uniform(0.35, 1.0)))
    return prob


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dilate,mode,max_lines", [(False, "fast", 1000), (True, "fast", 1000), (False, "slow", 1000),
                                                   (False, "fast", 3), (True, "fast", 1)])
def test_db_boxes_equal_the_step_by_step_reference_on_known_maps(seed, dilate, mode, max_lines):
    prob = _known_map(seed)
    bitmap = (prob > 0.3).astype(np.uint8)
    for orig in ((160, 224), (331, 467)):
        ours = db_boxes(bitmap, prob, orig, 0.5, 1.6, max_lines, dilate=dilate, score_mode=mode)
        ref_q, ref_s = _reference_db_boxes(bitmap, prob, orig, 0.5, 1.6, max_lines, dilate, mode)
        assert len(ref_q) > 0 and ours.quads.dtype == np.float32 and ours.scores.dtype == np.float32
        assert np.array_equal(ours.quads, ref_q) and np.array_equal(ours.scores, ref_s)


def test_a_blank_map_skips_the_contour_search(monkeypatch):
    import cv2

    def no_search(*a, **k):
        raise AssertionError("findContours called on a map with nothing above the threshold")
    monkeypatch.setattr(cv2, "findContours", no_search)
    prob = np.full((608, 800), 0.01, np.float32)
    out = db_boxes((prob > 0.3).astype(np.uint8), prob, (600, 800), 0.6, 2.0, 1000)
    assert out.quads.shape == (0, 4, 2) and out.scores.shape == (0,)
    with pytest.raises(AssertionError, match="findContours"):   # the probe bites where there is text
        prob[10:30, 10:90] = 0.9
        db_boxes((prob > 0.3).astype(np.uint8), prob, (600, 800), 0.6, 2.0, 1000)


def test_host_seam_output_shape_depends_on_the_image():
    """Why the DB post-process is not in a graph: the number of polygons (the output's shape)
    depends on the map's content, which a fixed-shape captured stage cannot express."""
    a = _map_with_rects([(10, 20, 10, 60)])
    b = _map_with_rects([(10, 20, 10, 60), (30, 40, 10, 60), (50, 60, 10, 60)])
    shapes = {db_boxes((m > 0.3).astype(np.uint8), m, (64, 96), 0.6, 1.5, 1000).quads.shape for m in (a, b)}
    assert shapes == {(1, 4, 2), (3, 4, 2)}


def test_reading_order_is_top_to_bottom_then_left_to_right():
    q = lambda x, y: np.array([[x, y], [x + 10, y], [x + 10, y + 5], [x, y + 5]], np.float32)  # noqa: E731
    quads = np.stack([q(50, 30), q(60, 2), q(5, 4), q(5, 31)])
    assert reading_order(quads).tolist() == [2, 1, 3, 0]


def test_crop_line_warps_upright_and_turns_tall_crops():
    img = np.zeros((60, 80, 3), np.uint8)
    img[10:20, 5:65] = 200
    quad = np.array([[5, 10], [65, 10], [65, 20], [5, 20]], np.float32)
    crop = crop_line(img, quad)
    assert crop.shape == (10, 60, 3) and crop.mean() > 150
    tall = crop_line(img, np.array([[5, 0], [15, 0], [15, 50], [5, 50]], np.float32))
    assert tall.shape[:2] == (10, 50)   # turned 90 degrees


def test_rec_widths_and_batches_by_similar_width():
    assert rec_width((32, 100)) == 150 and bucket_of(150) == 320 and bucket_of(321) == 640
    assert rec_width((10, 10_000)) == REC_BUCKETS[-1]
    assert padded_width(1) == 32 and padded_width(64) == 64 and padded_width(65) == 96
    lines = [np.full((48, w, 3), i, np.uint8) for i, w in enumerate((40, 300, 60, 128, 45))]
    batches = rec_batches(lines, 2)
    # narrowest first; a batch keeps widths within 1.25x its first line's + 32 and at most 2 lines
    assert [(b[0], b[1].shape, b[2].tolist()) for b in batches] == [
        ([0, 4], (2, 48, 64, 3), [40, 45]), ([2], (1, 48, 64, 3), [60]), ([3], (1, 48, 128, 3), [128]),
        ([1], (1, 48, 320, 3), [300])]
    assert np.all(batches[0][1][1, :, 45:] == 0) and np.all(batches[0][1][1, :, :45] == 4)
    pow2 = rec_batches(lines[:2] + [np.zeros((48, 50, 3), np.uint8)] * 2, 8, rows="pow2")
    assert [b[1].shape[0] for b in pow2] == [4, 1] and pow2[0][2].tolist() == [40, 50, 50, 0]
    with pytest.raises(ValueError, match="rows must be"):
        rec_batches(lines, 2, rows="fixed")


# --------------------------------------------------------------------------- recognition stage
def test_padding_changes_the_probabilities_of_the_unpadded_part(model):
    """The recognizer sees the padding (SVTR's global attention over every column; convs at the
    line's end), so a line's probabilities depend on the width it is padded to: the bucket is
    part of what predict computes, and is chosen from the line alone."""
    g = torch.Generator().manual_seed(0)
    line = torch.randint(0, 256, (1, 48, 64, 3), generator=g, dtype=torch.uint8)
    wide = torch.zeros((1, 48, 128, 3), dtype=torch.uint8)
    wide[:, :, :64] = line
    w = torch.tensor([64])
    with torch.no_grad():
        narrow_p = model.infer_rec(line, w)
        wide_p = model.infer_rec(wide, w)[:, :8]
    assert narrow_p.shape == wide_p.shape == (1, 8, 18385)
    assert not torch.equal(narrow_p, wide_p)
    rel = ((narrow_p - wide_p).norm() / narrow_p.norm()).item()
    assert rel > 1e-6, rel


def test_a_line_does_not_depend_on_the_other_lines_of_its_batch(model):
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 256, (2, 48, 64, 3), generator=g, dtype=torch.uint8)
    b = a.clone()
    b[1] = torch.randint(0, 256, (48, 64, 3), generator=g, dtype=torch.uint8)
    w = torch.tensor([64, 50])
    plan = model.get_predictor().plan(SIZE)
    with torch.no_grad():
        ra, rb = plan.rec_stage(a, w), plan.rec_stage(b, w)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(ra, rb))
    assert not torch.equal(ra[2][1], rb[2][1])


# ------------------------------------------------------------------------------ predict
def test_predict_end_to_end_gives_text_lines_plot_and_json(model, page, tmp_path):
    r = model(page, imgsz=SIZE, max_lines=3, box_thresh=0.0, rec_batch=4)
    lines = r.texts
    assert isinstance(lines, TextLines) and 1 <= len(lines) <= 3
    assert lines.polygons.shape == (len(lines), 4, 2) and lines.data.shape == (len(lines), 10)
    h, w = page.shape[:2]
    assert torch.all(lines.polygons[..., 0] <= w) and torch.all(lines.polygons[..., 1] <= h)
    assert all(t and set(t) <= set(model.charset) for t in lines.texts)
    assert torch.all((lines.conf >= 0) & (lines.conf <= 1))
    rows = json.loads(r.to_json())
    assert [row["text"] for row in rows] == lines.texts and len(rows[0]["polygon"]) == 4
    assert r.plot().shape == page.shape
    assert (tmp_path / "o.png").exists() is False and r.save(tmp_path / "o.png")
    poly, text, conf = next(iter(lines))
    assert text == lines.texts[0] and isinstance(conf, float)
    assert len(lines[:1]) == 1 and lines.numpy().cpu().data.shape == (len(lines), 10)


def test_image_without_text_gives_an_empty_result(model):
    blank = np.full((40, 100, 3), 255, np.uint8)
    r = model(blank, imgsz=SIZE, det_thresh=1.0)   # nothing above threshold: no region at all
    assert len(r.texts) == 0 and r.texts.polygons.shape == (0, 4, 2)
    assert r.to_json() == "[]" and r.plot().shape == blank.shape and r.texts.text == ""


def test_a_high_recognition_threshold_keeps_no_line(model, page):
    r = model(page, imgsz=SIZE, max_lines=2, box_thresh=0.0, rec_batch=2, rec_conf=1.0)
    assert len(r.texts) == 0


@pytest.mark.parametrize("opt,value,words", [
    ("det_thresh", 1.5, "det_thresh"), ("box_thresh", -0.1, "box_thresh"), ("unclip_ratio", -1, "unclip_ratio"),
    ("max_lines", 0, "max_lines"), ("rec_batch", 0, "rec_batch"), ("rec_conf", 2, "rec_conf"),
])
def test_bad_options_are_named(model, page, opt, value, words):
    with pytest.raises(ValueError, match=words):
        model(page, imgsz=SIZE, **{opt: value})


def test_unknown_option_lists_the_ocr_options(model, page):
    with pytest.raises(TypeError, match="det_thresh"):
        model(page, imgsz=SIZE, conf=0.5)


def test_verify_covers_the_recognition_stage_at_every_bucket(model):
    plan = model.get_predictor().plan(SIZE)
    stages = plan.parity_stages(2, model.device)
    assert [s[0] for s in stages] == ["rec-stage w64", "rec-stage w128"]
    name, fn, a, b = stages[0]
    with torch.no_grad():
        ea, eb = fn(*a), fn(*b)
    assert ea[0].shape == (2, 8) and not all(torch.equal(x, y) for x, y in zip(ea, eb))


def test_bench_runs_ocr_on_its_printed_page(model):
    """`libreyolo bench` for OCR: det + rec of the 10-line page (untrained: box threshold 0,
    at most 10 lines), the lines counted in the JSON, the recognition stage alone as its own
    arm; eager arms only on the CPU."""
    from libreyolo.benchmark import bench_model
    res = bench_model(model, imgsz=SIZE, runs=1, warmup=0)
    assert res["task"] == "ocr" and res["task_input"]["lines_on_page"] == 10
    assert 0 < res["text_lines_per_image"] <= 10 and "max_lines=10" in res["task_input"]["options"]
    assert {"forward_eager", "predict_eager", "rec_stage_b8_w128_eager"} <= set(res["arms"])
