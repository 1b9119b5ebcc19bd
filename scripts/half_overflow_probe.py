"""Where a family's half-precision network leaves the finite numbers (GPU; issue 15's contract).

    PYTHONPATH=. python3 scripts/half_overflow_probe.py --family picodet --size s [--epochs 30] \
        [--precision fp16] [--json FILE] [--save trained.pt]   (--epochs 0 --device cpu --precision bf16:
        a smoke run on untrained weights)

Trains the family briefly on the demo's built-in shapes, as ``scripts/fast_contract.py`` does (the
same recipe and data, so the weights are like the ones its contract was measured on), then runs
the contract's images (the sample image in five variants, 16 shapes validation images) through
two copies of the network made by the fast path's ``make_half``: one in float32 and one in the
half dtype (BatchNorm folded, channels_last, as predict runs it). Forward hooks on every module
record the largest magnitude of its outputs in each copy and whether the half copy's are finite.

Prints, in execution order: the first modules whose half output holds inf or NaN, the modules
whose float32 output already exceeds the half dtype's largest finite value (where the overflow is
the network's range, not rounding), and how many of the half path's final scores are NaN.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fast_contract import FAMILIES, real_images, train_briefly  # noqa: E402

from libreyolo import LibreYOLO  # noqa: E402
from libreyolo.cli import DEMO_DATA  # noqa: E402
from libreyolo.data.datasets import resolve_data  # noqa: E402
from libreyolo.data.synthetic import make_shapes_dataset  # noqa: E402
from libreyolo.engine.fastpath import DTYPES, make_half  # noqa: E402


def trained(fam: str, size: str, epochs: int, data_yaml: str, data, device: str):
    m = LibreYOLO.new(fam, size, nc=data.nc, names=data.names, device=device, seed=0)
    if epochs == 0:   # untrained seed-0 weights (a smoke run of this script)
        return m
    train_briefly(m, data_yaml, epochs)   # as the contract's weights are trained
    return m


def magnitudes(net: torch.nn.Module, call) -> tuple[dict[str, tuple[float, bool]], object]:
    """``call()`` (the family's ``infer`` on ``net``) with a hook on every module of ``net``:
    name -> (largest |output| over its tensors, all finite), and the call's result."""
    seen: dict[str, tuple[float, bool]] = {}
    hooks = []

    def hook(name):
        def fn(_mod, _inp, out):
            ts = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
            if not ts:
                return
            finite = all(bool(torch.isfinite(t).all()) for t in ts)
            big = max(float(t.detach().float().abs().max()) for t in ts)
            prev = seen.get(name)
            seen[name] = (big, finite) if prev is None else (max(prev[0], big), prev[1] and finite)
        return fn
    for name, mod in net.named_modules():
        if name:
            hooks.append(mod.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            out = call()
    finally:
        for h in hooks:
            h.remove()
    return seen, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="picodet")
    ap.add_argument("--size", default=None)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--precision", default="fp16", choices=sorted(DTYPES))
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--save", default=None, help="write the trained checkpoint here")
    a = ap.parse_args()
    size = a.size or dict(FAMILIES)[a.family]
    data_yaml = str(make_shapes_dataset(**DEMO_DATA))
    data = resolve_data(data_yaml)
    m = trained(a.family, size, a.epochs, data_yaml, data, a.device)
    if a.save:
        m.save(a.save)
    dtype = DTYPES[a.precision]
    limit = float(torch.finfo(dtype).max)
    f32, half = make_half(m.model, torch.float32, m.fused), make_half(m.model, dtype, m.fused)
    images = real_images() + [np.asarray(Image.open(s.image).convert("RGB")) for s in data.val[:16]]
    report: dict = {"family": a.family, "size": size, "precision": a.precision, "limit": limit, "images": []}
    for i, img in enumerate(images):
        u8 = torch.from_numpy(np.ascontiguousarray(img)).unsqueeze(0).to(a.device)
        x32 = m.preprocess(u8, a.imgsz).float().contiguous(memory_format=torch.channels_last)
        xh = x32.to(dtype)
        mag32, _ = magnitudes(f32, lambda: m.infer_with(f32)(x32))
        magh, (_, scores, _) = magnitudes(half, lambda: m.infer_with(half)(xh))
        # the hooks fire as modules finish (children before their parents): in that order, the first
        # non-finite entry is the innermost module that first made inf or NaN
        bad = [n for n, (_, finite) in magh.items() if not finite]
        over = [n for n, (big, _) in mag32.items() if big > limit]
        report["images"].append({
            "image": i, "first_nonfinite": bad[:8], "nonfinite_modules": len(bad),
            "fp32_over_limit": [(n, mag32[n][0]) for n in over[:8]],
            "largest_fp32": sorted(((mag32[n][0], n) for n in mag32), reverse=True)[:5],
            "nan_scores": int(torch.isnan(scores.float()).sum()), "scores": int(scores.numel())})
        r = report["images"][-1]
        print(f"image {i}: NaN scores {r['nan_scores']}/{r['scores']}; first non-finite modules {r['first_nonfinite'][:4]}; "
              f"fp32 over {limit:.3g}: {r['fp32_over_limit'][:3]}; largest fp32 {r['largest_fp32'][:2]}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
