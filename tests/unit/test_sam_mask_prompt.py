"""Mask prompts in predict (``mask_input``) for SAM, SAM 2 and EdgeTAM, on small configs on the CPU:
the prompt stage with a mask equals transformers' own models given the same ``input_masks`` bit for
bit, ``Results.masks.logits`` is what a next call takes (SAM's iterative refinement), a binary
mask of the image lands where the image is in the network's frame, files work as arrays, and
MobileSAM / PicoSAM3 refuse a mask prompt by name (MobileSAM's two-output prompt stage unchanged)."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the sam extra (pip install 'libreyolo-graphs[sam]')")

from test_sam import SMALL, small_net  # noqa: E402

from libreyolo.models.registry import get_family  # noqa: E402
from libreyolo.models.sam.model import SAM  # noqa: E402
from libreyolo.models.sam.nn import sam_config  # noqa: E402
from libreyolo.ops.preprocess import long_side_size  # noqa: E402
from libreyolo.tasks.segment_prompt.predictor import (  # noqa: E402
    MASK_BIAS,
    PromptPredictor,
    mask_prompt_logits,
    upscale_logits,
)

SIZE = 128          # the frame of the small networks; low-resolution logits are 32 x 32
S4 = SIZE // 4
H, W = 90, 160


@pytest.fixture(scope="module")
def image():
    g = np.random.default_rng(0)
    img = np.zeros((H, W, 3), np.uint8)
    img[20:70, 30:100] = (220, 40, 40)
    return np.clip(img + g.integers(0, 30, img.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def sam():
    from libreyolo.engine.verify import input_sensitive
    return input_sensitive(SAM(small_net(), size="base", imgsz=SIZE, device="cpu", trained=False), seed=1)


@pytest.fixture(scope="module", params=[("sam2", "tiny"), ("edgetam", "edge")], ids=["sam2", "edgetam"])
def sam2(request):
    fam, size = request.param
    return get_family(fam).new(size, device="cpu", imgsz=SIZE, seed=0, video=False)


def _reference_class(net):
    return next(c for c in type(net).__mro__ if c.__module__.startswith("transformers.models."))


def _frame_points(points, hw, resized):
    sx, sy = resized[1] / hw[1], resized[0] / hw[0]
    return torch.tensor([[[[x * sx, y * sy] for x, y in points]]], dtype=torch.float32)


def test_sam_mask_prompt_equals_transformers_sammodel(sam, image):
    """A point and the previous call's best logits (SAM's refinement), and the logits alone:
    our prompt stage == transformers' SamModel with ``input_masks`` on the same embedding."""
    ref = transformers.SamModel(sam_config(SMALL, image_size=SIZE, window_size=4)).eval()
    ref.load_state_dict(sam.model.state_dict(), strict=True)
    first = sam(image, points=[[80, 45]], labels=[1])
    logits = first.masks.logits
    assert logits.shape == (3, S4, S4) and logits.dtype == torch.float32
    emb = sam.get_predictor().current.embedding
    resized = long_side_size(H, W, SIZE)
    prev = logits[first.masks.best]
    again = sam(points=[[80, 45]], labels=[1], mask_input=prev)
    alone = sam(mask_input=prev[None], multimask=False)
    with torch.no_grad():
        # the first call's logits are SamModel's pred_masks
        theirs = ref(image_embeddings=emb, input_points=_frame_points([[80, 45]], (H, W), resized),
                     input_labels=torch.tensor([[[1]]]), multimask_output=True)
        assert torch.equal(logits, theirs.pred_masks[0, 0])
        theirs = ref(image_embeddings=emb, input_points=_frame_points([[80, 45]], (H, W), resized),
                     input_labels=torch.tensor([[[1]]]), input_masks=prev[None, None], multimask_output=True)
        assert torch.equal(again.masks.logits, theirs.pred_masks[0, 0])
        assert torch.equal(again.masks.scores, theirs.iou_scores[0, 0])
        assert torch.equal(again.masks.data, upscale_logits(theirs.pred_masks[:, 0], SIZE, resized, (H, W))[0] > 0)
        theirs = ref(image_embeddings=emb, input_masks=prev[None, None], multimask_output=False)
        assert torch.equal(alone.masks.logits, theirs.pred_masks[0, 0])
    assert not torch.equal(again.masks.logits, logits), "the mask prompt must change the masks"


def test_sam2_mask_prompt_equals_transformers(sam2, image):
    """SAM 2 / EdgeTAM: a box with a mask prompt, and a mask alone, == transformers' image model
    (``Sam2Model`` / ``EdgeTamModel``) forward with ``input_masks`` on the same embeddings."""
    first = sam2(image, boxes=[[30, 20, 100, 70]])
    prev = first.masks.logits[first.masks.best]
    both = sam2(boxes=[[30, 20, 100, 70]], mask_input=prev, multimask=False)
    alone = sam2(mask_input=prev)
    embs = list(sam2.get_predictor().current.embedding)
    net = sam2.model
    box = torch.tensor([[[30 * SIZE / W, 20 * SIZE / H, 100 * SIZE / W, 70 * SIZE / H]]], dtype=torch.float32)
    with torch.no_grad():
        theirs = _reference_class(net).forward(net, image_embeddings=embs, input_boxes=box,
                                               input_masks=prev[None, None], multimask_output=False)
        assert torch.equal(both.masks.logits, theirs.pred_masks[0, 0])
        assert torch.equal(both.masks.scores, theirs.iou_scores[0, 0])
        theirs = _reference_class(net).forward(net, image_embeddings=embs, input_masks=prev[None, None],
                                               multimask_output=True)
        assert torch.equal(alone.masks.logits, theirs.pred_masks[0, 0])
    assert not torch.equal(both.masks.logits, first.masks.logits[:1])


@pytest.mark.parametrize("family", ["sam", "sam2"])
def test_binary_mask_lands_where_the_image_is(family, sam, image):
    """A bool mask of the image becomes logits (+10 in, -10 out) in the frame where the image is:
    brought back to the image by the family's own upsampling it is the mask again (up to the
    edge pixels), and SAM's padding (below the resized image) is outside."""
    truth = np.zeros((H, W), bool)
    truth[20:70, 30:100] = True
    if family == "sam":
        resized = long_side_size(H, W, SIZE)
        low = mask_prompt_logits(truth, SIZE, resized, (H, W), torch.device("cpu"))
        back = upscale_logits(low, SIZE, resized, (H, W))[0, 0] > 0
        rows = -(-resized[0] // 4)    # low-res rows holding the image
        assert torch.allclose(low[0, 0, rows + 1:], torch.tensor(MASK_BIAS), atol=1e-5)
    else:
        from libreyolo.models.sam2.model import Sam2Family
        low = mask_prompt_logits(truth, SIZE, (SIZE, SIZE), (H, W), torch.device("cpu"))
        back = Sam2Family.postprocess_masks(low, SIZE, (SIZE, SIZE), (H, W))[0, 0]
    assert low.shape == (1, 1, S4, S4) and float(low.max()) <= 10 and float(low.min()) >= -10
    iou = (back.numpy() & truth).sum() / (back.numpy() | truth).sum()
    assert iou > 0.9, iou


def test_binary_mask_and_files_predict(sam, image, tmp_path):
    """A bool mask, the same as 0/1 uint8, as a PNG file, and logits as a .npy: each is the array's call."""
    from PIL import Image
    truth = np.zeros((H, W), bool)
    truth[20:70, 30:100] = True
    a = sam(image, points=[[60, 45]], mask_input=truth)
    b = sam(points=[[60, 45]], mask_input=truth.astype(np.uint8))
    Image.fromarray(truth.astype(np.uint8) * 255).save(tmp_path / "m.png")
    c = sam(points=[[60, 45]], mask_input=str(tmp_path / "m.png"))
    for r in (b, c):
        assert torch.equal(r.masks.logits, a.masks.logits)
    np.save(tmp_path / "l.npy", a.masks.logits[0].numpy())
    d, e = sam(points=[[60, 45]], mask_input=tmp_path / "l.npy"), sam(points=[[60, 45]], mask_input=a.masks.logits[0])
    assert torch.equal(d.masks.logits, e.masks.logits)


def test_cli_predict_with_a_mask_file(sam, image, tmp_path, monkeypatch):
    import json

    from PIL import Image

    import libreyolo.cli as cli
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: sam)
    truth = np.zeros((H, W), np.uint8)
    truth[20:70, 30:100] = 255
    Image.fromarray(truth).save(tmp_path / "m.png")
    Image.fromarray(image).save(tmp_path / "img.png")
    assert cli.main(["predict", "model=sam-base", f"source={tmp_path / 'img.png'}", "device=cpu", "save=false",
                     f"mask_input={tmp_path / 'm.png'}", f"json={tmp_path / 'r.json'}"]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    ref = sam(str(tmp_path / "img.png"), mask_input=str(tmp_path / "m.png")).masks.summary()
    assert rows == json.loads(json.dumps(ref))


@pytest.mark.parametrize("kw,match", [
    ({"mask_input": np.zeros((S4, S4 + 1), np.float32)}, r"low-resolution logits .* shape \(32, 32\)"),
    ({"mask_input": np.zeros((H, W + 1), bool)}, "a binary mask_input is a mask of the image: shape 90x160"),
    ({"mask_input": np.full((H, W), 3, np.uint8)}, "values must be 0 or 1"),
    ({"mask_input": np.full((S4, S4), np.nan, np.float32)}, "finite"),
    ({"mask_input": "missing.png"}, "does not exist"),
    ({"mask_input": [[0.0]]}, "must be an array, a tensor or a file"),
    ({"mask_input": np.zeros((H, W), bool), "prompts": "grid"}, "leave points, labels, boxes and mask_input out"),
    ({"mask_input": np.zeros((H, W), bool), "labels": [1]}, "labels were given without points"),
])
def test_bad_mask_input_is_named(sam, image, kw, match):
    sam.set_image(image)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        sam(**kw)


@pytest.mark.parametrize("family,size,kw", [("mobilesam", "tiny", {"points": [[10, 10]]}),
                                            ("picosam3", "pico", {"boxes": [[10, 10, 50, 50]]})])
def test_families_without_a_mask_input_refuse_it(family, size, kw, image):
    """MobileSAM and PicoSAM3 refuse a mask prompt by name; MobileSAM's prompt stage keeps its
    two outputs (masks, scores: the GPU-proven stage) and its Results carry no logits."""
    model = get_family(family).new(size, device="cpu", imgsz=128 if family == "mobilesam" else None)
    with pytest.raises(ValueError, match=f"{family}-{size} takes no mask prompts"):
        model(image, mask_input=np.zeros((H, W), bool), **kw)
    r = model(image, **kw)
    assert r.masks.logits is None
    if family == "mobilesam":
        st = model.get_predictor().current
        stage = PromptPredictor(model).prompt_stage(st.size, st.resized, st.hw, 1, 0, True)
        from libreyolo.tasks.segment_prompt.prompts import pack, parse_prompt
        packed = torch.from_numpy(pack(parse_prompt(**kw).for_image(H, W), H, W, *st.resized))
        with torch.no_grad():
            out = stage(st.embedding, packed)
        assert len(out) == 2 and torch.equal(out[0][0], r.masks.data)


def test_verify_cases_hold_the_mask_prompt_stage(sam2, monkeypatch):
    """SAM 2 / EdgeTAM's parity cases include the prompt stage with a mask prompt (what the GPU
    run proves before a graph flag is declared); on the CPU, with the capture stood in by a
    replay, each case passes the protocol (probes differ, replays equal)."""
    from standin import StandInCapturer

    import libreyolo.graphs.parity as parity
    monkeypatch.setattr(parity, "CudaGraphCapturer", StandInCapturer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cases = sam2.verify_cases(SIZE, 1, (48, 64))
    assert [c[0].split()[0] for c in cases] == ["network", "image-stage", "prompt-stage", "prompt-stage+mask"]
    with torch.no_grad():
        results = [parity.check_parity(name, fn, a, b, module=sam2.model) for name, fn, a, b in cases[2:]]
    assert all(r.passed for r in results), [r.as_dict() for r in results]
