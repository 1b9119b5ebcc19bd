"""SAM 3 (transformers' Sam3TrackerModel / Sam3TrackerVideoModel) on the CPU: the fast twin of the
sam3-large fixture (a small config against transformers' own forward, bit for bit), predict with
points and boxes, set_image, multimask, automatic masks, the CLI, checkpoints, bad input, and video
propagation against transformers' streaming loop.

The fixture rows (tests/unit/test_fixtures.py, sam3-large) run the 458 M-parameter tracker at its
fixed 1008 frame and are slow (rows.SLOW_FIXTURES); here the same code runs with a small ViT
(width 64, two blocks, one global) at a 112 frame: the tracker's table of sizes (``nn.VIT``) is
swapped for the module's tests, as the other families' small configs are."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

transformers = pytest.importorskip("transformers", reason="the sam extra (pip install 'libreyolo-graphs[sam]')")

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.models.registry import get_family  # noqa: E402
from libreyolo.models.sam3 import nn as sam3_nn  # noqa: E402
from libreyolo.models.sam3.model import Sam3  # noqa: E402

SIZE = 112   # 8 x 8 patches: the 4 x 4 position embedding tiled twice, four 4 x 4 windows
SMALL = sam3_nn.Sam3ViT(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        window_size=4, global_attn_indexes=(1,), pretrain_image_size=56)
RELEASE = sam3_nn.VIT["large"]


@pytest.fixture(scope="module", autouse=True)
def small_vit():
    """The module's networks are built with the small ViT (the release's is restored after)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sam3_nn.VIT, "large", SMALL)
        yield


def _redraw(net, seed):
    """Input-sensitive weights (transformers' init leaves the no-memory embedding at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 / max(1, p[0].numel()) ** 0.5 if p.dim() > 1 else 0.1))
    return net


@pytest.fixture(scope="module")
def model():
    m = Sam3.new("large", device="cpu", imgsz=SIZE, seed=0, video=False)
    _redraw(m.model, 1)
    return m


@pytest.fixture(scope="module")
def image():
    g = np.random.default_rng(0)
    img = np.full((90, 160, 3), 30, np.uint8)
    img[20:70, 30:100] = (220, 40, 40)
    return np.clip(img + g.integers(0, 30, img.shape), 0, 255).astype(np.uint8)


def test_release_layout_is_the_fixtures(small_vit):
    """Built on the meta device with the release's ViT: transformers' Sam3TrackerModel state dict
    key for key, in the fixture's order, with its 458,260,369 parameters; the video network holds
    the same entries plus the memory modules."""
    from conftest import FIXTURES_DIR
    layout = json.loads((FIXTURES_DIR / "sam3-large.json").read_text())["layout"]
    with pytest.MonkeyPatch.context() as mp, torch.device("meta"):
        mp.setitem(sam3_nn.VIT, "large", RELEASE)
        img = Sam3.build_network("large")
        vid = sam3_nn.Sam3VideoNet("large")
    assert [(k, tuple(v.shape)) for k, v in img.state_dict().items()] == [(n, tuple(s)) for n, s, _ in layout]
    assert sum(p.numel() for p in img.parameters()) == 458_260_369
    assert set(img.state_dict()) < set(vid.state_dict())
    assert any(k.startswith(Sam3.VIDEO_KEY) for k in vid.state_dict())
    assert (img.frame, img.backbone_feature_sizes) == (1008, [[288, 288], [144, 144], [72, 72]])
    sd = img.state_dict()
    assert Sam3.owns_state_dict(sd) and not get_family("sam2").owns_state_dict(sd)


def test_two_stages_equal_transformers_forward(model):
    """embed + decode (an image embedded once, prompted many times) == transformers'
    Sam3TrackerModel.forward on the same weights, bit for bit: the fixture's call (the image padded
    to the frame, two points), a box with points, a box alone, multimask or not. The no-memory
    embedding is drawn non-zero: transformers adds it to the FPN's fourth level, which the mask
    decoder never sees, and so does ours."""
    net = model.model
    ref = transformers.Sam3TrackerModel(sam3_nn.sam3_config("large", SIZE)).eval()
    ref.load_state_dict(net.state_dict(), strict=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((1, 3, 80, SIZE), generator=g)
    pts, lab = torch.tensor([[[[20.0, 30.0], [90.0, 60.0]]]]), torch.tensor([[[1, 0]]])
    box = torch.tensor([[[10.0, 12.0, 100.0, 70.0]]])
    assert net.no_memory_embedding.abs().sum() > 0
    with torch.no_grad():
        ours = net(x, input_points=pts, input_labels=lab, multimask_output=True)
        theirs = ref(pixel_values=F.pad(x, (0, 0, 0, SIZE - 80)), input_points=pts, input_labels=lab,
                     multimask_output=True)
        for k in ("pred_masks", "iou_scores", "object_score_logits"):
            assert torch.equal(ours[k], getattr(theirs, k)), k
        assert all(torch.equal(a, b) for a, b in zip(ours["image_embeddings"], theirs.image_embeddings))
        embs = net.embed(F.pad(x, (0, 0, 0, SIZE - 80)))
        for kw, mm in (({"input_points": pts, "input_labels": lab, "input_boxes": box}, False),
                       ({"input_boxes": box}, True)):
            r = ref(image_embeddings=list(embs), multimask_output=mm, **kw)
            low, iou, obj = net.decode(*embs, pts[:, 0] if "input_points" in kw else None,
                                       lab[:, 0] if "input_points" in kw else None, box, mm)
            assert torch.equal(low, r.pred_masks[:, 0]) and torch.equal(iou, r.iou_scores[:, 0])
            assert torch.equal(obj, r.object_score_logits)
    assert tuple(embs[0].shape[1:]) == (32, 32, 32) and tuple(embs[2].shape[1:]) == (256, 8, 8)


def test_video_network_predicts_as_the_image_network(model, image):
    """One set of weights, one image prediction: the video network (its image entries loaded from
    the image network) embeds and decodes as the image network does."""
    vid = Sam3.new("large", device="cpu", imgsz=SIZE, seed=0)
    missing, unexpected = vid.model.load_state_dict(model.model.state_dict(), strict=False)
    assert not unexpected and all(k.startswith(("memory_", "mask_downsample", "object_pointer_proj", "temporal_",
                                                "no_memory_positional", "no_object_pointer", "occlusion"))
                                  for k in missing)
    a = model(image, points=[[60, 45]], labels=[1])
    b = vid(image, points=[[60, 45]], labels=[1])
    assert torch.equal(a.masks.data, b.masks.data) and torch.equal(a.masks.scores, b.masks.scores)


def test_predict_points_boxes_and_set_image(model, image):
    r = model(image, points=[[60, 45]], labels=[1], bgr=False)
    assert r.masks.data.shape == (3, 90, 160) and r.masks.data.dtype == torch.bool
    assert r.masks.scores.shape == (3,)
    calls = model.runner.eager_calls
    one = model(points=[[60, 45], [5, 5]], labels=[1, 0], boxes=[[30, 20, 100, 70]], multimask=False)
    box = model(boxes=[[30, 20, 100, 70]])
    assert model.runner.eager_calls - calls == 2, "a prompt call on the set image runs the prompt stage only"
    assert one.masks.data.shape == (1, 90, 160) and one.masks.scores.shape == (1,)
    assert box.masks.data.shape == (3, 90, 160) and len(box.masks.boxes) == 1
    again = model(points=[[60, 45]], labels=[1])
    assert torch.equal(again.masks.data, r.masks.data) and torch.equal(again.masks.scores, r.masks.scores)
    # the steps by hand: stretched to the frame with mean / std 0.5 (transformers' Sam3ImageProcessor:
    # within one level of 255, where its fixed-point uint8 resize rounds otherwise), points scaled
    # into it, decode, the low-resolution logits bilinear straight to the image's size, > 0
    with torch.no_grad():
        x = model.preprocess(torch.from_numpy(image)[None], SIZE)
        ref = transformers.Sam3ImageProcessor(size={"height": SIZE, "width": SIZE})(images=image, return_tensors="pt")
        assert (x - ref["pixel_values"]).abs().max() <= 2 / 255 + 1e-6
        low, iou, _ = model.model.decode(*model.model.embed(x), torch.tensor([[[60 * SIZE / 160, 45 * SIZE / 90]]]),
                                         torch.ones(1, 1), None, True)
    assert torch.equal(F.interpolate(low, (90, 160), mode="bilinear", align_corners=False)[0] > 0, r.masks.data)
    assert torch.equal(iou[0], r.masks.scores)
    row = r.summary()
    assert [d["name"] for d in row] == ["mask0", "mask1", "mask2"]


def test_a_mask_prompt_at_the_stride_14_low_resolution(model, image):
    """SAM 3's low-resolution logits are 4x its stride-14 embedding (not SAM's size / 4): a previous
    call's logits feed back as a mask prompt, and a bool mask of the image is taken too."""
    r = model(image, points=[[60, 45]], labels=[1], bgr=False)
    side = 4 * (SIZE // 14)
    assert r.masks.logits.shape[-2:] == (side, side)
    again = model(points=[[60, 45]], labels=[1], mask_input=r.masks.logits[0])
    assert again.masks.data.shape == r.masks.data.shape
    from_bool = model(points=[[60, 45]], labels=[1], mask_input=r.masks.data[0].numpy())
    assert from_bool.masks.data.shape == r.masks.data.shape


def test_automatic_masks(model, image):
    """prompts="grid": the point grid through the grid stage (three maps, the stretched frame's
    up-sampling); a grid point's masks equal a prompt call for that point."""
    r = model(image, prompts="grid", points_per_side=3, pred_iou_thresh=0, stability_score_thresh=0,
              box_nms_thresh=1.0)
    assert type(r.masks).__name__ == "AutoMasks" and r.masks.data.shape[1:] == (90, 160)
    assert len(r.masks) >= 1 and (r.masks.areas == r.masks.data.sum((1, 2))).all()
    from libreyolo.tasks.segment_prompt.amg import grid_stage, point_grid
    st = model.get_predictor().current
    xy = point_grid(3)[4] * np.array([160, 90])
    rows = np.array([[xy[0] * SIZE / 160, xy[1] * SIZE / 90, 1.0]], np.float32)
    with torch.no_grad():
        masks, iou, _, _ = grid_stage(model, st.size, st.resized, st.hw)(*st.embedding, torch.from_numpy(rows))
    one = model(points=[xy.tolist()])
    assert torch.equal(masks[0], one.masks.data)
    assert torch.allclose(iou[0], one.masks.scores, atol=1e-6)


@pytest.mark.parametrize("kw,match", [
    ({"points": [[161, 10]]}, r"prompt point 0 \(161, 10\) is outside the 160x90 image"),
    ({"boxes": [[0, 0, 200, 50]]}, "prompt box 0 .* is outside the 160x90 image"),
    ({"boxes": [[0, 0, 10, 10], [5, 5, 20, 20]]}, "at most one box"),
    ({"points": [[1, 1]], "imgsz": 224}, "takes 112x112 frames"),
])
def test_bad_input_is_refused_by_name(model, image, kw, match):
    with pytest.raises(ValueError, match=match):
        model(image, **kw)


def test_frame_rules():
    with pytest.raises(ValueError, match="multiples of 14"):
        Sam3.new("large", device="cpu", imgsz=100, video=False)
    with pytest.raises(ValueError, match="unknown SAM 3 size 'huge'"):
        Sam3.build_network("huge")


def test_checkpoint_keeps_its_frame_and_cli_predicts(tmp_path, model, image):
    """A saved model reloads at its frame (imgsz in the file) as SAM 3; the CLI predicts with
    points and a box, and with prompts=grid."""
    from libreyolo.cli import main
    path = model.save(tmp_path / "LibreSAM3large.pt")
    back = LibreYOLO(str(path), device="cpu")
    assert (back.FAMILY, back.size, back.imgsz, back.has_video) == ("sam3", "large", SIZE, False)
    assert all(torch.equal(a, b) for a, b in zip(back.model.state_dict().values(), model.model.state_dict().values()))
    src = tmp_path / "img.png"
    Image.fromarray(image).save(src)
    out = tmp_path / "pred"
    assert main(["predict", f"model={path}", f"source={src}", "device=cpu", "points=60,45;5,5", "labels=1,0",
                 "boxes=30,20,100,70", f"save_dir={out}", f"json={tmp_path / 'r.json'}"]) == 0
    assert (out / "img.jpg").exists()
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    assert [d["name"] for d in rows] == ["mask0", "mask1", "mask2"]
    assert main(["predict", f"model={path}", f"source={src}", "device=cpu", "prompts=grid", "points_per_side=2",
                 "pred_iou_thresh=0", "stability_score_thresh=0", f"save_dir={tmp_path / 'grid'}"]) == 0


def test_names_resolve():
    from libreyolo.models.registry import parse_spec
    assert parse_spec("sam3-large") == (Sam3, "large") and parse_spec("LibreSAM3large.pt") == (Sam3, "large")
    assert parse_spec("sam-large")[0].FAMILY == "sam" and parse_spec("picosam3-pico")[0].FAMILY == "picosam3"


# ----------------------------------------------------------------------------------------- video
def _clip(n, h=48, w=64):
    yy, xx = np.mgrid[:h, :w]
    out = []
    for t in range(n):
        m = (xx - 14 - 2 * t) ** 2 + (yy - 16 - t) ** 2 <= (6 + t) ** 2
        img = np.full((h, w, 3), 30, np.uint8)
        img[m] = (230, 190, 40)
        out.append(img)
    return out


@pytest.fixture(scope="module")
def video_model():
    m = Sam3.new("large", device="cpu", imgsz=SIZE, seed=0)
    _redraw(m.model, 2)
    with torch.no_grad():   # the object judged present: otherwise every mask is the no-object logit
        m.model.mask_decoder.pred_obj_score_head.proj_out.bias.fill_(8.0)
    return m


def _reference_stream(model, frames, prompts):
    """transformers' Sam3TrackerVideoModel in streaming mode, one object prompted with a point on
    each frame of ``prompts`` ({frame: (x, y)}): its low-resolution mask logits per frame."""
    net = model.model
    base = transformers.Sam3TrackerVideoModel
    h, w = frames[0].shape[:2]
    sess = transformers.Sam3TrackerVideoInferenceSession(video_height=h, video_width=w, inference_device="cpu",
                                                         dtype=torch.float32)
    idx = sess.obj_id_to_idx(1)
    out = []
    with torch.no_grad():
        for t, f in enumerate(frames):
            if t in prompts:
                x, y = prompts[t]
                sess.add_point_inputs(idx, t, {"point_coords": torch.tensor([[[[x * SIZE / w, y * SIZE / h]]]]),
                                               "point_labels": torch.ones((1, 1, 1), dtype=torch.int32)})
                sess.obj_with_new_inputs = [1]
            pix = model.preprocess(torch.from_numpy(f)[None], SIZE)[0]
            out.append(base.forward(net, sess, frame=pix).pred_masks.float())
    return out


def _ours(model, frames, prompts):
    from libreyolo.tasks.segment_prompt.video import VideoPropagator, parse_track_prompts
    prop = VideoPropagator(model, parse_track_prompts(prompts=[{"frame": t, "id": 1, "points": [list(p)]}
                                                               for t, p in prompts.items()]))
    seen, net = [], model.model
    orig = net.track_step

    def spy(*a, **k):   # the low-resolution logits of each step, before the upsampling to the frame
        out = orig(*a, **k)
        seen.append(out[0].float())
        return out
    net.track_step = spy
    try:
        with torch.no_grad():
            for i, f in enumerate(frames):
                prop.step(i, f)
    finally:
        del net.track_step
    return seen, prop


@pytest.mark.parametrize("prompts", [{0: (15, 16)}, {t: (15 + 2 * t, 16 + t) for t in range(6)}],
                         ids=["one-prompt", "six-conditioning-frames"])
def test_propagation_equals_transformers_streaming(video_model, prompts):
    """Our fixed-shape step with its tensor memory bank == transformers' Sam3TrackerVideoModel
    session loop, frame by frame, bit for bit: one prompted frame then tracking; and six prompted
    (conditioning) frames, more than the four SAM 3 attends to (the closest four are chosen, a
    left-out one counts as a tracked frame), then tracking."""
    frames = _clip(8)
    ref = _reference_stream(video_model, frames, prompts)
    seen, prop = _ours(video_model, frames, prompts)
    assert len(seen) == len(ref) == 8
    for i, (a, b) in enumerate(zip(seen, ref)):
        assert torch.equal(a, b), (i, (a - b).abs().max())
        assert a.std() > 0.01, "logits of an absent object (constant) would prove nothing"
    assert len(prop.banks[1].cond) == len(prompts)
    if len(prompts) > 4:   # the selection matters: all six conditioning frames give other logits
        import libreyolo.tasks.segment_prompt.video as video
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(video, "select_cond_frames", lambda frame, cond, limit: (cond, {}))
            every, _ = _ours(video_model, frames, prompts)
        assert all(torch.equal(a, b) for a, b in zip(every[:6], seen[:6]))   # the prompted frames: no memory
        assert not torch.equal(every[6], seen[6]) and not torch.equal(every[7], seen[7])


def test_track_results(video_model):
    frames = _clip(5)
    res = video_model.track(frames, prompts=[{"frame": 0, "id": 1, "points": [[14, 16]]},
                                             {"frame": 2, "id": 4, "boxes": [[40, 2, 60, 20]]}])
    assert [r.masks.ids.tolist() for r in res] == [[1]] * 2 + [[1, 4]] * 3
    assert res[3].masks.data.shape == (2, 48, 64) and res[3].masks.scores.shape == (2,)


def test_track_needs_the_memory(model, image):
    with pytest.raises(ValueError, match="image network only"):
        model.track([image] * 2, points=[[10, 10]])


def test_grid_of_a_family_without_logit_upsampling_is_refused_by_name(image):
    """The grid stage needs a family's own up-sampling as logits (SAM 3's ``upscale_logits``); a
    family that post-processes its masks its own way without it (SAM 2 here) gets one error."""
    sam2 = get_family("sam2").new("tiny", device="cpu", imgsz=64, seed=0, video=False)
    with pytest.raises(ValueError, match="sam2 has no automatic mask generation yet"):
        sam2(image, prompts="grid", points_per_side=2)


def test_verify_cases_run_the_parity_protocol_on_the_cpu(video_model, monkeypatch):
    """The family's cases (network, image stage, prompt stage without and with a mask prompt, the
    video step at a full bank for one and three objects, the frame stage) through the parity protocol, the capture stood in by a replay: probes differ,
    replays equal."""
    from standin import StandInCapturer

    import libreyolo.graphs.parity as parity
    monkeypatch.setattr(parity, "CudaGraphCapturer", StandInCapturer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cases = video_model.task_def.verify_cases(video_model, SIZE, 1, (48, 64))
    with torch.no_grad():
        results = [parity.check_parity(name, fn, a, b, module=video_model.model) for name, fn, a, b in cases]
    assert [c[0].split()[0] for c in cases] == ["network", "image-stage", "prompt-stage", "prompt-stage+mask",
                                                "video-step", "video-step", "video-frame-stage"]
    assert all(r.passed for r in results), [r.as_dict() for r in results]
