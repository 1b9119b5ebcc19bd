"""Helpers of the parity protocol that need no GPU."""
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.engine.verify import input_sensitive


def test_input_sensitive_copy_of_untrained_model_is_independent():
    m = LibreYOLO.new("yolo9", "t", device="cpu", seed=0)
    twin = input_sensitive(m)
    assert twin is not m and twin.model is not m.model and twin.runner is not m.runner
    assert twin.get_predictor().model is twin
    x1, x2 = torch.randn(1, 3, 64, 64), 3 * torch.rand(1, 3, 64, 64) + 2
    with torch.no_grad():
        assert not torch.equal(twin.infer(x1)[1], twin.infer(x2)[1])
    assert torch.all(m.model.head.cv3[0][2].bias == -10.0), "the original model must be untouched"
    assert not torch.equal(m.model.backbone.conv0.conv.weight, twin.model.backbone.conv0.conv.weight)
    trained = LibreYOLO.new("yolo9", "t", device="cpu")
    trained.trained = True
    assert input_sensitive(trained) is trained


@pytest.fixture
def tf32_restored():
    """Put the process-wide TF32 switches back after the test. Not monkeypatch: with torch 2.14
    ``allow_tf32`` is served by the backend module's ``__getattr__``, which pytest's monkeypatch
    records as an absent attribute and then fails to delete at teardown."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_bench_cli_on_cpu_records_its_settings(tmp_path, tf32_restored):
    """`libreyolo bench` runs its eager arms on the CPU, skips the graph arms, and the JSON names
    the device, torch version, date and the TF32 settings it ran under."""
    import json

    from libreyolo.cli import main

    torch.backends.cudnn.allow_tf32 = True    # the bench's tf32=false must switch both off
    torch.backends.cuda.matmul.allow_tf32 = True
    out = tmp_path / "b.json"
    assert main(["bench", "model=yoloxn", "imgsz=64", "runs=2", "warmup=1", "device=cpu", "tf32=false",
                 f"json={out}"]) == 0
    res = json.loads(out.read_text())
    assert res["tf32"] == {"cudnn": False, "matmul": False}
    assert res["model"] == "yolox-n" and res["torch"] == torch.__version__ and res["date"]
    assert {"forward_eager", "predict_eager"} <= set(res["arms"]) and "forward_graph" not in res["arms"]


def test_cli_seed_covers_the_initial_weights():
    """`libreyolo train model=<family/size> seed=N` starts from the same weights every time."""
    from libreyolo.cli import _load

    a = _load({"model": "yolox-n", "device": "cpu"}, seed=3).model.state_dict()
    b = _load({"model": "yolox-n", "device": "cpu"}, seed=3).model.state_dict()
    c = _load({"model": "yolox-n", "device": "cpu"}, seed=4).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_the_post_cases_capture_the_stage_at_a_low_threshold():
    """The "+post" parity cases run the stage with conf at VERIFY_CONF (a threshold is an input of
    the graph, so nothing captured changes): an untrained network's candidates stay in the outputs,
    so the two probes differ; a task without a conf keeps its defaults."""
    from libreyolo.engine.verify import VERIFY_CONF, verify_plan
    det = LibreYOLO.new("yolo2", "t", nc=3, device="cpu", seed=0)
    plan = verify_plan(det, det.get_predictor(), 64)
    assert plan.conf == VERIFY_CONF < det.task_def.predict_defaults["conf"]
    depth = LibreYOLO.new("zipdepth", "b", device="cpu", seed=0)
    assert verify_plan(depth, depth.get_predictor(), 64) is not None
