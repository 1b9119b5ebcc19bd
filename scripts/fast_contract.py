"""Measure the fast-path tolerance contract per detection family (GPU): the figures
``libreyolo/assets/fast_contract.json`` holds and the library checks before it runs
``precision="fp16"``/``"bf16"`` or ``fast=True`` / ``"aot"`` (libreyolo/engine/fastpath.py).
``--fast-modes false true aot`` adds the ahead-of-time arm (``<precision>-aot``) to the two measured
by default.

Per family, on weights trained briefly on the demo's built-in shapes (the ``easy`` style of
``libreyolo demo``, trained with the demo's recipe - AdamW, the nominal batch equal to the batch,
mosaic closed for the last third - so that a minute of training detects; ``--weights trained``,
the default; ``redraw`` uses verify's seeded re-draw instead and measures no mAP):

(a) the half and fast paths' own parity: the graph of the network stage and of the whole predict
    stage (uint8 in, post-processing included) replayed on two probe distributions must equal the
    same path run eagerly, bit for bit, and must not be stale (engine/verify.py: verify_half). It
    runs on verify's seeded re-draw of an untrained twin: a trained detector finds nothing in the
    protocol's noise probes, so its two probes would give the same (empty) output and prove nothing;
(b) against fp32 eager, on real images (libreyolo.SAMPLE_IMAGE, resized, rotated) and synthetic
    ones (the shapes validation images): the rate of fp32 detections (score >= --score) matched by
    a detection of the half path of the same class at IoU >= 0.95, the p99 of the matched pairs'
    score difference, and mAP50-95 on the shapes validation set, fp32 vs the half path.

    python scripts/fast_contract.py --out benchmarks/results/fast_contract.json \\
        --table libreyolo/assets/fast_contract.json --markdown benchmarks/results/fast_contract.md

writes the raw JSON, the table file the library reads (``--table``; every arm measured, inside the
contract or not: the library refuses those outside, naming the figure) and a markdown table for
docs/families.md.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.cli import DEMO_DATA, demo_train_args
from libreyolo.engine import fastpath
from libreyolo.engine.fastpath import CONTRACT, arm_name, match_detections, measuring, violations
from libreyolo.engine.verify import input_sensitive, verify_half

FAMILIES = [("yolo9", "t"), ("yolox", "n"), ("yolo7", "tiny"), ("rtmdet", "t"), ("picodet", "s"),
            ("rtdetr", "r18"), ("rtdetrv2", "r18"), ("rtdetrv4", "s"), ("dfine", "n"), ("deim", "n"),
            ("deimv2", "atto"), ("ec", "s"), ("yolo9_p2", "t"), ("yolo9_e2e", "t"), ("ppyoloe", "s"), ("yolonas", "s")]


def real_images() -> list[np.ndarray]:
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    return [np.asarray(pil), np.asarray(pil.resize((640, 360))), np.asarray(pil.resize((333, 517))),
            np.asarray(pil.rotate(180)), np.asarray(pil.transpose(Image.Transpose.FLIP_LEFT_RIGHT))]


def shapes_map(model, data, imgsz: int, **kw) -> float:
    """mAP50-95 (points) on the shapes validation split through predict (conf 0.001, as val)."""
    from libreyolo.tasks.detect.metrics import evaluate_detections
    preds, gts = [], []
    paths = [str(s.image) for s in data.val]
    res = [r for i in range(0, len(paths), 32)   # <= 32 per call: no progress bar
           for r in model.predict(paths[i:i + 32], imgsz=imgsz, conf=0.001, iou=0.7, max_det=300, **kw)]
    for s, r in zip(data.val, res):
        preds.append(r.boxes.data.cpu().numpy())
        lab = s.labels.copy()
        lab[:, [1, 3]] *= s.width
        lab[:, [2, 4]] *= s.height
        gts.append(lab)
    return 100.0 * float(evaluate_detections(preds, gts, model.nc, model.names)["map50_95"])


def train_briefly(m, data_yaml: str, epochs: int, imgsz: int = 320, batch: int = 16, lr0: float = 0.002) -> dict:
    """``m`` trained with the demo's recipe (AdamW, the nominal batch equal to the batch, mosaic
    closed for the last third; the DETR line at its own AdamW rate, the demo's suits the YOLOs),
    captured where the family declares it; ``model.train``'s result."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = {"epochs": epochs, "imgsz": imgsz, "batch": batch, "optimizer": "AdamW", "lr0": lr0,
                "close_mosaic": None, "workers": 4, "project": tmp, "seed": 0}
        kw = demo_train_args(opts)
        if getattr(m, "TRAIN_DEFAULTS", {}).get("optimizer") == "AdamW":
            kw.pop("lr0")
        return m.train(data=data_yaml, verbose=False, cuda_graph=m.device.type == "cuda" and m.SUPPORTS_CUDA_GRAPH_TRAIN,
                       **kw)


def measure_family(fam: str, size: str, args, data) -> dict:
    t0 = time.perf_counter()
    cuda = args.device == "cuda"
    m = LibreYOLO.new(fam, size, nc=data.nc, names=data.names, device=args.device, seed=0)
    out: dict = {"family": fam, "size": size, "weights": args.weights}
    twin = input_sensitive(LibreYOLO.new(fam, size, nc=data.nc, names=data.names, device=args.device, seed=0))
    if args.weights == "trained":
        tr = train_briefly(m, args.data_yaml, args.epochs, args.imgsz, args.batch, args.lr0)
        out["train_s"] = tr["time_s"]
        out["fp32_val_map50_95"] = tr.get("map50_95")
    else:
        m = twin
    images = real_images() + [np.asarray(Image.open(s.image).convert("RGB")) for s in data.val[:args.synthetic]]
    kw = dict(imgsz=args.imgsz, conf=args.conf, max_det=300)
    ref = m.predict(images, cuda_graph=False, **kw)
    map_fp32 = shapes_map(m, data, args.imgsz) if args.weights == "trained" else None
    out["fp32_map50_95"] = map_fp32
    out["arms"] = {}
    # the CPU smoke run measures each precision's plain half copy only
    arms = args.arm_list if cuda else list(dict.fromkeys((p, False) for p, _ in args.arm_list))
    for precision, fast in arms:
        arm = arm_name(precision, fast)
        t1 = time.perf_counter()
        fig: dict = {}
        try:
            with measuring():
                if cuda:   # the parity protocol needs CUDA graphs; the CPU smoke run skips it
                    # batch 1 only: every call below is batch 1, so one compiled shape per arm
                    par = verify_half(twin, args.imgsz, (1,), (480, 640), (precision,), fast)
                    fig["graph_bitwise"] = all(r.passed for r in par)
                    fig["parity"] = [r.as_dict() for r in par]
                got = m.predict(images, cuda_graph=cuda, precision=precision, fast=fast, **kw)
                ok = tot = 0
                diffs: list[float] = []
                for a, b in zip(ref, got):
                    mm, tt, dd = match_detections(a.boxes.data.cpu(), b.boxes.data.cpu(), args.score)
                    ok, tot, diffs = ok + mm, tot + tt, diffs + dd
                fig["detections"] = tot
                fig["match_rate"] = ok / tot if tot else None
                fig["score_diff_p99"] = float(np.percentile(diffs, 99)) if diffs else None
                if map_fp32 is not None:
                    fig["map50_95"] = shapes_map(m, data, args.imgsz, cuda_graph=cuda, precision=precision,
                                                 fast=fast)
                    fig["map_diff"] = fig["map50_95"] - map_fp32
                hn = m._half_networks.get((precision, fast))
                fig["first_call_s"] = getattr(hn, "first_call_s", None)
        except Exception as exc:   # recorded per arm: one family's failure does not stop the run
            fig["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        fig["violations"] = violations(fig) if "error" not in fig else [fig["error"]]
        fig["seconds"] = time.perf_counter() - t1
        fig.update(device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__, date=_dt.date.today().isoformat(),
                   compile_mode=fastpath.COMPILE_MODE if fast else None)
        out["arms"][arm] = fig
        save_partial(args, out)   # a run cut short by its time limit keeps the arms it finished
        m.release_graphs()
        twin.release_graphs()
    out["seconds"] = time.perf_counter() - t0
    torch._dynamo.reset()
    return out


#: the table file's first entry: what it is, for a reader who opens it
TABLE_ABOUT = ("Measured fast-path figures per detection family and arm (fp16, fp16-fast, fp16-aot, bf16, bf16-fast, "
               "bf16-aot), "
               "written by scripts/fast_contract.py --table on a GPU. A family/arm missing here is unmeasured "
               "and refused; one whose figures break the contract (libreyolo/engine/fastpath.py: CONTRACT) is "
               "refused naming the figure.")


def markdown(rows: list[dict]) -> str:
    c = CONTRACT
    lines = [f"Contract: matched at IoU >= 0.95 >= {c['match_rate_min']:.0%}, score diff p99 <= "
             f"{c['score_diff_p99_max']}, |mAP50-95 diff| <= {c['map_diff_max']} points.", "",
             "| family | arm | graph == same path eager | matched @IoU0.95 | score diff p99 | mAP50-95 fp32 -> half | "
             "first call s | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for arm, f in r.get("arms", {}).items():
            def fmt(v, spec):
                return "-" if v is None else format(v, spec)
            # the fp32 figure of the arm's own run (a merged row's family-level one may be a later run's)
            mp = ("-" if f.get("map50_95") is None else
                  f"{f['map50_95'] - f['map_diff']:.2f} -> {f['map50_95']:.2f} ({f['map_diff']:+.2f})")
            verdict = "in contract" if not f["violations"] else "REFUSED: " + "; ".join(f["violations"])
            lines.append(f"| {r['family']}-{r['size']} | {arm} | {f.get('graph_bitwise', '-')} | "
                         f"{fmt(f.get('match_rate'), '.4f')} ({f.get('detections', 0)}) | "
                         f"{fmt(f.get('score_diff_p99'), '.4f')} | {mp} | {fmt(f.get('first_call_s'), '.1f')} | "
                         f"{verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="*", default=[f for f, _ in FAMILIES])
    ap.add_argument("--precisions", nargs="*", default=["fp16"], choices=["fp16", "bf16"])
    ap.add_argument("--weights", choices=["trained", "redraw"], default="trained")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr0", type=float, default=0.002, help="AdamW rate of the YOLO families (the demo's)")
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--conf", type=float, default=0.05, help="predict threshold of both paths")
    ap.add_argument("--score", type=float, default=0.1, help="fp32 detections at or above this must be matched")
    ap.add_argument("--synthetic", type=int, default=16, help="shapes val images among the matched images")
    ap.add_argument("--out", default="benchmarks/results/fast_contract.json")
    ap.add_argument("--table", default=None, help="also write the library's table file here")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--compile-mode", default=fastpath.COMPILE_MODE,
                    help="torch.compile mode of the fast arms (default: the library's)")
    ap.add_argument("--fast-modes", nargs="+", default=["false", "true"], choices=["false", "true", "aot"],
                    help="the arms per precision: false (the half copy), true (torch.compile), aot "
                         "(AOTInductor, arm '<precision>-aot'); the CPU smoke run takes false only")
    ap.add_argument("--arms", nargs="+", default=None,
                    help="the arms to measure by name (fp16, fp16-fast, fp16-aot, bf16, ...), instead of "
                         "--precisions x --fast-modes: one training, only the arms not yet measured")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of this script (bf16 eager only, no parity)")
    ap.add_argument("--merge", nargs="*", default=None,
                    help="merge these earlier --out files (one per GPU) instead of measuring")
    args = ap.parse_args(argv)
    fastpath.COMPILE_MODE = args.compile_mode
    args.fast_modes = tuple(fastpath.parse_fast(v) for v in args.fast_modes)
    try:
        args.arm_list = parse_arms(args.arms) if args.arms else [
            (p, f) for p in args.precisions for f in args.fast_modes]
    except ValueError as exc:
        ap.error(str(exc))
    if args.merge:
        return write(merge_rows([json.loads(Path(p).read_text())["families"] for p in args.merge]), args)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("fast_contract.py needs a CUDA GPU (--device cpu: a smoke run of the script itself, bf16 "
              "eager, no parity, figures not for the table)", file=sys.stderr)
        return 2
    logging.getLogger("libreyolo").setLevel(logging.WARNING)
    from libreyolo.data.datasets import resolve_data
    from libreyolo.data.synthetic import make_shapes_dataset
    args.data_yaml = str(make_shapes_dataset(**DEMO_DATA))
    data = resolve_data(args.data_yaml)
    sizes = dict(FAMILIES)
    rows = []
    args.done_rows = rows
    for fam in args.families:
        print(f"== {fam}-{sizes[fam]}", flush=True)
        try:
            rows.append(measure_family(fam, sizes[fam], args, data))
        except Exception as exc:
            traceback.print_exc()
            rows.append({"family": fam, "size": sizes[fam], "error": f"{type(exc).__name__}: {exc}", "arms": {}})
        for arm, f in rows[-1]["arms"].items():
            print(f"   {arm}: bitwise {f.get('graph_bitwise')} match {f.get('match_rate')} p99 "
                  f"{f.get('score_diff_p99')} mAP diff {f.get('map_diff')} -> {f['violations'] or 'in contract'}",
                  flush=True)
    return write(rows, args)


def parse_arms(names: list[str]) -> list[tuple[str, bool | str]]:
    """Arm names as (precision, fast) pairs, in the order given: ``bf16-aot`` -> ("bf16", "aot")."""
    out = []
    for name in names:
        precision, sep, mode = name.partition("-")
        fast = {"": False, "fast": True, "aot": "aot"}.get(mode) if mode or not sep else None
        if precision not in ("fp16", "bf16") or fast is None:
            raise ValueError(f"unknown arm {name!r}: fp16 or bf16, optionally with -fast or -aot")
        out.append((precision, fast))
    return out


def merge_rows(runs: list[list[dict]]) -> list[dict]:
    """The family rows of several runs as one list, a family once: its arms from every run, a
    later run's measurement of an arm replacing an earlier one's (a bf16 run merged onto the
    fp16 table keeps the fp16 arms)."""
    merged: dict[str, dict] = {}
    for rows in runs:
        for r in rows:
            prev = merged.get(r["family"])
            if prev is None:
                merged[r["family"]] = {**r, "arms": dict(r.get("arms", {}))}
            else:
                arms = {**prev["arms"], **r.get("arms", {})}
                merged[r["family"]] = {**prev, **r, "arms": arms}
    return list(merged.values())


def _json_value(v):
    """``v`` for the table file, which is strict JSON: a figure that is not a finite number (NaN
    scores made a score difference NaN) is null there, which the library reads as a breach."""
    return None if isinstance(v, float) and not np.isfinite(v) else v


def save_partial(args, row: dict) -> None:
    """The raw file as it stands: the families finished so far and ``row``, the one being measured
    (written whole to a temporary file, then renamed over --out)."""
    if getattr(args, "done_rows", None) is None:
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"contract": CONTRACT, "args": {k: v for k, v in vars(args).items() if k != "done_rows"},
                               "families": [*args.done_rows, row], "partial": True}, indent=2, default=str))
    tmp.replace(out)


def write(rows: list[dict], args) -> int:
    args.done_rows = None
    result = {"contract": CONTRACT, "args": vars(args), "families": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    md = markdown(rows)
    if args.markdown:
        Path(args.markdown).write_text(md)
    print(md)
    if args.table:   # the library's table: figures only (no parity details), per family and arm
        keep = ("graph_bitwise", "match_rate", "score_diff_p99", "map_diff", "map50_95", "detections",
                "device", "torch", "date", "error")
        table = {"about": TABLE_ABOUT, "contract": CONTRACT, "weights": args.weights,
                 "families": {r["family"]: {arm: {k: _json_value(f[k]) for k in keep if k in f}
                                            for arm, f in r["arms"].items()} for r in rows}}
        Path(args.table).write_text(json.dumps(table, indent=2) + "\n")
        print(f"table written to {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
