"""The asynchronous training loop on a real GPU: each step's loss copied into pinned memory behind
the step and read one step late (LossFold's CUDA path), with the whole step captured.
The CPU tests (tests/unit/test_train_loop.py) cover the same loop where the step is synchronous."""
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.engine import trainer as T

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("loop") / "s", n_train=64, n_val=8, imgsz=128))


def train(tmp_path, data, monkeypatch, **kw):
    real, seen = T.Trainer.step, []

    def step(self, ni, batch):
        items = real(self, ni, batch)
        seen.append(items.clone())   # on the device: the test adds no sync to the loop
        return items

    monkeypatch.setattr(T.Trainer, "step", step)
    model = LibreYOLO.new("yolo9", "t", device="cuda")
    model.SUPPORTS_CUDA_GRAPH_TRAIN = True
    args = dict(data=data, epochs=3, batch=8, nbs=16, imgsz=128, workers=2, project=str(tmp_path), cuda_graph=True,
                amp="bf16", warmup_epochs=0, close_mosaic=1, verbose=True, plots=False)
    return model.train(**{**args, **kw}), seen


def test_async_epoch_means_are_the_host_fold_of_each_steps_items(data, tmp_path, monkeypatch):
    """The epoch means in history equal (mloss * i + items) / (i + 1) in float32 on the host over
    each step's items - what the synchronous loop computed - with graphs replaying, the progress
    bar's counts read from pinned memory, and the device time of the steps accounted."""
    res, seen = train(tmp_path, data, monkeypatch)
    assert res["cuda_graph"]["replays"] > 0 and res["cuda_graph"]["disabled_reason"] is None, res["cuda_graph"]
    nb = len(seen) // 3
    for epoch, row in enumerate(res["history"]):
        mloss = torch.zeros(len(res["loss_names"]))
        for i in range(nb):
            mloss = (mloss * i + seen[epoch * nb + i].float().cpu()) / (i + 1)
        assert [row[f"train/{n}_loss"] for n in res["loss_names"]] == [float(v) for v in mloss.tolist()], epoch
        assert 0.0 < row["time/step_device_s"] <= row["time/epoch_s"] + 1e-3, row
        assert 0.0 <= row["time/sync_wait_s"] <= row["time/epoch_s"], row


def test_a_non_finite_loss_on_cuda_names_its_epoch_and_batch(data, tmp_path, monkeypatch):
    real = T.Trainer.step
    bad = None

    def step(self, ni, batch):
        nonlocal bad
        items = real(self, ni, batch)
        if bad is None and ni == self.nb + 2:   # epoch 2, batch 2
            bad = ni
            return items * float("nan")
        return items

    monkeypatch.setattr(T.Trainer, "step", step)
    model = LibreYOLO.new("yolo9", "t", device="cuda")
    with pytest.raises(FloatingPointError, match=r"non-finite loss at epoch 2 batch 2: \[nan"):
        model.train(data=data, epochs=2, batch=8, imgsz=128, workers=2, project=str(tmp_path), warmup_epochs=0,
                    verbose=False, plots=False, val=False)


def test_host_copies_of_cuda_tensors_are_their_bytes_in_few_transfers(monkeypatch):
    """weights.host_copies on a device's tensors: the same values on the host, contiguous, each in
    its own memory, in one device-to-host transfer per dtype, CPU tensors alongside."""
    from libreyolo import weights as W
    g = torch.Generator(device="cuda").manual_seed(0)
    sources = [torch.randn(3, 4, 5, 6, device="cuda", generator=g).contiguous(memory_format=torch.channels_last),
               torch.randn(7, device="cuda", generator=g).to(torch.bfloat16), torch.tensor(3.5, device="cuda"),
               torch.randn(8, 8, device="cuda", generator=g)[:, 1:5], torch.arange(6, device="cuda"),
               torch.randn(5, 5, device="cuda", generator=g), torch.randn(4), torch.empty(0, device="cuda")]
    transfers = []
    real_to = torch.Tensor.to

    def counting_to(self, *a, **kw):
        out = real_to(self, *a, **kw)
        if self.is_cuda and out.device.type == "cpu":
            transfers.append(str(self.dtype))
        return out

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    copies = W.host_copies(sources)
    monkeypatch.setattr(torch.Tensor, "to", real_to)
    assert sorted(transfers) == ["torch.bfloat16", "torch.float32", "torch.int64"]
    for src, got in zip(sources, copies):
        assert got.device.type == "cpu" and got.dtype == src.dtype and got.shape == src.shape
        assert got.is_contiguous() and torch.equal(got, src.cpu())


def test_a_resumed_channels_last_whole_step_run_ends_as_an_uninterrupted_one(data, tmp_path, monkeypatch):
    """yolo9 trains channels_last on CUDA with the fused SGD inside the captured whole step; the
    fused update pairs parameter, gradient and momentum by memory position, so a momentum
    resumed in another layout is a silently wrong update. Interrupted after epoch 1 and resumed,
    the run's last.pt is the uninterrupted run's, within the distance of two uninterrupted runs
    (cuDNN's deterministic kernels: normally none), and every momentum is in its parameter's layout."""
    from interrupt import interrupted_after_last_pt  # tests/interrupt.py

    from libreyolo.weights import load_checkpoint
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    args = dict(data=data, epochs=2, batch=8, nbs=8, imgsz=128, workers=0, cuda_graph=True, amp="bf16",
                warmup_epochs=0, close_mosaic=0, verbose=False, plots=False, val=False, seed=0, name="run")

    def run(project, **kw):
        model = LibreYOLO.new("yolo9", "t", device="cuda", seed=0)
        model.SUPPORTS_CUDA_GRAPH_TRAIN = True
        return model.train(project=str(tmp_path / project), **{**args, **kw})

    res = run("a")
    assert res["cuda_graph"]["replays"] > 0 and res["cuda_graph"]["disabled_reason"] is None, res["cuda_graph"]
    run("a2")
    with interrupted_after_last_pt(monkeypatch):
        run("b")
    resumed = run("b", resume=True)
    assert resumed["cuda_graph"]["replays"] > 0, resumed["cuda_graph"]
    a, a2, b = (load_checkpoint(tmp_path / p / "run" / "weights" / "last.pt") for p in ("a", "a2", "b"))

    def tensors(ck):
        st = ck["train_state"]
        return ([*ck["model"].values(), *st["model_raw"].values()]
                + [s["momentum_buffer"] for _, s in sorted(st["optimizer"]["state"].items())])

    def distance(x, y):
        return max(float((u.float() - v.float()).abs().max()) if u.numel() else 0.0 for u, v in zip(tensors(x), tensors(y)))

    noise = distance(a, a2)
    assert distance(a, b) <= 10 * noise + 1e-6, (distance(a, b), noise)
    assert b["train_state"]["epoch"] == 1
    momenta = [s["momentum_buffer"] for s in b["train_state"]["optimizer"]["state"].values()]
    assert any(m.dim() == 4 and not m.is_contiguous() for m in momenta)   # the run was channels_last
    assert all(m.dim() != 4 or m.is_contiguous(memory_format=torch.channels_last) for m in momenta)
