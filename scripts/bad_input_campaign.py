"""Bad inputs and faults tried through the Python API and the command line, the way a careful user
would: other file types, other options of the same kind, other tasks. Each case states what a
good answer is - one error of an expected kind whose message names the problem (the file, the
option, the shape) - and the campaign reports every case that answers otherwise: another exception
type (an error from inside torch, numpy or PIL), a message that does not name the problem, or no
error where one is due.

    python scripts/bad_input_campaign.py               # every case; a table, then the failures
    python scripts/bad_input_campaign.py --only sources --json out.jsonl

Runs on a CPU in a few minutes (untrained models built from config, generated files in a
temporary folder). docs/errors.md lists the kinds and the counts of the last run.
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.results import Results

#: what a clear error may be: the library's own, or the standard ones it raises with a message
CLEAR = (ValueError, TypeError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
         NotImplementedError, OSError)


@dataclass
class Case:
    kind: str                      # the group in docs/errors.md
    name: str
    run: Callable[[], Any]
    names: tuple[str, ...] = ()    # what the message must mention (any one of them)
    ok: bool = False               # True: the call must succeed (a documented tolerance)
    either: bool = False           # True: success or a clear error naming one of ``names`` both hold
    check: Callable[[Any], str | None] | None = None   # for ok cases: a problem, or None


@dataclass
class Outcome:
    kind: str
    name: str
    held: bool
    what: str


def judge(case: Case) -> Outcome:
    try:
        value = case.run()
    except BaseException as exc:   # noqa: BLE001 - every answer is judged
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) and not isinstance(exc, SystemExit):
            raise
        text = f"{type(exc).__name__}: {exc}"
        if case.ok and not case.either:
            return Outcome(case.kind, case.name, False, "raised where it must work: " + text[:300])
        if isinstance(exc, SystemExit):
            return Outcome(case.kind, case.name, exc.code not in (0, None), f"exit {exc.code}")
        if not isinstance(exc, CLEAR):
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            return Outcome(case.kind, case.name, False, f"{text[:300]} (at {Path(tb.filename).name}:{tb.lineno})")
        msg = str(exc).lower()
        if case.names and not any(n.lower() in msg for n in case.names):
            return Outcome(case.kind, case.name, False, f"does not name {case.names}: {text[:300]}")
        return Outcome(case.kind, case.name, True, text[:200])
    if not case.ok:
        return Outcome(case.kind, case.name, False, f"no error (returned {type(value).__name__})")
    problem = case.check(value) if case.check else None
    return Outcome(case.kind, case.name, problem is None, problem or "worked")


# ------------------------------------------------------------------ inputs
def _png(path: Path, arr: np.ndarray, mode: str | None = None) -> Path:
    Image.fromarray(arr, mode).save(path) if mode else Image.fromarray(arr).save(path)
    return path


def _files(d: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    out: dict[str, Path] = {}
    out["empty"] = d / "empty.jpg"
    out["empty"].write_bytes(b"")
    out["text"] = d / "notes.jpg"
    out["text"].write_text("not an image\n")
    good = _png(d / "good.png", rgb)
    data = good.read_bytes()
    out["truncated"] = d / "truncated.png"
    out["truncated"].write_bytes(data[: len(data) // 2])
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG")
    out["truncated_jpg"] = d / "truncated.jpg"
    out["truncated_jpg"].write_bytes(buf.getvalue()[:300])
    out["png_as_jpg"] = d / "png_inside.jpg"
    out["png_as_jpg"].write_bytes(data)
    out["gray16"] = d / "gray16.png"
    Image.fromarray(rng.integers(0, 65535, (40, 50), dtype=np.uint16)).save(out["gray16"])
    out["cmyk"] = d / "cmyk.jpg"
    Image.fromarray(rgb).convert("CMYK").save(out["cmyk"])
    out["rgba"] = _png(d / "rgba.png", np.dstack([rgb, rgb[..., :1]]))
    out["palette"] = d / "palette.png"
    Image.fromarray(rgb).convert("P").save(out["palette"])
    out["one_px"] = _png(d / "one.png", rgb[:1, :1])
    out["thin"] = _png(d / "thin.png", np.zeros((1, 4000, 3), np.uint8))
    out["gif"] = d / "anim.gif"
    frames = [Image.fromarray(rgb), Image.fromarray(255 - rgb)]
    frames[0].save(out["gif"], save_all=True, append_images=frames[1:])
    out["tiff_pages"] = d / "pages.tiff"
    frames[0].save(out["tiff_pages"], save_all=True, append_images=frames[1:])
    out["webp"] = d / "img.webp"
    Image.fromarray(rgb).save(out["webp"])
    out["bmp"] = d / "img.bmp"
    Image.fromarray(rgb).save(out["bmp"])
    out["good"] = good
    out["dir_empty"] = d / "empty_dir"
    out["dir_empty"].mkdir()
    mixed = d / "mixed"
    mixed.mkdir()
    _png(mixed / "a.png", rgb)
    (mixed / "b.jpg").write_text("broken")
    out["dir_mixed"] = mixed
    out["mp4_text"] = d / "clip.mp4"
    out["mp4_text"].write_text("not a video")
    out["yaml_binary"] = d / "data.yaml"
    out["yaml_binary"].write_bytes(bytes(range(256)))
    return out


def _dataset(d: Path, name: str, yaml_text: str, labels: dict[str, str] | None = None, images: int = 2) -> Path:
    root = d / name
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(images):
            _png(root / "images" / split / f"im{i}.png", np.full((64, 64, 3), 40 * i, np.uint8))
            text = (labels or {}).get(f"{split}/im{i}", "0 0.5 0.5 0.2 0.2\n")
            (root / "labels" / split / f"im{i}.txt").write_text(text)
    y = root / "data.yaml"
    y.write_text(yaml_text.replace("ROOT", str(root)))
    return y


# ------------------------------------------------------------------ cases
def _one_results(r: Any) -> str | None:
    """The check of a predict on one image: it returns that image's one Results."""
    return None if isinstance(r, Results) else f"{type(r).__name__}, expected one Results"


def source_cases(models: dict[str, Any], f: dict[str, Path]) -> list[Case]:
    cases = []
    tolerated = ("gray16", "cmyk", "rgba", "palette", "one_px", "webp", "bmp", "gif", "tiff_pages")
    for task, m in models.items():
        if task == "segment-prompt":
            continue
        for key in ("empty", "text", "truncated", "truncated_jpg"):
            cases.append(Case("sources", f"{task}: {key} file", lambda m=m, p=f[key]: m.predict(p), (f[key].name,)))
        for key in tolerated:
            cases.append(Case("sources", f"{task}: {key} image", lambda m=m, p=f[key]: m.predict(p), ok=True,
                              check=_one_results))
        cases.append(Case("sources", f"{task}: 1x4000 strip image", lambda m=m: m.predict(f["thin"]), ("aspect",),
                          ok=True, either=True, check=_one_results))
        cases.append(Case("sources", f"{task}: png bytes named .jpg", lambda m=m: m.predict(f["png_as_jpg"]), ok=True,
                          check=_one_results))
        cases.append(Case("sources", f"{task}: missing file", lambda m=m: m.predict(f["good"].parent / "nope.png"),
                          ("nope.png",)))
        cases.append(Case("sources", f"{task}: empty folder", lambda m=m: m.predict(f["dir_empty"]), ("empty_dir",)))
        cases.append(Case("sources", f"{task}: glob matching nothing",
                          lambda m=m: m.predict(str(f["good"].parent / "*.nothing")), ("*.nothing",)))
        cases.append(Case("sources", f"{task}: folder with one broken file (skipped, one warning)",
                          lambda m=m: m.predict(f["dir_mixed"]), ok=True,
                          check=lambda r: None if len(r) == 1 else f"{len(r)} results, expected 1"))
        cases.append(Case("sources", f"{task}: folder with one broken file, strict",
                          lambda m=m: m.predict(f["dir_mixed"], strict=True), ("b.jpg",)))
        arrays = {
            "float64 array above 1": (np.full((32, 32, 3), 7.0), ("float", "range", "dtype")),
            "int16 array": (np.zeros((32, 32, 3), np.int16), ("int16", "dtype")),
            "bool array": (np.zeros((32, 32, 3), bool), ("bool", "dtype")),
            "5-channel array": (np.zeros((32, 32, 5), np.uint8), ("channel", "shape", "5")),
            "1-D array": (np.zeros(10, np.uint8), ("shape", "dimension", "ndim")),
            "empty array": (np.zeros((0, 32, 3), np.uint8), ("empty", "shape", "0")),
            "NaN float array": (np.full((32, 32, 3), np.nan, np.float32), ("nan", "finite")),
            "4-D array": (np.zeros((2, 32, 32, 3), np.uint8), ("shape", "dimension", "ndim")),
            "complex tensor": (torch.zeros(3, 32, 32, dtype=torch.complex64), ("complex", "dtype")),
            "meta tensor": (torch.empty(3, 32, 32, device="meta"), ("meta",)),
            "int64 tensor": (torch.zeros(3, 32, 32, dtype=torch.int64), ("int64", "dtype")),
            "tensor with 2 channels": (torch.zeros(2, 32, 32), ("channel", "shape", "2")),
        }
        for name, (arr, names) in arrays.items():
            cases.append(Case("sources", f"{task}: {name}", lambda m=m, a=arr: m.predict(a), names))
        cases.append(Case("sources", f"{task}: non-contiguous array",
                          lambda m=m: m.predict(np.zeros((64, 64, 3), np.uint8)[::2, ::-1]), ok=True,
                          check=_one_results))
        cases.append(Case("sources", f"{task}: a dict as source", lambda m=m: m.predict({"a": 1}), ("dict",)))
        cases.append(Case("sources", f"{task}: None as source", lambda m=m: m.predict(None), ("none", "source")))
        cases.append(Case("sources", f"{task}: empty list", lambda m=m: m.predict([]), ("empty",)))
        cases.append(Case("video", f"{task}: text file named .mp4", lambda m=m: m.predict(f["mp4_text"]),
                          ("clip.mp4",)))
    return cases


def option_cases(models: dict[str, Any], f: dict[str, Path]) -> list[Case]:
    cases = []
    img = np.zeros((64, 64, 3), np.uint8)
    for task, m in models.items():
        if task == "segment-prompt":
            continue
        bad = {"imgsz": [-32, 0.5, "big", 10**6, [64, -1]], "batch": [0, -1, 2.5, "x"], "amp": ["fp8", 3],
               "cuda_graph": ["maybe"], "precision": ["fp8"], "vid_stride": [0], "timeout": [-1, "soon"],
               "save": ["perhaps"], "fast": ["turbo"], "decode": ["npu"], "color_format": ["hsv"]}
        if task == "detect":
            bad.update({"conf": [1.5, -0.1, "x"], "iou": [2], "max_det": [0, 10**9], "classes": [[999], ["zebra"]]})
        if task == "classify":
            bad.update({"topk": [0, -3]})
        for opt, values in bad.items():
            for v in values:
                cases.append(Case("options", f"{task}: predict {opt}={v!r}",
                                  lambda m=m, o=opt, v=v: m.predict(img, **{o: v}), (opt,)))
        cases.append(Case("options", f"{task}: predict unknown option", lambda m=m: m.predict(img, confidence=0.3),
                          ("confidence",)))
        cases.append(Case("options", f"{task}: cuda_graph=True on a CPU", lambda m=m: m.predict(img, cuda_graph=True),
                          ("cuda", "gpu")))
        cases.append(Case("options", f"{task}: val on a dataset of another task's format",
                          lambda m=m: m.val(data=str(f["yaml_binary"])), ("data.yaml",)))
        for opt, v in {"epochs": 0, "batch": -2, "lr0": -1, "momentum": 1.5, "workers": -1, "seed": -1,
                       "optimizer": "Adam9", "imgsz": 7, "patience": -1, "freeze": "nosuchlayer",
                       "loggers": "wandb", "cache": "gpu", "amp": "int8", "resume": "/no/such/last.pt"}.items():
            cases.append(Case("options", f"{task}: train {opt}={v!r}",
                              lambda m=m, o=opt, v=v: m.train(data="shapes", epochs=1, **{"epochs": 1, o: v}),
                              (opt, "nosuchlayer")))
        cases.append(Case("options", f"{task}: export format=caffe", lambda m=m: m.export(format="caffe"),
                          ("caffe", "format")))
        cases.append(Case("options", f"{task}: export imgsz=-1", lambda m=m: m.export(imgsz=-1), ("imgsz",)))
    return cases


def dataset_cases(models: dict[str, Any], d: Path) -> list[Case]:
    m = models["detect"]
    base = "path: ROOT\ntrain: images/train\nval: images/val\nnames: [a, b]\n"
    sets = {
        "labels with 6 columns": (base, {"train/im0": "0 0.5 0.5 0.2 0.2 0.9\n"}, ("im0.txt",)),
        "class id beyond names": (base, {"train/im0": "7 0.5 0.5 0.2 0.2\n"}, ("im0.txt", "7")),
        "negative class id": (base, {"train/im1": "-1 0.5 0.5 0.2 0.2\n"}, ("im1.txt",)),
        "coordinates above 1": (base, {"val/im0": "0 1.5 0.5 0.2 0.2\n"}, ("im0.txt",)),
        "text where numbers go": (base, {"train/im0": "0 a b c d\n"}, ("im0.txt",)),
        "polygon row in a detection set": (base, {"train/im0": "0 0.1 0.1 0.5 0.1 0.5 0.5 0.1 0.5\n"},
                                           ("im0.txt",)),
        "names missing": ("path: ROOT\ntrain: images/train\nval: images/val\n", None, ("names",)),
        "val split missing": ("path: ROOT\ntrain: images/train\nnames: [a]\n", None, ("val",)),
        "split folder missing": ("path: ROOT\ntrain: images/nothing\nval: images/val\nnames: [a]\n", None,
                                 ("nothing",)),
        "YAML syntax error": ("path: ROOT\ntrain: [images/train\nnames: {a\n", None, ("data.yaml",)),
        "YAML that is a list": ("- a\n- b\n", None, ("data.yaml",)),
        "nc disagreeing with names": (base + "nc: 5\n", None, ("nc", "names")),
        "empty YAML": ("", None, ("data.yaml",)),
    }
    cases = []
    for i, (name, (text, labels, names)) in enumerate(sets.items()):
        def run(text=text, labels=labels, i=i):
            y = _dataset(d, f"ds{i}", text, labels)
            return m.train(data=str(y), epochs=1, batch=2, imgsz=64, workers=0, plots=False, verbose=False,
                           project=str(d / "runs"), name=f"ds{i}", exist_ok=True)
        cases.append(Case("datasets", f"detect: {name}", run, names))
    cases.append(Case("datasets", "detect: data= a directory", lambda: m.val(data=str(d)), (d.name, "data")))
    cases.append(Case("datasets", "detect: data= a missing YAML", lambda: m.val(data=str(d / "none.yaml")),
                      ("none.yaml",)))
    cases.append(Case("datasets", "detect: data= an unknown built-in name", lambda: m.val(data="shapez"),
                      ("shapez",)))
    return cases


def checkpoint_cases(models: dict[str, Any], d: Path) -> list[Case]:
    m = models["detect"]
    good = d / "good.pt"
    m.save(good)
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    files = {
        "empty .pt": b"",
        "text .pt": b"hello\n",
        "truncated .pt": data[: len(data) // 3],
        "one byte flipped": bytes(flipped),
        "a zip with no checkpoint": None,
        "safetensors with a broken header": b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}xxxxxxx",
    }
    cases = []
    for name, blob in files.items():
        suffix = ".safetensors" if "safetensors" in name else ".pt"
        p = d / (name.replace(" ", "_").replace(".", "") + suffix)
        if blob is None:
            with zipfile.ZipFile(p, "w") as z:
                z.writestr("readme.txt", "nothing")
        else:
            p.write_bytes(blob)
        cases.append(Case("checkpoints", name, lambda p=p: LibreYOLO(str(p)), (p.name,)))
    nan = d / "nan.pt"

    def make_nan():
        sd = torch.load(good, weights_only=True)
        key = next(k for k, v in sd["model"].items() if v.is_floating_point())
        sd["model"][key] = sd["model"][key].clone().fill_(float("nan"))
        torch.save(sd, nan)
        return LibreYOLO(str(nan))
    cases.append(Case("checkpoints", "NaN weights", make_nan, ("nan", "finite")))
    cases.append(Case("checkpoints", "a missing file", lambda: LibreYOLO(str(d / "missing.pt")), ("missing.pt",)))
    cases.append(Case("checkpoints", "a directory", lambda: LibreYOLO(str(d)), (d.name,)))
    cases.append(Case("checkpoints", "an image as weights", lambda: LibreYOLO(str(d / "good.png")), ("good.png",)))
    cases.append(Case("checkpoints", "an unknown family name", lambda: LibreYOLO("yolo99z"), ("yolo99z",)))
    cases.append(Case("checkpoints", "save into a missing folder's file",
                      lambda: m.save(d / "no" / "such" / "x.pt"), ok=True,
                      check=lambda r: None if (d / "no" / "such" / "x.pt").is_file() else "nothing written"))
    return cases


def cli_cases(d: Path) -> list[Case]:
    def cli(*args: str) -> Any:
        r = subprocess.run([sys.executable, "-m", "libreyolo.cli", *args], capture_output=True, text=True,
                           timeout=300)
        if r.returncode == 0:
            return r
        text = (r.stderr or r.stdout).strip()
        if "Traceback" in r.stderr:
            raise RuntimeError(f"traceback (exit {r.returncode}): {text.splitlines()[-1]}")
        # the lines that say what went wrong (the untrained-model notice and the usage are not it)
        said = [ln for ln in text.splitlines() if "error" in ln.lower() or "unknown" in ln.lower()]
        raise ValueError(f"exit {r.returncode}: {' | '.join(said) or text[-300:]}")
    return [
        Case("cli", "predict source= missing", lambda: cli("predict", "model=yolo9t", f"source={d}/nope.png"),
             ("nope.png",)),
        Case("cli", "predict conf=2", lambda: cli("predict", "model=yolo9t", "source=x.png", "conf=2"), ("conf",)),
        Case("cli", "train epochs=-1", lambda: cli("train", "model=yolo9t", "data=shapes", "epochs=-1"),
             ("epochs",)),
        Case("cli", "unknown command", lambda: cli("trian"), ("trian",)),
        Case("cli", "an option without =", lambda: cli("predict", "model=yolo9t", "conf"), ("conf",)),
        Case("cli", "model= a text file", lambda: cli("predict", f"model={d}/notes.jpg", "source=x.png"),
             ("notes.jpg",)),
        Case("cli", "export format=nope", lambda: cli("export", "model=yolo9t", "format=nope"), ("format",)),
    ]


def build_models() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "detect": LibreYOLO.new("yolo9", "t", nc=2, imgsz=64, device="cpu"),
        "classify": LibreYOLO.new("resnet", "18", nc=3, imgsz=64, device="cpu"),
        "semantic": LibreYOLO.new("segformer", "b0", nc=3, imgsz=64, device="cpu"),
        "depth": LibreYOLO.new("depth_anything", "s", imgsz=56, device="cpu"),
        "ocr": LibreYOLO.new("ppocr", "t", device="cpu"),
        "segment-prompt": LibreYOLO.new("mobilesam", "tiny", device="cpu"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated kinds: sources, video, options, datasets, checkpoints, cli")
    ap.add_argument("--json", help="write one JSON line per case here")
    args = ap.parse_args(argv)
    import logging
    logging.getLogger("libreyolo").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        models = build_models()
        f = _files(d)
        cases = (source_cases(models, f) + option_cases(models, f) + dataset_cases(models, d)
                 + checkpoint_cases(models, d) + cli_cases(d))
        if args.only:
            kinds = set(args.only.split(","))
            cases = [c for c in cases if c.kind in kinds]
        outcomes = []
        for c in cases:
            o = judge(c)
            outcomes.append(o)
            print(f"{'held' if o.held else 'FAIL'}  {o.kind:<11} {o.name}", flush=True)
    by_kind: dict[str, list[int]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, [0, 0])[0 if o.held else 1] += 1
    print(f"\n{len(outcomes)} cases in {time.perf_counter() - t0:.0f} s")
    print("| kind | cases | held | failed |\n|---|---|---|---|")
    for k, (h, bad) in by_kind.items():
        print(f"| {k} | {h + bad} | {h} | {bad} |")
    failed = [o for o in outcomes if not o.held]
    if failed:
        print("\nfailed:")
        for o in failed:
            print(f"- {o.kind}: {o.name}: {o.what}")
    if args.json:
        with open(args.json, "w") as fh:
            for o in outcomes:
                fh.write(json.dumps(o.__dict__) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
