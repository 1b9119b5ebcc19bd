"""Distributed training on the CPU: a 2-process gloo run through the trainer's own code path
(ddp_child.py, one forked process per rank), and the launch plumbing (device lists, the torchrun
command line) without starting anything.

What the run must show: the gradients of 2 ranks x 4 images equal one process's of the 8 (the
share rule of the five YOLO-style losses, and the mean rule), capture decided by all ranks
together, weights equal on both ranks after every step, each image once per epoch across the
ranks, rank 0 alone writing the run folder, resume from last.pt on both ranks, and a rank that
dies stopping the run with a clear error on rank 0 (last.pt intact)."""
import csv
import json
import multiprocessing
import socket
import sys
from pathlib import Path

import pytest
import torch

from libreyolo import distributed as D
from libreyolo import launch as L
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.options import OptionError
from libreyolo.weights import load_checkpoint

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ddp_child  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32" or not torch.distributed.is_gloo_available(),
                                reason="fork and gloo")

WORLD = 2
N_TRAIN = 16


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now (held open together while they are picked)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _rank(rank, ports, data, project, out):
    ddp_child.main(rank, WORLD, ports, data, project, out)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both ranks' reports (forked from this process: torch is imported once) and the project."""
    root = tmp_path_factory.mktemp("ddp")
    data = str(make_shapes_dataset(root / "ds", n_train=N_TRAIN, n_val=4, imgsz=64, seed=0))
    project, out = root / "runs", root / "out"
    out.mkdir()
    ctx = multiprocessing.get_context("fork")
    ports = _free_ports(4)
    procs = [ctx.Process(target=_rank, args=(r, ports, data, str(project), str(out)), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    reports = [json.loads((out / f"rank{r}.json").read_text()) if (out / f"rank{r}.json").is_file() else {}
               for r in range(WORLD)]
    for r, rep in enumerate(reports):
        assert "crash" not in rep, f"rank {r} crashed:\n{rep['crash']}"
    return reports, project, [p.exitcode for p in procs]


@pytest.mark.parametrize("family", [f for f, _ in ddp_child.SHARE_FAMILIES])
def test_two_ranks_of_half_the_batch_give_one_process_gradients(ranks, family):
    reports, _, _ = ranks
    g = reports[0]["grads"][family]
    assert g["rule"] == "sum"   # the loss's share of the global batch, gradients summed
    assert g["grad_norm"] > 0
    assert g["allclose"], f"2 ranks x 4 images != 1 process x 8 images (max relative diff {g['max_rel_diff']:.3g})"
    # float rounding only (measured ~1e-8 of the largest gradient); each rank dividing by its own
    # normalizers instead of the global ones is off by 1.6e-4 (yolo7) to 1.0 (yolox) with either rule
    assert g["max_rel_diff"] < 1e-5
    assert g["items_close"], "the summed loss items are not the one-process items"
    assert all(r["grads"][family]["views_kept"] for r in reports), "backward replaced the gradient views"


def test_the_mean_rule_gives_one_process_gradients_of_a_per_sample_mean(ranks):
    reports, _, _ = ranks
    assert reports[0]["grads"]["mean_rule_close"], "averaged gradients != the one-process gradient"


def test_a_capture_that_failed_on_one_rank_is_dropped_on_every_rank(ranks):
    reports, _, _ = ranks
    a0, a1 = reports[0]["agree"], reports[1]["agree"]
    assert not a0["active"] and not a1["active"]
    assert "another rank" in a0["disabled_reason"] and "capture failed" in a1["disabled_reason"]
    assert a0["replays"] == a1["replays"] == 0 and a0["eager_steps"] == a1["eager_steps"]
    assert a0["weights_same"] and a1["weights_same"]


def test_weights_equal_on_both_ranks_after_every_step(ranks):
    reports, _, _ = ranks
    for part in ("run", "resume"):
        for r in reports:
            assert r[part]["same"] and all(r[part]["same"]), f"{part}: the ranks' weights differ after a step"
    assert reports[0]["run"]["local_batches"] == [4, 4, 4, 4]   # global batch 8 over 2 ranks


def test_the_ranks_step_with_the_same_target_rows(ranks):
    """Each rank's collate pads its targets to its own row count (16 on rank 0, 32 on rank 1
    here); the step pads both to the larger, so the ranks run - and would capture - the same
    shapes at the same steps."""
    reports, _, _ = ranks
    for part in ("run", "resume"):
        r0, r1 = (r[part]["rows"] for r in reports)
        assert len(r0) == len(r1) > 0
        assert [a for _, a in r0] == [a for _, a in r1]
        assert all(a == max(l0, l1) for (l0, a), (l1, _) in zip(r0, r1))
    assert any(own < agreed for own, agreed in reports[0]["run"]["rows"])


def test_every_image_once_per_epoch_across_the_ranks(ranks):
    reports, _, _ = ranks
    for epoch in (0, 1):
        per_rank = [[i for e, i in r["run"]["seen"] if e == epoch] for r in reports]
        assert all(len(s) == N_TRAIN // WORLD for s in per_rank)
        assert sorted(per_rank[0] + per_rank[1]) == list(range(N_TRAIN)), f"epoch {epoch}: images missed or twice"
    orders = [[i for e, i in reports[0]["run"]["seen"] if e == epoch] for epoch in (0, 1)]
    assert orders[0] != orders[1], "the sampler did not reshuffle between epochs"


def test_rank_zero_alone_writes_the_run_folder(ranks):
    reports, project, _ = ranks
    assert sorted(p.name for p in project.iterdir()) == ["fault", "run"]   # rank 1 made no folder of its own
    run = project / "run"
    assert reports[0]["run"]["run_dir"] == reports[1]["run"]["run_dir"] == str(run)
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]   # two epochs, then the resumed third
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["best.pt", "last.pt"]
    # every rank returns rank 0's account of the run (its losses are the global-batch ones)
    assert reports[0]["run"]["losses"] == reports[1]["run"]["losses"] and len(reports[0]["run"]["losses"]) == 2


def test_resume_loads_last_pt_on_every_rank(ranks):
    reports, project, _ = ranks
    for r in reports:
        assert r["resume"]["start_epoch"] == 2 and r["resume"]["epochs"] == 1
        assert r["run"]["group_left"] and r["resume"]["group_left"]   # the trainer left the group it joined
    st = load_checkpoint(project / "run" / "weights" / "last.pt")["train_state"]
    assert st["epoch"] == 2


def test_a_rank_that_dies_stops_the_run_with_a_clear_error_on_rank_zero(ranks):
    reports, project, exitcodes = ranks
    f = reports[0]["fault"]
    assert f.get("error_type") == "TrainingError", f
    assert "rank 0 of 2" in f["error"] and "a collective failed" in f["error"]
    assert "holds epoch 1" in f["error"] and "resume=True" in f["error"]
    assert exitcodes == [0, 3]
    ck = load_checkpoint(project / "fault" / "weights" / "last.pt")   # still loadable
    assert ck["train_state"]["epoch"] == 0


# ------------------------------------------------------------------------------------ launching


def test_device_lists():
    assert D.parse_devices("0,1") == [0, 1]
    assert D.parse_devices([2, 3]) == [2, 3]
    assert D.parse_devices("cuda:0,cuda:1") == [0, 1]
    for one in ("auto", "cpu", "cuda", "cuda:1", 0, "0", [0], None):
        assert D.parse_devices(one) is None
    with pytest.raises(OptionError, match="twice"):
        D.parse_devices("0,0")
    with pytest.raises(OptionError, match="not a GPU index"):
        D.parse_devices("0,cpu")


def test_local_device_follows_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert D.local_device("2,5") == "cuda:5"
    assert D.local_device("cpu") == "cpu"
    with pytest.raises(D.DistributedError, match="lists 2 GPUs"):
        monkeypatch.setenv("LOCAL_RANK", "2")
        D.local_device("2,5")


def test_cli_train_builds_the_torchrun_command(monkeypatch):
    from libreyolo import cli
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    launched = []
    monkeypatch.setattr(L, "launch", lambda cmd, env=None: launched.append(list(cmd)) or 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # as on a 2-GPU machine (nothing runs on them)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    argv = ["train", "model=yolo9t", "device=0,1", "batch=32", "epochs=3"]
    assert cli.main(argv) == 0
    assert launched == [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "-m", "libreyolo.cli", "train", "model=yolo9t", "device=0,1", "batch=32", "epochs=3"]]
    assert cli.main(["train", "device=0,x"]) == 2   # a bad list fails before any launch
    assert cli.main(["train", "device=0,2"]) == 2   # a GPU this machine does not have
    assert len(launched) == 1


def test_model_train_with_a_gpu_list_launches_torchrun(monkeypatch, tmp_path):
    from libreyolo import LibreYOLO
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    seen = {}

    def fake_launch(cmd, env=None):
        seen["cmd"] = list(cmd)
        spec = json.loads(Path(cmd[-1]).read_text())
        seen["spec"] = spec
        return 1   # as if a rank failed: the call must say so
    monkeypatch.setattr(L, "launch", fake_launch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    with pytest.raises(D.DistributedError, match="exit status 1"):
        model.train(data="shapes", device=[0, 1], epochs=2, batch=16)
    assert seen["cmd"][:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert seen["cmd"][6:8] == ["-m", "libreyolo.launch"]
    assert seen["spec"]["kwargs"] == {"data": "shapes", "device": "0,1", "epochs": 2, "batch": 16}
    assert seen["spec"]["family"] == "yolo9" and seen["spec"]["trained"] is False


def test_batch_must_divide_by_the_ranks():
    d = D.Distributed.__new__(D.Distributed)
    d.world = 3
    assert d.local_batch(48) == 16
    with pytest.raises(OptionError, match="multiple of 3"):
        d.local_batch(16)


def test_share_helpers_are_the_identity_outside_a_distributed_step():
    t = torch.tensor([2.5])
    assert D.global_sum(t) is t and D.global_batch(8) == 8 and D.share_of_mean(t, 4) is t
    with D.loss_share():   # no process group: still the identity
        assert D.global_sum(t) is t and D.global_batch(8) == 8


def test_gradient_views_keep_channels_last_strides():
    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    lin = torch.nn.Linear(4, 2)
    params = list(conv.parameters()) + list(lin.parameters())
    r = D.GradientReducer(params, world=1, mean=False)
    assert conv.weight.grad.stride() == conv.weight.stride()
    assert r.flat.numel() == sum(p.numel() for p in params) and r.attached()
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    conv(x).sum().backward()
    assert r.attached() and r.flat.abs().sum() > 0   # autograd accumulated into the buffer


def test_model_train_gpu_list_round_trip_loads_the_trained_weights(monkeypatch, tmp_path):
    """train_from_python's plumbing without GPUs: the 'launch' runs the rank entry point in this
    process on the CPU (as a one-process run); the model must come back with best.pt's weights
    (last.pt's: val=False), its head rebuilt for the data's 5 classes."""
    from libreyolo import LibreYOLO
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    data = make_shapes_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64, seed=0)

    monkeypatch.setattr(L, "check_gpus", lambda gpus: None)   # no GPUs here: the rank below trains on the CPU

    def run_rank_here(cmd, env=None):
        spec_path = Path(cmd[-1])
        spec = json.loads(spec_path.read_text())
        spec["kwargs"]["device"] = "cpu"
        spec_path.write_text(json.dumps(spec))
        return L.rank_main(str(spec_path))
    monkeypatch.setattr(L, "launch", run_rank_here)
    model = LibreYOLO.new("yolo9", "t", nc=80, device="cpu", seed=0)
    res = model.train(data=str(data), device="0,1", epochs=1, batch=8, imgsz=64, workers=0, val=False,
                      plots=False, verbose=False, project=str(tmp_path / "runs"), warmup_epochs=0)
    assert res["epochs"] == 1 and Path(res["last"]).is_file()
    last = load_checkpoint(res["last"])
    assert model.nc == 5 and model.trained
    sd = model.model.state_dict()
    assert all(torch.equal(sd[k].cpu(), v) for k, v in last["model"].items())
    assert model.ckpt_path == res["best"]


def test_sync_batchnorm_round_trip_shares_the_tensors():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                              torch.nn.Sequential(torch.nn.BatchNorm2d(4)))
    tensors = [id(t) for t in list(net.parameters()) + list(net.buffers())]
    keys = list(net.state_dict())
    D.convert_sync_batchnorm(net)
    assert isinstance(net[1], torch.nn.SyncBatchNorm) and isinstance(net[2][0], torch.nn.SyncBatchNorm)
    assert list(net.state_dict()) == keys
    D.revert_sync_batchnorm(net)
    assert type(net[1]) is torch.nn.BatchNorm2d and type(net[2][0]) is torch.nn.BatchNorm2d
    assert [id(t) for t in list(net.parameters()) + list(net.buffers())] == tensors


def test_sync_bn_outside_a_distributed_run_is_refused(monkeypatch):
    from libreyolo import LibreYOLO
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    with pytest.raises(OptionError, match="sync_bn=True synchronizes BatchNorm"):
        model.train(data="shapes", sync_bn=True, epochs=1)


def test_a_gpu_list_beyond_the_machine_is_refused_before_launching(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(OptionError, match=r"asks for GPU\(s\) 1, but this machine has 1 CUDA GPU"):
        L.check_gpus([0, 1])


class _Ranked(D.Distributed):
    """A Distributed of one rank whose broadcast is recorded (rank 0) or answered from
    ``answer`` (the others), in place of a process group: main_first's order and errors."""

    def __init__(self, rank: int, calls: list, answer=None):
        self.rank, self.world, self.calls, self.answer = rank, WORLD, calls, answer

    def broadcast_object(self, obj):
        self.calls.append(("broadcast", obj))
        return obj if self.rank == 0 else self.answer


def test_main_first_runs_rank_0_before_the_others_and_passes_its_failure_on():
    calls = []
    work = lambda: calls.append("work") or "data"   # noqa: E731
    assert _Ranked(0, calls).main_first(work, "prepare data") == "data"
    assert calls == ["work", ("broadcast", None)]   # rank 0: the work, then the others are let go
    calls.clear()
    assert _Ranked(1, calls).main_first(work, "prepare data") == "data"
    assert calls == [("broadcast", None), "work"]   # the others: rank 0's word first, then the work

    def bad():
        raise ValueError("data.yaml: no 'names'")

    calls.clear()
    with pytest.raises(ValueError, match="no 'names'"):
        _Ranked(0, calls).main_first(bad, "prepare data='d.yaml'")
    assert calls == [("broadcast", "ValueError: data.yaml: no 'names'")]
    calls.clear()
    with pytest.raises(D.DistributedError, match=r"rank 0 could not prepare data='d.yaml': ValueError: data.yaml"):
        _Ranked(1, calls, answer="ValueError: data.yaml: no 'names'").main_first(work, "prepare data='d.yaml'")
    assert "work" not in calls
