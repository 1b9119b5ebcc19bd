"""Record, or compare against a recorded file, the predict outputs of every detection family on a
fixed set of images (CPU, fp32): the proof that a refactor left detection unchanged bit for bit.

    python scripts/predict_snapshot.py record /tmp/before.pt
    python scripts/predict_snapshot.py compare /tmp/before.pt
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import input_sensitive

MODELS = [("yolo9", "t"), ("yolox", "n"), ("yolo7", "tiny"), ("rtmdet", "t"), ("picodet", "s"),
          ("rtdetr", "r18"), ("dfine", "n"), ("deimv2", "atto"), ("ec", "s")]


def images() -> list[np.ndarray]:
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    g = np.random.default_rng(0)
    return [np.asarray(pil), np.asarray(pil.resize((333, 517))), np.asarray(pil.rotate(180)),
            g.integers(0, 256, (240, 320, 3), dtype=np.uint8)]


def snapshot() -> dict[str, torch.Tensor]:
    out = {}
    ims = images()
    torch.manual_seed(0)
    for fam, size in MODELS:
        m = input_sensitive(LibreYOLO.new(fam, size, device="cpu", seed=0))
        for opts in ({"conf": 0.05}, {"conf": 0.2, "iou": 0.6, "max_det": 50}, {"conf": 0.05, "classes": [0, 1, 2]},
                     {"conf": 0.05, "agnostic_nms": True}):
            for batch in (1, 3):
                res = m(ims, imgsz=320, batch=batch, **opts)
                for i, r in enumerate(res):
                    out[f"{fam}-{size} {sorted(opts.items())} b{batch} img{i}"] = r.boxes.data.clone()
    return out


def main(argv: list[str]) -> int:
    verb, path = argv
    snap = snapshot()
    if verb == "record":
        torch.save(snap, path)
        print(f"recorded {len(snap)} outputs ({sum(len(v) for v in snap.values())} boxes) to {path}")
        return 0
    ref = torch.load(path, weights_only=True)
    bad = [k for k in ref if k not in snap or not torch.equal(ref[k], snap[k])]
    print(f"{len(ref) - len(bad)}/{len(ref)} outputs bitwise equal ({sum(len(v) for v in ref.values())} boxes)")
    for k in bad[:20]:
        print("DIFFERS:", k)
    return 1 if bad or set(snap) != set(ref) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
