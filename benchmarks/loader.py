"""The training loader's CPU cost: samples/s of the detection datasets and batches/s of a DataLoader.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/loader.py --imgsz 320 640 --workers 2

Per image size, in this process on one torch thread (what each DataLoader worker does):

* ``train``: ``DetectionDataset(augment=True)`` with the YOLO recipe's defaults (mosaic of four
  decoded and letterboxed images, the random affine, the colour matrix, the flip), samples/s;
* ``val``: ``DetectionDataset(augment=False)`` (decode + predict's letterbox), samples/s;
* with ``--workers N`` (N > 0): batches/s of the training set through a DataLoader of N worker
  processes (``collate_detections``, ``--batch``), over ``--batches`` batches after the workers'
  first batch.

Images: the built-in shapes set with its images' long side at ``--data-imgsz`` (default: the
measured size, so nothing is resized; the 320 px set is ``resolve_data("shapes")``, others are
generated once under the datasets folder). ``--cache ram`` decodes and letterboxes every image up
front (``cache=ram``), which leaves the augmentation alone. The per-sample figures are samples
per second of this thread's CPU time (``time.thread_time``: a shared machine's other load stays
out of them), the best of ``--repeats`` passes; the DataLoader's is wall time.
"""
from __future__ import annotations

import argparse
import functools
import json
import time


def _dataset(data_imgsz: int):
    from libreyolo.data.datasets import resolve_data
    from libreyolo.data.synthetic import make_shapes_dataset

    if data_imgsz == 320:
        return resolve_data("shapes")
    return resolve_data(make_shapes_dataset(n_train=128, n_val=32, imgsz=data_imgsz))


def _rate(ds, n: int, repeats: int, seed: int) -> float:
    """Best samples per CPU second of this thread over ``repeats`` passes of ``n`` samples."""
    import torch

    best = 0.0
    for r in range(repeats):
        torch.manual_seed(seed + r)
        t = time.thread_time()
        for i in range(n):
            ds[i % len(ds)]
        best = max(best, n / (time.thread_time() - t))
    return best


def _loader_rate(ds, workers: int, batch: int, batches: int) -> float:
    import torch
    from torch.utils.data import DataLoader

    from libreyolo.data.augment import collate_detections

    loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                        collate_fn=functools.partial(collate_detections, bucket=16),
                        persistent_workers=True, generator=torch.Generator().manual_seed(0))
    done, t = 0, None
    while done < batches:
        for _ in loader:
            if t is None:   # the workers are up and have filled their prefetch
                t = time.perf_counter()
                continue
            done += 1
            if done == batches:
                break
    return batches / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--imgsz", type=int, nargs="+", default=[320, 640])
    ap.add_argument("--data-imgsz", type=int, default=0, help="long side of the images (default: --imgsz)")
    ap.add_argument("--samples", type=int, default=200, help="samples per timed pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="also time a DataLoader with this many workers")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--cache", choices=["false", "ram"], default="false")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    from libreyolo.data.augment import DetectionDataset

    torch.set_num_threads(1)
    rows = []
    for s in a.imgsz:
        data = _dataset(a.data_imgsz or s)
        train = DetectionDataset(data.train, s, augment=True)
        val = DetectionDataset(data.val, s, augment=False)
        if a.cache == "ram":
            for ds in (train, val):
                ds.cache_images("ram", progress=False)
        for ds in (train, val):   # warm-up: file cache, allocator
            _rate(ds, 8, 1, 0)
        row = {"imgsz": s, "data_imgsz": a.data_imgsz or s, "cache": a.cache,
               "train_samples_s": _rate(train, a.samples, a.repeats, 0),
               "val_samples_s": _rate(val, a.samples, a.repeats, 0)}
        line = (f"imgsz {s} (images {row['data_imgsz']} px, cache {a.cache}): train {row['train_samples_s']:.1f} "
                f"samples/s ({1e3 / row['train_samples_s']:.2f} ms), val {row['val_samples_s']:.1f} samples/s "
                f"({1e3 / row['val_samples_s']:.2f} ms)")
        if a.workers > 0:
            row["workers"], row["batch"] = a.workers, a.batch
            row["loader_batches_s"] = _loader_rate(train, a.workers, a.batch, a.batches)
            line += f"; DataLoader {a.workers} workers, batch {a.batch}: {row['loader_batches_s']:.2f} batches/s"
        print(line, flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
