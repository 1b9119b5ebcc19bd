"""Promptable segmentation (MobileSAM) on the CPU: prompts, the two stages, results, bad input,
the graph policy of both stages (stand-in capturer), verify's cases and the bench arms.

Models run at a small frame (imgsz 128/256) so the image encoder costs well under a second."""
import json

import numpy as np
import pytest
import torch
from PIL import Image
from standin import StandInCapturer

from libreyolo import LibreYOLO
from libreyolo.models.mobilesam.nn import MobileSAMNet
from libreyolo.ops.preprocess import long_side_size
from libreyolo.tasks.segment_prompt.predictor import postprocess_masks
from libreyolo.tasks.segment_prompt.prompts import pack, parse_cli, parse_prompt

SIZE = 128


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


@pytest.fixture(scope="module")
def fixture_net():
    """The fixture's network (its deterministic weights), for the padding test."""
    from conftest import FIXTURES_DIR
    from fill import fill_state_dict
    fx = json.loads((FIXTURES_DIR / "mobilesam-tiny.json").read_text())
    net = MobileSAMNet()
    net.load_state_dict(fill_state_dict(fx["layout"], constants={}, tied=fx["tied"]), strict=True)
    return net.eval()


# ---------------------------------------------------------------------------- capture seam
def test_padding_a_prompt_changes_the_masks_so_prompt_counts_are_not_bucketed(fixture_net):
    """SAM's "not a point" padding (label -1) is a real token every other token attends to: a
    prompt padded to a bucket gives different masks and scores - not only different bits - so
    the prompt stage is captured per exact prompt count instead (one graph per count)."""
    net = fixture_net
    x = 255 * torch.rand((1, 3, 96, 128), generator=torch.Generator().manual_seed(0))
    pts = torch.tensor([[[40.0, 60.0], [100.0, 30.0]]])
    lab = torch.tensor([[1.0, 0.0]])
    with torch.no_grad():
        emb = net.embed(x, 256)
        m0, s0 = net.decode(emb, pts, lab, None, True, 256)
        padded = torch.cat([pts, torch.zeros(1, 1, 2)], 1), torch.cat([lab, -torch.ones(1, 1)], 1)
        m1, s1 = net.decode(emb, *padded, None, True, 256)
        m0b, s0b = net.decode(emb, pts, lab, None, True, 256)
    assert torch.equal(m0, m0b) and torch.equal(s0, s0b), "eager must be deterministic for the comparison to mean anything"
    assert not torch.equal(m0, m1) and not torch.equal(s0, s1)
    assert (m0 - m1).abs().max() > 1e-3 and (s0 - s1).abs().max() > 1e-4   # other masks, not rounding


# ----------------------------------------------------------------------------------- prompts
def test_prompts_are_mapped_into_the_frame_as_sam_does():
    assert long_side_size(90, 160, 128) == (72, 128) and long_side_size(1080, 1920, 1024) == (576, 1024)
    p = parse_prompt([[80, 45], [0, 90]], [1, 0], [[10, 20, 160, 90]]).for_image(90, 160)
    row = pack(p, 90, 160, 72, 128)
    np.testing.assert_allclose(row[0], [64, 36, 0, 72, 1, 0, 8, 16, 128, 72], rtol=1e-6)
    c = parse_prompt("center").for_image(90, 160)
    assert c.points.tolist() == [[80.0, 45.0]] and c.labels.tolist() == [1]
    assert parse_prompt([3, 4]).points.shape == (1, 2)          # one point, labels default to foreground
    assert parse_cli("1,2;3,4", "1,0", None) == {"points": [[1, 2], [3, 4]], "labels": [1, 0]}
    assert parse_cli(None, None, None) == {"points": "center"}


@pytest.mark.parametrize("kw,match", [
    ({}, "no prompt"),
    ({"points": []}, "points is an empty list"),
    ({"boxes": []}, "boxes is an empty list"),
    ({"points": [[1, 2], [3, 4]], "labels": [1]}, "labels has 1 value.* points has 2"),
    ({"points": [[1, 2]], "labels": [2]}, "labels must be 0 .background. or 1"),
    ({"labels": [1]}, "labels were given without points"),
    ({"boxes": [[50, 10, 20, 40]]}, "x2 < x1 or y2 < y1"),
    ({"boxes": [[10, 40, 20, 10]]}, "x2 < x1 or y2 < y1"),
    ({"points": [[1, 2, 3]]}, r"points must be a list of \[x, y\] points"),
    ({"points": "middle"}, "points must be a list of .x, y. pairs or 'center'"),
])
def test_bad_prompts_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        parse_prompt(**kw)


@pytest.mark.parametrize("kw,match", [
    ({"points": [[161, 10]]}, r"prompt point 0 \(161, 10\) is outside the 160x90 image"),
    ({"points": [[5, 5], [10, -1]]}, r"prompt point 1 \(10, -1\) is outside"),
    ({"boxes": [[0, 0, 200, 50]]}, "prompt box 0 .* is outside the 160x90 image"),
])
def test_prompts_outside_the_image_are_refused(model, image, kw, match):
    with pytest.raises(ValueError, match=match):
        model(image, **kw)


def test_prompt_without_an_image_is_refused():
    m = LibreYOLO.new("mobilesam", "tiny", device="cpu", imgsz=SIZE)
    with pytest.raises(ValueError, match="no image: pass one .* or call model.set_image"):
        m(points=[[1, 1]])
    with pytest.raises(ValueError, match="set_image takes one image, got 2"):
        m.set_image([np.zeros((8, 8, 3), np.uint8)] * 2)


# ------------------------------------------------------------------------------------ stages
def test_predict_equals_the_network_run_by_hand(model, image):
    """Image stage + prompt stage == resize -> embed -> decode (points scaled into the frame) ->
    SAM's mask post-processing, bit for bit; masks at the original size, one score each."""
    pts, lab, box = [[80, 45], [20, 80]], [1, 0], [[30, 20, 100, 70]]
    r = model(image, points=pts, labels=lab, boxes=box, color_format="rgb")
    rh, rw = long_side_size(90, 160, SIZE)
    net = model.model
    with torch.no_grad():
        x = model.preprocess(torch.from_numpy(image)[None], SIZE)
        assert tuple(x.shape) == (1, 3, rh, rw)
        emb = net.embed(x * 255.0, SIZE)
        sx, sy = rw / 160, rh / 90
        p = torch.tensor([[[80 * sx, 45 * sy], [20 * sx, 80 * sy]]], dtype=torch.float32)
        b = torch.tensor([[[30 * sx, 20 * sy, 100 * sx, 70 * sy]]], dtype=torch.float32)
        low, iou = net.decode(emb, p, torch.tensor([[1.0, 0.0]]), b, True, SIZE)
        masks = postprocess_masks(low, SIZE, (rh, rw), (90, 160))
    assert r.masks.data.shape == (3, 90, 160) and r.masks.data.dtype == torch.bool
    assert torch.equal(r.masks.data, masks[0]) and torch.equal(r.masks.scores, iou[0])
    one = model(image, points=pts, labels=lab, boxes=box, multimask=False, color_format="rgb").masks
    assert one.data.shape == (1, 90, 160) and one.scores.shape == (1,)


def test_set_image_then_prompts_reuse_the_embedding(model, image):
    model.set_image(image)
    calls = model.runner.eager_calls
    a = model(points=[[80, 45]])
    b = model(points=[[80, 45]], labels=[0])
    c = model(boxes=[[30, 20, 100, 70]])
    assert model.runner.eager_calls - calls == 3, "a prompt call on a set image runs the prompt stage only"
    again = model(image, points=[[80, 45]])    # a one-shot call embeds the image again: same masks
    assert torch.equal(a.masks.data, again.masks.data) and torch.equal(a.masks.scores, again.masks.scores)
    assert not torch.equal(a.masks.scores, b.masks.scores) and not torch.equal(a.masks.scores, c.masks.scores)
    with pytest.raises(ValueError, match="embedded at imgsz=128, not 256"):
        model(points=[[1, 1]], imgsz=256)


def test_results_plot_save_and_json(model, image, tmp_path):
    r = model(image, points=[[80, 45], [150, 10]], labels=[1, 0], boxes=[[30, 20, 100, 70]])
    m = r.masks
    assert 0 <= m.best < 3 and len(m) == 3 and m.orig_shape == (90, 160)
    pic = r.plot()
    assert pic.shape == image.shape and pic.dtype == np.uint8
    assert tuple(pic[45, 80]) != tuple(image[45, 80])     # the foreground point is drawn
    assert tuple(pic[20, 65]) != tuple(image[20, 65])     # the box's top edge is drawn
    rows = json.loads(r.to_json())
    assert [d["name"] for d in rows] == ["mask0", "mask1", "mask2"]
    assert all(0 <= d["area"] <= 1 for d in rows)
    assert rows[0]["confidence"] == pytest.approx(float(m.scores[0]), abs=1e-5)
    n = m.numpy()
    assert isinstance(n.data, np.ndarray) and n.data.shape == (3, 90, 160)
    path = r.save(tmp_path / "out.png")
    assert Image.open(path).size == (160, 90)
    saved = model(image, points="center", save=True, save_dir=tmp_path / "pred").saved_to
    assert saved and Image.open(saved).size == (160, 90)


# ------------------------------------------------------------------------------ graph policy
def test_each_stage_is_captured_per_its_own_signature(image):
    """cuda_graph=True: one image-stage graph per input size, one prompt-stage graph per prompt
    count; replays equal eager."""
    m = LibreYOLO.new("mobilesam", "tiny", device="cpu", imgsz=SIZE, seed=0)
    m.SUPPORTS_CUDA_GRAPH = True
    m._attach(m.model)
    cap = m.runner.capturer = StandInCapturer()
    eager = [m(image, points=[[80, 45]]), m(points=[[80, 45], [10, 10]], labels=[1, 0])]
    m.set_image(image, cuda_graph=True)
    got = [m(points=[[80, 45]], cuda_graph=True), m(points=[[80, 45], [10, 10]], labels=[1, 0], cuda_graph=True)]
    again = m(points=[[80, 45]], cuda_graph=True)
    m.set_image(image[:, :100], cuda_graph=True)        # another size: another image-stage graph
    assert [s[0] for s in cap.captures] == [(1, 90, 160, 3), (1, 256, 8, 8), (1, 256, 8, 8), (1, 90, 100, 3)]
    assert [s[1] for s in cap.captures[1:3]] == [(1, 3), (1, 6)]      # packed prompts: 1 and 2 points
    for a, b in zip(eager + eager[:1], got + [again]):
        assert torch.equal(a.masks.data, b.masks.data) and torch.equal(a.masks.scores, b.masks.scores)
    info = m.graph_info()
    assert len(info["graphs"]) == 4 and info["replays"] == 5


# ---------------------------------------------------------------------------- verify / bench
def test_verify_cases_run_the_parity_protocol_on_the_cpu(model, monkeypatch):
    """verify's cases for this task (network, image stage, prompt stage) through the parity
    protocol, the capture stood in by a replay of the function: probes differ, replays equal."""
    import libreyolo.graphs.parity as parity
    monkeypatch.setattr(parity, "CudaGraphCapturer", StandInCapturer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cases = model.task_def.verify_cases(model, SIZE, 2, (48, 64))
    assert [c[0].split()[0] for c in cases] == ["network", "image-stage", "prompt-stage"]
    with torch.no_grad():
        results = [parity.check_parity(name, fn, a, b, module=model.model) for name, fn, a, b in cases]
    assert all(r.passed for r in results), [r.as_dict() for r in results]
    masks, scores = cases[2][1](*cases[2][2])
    assert masks.shape == (2, 3, 48, 64) and scores.shape == (2, 3)


def test_bench_measures_the_image_stage_and_the_prompt_call(model):
    from libreyolo.benchmark import bench_model
    img = np.zeros((60, 80, 3), np.uint8)
    res = bench_model(model, imgsz=SIZE, runs=1, warmup=0, image=img)
    assert {"forward_eager", "predict_eager", "set_image_eager", "prompt_eager"} <= set(res["arms"])
    assert res["task"] == "segment-prompt"
    assert model.info(imgsz=SIZE, verbose=False)["parameters"] == 10_130_092   # libreyolo info / flops


def test_cli_predict_with_a_prompt(tmp_path, image):
    from libreyolo.cli import main
    src = tmp_path / "img.png"
    Image.fromarray(image).save(src)
    out = tmp_path / "pred"
    assert main(["predict", "model=mobilesamtiny", f"source={src}", "imgsz=128", "device=cpu",
                 "points=80,45;10,10", "labels=1,0", f"save_dir={out}", f"json={tmp_path / 'r.json'}"]) == 0
    assert (out / "img.jpg").exists()
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    assert [d["name"] for d in rows] == ["mask0", "mask1", "mask2"]


@pytest.mark.parametrize("lq,lk,split", [(7, 4096, True), (7, 1024, True), (7, 1000, False), (4096, 7, False),
                                         (100, 4096, False)])
def test_attention_weighted_sum_in_runs_of_keys_is_the_product(lq, lk, split):
    """A few queries over many keys (tokens -> image) sum in runs of SPLIT_KEYS keys: the same
    product up to rounding (float64 exact to 1e-12, float32 to its precision); other shapes,
    or SPLIT_KEYS None, are the plain matmul, bit for bit."""
    from libreyolo.models.mobilesam.nn import Attention
    att = Attention(64, 4)
    g = torch.Generator().manual_seed(0)
    w = torch.rand(2, 4, lq, lk, generator=g).softmax(-1)
    v = torch.randn(2, 4, lk, 16, generator=g)
    ref = (w.double() @ v.double())
    out = att._weighted_sum(w, v)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, rtol=0, atol=1e-5)
    assert torch.allclose(att._weighted_sum(w.double(), v.double()), ref, rtol=0, atol=1e-12)
    if split:   # the path taken: the runs' products, added
        run = att.SPLIT_KEYS
        runs = w.unflatten(-1, (lk // run, run)).transpose(-3, -2) @ v.unflatten(-2, (lk // run, run))
        assert torch.equal(out, runs.sum(-3))
    else:
        assert torch.equal(out, w @ v)
    att.SPLIT_KEYS = None
    assert torch.equal(att._weighted_sum(w, v), w @ v)


def test_an_untrained_mobilesam_warns_once_as_the_other_families(caplog):
    """The UNTRAINED warning on the first use, also where that is set_image (then prompts)."""
    m = LibreYOLO.new("mobilesam", "tiny", device="cpu", imgsz=SIZE, seed=0)
    with caplog.at_level("WARNING", logger="libreyolo"):
        m.set_image(np.zeros((40, 60, 3), np.uint8))
        m(points=[[10, 10]])
        assert any("UNTRAINED" in r.getMessage() for r in caplog.records)   # said by set_image's path
        m(np.zeros((40, 60, 3), np.uint8), points=[[10, 10]])
    said = [r.getMessage() for r in caplog.records if "UNTRAINED" in r.getMessage()]
    assert said == ["mobilesam-tiny is UNTRAINED (random weights): its masks are meaningless"]
