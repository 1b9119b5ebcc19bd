"""The augmented samples of the two YOLO recipes side by side: the CPU recipe
(``DetectionDataset.__getitem__``) and the device recipe (``DeviceAugment`` on the batches a
``gpu_augment=True`` dataset's collate gives; on CPU tensors here, ``--device cuda`` for the GPU).

    PYTHONPATH=. python3 benchmarks/gpu_augment_stats.py --imgsz 160 --seeds 0 1 2 3 4 5 --json out.json

Per recipe, over ``--batches`` shuffled batches of ``--batch`` per seed (one epoch each, the
device recipe seeded once per epoch as the trainer does): boxes per image, the fraction of
images left without a box, quantiles of box width, height and centre (fractions of the image),
the fraction of small boxes (side under 5 % of the image), brightness (mean of max(r, g, b)) and
saturation ((max - min) / max), the fraction of grey-114 pixels (the padding; exact only with
``--no-hsv``, the value gain changes that grey), and how many distinct source images a batch
shows (mosaic partners included: each sample's own image and its partners; the CPU recipe's
partners from its draws, the device recipe's from ``DeviceAugment``'s). ``--pool 0`` is the
device recipe with batch-local partners. The built-in shapes set (320 train images).
"""
from __future__ import annotations

import argparse
import json


def quantiles(values, qs=(0.05, 0.25, 0.5, 0.75, 0.95)):
    import numpy as np
    return [round(float(v), 4) for v in np.quantile(np.asarray(values, dtype=float), qs)] if len(values) else []


def summarize(batches, s):
    """Statistics of an iterable of (images uint8 (B, 3, S, S), targets (B, M, 5), mask (B, M))."""
    import numpy as np
    n, w, h, cx, cy, bright, sat, grey = [], [], [], [], [], [], [], []
    for images, targets, mask in batches:
        images, targets, mask = images.cpu(), targets.cpu(), mask.cpu()
        for i in range(images.shape[0]):
            t = targets[i][mask[i]]
            n.append(len(t))
            w += ((t[:, 3] - t[:, 1]) / s).tolist()
            h += ((t[:, 4] - t[:, 2]) / s).tolist()
            cx += ((t[:, 3] + t[:, 1]) / 2 / s).tolist()
            cy += ((t[:, 4] + t[:, 2]) / 2 / s).tolist()
            x = images[i].float()
            mx, mn = x.amax(0), x.amin(0)
            bright.append(float(mx.mean()) / 255)
            sat.append(float(((mx - mn) / mx.clamp_min(1)).mean()))
            grey.append(float((images[i] == 114).all(0).float().mean()))
    n = np.asarray(n)
    side = np.sqrt(np.asarray(w) * np.asarray(h))
    return {"images": int(len(n)), "boxes_per_image": round(float(n.mean()), 3),
            "zero_box_images": round(float(np.mean(n == 0)), 4), "box_w": quantiles(w), "box_h": quantiles(h),
            "small_boxes": round(float(np.mean(side < 0.05)), 4), "centre_x": quantiles(cx),
            "centre_y": quantiles(cy), "brightness": quantiles(bright), "saturation": quantiles(sat),
            "grey114": round(float(np.mean(grey)), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--no-hsv", action="store_true")
    ap.add_argument("--pool", type=int, default=None, help="DeviceAugment's pool (default: POOL_IMAGES)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    from libreyolo.data.augment import DetectionDataset, collate_detections
    from libreyolo.data.datasets import resolve_data
    from libreyolo.data.gpu_augment import POOL_IMAGES, DeviceAugment, _Draw

    s, dev = a.imgsz, torch.device(a.device)
    data = resolve_data("shapes")
    hsv = dict(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0) if a.no_hsv else {}
    hyp = dict(mosaic=1.0, translate=0.1, scale=0.5, fliplr=0.5, **hsv)
    pool = POOL_IMAGES if a.pool is None else a.pool
    distinct = {"cpu": [], "device": []}

    def epoch(seed):
        """The shuffled batches' dataset indices of one epoch (as a shuffling loader draws them)."""
        order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(seed)).tolist()
        return [order[k * a.batch:(k + 1) * a.batch] for k in range(min(a.batches, len(order) // a.batch))]

    def cpu_batches(seed):
        ds = DetectionDataset(data.train, s, augment=True, **hyp)
        tiles = []   # every image a sample reads: its own and its mosaic partners
        real = ds._tile

        def tile(i):
            tiles.append(i)
            return real(i)

        ds._tile = tile
        torch.manual_seed(seed)
        for idx in epoch(seed):
            tiles.clear()
            batch = collate_detections([ds[i] for i in idx])
            distinct["cpu"].append(len(set(tiles)))
            yield batch

    def device_batches(seed):
        ds = DetectionDataset(data.train, s, augment=True, gpu_augment=True, **hyp)
        aug = DeviceAugment(ds, pool=pool)
        aug.seed(seed, 0)
        sources = []   # per pass: the pool rows its samples read
        real = _Draw.sample.__func__

        def sample(cls, aug_, own, pool_=None):
            d = real(cls, aug_, own, pool_)
            sources.append(d.src[d.mosaic].flatten().tolist() + d.src[~d.mosaic, 0].tolist())
            return d

        _Draw.sample = classmethod(sample)
        try:
            earlier = []   # the earlier batches' indices, as DeviceAugment keeps them (oldest first)
            for idx in epoch(seed):
                rows = list(idx) + [i for b in reversed(earlier) for i in b]   # DeviceAugment._pooled's order
                sources.clear()
                out = aug(*(t.to(dev) for t in collate_detections([ds[i] for i in idx])))
                distinct["device"].append(len({rows[j] for pass_ in sources for j in pass_}))
                earlier = (earlier + [list(idx)])[-len(aug._earlier):] if aug._earlier else []
                yield out
        finally:
            _Draw.sample = classmethod(real)

    result = {"imgsz": s, "batch": a.batch, "batches": a.batches, "seeds": a.seeds, "hsv": not a.no_hsv,
              "pool": pool, "device": a.device}
    for name, gen in (("cpu", cpu_batches), ("device", device_batches)):
        stats = summarize((b for seed in a.seeds for b in gen(seed)), s)
        stats["distinct_images_per_batch"] = round(sum(distinct[name]) / len(distinct[name]), 2)
        result[f"{name}_recipe"] = stats
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
