"""Video frames through CUDA graphs, on a GPU: one capture at the second frame, replays after,
every frame equal to eager; tracking on top leaves the captured stage unchanged. Run through
scripts/gpu-check (the CPU tests drive the same policy through a stand-in capturer)."""
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.data.clips import write_moving_shapes_clip
from libreyolo.engine.verify import input_sensitive

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    write_moving_shapes_clip(path, 640, 360, frames=20, fps=30, objects=6, seed=0)
    return path


@pytest.fixture(scope="module")
def model():
    return input_sensitive(LibreYOLO.new("yolo9", "t", device="cuda", seed=0))


def test_video_captures_once_at_the_second_frame_and_equals_eager(model, clip):
    model.release_graphs()
    eager = model.predict(clip, imgsz=640, conf=0.1)
    model.release_graphs()
    model._predictor = None
    got, captures = [], []
    for r in model.predict(clip, imgsz=640, conf=0.1, cuda_graph="auto", stream=True):
        got.append(r)
        captures.append(model.graph_info()["captures"])
    info = model.graph_info()
    assert captures[0] == 0 and captures[1] == 1 and captures[-1] == 1, captures
    assert len(info["graphs"]) == 1 and "u8" in info["graphs"][0]["stage"]
    assert info["replays"] == len(got) - 1
    assert len(got) == len(eager) == 20
    for a, b in zip(eager, got):
        assert torch.equal(a.boxes.data.cpu(), b.boxes.data.cpu())


def test_tracking_on_the_graph_path_equals_eager_tracking(model, clip):
    pytest.importorskip("trackers", reason="tracking needs the 'track' extra (the trackers package)")
    model.release_graphs()
    eager = model.track(clip, imgsz=640, cuda_graph=False)
    graph = model.track(clip, imgsz=640, cuda_graph="auto")
    assert model.graph_info()["replays"] >= len(graph) - 2
    assert sum(len(r) for r in graph) > 0
    for a, b in zip(eager, graph):
        assert torch.equal(a.boxes.data.cpu(), b.boxes.data.cpu())
        assert torch.equal(a.boxes.id.cpu(), b.boxes.id.cpu())
