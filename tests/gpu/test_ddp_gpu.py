"""Distributed training with CUDA-graph capture on real GPUs (NCCL), through torchrun.

Each test starts ``ddp_gpu_child.py`` under ``python -m torch.distributed.run --standalone`` (the
launcher the library uses) and reads the ranks' reports:

* one GPU, world size 1: the NCCL all-reduce of the flat gradient buffer captured inside the
  whole training step; step-0 loss of the replay bitwise equal to eager; a 20-step curve within
  eager's own run-to-run spread; ``Trainer.train(cuda_graph=True)`` replays the captured step;
* two GPUs (skipped with fewer): the same per rank, and the ranks agreeing on the reduced losses.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from libreyolo import launch as L
from libreyolo.data.synthetic import make_shapes_dataset

pytestmark = pytest.mark.cuda

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


sys.path.insert(0, str(HERE))
import ddp_gpu_child  # noqa: E402


def run_ranks(tmp_path: Path, nproc: int) -> list[dict]:
    data = make_shapes_dataset(tmp_path / "s", n_train=64, n_val=8, imgsz=128, seed=0)
    out = tmp_path / "report.json"
    env = L.launch_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = L.torchrun_command(nproc, [str(HERE / "ddp_gpu_child.py"), str(data), str(out)])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"torchrun exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return [json.loads((tmp_path / f"report.rank{r}.json").read_text()) for r in range(nproc)]


def _gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def check_rank(rep: dict) -> None:
    eager, graph = rep["eager"], rep["graph"]
    assert graph["whole_step"], "the trainer did not take the whole-step path"
    g = graph["graph"]
    assert g["disabled_reason"] is None and g["captures"] >= 1 and g["replays"] >= 19, g
    # step 0 is the first replay of the captured whole step (all-reduce included): bitwise eager's
    assert graph["local_loss_hex"][0] == eager[0]["local_loss_hex"][0], (graph["local_loss"][0],
                                                                          eager[0]["local_loss"][0])
    assert graph["items"][0] == eager[0]["items"][0]
    curves = [e["local_loss"] for e in eager]
    noise = max(_gap(a, b) for i, a in enumerate(curves) for b in curves[i + 1:])
    diff = max(_gap(graph["local_loss"], e) for e in curves)
    assert diff <= max(2 * noise, 1e-5 * max(abs(v) for v in curves[0])), (noise, diff)
    t = rep["train"]["cuda_graph"]
    assert t["replays"] > 0 and t["disabled_reason"] is None, t


def test_world_size_one_nccl_captures_the_all_reduce_in_the_whole_step(tmp_path):
    (rep,) = run_ranks(tmp_path, 1)
    assert rep["world"] == 1
    check_rank(rep)
    # one rank in a process group computes what a run without one computes: the same step 0, and a
    # curve within eager's own spread (the share helpers and the all-reduce change no arithmetic)
    data = str(tmp_path / "s" / "data.yaml")
    plain = ddp_gpu_child.steps(data, str(tmp_path / "plain"), False, ddp_gpu_child.make_batches(data, 1), 0, 1)
    assert plain["local_loss_hex"][0] == rep["eager"][0]["local_loss_hex"][0]
    curves = [e["local_loss"] for e in rep["eager"]]
    noise = max(_gap(a, b) for i, a in enumerate(curves) for b in curves[i + 1:])
    assert max(_gap(plain["local_loss"], c) for c in curves) <= max(2 * noise, 1e-5 * max(abs(v) for v in curves[0]))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (nvidia-h200-x2)")
def test_two_ranks_eager_vs_captured_ddp(tmp_path):
    reps = run_ranks(tmp_path, 2)
    for rep in reps:
        check_rank(rep)
    # the reduced items are the global batch's: the same on both ranks, step by step
    for a, b in zip(reps[0]["graph"]["items"], reps[1]["graph"]["items"]):
        assert a == b
    assert reps[0]["train"]["losses"] == reps[1]["train"]["losses"]
    # each rank back-propagates its own share: the two local losses differ (different images)
    assert reps[0]["graph"]["local_loss"][0] != reps[1]["graph"]["local_loss"][0]
