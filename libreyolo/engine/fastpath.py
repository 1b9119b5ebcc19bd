"""The opt-in fast inference path: a half-precision copy of the network, optionally compiled.

``precision="fp32"`` (the default) is the bitwise path: nothing here runs. ``"fp16"`` / ``"bf16"``
run a cached copy of the network with BatchNorm folded into the convolutions (the family's
``fuse()``), every parameter and buffer in the half dtype and the weights in ``channels_last``;
the preprocessing writes the half NHWC input directly (:meth:`Preprocess.to_input`). ``fast=True``
additionally compiles that copy with inductor (no cudagraph trees: the predictor captures the
compiled kernels in its own CUDA graph, together with the pre- and post-processing).
``fast="aot"`` compiles it ahead of time instead (AOTInductor, :mod:`.aot`): one package per
input shape and set of weights (the weights are inside it), cached on disk, so a later process
loads the kernels without dynamo's trace or inductor's start (the warm start).

What stays float32: the fp32 network (the source of truth: the copy is rebuilt whenever its
weights, device or module tree change), the family's ``infer`` decoding wherever it already casts
(YOLOX, RTMDet, PicoDet, the DETR heads decode the half network's raw outputs in float32; YOLOv9 and
YOLOv7 decode inside the network, in half), deformable attention's sampling (coordinates), and
all the task's post-processing: the network's outputs are cast to float32 before top-k, NMS and
the mapping back to image pixels, so box coordinates lose nothing after the network.

The half path is not bitwise against fp32, so it is held to a measured contract per family
(:data:`CONTRACT`): matched-detection rate at IoU >= 0.95, score-difference p99, mAP difference on
the shapes validation set, measured by ``scripts/fast_contract.py`` and stored in
``libreyolo/assets/fast_contract.json``. A family whose figures are outside the contract, or that
was never measured, is refused with an error naming the family and the figure (no silent
fallback); :func:`measuring` lifts the check for the script that produces the figures.
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# AotLoadError, AotPackage, FastPathError, aot_cache_dir, check_package_loads, inductor_cache_dir and
# source_digest are re-exported: the ahead-of-time packages and the compile caches were part of this module
from .aot import (  # noqa: F401
    AotInfer,
    AotLoadError,
    AotPackage,
    FastPathError,
    aot_cache_dir,
    cache_counts,
    check_package_loads,
    inductor_cache_dir,
    source_digest,
    use_inductor_cache,
)

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_SPELLINGS = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "32": "fp32",
              "fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16",
              "bf16": "bf16", "bfloat16": "bf16"}

#: the tolerance contract of the half / fast path against fp32 eager: a family is
#: allowed when every figure it was measured with is inside these bounds
CONTRACT = {"match_rate_min": 0.99,      # detections matched at IoU >= 0.95 (same class), fraction
            "score_diff_p99_max": 0.01,  # p99 of |score_half - score_fp32| over matched pairs
            "map_diff_max": 0.3}         # |mAP50-95 fp32 - half| on shapes val, in points (x100)

#: fewer fp32 detections than this in the measured image set prove nothing about the match rate
MIN_DETECTIONS = 20

TABLE_PATH = Path(__file__).resolve().parent.parent / "assets" / "fast_contract.json"


def parse_precision(value: Any) -> str:
    """``precision`` as predict, capture_graph, bench, verify and the CLI take it -> "fp32" |
    "fp16" | "bf16" (None -> "fp32"; torch dtypes and the usual spellings are accepted)."""
    if value is None:
        return "fp32"
    for name, dt in DTYPES.items():
        if value is dt:
            return name
    if isinstance(value, str):
        s = value.strip().lower().replace("torch.", "")
        if s in _SPELLINGS:
            return _SPELLINGS[s]
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {value!r}")


#: ``fast`` values after :func:`parse_fast`: off, torch.compile (JIT, in the first call of each
#: shape) or AOTInductor (ahead of time, a package per shape cached on disk)
FAST_MODES = (False, True, "aot")


def parse_fast(value: Any) -> bool | str:
    """``fast`` as predict, capture_graph, bench, verify and the CLI take it -> False, True
    (torch.compile: inductor compiles in the process, its caches on disk) or "aot" (AOTInductor:
    a compiled package per input shape on disk, loaded by later processes without recompiling)."""
    from ..options import OptionError, parse_bool
    if isinstance(value, str) and value.strip().lower() in ("aot", "aoti"):
        return "aot"
    try:
        return parse_bool("fast", value)
    except OptionError:
        raise OptionError(f"fast must be true, false or 'aot' (ahead-of-time compiled, cached on disk), "
                          f"got {value!r}") from None


def resolve(precision: Any, fast: Any, device: torch.device) -> tuple[str, bool | str]:
    """Validate ``precision`` / ``fast`` together: (precision, fast) with fast in :data:`FAST_MODES`.

    ``fast=True`` / ``"aot"`` run a half network, so they take fp16 (the default) or bf16, never
    fp32; they need CUDA: on the CPU there is no CUDA graph to put the compiled kernels in and
    inductor's C++ backend would compile for minutes for no latency gain, so they are refused (the
    half eager path, ``precision="bf16"`` without ``fast``, runs on the CPU).
    """
    fast = parse_fast(fast)
    if fast and precision is None:
        precision = "fp16"
    precision = parse_precision(precision)
    if fast and precision == "fp32":
        raise ValueError(f"fast={fast!r} runs the half-precision network: use precision='fp16' (the default "
                         f"with fast={fast!r}) or 'bf16'; precision='fp32' is the bitwise path and is never "
                         "compiled")
    if fast and device.type != "cuda":
        raise ValueError(f"fast={fast!r} needs a CUDA device (the model is on '{device}'): it compiles the half "
                         "network with inductor and replays it inside a CUDA graph. On the CPU use "
                         "precision='bf16' (half eager) or the default fp32 path")
    return precision, fast


# ------------------------------------------------------------------ the contract table
_measuring = threading.local()


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """Lift the contract check in this thread: for ``scripts/fast_contract.py``, which measures the
    figures the check reads, and for tests of the half path itself."""
    prev = getattr(_measuring, "on", False)
    _measuring.on = True
    try:
        yield
    finally:
        _measuring.on = prev


#: parsed contract tables by path, with the (mtime, size) they were read at: the check runs on
#: every half-path predict call, before the launch, where reading and parsing the file each time
#: cost more than the rest of the check
_TABLES: dict[str, tuple[tuple[int, int], dict]] = {}


def load_table(path: Path | None = None) -> dict:
    """``{family: {arm: figures or None}}`` with arm "fp16", "fp16-fast", "bf16", "bf16-fast".

    Read once per file version (a rewritten file is read again); the dict is shared: read it,
    do not modify it."""
    p = Path(path) if path is not None else TABLE_PATH
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _TABLES.get(str(p))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    table = json.loads(p.read_text()).get("families", {})
    _TABLES[str(p)] = (stamp, table)
    return table


def arm_name(precision: str, fast: bool | str) -> str:
    """The contract table's arm: "fp16", "fp16-fast" (torch.compile), "fp16-aot" (AOTInductor)."""
    if fast == "aot":
        return f"{precision}-aot"
    return f"{precision}-fast" if fast else precision


def violations(figures: dict) -> list[str]:
    """The contract bounds ``figures`` (one arm's measurement) breaks, as readable strings."""
    import math
    out = []
    c = CONTRACT

    def missing(key: str) -> bool:   # not measured, or not a finite number (NaN scores made it NaN)
        return figures.get(key) is None or not math.isfinite(figures[key])

    if figures.get("error"):
        out.append(f"the measurement failed ({figures['error']})")
    if missing("match_rate") or figures["match_rate"] < c["match_rate_min"]:
        out.append(f"matched-detection rate at IoU>=0.95 {figures.get('match_rate')} < {c['match_rate_min']}")
    if missing("score_diff_p99") or figures["score_diff_p99"] > c["score_diff_p99_max"]:
        out.append(f"score difference p99 {figures.get('score_diff_p99')} > {c['score_diff_p99_max']}")
    if missing("map_diff") or abs(figures["map_diff"]) > c["map_diff_max"]:
        out.append(f"mAP50-95 difference {figures.get('map_diff')} points > {c['map_diff_max']}")
    if figures.get("detections") is not None and figures["detections"] < MIN_DETECTIONS:
        out.append(f"only {figures['detections']} fp32 detections to match (< {MIN_DETECTIONS}): too few to conclude")
    if figures.get("graph_bitwise") is False:
        out.append("graph replay not bitwise equal to the same path eager")
    return out


class FastPathRefused(ValueError):
    """The half / fast path is refused for a family (unmeasured, or outside the contract)."""


def check_contract(family: str, precision: str, fast: bool | str, table: dict | None = None) -> None:
    """Raise :class:`FastPathRefused` unless ``family``'s measured figures for this arm are inside
    :data:`CONTRACT` (or :func:`measuring` is on)."""
    if precision == "fp32" or getattr(_measuring, "on", False):
        return
    arm = arm_name(precision, fast)
    table = load_table() if table is None else table
    figures = (table.get(family) or {}).get(arm)
    what = f"precision={precision!r}" + (f", fast={fast!r}" if fast else "")
    if not figures:
        raise FastPathRefused(
            f"{what} is refused for the '{family}' family: its tolerance against fp32 is unmeasured "
            f"(no '{arm}' entry for {family} in {TABLE_PATH.name}; scripts/fast_contract.py measures it "
            "on a GPU). Use the default precision='fp32'")
    bad = violations(figures)
    if bad:
        raise FastPathRefused(
            f"{what} is refused for the '{family}' family: measured outside the fast-path contract: "
            + "; ".join(bad) + f" (measured on {figures.get('device', '?')}, torch {figures.get('torch', '?')}; "
            "see docs/families.md). Use the default precision='fp32'")


# ---------------------------------------------------------------------- the half copy
def _source_fingerprint(model) -> tuple:
    """What the half copy was made from: the fp32 network object, its device and fused state, and
    every parameter's and buffer's address and version (training steps, loads and ``.to()`` all
    change it)."""
    return (*_network_identity(model), model.runner.fingerprint())


#: torch.compile mode of ``fast=True``: inductor without cudagraph trees (our own CUDA graph holds
#: the compiled kernels). "default" fuses the pointwise and reduction kernels around cuDNN/cuBLAS
#: (where these small networks lose their time: kernel count) and compiles in seconds;
#: "max-autotune-no-cudagraphs" also benchmarks Triton templates for every convolution and matmul
#: (minutes on the first compile, cached on disk) - ``libreyolo bench compile_mode=`` compares them
COMPILE_MODE = "default"


@dataclass
class HalfNetwork:
    """A half-precision copy of a model's network and the ``infer`` that runs it."""

    net: torch.nn.Module
    infer: Callable[[torch.Tensor], Any]
    precision: str
    #: False (the half copy eager), True (torch.compile) or "aot" (AOTInductor: ``infer`` is an AotInfer)
    fast: bool | str
    source: tuple
    build_s: float
    cache_dir: Path | None = None
    compile_mode: str | None = None
    #: seconds of the first call (dynamo + inductor compile, or the on-disk cache hit; with "aot"
    #: the package's load, or its export and compile when it is not on disk yet)
    first_call_s: float | None = None
    #: what the first call found on disk: inductor's cache hits / misses (:func:`.aot.cache_counts`),
    #: or with "aot" the packages loaded / built (:meth:`AotInfer.counts`): a warm start hits / loads
    first_call_cache: dict | None = None
    calls: int = field(default=0)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    def _counts(self) -> dict:
        return self.infer.counts() if isinstance(self.infer, AotInfer) else cache_counts()

    def __call__(self, x: torch.Tensor) -> Any:
        if not self.fast or self.first_call_s is not None:
            self.calls += 1
            return self.infer(x)
        before, t0 = self._counts(), time.perf_counter()
        out = self.infer(x)
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        self.first_call_s = time.perf_counter() - t0
        self.first_call_cache = {k: v - before[k] for k, v in self._counts().items()}
        log.info("%s fast path ready in %.1f s (%s cache %s: %s)", self.precision,
                 self.first_call_s, "AOTInductor" if self.fast == "aot" else "inductor", self.cache_dir,
                 self.first_call_cache)
        self.calls += 1
        return out


def make_half(net: torch.nn.Module, dtype: torch.dtype, fused: bool) -> torch.nn.Module:
    """A copy of ``net`` for inference in ``dtype``: BatchNorm folded (``fuse()``, unless the
    network is fused already), every floating parameter and buffer in ``dtype``, 4-D weights in
    ``channels_last``, eval mode. ``net`` itself is not touched."""
    half = copy.deepcopy(net)
    if not fused:
        fuse = getattr(half, "fuse", None)
        if fuse is not None:
            fuse()
    half = half.to(dtype=dtype).eval()
    half.to(memory_format=torch.channels_last)
    for p in half.parameters():
        p.requires_grad_(False)
    return half


def compile_infer(infer: Callable, backend: str = "inductor", mode: str | None = COMPILE_MODE,
                  fullgraph: bool = True) -> Callable:
    """``torch.compile`` of a family's ``infer`` bound to a half network (one graph: a break would
    split the captured stage into eager islands, so ``fullgraph`` is on), with inductor's caches
    pointed at the libreyolo cache first (:func:`use_inductor_cache`)."""
    if backend == "inductor":
        use_inductor_cache()
    kw = {"mode": mode} if backend == "inductor" and mode else {}
    return torch.compile(infer, backend=backend, fullgraph=fullgraph, dynamic=False, **kw)


# ------------------------------------------------------------- ahead of time (AOTInductor)
def _network_identity(model) -> tuple:
    """The cheap part of :func:`_source_fingerprint`: which network object, its device, fused."""
    return (id(model.model), str(model.device), bool(model.fused))


def is_current(model, hn: HalfNetwork) -> bool:
    """Whether ``hn`` was made from the model's fp32 network as it is now (every tensor's address
    and version: a pass over all of them)."""
    return hn.source == _source_fingerprint(model)


def half_network(model, precision: str, fast: bool | str = False, verify: bool = True) -> HalfNetwork:
    """The model's cached half network for ``precision`` (compiled with ``fast``), rebuilt when the
    fp32 network changed since it was made (weights loaded or trained, ``reset_classes``,
    ``.to()``, ``fuse()``). A rebuild releases the model's CUDA graphs: they read the old copy.

    ``verify=False`` checks only which network it is (a new one after ``reset_classes``, a move,
    ``fuse()``) and skips the pass over every tensor: predict launches with the cached copy and
    checks it with :func:`is_current` while the device works, running the call again on a
    rebuilt copy when the weights changed."""
    cache: dict = model.__dict__.setdefault("_half_networks", {})
    fast = parse_fast(fast)
    key = (precision, fast)
    hn = cache.get(key)
    if not verify and hn is not None and hn.source[:3] == _network_identity(model):
        return hn
    src = _source_fingerprint(model)
    if hn is not None and hn.source == src:
        return hn
    if hn is not None or any(h.source != src for h in cache.values()):
        stale = [k for k, h in cache.items() if h.source != src]
        for k in stale:
            del cache[k]
        model.runner.release()
        log.info("%s-%s changed: rebuilt its %s network", model.FAMILY, model.size, precision)
    t0 = time.perf_counter()
    dtype = DTYPES[precision]
    net = make_half(model.model, dtype, model.fused)
    infer = model.infer_with(net)
    cache_dir = mode = None
    if fast == "aot":
        infer = AotInfer(model, net, infer, precision)
        cache_dir, mode = infer.root, COMPILE_MODE
    elif fast:
        cache_dir, mode = use_inductor_cache(), COMPILE_MODE
        infer = compile_infer(infer, mode=mode)
    hn = cache[key] = HalfNetwork(net, infer, precision, fast, src, time.perf_counter() - t0,
                                  cache_dir=cache_dir, compile_mode=mode)
    return hn


def invalidate(model) -> int:
    """Drop the model's half networks; returns how many there were."""
    cache = model.__dict__.get("_half_networks") or {}
    n = len(cache)
    cache.clear()
    return n


def to_float32(outputs: Any) -> Any:
    """The network's outputs with every floating tensor in float32 (post-processing precision)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float() if outputs.is_floating_point() else outputs
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(to_float32(o) for o in outputs)
    if isinstance(outputs, dict):
        return {k: to_float32(v) for k, v in outputs.items()}
    return outputs


def match_detections(ref: torch.Tensor, got: torch.Tensor, min_score: float,
                     iou_thr: float = 0.95) -> tuple[int, int, list[float]]:
    """Greedy one-to-one matching of ``ref``'s detections ((n, 6) ``[x1, y1, x2, y2, score, cls]``,
    those with score >= ``min_score``) to ``got``'s of the same class at IoU >= ``iou_thr``, best
    IoU first: (matched, total, |score difference| of each matched pair). The contract's
    matched-detection rate is matched / total over a set of images."""
    from torchvision.ops import box_iou
    ref = ref[ref[:, 4] >= min_score]
    if len(ref) == 0:
        return 0, 0, []
    if len(got) == 0:
        return 0, len(ref), []
    iou = box_iou(ref[:, :4].double(), got[:, :4].double())
    iou[ref[:, 5:6] != got[:, 5].unsqueeze(0)] = 0
    used: set[int] = set()
    diffs: list[float] = []
    for i in torch.argsort(iou.max(1).values, descending=True).tolist():
        for j in torch.argsort(iou[i], descending=True).tolist():
            if iou[i, j] < iou_thr:
                break
            if j not in used:
                used.add(j)
                diffs.append(abs(float(ref[i, 4]) - float(got[j, 4])))
                break
    return len(diffs), len(ref), diffs
