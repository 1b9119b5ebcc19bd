"""SAM 2 tiny video step on a GPU: 30-frame parity of the captured track against eager and frames/s (docs/families.md, "SAM 2 and EdgeTAM")."""
import time

import numpy as np
import torch

from libreyolo.models.registry import get_family

m = get_family("sam2").new("tiny", device="cuda", seed=0)
yy, xx = np.mgrid[:720, :1280]
clip = [np.where((((xx - 300 - 20 * t) ** 2 + (yy - 360) ** 2) < (80 + 2 * t) ** 2)[..., None], 230, 30)
        .astype(np.uint8).repeat(3, 2) for t in range(30)]
runs, fps = {}, {}
for mode in (False, "auto"):
    for _ in range(2):   # warm-up: "auto" captures a signature (a bank fill) at its second sight
        m.track(clip[:20], points=[[300, 360]], cuda_graph=mode)
    torch.cuda.synchronize(); t = time.perf_counter()
    runs[mode] = m.track(clip, points=[[300, 360]], cuda_graph=mode)
    torch.cuda.synchronize(); fps[mode] = 30 / (time.perf_counter() - t)
same = all(torch.equal(a.masks.data, b.masks.data) and torch.equal(a.masks.scores, b.masks.scores)
           for a, b in zip(runs[False], runs["auto"]))
print("30-frame parity", same, "fps eager", fps[False], "captured", fps["auto"], "ratio", fps["auto"] / fps[False])
