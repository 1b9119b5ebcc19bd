"""Write, or compare against the recorded reference, a bitwise fingerprint of what the library does:
the proof that a refactor left predictions and training unchanged.

    python scripts/behaviour_snapshot.py write              # regenerate the reference
    python scripts/behaviour_snapshot.py compare            # every part; exit 1 and the differing entries
    python scripts/behaviour_snapshot.py compare predict cli    # only some parts

The reference is ``tests/fixtures/behaviour_snapshot.json``; ``tests/unit/test_behaviour_snapshot.py``
compares against it. Regenerate it ONLY for an intended behaviour change, and say so in the commit.

Parts (each entry is ``"<sha256> <dtype>[<shape>]"`` of one tensor, or the SHA-256 of a file or text):

* ``predict``: every model of :data:`PREDICT_MODELS`: the state dict of
  ``LibreYOLO.new(family, size, seed=0)`` (the seeded initialisation, one entry per model); then the
  model of :data:`PREDICT_MODELS`, its floating-point weights then replaced by
deterministic, input-sensitive values (``tests/fixtures/fill.py``; an untrained
  detector scores every box near zero, so nothing would pass ``conf``), predicting :func:`images`
  through the Python
  API: every tensor of every ``Results`` (boxes, probabilities, masks, depth, ...) and its
  ``summary()``, plus the raw network output (``model.infer``) of a fixed random input.
* ``cli``: one ``libreyolo predict`` in a subprocess with ``save=true`` and ``json=``: the saved
  image's and the JSON file's bytes.
* ``train``: 2 epochs of the smallest detector and of a classifier on the built-in synthetic sets
  (workers as the trainer picks): ``results.csv`` with its wall-time columns (``time/...``) removed,
  and the tensors of ``last.pt``'s model weights (one entry per run).

Everything runs on the CPU with one torch thread (a different thread count may split a reduction
differently). Bits depend on the torch version and the CPU's vector instructions, both recorded
with the reference; the test skips where they differ.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "fixtures" / "behaviour_snapshot.json"
PARTS = ("predict", "cli", "train")

#: (family, size, predict options): detectors of different kinds (anchor-based NMS heads, anchor-free,
#: a DETR, a GFL head), a classifier, a semantic segmenter and a depth model, each small on the CPU
PREDICT_MODELS: list[tuple[str, str, dict[str, Any]]] = [
    ("yolo9", "t", {"imgsz": 320, "conf": 0.05}),
    ("yolox", "n", {"imgsz": 320, "conf": 0.05}),
    ("rtdetr", "r18", {"imgsz": 320, "conf": 0.05}),
    ("picodet", "s", {"imgsz": 320, "conf": 0.05}),
    ("mobilenetv4", "s", {"imgsz": 224}),
    ("segformer", "b0", {"imgsz": 256}),
    ("depth_anything", "s", {"imgsz": 252}),
]
#: (family, size, data, imgsz, batch) of the training part
TRAIN_RUNS: list[tuple[str, str, str, int, int]] = [
    ("yolox", "n", "shapes", 64, 16),
    ("mobilenetv4", "s", "shapes-cls", 32, 16),
]
CLI_MODEL = ("yolox", "n")


def environment() -> dict[str, str]:
    """What the bits depend on besides the code."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "numpy": np.__version__}


# ----------------------------------------------------------------------------- hashing
def tensor_entry(t: Any) -> str:
    """``"<sha256> <dtype>[<shape>]"`` of a tensor or array (its values, dtype and shape)."""
    a = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
    h = hashlib.sha256(f"{a.dtype}{list(a.shape)}".encode())
    h.update(a.tobytes())
    return f"{h.hexdigest()} {a.dtype}{list(a.shape)}"


def text_entry(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return f"{hashlib.sha256(data).hexdigest()} {len(data)}B"


def tensors(prefix: str, value: Any, out: dict[str, str]) -> None:
    """Every tensor/array in ``value`` (nested tuples, lists, dicts) as ``prefix.i`` entries."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        out[prefix] = tensor_entry(value)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            tensors(f"{prefix}.{i}", v, out)
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            tensors(f"{prefix}.{k}", value[k], out)
    elif value is not None:
        out[prefix] = text_entry(repr(value))


def combined(value: dict[str, Any]) -> str:
    """One entry for many tensors: the SHA-256 of their names and entries, and how many there are."""
    parts: dict[str, str] = {}
    tensors("", value, parts)
    listing = "".join(f"{k} {v}\n" for k, v in parts.items())
    return f"{hashlib.sha256(listing.encode()).hexdigest()} {len(parts)} tensors"


# ----------------------------------------------------------------------------- inputs
def images() -> list[Any]:
    """The bundled sample image (a path) and two generated uint8 RGB images."""
    from libreyolo import SAMPLE_IMAGE
    g = np.random.default_rng(0)
    noise = g.integers(0, 256, (240, 320, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:300, 0:200]
    ramp = np.stack([(xx * 255 // 199), (yy * 255 // 299), ((xx + yy) % 256)], -1).astype(np.uint8)
    return [str(SAMPLE_IMAGE), noise, ramp]


def input_sensitive(model: Any) -> Any:
    """Replace the model's floating-point weights with values that depend only on each tensor's
    name (``tests/fixtures/fill.py``), so every output depends on the input."""
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    try:
        from fill import fill_state_dict
    finally:
        sys.path.remove(str(ROOT / "tests" / "fixtures"))
    sd = model.model.state_dict()
    layout = [[k, list(v.shape), str(v.dtype)] for k, v in sd.items() if v.is_floating_point()]
    filled = fill_state_dict(layout)
    model.load_state_dict({k: filled.get(k, v) for k, v in sd.items()})
    return model


# ----------------------------------------------------------------------------- parts
def result_entries(prefix: str, r: Any, out: dict[str, str]) -> None:
    """Every output tensor of one Results, through its public fields."""
    if r.boxes is not None:
        tensors(f"{prefix}.boxes.data", r.boxes.data, out)
        tensors(f"{prefix}.boxes.id", r.boxes.id, out)
    for field in ("probs", "masks", "depth", "alpha", "texts"):
        obj = getattr(r, field, None)
        if obj is None:
            continue
        tensors(f"{prefix}.{field}.data", obj.data, out)
        if field == "probs":
            out[f"{prefix}.probs.top"] = text_entry(repr(list(obj.top)))
            tensors(f"{prefix}.probs.topconf", obj.topconf, out)
    out[f"{prefix}.orig_shape"] = text_entry(repr(tuple(r.orig_shape)))
    out[f"{prefix}.summary"] = text_entry(json.dumps(r.summary(), sort_keys=True, default=str))


def part_predict() -> dict[str, str]:
    from libreyolo import LibreYOLO
    out: dict[str, str] = {}
    ims = images()
    for fam, size, opts in PREDICT_MODELS:
        m = LibreYOLO.new(fam, size, seed=0, device="cpu")
        key = f"predict/{fam}-{size}"
        out[f"{key}/init.state_dict"] = combined(dict(m.model.state_dict()))
        input_sensitive(m)
        for i, r in enumerate(m.predict(ims, save=False, verbose=False, **opts)):
            result_entries(f"{key}/img{i}", r, out)
        x = torch.rand((1, 3, opts["imgsz"], opts["imgsz"]), generator=torch.Generator().manual_seed(0))
        m.model.eval()
        with torch.no_grad():
            tensors(f"{key}/raw", m.infer(x), out)
    return out


def _console_entry() -> str:
    """``module:function`` of the ``libreyolo`` program, as pyproject.toml declares it."""
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return scripts["libreyolo"]


def part_cli() -> dict[str, str]:
    from libreyolo import SAMPLE_IMAGE, LibreYOLO
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "model.pt"
        # the JSON names the source as given: a copy, named relative to the working directory
        shutil.copyfile(SAMPLE_IMAGE, Path(tmp) / "sample.jpg")
        input_sensitive(LibreYOLO.new(*CLI_MODEL, seed=0, device="cpu")).save(weights)
        module, func = _console_entry().split(":")
        code = (f"import sys; sys.argv[0] = 'libreyolo'; import torch; torch.set_num_threads(1); "
                f"from {module} import {func}; {func}()")
        args = ["predict", f"model={weights}", "source=sample.jpg", "imgsz=320", "conf=0.05",
                "device=cpu", "save=true", f"save_dir={Path(tmp) / 'out'}", f"json={Path(tmp) / 'det.json'}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        proc = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp, env=env, capture_output=True, check=False,
                              text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"libreyolo {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        saved = sorted(p for p in (Path(tmp) / "out").rglob("*") if p.is_file())
        if not saved:
            raise RuntimeError(f"libreyolo predict save=true wrote nothing under {Path(tmp) / 'out'}")
        for p in saved:
            out[f"cli/predict/{p.relative_to(Path(tmp) / 'out').as_posix()}"] = text_entry(p.read_bytes())
        out["cli/predict/det.json"] = text_entry((Path(tmp) / "det.json").read_bytes())
    return out


def results_csv_without_times(path: Path) -> str:
    """``results.csv`` with the wall-time columns (header ``time/...``) removed."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    keep = [i for i, name in enumerate(rows[0]) if not name.startswith("time/")]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for row in rows:
        w.writerow([row[i] for i in keep])
    return buf.getvalue()


def part_train() -> dict[str, str]:
    from libreyolo import LibreYOLO
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fam, size, data, imgsz, batch in TRAIN_RUNS:
            key = f"train/{fam}-{size}-{data}"
            m = LibreYOLO.new(fam, size, seed=0, device="cpu")
            res = m.train(data=data, epochs=2, imgsz=imgsz, batch=batch, device="cpu", project=tmp,
                          name=f"{fam}-{size}", plots=False, verbose=False)
            run = Path(res["run_dir"])
            table = results_csv_without_times(run / "results.csv")
            out[f"{key}/results.csv"] = text_entry(table)
            out[f"{key}/results.csv.columns"] = text_entry(table.splitlines()[0])
            ckpt = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=False)
            out[f"{key}/last.pt.model"] = combined(dict(ckpt["model"]))
    return out


def snapshot(parts: tuple[str, ...] = PARTS) -> dict[str, str]:
    """The entries of ``parts`` (CPU, one torch thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out: dict[str, str] = {}
        for part in parts:
            out.update(globals()[f"part_{part}"]())
        return out
    finally:
        torch.set_num_threads(before)


def differences(ref: dict[str, str], new: dict[str, str]) -> list[str]:
    """One line per entry that differs, is missing or is new."""
    lines = []
    for k in sorted(set(ref) | set(new)):
        if k not in new:
            lines.append(f"missing: {k}")
        elif k not in ref:
            lines.append(f"new:     {k}")
        elif ref[k] != new[k]:
            lines.append(f"differs: {k}  (reference {ref[k]}, now {new[k]})")
    return lines


def load_reference(path: Path = REFERENCE) -> dict[str, Any]:
    return json.loads(path.read_text())


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("write", "compare") or any(p not in PARTS for p in argv[1:]):
        print(__doc__)
        print(f"parts: {', '.join(PARTS)}")
        return 2
    verb, parts = argv[0], tuple(argv[1:]) or PARTS
    if verb == "write" and parts != PARTS:
        print("write regenerates every part; name none")
        return 2
    new = snapshot(parts)
    if verb == "write":
        REFERENCE.write_text(json.dumps({"environment": environment(), "entries": new}, indent=1,
                                        sort_keys=True) + "\n")
        print(f"wrote {len(new)} entries to {REFERENCE}")
        return 0
    ref = load_reference()
    if ref["environment"] != environment():
        print(f"note: the reference was written under {ref['environment']}, this is {environment()}")
    entries = {k: v for k, v in ref["entries"].items() if k.split("/", 1)[0] in parts}
    bad = differences(entries, new)
    print(f"{len(entries) - len(bad)}/{len(entries)} entries bitwise equal ({', '.join(parts)})")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
