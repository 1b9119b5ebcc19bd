"""The opt-in fast inference path: a half-precision copy of the network, optionally compiled.

``precision="fp32"`` (the default) is the bitwise path: nothing here runs. ``"fp16"`` / ``"bf16"``
run a cached copy of the network with BatchNorm folded into the convolutions (the family's
``fuse()``), every parameter and buffer in the half dtype and the weights in ``channels_last``;
the preprocessing writes the half NHWC input directly (:meth:`Preprocess.to_input`). ``fast=True``
additionally compiles that copy with inductor (no cudagraph trees: the predictor captures the
compiled kernels in its own CUDA graph, together with the pre- and post-processing).
``fast="aot"`` compiles it ahead of time instead (AOTInductor, :class:`AotInfer`): one package per
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
import functools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_SPELLINGS = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "32": "fp32",
              "fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16",
              "bf16": "bf16", "bfloat16": "bf16"}

#: the tolerance contract of the half / fast path against fp32 eager (issue 15): a family is
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


def inductor_cache_dir() -> Path:
    """Where inductor's on-disk caches (FX graph and AOTAutograd caches, autotune results, the
    compiled kernels and Triton's cache beneath) live when libreyolo chooses:
    ``<libreyolo cache>/inductor/torch-<version>``. Inductor keys every entry by what it compiled:
    the graph (family, size, input shape and dtype - the precision - are all in it), the config
    and the system (torch, Triton and CUDA versions, the GPU). The version in the path only keeps
    an upgrade from reading an older torch's files."""
    return _cache_root() / "inductor" / f"torch-{torch.__version__}"


def _cache_root() -> Path:
    return Path(os.environ.get("LIBREYOLO_CACHE_DIR") or Path.home() / ".cache" / "libreyolo").expanduser()


def _inductor_default_dir() -> str:
    """Inductor's own default cache directory (``/tmp/torchinductor_<user>``)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:   # older layouts
        from torch._inductor.runtime.runtime_utils import default_cache_dir
    return os.path.abspath(default_cache_dir())


def use_inductor_cache() -> Path:
    """Point inductor's caches at :func:`inductor_cache_dir` for the rest of the process, before
    the first compile, and return the directory inductor uses.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` each time, but some of its paths are fixed at their
    first use in a process: Triton's cache (``TRITON_CACHE_DIR`` is set from it when the first
    kernel loads), the autotune cache's local path (cached), and what the compile workers are
    handed. So the directory is set once and never switched back and forth around calls (a
    compile or a background thread outside such a window would read or write the default
    instead). Importing ``torch._dynamo`` (torchvision does) already sets the variable to
    inductor's default ``/tmp/torchinductor_<user>``; that value is replaced, any other - the
    user's choice - is kept."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current and os.path.abspath(current) != _inductor_default_dir():
        return Path(current)
    path = inductor_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def _cache_counts() -> dict:
    """Inductor's FX-graph and AOTAutograd cache hit / miss counts so far in this process."""
    from torch._dynamo.utils import counters
    ind, aot = counters["inductor"], counters["aot_autograd"]
    return {"fxgraph_cache_hit": ind["fxgraph_cache_hit"], "fxgraph_cache_miss": ind["fxgraph_cache_miss"],
            "autograd_cache_hit": aot["autograd_cache_hit"], "autograd_cache_miss": aot["autograd_cache_miss"]}


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
    #: what the first call found on disk: inductor's cache hits / misses (``_cache_counts``), or
    #: with "aot" the packages loaded / built (:meth:`AotInfer.counts`): a warm start hits / loads
    first_call_cache: dict | None = None
    calls: int = field(default=0)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    def _counts(self) -> dict:
        return self.infer.counts() if isinstance(self.infer, AotInfer) else _cache_counts()

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
class FastPathError(RuntimeError):
    """The fast path's network could not be compiled (export or AOTInductor failed)."""


#: inductor options of each COMPILE_MODE, as AOTInductor takes them
_AOT_MODE_CONFIGS = {"default": {}, "max-autotune-no-cudagraphs": {"max_autotune": True}}

@functools.cache
def source_digest() -> str:
    """A digest of every Python file of the installed libreyolo package: what a family's network
    and ``infer`` compute is code, so an ahead-of-time package is only reused by the same code
    (an upgrade or a local edit compiles anew). Read once per process (a few milliseconds)."""
    import hashlib
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _device_identity(device: torch.device) -> dict:
    """What compiled kernels are built for: the GPU (name, compute capability, CUDA) or the CPU's
    vector instruction set (inductor's C++ kernels use the build machine's)."""
    if device.type == "cuda":
        return {"gpu": torch.cuda.get_device_name(device), "capability": list(torch.cuda.get_device_capability(device)),
                "cuda": torch.version.cuda}
    import platform   # torch's reading of the CPU (no inductor import: that pulls in dynamo)
    return {"cpu": platform.machine(), "capability": torch.backends.cpu.get_cpu_capability()}


def _versions() -> dict:
    import importlib.metadata as md
    out = {"torch": torch.__version__}
    for name in ("triton", "timm", "torchvision"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


class AotInfer:
    """A half network's ``infer`` compiled ahead of time by AOTInductor, one package per input
    signature (shape, dtype, strides, device), what ``torch.compile(dynamic=False)`` would
    compile per shape.

    Each package lives in ``<libreyolo cache>/aot/torch-<version>/`` under a key of everything it
    was built from: the library's code (:func:`source_digest`), the family, size and precision, the
    half copy's weights (every tensor's name, shape, dtype, strides and bytes: :meth:`weights_digest`),
    the input signature, the device (:func:`_device_identity`), the versions of torch, Triton, timm
    and torchvision, and the compile mode. The weights are inside the package: AOTInductor folds
    some of them into what it compiles (on the CPU a convolution's or a linear layer's bias, while
    ``load_constants`` updates the rest), so a package whose weights were swapped afterwards would
    mix two networks. New weights - a training run, another checkpoint - therefore build a new
    package; for weights that keep changing in a process ``fast=True`` (torch.compile, whose
    compiled graph reads the weights as inputs) is the one to use. A missing package is exported
    (``torch.export``), compiled and written atomically (temporary file, then rename: two
    processes may build the same package; each writes a whole file); a later process only loads
    it - no dynamo trace, no inductor start. A file that does not load (cut short, another torch
    build) is built again once.
    """

    def __init__(self, model, net: torch.nn.Module, infer: Callable, precision: str):
        self.net, self.infer, self.precision = net, infer, precision
        self.label = f"{model.FAMILY}-{model.size}"
        self.fused = bool(model.fused)
        self.root = aot_cache_dir()
        self._packages: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._weights: str | None = None
        self.paths: dict[tuple, Path] = {}
        self.loaded = self.built = 0

    def counts(self) -> dict:
        return {"aot_packages_loaded": self.loaded, "aot_packages_built": self.built}

    @staticmethod
    def signature(x: torch.Tensor) -> tuple:
        return (tuple(x.shape), str(x.dtype), tuple(x.stride()), str(x.device))

    def __call__(self, x: torch.Tensor) -> Any:
        sig = self.signature(x)
        pk = self._packages.get(sig)
        if pk is None:
            with self._lock:
                pk = self._packages.get(sig)
                if pk is None:
                    pk = self._packages[sig] = self._package(x, sig)
        return pk(x)

    def weights_digest(self) -> str:
        """sha256 of the half copy's tensors: names, shapes, dtypes, strides and bytes (once)."""
        if self._weights is None:
            import hashlib
            h = hashlib.sha256()
            for k, v in self.net.state_dict().items():
                h.update(json.dumps([k, list(v.shape), str(v.dtype), list(v.stride())]).encode())
                h.update(v.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
            self._weights = h.hexdigest()
        return self._weights

    def package_path(self, x: torch.Tensor) -> Path:
        """Where the package for input ``x`` is (or will be) on disk."""
        import hashlib
        ident = {"libreyolo_source": source_digest(), "model": self.label, "precision": self.precision,
                 "fused": self.fused, "weights": self.weights_digest(),
                 "input": [list(x.shape), str(x.dtype), list(x.stride())],
                 "device": _device_identity(x.device), "versions": _versions(), "compile_mode": COMPILE_MODE}
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
        shape = "x".join(str(int(v)) for v in x.shape)
        return self.root / f"{self.label}-{self.precision}-{shape}-{x.device.type}-{digest}.pt2"

    #: packages kept per model, precision, input shape and device (the most recently used): each
    #: new set of weights builds one, and a run that predicts after every epoch would fill the disk
    KEEP = 4

    def _package(self, x: torch.Tensor, sig: tuple):
        path = self.paths[sig] = self.package_path(x)
        if path.is_file():
            try:
                pk = AotPackage(path, x.device)
                self.loaded += 1
                os.utime(path)   # recently used: kept by _prune
                return pk
            except AotLoadError:   # this torch cannot load packages here: a rebuild would not either
                raise
            except Exception as exc:   # noqa: BLE001 - cut short or stale: built again below
                log.warning("the ahead-of-time package %s did not load (%s: %s); building it again",
                            path, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        _load_marker(path).unlink(missing_ok=True)
        self._build(x, path)
        pk = AotPackage(path, x.device)
        self.built += 1
        self._prune(path)
        return pk

    def _prune(self, path: Path) -> None:
        """Remove all but the :attr:`KEEP` most recently used packages of this model, precision,
        input shape and device (``path``'s name without its digest)."""
        prefix = path.name.rsplit("-", 1)[0] + "-"   # the digest (hex) is the only part after it
        same = [p for p in path.parent.glob(prefix + "*.pt2") if not p.name.endswith(".tmp.pt2")]

        def used(p: Path) -> float:
            try:
                return p.stat().st_mtime
            except OSError:   # removed by another process meanwhile
                return 0.0
        for old in sorted(same, key=used, reverse=True)[self.KEEP:]:
            if old != path:
                old.unlink(missing_ok=True)
                _load_marker(old).unlink(missing_ok=True)

    def _module(self) -> torch.nn.Module:
        """``infer`` as a module whose parameters and buffers are the half copy's: what
        torch.export takes."""
        net, infer = self.net, self.infer

        class Infer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, t):
                return infer(t)
        return Infer().eval()

    def _build(self, x: torch.Tensor, path: Path) -> None:
        import tempfile
        use_inductor_cache()   # AOTInductor compiles through inductor's caches too
        log.warning("compiling %s's %s network ahead of time (AOTInductor) for input %s: a one-time "
                    "cost for these weights (a minute or more), cached in %s", self.label, self.precision,
                    "x".join(str(int(v)) for v in x.shape), path.parent)
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                ep = torch.export.export(self._module(), (x,))
        except Exception as exc:
            raise FastPathError(f"fast='aot' could not export {self.label}'s {self.precision} network "
                                f"(torch.export): {type(exc).__name__}: {exc}. Use fast=True (torch.compile) "
                                "or the half path without fast") from exc
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp.pt2")
        os.close(fd)
        try:
            from torch import _inductor as inductor
            inductor.aoti_compile_and_package(ep, package_path=tmp,
                                              inductor_configs=dict(_AOT_MODE_CONFIGS.get(COMPILE_MODE, {})))
            os.replace(tmp, path)
        except Exception as exc:
            raise FastPathError(f"fast='aot' could not compile {self.label}'s {self.precision} network "
                                f"(AOTInductor): {type(exc).__name__}: {str(exc)[:2000]}. Use fast=True "
                                "(torch.compile) or the half path without fast") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("%s's ahead-of-time package built in %.1f s: %s", self.label,
                 time.perf_counter() - t0, path)


class AotPackage:
    """A loaded AOTInductor package, called like the function it was exported from.

    torch's own loader (``torch._inductor.aoti_load_package``) is reached through
    ``torch._inductor``, whose import pulls in dynamo: about a second of a warm process's start,
    for nothing the package needs. This calls the same C++ loader it calls
    (``torch._C._aoti.AOTIModelPackageLoader``) and does what its Python wrapper does around a
    run (the inputs and outputs flattened and rebuilt by the package's own tree specs); where that
    loader's signature is not this torch's, torch's wrapper is used. Loaded without the model
    container's thread synchronisation (``run_single_threaded``), which a CUDA-graph capture
    trips on; on the device the input is on.
    """

    def __init__(self, path: Path, device: torch.device):
        from torch.utils import _pytree as pytree
        self._pytree = pytree
        index = device.index if device.type == "cuda" and device.index is not None else -1
        check_package_loads(path, index)
        try:
            self._loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", True, 1, index)
        except (AttributeError, TypeError):   # another torch's binding: its public loader
            from torch import _inductor as inductor
            self._loader = None
            self._wrapped = inductor.aoti_load_package(str(path), run_single_threaded=True,
                                                     device_index=index)
            return
        spec = self._loader.get_call_spec()
        self._out_spec = pytree.treespec_loads(spec[1])

    def __call__(self, *args):
        if self._loader is None:
            return self._wrapped(*args)
        flat = [t for t in self._pytree.tree_flatten((args, {}))[0] if isinstance(t, torch.Tensor)]
        return self._pytree.tree_unflatten(self._loader.boxed_run(flat), self._out_spec)


class AotLoadError(RuntimeError):
    """An AOTInductor package that this torch build cannot load: loading it ended a test process."""


def _load_marker(path: Path) -> Path:
    return path.with_name(path.name + ".loads")


#: the test process: load the package with the loader :class:`AotPackage` uses, on that device
_LOAD_CHECK = ("import sys, torch; "
               "torch._C._aoti.AOTIModelPackageLoader(sys.argv[1], 'model', True, 1, int(sys.argv[2])); "
               "print('loaded')")


def check_package_loads(path: Path, index: int) -> None:
    """Load ``path`` once in a child process before this process does, and raise
    :class:`AotLoadError` if a signal ends that child.

    Some torch builds end the process with a segmentation fault inside torch's package loader
    (``AOTIModelPackageLoader``), even for a package torch itself has just compiled; a loader that
    crashes cannot be caught in the process that calls it, and ``fast="aot"`` must not take the
    user's process down. A child that loaded the package leaves a marker beside it (its name plus
    ``.loads``), so later processes load at once; a rebuilt package removes the marker."""
    import subprocess
    import sys
    marker = _load_marker(path)
    if marker.is_file():
        return
    try:
        proc = subprocess.run([sys.executable, "-c", _LOAD_CHECK, str(path), str(index)],
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise AotLoadError(f"fast='aot': loading the ahead-of-time package {path} in a test process did not "
                           f"finish in {exc.timeout:.0f} s; use fast=True (torch.compile) or fast=False") from None
    if proc.returncode < 0:
        raise AotLoadError(
            f"fast='aot': torch {torch.__version__} cannot load the ahead-of-time package {path} on this "
            f"machine (a test process loading it was killed by signal {-proc.returncode}); loading it here "
            "would end this process. Use fast=True (torch.compile, the same kernels compiled in the process) "
            "or fast=False.")
    if proc.returncode != 0 or "loaded" not in proc.stdout:
        return   # an error the loader raises (a file cut short): raised again here, where it is handled
    try:
        marker.write_text(torch.__version__)
    except OSError:   # a read-only cache: the check runs again next time, nothing else changes
        pass


def aot_cache_dir() -> Path:
    """Where the ahead-of-time packages live: ``<libreyolo cache>/aot/torch-<version>``."""
    return _cache_root() / "aot" / f"torch-{torch.__version__}"


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
