"""``libreyolo track`` of SAM 2 / EdgeTAM (video propagation of a prompted object), the video step
with several objects batched (equal to one object at a time, bit for bit) and ``libreyolo bench``
of every segment-prompt prompt kind (PicoSAM3 takes boxes only), on the CPU with small networks:
SAM 2 tiny at a 64 frame (EdgeTAM at 256) on a short synthetic clip."""
import json

import pytest
import torch
from test_sam_video import H, W, shape_clip

from libreyolo.cli import main
from libreyolo.models.sam2.model import Sam2

N = 5   # frames of the clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from libreyolo.data.video import VideoWriter
    frames, _ = shape_clip(N)
    w = VideoWriter(tmp_path_factory.mktemp("clip") / "clip.mp4", 10, W, H)
    for f in frames:
        w.write(f)
    return w.close()


@pytest.fixture(scope="module")
def sam2_tiny():
    """``sam2-tiny`` by name, built once: the untrained video network at a 64 frame (1024 as
    released; building it takes seconds on one core)."""
    from libreyolo import LibreYOLO
    mp = pytest.MonkeyPatch()
    mp.setattr(Sam2, "DEFAULT_IMGSZ", 64)
    try:
        model = LibreYOLO("sam2-tiny", device="cpu")
    finally:
        mp.undo()
    assert (model.FAMILY, model.imgsz, model.has_video) == ("sam2", 64, True)
    return model


@pytest.fixture
def tiny(monkeypatch, sam2_tiny):
    """``model=sam2-tiny`` on the command line loads the model built once."""
    import libreyolo.cli as cli
    load = cli._load
    monkeypatch.setattr(cli, "_load", lambda opts, seed=None: sam2_tiny if opts["model"] == "sam2-tiny"
                        else load(opts, seed))
    return sam2_tiny


def test_track_cli_follows_a_point(tmp_path, clip, tiny, capsys):
    out = tmp_path / "out"
    rc = main(["track", "model=sam2-tiny", f"source={clip}", "points=14,16", "labels=1", "frame=0", "save=true",
               f"save_dir={out}", "device=cpu", f"json={tmp_path / 'r.json'}"])
    assert rc == 0
    text = capsys.readouterr().out
    assert f"{N} frame(s)" in text and "1 track(s)" in text and "non-empty mask(s)" in text
    assert (out / "clip.mp4").stat().st_size > 0
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["frame"] for r in rows] == list(range(N))
    assert all(r["path"] == str(clip) for r in rows)
    assert all([d["name"] for d in r["detections"]] == ["object1"] for r in rows)


def test_track_cli_equals_the_python_call(tmp_path, clip, tiny):
    """The command line's prompt (a box on frame 1, id 3) reaches ``model.track`` as given: the
    masks written by --json equal the Python call's summaries."""
    assert main(["track", "model=sam2-tiny", f"source={clip}", "boxes=8,8,30,28", "frame=1", "obj_id=3",
                 "save=false", "device=cpu", f"json={tmp_path / 'r.json'}"]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())
    ref = tiny.track(str(clip), boxes=[[8, 8, 30, 28]], frame=1, obj_id=3)
    assert [r["detections"] for r in rows] == [r.summary() for r in ref]
    assert rows[0]["detections"] == [] and rows[1]["detections"][0]["id"] == 3


@pytest.mark.parametrize("args,match", [
    ([], "track needs a prompt"),
    (["points=14,16", "multimask=false"], "multimask: not an option of sam2-tiny's video propagation"),
    (["points=14,16", "frame=-1"], "frame"),
    (["points=14,16", "labels=1,0"], None),   # one label per point: the API's message
])
def test_track_cli_bad_input(clip, tiny, capsys, args, match):
    rc = main(["track", "model=sam2-tiny", f"source={clip}", "device=cpu", "save=false", *args])
    err = capsys.readouterr().err
    assert rc in (1, 2)
    assert (match or "labels has 2 value(s) but points has 1") in err


def test_track_cli_refuses_image_families_and_images(tmp_path, capsys, clip, tiny):
    assert main(["track", "model=mobilesamtiny", f"source={clip}", "points=1,1", "device=cpu"]) == 2
    assert "segments images" in capsys.readouterr().err
    from PIL import Image
    src = tmp_path / "img.png"
    Image.fromarray(shape_clip(1)[0][0]).save(src)
    assert main(["track", "model=sam2-tiny", f"source={src}", "points=1,1", "device=cpu"]) == 1
    assert "track takes a video" in capsys.readouterr().err
    # a detection model refuses the segment-prompt options by name
    assert main(["track", "model=yolo9t", f"source={clip}", "frame=2", "device=cpu"]) == 2
    assert "frame is an option of segment-prompt models" in capsys.readouterr().err


def test_bench_prompts_each_family_with_what_it_takes(tmp_path):
    """PicoSAM3 takes boxes only: the bench prompts it with the centre box (a point family keeps
    the centre point); the end-to-end and prompt arms run."""
    from libreyolo.models.registry import get_family
    from libreyolo.tasks.segment_prompt.task import bench_prompt
    assert bench_prompt(get_family("picosam3").new("pico", device="cpu")) == {"boxes": "center"}
    assert bench_prompt(get_family("mobilesam").new("tiny", device="cpu")) == {"points": "center"}
    path = tmp_path / "b.json"
    assert main(["bench", "model=picosam3-pico", "runs=1", "warmup=0", "imgsz=96", "device=cpu", f"json={path}"]) == 0
    arms = json.loads(path.read_text())["arms"]
    assert {"predict_eager", "set_image_eager", "prompt_eager"} <= set(arms)


def test_predict_cli_defaults_to_what_the_family_takes(tmp_path):
    """``libreyolo predict`` without a prompt: the centre box for PicoSAM3 (it takes no points)."""
    from PIL import Image
    src = tmp_path / "img.png"
    Image.fromarray(shape_clip(1, 90, 160)[0][0]).save(src)
    assert main(["predict", "model=picosam3-pico", f"source={src}", "device=cpu", "save=false",
                 f"json={tmp_path / 'r.json'}"]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())[0]["detections"]
    assert len(rows) == 1   # one mask for the one (centre) box


@pytest.mark.parametrize("family,size,imgsz,n", [("sam2", "tiny", 64, 5), ("edgetam", "edge", 256, 2)])
def test_batched_objects_equal_one_at_a_time(family, size, imgsz, n, sam2_tiny):
    """Objects prompted on the same frame are tracked as one batch (memory attention, and SAM 2's
    memory encoder, on all of them at once); each object's masks, scores and new memories equal
    the one-object-at-a-time run bit for bit. An object prompted later (other pointer offsets)
    is its own batch."""
    from libreyolo.models.registry import get_family
    from libreyolo.tasks.segment_prompt.video import VideoPropagator, parse_track_prompts
    model = sam2_tiny if family == "sam2" else get_family(family).new(size, device="cpu", imgsz=imgsz, seed=0)
    frames, _ = shape_clip(n)
    prompts = [{"frame": 0, "id": 1, "points": [[14, 16]]}, {"frame": 0, "id": 2, "boxes": [[30, 5, 60, 30]]},
               {"frame": 0, "id": 4, "points": [[50, 40], [3, 3]], "labels": [1, 0]}]
    if n > 3:
        prompts.append({"frame": 2, "id": 3, "points": [[40, 30]]})
    net, batches = model.model, []
    orig = net.track_step

    def spy(*a, **k):
        batches.append(1 if a[4] is None else int(a[4].shape[1]))
        return orig(*a, **k)
    runs = {}
    net.track_step = spy
    try:
        with torch.no_grad():
            for batched in (True, False):
                batches.clear()
                prop = VideoPropagator(model, parse_track_prompts(prompts=prompts), batch_objects=batched)
                runs[batched] = ([prop.step(i, f) for i, f in enumerate(frames)], dict(prop.banks), list(batches))
    finally:
        del net.track_step
    (got, banks, calls), (ref, ref_banks, ref_calls) = runs[True], runs[False]
    assert max(calls) == 3 and max(ref_calls) == 1 and len(calls) < len(ref_calls)
    if n > 3:
        assert calls[-2:] == [3, 1]   # the last frame: objects 1, 2, 4 together, object 3 alone
    for (ids, masks, scores), (rids, rmasks, rscores) in zip(got, ref):
        assert ids == rids and torch.equal(masks, rmasks), (ids, (masks != rmasks).flatten(1).sum(1))
        assert torch.equal(scores, rscores), (scores, rscores)
    for obj_id, bank in banks.items():
        for f, mem in bank.recent.items():
            other = ref_banks[obj_id].recent[f]
            assert torch.equal(mem.memory, other.memory) and torch.equal(mem.pointer, other.pointer)
            assert torch.equal(mem.memory_pos, other.memory_pos)


def test_video_step_cases_hold_a_batch_of_objects(sam2_tiny, monkeypatch):
    """The parity cases of the video step (what the GPU run proves before a graph flag is
    declared) include three objects as one batch; on the CPU, the capture stood in by a replay,
    both video-step cases pass the protocol."""
    from standin import StandInCapturer

    import libreyolo.graphs.parity as parity
    monkeypatch.setattr(parity, "CudaGraphCapturer", StandInCapturer)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cases = [c for c in sam2_tiny.verify_cases(64, 1, (48, 64)) if c[0].startswith("video-step")]
    assert [c[0] for c in cases] == ["video-step (full bank)", "video-step (full bank, 3 objects)"]
    with torch.no_grad():
        results = [parity.check_parity(name, fn, a, b, module=sam2_tiny.model) for name, fn, a, b in cases]
    assert all(r.passed for r in results), [r.as_dict() for r in results]


def test_memory_attention_rows_equal_one_object_each(sam2_tiny):
    """The batched part of the step: the memory attention of N objects (random banks of random
    fill, pointer counts and batch sizes) gives each object the rows of its own run, bit for bit."""
    net = sam2_tiny.model
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        n, t, k = 2 + seed % 3, 1 + seed % 7, 1 + (5 * seed) % 16
        feats, pos = torch.randn(16, 1, 256, generator=g), torch.randn(16, 1, 256, generator=g)
        mem, mem_pos = torch.randn(16 * t, n, 64, generator=g), torch.randn(16 * t, n, 64, generator=g)
        ptr, offsets = torch.randn(k, n, 1, 256, generator=g), torch.arange(k, dtype=torch.float32) + 1
        with torch.no_grad():
            both = net.conditioned_features(feats.expand(-1, n, -1), pos.expand(-1, n, -1), mem, mem_pos, ptr, offsets)
            for i in range(n):
                one = net.conditioned_features(feats, pos, mem[:, i:i + 1], mem_pos[:, i:i + 1], ptr[:, i:i + 1], offsets)
                assert torch.equal(both[i:i + 1], one), (seed, i)
