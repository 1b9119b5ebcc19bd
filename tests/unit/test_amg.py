"""Automatic mask generation (``model(image)`` with no prompt, ``prompts="grid"``) on the CPU:
SAM's definitions (point grid, stability score, mask boxes), the grid stage against the prompt
stage, the whole generator on a stand-in decoder whose masks are known, results, bad input, CLI.

MobileSAM at a 128 frame: the image encoder costs well under a second."""
import json

import numpy as np
import pytest
import torch
from PIL import Image
from standin import StandInCapturer

from libreyolo import LibreYOLO
from libreyolo.tasks.segment_prompt.amg import (
    AutoMasks,
    grid_stage,
    mask_boxes,
    point_grid,
    stability_score,
)
from libreyolo.tasks.segment_prompt.prompts import pack, parse_prompt

SIZE = 128
RECTS = [(10, 10, 60, 50), (90, 30, 150, 80)]     # the stand-in decoder's two objects (image pixels)


@pytest.fixture(scope="module")
def model():
    from libreyolo.engine.verify import input_sensitive
    return input_sensitive(LibreYOLO.new("mobilesam", "tiny", device="cpu", imgsz=SIZE, seed=0), seed=1)


@pytest.fixture(scope="module")
def image():
    g = np.random.default_rng(0)
    img = np.zeros((90, 160, 3), np.uint8)
    img[20:70, 30:100] = (220, 40, 40)
    return np.clip(img + g.integers(0, 30, img.shape), 0, 255).astype(np.uint8)


# ------------------------------------------------------------------------- SAM's definitions
def test_grid_stability_and_boxes_are_sams_definitions():
    """The point grid, the stability score and the mask boxes equal SAM's (transformers'
    automatic-mask-generation helpers, which follow segment_anything's amg utilities)."""
    sam = pytest.importorskip("transformers.models.sam.image_processing_sam")
    for n in (1, 4, 32):
        np.testing.assert_allclose(point_grid(n), sam._build_point_grid(n).numpy(), rtol=0, atol=1e-7)
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn((5, 3, 23, 31), generator=g)
    logits[1, 2] = -5.0                                   # an empty mask (0 / 0 -> nan, as SAM's)
    ours = stability_score(logits, 0.0, 1.0)
    ref = sam._compute_stability_score(logits, 0.0, 1.0)
    assert torch.equal(ours.isnan(), ref.isnan()) and torch.equal(ours.nan_to_num(), ref.nan_to_num())
    masks = logits > 0
    masks[0, 0] = False
    masks[0, 0, 4:9, 7:8] = True
    assert torch.equal(mask_boxes(masks), sam._batched_mask_to_box(masks).float())
    assert mask_boxes(masks)[0, 0].tolist() == [7, 4, 7, 8] and mask_boxes(masks)[1, 2].tolist() == [0, 0, 0, 0]


# ------------------------------------------------------------------- against the prompt stage
def test_grid_stage_gives_each_point_the_prompt_calls_masks_and_prompt_calls_are_unchanged(model, image):
    """MobileSAM's prompt stage is untouched by the grid path: a point's row of the grid stage
    is the masks and scores a prompt call gives for that point, and prompt calls before and
    after an automatic-mask call are equal bit for bit."""
    before = model(image, points=[[80, 45]], labels=[1])
    auto = model(image, points_per_side=4, pred_iou_thresh=0, stability_score_thresh=0)
    assert isinstance(auto.masks, AutoMasks)
    after = model(image, points=[[80, 45]], labels=[1])
    assert torch.equal(before.masks.data, after.masks.data) and torch.equal(before.masks.scores, after.masks.scores)
    st = model.get_predictor().current
    pts = [[80.0, 45.0], [10.0, 70.0], [150.0, 5.0]]
    rows = np.concatenate([pack(parse_prompt([p]).for_image(*st.hw), *st.hw, *st.resized) for p in pts])
    with torch.no_grad():
        masks, iou, stab, boxes = grid_stage(model, st.size, st.resized, st.hw)(st.embedding, torch.from_numpy(rows))
    assert masks.shape == (3, 3, 90, 160) and iou.shape == stab.shape == (3, 3) and boxes.shape == (3, 3, 4)
    for i, p in enumerate(pts):
        one = model(points=[p]).masks
        assert (one.data != masks[i]).float().mean() < 1e-3        # a batch of 3 vs 1: the same masks
        torch.testing.assert_close(one.scores, iou[i], rtol=0, atol=1e-5)


# -------------------------------------------------------------------- the whole generator
def stand_in_decoder(size, scale):
    """A decoder whose masks are known: a point inside object k gives object k's rectangle as
    tokens 1-2 (predicted IoU 0.95, 0.90) and the whole frame as token 3 (0.50); elsewhere empty
    masks. Rectangles in frame pixels (``scale``: image -> frame)."""
    s = size // 4
    c = (torch.arange(s, dtype=torch.float32) + 0.5) * 4          # low-res cell centres in the frame
    cy, cx = c[:, None], c[None, :]

    def decode(emb, pts, lab, boxes, multimask, frame):
        n = pts.shape[0]
        low = torch.full((n, 3, s, s), -20.0)
        low[:, 2] = 20.0
        for x1, y1, x2, y2 in RECTS:
            x1, y1, x2, y2 = x1 * scale, y1 * scale, x2 * scale, y2 * scale
            hit = (pts[:, 0, 0] >= x1) & (pts[:, 0, 0] < x2) & (pts[:, 0, 1] >= y1) & (pts[:, 0, 1] < y2)
            region = torch.where((cx >= x1) & (cx < x2) & (cy >= y1) & (cy < y2), 20.0, -20.0)
            for t in (0, 1):
                low[:, t] = torch.where(hit[:, None, None], region, low[:, t])
        return low, torch.tensor([0.95, 0.90, 0.50]).expand(n, 3)
    return decode


def test_generator_keeps_one_mask_per_object(image):
    """A 16 x 16 grid over two known objects: the whole-frame masks fail pred_iou_thresh, the
    empty ones (background points) the stability score, and NMS leaves one mask per object,
    best first, with its area, box, scores and grid point."""
    m = LibreYOLO.new("mobilesam", "tiny", device="cpu", imgsz=SIZE, seed=0)
    m.set_image(image)
    st = m.get_predictor().current
    m.decode = stand_in_decoder(SIZE, st.resized[1] / 160)
    r = m(points_per_side=16, points_per_batch=48)      # 256 points: 5 full batches + 1 filled up
    a = r.masks
    assert len(a) == 2 and a.data.dtype == torch.bool and a.data.shape == (2, 90, 160)
    assert a.scores.tolist() == pytest.approx([0.95, 0.95]) and (a.stability > 0.95).all()
    got = sorted(tuple(int(v) for v in b) for b in a.xyxy)
    assert got == sorted(RECTS)
    for k in range(2):
        x1, y1, x2, y2 = (int(v) for v in a.xyxy[k])
        assert int(a.areas[k]) == int(a.data[k].sum()) > 0.98 * (x2 - x1) * (y2 - y1)   # bilinear corners
        assert int(a.data[k, y1:y2, x1:x2].sum()) == int(a.areas[k])                 # all inside its box
        px, py = a.points[k]
        assert x1 <= px < x2 and y1 <= py < y2                      # the grid point inside its mask
    rows = json.loads(r.to_json())
    assert [d["name"] for d in rows] == ["mask0", "mask1"] and rows[0]["pixels"] == int(a.areas[0])
    assert {"confidence", "stability", "area", "box", "point"} <= set(rows[0])
    pic = r.plot()
    assert pic.shape == image.shape and tuple(pic[30, 30]) != tuple(image[30, 30])
    n = a.numpy()
    assert isinstance(n.data, np.ndarray) and isinstance(n.stability, np.ndarray) and n.xyxy.shape == (2, 4)
    # with no stability threshold the empty masks still never pass: their score is 0 / 0
    loose = m(prompts="grid", points_per_side=16, stability_score_thresh=0.0).masks
    assert len(loose) == 2, "empty masks have a NaN stability score and never pass"
    none = m(prompts="grid", points_per_side=2, pred_iou_thresh=1.0)      # nothing passes: an empty result
    assert none.masks.data.shape == (0, 90, 160) and json.loads(none.to_json()) == []
    assert none.plot().shape == image.shape and none.masks.numpy().xyxy.shape == (0, 4)


def test_grid_stage_runs_eager_until_proven_on_a_gpu(image):
    """cuda_graph=True on MobileSAM (graph flags on): the image stage is captured, the grid
    stage is not (GRID_GRAPH_PROVEN is False until the GPU command in docs/families.md passes)."""
    m = LibreYOLO.new("mobilesam", "tiny", device="cpu", imgsz=SIZE, seed=0)
    m.SUPPORTS_CUDA_GRAPH = True
    m._attach(m.model)
    cap = m.runner.capturer = StandInCapturer()
    eager = m(image, points_per_side=2, pred_iou_thresh=0, stability_score_thresh=0)
    got = m(image, points_per_side=2, pred_iou_thresh=0, stability_score_thresh=0, cuda_graph=True)
    assert [s[0] for s in cap.captures] == [(1, 90, 160, 3)]
    assert torch.equal(eager.masks.data, got.masks.data) and torch.equal(eager.masks.scores, got.masks.scores)


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,match", [
    ({"prompts": "grid", "points": [[1, 1]]}, "prompts='grid' makes its own point grid"),
    ({"prompts": "everything"}, "prompts must be 'grid'"),
    ({"points_per_side": 0}, "points_per_side"),
    ({"pred_iou_thresh": 1.5}, "pred_iou_thresh"),
])
def test_bad_grid_options_are_refused_by_name(model, image, kw, match):
    with pytest.raises(ValueError, match=match):
        model(image, **kw)


def test_cli_predict_grid(tmp_path, image):
    from libreyolo.cli import main
    src = tmp_path / "img.png"
    Image.fromarray(image).save(src)
    out = tmp_path / "pred"
    assert main(["predict", "model=mobilesamtiny", f"source={src}", "imgsz=128", "device=cpu", "prompts=grid",
                 "points_per_side=2", "pred_iou_thresh=0", "stability_score_thresh=0", f"save_dir={out}",
                 f"json={tmp_path / 'r.json'}"]) == 0
    assert (out / "img.jpg").exists()
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    assert rows and all("stability" in d for d in rows)


# ------------------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("family,size", [("mobilesam", "tiny"), ("sam", "base")])
def test_grid_stage_graph_equals_eager_on_cuda(family, size):
    """What GRID_GRAPH_PROVEN waits for: the grid stage (64 points, fp32 and bf16 autocast) through
    the parity protocol at 1024 on a 720x1280 image - probes differ, replays equal eager, the
    replay is not stale - and a whole automatic-mask call with the stage captured equals eager."""
    if family == "sam":
        pytest.importorskip("transformers")
    from libreyolo.engine.verify import input_sensitive
    from libreyolo.graphs.parity import check_parity
    m = input_sensitive(LibreYOLO.new(family, size, device="cuda", seed=0), seed=1)
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (720, 1280, 3), generator=g, dtype=torch.uint8).numpy()
    m.set_image(img, imgsz=1024)
    st = m.get_predictor().current
    fn = grid_stage(m, st.size, st.resized, st.hw)
    rows = lambda lo, hi: torch.cat([lo + (hi - lo) * torch.rand((64, 2), generator=g),  # noqa: E731
                                     torch.ones(64, 1)], 1).cuda()
    a, b = rows(0, 500), rows(200, 560)
    for amp in (None, torch.bfloat16):
        ctx = torch.autocast("cuda", dtype=amp) if amp else torch.autocast("cuda", enabled=False)
        with torch.no_grad(), ctx:
            r = check_parity(f"{family} grid stage {amp}", fn, (st.embedding, a), (st.embedding, b), module=m.model)
        assert r.passed, r.as_dict()
    import libreyolo.tasks.segment_prompt.amg as amg
    eager = m(points_per_side=16)
    amg.GRID_GRAPH_PROVEN = True
    try:
        m.SUPPORTS_CUDA_GRAPH = True
        m.runner.supported = True
        got = [m(points_per_side=16, cuda_graph=True) for _ in range(2)]
    finally:
        amg.GRID_GRAPH_PROVEN = False
    for r in got:
        assert torch.equal(r.masks.data, eager.masks.data) and torch.equal(r.masks.scores, eager.masks.scores)
