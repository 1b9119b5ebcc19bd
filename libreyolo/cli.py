"""``libreyolo predict|train|val|export|verify|bench|info|demo``.

Arguments follow the LibreYOLO convention ``key=value`` and also accept ``--key value``,
``--key=value`` and bare ``--flag`` (= true). click/typer cannot parse the ``key=value``
form, hence this small parser; output uses rich.

The options of train, predict, track, val and export are not declared here: they are made from
the fields of the options dataclasses the Python API checks its arguments with (the training
groups of :mod:`libreyolo.engine.config`, each task's Options, and
:mod:`libreyolo.engine.call_options`), each with its default, help and check. So every option of
``model.train()``/``predict()``/``val()``/``export()`` is an option here, and a bad value stops
the command before any model is loaded with the API's message (exit status 2). Only what belongs
to the command line (``model=``, ``source=``, ``json=``, the commands verify, bench, info and demo)
is declared in this module.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .options import (
    MAX_SEED,
    OptionError,
    OptionInfo,
    check_choice,
    check_float,
    check_fraction,
    check_imgsz,
    check_int,
    did_you_mean,
    option_fields,
    parse_bool,
    parse_classes,
)

console = Console(soft_wrap=True)   # long lines (paths) are never broken mid-path; tables fit the width
err_console = Console(stderr=True, soft_wrap=True)   # errors go to standard error: a pipe of the output stays clean


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


@dataclass
class Opt:
    """One command-line option: its converter (text -> value, raising OptionError), default and
    help; ``info``: the API option it is made from (None: an option of the command line only)."""

    conv: Callable[[str], Any]
    default: Any
    help: str
    info: OptionInfo | None = None


def _api_option(info: OptionInfo, default: Any = None, help: str | None = None) -> Opt:
    """The command-line form of an API option (its check, default and help)."""
    return Opt(info.parse, info.default if default is None else default, info.help if help is None else help, info)


def _fields_spec(cls: Any, defaults: dict[str, Any] | None = None, skip: tuple[str, ...] = ()) -> dict[str, Opt]:
    """The options of dataclass ``cls`` on the command line (``defaults``: where the command's
    default is not the API's, e.g. predict saves its pictures; fields declared ``cli=False`` and
    ``skip`` are left out)."""
    defaults = defaults or {}
    return {i.name: _api_option(i, defaults.get(i.name)) for i in option_fields(cls)
            if i.meta.get("cli", True) and i.name not in skip}


def _task_options() -> dict[str, dict[str, OptionInfo]]:
    """Each training option of the tasks: {name: {task: its declaration}}, in task order."""
    from .tasks import TASKS
    out: dict[str, dict[str, OptionInfo]] = {}
    for task_name in TASKS:
        for info in option_fields(TASKS[task_name].Options):
            out.setdefault(info.name, {})[task_name] = info
    return out


def _union(name: str, infos: dict[str, OptionInfo]) -> Opt:
    """A training option several tasks declare, each its own way: the help of each; a value must
    pass one of their checks here, and passes the model's task's once the model is known."""
    first = next(iter(infos.values()))
    by_help: dict[str, list[str]] = {}
    for task, i in infos.items():
        by_help.setdefault(i.help, []).append(task)
    helps = "; ".join(f"{', '.join(tasks)}: {text}" for text, tasks in by_help.items())
    if len(infos) == 1:
        return _api_option(first, help=helps)

    def conv(text: str) -> Any:
        for info in infos.values():
            try:
                return info.parse(text)
            except ValueError:
                pass
        return text   # refused by every task: the model's task's check says why (_check_task_options)

    defaults = {repr(i.default) for i in infos.values()}
    if len(defaults) > 1 and "default" not in helps.lower():
        helps += " (default: " + ", ".join(f"{task} {_show_default(i.default)}" for task, i in infos.items()) + ")"
    return Opt(conv, first.default, helps, first)


class _Spec(Mapping):
    """A command's options, made on first use: the options dataclasses import the library (and
    torch), which ``libreyolo --help`` and the parsing of other commands need not wait for."""

    def __init__(self, make: Callable[[], dict[str, Opt]]):
        self._make = make
        self._table: dict[str, Opt] | None = None

    def _get(self) -> dict[str, Opt]:
        if self._table is None:
            self._table = self._make()
        return self._table

    def __getitem__(self, key: str) -> Opt:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class Parsed(dict):
    """A command's options, every one (given or default); ``given``: the names on the command line,
    ``raw``: their text."""

    given: set[str]
    raw: dict[str, str]


def _parse(argv: list[str], spec: Mapping[str, Opt], command: str) -> Parsed:
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
            raise UsageError(f"unknown option {k!r} for '{command}'{did_you_mean([k], spec)}; options: "
                             f"{', '.join(spec)}")
        raw[k] = v
        i += 1
    out = Parsed()
    for k, o in spec.items():
        if k in raw:
            try:
                out[k] = o.conv(raw[k])
            except ValueError as exc:  # OptionError: the message names the option and the value
                raise UsageError(str(exc)) from None
        else:
            out[k] = o.default
    out.given, out.raw = set(raw), raw
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
def _predict_spec(track: bool = False) -> dict[str, Opt]:
    from .engine.call_options import PredictOptions, TrackOptions
    return {
        "model": Opt(str, None, "checkpoint path or family/size name"),
        "source": Opt(str, None, "image, directory, glob, video file, camera index (0), rtsp/rtmp/http(s) URL or "
                                 ".streams list (default: the bundled sample image)"),
        # the command line shows what it predicts: it saves the annotated pictures, reports as it
        # goes and captures CUDA graphs once a size repeats, unless told otherwise
        **_fields_spec(TrackOptions if track else PredictOptions,
                       defaults={"save": True, "verbose": True, "cuda_graph": "auto"}, skip=("persist",)),
        "device": Opt(str, "auto", "auto, cpu, cuda, cuda:1"),
        "json": Opt(str, None, "also write all detections to this JSON file"),
    }


PREDICT = _Spec(_predict_spec)
#: options of the command line itself, not of model.predict
_CLI_ONLY = ("model", "source", "device", "json")


def _predict_kwargs(opts: Parsed, model, command: str, spec: Mapping[str, Opt]) -> dict[str, Any]:
    """The keywords of ``model.predict``/``track``: the options given, those whose default here is
    not the API's, and the task's own options (for the model's task only)."""
    own = set(model.task_def.predict_defaults)
    kw: dict[str, Any] = {}
    for k, o in spec.items():
        if k in _CLI_ONLY or k == "tracker":
            continue
        tasks = o.info.meta.get("tasks") if o.info is not None else None
        if tasks:
            if k in opts.given and k not in own:
                raise UsageError(f"{k} is an option of {', '.join(tasks)} models; {model.FAMILY}-{model.size} is a "
                                 f"{model.TASK} model" + (f" (its options: {', '.join(sorted(own))})" if own else ""))
            if k in opts.given or (k in own and o.default != o.info.default):
                kw[k] = opts[k]
        elif k in opts.given or o.default != o.info.default:
            kw[k] = opts[k]
    return kw


def cmd_predict(opts: Parsed, track: bool = False) -> int:
    command = "track" if track else "predict"
    _need_model(opts, command)
    from . import SAMPLE_IMAGE
    from .data.video import is_video_source
    model = _load(opts)
    if track and getattr(model, "TASK", None) == "segment-prompt":   # SAM 2 / EdgeTAM: video propagation
        return _track_prompted(model, opts)
    spec = TRACK if track else PREDICT
    kw = _predict_kwargs(opts, model, command, spec)
    if kw.get("classes") is not None:   # ids and names resolved now: a bad one is a usage error
        kw["classes"] = parse_classes(kw["classes"], model.names)
    if getattr(model, "TASK", None) == "segment-prompt":   # the prompt (one per image)
        from .tasks.segment_prompt.prompts import default_prompt, parse_cli
        try:
            prompt = parse_cli(kw.pop("points", None), kw.pop("labels", None), kw.pop("boxes", None),
                               grid=kw.get("prompts") is not None,
                               default={} if kw.get("mask_input") is not None else default_prompt(model))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        kw.update(prompt)
    source = opts["source"] or SAMPLE_IMAGE
    call = (lambda src, **k: model.track(src, tracker=opts["tracker"], **k)) if track else model.predict
    try:
        if is_video_source(source):  # frames are counted, not listed (a stream can run for hours)
            return _video_report(call(source, **{**kw, "stream": True}), opts, model, track)
        out = call(source, **kw)
        results = out if isinstance(out, list) else [out]   # one image: its one Results
    except TypeError as exc:   # an option this kind of model does not take (e.g. decode= for an ONNX model)
        if "unknown predict option" in str(exc) or "unexpected keyword argument" in str(exc):
            raise UsageError(f"{exc} ({model.FAMILY}-{model.size}, {model.TASK})") from None
        raise
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


#: what ``libreyolo track`` passes to a segment-prompt model's video propagation (SAM 2, EdgeTAM:
#: ``model.track(source, points=..., labels=..., boxes=..., frame=..., obj_id=...)``)
_PROMPT_TRACK = ("points", "labels", "boxes", "frame", "obj_id", "save", "save_dir", "exist_ok", "cuda_graph",
                 "vid_stride", "verbose")


def _track_prompted(model, opts: Parsed) -> int:
    """``libreyolo track`` of a segment-prompt model: one object prompted on one frame of a video
    and followed through it (``model.track``, :mod:`libreyolo.tasks.segment_prompt.video`)."""
    name = f"{model.FAMILY}-{model.size}"
    if not hasattr(model, "has_video"):
        raise UsageError(f"{name} segments images (libreyolo predict); following prompted objects through a video "
                         "is SAM 2's and EdgeTAM's: libreyolo track model=sam2-tiny source=clip.mp4 points=x,y "
                         "labels=1 frame=0")
    bad = sorted(opts.given - set(_PROMPT_TRACK) - set(_CLI_ONLY))
    if bad:
        raise UsageError(f"{', '.join(bad)}: not an option of {name}'s video propagation; its options: "
                         f"{', '.join(_CLI_ONLY + _PROMPT_TRACK)}")
    if not opts["source"]:
        raise UsageError(f"track needs source=... (a video file, camera or stream) for {name}")
    from .tasks.segment_prompt.prompts import parse_cli
    try:
        kw = parse_cli(opts["points"], opts["labels"], opts["boxes"], default={})
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not kw:
        raise UsageError(f"track needs a prompt for {name}: points=x,y;x,y (labels=1,0) and/or boxes=x1,y1,x2,y2, "
                         "in the pixels of frame=N (default 0)")
    for k in _PROMPT_TRACK[3:]:
        o = TRACK[k]
        if k in opts.given or o.default != o.info.default:
            kw[k] = opts[k]
    return _video_report(model.track(opts["source"], stream=True, **kw), opts, model, True)


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
        s["ms"] += sum(v for v in r.speed.values() if v is not None)
        if r.boxes is None and getattr(r.masks, "ids", None) is not None:   # segment-prompt video: objects' masks
            s["ids"].update(int(i) for i in r.masks.ids)
            s["boxes"] += int((r.masks.data.flatten(1).any(1) if len(r.masks) else r.masks.data).sum())
            s["unit"] = "non-empty mask(s)"
        else:
            s["boxes"] += len(r)
        if r.boxes is not None and r.boxes.is_track:
            s["ids"].update(int(i) for i in r.boxes.id.tolist())
        if rows is not None:
            rows.append({"path": r.path, "frame": r.frame_index, "timestamp": r.timestamp, "detections": r.summary()})
    for path, s in per_source.items():
        tracks = f", {len(s['ids'])} track(s)" if track else ""
        console.print(f"{path}: {s['frames']} frame(s), {s['boxes']} {s.get('unit', 'box(es)')}{tracks} "
                      f"({s['ms'] / max(1, s['frames']):.1f} ms per frame)"
                      + (f"; annotated video [bold]{s['saved']}[/]" if s["saved"] else ""))
    if rows is not None:
        Path(opts["json"]).write_text(json.dumps(rows, indent=2))
        console.print(f"detections written to {opts['json']}")
    _graph_report(model, opts)
    return 0


TRACK = _Spec(lambda: _predict_spec(track=True))


def cmd_track(opts: dict) -> int:
    return cmd_predict(opts, track=True)


INFO = {"json": Opt(_flag("json"), False, "print JSON instead of tables")}


def cmd_info(opts: dict) -> int:
    import textwrap

    import torch

    from . import __version__
    from .device import torch_pair_problem
    problem = torch_pair_problem()   # a broken pair is reported, not raised: info is how one checks
    env = {"libreyolo": __version__, "torch": torch.__version__, "torchvision": _version("torchvision"),
           "cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda,
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    if problem is not None:   # the families import torchvision: none can be listed
        env["problem"] = problem
        if opts["json"]:
            print(json.dumps({"environment": env}, indent=2))
        else:
            e = Table(title="environment", show_header=False)
            for k, v in env.items():
                e.add_row(k, str(v if v not in (None, []) else "-"))
            console.print(e)
            console.print(f"[bold red]error:[/] {problem}")
        return 1
    from . import list_models
    from .tasks import TASKS
    models = list_models()
    # every (family, class) per task: a family's main class and its variants for other tasks
    entries = [(m["family"], row) for m in models for row in [m, *m["variants"]]]
    tasks = {name: sorted(f for f, row in entries if row["task"] == name) for name in TASKS}
    if opts["json"]:
        print(json.dumps({"environment": env, "tasks": tasks, "models": models}, indent=2))
        return 0

    def graphs(row) -> tuple[str, str]:
        predict = (("front part (seam)" if row["cuda_graph_predict_seam"] else "yes") if row["cuda_graph"]
                   else "no (eager)")
        train = ("whole step" if row["cuda_graph_train"] else
                 "backbone+encoder" if row["cuda_graph_train_seam"] else "no (eager)")
        return predict, train
    from .models.registry import TASK_SUFFIXES
    suffix = {task: s for s, task in reversed(TASK_SUFFIXES.items())}   # the first suffix of each task
    main = {m["family"]: m["task"] for m in models}
    prefix = {m["family"]: m["file_prefix"] for m in models}
    rows = []   # grouped by task, in the task table's order
    for name in TASKS:
        for f, row in sorted(((f, r) for f, r in entries if r["task"] == name), key=lambda e: e[0]):
            files = f"{prefix[f]}<size>.pt" if main[f] == name else f"{prefix[f]}<size>-{suffix.get(name, name)}.pt"
            rows.append((f, ", ".join(row["sizes"]), name, files, *graphs(row)))
    cols = ("family", "sizes", "task", "checkpoint names", "predict graph", "train graph")
    # the table's width: each column's widest cell, plus rich's borders and padding (3 a column)
    if sum(max(len(r[i]) for r in rows + [cols]) for i in range(len(cols))) + 3 * len(cols) + 1 <= console.width:
        t = Table(title="libreyolo model families, by task")
        for col in cols:
            t.add_column(col)
        for i, row in enumerate(rows):
            t.add_row(*row, end_section=i + 1 < len(rows) and rows[i + 1][2] != row[2])
        console.print(t)
    else:   # a narrow terminal or a pipe: a heading per task, one family a paragraph, nothing cut
        console.print("[bold]libreyolo model families, by task[/]")
        width = max(40, console.width)
        for name in TASKS:
            mine = [r for r in rows if r[2] == name]
            graphed = sum(r[4] != "no (eager)" for r in mine)
            console.print(f"[bold]{name}[/]: {len(mine)} {'family' if len(mine) == 1 else 'families'}, "
                          f"{graphed} with predict graphs")
            for family, sizes, _, files, predict, train in mine:
                text = (f"{family}: sizes {sizes}; checkpoints {files}; CUDA graph: predict {predict}, "
                        f"train {train}")
                console.print("\n".join(textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="      ",
                                                       break_on_hyphens=False, break_long_words=False)),
                              highlight=False, markup=False)
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
        err_console.print("[bold red]verify needs a CUDA GPU[/]: it runs the CUDA-graph parity protocol "
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


def _train_spec() -> dict[str, Opt]:
    from .engine.config import GROUPS
    spec = {"model": Opt(str, "yolo9t", "checkpoint to fine-tune, or a family/size name for an untrained model")}
    for group in GROUPS.values():
        spec.update(_fields_spec(group))
    for name, infos in _task_options().items():
        if name not in spec:
            spec[name] = _union(name, infos)
    return spec


TRAIN = _Spec(_train_spec)


def _task_of(model: str):
    """The task of the model ``model=`` names, when its name tells (a family/size name, or a
    checkpoint file named as ours), without loading it; else None."""
    from .models.registry import parse_spec
    from .tasks import get_task
    spec = parse_spec(str(model)) if not Path(str(model)).is_file() else None
    return get_task(spec[0].TASK) if spec is not None else None


def _check_task_options(opts: Parsed, task) -> None:
    """The tasks' training options given, converted and checked as ``task`` declares them (the
    parser accepted a value any task takes); one ``task`` does not take is a usage error."""
    declared = _task_options()
    own = {i.name: i for i in option_fields(task.Options)}
    for k in sorted(opts.given):
        if k in declared and TRAIN[k].info is not None and k not in _generic_train_names():
            if k not in own:
                raise UsageError(f"{k} is a training option of {', '.join(declared[k])} models, not of {task.name} "
                                 f"models" + (f" (theirs: {', '.join(own)})" if own else ""))
            try:
                opts[k] = own[k].parse(opts.raw[k])
            except ValueError as exc:
                raise UsageError(str(exc)) from None


def _generic_train_names() -> set[str]:
    from .engine.config import GROUPS
    return {i.name for g in GROUPS.values() for i in option_fields(g)}


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
    task = _task_of(opts["model"])
    if task is not None:   # the options checked as the model's task takes them, before it is loaded
        _check_task_options(opts, task)
        _require_data(opts, task)
    if launched():   # one rank of a torchrun run: the model on this rank's device
        model = _load({**opts, "device": local_device(opts["device"])}, seed=opts["seed"])
    else:
        model = _load(opts, seed=opts["seed"])
    if task is None:
        _check_task_options(opts, model.task_def)
        _require_data(opts, model.task_def)
    # the options given, as model.train() takes them: what is not given is the API's default (the
    # family's recipe, else the dataclasses' defaults), the same as in Python
    kw = {k: opts[k] for k in opts.given if k != "model"}
    before = _process_age()   # ... then the library's imports, the model and its device, up to here
    res = model.train(**kw)
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
    r = best.predict(str(held_out.image), imgsz=opts["imgsz"], conf=conf, cuda_graph=mode)
    note = f"at conf >= {conf}"
    if not len(r):  # a weak model (fewer epochs, a harder start) may not be confident yet: show its best guesses
        r = best.predict(str(held_out.image), imgsz=opts["imgsz"], conf=DEMO_FALLBACK_CONF, max_det=5,
                         cuda_graph=mode)
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


def _val_spec() -> dict[str, Opt]:
    from .engine.call_options import ValOptions
    return {"model": Opt(str, None, "checkpoint path"), **_fields_spec(ValOptions),
            "device": Opt(str, "auto", "auto, cpu, cuda")}


VAL = _Spec(_val_spec)


def _require_data(opts: Parsed, task) -> None:
    """``data=`` missing: the task's own refusal (which lists its built-in sets), as a usage error."""
    if opts["data"] is None:
        try:
            task.resolve_data(None)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        raise UsageError("data is required")   # a task that resolved nothing: never silently a default set


def cmd_val(opts: Parsed) -> int:
    _need_model(opts, "val")
    model = _load(opts)
    _require_data(opts, model.task_def)
    kw = {k: opts[k] for k in opts.given if k not in ("model", "device")}
    for k in ("conf", "iou"):   # detection's thresholds
        if k in kw and k not in model.task_def.val_option_names:
            raise UsageError(f"{k} is an option of detection models; {model.FAMILY}-{model.size} is a {model.TASK} "
                             "model")
    res = model.val(**kw)
    if model.TASK != "detect":
        t = Table(title=f"{model.FAMILY}-{model.size} on {opts['data']}")
        for col in ("metric", "value"):
            t.add_column(col)
        for k, v in res.items():
            if isinstance(v, float):
                t.add_row(k, f"{v:.4f}")
        console.print(t)
        return 0
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


def _export_spec() -> dict[str, Opt]:
    from .engine.call_options import ExportOptions
    return {"model": Opt(str, None, "checkpoint path or family/size name"), **_fields_spec(ExportOptions),
            "device": Opt(str, "cpu", "where the model is loaded before export")}


EXPORT = _Spec(_export_spec)


def cmd_export(opts: dict) -> int:
    _need_model(opts, "export")
    model = _load(opts)
    kw = {k: opts[k] for k in opts.given if k not in ("model", "format", "device")}
    path = model.export(format=opts["format"], **kw)
    console.print(f"exported {model.FAMILY}-{model.size} ({model.TASK}) to [bold]{path}[/]")
    return 0


COMMANDS: dict[str, tuple[Callable[[dict], int], dict, str]] = {
    "demo": (cmd_demo, DEMO, "train briefly on built-in data, validate, predict a held-out image, save it"),
    "train": (cmd_train, TRAIN, "train a model on a dataset (data=..., e.g. data=shapes: the built-in synthetic set)"),
    "val": (cmd_val, VAL, "mAP50 / mAP50-95 on a dataset's validation split"),
    "predict": (cmd_predict, PREDICT, "detect objects in images or videos and save annotated pictures/videos"),
    "track": (cmd_track, TRACK, "detect and track objects in a video, camera or stream (ids on the boxes); "
                                "SAM 2 / EdgeTAM: follow prompted objects (points=, boxes=, frame=)"),
    "verify": (cmd_verify, VERIFY, "run the CUDA-graph parity protocol on this GPU"),
    "export": (cmd_export, EXPORT, "write the model as ONNX or OpenVINO (with its post-processing) for other runtimes"),
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


def _md_default(info: OptionInfo) -> str:
    return "" if info.default is None else f"`{_show_default(info.default)}`"


def _md_table(infos: list[OptionInfo]) -> list[str]:
    lines = ["| option | accepts | default | what it does |", "|---|---|---|---|"]
    for i in infos:
        accepts = i.check.text + ("; auto/none: the default" if i.check.none and not i.check.free else "")
        lines.append(f"| `{i.name}` | {accepts} | {_md_default(i)} | {i.help.replace('|', '/')} |")
    return lines


def options_markdown() -> str:
    """docs/options.md: every option of train, predict/track, val and export, made from the options
    dataclasses as the CLI is (``python scripts/options_doc.py`` writes it; a test checks it)."""
    from .engine.call_options import (
        ExportOptions,
        PredictOptions,
        TrackOptions,
        ValOptions,
    )
    from .engine.config import GROUPS
    from .tasks import TASKS
    out = ["# Options", "",
           "Every option of `model.train()`, `model.predict()` / `model.track()`, `model.val()` and",
           "`model.export()`, as the options dataclasses declare it (name, what it accepts, default, help);",
           "the same options, with the same checks and messages, are those of `libreyolo train|predict|track|",
           "val|export key=value` (`libreyolo COMMAND --help`). On the command line booleans are `true`/`false`",
           "(also 1/0, yes/no, on/off), lists are comma-separated, and `auto` (or `none`) gives the options",
           "whose default is decided elsewhere. Generated by `scripts/options_doc.py` from",
           "`libreyolo/engine/config.py`, the tasks' Options and `libreyolo/engine/call_options.py`: do not edit.",
           "", "## train", "",
           "`model.train(data=..., ...)`; `libreyolo train model=... data=...`. A model family's training recipe",
           "(`Model.TRAIN_DEFAULTS`) may replace a default (e.g. the DETRs: AdamW, lr0 1e-4, mosaic 0).", ""]
    for group, cls in GROUPS.items():
        out += [f"### {group} ({cls.__name__})", "", (cls.__doc__ or "").strip().splitlines()[0], ""]
        out += _md_table([i for i in option_fields(cls) if i.meta.get("cli", True)]) + [""]
    for name in TASKS:
        infos = option_fields(TASKS[name].Options)
        if infos:
            out += [f"### {name} ({TASKS[name].Options.__name__})", ""] + _md_table(infos) + [""]
    predict = option_fields(PredictOptions)
    out += ["## predict and track", "",
            "`model.predict(source, ...)`, `model.track(source, ...)`; `libreyolo predict|track model=... source=...`",
            "(the command line saves the annotated pictures, shows progress and uses `cuda_graph=auto` unless told",
            "otherwise).", ""]
    out += _md_table([i for i in predict if not i.meta.get("tasks")]) + [""]
    out += ["### the tasks' own predict options", "",
            "A model of another task refuses them; only those given reach the task.", ""]
    out += _md_table([i for i in predict if i.meta.get("tasks")]) + [""]
    track_only = [i for i in option_fields(TrackOptions) if i.name in ("tracker", "persist", "conf", "frame", "obj_id")]
    out += ["### track", "", "`model.track` also takes these (and a lower default `conf`). A segment-prompt model with",
            "video memory (SAM 2, EdgeTAM) follows the objects prompted by `points` / `labels` / `boxes` on `frame`",
            "instead of detecting (`libreyolo track model=sam2-tiny source=clip.mp4 points=x,y labels=1 frame=0`).", ""]
    out += _md_table(track_only) + [""]
    out += ["## val", "", "`model.val(data=..., ...)`; `libreyolo val model=... data=...`.", ""]
    out += _md_table(option_fields(ValOptions)) + [""]
    out += ["## export", "", "`model.export(format=\"onnx\", ...)`; `libreyolo export model=...`.", ""]
    out += _md_table(option_fields(ExportOptions))
    return "\n".join(out) + "\n"


def _usage() -> str:
    lines = ["usage: libreyolo COMMAND key=value ...", "", "commands:"]
    for name, (_, _spec, text) in COMMANDS.items():
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
        print(f"libreyolo: unknown command {name!r}{did_you_mean([name], COMMANDS)}\n\n{_usage()}", file=sys.stderr)
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
        err_console.print(f"[bold red]error:[/] {exc}")
        return 1


#: seconds the exit after Ctrl-C may take (joining threads, the exit handlers) before the process
#: ends anyway, printing every thread's stack: a user who pressed Ctrl-C gets a prompt back
EXIT_AFTER_INTERRUPT_S = 60.0


def _exit_watchdog(seconds: float, rc: int) -> None:
    """End the process with ``rc`` if it is still exiting after ``seconds`` (a thread or an exit
    handler that does not return), printing one line and the stack of every thread (what held the
    exit up) to stderr first."""
    import faulthandler
    import threading

    def fire() -> None:
        try:
            print(f"libreyolo: still exiting {seconds:g} s after Ctrl-C; ending the process. What held it "
                  "up (every thread's stack):", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        finally:
            os._exit(rc)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.name = "libreyolo-exit-watchdog"
    timer.start()


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
        _exit_watchdog(EXIT_AFTER_INTERRUPT_S, rc)
    # what a normal exit does: first wake the idle workers of concurrent.futures' thread pools (a
    # library's executor - OpenVINO's telemetry sender, started by importing openvino - waits for
    # work until this hook of the interpreter's exit runs), then wait for every non-daemon thread
    from concurrent.futures import thread as futures_thread
    futures_thread._python_exit()
    for thread in threading.enumerate():
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
