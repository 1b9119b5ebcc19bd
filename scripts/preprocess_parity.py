"""Preprocessing parity with the reference library: the network input of predict, both sides.

For every family: an untrained model is built here and saved as a checkpoint; the same file is
loaded by the reference library (LibreYOLO 1.6.0, installed in another interpreter: ``--ref-python``)
and both run predict on the same photographs (PIL images, so no channel-order question). A
forward pre-hook on the network module catches the tensor the network receives, on both sides.
The report, per family and photograph: both shapes, the largest absolute difference and the
fraction of elements that differ by more than 1 % of the reference input's range.

``--fixtures DIR`` also writes what tests/unit/test_preprocess_parity.py replays without the
reference installed: the photographs (downsized, PNG) once, and per family the reference's input
at a small ``imgsz``, stored losslessly where its values lie on a lattice (resizing in uint8, then
an affine map: the usual case) and otherwise quantized to 16 bits over each channel's range.

Run from the repository root with the repository's interpreter:

    PYTHONPATH=. python scripts/preprocess_parity.py --ref-python /path/to/ref-venv/bin/python \
        [--families yolox,resnet] [--fixtures tests/fixtures/preprocess]

The same file runs as the reference-side worker (``--worker``); it then imports the reference's
``libreyolo`` and never this repository's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

#: family -> the size the harness builds (the smallest)
SIZES = {
    "yolo9": "t", "yolox": "n", "yolo7": "b", "rtmdet": "t", "picodet": "s", "rtdetr": "r18",
    "rtdetrv2": "r18", "dfine": "n", "deim": "n", "deimv2": "atto", "ec": "s", "rtdetrv4": "s",
    "resnet": "18", "efficientnetv2": "b0", "mobilenetv4": "s", "convnext": "t", "segformer": "b0",
    "mobilesam": "tiny", "depth_anything": "s", "birefnet": "t", "ppocr": "t",
}
#: predict options both sides need (a prompt for MobileSAM, whose image stage is what is compared)
PREDICT_ARGS = {"mobilesam": {"points": [[20, 20]], "labels": [1]}}
#: families whose task the reference names otherwise (its checkpoints say "segment" for MobileSAM)
REF_TASK = {"mobilesam": "segment"}
#: the photographs of the report (skimage's bundled data and the repository's sample image)
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "rocket_portrait", "hubble_deep_field", "sample")
#: the fixture's smaller run: photographs (longer side downsized to FIXTURE_SIDE) and imgsz per family
FIXTURE_PHOTOS = ("coffee", "rocket_portrait", "astronaut")
FIXTURE_SIDE = 320
FIXTURE_IMGSZ = {
    "resnet": 96, "efficientnetv2": 96, "mobilenetv4": 96, "convnext": 96,
    "depth_anything": 126, "mobilesam": 1024, "birefnet": 192, "ppocr": 160, "segformer": 160,
}
#: MobileSAM runs at 1024 on the reference side whatever imgsz says: one photograph only
FIXTURE_PHOTOS_OF = {"mobilesam": ("coffee",)}
FIXTURE_IMGSZ_DEFAULT = 160


# --------------------------------------------------------------------------- both sides
def network_of(model, family: str):
    """The module whose first forward call receives the network input."""
    net = model.model
    if family == "ppocr":
        return net.det
    if family == "mobilesam":
        return net.image_encoder
    return net


class Captured(Exception):
    """Raised by the hook once the input is caught: the network itself need not run."""


def capture_input(model, family: str, run) -> np.ndarray:
    """``run()`` with a pre-hook on every submodule of the network; the first tensor argument of
    the first module called (the outermost one that sees the input) is returned as float32, and
    the call is stopped there."""
    import torch
    seen: list = []

    def hook(_mod, args, kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor) and a.dim() == 4:
                seen.append(a.detach().to("cpu", torch.float32).clone())
                raise Captured

    if family == "ppocr":
        model.predict_fused = False   # the hooks sit on the loaded network (a fused copy sees the same input)
    root = network_of(model, family)
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in root.modules()]
    try:
        run()
    except Captured:
        pass
    finally:
        for h in handles:
            h.remove()
    if not seen:
        raise RuntimeError(f"{family}: the network received no 4-D tensor")
    return seen[0].numpy()


# --------------------------------------------------------------------------- reference side
def worker(job_path: str) -> None:
    """Reference side: load each checkpoint, predict each photograph, save the captured inputs."""
    import torch
    from PIL import Image

    import libreyolo
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    report = {}
    for fam, ckpt in job["checkpoints"].items():
        if fam == "mobilesam":   # built by the reference only from its hub snapshot: its own functions
            report[fam] = _mobilesam_reference(job, out)
            continue
        try:
            model = libreyolo.LibreYOLO(ckpt, device="cpu")
        except Exception as e:  # noqa: BLE001 - reported, the other families go on
            report[fam] = {"error": f"load: {type(e).__name__}: {e}"[:400]}
            continue
        info = {"class": type(model).__name__, "imgsz": getattr(model, "input_size", None)}
        for name, photo in job["photos"].items():
            img = Image.fromarray(np.load(photo))
            kwargs = {**PREDICT_ARGS.get(fam, {}), **job.get("predict", {}).get(fam, {})}
            try:
                x = capture_input(model, fam, lambda m=model, img=img, kw=kwargs: m.predict(img, **kw))
            except Exception as e:  # noqa: BLE001 - reported, the other photographs go on
                info[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
                continue
            np.save(out / f"{fam}__{name}.npy", x)
            info[name] = {"shape": list(x.shape)}
        report[fam] = info
    (out / "report.json").write_text(json.dumps(report, indent=1))


def _mobilesam_reference(job: dict, out: Path) -> dict:
    """MobileSAM's network input as the reference computes it, from its own functions (the
    reference builds this family only from its hub snapshot, so no checkpoint of ours loads):
    its image/prompt encoding (longest side to 1024) and the network's normalize-and-pad, with
    the network's own constants."""
    from libreyolo.models.mobilesam.preprocess import encode_image_and_prompts, preprocess_tensor
    from PIL import Image

    from libreyolo.models.mobilesam.model import MobileSAMNetwork
    net = MobileSAMNetwork()
    info: dict = {"class": "functions"}
    for name, photo in job["photos"].items():
        img = Image.fromarray(np.load(photo))
        enc = encode_image_and_prompts(img, target_length=1024, **PREDICT_ARGS["mobilesam"])
        x = preprocess_tensor(enc["pixel_values"], image_size=net.image_size, pixel_mean=net.pixel_mean,
                              pixel_std=net.pixel_std)
        np.save(out / f"mobilesam__{name}.npy", x.numpy().astype(np.float32))
        info[name] = {"shape": list(x.shape)}
    return info


def photographs(ref_python: str, cache: Path) -> dict[str, Path]:
    """The photographs as RGB uint8 .npy files under ``cache`` (skimage's come from the reference
    interpreter, which has scikit-image installed)."""
    cache.mkdir(parents=True, exist_ok=True)
    paths = {n: cache / f"{n}.npy" for n in PHOTOS}
    if all(p.exists() for p in paths.values()):
        return paths
    code = ("import numpy as np, skimage.data as d, sys\n"
            "for n in ['astronaut', 'coffee', 'chelsea', 'rocket', 'hubble_deep_field']:\n"
            "    np.save(f'{sys.argv[1]}/{n}.npy', np.ascontiguousarray(getattr(d, n)()[..., :3]))\n")
    subprocess.run([ref_python, "-c", code, str(cache)], check=True, cwd="/", env=_ref_env())
    np.save(paths["rocket_portrait"], np.ascontiguousarray(np.rot90(np.load(paths["rocket"]))))
    from PIL import Image

    import libreyolo
    np.save(paths["sample"], np.asarray(Image.open(libreyolo.SAMPLE_IMAGE).convert("RGB")))
    return paths


def _ref_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


# --------------------------------------------------------------------------- our side
def ours(families, cache: Path, photos: dict[str, Path], predict: dict, tag: str) -> dict:
    """Build + save each family's checkpoint (once) and capture our network input per photograph."""
    from PIL import Image

    from libreyolo.models.registry import FAMILIES
    out, ckpts = cache / f"ours-{tag}", {}
    out.mkdir(parents=True, exist_ok=True)
    for fam in families:
        ckpt = cache / "ckpt" / f"{fam}-{SIZES[fam]}.pt"
        if not ckpt.exists():
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            FAMILIES[fam].new(SIZES[fam], seed=0, device="cpu").save(ckpt)
        ckpts[fam] = str(ckpt)
        if fam in REF_TASK:   # a copy whose task the reference knows (the same weights and metadata)
            import torch
            ref_ckpt = ckpt.with_name(f"{ckpt.stem}-ref.pt")
            if not ref_ckpt.exists():
                d = torch.load(ckpt, map_location="cpu", weights_only=False)
                d["task"] = REF_TASK[fam]
                torch.save(d, ref_ckpt)
            ckpts[fam] = str(ref_ckpt)
        if all((out / f"{fam}__{name}.npy").exists() for name in photos):
            continue
        import libreyolo
        model = libreyolo.LibreYOLO(str(ckpt), device="cpu")
        for name, photo in photos.items():
            img = Image.fromarray(np.load(photo))
            kwargs = {**PREDICT_ARGS.get(fam, {}), **predict.get(fam, {})}
            x = capture_input(model, fam, lambda m=model, img=img, kw=kwargs: m.predict(img, **kw))
            np.save(out / f"{fam}__{name}.npy", x)
    return ckpts


def run_reference(ref_python: str, ckpts: dict, photos: dict, predict: dict, out: Path) -> dict:
    job = out.with_suffix(".json")
    job.write_text(json.dumps({"checkpoints": ckpts, "photos": {k: str(v) for k, v in photos.items()},
                               "predict": predict, "out": str(out)}))
    subprocess.run([ref_python, os.path.abspath(__file__), "--worker", str(job)], check=True, cwd="/",
                   env=_ref_env())
    return json.loads((out / "report.json").read_text())


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Ours ``a`` against the reference's ``b``."""
    if a.shape != b.shape:
        return {"shape": [list(a.shape), list(b.shape)]}
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    rng = float(b.max() - b.min()) or 1.0
    return {"shape": list(a.shape), "max_abs": float(d.max()), "frac_1pct": float((d > 0.01 * rng).mean()),
            "range": rng}


# --------------------------------------------------------------------------- fixtures
#: the level that stands for an exact 0.0 off the lattice (a network's zero padding after its
#: normalization: MobileSAM's)
ZERO_LEVEL = 65535


def encode(x: np.ndarray) -> dict[str, np.ndarray]:
    """A float32 (1, C, H, W) input as uint16 levels + per-channel offset and step: exact where each
    channel's values (zeros apart: :data:`ZERO_LEVEL`) lie on a lattice of at most 65535 steps,
    else quantized over its range; uint8 levels (255 the zero) where every channel is exact in
    fewer than 255 steps."""
    c = x.shape[1]
    levels = np.empty(x.shape, np.uint16)
    lo, step, exact = np.zeros(c, np.float64), np.zeros(c, np.float64), np.zeros(c, bool)
    for i in range(c):
        v = x[:, i].astype(np.float64)
        u = np.unique(v)
        zeros = v == 0
        if zeros.any() and len(u) > 2 and not zeros.all():
            lat = _lattice(np.unique(v[~zeros]))
            if lat is not None and abs(round(-lat[0] / lat[1]) * lat[1] + lat[0]) > 1e-6:
                lo[i], step[i], exact[i] = lat[0], lat[1], True
                q = np.round((v - lat[0]) / lat[1])
                q[zeros] = ZERO_LEVEL
                levels[:, i] = q.astype(np.uint16)
                continue
        lo[i] = u[0]
        if len(u) == 1:
            step[i], exact[i] = 1.0, True
            levels[:, i] = 0
            continue
        span = u[-1] - u[0]
        s = span / max(1.0, np.round(span / float(np.diff(u).min())))   # the lattice step, from the span
        q = np.round((v - u[0]) / s)
        if q.max() <= 65535 and np.abs(u[0] + q * s - v).max() <= 2e-6 * max(1.0, np.abs(u).max()):
            step[i], exact[i] = s, True
        else:
            s = (u[-1] - u[0]) / 65535
            q = np.round((v - u[0]) / s)
            step[i] = s
        levels[:, i] = q.astype(np.uint16)
    real = levels[levels != ZERO_LEVEL]
    if exact.all() and (real.size == 0 or int(real.max()) < 255):   # one byte per element
        levels = np.where(levels == ZERO_LEVEL, 255, levels).astype(np.uint8)
    return {"levels": levels, "offset": lo, "step": step, "exact": exact}


def _lattice(u: np.ndarray) -> tuple[float, float] | None:
    """(offset, step) of sorted unique values on a lattice of at most 65535 steps, else None."""
    if len(u) < 2:
        return None
    span = u[-1] - u[0]
    s = span / max(1.0, np.round(span / float(np.diff(u).min())))
    q = np.round((u - u[0]) / s)
    if q.max() < ZERO_LEVEL and np.abs(u[0] + q * s - u).max() <= 2e-6 * max(1.0, np.abs(u).max()):
        return float(u[0]), float(s)
    return None


def decode(d) -> np.ndarray:
    lv = d["levels"].astype(np.float64)
    x = lv * d["step"].reshape(1, -1, 1, 1) + d["offset"].reshape(1, -1, 1, 1)
    zero = 255 if d["levels"].dtype == np.uint8 else ZERO_LEVEL
    return np.where((d["levels"] == zero) & d["exact"].reshape(1, -1, 1, 1), 0.0, x).astype(np.float32)


def write_fixtures(fixtures: Path, families, ref_python: str, cache: Path, photos: dict, ckpts: dict) -> None:
    from PIL import Image
    fixtures.mkdir(parents=True, exist_ok=True)
    small = {}
    for name in FIXTURE_PHOTOS:
        if (fixtures / f"{name}.png").exists():
            small[name] = cache / f"small_{name}.npy"
            np.save(small[name], np.asarray(Image.open(fixtures / f"{name}.png").convert("RGB")))
            continue
        im = Image.fromarray(np.load(photos[name]))
        s = FIXTURE_SIDE / max(im.size)
        im = im.resize((round(im.size[0] * s), round(im.size[1] * s)), Image.Resampling.LANCZOS)
        im.save(fixtures / f"{name}.png", optimize=True)
        small[name] = cache / f"small_{name}.npy"
        np.save(small[name], np.asarray(Image.open(fixtures / f"{name}.png").convert("RGB")))
    predict = {f: {"imgsz": FIXTURE_IMGSZ.get(f, FIXTURE_IMGSZ_DEFAULT)} for f in families}
    ref = run_reference(ref_python, ckpts, small, predict, cache / "ref-fixture")
    ours(families, cache, small, predict, "fixture")
    for fam in families:
        arrays, names = {}, FIXTURE_PHOTOS_OF.get(fam, FIXTURE_PHOTOS)
        for name in names:
            p = cache / "ref-fixture" / f"{fam}__{name}.npy"
            if not p.exists():
                print(f"{fam} {name}: no reference input ({ref.get(fam, {}).get(name)})")
                continue
            x = np.load(p)
            enc = encode(x)
            arrays.update({f"{name}.{k}": v for k, v in enc.items()})
            c = compare(np.load(cache / "ours-fixture" / f"{fam}__{name}.npy"), decode(enc))
            print(f"fixture {fam:15s} {name:16s} exact={bool(enc['exact'].all())} {c}")
        np.savez_compressed(fixtures / f"{fam}.npz", size=np.array(SIZES[fam]),
                            imgsz=np.array(predict[fam]["imgsz"]), photos=np.array(names), **arrays)


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--ref-python", default="/work/venv-ref/bin/python")
    ap.add_argument("--families", default=",".join(SIZES))
    ap.add_argument("--photos", default=",".join(PHOTOS))
    ap.add_argument("--cache", default=".cache/preprocess_parity")
    ap.add_argument("--fixtures", help="write the test fixtures into this folder")
    ap.add_argument("--json", help="write the report here too")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    fams = [f for f in a.families.split(",") if f]
    cache = Path(a.cache).resolve()
    all_photos = photographs(a.ref_python, cache / "photos")
    photos = {k: v for k, v in all_photos.items() if k in a.photos.split(",")}
    t0 = time.perf_counter()
    ckpts = ours(fams, cache, photos, {}, "full")
    ref = run_reference(a.ref_python, ckpts, photos, {}, cache / "ref-full")
    report = {}
    for fam in fams:
        rows = {"ref": {k: v for k, v in ref.get(fam, {}).items() if k not in photos}}
        for name in photos:
            r = ref.get(fam, {}).get(name)
            p = cache / "ref-full" / f"{fam}__{name}.npy"
            if not p.exists():
                rows[name] = {"ref_error": (r or ref.get(fam) or {}).get("error", "missing")}
                continue
            rows[name] = compare(np.load(cache / "ours-full" / f"{fam}__{name}.npy"), np.load(p))
        report[fam] = rows
        worst = [v for k, v in rows.items() if k != "ref" and "max_abs" in v]
        line = (f"max_abs {max(v['max_abs'] for v in worst):.4g}  >1%: {max(v['frac_1pct'] for v in worst):.2%}"
                if worst else "")
        shapes = sorted({str(v.get("shape")) for k, v in rows.items() if k != "ref"})
        errs = sorted({v["ref_error"] for k, v in rows.items() if k != "ref" and "ref_error" in v} |
                      ({rows["ref"]["error"]} if "error" in rows["ref"] else set()))
        print(f"{fam:15s} {line:32s} shapes {' '.join(shapes)} {' '.join(errs)[:200]}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    if a.fixtures:
        write_fixtures(Path(a.fixtures), fams, a.ref_python, cache, all_photos, ckpts)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
