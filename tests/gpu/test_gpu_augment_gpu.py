"""gpu_augment on CUDA: the batched YOLO recipe (libreyolo.data.gpu_augment) gives on the GPU what
the same code gives on the CPU for the same batch and seed, and a training run with it and
cuda_graph=True replays its captured step. Run through scripts/gpu-check."""
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.data.augment import DetectionDataset, collate_detections
from libreyolo.data.datasets import resolve_data
from libreyolo.data.gpu_augment import DeviceAugment
from libreyolo.data.synthetic import make_shapes_dataset

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(make_shapes_dataset(tmp_path_factory.mktemp("gpuaug") / "s", n_train=64, n_val=8, imgsz=256))


@pytest.mark.parametrize("hyp", [dict(), dict(mosaic=0.5, degrees=10.0, mixup=0.5), dict(dense_mosaic=True)],
                         ids=["default", "mixed-rotated-mixup", "dense"])
@pytest.mark.parametrize("resize", ["topleft", "center"])
def test_cuda_equals_cpu_for_the_same_batch_and_seed(data, hyp, resize):
    """The random numbers are drawn on the host, so both devices use the same ones; the boxes are
    the same float arithmetic (equal), the images the same up to grid_sample's and the colour
    multiply-adds' last bits (at most one grey level, on very few pixels)."""
    ds = DetectionDataset(resolve_data(data).train, 320, augment=True, gpu_augment=True, resize=resize, **hyp)
    raw = collate_detections([ds[i] for i in range(16)])
    aug = DeviceAugment(ds)
    for epoch in range(3):
        aug.seed(0, epoch)
        cpu = aug(*raw)
        aug.seed(0, epoch)
        gpu = aug(*(t.cuda() for t in raw))
        assert all(g.is_cuda for g in gpu)
        diff = (gpu[0].cpu().int() - cpu[0].int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, (diff.max(), (diff > 0).float().mean())
        assert torch.equal(gpu[2].cpu(), cpu[2])
        torch.testing.assert_close(gpu[1].cpu(), cpu[1], atol=1e-4, rtol=0)


def test_training_with_gpu_augment_replays_the_captured_step(tmp_path, data, monkeypatch):
    """gpu_augment + cuda_graph: the augmentation runs before the captured step, outside it; the
    step is captured and replayed (the bucketed target count keeps its shapes few), losses finite."""
    calls = []
    real = DeviceAugment.__call__

    def counted(self, *batch):
        calls.append(batch[0].device.type)
        return real(self, *batch)

    monkeypatch.setattr(DeviceAugment, "__call__", counted)
    model = LibreYOLO.new("yolo9", "t", device="cuda")
    res = model.train(data=data, epochs=3, batch=8, nbs=8, imgsz=128, workers=2, project=str(tmp_path),
                      cuda_graph=True, amp="bf16", gpu_augment=True, warmup_epochs=0, close_mosaic=1,
                      verbose=False)
    g = res["cuda_graph"]
    assert g["replays"] > 0 and g["disabled_reason"] is None, g
    assert calls and set(calls) == {"cuda"} and len(calls) == 3 * (64 // 8)
    assert all(v == v for row in res["losses"] for v in row)
