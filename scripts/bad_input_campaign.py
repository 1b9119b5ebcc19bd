"""Bad inputs and faults tried through the Python API and the command line, the way a careful user
would: other file types, other options of the same kind, other tasks. Each case states what a
good answer is - one error of an expected kind whose message names the problem (the file, the
option, the shape) - and the campaign reports every case that answers otherwise: another exception
type (an error from inside torch, numpy or PIL), a message that does not name the problem, or no
error where one is due.

    python scripts/bad_input_campaign.py               # every case; a table, then the failures
    python scripts/bad_input_campaign.py --only sources --json out.jsonl

Some cases must work instead (a documented tolerance: a 16-bit PNG, a folder with one broken
file, workers=1000 capped with one log line) and check their result or what they logged.

Runs on a CPU in about ten minutes, most of it the command-line cases (each starts an
interpreter) and a few one-epoch runs on two 64 px images (untrained models built from config,
generated files in a temporary folder). The ``writes`` kind mounts two small tmpfs folders (a
read-only one, a full one) and so needs root; elsewhere its read-only folder is a chmod'ed one and
the full-disk cases are left out. docs/errors.md lists the kinds and the counts of the last run.
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.results import Results

#: what a clear error may be: the library's own (a class defined in libreyolo, see ``is_clear``), or the
#: standard ones it raises with a message
CLEAR = (ValueError, TypeError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
         NotImplementedError, OSError)


def is_clear(exc: BaseException) -> bool:
    """A standard error of :data:`CLEAR`, or one of the library's own documented errors
    (``GraphUnavailableError``, ``TrainingError``, ...: a class defined in a libreyolo module);
    its message is judged apart."""
    return isinstance(exc, CLEAR) or type(exc).__module__.split(".")[0] == "libreyolo"


@dataclass
class Case:
    kind: str                      # the group in docs/errors.md
    name: str
    run: Callable[[], Any]
    names: tuple[str, ...] = ()    # what the message must mention (any one of them)
    ok: bool = False               # True: the call must succeed (a documented tolerance)
    either: bool = False           # True: success or a clear error naming one of ``names`` both hold
    check: Callable[[Any], str | None] | None = None   # for ok cases: a problem, or None
    forbid: tuple[str, ...] = ()   # what the message must not mention (a hidden temp file's suffix)


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
        if not is_clear(exc):
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            return Outcome(case.kind, case.name, False, f"{text[:300]} (at {Path(tb.filename).name}:{tb.lineno})")
        msg = str(exc).lower()
        if case.names and not any(n.lower() in msg for n in case.names):
            return Outcome(case.kind, case.name, False, f"does not name {case.names}: {text[:300]}")
        if any(n.lower() in msg for n in case.forbid):
            return Outcome(case.kind, case.name, False, f"names {case.forbid}: {text[:300]}")
        return Outcome(case.kind, case.name, True, text[:200])
    if not case.ok:
        return Outcome(case.kind, case.name, False, f"no error (returned {type(value).__name__})")
    problem = case.check(value) if case.check else None
    return Outcome(case.kind, case.name, problem is None, problem or "worked")


def logged(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fn()`` and what it logged (libreyolo's loggers, INFO and up) or warned (``warnings``)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    lg = logging.getLogger("libreyolo")
    keep, level = Keep(), lg.level
    lg.addHandler(keep)
    lg.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = fn()
    finally:
        lg.removeHandler(keep)
        lg.setLevel(level)
    return value, messages + [str(w.message) for w in caught]


def said(pattern: str, count: int | None = None) -> Callable[[Any], str | None]:
    """A check for :func:`logged` results: a message holds ``pattern`` (and ``count`` results came)."""
    def check(out: Any) -> str | None:
        value, messages = out
        if count is not None and len(value) != count:
            return f"{len(value)} results, expected {count}"
        return None if any(pattern in m for m in messages) else f"nothing said about {pattern!r}: {messages[:5]}"
    return check


def _mount_tmpfs(path: Path, options: str) -> bool:
    """A small tmpfs at ``path`` (a full disk, a read-only folder); False where mounting is not
    allowed (not root, no CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, check=False)
    return r.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, check=False)


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
    out["text_only_dir"] = d / "text_only"
    out["text_only_dir"].mkdir()
    (out["text_only_dir"] / "readme.txt").write_text("no images here")
    out["mp4"] = d / "clip_ok.mp4"
    import av
    with av.open(str(out["mp4"]), "w") as c:
        st = c.add_stream("mpeg4", rate=10)
        st.width, st.height, st.pix_fmt = 64, 48, "yuv420p"
        for i in range(20):
            frame = av.VideoFrame.from_ndarray(np.roll(rgb, 3 * i, axis=1).copy(), format="rgb24")
            for packet in st.encode(frame):
                c.mux(packet)
        for packet in st.encode():
            c.mux(packet)
    VIDEO[:] = [out["mp4"]]
    whole = out["mp4"].read_bytes()
    out["mp4_truncated"] = d / "clip_cut.mp4"
    out["mp4_truncated"].write_bytes(whole[: len(whole) // 3])
    out["mp4_empty"] = d / "clip_empty.mp4"
    out["mp4_empty"].write_bytes(b"")
    out["streams"] = d / "cams.streams"
    out["streams"].write_text(f"{out['mp4']}\nthis is not a source\n")
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
        # lazily decoded sources: a broken file of a folder or glob is one warning naming it, also streamed
        cases.append(Case("sources", f"{task}: stream=True over a folder with one broken file",
                          lambda m=m: logged(lambda: list(m.predict(f["dir_mixed"], stream=True))), ok=True,
                          check=said("b.jpg", 1)))
        cases.append(Case("sources", f"{task}: stream=True over a glob with one broken file",
                          lambda m=m: logged(lambda: list(m.predict(str(f["dir_mixed"] / "*"), stream=True))),
                          ok=True, check=said("b.jpg", 1)))
        cases.append(Case("sources", f"{task}: a list holding a broken file",
                          lambda m=m: m.predict([f["good"], f["dir_mixed"] / "b.jpg"]), ("b.jpg",)))
        cases.append(Case("sources", f"{task}: a folder holding no image", lambda m=m: m.predict(f["text_only_dir"]),
                          ("text_only",)))
        more = {
            "HWC torch tensor": (torch.zeros(64, 64, 3), ("shape", "channel")),
            "5-D tensor": (torch.zeros(1, 1, 3, 32, 32), ("shape", "dimension", "ndim")),
            "inf float tensor": (torch.full((3, 32, 32), float("inf")), ("nan", "finite", "inf")),
            "float tensor above 1": (torch.full((3, 32, 32), 200.0), ("range", "[0, 1]")),
            "bytes": (b"\x89PNG", ("bytes",)),
        }
        for name, (arr, names) in more.items():
            cases.append(Case("sources", f"{task}: {name}", lambda m=m, a=arr: m.predict(a), names))
        cases.append(Case("sources", f"{task}: float16 tensor in [0, 1]",
                          lambda m=m: m.predict(torch.rand(3, 48, 64).half()), ok=True,
                          check=lambda r: None if len(r) == 1 else "no result"))
        for key, names in (("mp4_truncated", ("clip_cut.mp4",)), ("mp4_empty", ("clip_empty.mp4",)),
                           ("streams", ("cams.streams", "line 2"))):
            cases.append(Case("video", f"{task}: {key.replace('_', ' ')}",
                              lambda m=m, p=f[key]: list(m.predict(p, stream=True)), names))
        cases.append(Case("video", f"{task}: a good video (stream=True)",
                          lambda m=m: list(m.predict(f["mp4"], stream=True)), ok=True,
                          check=lambda r: None if len(r) == 20 else f"{len(r)} frames, expected 20"))
    return cases


#: each task's built-in training set (PP-OCR does not train)
BUILTIN = {"detect": "shapes", "classify": "shapes-cls", "semantic": "shapes-seg", "depth": "shapes-depth",
           "ocr": "shapes"}


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
                          lambda m=m: m.val(data=str(f["yaml_binary"])),
                          ("data.yaml",) + (("ppocr",) if task == "ocr" else ())))
        for opt, v in {"epochs": 0, "batch": -2, "lr0": -1, "momentum": 1.5, "workers": -1, "seed": -1,
                       "optimizer": "Adam9", "imgsz": -64, "patience": -1, "freeze": "nosuchlayer",
                       "loggers": "wandb", "cache": "gpu", "amp": "int8", "resume": "/no/such/last.pt"}.items():
            # one epoch of a small run, should a bad value slip through; the option under test overrides
            kw = {"data": BUILTIN[task], "epochs": 1, "imgsz": 64, "batch": 2, "workers": 0, "plots": False,
                  "project": str(f["good"].parent / "runs"), "name": f"{task}-{opt}", "exist_ok": True}
            # PP-OCR does not train: "training is not implemented for the ppocr family" is the answer
            cases.append(Case("options", f"{task}: train {opt}={v!r}",
                              lambda m=m, kw=kw, o=opt, v=v: m.train(**{**kw, o: v}),
                              (opt, "nosuchlayer") + (("ppocr",) if task == "ocr" else ())))
        cases.append(Case("options", f"{task}: train data=None", lambda m=m: m.train(data=None, epochs=1),
                          ("data", "ppocr")))
        cases.append(Case("options", f"{task}: export format=caffe", lambda m=m: m.export(format="caffe"),
                          ("caffe", "format")))
        cases.append(Case("options", f"{task}: export imgsz=-1", lambda m=m: m.export(imgsz=-1), ("imgsz",)))
    return cases


def train_cases(models: dict[str, Any], f: dict[str, Path], d: Path) -> list[Case]:
    """Options whose fault shows in a run: the seed's range, the worker count, a diverging run, a
    run folder in use. A small detection set (two 64 px images a split) keeps each run short."""
    m = models["detect"]
    base = "path: ROOT\ntrain: images/train\nval: images/val\nnames: [a, b]\n"

    def run(model: Any = m, **kw: Any) -> Any:
        y = _dataset(d, "small", base)
        opts = {"data": str(y), "epochs": 1, "batch": 2, "imgsz": 64, "workers": 0, "plots": False,
                "project": str(d / "runs"), "name": "opt", "exist_ok": True, "verbose": False, **kw}
        return model.train(**opts)

    def fresh() -> Any:   # a diverging run leaves its model's weights as they ended: not the shared one
        return LibreYOLO.new("yolo9", "t", nc=2, imgsz=64, device="cpu")

    def after_divergence() -> Any:
        model = fresh()
        try:
            run(model, lr0=1e6, epochs=2, nan_patience=1, warmup_epochs=0, name="diverge2")
        except FloatingPointError:
            pass
        return model

    def finite(model: Any) -> str | None:
        bad = [k for k, v in model.model.state_dict().items() if v.is_floating_point() and not v.isfinite().all()]
        return (f"the model holds non-finite weights after the diverged run ({len(bad)} tensors, e.g. {bad[0]}): "
                "its predict returns nothing, silently") if bad else None

    def busy() -> Any:
        import fcntl
        folder = d / "runs" / "busy"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".libreyolo.lock", "a+") as fh:   # another run's lock, as RunLock takes it
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                return run(name="busy")
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    return [
        Case("options", "detect: train seed=2**40", lambda: run(seed=2**40), ("seed",)),
        Case("options", "detect: LibreYOLO.new(seed=-1)", lambda: LibreYOLO.new("yolo9", "t", seed=-1), ("seed",)),
        Case("options", "detect: train warmup_epochs=-1", lambda: run(warmup_epochs=-1), ("warmup_epochs",)),
        Case("options", "detect: train nan_patience=0", lambda: run(nan_patience=0), ("nan_patience",)),
        Case("options", "detect: train workers=10000000", lambda: run(workers=10_000_000), ("workers",)),
        Case("options", "detect: train workers=100000 (capped, one log line)",
             lambda: logged(lambda: run(workers=100000)), ok=True, check=said("workers=100000 capped at")),
        Case("options", "detect: train workers=1000 (capped, one log line)", lambda: logged(lambda: run(workers=1000)),
             ok=True, check=said("workers=1000 capped at")),
        Case("options", "detect: train imgsz=7 (rounded up to the stride, one warning)",
             lambda: logged(lambda: run(imgsz=7)), ok=True, check=said("imgsz=7 is not a multiple of the stride")),
        Case("options", "detect: a diverging run (lr0=1e6)",
             lambda: run(fresh(), lr0=1e6, epochs=4, nan_patience=2, warmup_epochs=0, name="diverge"), ("lr0",)),
        Case("options", "detect: the model a diverged run leaves holds finite weights", after_divergence, ok=True,
             check=finite),
        Case("options", "detect: a run folder in use by another run", busy, ("busy", "in use")),
    ]


def _coco(root: Path) -> Path:
    """A COCO set whose training annotations hold a box entirely outside its image (id 30)."""
    rgb = np.full((50, 100, 3), 77, np.uint8)
    for folder in ("train2017", "val2017"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(2):
            _png(root / folder / f"{i}.png", rgb)
    images = [{"id": i + 1, "file_name": f"{i}.png", "width": 100, "height": 50} for i in range(2)]
    cats = [{"id": 7, "name": "dog"}]
    good = [{"id": i + 1, "image_id": i + 1, "category_id": 7, "bbox": [10, 5, 20, 10]} for i in range(2)]
    docs = {"train": good + [{"id": 30, "image_id": 1, "category_id": 7, "bbox": [-50, -50, 30, 30]}],
            "val": good}
    (root / "annotations").mkdir(exist_ok=True)
    for split, anns in docs.items():
        (root / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": anns, "categories": cats}))
    y = root / "coco.yaml"
    y.write_text("format: coco\npath: .\n"
                 "train: {images: train2017, annotations: annotations/instances_train.json}\n"
                 "val: {images: val2017, annotations: annotations/instances_val.json}\n")
    return y


def dataset_cases(models: dict[str, Any], d: Path, f: dict[str, Path]) -> list[Case]:
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
    def broken_image() -> Any:
        y = _dataset(d, "ds_trunc", base)
        (y.parent / "images" / "train" / "im1.png").write_bytes(f["truncated"].read_bytes())
        return m.train(data=str(y), epochs=1, batch=2, imgsz=64, workers=0, plots=False,
                       project=str(d / "runs"), name="trunc", exist_ok=True, verbose=False)

    def missing_listed() -> Any:
        y = _dataset(d, "ds_list", "path: ROOT\ntrain: train.txt\nval: images/val\nnames: [a, b]\n")
        (y.parent / "train.txt").write_text("images/train/im0.png\nimages/train/gone.png\n")
        return m.train(data=str(y), epochs=1, batch=2, imgsz=64, workers=0, plots=False,
                       project=str(d / "runs"), name="list", exist_ok=True, verbose=False)

    def coco_outside() -> Any:
        y = _coco(d / "coco")
        return m.train(data=str(y), epochs=1, batch=2, imgsz=64, workers=0, plots=False,
                       project=str(d / "runs"), name="coco", exist_ok=True, verbose=False)

    cases.append(Case("datasets", "detect: a truncated image in the training split", broken_image, ("im1.png",)))
    cases.append(Case("datasets", "detect: an image list naming a missing image", missing_listed, ("gone.png",)))
    cases.append(Case("datasets", "detect: a COCO box entirely outside its image (skipped, one warning)",
                      lambda: logged(coco_outside), ok=True, check=said("(id 30)")))
    for task, mt in models.items():
        if task in ("segment-prompt", "ocr"):
            continue
        cases.append(Case("datasets", f"{task}: train data= an image file",
                          lambda mt=mt: mt.train(data=str(f["good"]), epochs=1), ("good.png",)))
        cases.append(Case("datasets", f"{task}: val data= a binary file named .yaml",
                          lambda mt=mt: mt.val(data=str(f["yaml_binary"])), ("data.yaml",)))
        bad = d / f"syntax_{task}" / "data.yaml"
        bad.parent.mkdir(parents=True, exist_ok=True)
        bad.write_text("path: .\ntrain: [images/train\nnames: {a\n")
        cases.append(Case("datasets", f"{task}: train on a YAML with a syntax error",
                          lambda mt=mt, y=bad: mt.train(data=str(y), epochs=1), ("data.yaml",)))
        listy = d / f"list_{task}" / "data.yaml"
        listy.parent.mkdir(parents=True, exist_ok=True)
        listy.write_text("- a\n- b\n")
        cases.append(Case("datasets", f"{task}: val on a YAML that is a list",
                          lambda mt=mt, y=listy: mt.val(data=str(y)), ("data.yaml",)))
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
    def edited(name: str, edit: Callable[[dict], None]) -> Any:
        sd = torch.load(good, weights_only=True)
        edit(sd)
        p = d / name
        torch.save(sd, p)
        return LibreYOLO(str(p))

    def inf_weight(sd: dict) -> None:
        key = next(k for k, v in sd["model"].items() if v.is_floating_point() and "anchor" not in k)
        sd["model"][key] = sd["model"][key].clone().fill_(float("inf"))
    cases.append(Case("checkpoints", "inf weights", lambda: edited("inf.pt", inf_weight), ("finite", "inf")))
    def cast(dtype: torch.dtype) -> Callable[[dict], None]:
        def edit(sd: dict) -> None:
            sd["model"] = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd["model"].items()}
        return edit
    cases.append(Case("checkpoints", "int32 weights", lambda: edited("int32.pt", cast(torch.int32)),
                      ("int32", "kind of number")))
    cases.append(Case("checkpoints", "complex weights", lambda: edited("complex.pt", cast(torch.complex64)),
                      ("complex", "kind of number")))
    cases.append(Case("checkpoints", "float16 weights (loaded into float32)",
                      lambda: edited("half.pt", cast(torch.float16)), ok=True))
    cases.append(Case("checkpoints", "model='' (empty)", lambda: LibreYOLO(""), ("empty", "model")))
    cases.append(Case("checkpoints", "model=None", lambda: LibreYOLO(None), ("model", "none")))
    for v in (0, -1, "abc", 10**6):
        cases.append(Case("checkpoints", f"LibreYOLO.new(imgsz={v!r})",
                          lambda v=v: LibreYOLO.new("yolo9", "t", nc=2, imgsz=v), ("imgsz",)))
    cases.append(Case("checkpoints", "metadata nc='eighty'",
                      lambda: edited("nc_text.pt", lambda sd: sd.update(nc="eighty")), ("nc",)))
    cases.append(Case("checkpoints", "nc= differing from the checkpoint's", lambda: LibreYOLO(str(good), nc=3),
                      ("nc=3",)))
    st = d / "good.safetensors"
    m.save(st)
    cut = d / "cut.safetensors"
    cut.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    cases.append(Case("checkpoints", "truncated .safetensors", lambda: LibreYOLO(str(cut)), ("cut.safetensors",)))
    onnx_good = d / "good.onnx"
    m.export(format="onnx", file=str(onnx_good), imgsz=64)
    blob = onnx_good.read_bytes()
    for name, data in {"empty .onnx": b"", "text .onnx": b"hello\n", "truncated .onnx": blob[: len(blob) // 3]}.items():
        p = d / (name.replace(" ", "_").replace(".", "") + ".onnx")
        p.write_bytes(data)
        cases.append(Case("checkpoints", name, lambda p=p: LibreYOLO(str(p)), (p.name,)))
    cases.append(Case("checkpoints", "a missing file", lambda: LibreYOLO(str(d / "missing.pt")), ("missing.pt",)))
    cases.append(Case("checkpoints", "a directory", lambda: LibreYOLO(str(d)), (d.name,)))
    cases.append(Case("checkpoints", "an image as weights", lambda: LibreYOLO(str(d / "good.png")), ("good.png",)))
    cases.append(Case("checkpoints", "an unknown family name", lambda: LibreYOLO("yolo99z"), ("yolo99z",)))
    cases.append(Case("checkpoints", "save into a missing folder's file",
                      lambda: m.save(d / "no" / "such" / "x.pt"), ok=True,
                      check=lambda r: None if (d / "no" / "such" / "x.pt").is_file() else "nothing written"))
    return cases


def write_cases(models: dict[str, Any], d: Path) -> list[Case]:
    """Saving and exporting into a read-only folder and onto a full disk: one error naming the
    target (not the hidden temp file), nothing left behind. Needs small tmpfs mounts (root); a
    read-only folder falls back to a chmod'ed one for other users, and the full-disk cases are
    left out there (the table says how many ran)."""
    m = models["detect"]
    result = m.predict(np.random.default_rng(0).integers(0, 256, (600, 800, 3), dtype=np.uint8))[0]
    ro, full = d / "ro", d / "full"
    if _mount_tmpfs(ro, "size=1m,ro"):
        MOUNTS.append(ro)
    elif os.geteuid() != 0:
        ro.mkdir(exist_ok=True)
        ro.chmod(0o555)
    else:
        ro = None
    full_ok = _mount_tmpfs(full, "size=64k")
    if full_ok:
        MOUNTS.append(full)
    places = ([("a read-only folder", ro)] if ro is not None else []) + ([("a full disk", full)] if full_ok else [])
    cases = []
    for where, folder in places:
        writes = {
            "model.save": (lambda folder=folder: m.save(folder / "w.pt"), "w.pt"),
            "model.save .safetensors": (lambda folder=folder: m.save(folder / "w.safetensors"), "w.safetensors"),
            "export onnx": (lambda folder=folder: m.export(format="onnx", file=str(folder / "m.onnx"), imgsz=64),
                            "m.onnx"),
            "Results.save": (lambda folder=folder: result.save(folder / "p.png"), "p.png"),
        }
        if where == "a read-only folder":   # (the annotated clip is a few KiB: it fits the full disk)
            writes["predict save=True of a video"] = (
                lambda folder=folder: m.predict(VIDEO[0], save=True, save_dir=str(folder), exist_ok=True),
                VIDEO[0].name)
        for what, (fn, target) in writes.items():
            def run(fn=fn, folder=folder) -> Any:
                try:
                    return fn()
                finally:
                    leftovers = [p.name for p in folder.iterdir()]
                    if leftovers:
                        raise RuntimeError(f"left behind in {folder}: {leftovers}")
            cases.append(Case("writes", f"{what} to {where}", run, (str(folder / target),), forbid=(".tmp",)))
    return cases


#: the good video of the generated files (set by ``_files``)
VIDEO: list[Path] = []

#: tmpfs mounts the write cases made, unmounted at the end
MOUNTS: list[Path] = []


#: a small detection set's YAML (two 64 px images a split)
SMALL = "path: ROOT\ntrain: images/train\nval: images/val\nnames: [a, b]\n"


def interrupted_train(d: Path) -> str | None:
    """``libreyolo train`` interrupted by SIGINT once its first last.pt is written: it must exit
    130 without a traceback, saying what last.pt holds and the resume= to continue. Returns a
    problem, or None."""
    y = _dataset(d, "ctrlc", SMALL, images=4)
    run = d / "runs" / "ctrlc"
    proc = subprocess.Popen([sys.executable, "-m", "libreyolo.cli", "train", "model=yolo9t", f"data={y}",
                             "epochs=200", "batch=2", "imgsz=64", "workers=1", "plots=false",
                             f"project={d}/runs", "name=ctrlc", "exist_ok=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not (run / "weights" / "last.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "still running 120 s after Ctrl-C"
    if proc.returncode != 130:
        return f"exit {proc.returncode}: {out[-300:]}"
    if "Traceback" in out:
        return "printed a traceback"
    if "resume=" not in out or "last.pt" not in out:
        return f"does not say what last.pt holds and the resume= command: {out[-300:]}"
    return None


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
        Case("cli", "train data= an image file", lambda: cli("train", "model=yolo9t", f"data={d}/good.png"),
             ("good.png",)),
        Case("cli", "train data= a binary file named .yaml",
             lambda: cli("train", "model=yolo9t", f"data={d}/data.yaml"), ("data.yaml",)),
        Case("cli", "train without data=", lambda: cli("train", "model=yolo9t", "epochs=1"), ("data",)),
        Case("cli", "train seed=-1", lambda: cli("train", "model=yolo9t", "data=shapes", "seed=-1"), ("seed",)),
        Case("cli", "train workers=100000", lambda: cli("train", "model=yolo9t", "data=shapes", "workers=100000"),
             ("workers",)),
        Case("cli", "val without data=", lambda: cli("val", "model=yolo9t"), ("data",)),
        Case("cli", "predict a truncated image", lambda: cli("predict", "model=yolo9t", f"source={d}/truncated.png"),
             ("truncated.png",)),
        Case("cli", "predict model= a truncated .onnx",
             lambda: cli("predict", f"model={d}/truncated_onnx.onnx", f"source={d}/good.png"),
             ("truncated_onnx.onnx",)),
        Case("cli", "train workers=1000 on a small set (capped, one log line)",
             lambda: cli("train", "model=yolo9t", f"data={_dataset(d, 'cli_small', SMALL)}", "epochs=1", "batch=2",
                         "imgsz=64", "workers=1000", "plots=false", f"project={d}/runs", "name=cliw", "exist_ok=true"),
             ok=True, check=lambda r: None if "capped at" in r.stdout + r.stderr else "no capped-workers line"),
        Case("cli", "Ctrl-C during training (exit 130, one line naming last.pt and resume=)",
             lambda: interrupted_train(d), ok=True, check=lambda r: r),
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
    ap.add_argument("--only", help="comma-separated kinds: sources, video, options, datasets, checkpoints, writes, cli")
    ap.add_argument("--json", help="write one JSON line per case here")
    args = ap.parse_args(argv)
    import logging
    logging.getLogger("libreyolo").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        models = build_models()
        f = _files(d)
        cases = (source_cases(models, f) + option_cases(models, f) + train_cases(models, f, d)
                 + dataset_cases(models, d, f)
                 + checkpoint_cases(models, d) + write_cases(models, d) + cli_cases(d))
        if args.only:
            kinds = set(args.only.split(","))
            cases = [c for c in cases if c.kind in kinds]
        outcomes = []
        try:
            for c in cases:
                o = judge(c)
                outcomes.append(o)
                print(f"{'held' if o.held else 'FAIL'}  {o.kind:<11} {o.name}", flush=True)
        finally:
            for mount in MOUNTS:
                _umount(mount)
            if (d / "ro").exists():
                (d / "ro").chmod(0o755)
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
