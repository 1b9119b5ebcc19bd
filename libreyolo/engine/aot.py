"""Where the fast path's compiled networks live: inductor's cache directory (``fast=True``) and the
ahead-of-time packages of ``fast="aot"``.

:class:`AotInfer` is a half network's ``infer`` compiled by AOTInductor, one package per input
signature, cached on disk under a key of everything it was built from, so that a later process
loads the kernels without dynamo's trace or inductor's start (the warm start); :class:`AotPackage`
loads one through torch's C++ package loader, after :func:`check_package_loads` proved in a child
process that loading it does not end the process. :mod:`libreyolo.engine.fastpath` builds the half
network these compile and re-exports every public name here.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def compile_mode() -> str:
    """The compile mode in force: :data:`libreyolo.engine.fastpath.COMPILE_MODE`, read at each use
    (the CLI and the scripts set it there)."""
    from . import fastpath
    return fastpath.COMPILE_MODE


# ---------------------------------------------------------------------- inductor's caches
def inductor_cache_dir() -> Path:
    """Where inductor's on-disk caches (FX graph and AOTAutograd caches, autotune results, the
    compiled kernels and Triton's cache beneath) live when libreyolo chooses:
    ``<libreyolo cache>/inductor/torch-<version>``. Inductor keys every entry by what it compiled:
    the graph (family, size, input shape and dtype - the precision - are all in it), the config
    and the system (torch, Triton and CUDA versions, the GPU). The version in the path only keeps
    an upgrade from reading an older torch's files."""
    return cache_root() / "inductor" / f"torch-{torch.__version__}"


def cache_root() -> Path:
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


def cache_counts() -> dict:
    """Inductor's FX-graph and AOTAutograd cache hit / miss counts so far in this process."""
    from torch._dynamo.utils import counters
    ind, aot = counters["inductor"], counters["aot_autograd"]
    return {"fxgraph_cache_hit": ind["fxgraph_cache_hit"], "fxgraph_cache_miss": ind["fxgraph_cache_miss"],
            "autograd_cache_hit": aot["autograd_cache_hit"], "autograd_cache_miss": aot["autograd_cache_miss"]}


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
    import platform  # torch's reading of the CPU (no inductor import: that pulls in dynamo)
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
                 "device": _device_identity(x.device), "versions": _versions(), "compile_mode": compile_mode()}
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
                                              inductor_configs=dict(_AOT_MODE_CONFIGS.get(compile_mode(), {})))
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
    return cache_root() / "aot" / f"torch-{torch.__version__}"
