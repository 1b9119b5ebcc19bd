"""The YOLO recipe per batch: on the device (``DeviceAugment``, gpu_augment=True) vs the CPU
recipe (``DetectionDataset.__getitem__``, what each DataLoader worker does per sample).

    PYTHONPATH=. python3 benchmarks/gpu_augment.py --batch 64 --imgsz 640 --device cuda --json out.json

Both from the same letterboxed images (decoded once, up front), so decoding is left out: the
device figure is the median wall time of one ``DeviceAugment`` call (it ends with its one host
read, so it spans the GPU work), the CPU figure the median time of a batch of samples on one core
(divide by the worker count for a loader's rate). Built-in shapes images at ``--data-imgsz``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cpu-runs", type=int, default=3)
    ap.add_argument("--data-imgsz", type=int, default=640)
    ap.add_argument("--mixup", type=float, default=0.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    from libreyolo.data.augment import DetectionDataset, collate_detections
    from libreyolo.data.datasets import resolve_data
    from libreyolo.data.gpu_augment import DeviceAugment
    from libreyolo.data.synthetic import make_shapes_dataset

    with tempfile.TemporaryDirectory() as tmp:
        data = resolve_data(make_shapes_dataset(f"{tmp}/s", n_train=a.batch, n_val=2, imgsz=a.data_imgsz))
        dev_set = DetectionDataset(data.train, a.imgsz, augment=True, gpu_augment=True, mixup=a.mixup)
        cpu_set = DetectionDataset(data.train, a.imgsz, augment=True, mixup=a.mixup)
        for ds in (dev_set, cpu_set):
            ds.cache_images("ram", progress=False)
        raw = collate_detections([dev_set[i] for i in range(a.batch)])
    device = torch.device(a.device)
    batch = [t.to(device) for t in raw]
    aug = DeviceAugment(dev_set)
    aug.seed(0, 0)
    for _ in range(3):
        aug(*batch)
    times = []
    for _ in range(a.runs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        aug(*batch)
        times.append(time.perf_counter() - t)
    torch.set_num_threads(1)   # as in a DataLoader worker
    cpu_times = []
    for _ in range(a.cpu_runs):
        t = time.perf_counter()
        for i in range(a.batch):
            cpu_set[i]
        cpu_times.append(time.perf_counter() - t)
    res = {"batch": a.batch, "imgsz": a.imgsz, "device": torch.cuda.get_device_name(0) if device.type == "cuda"
           else a.device, "torch": torch.__version__, "mixup": a.mixup,
           "device_ms_per_batch": 1e3 * statistics.median(times),
           "cpu_one_core_ms_per_batch": 1e3 * statistics.median(cpu_times)}
    print(json.dumps(res, indent=2))
    if a.json:
        from libreyolo.benchmark import write_json
        write_json(res, a.json)


if __name__ == "__main__":
    main()
