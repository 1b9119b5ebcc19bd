"""``libreyolo predict|train|val|export|verify|bench|info|demo``.

Arguments follow the LibreYOLO convention ``key=value`` and also accept ``--key value``,
``--key=value`` and bare ``--flag`` (= true). click/typer cannot parse the ``key=value``
form, hence this small parser; output uses rich. Every value is checked by the functions of
:mod:`libreyolo.options` that the Python API uses, so a bad value stops the command before any
model is loaded, with the same message (exit status 2).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from .options import (AMP_FAMILY_DEFAULT, MAX_SEED, OptionError, check_choice, check_float, check_fraction,
                      check_imgsz, check_int, parse_amp, parse_bool, parse_classes, parse_freeze, parse_loggers)

console = Console()


class UsageError(Exception):
    pass


# Option converters: each takes the text of one argument and returns its value, or raises
# OptionError (a ValueError) naming the option; the checks are those of the Python API
# (libreyolo.options), so `amp=flase` or `epochs=0` fail here exactly as they would there.


def _int(name: str, minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    return lambda v: check_int(name, v, minimum, maximum)


def _frac(name: str) -> Callable[[str], float]:
    return lambda v: check_fraction(name, v)


def _positive_float(name: str) -> Callable[[str], float]:
    return lambda v: check_float(name, v, 0.0, min_inclusive=False)


def _imgsz(name: str = "imgsz") -> Callable[[str], int]:
    # the family's stride is applied once the model is known (rounding up, with one warning)
    return lambda v: check_imgsz(v, 1, name)


def _flag(name: str) -> Callable[[str], bool]:
    return lambda v: parse_bool(name, v)


def _auto_flag(name: str) -> Callable[[str], bool | None]:
    """true/false, or auto (None: the library decides)."""
    return lambda v: None if str(v).strip().lower() in ("auto", "none") else parse_bool(name, v)


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    return lambda v: check_choice(name, v, choices)


def _graph_mode(v: str):
    s = str(v).strip().lower()
    if s == "auto":
        return "auto"
    try:
        return parse_bool("cuda_graph", v)
    except OptionError:
        raise OptionError(f"cuda_graph must be auto, true or false, got {v!r}") from None


def _amp(v: str):
    """amp as predict and train take it: False, True (the family's dtype), "fp16" or "bf16"."""
    import torch

    dtype = parse_amp(v)
    if dtype is None:
        return False
    if dtype is AMP_FAMILY_DEFAULT:
        return True
    return "bf16" if dtype is torch.bfloat16 else "fp16"


def _precision(v: str) -> str:
    """precision as predict takes it: fp32, fp16 or bf16."""
    from .engine.fastpath import parse_precision
    try:
        return parse_precision(v)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _fast(v: str) -> bool | str:
    """fast as predict takes it: true, false or aot."""
    from .engine.fastpath import parse_fast
    return parse_fast(v)


def _int_list(name: str, minimum: int) -> Callable[[str], list[int]]:
    def conv(v: str) -> list[int]:
        parts = [x.strip() for x in str(v).split(",")]
        if not parts or any(not x for x in parts):
            raise OptionError(f"{name} must be integers separated by commas, e.g. {name}=1,8, got {v!r}")
        return [check_int(name, x, minimum) for x in parts]
    return conv


def _classes(v: str) -> str:
    """The text of classes=; ids and names are checked against the model once it is loaded."""
    if not str(v).strip() or any(not t.strip() for t in str(v).split(",")):
        raise OptionError(f"classes must be class ids or names separated by commas, e.g. classes=0,2 or "
                          f"classes=person,car, got {v!r}")
    return str(v)


def _resume(v: str):
    """true/false, or the path of a run's last.pt."""
    try:
        return parse_bool("resume", v)
    except OptionError:
        pass
    if not Path(v).expanduser().is_file():
        raise OptionError(f"resume must be true, false or the path of a last.pt file, got {v!r} "
                          "(no such file)")
    return v


@dataclass
class Opt:
    conv: Callable[[str], Any]
    default: Any
    help: str


def _parse(argv: list[str], spec: dict[str, Opt], command: str) -> dict[str, Any]:
    raw: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            body = a[2:]
            if "=" in body:
                k, v = body.split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]:
                k, v = body, argv[i + 1]
                i += 1
            else:
                k, v = body, "true"
        elif "=" in a:
            k, v = a.split("=", 1)
        else:
            raise UsageError(f"unexpected argument {a!r}: use key=value or --key value")
        k = k.replace("-", "_")
        if k not in spec:
            raise UsageError(f"unknown option {k!r} for '{command}'; options: {', '.join(spec)}")
        raw[k] = v
        i += 1
    out = {}
    for k, o in spec.items():
        if k in raw:
            try:
                out[k] = o.conv(raw[k])
            except ValueError as exc:  # OptionError: the message names the option and the value
                raise UsageError(str(exc)) from None
        else:
            out[k] = o.default
    return out


def _need_model(opts: dict, command: str) -> None:
    if not opts.get("model"):
        raise UsageError(f"'{command}' needs model=... (a checkpoint such as LibreYOLO9t.pt, or a family/size "
                         "name such as yolo9t for an untrained model)")


def _load(opts: dict, seed: int | None = None):
    """The model named by ``opts["model"]``; ``seed`` makes an untrained one's initial weights
    reproducible (a run's ``seed`` then covers the whole run, not only what follows the init)."""
    from . import LibreYOLO
    if seed is not None:
        import torch
        torch.manual_seed(seed)
    return LibreYOLO(opts["model"], device=opts.get("device") or "auto")


# ---------------------------------------------------------------- commands
PREDICT = {
    "model": Opt(str, None, "checkpoint path or family/size name"),
    "source": Opt(str, None, "image, directory, glob, video file, camera index (0), rtsp/rtmp/http(s) URL or "
                             ".streams list (default: the bundled sample image)"),
    "imgsz": Opt(_imgsz(), None, "inference size (default: the checkpoint's)"),
    "conf": Opt(_frac("conf"), 0.25, "confidence threshold"),
    "iou": Opt(_frac("iou"), 0.45, "NMS IoU threshold"),
    "batch": Opt(_int("batch", 1), 1, "images per forward"),
    "max_det": Opt(_int("max_det", 1), None, "detections kept per image (default 300; an ONNX model's: its exported "
                                              "max_det)"),
    "classes": Opt(_classes, None, "only these classes: ids or names, e.g. 0,2 or person,car"),
    "device": Opt(str, "auto", "auto, cpu, cuda, cuda:1"),
    "cuda_graph": Opt(_graph_mode, "auto", "false, true or auto"),
    "amp": Opt(_amp, False, "false, true (the family's dtype), fp16 or bf16"),
    "precision": Opt(_precision, None, "fp32 (default, bitwise), fp16 or bf16: the half network (fp16 with fast=true)"),
    "fast": Opt(_fast, False, "CUDA: compile the half network with inductor inside the CUDA graph: true "
                              "(torch.compile) or aot (ahead of time, a package per shape cached on disk)"),
    "decode": Opt(_choice("decode", ("cpu", "gpu", "auto")), "cpu", "image files: cpu (PIL), gpu (JPEGs with nvjpeg, "
                                                                    "batched) or auto (gpu where it can run)"),
    "save": Opt(_flag("save"), True, "write annotated images"),
    "save_dir": Opt(str, None, "where annotated images go (default: a new runs/predict, runs/predict2, ...)"),
    "vid_stride": Opt(_int("vid_stride", 1), 1, "predict every N-th frame of a video"),
    "show": Opt(_flag("show"), False, "show the annotated frames in a window (where a display exists)"),
    "timeout": Opt(_positive_float("timeout"), 10.0, "seconds a camera or stream URL may take to answer"),
    "json": Opt(str, None, "also write all detections to this JSON file"),
    "points": Opt(str, None, "segment-prompt: points x,y;x,y in pixels, or 'center' (the default without boxes)"),
    "labels": Opt(str, None, "segment-prompt: one label per point, 1 foreground / 0 background, e.g. 1,0"),
    "boxes": Opt(str, None, "segment-prompt: boxes x1,y1,x2,y2;... in pixels"),
}


def cmd_predict(opts: dict, track: bool = False) -> int:
    command = "track" if track else "predict"
    _need_model(opts, command)
    from . import SAMPLE_IMAGE
    from .data.video import is_video_source
    model = _load(opts)
    task_opts = {}
    if "conf" in model.task.predict_defaults:   # detection's options
        task_opts = dict(conf=opts["conf"], iou=opts["iou"], classes=parse_classes(opts["classes"], model.names))
        if opts["max_det"] is not None:   # else the model's own (an ONNX export fixed its max_det)
            task_opts["max_det"] = opts["max_det"]
    elif model.TASK == "segment-prompt":        # the prompt (one per image)
        from .tasks.segment_prompt.prompts import parse_cli
        try:
            task_opts = parse_cli(opts["points"], opts["labels"], opts["boxes"])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    source = opts["source"] or SAMPLE_IMAGE
    call = (lambda src, **kw: model.track(src, tracker=opts["tracker"], **kw)) if track else model.predict
    common = dict(imgsz=opts["imgsz"], batch=opts["batch"], cuda_graph=opts["cuda_graph"], amp=opts["amp"],
                  save=opts["save"], save_dir=opts["save_dir"], verbose=True)
    if opts["show"]:
        common["show"] = True
    if opts["precision"] is not None or opts["fast"]:   # the default call stays today's call
        common.update(precision=opts["precision"], fast=opts["fast"])
    if opts["decode"] != "cpu":
        common["decode"] = opts["decode"]
    if is_video_source(source):  # frames are counted, not listed (a stream can run for hours)
        run = call(source, stream=True, vid_stride=opts["vid_stride"], timeout=opts["timeout"], **common, **task_opts)
        return _video_report(run, opts, model, track)
    results = list(call(source, **common, **task_opts))
    saved_to = str(Path(results[0].saved_to).parent) if results and results[0].saved_to else opts["save_dir"]
    for r in results:
        if r.boxes is not None:
            counts: dict[str, int] = {}
            for c in r.boxes.cls.tolist():
                name = r.names[int(c)]
                counts[name] = counts.get(name, 0) + 1
            what = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "no detections"
        elif getattr(r, "depth", None) is not None:
            what = f"relative inverse depth {r.depth.min:.3g} .. {r.depth.max:.3g}"
        elif isinstance(r.summary(), dict):   # one summary of the whole image (matting)
            what = ", ".join(f"{k} {v:.2f}" for k, v in r.summary().items() if isinstance(v, float))
        else:
            top = r.summary()[:3]
            what = ", ".join(f"{d.get('name', d.get('text'))} {d.get('confidence', d.get('area', 0)):.2f}"
                             for d in top) or "nothing found"
        ms = sum(v for v in r.speed.values() if v is not None)
        console.print(f"{r.path}: {r.orig_shape[1]}x{r.orig_shape[0]}, {what} ({ms:.1f} ms)")
    if opts["save"]:
        console.print(f"annotated images saved to [bold]{saved_to}[/]")
    if opts["json"]:
        Path(opts["json"]).write_text(json.dumps([{"path": r.path, "detections": r.summary()} for r in results],
                                                 indent=2))
        console.print(f"detections written to {opts['json']}")
    _graph_report(model, opts)
    return 0


def _graph_report(model, opts: dict) -> None:
    info = model.graph_info()
    console.print(f"cuda_graph={opts['cuda_graph']}: {len(info['graphs'])} graph(s), {info['replays']} replay(s)"
                  + (f"; eager because {info['fallbacks'][0]['reason']}" if info["fallbacks"] else ""))


def _video_report(run, opts: dict, model, track: bool) -> int:
    """Consume a video predict/track generator; print one summary line per source."""
    per_source: dict[str, dict] = {}
    rows = [] if opts["json"] else None
    for r in run:
        s = per_source.setdefault(r.path, {"frames": 0, "boxes": 0, "ids": set(), "ms": 0.0, "saved": r.saved_to})
        s["frames"] += 1
        s["boxes"] += len(r)
        s["ms"] += sum(v for v in r.speed.values() if v is not None)
        if r.boxes is not None and r.boxes.is_track:
            s["ids"].update(int(i) for i in r.boxes.id.tolist())
        if rows is not None:
            rows.append({"path": r.path, "frame": r.frame_index, "timestamp": r.timestamp, "detections": r.summary()})
    for path, s in per_source.items():
        tracks = f", {len(s['ids'])} track(s)" if track else ""
        console.print(f"{path}: {s['frames']} frame(s), {s['boxes']} box(es){tracks} "
                      f"({s['ms'] / max(1, s['frames']):.1f} ms per frame)"
                      + (f"; annotated video [bold]{s['saved']}[/]" if s["saved"] else ""))
    if rows is not None:
        Path(opts["json"]).write_text(json.dumps(rows, indent=2))
        console.print(f"detections written to {opts['json']}")
    _graph_report(model, opts)
    return 0


TRACK = {**PREDICT,
         "conf": Opt(_frac("conf"), 0.1, "confidence threshold (detections below the tracker's 0.25 only extend "
                                         "tracks)"),
         "tracker": Opt(_choice("tracker", ("bytetrack", "botsort")), "bytetrack", "bytetrack or botsort")}


def cmd_track(opts: dict) -> int:
    return cmd_predict(opts, track=True)


INFO = {"json": Opt(_flag("json"), False, "print JSON instead of tables")}


def cmd_info(opts: dict) -> int:
    import torch

    from . import __version__, list_models
    env = {"libreyolo": __version__, "torch": torch.__version__, "torchvision": _version("torchvision"),
           "cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda,
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    from .tasks import TASKS
    models = list_models()
    tasks = {name: sorted(m["family"] for m in models if m["task"] == name) for name in TASKS}
    if opts["json"]:
        print(json.dumps({"environment": env, "tasks": tasks, "models": models}, indent=2))
        return 0
    t = Table(title="libreyolo model families")
    for col in ("family", "sizes", "task", "checkpoint names", "predict graph", "train graph"):
        t.add_column(col)
    for m in models:
        train = ("whole step" if m["cuda_graph_train"] else
                 "backbone+encoder" if m["cuda_graph_train_seam"] else "no (eager)")
        t.add_row(m["family"], ", ".join(m["sizes"]), m["task"], f"{m['file_prefix']}<size>.pt",
                  ("front part (seam)" if m["cuda_graph_predict_seam"] else "yes") if m["cuda_graph"] else "no (eager)",
                  train)
    console.print(t)
    console.print("tasks: " + "; ".join(f"{k} ({', '.join(v) or '-'})" for k, v in tasks.items()))
    e = Table(title="environment", show_header=False)
    for k, v in env.items():
        e.add_row(k, str(v if v not in (None, []) else "-"))
    console.print(e)
    return 0


def _version(pkg: str) -> str:
    try:
        from importlib.metadata import version
        return version(pkg)
    except Exception:
        return "-"


VERIFY = {
    "model": Opt(str, None, "checkpoint path or family/size name"),
    "imgsz": Opt(_imgsz(), 640, "network input size"),
    "batch": Opt(_int_list("batch", 1), [1, 8], "batch sizes, e.g. 1,8"),
    "amp": Opt(_flag("amp"), True, "also verify under the family's autocast dtype"),
    "precision": Opt(_precision, None, "also verify the half path (fp16 or bf16): its graphs against it eager"),
    "fast": Opt(_fast, False, "with precision: the compiled (fast) half path: true (torch.compile) or aot"),
    "device": Opt(str, "cuda", "CUDA device"),
    "json": Opt(str, None, "write the report to this JSON file"),
}


def cmd_verify(opts: dict) -> int:
    _need_model(opts, "verify")
    import torch

    from .engine.verify import verify_model
    if not torch.cuda.is_available():
        console.print("[bold red]verify needs a CUDA GPU[/]: it runs the CUDA-graph parity protocol "
                      "(eager vs captured, bit for bit); this machine has none")
        return 2
    model = _load(opts)
    if not model.SUPPORTS_CUDA_GRAPH:
        console.print(f"[yellow]note:[/] {model.FAMILY} is not declared graph-capturable; verifying anyway")
    res = verify_model(model, imgsz=opts["imgsz"], batches=tuple(opts["batch"]),
                       amp_dtypes=(None, model.AMP_DTYPE) if opts["amp"] else (None,),
                       precisions=(opts["precision"] or ("fp16" if opts["fast"] else "fp32"),),
                       fast=opts["fast"])
    t = Table(title=f"parity: {model.FAMILY}-{model.size} on {torch.cuda.get_device_name(model.device)}, "
                    f"torch {torch.__version__}")
    for col in ("case", "outputs", "probes differ", "replay A == eager", "replay B == eager", "not stale",
                "max |diff|", "capture ms", "verdict"):
        t.add_column(col)
    for r in res:
        t.add_row(r.name, str(r.outputs), str(r.probes_differ), str(r.replay_a_equal), str(r.replay_b_equal),
                  str(r.not_stale), f"{r.max_abs_diff:.3g}", f"{r.capture_ms:.1f}",
                  "[green]PASS[/]" if r.passed else f"[red]FAIL[/] {r.error or ''}")
    console.print(t)
    ok = all(r.passed for r in res)
    console.print("[bold green]VERDICT: bitwise parity holds[/]" if ok else "[bold red]VERDICT: parity FAILED[/]")
    if opts["json"]:
        Path(opts["json"]).write_text(json.dumps([r.as_dict() for r in res], indent=2))
    return 0 if ok else 1


BENCH = {
    "model": Opt(str, "yolo9t", "checkpoint path or family/size name"),
    "imgsz": Opt(_imgsz(), 640, "network input size"),
    "batch": Opt(_int("batch", 1), 1, "batch size (above 1 also the batch arms: images/s eager, graph, fast)"),
    "chunks": Opt(_int("chunks", 1), 4, "batch arms: batches per predict call (chunks x batch images)"),
    "runs": Opt(_int("runs", 1), 200, "timed runs per arm (median reported)"),
    "warmup": Opt(_int("warmup", 0), 30, "untimed warm-up runs per arm"),
    "device": Opt(str, "auto", "auto, cpu, cuda"),
    "fuse": Opt(_flag("fuse"), False, "fold BatchNorm / re-parameterize first (every arm runs the fused network)"),
    "precision": Opt(_precision, "fp16", "dtype of the half and fast arms (CUDA): fp16 or bf16"),
    "compile": Opt(_flag("compile"), True, "CUDA: the torch.compile arms (reduce-overhead, fast path) with "
                                          "compile and warm-start times"),
    "compile_mode": Opt(_choice("compile_mode", ("default", "max-autotune-no-cudagraphs")), None,
                        "torch.compile mode of the fast arms (default: the library's)"),
    "aot": Opt(_flag("aot"), False, "CUDA, with compile: also the ahead-of-time fast arm (fast=aot: "
                                    "AOTInductor package build, its graph and a second process's warm start)"),
    "tf32": Opt(_flag("tf32"), None, "allow TF32 in float32 convolutions and matmuls (default: PyTorch's settings, "
                             "convolutions on, matmuls off); false = strict fp32"),
    "source": Opt(str, None, "a video file: frames/s eager vs graph on its frames, decode timed apart "
                             "(scripts/make_clip.py makes a 1080p one)"),
    "frames": Opt(_int("frames", 1), 300, "frames of source= used"),
    "json": Opt(str, None, "where to write the JSON result (default runs/bench/<model>-<imgsz>-b<batch>.json)"),
}


def cmd_bench(opts: dict) -> int:
    import torch

    from .benchmark import bench_model, write_json
    model = _load(opts)
    if opts["fuse"]:
        model.fuse()
    if opts["tf32"] is not None:  # for this process only: the bench is its own process
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = bool(opts["tf32"])
    if opts["source"]:
        return _bench_video(model, opts)
    if opts["compile_mode"]:   # for this process only: the bench is its own process
        from .engine import fastpath
        fastpath.COMPILE_MODE = opts["compile_mode"]
    res = bench_model(model, imgsz=opts["imgsz"], batch=opts["batch"], runs=opts["runs"], warmup=opts["warmup"],
                      precision=opts["precision"], compile_arms=opts["compile"], chunks=opts["chunks"],
                      aot=opts["aot"])
    tf32 = (f", TF32 conv {res['tf32']['cudnn']} / matmul {res['tf32']['matmul']}"
            if model.device.type == "cuda" else "")   # TF32 exists on CUDA only
    t = Table(title=f"{res['model']} imgsz={res['imgsz']} batch={res['batch']} on {res['device']} "
                    f"(torch {res['torch']}, {res['date']}{tf32})")
    for col in ("arm", "median ms", "p90 ms", "runs"):
        t.add_column(col)
    fixed = ("forward_eager", "forward_graph", "forward_graph_front_only", "forward_whole_graph",
             "predict_eager", "predict_graph")
    extra = [k for k, v in res["arms"].items() if k not in fixed and isinstance(v, dict) and "median_ms" in v]
    for arm in (*fixed, *extra):   # extra: the task's own arms (segment-prompt: set_image, prompt)
        if arm in res["arms"]:
            a = res["arms"][arm]
            t.add_row(arm, f"{a['median_ms']:.3f}", f"{a['p90_ms']:.3f}", str(a["runs"]))
    console.print(t)
    console.print(f"captured: {res['captured']}")
    whole = res["arms"].get("forward_whole_graph")
    if whole is not None:   # a seam family: the whole network captured as an experiment
        console.print("whole network captured (experiment, not what predict does): "
                      + (f"failed: {whole['error']}" if "error" in whole
                         else f"replay bitwise == eager: {whole['bitwise_equal_eager']}"))
    if "predict_graph_stages_ms_per_image" in res["arms"]:
        st = res["arms"]["predict_graph_stages_ms_per_image"]
        console.print("predict(graph) stages, ms per image: " + ", ".join(f"{k} {v:.3f}" for k, v in st.items()))
    if "capture" in res["arms"]:
        c = res["arms"]["capture"]
        console.print(f"capture: forward {c['forward_ms']:.1f} ms; "
                      f"forward graph bitwise == eager: {res['arms']['forward_graph_bitwise_equal_eager']}; "
                      f"predict graph == eager: {res['arms']['predict_graph_equal_eager']}")
    for note in res.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    if "compile" in res["arms"]:
        c = res["arms"]["compile"]
        console.print("compile: " + ", ".join(f"{k} {v:.1f} s" if isinstance(v, (int, float)) else f"{k} {v}"
                                              for k, v in c.items()))
    if "prompt_graph_equal_eager" in res["arms"]:
        console.print(f"prompt call graph == eager: {res['arms']['prompt_graph_equal_eager']}")
    batch_rows = [(k.removeprefix("batch_"), res["arms"][k]) for k in ("batch_eager", "batch_graph", "batch_fast")
                  if k in res["arms"]]
    if batch_rows:
        a0 = batch_rows[0][1]
        fg = res["arms"].get("forward_graph", {}).get("median_ms")
        console.print(f"batched predict ({a0['chunks']} x {a0['batch']} images per call), images/s: "
                      + ", ".join(f"{n} {a['images_per_s']:.0f} ({a['ms_per_batch']:.2f} ms/batch)"
                                  for n, a in batch_rows)
                      + (f"; graphed forward {fg:.2f} ms/batch" if fg else ""))
    r = res["ratios"]
    if r.get("batch_graph_over_eager_images_per_s"):
        console.print(f"batch: graph / eager images/s x{r['batch_graph_over_eager_images_per_s']:.2f}; "
                      f"graph ms per batch / graphed forward = {r['batch_graph_ms_per_batch_over_forward_graph']:.2f}")
    if r["forward_speedup"]:
        console.print(f"speedups: forward x{r['forward_speedup']:.2f}, predict x{r['predict_speedup']:.2f}; "
                      f"predict(graph) / forward(graph) = {r['predict_graph_over_forward_graph']:.2f}")
    else:
        console.print("graph arms skipped: " + ("no CUDA device" if model.device.type != "cuda"
                                                else f"{model.FAMILY} is not graph-capturable"))
    if model.TASK == "detect":
        console.print(f"detections per image: {res['detections_per_image']:.1f}"
                      + ("" if res["trained"] else " (untrained weights)"))
    if "text_lines_per_image" in res:
        console.print(f"text lines recognised per image: {res['text_lines_per_image']:.1f} on a page of "
                      f"{res['task_input']['lines_on_page']} ({res['task_input']['options']})")
    path = write_json(res, opts["json"] or f"runs/bench/{res['model']}-{res['imgsz']}-b{res['batch']}.json")
    console.print(f"written to {path}")
    return 0


def _bench_video(model, opts: dict) -> int:
    from .benchmark import bench_video, write_json
    res = bench_video(model, opts["source"], imgsz=opts["imgsz"], frames=opts["frames"],
                      warmup=min(opts["warmup"], max(0, opts["frames"] - 1)))
    v, a = res["video"], res["arms"]
    t = Table(title=f"{res['model']} imgsz={res['imgsz']} on {v['width']}x{v['height']} {v['codec']} "
                    f"({a['decode']['frames']} frames of {Path(str(v['source'])).name}), {res['device']}, "
                    f"torch {res['torch']}")
    for col in ("arm", "frames/s", "ms per frame", "note"):
        t.add_column(col)
    t.add_row("decode (PyAV, alone)", f"{a['decode']['fps']:.1f}", f"{a['decode']['ms_per_frame']:.2f}", "")
    for name in ("eager", "graph"):
        if f"predict_{name}" in a:
            p = a[f"predict_{name}"]
            first = ", ".join(f"{x:.1f}" for x in p["first_frames_ms"][:3])
            t.add_row(f"predict {name} (decoded frames)", f"{p['fps']:.1f}", f"{p['median_ms']:.2f}",
                      f"first frames {first} ms")
    for name in ("eager", "graph"):
        if f"video_{name}" in a:
            e = a[f"video_{name}"]
            note = (f"{e['captures']} capture(s), first replay at frame {e['first_replay_at_frame']}"
                    if name == "graph" else "decode overlapped in its thread")
            t.add_row(f"video {name} (end to end)", f"{e['fps']:.1f}", f"{1e3 / e['fps']:.2f}", note)
    console.print(t)
    if res["graph"] != "measured":
        console.print(f"graph arms skipped: {res['graph']} (eager only)")
    path = write_json(res, opts["json"] or f"runs/bench/{res['model']}-{res['imgsz']}-video.json")
    console.print(f"written to {path}")
    return 0


TRAIN = {
    "model": Opt(str, "yolo9t", "checkpoint to fine-tune, or a family/size name for an untrained model"),
    "data": Opt(str, "shapes", "dataset YAML (YOLO or COCO format) or 'shapes' (built-in synthetic set)"),
    "epochs": Opt(_int("epochs", 1), 100, "training epochs"),
    "batch": Opt(_int("batch", 1), 16, "batch size"),
    "imgsz": Opt(_imgsz(), None, "training size (default: the family's, e.g. 640 for detectors, 224 for classifiers)"),
    "device": Opt(str, "auto", "auto, cpu, cuda, cuda:1; several GPUs (0,1) train one process per GPU under "
                               "torchrun (batch is then the global batch)"),
    "workers": Opt(_int("workers", 0), None, "DataLoader workers (default: up to 8 on CUDA, 2 on the CPU)"),
    "optimizer": Opt(_choice("optimizer", ("SGD", "AdamW")), None,
                     "SGD or AdamW (default: the family's recipe, SGD for the YOLO families)"),
    "lr0": Opt(_positive_float("lr0"), None, "initial learning rate (default: the family's, else 0.01 SGD, "
                                             "0.001 AdamW)"),
    "cos_lr": Opt(_flag("cos_lr"), False, "cosine instead of linear decay"),
    "amp": Opt(_amp, True, "autocast on CUDA: true (float16), fp16, bf16 or false"),
    "close_mosaic": Opt(_int("close_mosaic", 0), None, "epochs at the end trained without mosaic and MixUp "
                                                      "(default: the family's, else 10)"),
    "mixup": Opt(_frac("mixup"), None, "probability of MixUp (default: the family's, else 0)"),
    "mosaic": Opt(_frac("mosaic"), None, "probability of mosaic (default: the family's, else 1; DETRs 0)"),
    "augment_policy": Opt(_choice("augment_policy", ("yolo", "detr")), None,
                          "yolo (affine + HSV) or detr (photometric, zoom-out, IoU crop); default: the family's"),
    "project": Opt(str, "runs/train", "where runs are written"),
    "name": Opt(str, "exp", "run name"),
    "exist_ok": Opt(_flag("exist_ok"), False, "reuse the run folder"),
    "resume": Opt(_resume, False, "true (this run's last.pt) or a path to last.pt"),
    "seed": Opt(_int("seed", 0, MAX_SEED), 0, "random seed"),
    "cuda_graph": Opt(_flag("cuda_graph"), False, "capture the training step in CUDA graphs (eager fallback, "
                                                  "one log line)"),
    "cache": Opt(str, "auto", "ram or disk: decode and resize every image once, before the first epoch; "
                               "auto (default): in RAM when the images need at most a quarter of the free "
                               "memory and 4 GiB; false: read the files every epoch"),
    "channels_last": Opt(_auto_flag("channels_last"), None, "NHWC network and batches: true, false or auto "
                                                           "(on CUDA for the families that declare it)"),
    "gpu_augment": Opt(_flag("gpu_augment"), None, "the YOLO recipe (mosaic, affine, HSV, flip) on the training "
                                                   "device per batch, the workers only decode (default false; "
                                                   "augment_policy=yolo only)"),
    "val": Opt(_flag("val"), True, "validate after every epoch (false: no validation, best.pt = last.pt)"),
    "patience": Opt(_int("patience", 0), 0, "stop after N epochs without a better validation fitness (0: never)"),
    "freeze": Opt(parse_freeze, None, "freeze the first N layers, or parameter-name prefixes, e.g. "
                                      "freeze=3 or freeze=backbone,neck.down1"),
    "save_period": Opt(_int("save_period", 0), 0, "also save weights/epochN.pt every N epochs (0: never)"),
    "loggers": Opt(parse_loggers, None, "experiment loggers: tensorboard (event files in the run folder)"),
    "sync_bn": Opt(_flag("sync_bn"), False, "multi-GPU: BatchNorm statistics over the global batch (SyncBatchNorm)"),
    "ddp_timeout": Opt(_positive_float("ddp_timeout"), 1800.0, "multi-GPU: seconds a rank waits for the others "
                                                             "before the run stops with an error"),
}


def cmd_train(opts: dict, argv: list[str] | None = None) -> int:
    from .distributed import env_rank, launched, local_device, parse_devices
    from .launch import check_gpus, cli_train_command, launch
    try:
        gpus = parse_devices(opts["device"])
        if gpus is not None and not launched():
            check_gpus(gpus)
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    if gpus is not None and not launched():
        # several GPUs: the same command, one process per GPU, under torchrun
        if argv is None:
            raise UsageError("device= lists several GPUs: run the command line form (libreyolo train ...), or "
                             "torchrun --nproc-per-node N -m libreyolo.cli train ...")
        return launch(cli_train_command(argv, len(gpus)))
    at_command = _process_age()   # the interpreter's start and the command line's imports
    if launched():   # one rank of a torchrun run: the model on this rank's device
        model = _load({**opts, "device": local_device(opts["device"])}, seed=opts["seed"])
    else:
        model = _load(opts, seed=opts["seed"])
    resume = opts.pop("resume")
    kw = {k: v for k, v in opts.items() if k not in ("model",)}
    before = _process_age()   # ... then the library's imports, the model and its device, up to here
    res = model.train(resume=resume, **kw)
    if env_rank() != 0:
        return 0   # rank 0 reports the run
    t = Table(title=f"trained {model.FAMILY}-{model.size} on {opts['data']} ({res['epochs']} epochs, "
                    f"{res['time_s']:.0f} s)")
    names = res["loss_names"]
    metric_cols = [k for k in (res["history"][0] if res["history"] else {}) if k.startswith("metrics/")]
    for col in ("epoch", *names, *(k.split("/", 1)[1] for k in metric_cols)):
        t.add_column(col)
    for h, losses in zip(res["history"], res["losses"]):
        t.add_row(str(h["epoch"]), *(f"{v:.4f}" for v in losses), *(f"{h[k]:.4f}" for k in metric_cols))
    console.print(t)
    g = res["cuda_graph"]
    if opts["cuda_graph"]:
        console.print(f"cuda_graph: {g['replays']} captured steps, {g['eager_steps']} eager"
                      + (f" ({g['disabled_reason']})" if g["disabled_reason"] else ""))
    console.print(f"weights: [bold]{res['best']}[/] (best), {res['last']} (last); curves: {res['run_dir']}/results.png")
    from .engine.trainer import timing_line
    console.print("time: " + (f"{before:.1f} s from the process's start to train() ({at_command:.1f} to the "
                              f"command, {before - at_command:.1f} the library's imports and the model); "
                              if before is not None else "") + timing_line(res["timing"]), highlight=False)
    return 0


def _process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: the demo's held-out picture falls back to this threshold (top 5) when nothing reaches ``conf``
DEMO_FALLBACK_CONF = 0.001

#: the demo's data: the built-in shapes in their ``easy`` style (3 to 6 large, non-overlapping
#: shapes of all five classes in random colours on calm backgrounds; see
#: :data:`libreyolo.data.synthetic.SHAPES_STYLES`), generated on first use and cached apart from
#: the default ``shapes`` set. Its validation split comes from its own random stream and is never
#: trained on; the held-out picture is one of its images.
DEMO_DATA = {"style": "easy", "n_train": 320, "n_val": 64, "imgsz": 320}

DEMO = {
    "model": Opt(str, "yolo9t", "family/size to train from scratch, or a checkpoint to fine-tune"),
    "epochs": Opt(_int("epochs", 1), 10, "training epochs"),
    "imgsz": Opt(_imgsz(), 128, "training and inference size"),
    "batch": Opt(_int("batch", 1), 8, "batch size"),
    "optimizer": Opt(_choice("optimizer", ("SGD", "AdamW")), "AdamW", "SGD or AdamW"),
    "lr0": Opt(_positive_float("lr0"), 0.002, "initial learning rate"),
    "close_mosaic": Opt(_int("close_mosaic", 0), None, "final epochs without mosaic (default: a third of the epochs)"),
    "device": Opt(str, "auto", "auto, cpu, cuda"),
    "workers": Opt(_int("workers", 0), None, "DataLoader workers (default: up to 8 on CUDA, 2 on the CPU)"),
    "cuda_graph": Opt(_graph_mode, "auto", "auto = on when a CUDA GPU is present"),
    "project": Opt(str, "runs/demo", "where the run and the picture go"),
    "conf": Opt(_frac("conf"), 0.25, "confidence threshold for the held-out prediction"),
    "seed": Opt(_int("seed", 0, MAX_SEED), 0, "random seed (initial weights, data order, augmentation)"),
}


def demo_train_args(opts: dict) -> dict:
    """The ``model.train`` arguments of a demo run with the (parsed) demo options ``opts``, less
    ``data``: AdamW at a fixed rate, one warm-up epoch at most, mosaic closed for the last third
    (``close_mosaic``), the nominal batch equal to the batch (no accumulation: each batch is an
    update, which is what a few hundred steps need), the run in ``<project>/train``."""
    epochs = opts["epochs"]
    close = opts["close_mosaic"] if opts["close_mosaic"] is not None else max(1, epochs // 3)
    return dict(epochs=epochs, imgsz=opts["imgsz"], batch=opts["batch"], optimizer=opts["optimizer"],
                lr0=opts["lr0"], workers=opts["workers"], project=opts["project"], name="train",
                close_mosaic=close, warmup_epochs=min(1.0, epochs / 3), nbs=opts["batch"], exist_ok=True,
                seed=opts["seed"])


def demo_matches(result, sample, iou: float = 0.5) -> int:
    """How many of ``sample``'s labelled objects one of ``result``'s boxes finds with the right
    class (IoU >= ``iou``; each box counts for one object at most, the most confident first)."""
    import torch
    from torchvision.ops import box_iou

    labels = torch.as_tensor(sample.labels, dtype=torch.float32).reshape(-1, 5)
    if not len(result) or not len(labels):
        return 0
    gt = labels[:, 1:5] * torch.tensor([sample.width, sample.height] * 2, dtype=torch.float32)  # to pixels
    ious = box_iou(result.boxes.xyxy.float().cpu(), gt)
    cls = result.boxes.cls.cpu()
    free = torch.ones(len(labels), dtype=torch.bool)
    for j in torch.argsort(result.boxes.conf.cpu(), descending=True).tolist():
        ok = free & (labels[:, 0] == cls[j]) & (ious[j] >= iou)
        if ok.any():
            free[torch.argmax(torch.where(ok, ious[j], -1.0))] = False
    return int((~free).sum())


def cmd_demo(opts: dict) -> int:
    """Train briefly on the built-in shapes (easy style), report the metrics of the saved best.pt,
    predict a held-out image at ``conf`` with it and save the annotated picture."""
    import time

    from .data.datasets import resolve_data
    from .data.synthetic import make_shapes_dataset
    from .weights import load_checkpoint
    t0 = time.time()
    model = _load(opts, seed=opts["seed"])
    on_gpu = model.device.type == "cuda"
    graph = opts["cuda_graph"]
    graph = on_gpu if graph == "auto" else bool(graph)
    data_yaml = make_shapes_dataset(**DEMO_DATA)
    data = resolve_data(data_yaml)
    console.print(f"[bold]demo[/]: training {model.FAMILY}-{model.size} on the built-in shapes "
                  f"({DEMO_DATA['style']} style: {len(data.train)} training images, {len(data.val)} held-out "
                  f"validation images in {data_yaml.parent}) for {opts['epochs']} epochs at {opts['imgsz']} px "
                  f"on {model.device}" + (" with CUDA-graph capture" if graph else ""))
    res = model.train(data=str(data_yaml), cuda_graph=graph, **demo_train_args(opts))
    # the metrics printed are those of the checkpoint the demo names and predicts with: best.pt
    # (the epoch of best fitness, whose validation it carries), not the last epoch's
    ckpt = load_checkpoint(res["best"])
    m = ckpt.get("train_metrics") or {}
    best = type(model).from_checkpoint(ckpt, device=model.device, source=res["best"])
    console.print(f"validation of {res['best']} (epoch {res['best_epoch']} of {res['epochs']}; {res['time_s']:.0f} s "
                  f"of training) on the {len(data.val)} held-out images: mAP50 {m.get('map50', float('nan')):.3f}, "
                  f"mAP50-95 {m.get('map50_95', float('nan')):.3f}, precision {m.get('precision', float('nan')):.3f}, "
                  f"recall {m.get('recall', float('nan')):.3f}")
    held_out = max(data.val, key=lambda s: len(s.labels))   # the held-out image with the most objects
    conf = opts["conf"]
    mode = "auto" if on_gpu else False
    r = best.predict(str(held_out.image), imgsz=opts["imgsz"], conf=conf, cuda_graph=mode)[0]
    note = f"at conf >= {conf}"
    if not len(r):  # a weak model (fewer epochs, a harder start) may not be confident yet: show its best guesses
        r = best.predict(str(held_out.image), imgsz=opts["imgsz"], conf=DEMO_FALLBACK_CONF, max_det=5,
                         cuda_graph=mode)[0]
        note = (f"none reached conf {conf} after this short training; " +
                (f"its {len(r)} most confident (conf >= {DEMO_FALLBACK_CONF})" if len(r) else
                 f"none even at conf {DEMO_FALLBACK_CONF}: train longer (epochs=)"))
    out = Path(opts["project"]) / "prediction.jpg"
    r.save(out)
    found = ", ".join(f"{r.names[int(c)]} {float(p):.2f}" for c, p in zip(r.boxes.cls.tolist(), r.boxes.conf.tolist()))
    console.print(f"held-out image {held_out.image.name} ({len(held_out.labels)} objects): {len(r)} detection(s) "
                  f"{note}, {demo_matches(r, held_out)} of the {len(held_out.labels)} objects found with the right "
                  f"class{': ' + found if found else ''}")
    console.print(f"annotated picture saved to [bold]{out}[/] (the demo took {time.time() - t0:.0f} s)")
    return 0


VAL = {
    "model": Opt(str, None, "checkpoint path"),
    "data": Opt(str, "shapes", "dataset YAML or 'shapes'"),
    "imgsz": Opt(_imgsz(), None, "size (default: the checkpoint's)"),
    "batch": Opt(_int("batch", 1), 16, "batch size"),
    "device": Opt(str, "auto", "auto, cpu, cuda"),
    "conf": Opt(_frac("conf"), 0.001, "confidence threshold"),
    "iou": Opt(_frac("iou"), 0.7, "NMS IoU threshold"),
    "save_json": Opt(_flag("save_json"), False, "also write the predictions as COCO results (predictions.json)"),
    "save_dir": Opt(str, None, "where predictions.json goes (default: a new runs/val, runs/val2, ...)"),
}


def cmd_val(opts: dict) -> int:
    _need_model(opts, "val")
    model = _load(opts)
    if model.TASK != "detect":
        res = model.val(data=opts["data"], imgsz=opts["imgsz"], batch=opts["batch"], save_json=opts["save_json"])
        t = Table(title=f"{model.FAMILY}-{model.size} on {opts['data']}")
        for col in ("metric", "value"):
            t.add_column(col)
        for k, v in res.items():
            if isinstance(v, float):
                t.add_row(k, f"{v:.4f}")
        console.print(t)
        return 0
    res = model.val(data=opts["data"], imgsz=opts["imgsz"], batch=opts["batch"], conf=opts["conf"], iou=opts["iou"],
                    save_json=opts["save_json"], save_dir=opts["save_dir"])
    t = Table(title=f"{model.FAMILY}-{model.size} on {opts['data']}")
    for col in ("class", "instances", "mAP50", "mAP50-95"):
        t.add_column(col)
    for name, r in res.get("per_class", {}).items():
        t.add_row(str(name), str(r.get("instances", "")), f"{r['map50']:.4f}", f"{r['map50_95']:.4f}")
    t.add_row("all", "", f"{res['map50']:.4f}", f"{res['map50_95']:.4f}")
    console.print(t)
    if res.get("predictions_json"):
        console.print(f"COCO results: {res['predictions_json']}")
    return 0


EXPORT = {
    "model": Opt(str, None, "checkpoint path or family/size name"),
    "format": Opt(_choice("format", ("onnx",)), "onnx", "export format"),
    "file": Opt(str, None, "where to write (default: beside the checkpoint, same name, .onnx)"),
    "imgsz": Opt(_imgsz(), None, "input size (default: the checkpoint's)"),
    "batch": Opt(_int("batch", 1), 1, "batch size of a static graph"),
    "dynamic": Opt(_flag("dynamic"), False, "symbolic batch, height and width"),
    "half": Opt(_flag("half"), False, "float16 weights (onnxruntime's CPU fp16 kernels are limited)"),
    "simplify": Opt(_flag("simplify"), False, "run onnxscript's optimizer over the graph"),
    "opset": Opt(_int("opset", 11), None, "ONNX opset (default 17)"),
    "max_det": Opt(_int("max_det", 1), 300, "detections per image (rows of the output)"),
    "max_nms": Opt(_int("max_nms", 1), None, "candidates per image entering NMS (default 1000, or max_det when "
                                              "larger)"),
    "agnostic_nms": Opt(_flag("agnostic_nms"), False, "NMS across classes"),
    "topk": Opt(_int("topk", 1), 5, "classes a classifier's graph returns"),
    "device": Opt(str, "cpu", "where the model is loaded before export"),
}


def cmd_export(opts: dict) -> int:
    _need_model(opts, "export")
    model = _load(opts)
    kw = {k: v for k, v in opts.items() if k not in ("model", "format", "device")}
    path = model.export(format=opts["format"], **kw)
    console.print(f"exported {model.FAMILY}-{model.size} ({model.TASK}) to [bold]{path}[/]")
    return 0


COMMANDS: dict[str, tuple[Callable[[dict], int], dict, str]] = {
    "demo": (cmd_demo, DEMO, "train briefly on built-in data, validate, predict a held-out image, save it"),
    "train": (cmd_train, TRAIN, "train a model (data=shapes: the built-in synthetic set)"),
    "val": (cmd_val, VAL, "mAP50 / mAP50-95 on a dataset's validation split"),
    "predict": (cmd_predict, PREDICT, "detect objects in images or videos and save annotated pictures/videos"),
    "track": (cmd_track, TRACK, "detect and track objects in a video, camera or stream (ids on the boxes)"),
    "verify": (cmd_verify, VERIFY, "run the CUDA-graph parity protocol on this GPU"),
    "export": (cmd_export, EXPORT, "write the model as ONNX (with its post-processing) for other runtimes"),
    "bench": (cmd_bench, BENCH, "measure eager vs graphed forward and end-to-end predict (source=clip.mp4: on "
                                "a video's frames)"),
    "info": (cmd_info, INFO, "families, sizes, tasks, graph support, torch/CUDA versions"),
}


def _show_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _options_help(spec: dict[str, Opt], width: int | None = None) -> str:
    """One entry per option: the name, then its help in one aligned column (wrapped to the
    terminal), with one default note: the help's own when it explains the default, else
    "(default: X)"; none for options that are off unless given (default None)."""
    import shutil
    import textwrap

    width = width or max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    col = 2 + max(len(k) for k in spec) + 2
    lines = []
    for k, o in spec.items():
        text = o.help
        if "default" not in text.lower() and o.default is not None:
            text += f" (default: {_show_default(o.default)})"
        lines.extend(textwrap.wrap(text, width=width, initial_indent=f"  {k}".ljust(col),
                                   subsequent_indent=" " * col, break_on_hyphens=False))
    return "\n".join(lines)


def _usage() -> str:
    lines = ["usage: libreyolo COMMAND key=value ...", "", "commands:"]
    for name, (_, spec, text) in COMMANDS.items():
        lines.append(f"  {name:8s} {text}")
    lines += ["", "e.g.  libreyolo predict model=LibreYOLO9t.pt source=img.jpg conf=0.25 cuda_graph=auto",
              "      libreyolo COMMAND --help   lists a command's options"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from .logs import stream_handler
    logging.basicConfig(level=logging.INFO, handlers=[stream_handler()])   # "libreyolo: <message>"
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version", "version"):
        from . import __version__
        print(f"libreyolo {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"libreyolo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    fn, spec, text = COMMANDS[name]
    if any(a in ("-h", "--help") for a in rest):
        print(f"libreyolo {name}: {text}\n\noptions (key=value or --key value):")
        print(_options_help(spec))
        return 0
    try:
        if fn is cmd_train:   # it may re-launch itself under torchrun with the same arguments
            return cmd_train(_parse(rest, spec, name), argv=rest)
        return fn(_parse(rest, spec, name))
    except (UsageError, OptionError) as exc:  # OptionError: a value only checkable with the model (classes)
        print(f"libreyolo {name}: {exc}", file=sys.stderr)
        return 2
    except (OSError, ImportError, ValueError, NotImplementedError, RuntimeError) as exc:
        # OSError: a missing file, a full disk (CheckpointSaveError); ImportError: an optional package
        console.print(f"[bold red]error:[/] {exc}")
        return 1


def entry() -> None:
    """The ``libreyolo`` program (console script and ``python -m libreyolo.cli``): :func:`main`,
    then a prompt exit. Once the command is done - its files closed, its threads joined, its
    loader workers stopped - the exit handlers run (logging, multiprocessing, torch's) and the
    process ends without the interpreter's teardown of every module and object, which for a
    torch process (and its CUDA context) takes seconds; the operating system reclaims the memory
    and the device at once. Output is flushed first."""
    import atexit
    import threading
    try:
        rc = main()
    except KeyboardInterrupt as exc:   # Ctrl-C: one line, no traceback, the shell's 128 + SIGINT
        if type(exc).__name__ != "TrainingInterrupted":   # a training run logged its own line
            print("libreyolo: interrupted", file=sys.stderr)
        rc = 130
    for thread in threading.enumerate():   # what a normal exit waits for, too
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe: nothing more can be said
            pass
    os._exit(0 if rc is None else rc if isinstance(rc, int) else 1)   # as sys.exit(rc)


if __name__ == "__main__":
    entry()
