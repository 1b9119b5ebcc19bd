"""``libreyolo track`` of SAM 2 / EdgeTAM (video propagation of a prompted object) and ``libreyolo
bench`` of every segment-prompt prompt kind (PicoSAM3 takes boxes only), on the CPU with small
networks: SAM 2 tiny at a 64 frame on a short synthetic clip."""
import json

import pytest
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
