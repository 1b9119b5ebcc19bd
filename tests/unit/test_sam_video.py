"""SAM 2 / EdgeTAM video propagation on the CPU (``model.track``): the same numbers as transformers'
own streaming loop, a 20-frame synthetic clip tracked through a file (the memory bank fills and
rolls, ids persist, the true-mask IoU recorded), refinement and several objects, stream / save,
bad input. Untrained weights: the tests check the mechanics, not the masks' quality."""
import logging

import numpy as np
import pytest
import torch

from libreyolo.models.registry import get_family
from libreyolo.tasks.segment_prompt.video import ObjectBank, VideoPropagator, parse_track_prompts

H, W = 48, 64


def shape_clip(n=20, h=H, w=W):
    """A disc that moves right and down and grows: (frames, true masks)."""
    yy, xx = np.mgrid[:h, :w]
    frames, truth = [], []
    for t in range(n):
        cx, cy, r = 14 + 1.5 * t, 16 + 0.6 * t, 6 + 0.3 * t
        m = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
        img = np.full((h, w, 3), 30, np.uint8)
        img[m] = (230, 190, 40)
        frames.append(img)
        truth.append(m)
    return frames, truth


@pytest.fixture(scope="module")
def sam2():
    return get_family("sam2").new("tiny", device="cpu", imgsz=64, seed=0)


def _reference_stream(model, frames, points, size):
    """transformers' ``Sam2VideoModel`` / ``EdgeTamVideoModel`` in streaming mode (frame by
    frame) with one point-prompted object on frame 0: its low-resolution mask logits per frame."""
    import transformers
    net = model.model
    base = next(c for c in type(net).__mro__ if c.__name__ in ("Sam2VideoModel", "EdgeTamVideoModel"))
    session_cls = (transformers.Sam2VideoInferenceSession if base.__name__ == "Sam2VideoModel"
                   else transformers.EdgeTamVideoInferenceSession)
    h, w = frames[0].shape[:2]
    sess = session_cls(video_height=h, video_width=w, inference_device="cpu", dtype=torch.float32)
    idx = sess.obj_id_to_idx(1)
    pts = torch.tensor([[[[x * size / w, y * size / h] for x, y in points]]], dtype=torch.float32)
    sess.add_point_inputs(idx, 0, {"point_coords": pts, "point_labels": torch.ones((1, 1, len(points)), dtype=torch.int32)})
    sess.obj_with_new_inputs = [1]
    out = []
    with torch.no_grad():
        for f in frames:
            x = model.preprocess(torch.from_numpy(f)[None], size)[0]
            out.append(base.forward(net, sess, frame=x).pred_masks.float())
    return out


@pytest.mark.parametrize("family,size,imgsz,n", [("sam2", "tiny", 64, 6), ("edgetam", "edge", 256, 4)])
def test_propagation_equals_transformers_streaming(family, size, imgsz, n):
    """Our fixed-shape step with its tensor memory bank == transformers' session loop, frame by
    frame (the same modules, memory selection and order): the mask logits bit for bit."""
    model = get_family(family).new(size, device="cpu", imgsz=imgsz, seed=0)
    frames, _ = shape_clip(n)
    ref = _reference_stream(model, frames, [(15, 16)], imgsz)
    prop = VideoPropagator(model, parse_track_prompts(points=[[15, 16]], labels=[1]))
    seen = []
    net = model.model
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
    assert len(seen) == n
    for i, (ours, theirs) in enumerate(zip(seen, ref)):
        assert torch.equal(ours, theirs), (i, (ours - theirs).abs().max())


def test_track_a_clip_file(tmp_path, sam2, caplog):
    """A 20-frame clip written as a video file, tracked by SAM 2 tiny from one point: one Results
    per frame with the object's id on every frame; the memory bank fills to 6 remembered and 15
    pointer frames and then rolls; save=True writes the overlaid video. The true-mask IoU per
    frame is logged (untrained weights: a record, not a target)."""
    from libreyolo.data.video import VideoWriter
    frames, truth = shape_clip(20)
    w = VideoWriter(tmp_path / "clip.mp4", 10, W, H)
    for f in frames:
        w.write(f)
    path = w.close()
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        results = sam2.track(path, points=[[14, 16]], labels=[1], frame=0, save=True, save_dir=tmp_path / "out")
    assert len(results) == 20
    assert all(r.masks.ids.tolist() == [1] for r in results)
    assert all(r.masks.data.shape == (1, H, W) for r in results)
    ious = []
    for r, t in zip(results, truth):
        m = r.masks.data[0].numpy()
        ious.append(float((m & t).sum() / max((m | t).sum(), 1)))
    assert all(0.0 <= v <= 1.0 for v in ious)
    logging.getLogger("libreyolo").info("sam2-tiny untrained, 20-frame clip: true-mask IoU per frame %s",
                                        [round(v, 3) for v in ious])
    assert (tmp_path / "out" / "clip.mp4").stat().st_size > 0
    assert results[0].save_dir == str(tmp_path / "out")


def test_bank_fills_and_rolls(sam2):
    frames, _ = shape_clip(20)
    prop = VideoPropagator(sam2, parse_track_prompts(points=[[14, 16]]))
    fills = []
    with torch.no_grad():
        for i, f in enumerate(frames):
            prop.step(i, f)
            bank = prop.banks[1]
            fills.append(bank.fill)
            mem, _, ptr, offs = bank.gather(i + 1, sam2.model)
            fills[-1] += (mem.shape[0] // 16, ptr.shape[0])   # 4x4 tokens per frame at imgsz 64
    assert fills[0] == (1, 0, 1, 1)          # the conditioning frame
    assert fills[5] == (1, 5, 6, 6)          # filling
    assert fills[10] == (1, 10, 7, 11)       # 1 + 6 memories remembered; pointers still filling
    assert fills[19] == (1, 15, 7, 16)       # full: 15 tracked frames kept, then rolling
    assert sorted(prop.banks[1].recent) == list(range(5, 20))
    assert offs.tolist() == [20.0] + [float(d) for d in range(1, 16)]


def test_refinement_and_two_objects_stream(sam2):
    """A second object from frame 3 and a new prompt for object 1 on frame 6 (a new conditioning
    frame); stream=True yields frame by frame; ids persist in id order."""
    frames, _ = shape_clip(8)
    gen = sam2.track(frames, prompts=[{"frame": 0, "id": 1, "points": [[14, 16]]},
                                      {"frame": 3, "id": 7, "boxes": [[40, 2, 60, 20]]},
                                      {"frame": 6, "id": 1, "points": [[22, 20], [2, 2]], "labels": [1, 0]}],
                     stream=True)
    assert not isinstance(gen, list)
    res = list(gen)
    assert [r.masks.ids.tolist() for r in res] == [[1]] * 3 + [[1, 7]] * 5
    assert res[4].masks.summary()[1]["name"] == "object7"
    assert res[0].plot().shape == (H, W, 3)


def test_mask_prompt(sam2):
    frames, truth = shape_clip(3)
    res = sam2.track(frames, mask=truth[0], frame=0)
    # a mask prompt is taken as the frame's output (SAM 2): the first frame's mask is the prompt,
    # resampled to the low-resolution logits and back
    m = res[0].masks.data[0].numpy()
    assert (m & truth[0]).sum() / (m | truth[0]).sum() > 0.8
    assert len(res) == 3


def test_bad_input_is_named(tmp_path, sam2):
    frames, _ = shape_clip(4)
    with pytest.raises(ValueError, match="point 0 .* outside the 64x48 image"):
        sam2.track(frames, points=[[100, 10]])
    with pytest.raises(ValueError, match="on frame 9, but 'clip' has 4 frames"):
        sam2.track(frames, points=[[10, 10]], frame=9)
    with pytest.raises(ValueError, match="object id 2 is prompted twice on frame 1"):
        sam2.track(frames, prompts=[{"frame": 1, "id": 2, "points": [[1, 1]]}, {"frame": 1, "id": 2, "boxes": [[0, 0, 5, 5]]}])
    with pytest.raises(ValueError, match="one box per object"):
        sam2.track(frames, boxes=[[0, 0, 5, 5], [1, 1, 6, 6]])
    with pytest.raises(ValueError, match="needs a prompt"):
        sam2.track(frames)
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(200))
    from libreyolo.data.video import VideoSourceError
    with pytest.raises(VideoSourceError, match="broken.mp4"):
        sam2.track(str(bad), points=[[10, 10]])
    with pytest.raises(ValueError, match="for one image use predict"):
        sam2.track(frames[0], points=[[10, 10]])


def test_object_bank_keeps_every_conditioning_frame():
    """SAM 2.1 attends to every conditioning frame (max_cond_frame_num=-1): refinements stay."""
    bank = ObjectBank(1)
    m = object()
    for f in (0, 4, 9):
        bank.add(f, m, True, keep=15)
    for f in range(30):
        bank.add(f, m, False, keep=15)
    assert list(bank.cond) == [0, 4, 9] and sorted(bank.recent) == list(range(15, 30))
