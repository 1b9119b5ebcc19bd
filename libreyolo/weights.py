"""Checkpoint files: load, save and locate LibreYOLO weights.

A LibreYOLO checkpoint is a plain dict ``{"model": state_dict, "model_family": ..., "size": ...,
"task": ..., "nc": ..., "names": {0: "person", ...}, "imgsz": ..., ...}``.  This module is the only
place that touches checkpoint files, so the safety rules live here once:

* loading never unpickles arbitrary objects (``torch.load(..., weights_only=True)`` or safetensors);
* saving is atomic (temp file in the target directory, fsync, ``os.replace``), so a crash or an
  exception never leaves a half-written checkpoint where a good one used to be;
* a missing weight file is an error that says where we looked and how to get weights; it is never
  silently replaced by a random initialisation.
"""

from __future__ import annotations

import errno
import inspect
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "HostPack",
    "PackedSnapshot",
    "host_copies",
    "state_dict_copies",
    "host_snapshot",
    "load_checkpoint",
    "save_checkpoint",
    "weights_dir",
    "resolve_weights",
    "default_repo_for",
    "downloads_allowed",
    "CheckpointSaveError",
    "hub_endpoint",
    "hub_timeout",
    "hub_call",
    "probe_hub",
    "HubUnreachable",
]

logger = logging.getLogger(__name__)

#: Organisation on the Hugging Face hub that publishes LibreYOLO weights, one repo per weight file.
HF_ORG = "LibreYOLO"

#: Key of the safetensors header metadata entry holding the non-tensor checkpoint fields (JSON).
SAFETENSORS_META_KEY = "libreyolo"
#: Key of the safetensors header metadata entry holding the state-dict key order (JSON list).
_SAFETENSORS_ORDER_KEY = "libreyolo.keys"

#: Environment variable: seconds the one reachability check of the hub may take before a download is
#: given up (no retries either way).
HUB_TIMEOUT_ENV = "LIBREYOLO_HUB_TIMEOUT"
DEFAULT_HUB_TIMEOUT = 2.0

_TRUE = {"1", "true", "yes", "on"}
_SAFETENSORS_SUFFIX = ".safetensors"
_STATE_DICT_KEYS = ("model", "state_dict")  # accepted spellings; normalised to "model"


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_checkpoint(path: str | os.PathLike[str], *, check_finite: bool = True) -> dict[str, Any]:
    """Load a checkpoint file into a dict whose ``"model"`` entry is a state dict of tensors.

    ``.safetensors`` files are read with safetensors (metadata from the header); anything else goes
    through ``torch.load(weights_only=True)`` so a malicious pickle cannot run code. A bare state
    dict is wrapped as ``{"model": sd}``. Raises ``FileNotFoundError`` for a missing file and
    ``ValueError`` (naming the file) for anything that is not a loadable checkpoint: a corrupt or
    truncated file (a ``.pt``'s zip CRCs are checked), and - unless ``check_finite=False``, for
    inspecting a broken file - NaN or infinite weights (see :func:`_check_finite`).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: '{path}'")
    if path.is_dir():
        raise ValueError(f"cannot load checkpoint '{path}': it is a directory, not a file")

    if path.suffix.lower() == _SAFETENSORS_SUFFIX:
        raw = _load_safetensors(path)
    else:
        raw = _load_torch(path)
    ckpt = _normalize_checkpoint(raw, path)
    if check_finite:
        _check_finite(ckpt, path)
    return ckpt


#: State-dict entries whose last name component is one of these may hold +-inf by design (never
#: NaN): anchor logits, +inf where an anchor box is not inside the image (the DETR decoders'
#: native-size ``decoder.anchors``, see ``libreyolo.models.detr_common.rtdetr_decoder.generate_anchors``).
INF_MASK_NAMES = frozenset({"anchors"})


def _check_finite(ckpt: Mapping[str, Any], path: Path) -> None:
    """Refuse NaN or +-inf weights: the network's state dict (``ckpt["model"]``) and, in a training
    checkpoint, the raw weights a resume loads (``train_state["model_raw"]``). One
    ``torch.isfinite(t).all()`` per floating tensor; a model with such weights predicts nothing
    (or garbage), so it is named here rather than discovered there."""
    dicts = [("", ckpt.get("model"))]
    state = ckpt.get("train_state")
    if isinstance(state, Mapping) and isinstance(state.get("model_raw"), Mapping):
        dicts.append(("train_state.model_raw.", state["model_raw"]))
    bad: list[str] = []
    first = ""
    for prefix, sd in dicts:
        for key, t in (sd or {}).items():
            if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()) or not t.numel():
                continue
            if bool(torch.isfinite(t).all()):
                continue
            nan = int(torch.isnan(t).sum())
            if not nan and str(key).rsplit(".", 1)[-1] in INF_MASK_NAMES:
                continue   # +-inf as a mask value, by design
            bad.append(prefix + str(key))
            if not first:
                inf = int(torch.isinf(t).sum())
                first = (f"tensor '{prefix}{key}' {tuple(t.shape)} holds {nan + inf} non-finite value(s) of "
                         f"{t.numel()} ({nan} NaN, {inf} inf)")
    if bad:
        more = f", and {len(bad) - 1} other tensor(s) too" if len(bad) > 1 else ""
        raise ValueError(f"cannot load checkpoint '{path}': its weights are not all finite: {first}{more}; "
                         "the weights are broken (a diverged training or a corrupt file): use an earlier "
                         "checkpoint, or train again")


def _load_torch(path: Path) -> Any:
    """``torch.load`` restricted to tensors and plain containers; errors become ``ValueError``.
    A zip-format file (what ``torch.save`` writes) has its members' CRCs checked first."""
    _verify_zip(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt zip, truncated file, refused pickle, ...
        refused, detail = _explain_torch_load_error(exc)
        if refused:
            what = f"it holds a pickled Python object that is not allowed ({detail})"
            hint = (
                "If the file comes from a trusted source, load it yourself and re-save its state dict "
                "and plain metadata with libreyolo.weights.save_checkpoint."
            )
        else:
            what = f"not a readable checkpoint ({detail})"
            hint = "The file may be corrupt or truncated; download or save it again."
        raise ValueError(
            f"cannot load checkpoint '{path}': {what}. Only tensors and plain containers (dict, list, "
            "tuple, str, int, float, bool, None) are accepted: checkpoints are read with "
            f"torch.load(weights_only=True) so that a file cannot run code. {hint}"
        ) from exc


_ZIP_MAGIC = b"PK\x03\x04"


def _verify_zip(path: Path) -> None:
    """Check the CRC-32 of every member of a zip-format torch file (``ZipFile.testzip``: the file
    is read once) and raise ``ValueError`` naming the file and the first bad member. torch's own
    reader does not check them, so one changed byte would otherwise load as a silently different
    weight. Files that do not start as a zip archive (legacy ``torch.save`` pickles, non-torch
    files) are left to ``torch.load``, which judges them."""
    import zipfile
    import zlib

    try:
        with open(path, "rb") as f:
            if f.read(4) != _ZIP_MAGIC:
                return
    except OSError:
        return   # unreadable: torch.load raises, and its error is reported
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, ValueError, OSError) as exc:
        raise ValueError(f"cannot load checkpoint '{path}': not a readable checkpoint, its zip archive is corrupt "
                         f"or truncated ({_first_line(exc)}); download or save it again") from exc
    if bad is not None:
        raise ValueError(f"cannot load checkpoint '{path}': its zip entry '{bad}' fails its CRC check, so the file "
                         "is corrupt or truncated (a byte changed on disk or in transfer); download or save it again")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TORCH_BOILERPLATE = ("weights only load failed", "check the documentation", "please file an issue", "in pytorch 2.6")


def _explain_torch_load_error(exc: BaseException) -> tuple[bool, str]:
    """(was a disallowed object refused?, the informative line of torch's long error message)."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    for line in lines:
        if "GLOBAL" in line:  # weights_only met a class/function it will not rebuild
            line = line.split("WeightsUnpickler error:", 1)[-1].strip()
            return True, line.split(". ", 1)[0].rstrip(".")
    useful = [ln for ln in lines if not ln.lower().startswith(_TORCH_BOILERPLATE) and not ln.startswith("(")]
    detail = (useful[-1] if useful else (lines[0] if lines else "")).split(". ", 1)[0].rstrip(".")
    return False, f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _load_safetensors(path: Path) -> dict[str, Any]:
    """Read tensors and LibreYOLO metadata from a safetensors file."""
    safe_open = _import_safetensors().safe_open
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = f.metadata() or {}
            state = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as exc:
        raise ValueError(
            f"cannot load checkpoint '{path}': not a valid safetensors file ({_first_line(exc)}). "
            "It may be corrupt or truncated; download it again."
        ) from exc

    try:
        meta = json.loads(header[SAFETENSORS_META_KEY]) if SAFETENSORS_META_KEY in header else {}
        order = json.loads(header[_SAFETENSORS_ORDER_KEY]) if _SAFETENSORS_ORDER_KEY in header else None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"cannot load checkpoint '{path}': its '{SAFETENSORS_META_KEY}' metadata is not valid JSON ({exc})"
        ) from exc
    if not isinstance(meta, dict):
        raise ValueError(f"cannot load checkpoint '{path}': its '{SAFETENSORS_META_KEY}' metadata is not a JSON object")

    # safetensors stores tensors sorted; restore the original state-dict order when it was recorded.
    if isinstance(order, list) and set(order) == set(state) and len(order) == len(state):
        state = {key: state[key] for key in order}
    if isinstance(meta.get("names"), dict):
        meta["names"] = _int_keys(meta["names"])  # JSON turned the class-index keys into strings
    meta.pop("model", None)
    return {"model": state, **meta}


def _normalize_checkpoint(raw: Any, path: Path) -> dict[str, Any]:
    """Return ``raw`` as a checkpoint dict with a tensor state dict under ``"model"``."""
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"cannot load checkpoint '{path}': expected a dict with a 'model' state dict, got {type(raw).__name__}"
        )
    if raw and all(isinstance(v, torch.Tensor) for v in raw.values()):
        return {"model": dict(raw)}  # a bare state dict

    ckpt = dict(raw)
    for key in _STATE_DICT_KEYS:
        sd = ckpt.get(key)
        if isinstance(sd, Mapping) and sd and all(isinstance(v, torch.Tensor) for v in sd.values()):
            if key != "model":
                ckpt["model"] = ckpt.pop(key)
            ckpt["model"] = dict(ckpt["model"])
            _check_metadata(ckpt, path)
            return ckpt
    raise ValueError(
        f"cannot load checkpoint '{path}': no state dict found (expected a 'model' entry mapping "
        f"parameter names to tensors, or a bare state dict); top-level keys: {sorted(map(str, ckpt))[:20]}"
    )


def _check_metadata(ckpt: dict[str, Any], path: Path) -> None:
    """Check (in place) the metadata fields a model is built from, so that a bad value is named
    here rather than failing as a bare ``int()`` later: ``nc`` and ``imgsz`` positive integers
    (``imgsz`` may be a square pair, stored back as one int), ``names`` a list of str or a dict
    {class id: str}, ``size``/``model_family``/``task`` strings. Absent or None fields are left to
    the defaults (whether ``names`` covers ``nc`` classes is checked when the model is built)."""

    def bad(field: str, wanted: str) -> ValueError:
        value = ckpt[field]
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        return ValueError(f"cannot load checkpoint '{path}': metadata field '{field}' must be {wanted}, "
                          f"got {shown} ({type(value).__name__})")

    def present(field: str) -> bool:
        return ckpt.get(field) is not None

    if present("nc"):
        nc = ckpt["nc"]
        if isinstance(nc, bool) or not isinstance(nc, int) or nc < 1:
            raise bad("nc", "a positive integer")
    if present("imgsz"):
        from .options import OptionError, check_imgsz

        try:
            ckpt["imgsz"] = check_imgsz(ckpt["imgsz"], 1)
        except OptionError:
            raise bad("imgsz", "a positive integer (pixels) or a square pair") from None
    for field in ("size", "model_family", "task"):
        if present(field) and not isinstance(ckpt[field], str):
            raise bad(field, "a string")
    if present("names"):
        names = ckpt["names"]
        if isinstance(names, (list, tuple)):
            ok = all(isinstance(n, str) for n in names)
        elif isinstance(names, Mapping):
            ok = all(isinstance(n, str) for n in names.values()) and all(
                (isinstance(k, int) and not isinstance(k, bool) and k >= 0)
                or (isinstance(k, str) and k.isdigit()) for k in names)
        else:
            ok = False
        if not ok:
            raise bad("names", "a list of class names or a dict {class id: name} of strings")


# --------------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------------


class CheckpointSaveError(OSError):
    """A checkpoint could not be written. The message names the file, the space it needs and the
    space free; the previous file at that path (if any) is intact. ``errno`` and ``filename`` are
    set where known (``errno.ENOSPC`` for a full disk)."""

    def __init__(self, message: str, *, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errno = errno
        self.filename = filename

    def __str__(self) -> str:  # OSError's own would print "[Errno 28] None: 'file'" instead
        return self.message


#: Temp files of an earlier, interrupted save of the same target older than this are removed by
#: the next save where advisory file locks are not available (a save in progress keeps its temp
#: file's modification time fresh).
STALE_TEMP_AGE_S = 60.0

#: Where locks are available (POSIX ``flock``), a save holds an exclusive lock on its temp file
#: while writing it; a temp file nobody holds a lock on and older than this is left by a writer
#: that died (``kill -9``, a crash, a power cut) and is removed by the next save, however recent.
#: The grace covers the instant between a writer creating its temp file and locking it.
STALE_TEMP_GRACE_S = 2.0

try:  # POSIX advisory locks; absent on Windows, where the age rule alone decides
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - not on the platforms CI runs
    _fcntl = None

# NamedTemporaryFile names: prefix, 8 characters of [a-z0-9_], suffix
_TEMP_TAIL = r"\.[a-z0-9_]{8}\.tmp"


def save_checkpoint(ckpt: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``ckpt`` to ``path`` atomically and return the path.

    The bytes go to a temp file in the same directory, are fsync'ed, then ``os.replace``'d onto the
    target, so readers see either the old file or the complete new one. On any error the temp file
    is removed and an existing target is left untouched; a failed write (a full disk: torch's
    "unexpected pos", or any ``OSError``) raises :class:`CheckpointSaveError` naming the file, the
    space needed and the space free. Temp files left by interrupted saves of the same target are
    removed first (see :func:`_remove_stale_temps`). A ``.safetensors`` suffix writes
    safetensors (``ckpt["model"]`` as tensors, the other fields as JSON header metadata); any other
    suffix uses ``torch.save``. Parent directories are created.
    """
    if not isinstance(ckpt, Mapping):
        raise TypeError(f"save_checkpoint expects a dict, got {type(ckpt).__name__}")
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)

    # Build the safetensors payload before touching the disk so a bad checkpoint fails early.
    payload = _safetensors_bytes(ckpt, path) if path.suffix.lower() == _SAFETENSORS_SUFFIX else None
    mode = _target_mode(path)

    _remove_stale_temps(path)

    try:   # a read-only or full folder fails here already: the error names ``path``, not the temp file
        tmp = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    except OSError as exc:
        raise _save_error(path, exc, _tensor_bytes(ckpt) if payload is None else len(payload)) from exc
    try:
        _lock(tmp.fileno())   # released by the kernel when this process dies, however it dies
        with tmp:
            if payload is not None:
                tmp.write(payload)
            else:
                torch.save(dict(ckpt), tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp.name, mode)
        os.replace(tmp.name, path)
    except BaseException as exc:
        try:
            os.unlink(tmp.name)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) or (isinstance(exc, RuntimeError) and _is_write_failure(exc)):
            needed = len(payload) if payload is not None else _tensor_bytes(ckpt)
            raise _save_error(path, exc, needed) from exc
        raise
    _fsync_dir(path.parent)
    return path


def host_snapshot(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``ckpt`` that shares nothing mutable with training: every tensor copied into new
    host memory (each its own storage; the strides of a dense one kept - channels_last stays
    channels_last -, any other contiguous), every dict / list / tuple rebuilt. What a background
    writer saves while the next epoch updates the weights and the optimizer state in place; the
    file holds the values :func:`save_checkpoint` of ``ckpt`` would have written at the call
    (CUDA tensors land on the host, as :func:`load_checkpoint` maps them anyway).
    ``PackedSnapshot(ckpt).unpack()``: the copy is taken at once, the split into tensors can be
    left to the writer thread."""
    return PackedSnapshot(ckpt).unpack()


class PackedSnapshot:
    """``ckpt`` copied to host memory as a few flat buffers (:class:`HostPack`) and its
    structure; :meth:`unpack` builds the dict of :func:`host_snapshot` from them. The tensors
    under a key path of ``contiguous`` (``"model"``, ``"train_state.model_raw"``: dotted keys)
    come back contiguous, the others with their strides where they are dense.

    Taking it costs a few operator calls however many tensors the checkpoint holds, so the
    training thread can take it at an epoch's end even while other Python threads (the loader's
    pin-memory thread, a plot being drawn) are busy: each operator call gives up the GIL, and
    getting it back behind a busy thread can take the interpreter's switch interval, which makes
    a per-tensor copy of a checkpoint of thousands of tensors take seconds (docs/benchmarks.md,
    "Training run levers"). The per-tensor work is :meth:`unpack`'s, in the thread that writes
    the files. The copies are synchronous and into
    pageable memory: no pinned block is left for the writer thread to free (a pinned free records
    CUDA events, which a graph capture in the main thread must not meet)."""

    def __init__(self, ckpt: Mapping[str, Any], contiguous: tuple[str, ...] = ()) -> None:
        tensors: list[torch.Tensor] = []
        flagged: list[bool] = []   # per tensor: whether it lies under a ``contiguous`` path
        paths = {tuple(p.split(".")) for p in contiguous}
        self._template = _template(dict(ckpt), tensors, flagged, paths, (), False)
        flat = {id(t) for t, f in zip(tensors, flagged) if f}   # flat wherever else it appears
        self._pack = HostPack(tensors, keep_strides=[id(t) not in flat for t in tensors])

    def unpack(self) -> dict[str, Any]:
        return _rebuild(self._template, self._pack.tensors())


class _Slot:
    """In :class:`PackedSnapshot`'s template, the place of its ``i``-th tensor."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple:
        return _Slot, (self.i,)


def _template(node: Any, tensors: list, flagged: list, paths: set, path: tuple | None, flag: bool) -> Any:
    """``node`` with every dict / list / tuple rebuilt and every tensor replaced by a
    :class:`_Slot`, appending the tensors to ``tensors`` (and to ``flagged`` whether they lie under
    one of ``paths``, key tuples from the root; ``path`` is ``node``'s own while it can still lead
    to one, else None). One walk both flattens and marks the tensors under ``paths``, at every
    epoch's end on the step loop's thread: with torch's pytree that takes its flatten (about as
    long as this walk) and a second walk of those subtrees, and a key path from pytree's own
    ``tree_flatten_with_path`` costs several times more (docs/benchmarks.md, "Training run
    levers"). A dict or list subclass other than OrderedDict is refused rather than copied by
    reference into a snapshot; anything else that is not a tuple is a value, kept as it is."""
    if isinstance(node, torch.Tensor):
        tensors.append(node)
        flagged.append(flag)
        return _Slot(len(tensors) - 1)
    kind = type(node)
    if kind is dict or kind is OrderedDict:
        out = kind()
        for key, value in node.items():
            sub, hit = None, flag
            if path is not None and not flag:   # (under a flagged key its whole subtree is)
                sub = (*path, key)
                hit = sub in paths
                if hit or not any(p[:len(sub)] == sub for p in paths):
                    sub = None
            try:
                out[key] = _template(value, tensors, flagged, paths, sub, hit)
            except _Refused as exc:
                exc.keys.insert(0, key)
                raise
        return out
    if kind is list:
        return [_template(v, tensors, flagged, paths, None, flag) for v in node]
    if kind is tuple or (isinstance(node, tuple) and hasattr(kind, "_fields")):
        items = [_template(v, tensors, flagged, paths, None, flag) for v in node]
        return tuple(items) if kind is tuple else kind(*items)
    if isinstance(node, (Mapping, list)):
        raise _Refused(kind)
    return node


class _Refused(TypeError):
    """:func:`_template` met a container it does not rebuild; ``keys`` is filled on the way out."""

    def __init__(self, kind: type) -> None:
        super().__init__()
        self.kind, self.keys = kind, []

    def __str__(self) -> str:
        where = ".".join(map(str, self.keys)) or "the top level"
        return (f"a checkpoint snapshot holds dicts, OrderedDicts, lists and tuples, not {self.kind.__name__} "
                f"(at {where})")


def _rebuild(node: Any, tensors: list[torch.Tensor]) -> Any:
    """:func:`_template`'s ``node`` with its slots filled from ``tensors``, every container new."""
    kind = type(node)
    if kind is _Slot:
        return tensors[node.i]
    if kind is dict or kind is OrderedDict:
        return kind((key, _rebuild(value, tensors)) for key, value in node.items())
    if kind is list:
        return [_rebuild(v, tensors) for v in node]
    if kind is tuple:
        return tuple(_rebuild(v, tensors) for v in node)
    if isinstance(node, tuple):   # a named tuple
        return kind(*(_rebuild(v, tensors) for v in node))
    return node


#: the most bytes one flat buffer of :class:`HostPack` gathers on a device (its temporary memory)
HOST_COPY_CHUNK_BYTES = 256 << 20


class HostPack:
    """The values of ``tensors`` copied to host memory in a few transfers: the tensors of one
    device and dtype concatenated (in logical order, flattened) on their device, up to
    :data:`HOST_COPY_CHUNK_BYTES` at a time, each buffer moved to the host at once.
    :meth:`tensors` splits the buffers into tensors with their own storage: contiguous, or - where
    ``keep_strides`` says so (default: none) and the source was dense - with the source's
    strides (an optimizer's channels_last momentum must match its parameter's layout: fused
    optimizers require it)."""

    def __init__(self, tensors: list[torch.Tensor], keep_strides: list[bool] | None = None) -> None:
        from torch._utils import _flatten_dense_tensors  # one C++ call per buffer (what DDP uses)

        # one pass of metadata reads (no operator call but a non-strided tensor's copy): shapes,
        # the layout to restore at unpack, and per device and dtype consecutive runs of at most
        # the chunk size
        self._shapes: list[torch.Size] = []
        self._strides: list[tuple[int, ...] | None] = []
        self._buffers: list[tuple[torch.Tensor, list[int]]] = []   # (flat host buffer, its tensors' indices)
        self._alone: dict[int, torch.Tensor] = {}                  # sparse and other non-strided layouts
        runs: dict[tuple[torch.device, torch.dtype], list] = {}    # the open run: [indices, bytes]
        chunks: list[list[int]] = []
        strided = torch.strided
        for i, (t, keep) in enumerate(zip(tensors, keep_strides or [False] * len(tensors))):
            self._shapes.append(t.shape)
            if t.layout != strided:
                self._strides.append(None)
                self._alone[i] = t.detach().to("cpu", copy=True)
                continue
            self._strides.append(t.stride() if keep and not t.is_contiguous() and is_dense(t) else None)
            size, key = t.numel() * t.element_size(), (t.device, t.dtype)
            run = runs.get(key)
            if run is None or run[1] + size > HOST_COPY_CHUNK_BYTES:
                run = runs[key] = [[], 0]
                chunks.append(run[0])
            run[0].append(i)
            run[1] += size
        with torch.no_grad():
            for chunk in chunks:
                # copy=True: a one-tensor buffer of a host tensor is that tensor's own memory
                flat = _flatten_dense_tensors([tensors[i] for i in chunk]).to("cpu", copy=True)
                self._buffers.append((flat, chunk))

    def __getstate__(self) -> dict:
        # the flat buffers as bytes (numpy views, no copy): pickled with protocol 5 they travel
        # out of band (engine.ckptwriter sends them to its child as raw bytes)
        state = dict(self.__dict__)
        state["_buffers"] = [(flat.view(torch.uint8).numpy(), flat.dtype, chunk) for flat, chunk in self._buffers]
        return state

    def __setstate__(self, state: dict) -> None:
        state["_buffers"] = [(torch.from_numpy(raw).view(dtype), chunk) for raw, dtype, chunk in state["_buffers"]]
        self.__dict__.update(state)

    def tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor | None] = [None] * len(self._shapes)
        for i, t in self._alone.items():
            out[i] = t
        for flat, chunk in self._buffers:
            parts = flat.split([self._shapes[i].numel() for i in chunk])
            for i, part in zip(chunk, parts):
                value, stride = part.view(self._shapes[i]), self._strides[i]
                out[i] = value.clone() if stride is None else \
                    torch.empty_strided(self._shapes[i], stride, dtype=value.dtype).copy_(value)
        return out  # type: ignore[return-value]


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill ``numel`` consecutive places, without gaps or overlaps, in
    some order of the dimensions (contiguous, channels_last, any permutation): metadata only."""
    if t.numel() <= 1:
        return True
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def host_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """New contiguous host tensors with the values of ``tensors`` (detached, each its own
    storage), copied in a few transfers (:class:`HostPack`)."""
    return HostPack(tensors).tensors()


def state_dict_copies(net: torch.nn.Module, host: bool = True) -> dict[str, torch.Tensor]:
    """``net``'s state dict: detached contiguous host copies (:func:`host_copies`), or with
    ``host=False`` the network's own tensors (parameters as they are: no operator call per tensor,
    see :class:`PackedSnapshot`), for a caller that copies them at once."""
    sd = net.state_dict(keep_vars=True)
    return dict(zip(sd, host_copies(list(sd.values())))) if host else sd


def _lock(fd: int) -> bool:
    """Take an exclusive advisory lock on ``fd`` without waiting; False if another open file
    holds one, or where locks are not supported (no ``fcntl``, a file system without them)."""
    if _fcntl is None:
        return False
    try:
        _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _writer_gone(entry: os.DirEntry, age: float) -> bool:
    """Whether the temp file ``entry`` (``age`` seconds since its last write) belongs to no save in
    progress: nobody holds its lock (and it is past :data:`STALE_TEMP_GRACE_S`), or, where locks
    cannot be taken, it is older than :data:`STALE_TEMP_AGE_S`."""
    if age < STALE_TEMP_GRACE_S:
        return False
    if _fcntl is not None:
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            return True            # we got the lock: its writer is gone
        except BlockingIOError:
            return False           # a save in progress holds it
        except OSError:
            pass                   # no locks on this file system: fall back to the age
        finally:
            os.close(fd)
    return age >= STALE_TEMP_AGE_S


def _remove_stale_temps(path: Path) -> None:
    """Remove temp files that interrupted saves of ``path`` left behind (``.<name>.XXXXXXXX.tmp``
    whose writer is gone, see :func:`_writer_gone`): nothing else would, and on a nearly full disk
    they hold the space the next save needs. Temp files of other targets, and of saves still in
    progress, are never touched."""
    pattern = re.compile(re.escape(f".{path.name}") + _TEMP_TAIL)
    now = time.time()
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            if not entry.is_file(follow_symlinks=False) or not _writer_gone(entry, now - entry.stat().st_mtime):
                continue
            os.unlink(entry.path)
            logger.info("removed %s, left by an interrupted save of %s", entry.path, path)
        except OSError as exc:  # gone already, or not ours to remove: leave it
            logger.debug("could not remove stale temp file %s: %s", entry.path, exc)


_WRITE_FAILURE_MARKERS = ("inline_container", "unexpected pos", "file write failed", "PytorchStreamWriter")


def _is_write_failure(exc: BaseException) -> bool:
    """Whether a RuntimeError from ``torch.save`` reports a failed write (torch's zip writer turns
    the OSError of a full disk into "[enforce fail at inline_container.cc] unexpected pos")."""
    text = str(exc)
    return any(m in text for m in _WRITE_FAILURE_MARKERS) or _os_error_in_chain(exc) is not None


def _os_error_in_chain(exc: BaseException) -> OSError | None:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensor data in ``obj`` (nested dicts/lists), each storage counted once: about
    what ``torch.save`` writes (the pickled metadata adds little)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            key = (str(x.device), storage.data_ptr())
            if key not in seen or storage.data_ptr() == 0:
                seen.add(key)
                total += storage.nbytes()
        elif isinstance(x, Mapping):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def _save_error(path: Path, exc: BaseException, needed: int) -> CheckpointSaveError:
    """The one error a failed save raises: file, cause, space needed and free, what is left."""
    os_err = _os_error_in_chain(exc)
    # the OS's words without the temp file's name (the caller asked for ``path``)
    cause = (f"OSError: [Errno {os_err.errno}] {os_err.strerror}" if os_err is not None and os_err.strerror
             else _short(os_err if os_err is not None else exc))
    if os_err is not None and exc is not os_err:
        cause += f" (torch: {_short(exc, 160)})"
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    code = os_err.errno if os_err is not None else None
    if code == errno.EROFS:
        cause += f" ('{path.parent}' is on a read-only filesystem)"
    elif code in (errno.EACCES, errno.EPERM):
        cause += f" (no permission to write in '{path.parent}')"
    # another known cause (read-only, no permission) is not a full disk, however little space is free
    full = code == errno.ENOSPC or (code in (None, errno.EIO) and free is not None and free < needed)
    space = f"it needs about {_size(needed)}; " + (
        f"{_size(free)} free on the filesystem of '{path.parent}'" if free is not None
        else "free space unknown")
    kept = (f"the previous '{path}' is intact" if path.exists() else f"nothing was written at '{path}'")
    advice = ("free some space or save elsewhere" if full
              else "check that the filesystem has room and the directory is writable")
    return CheckpointSaveError(
        f"cannot save checkpoint '{path}': {cause}; {space}{' (the disk is full)' if full else ''}; "
        f"{kept} and no temp file was left behind: {advice}",
        errno=errno.ENOSPC if full and code is None else code, filename=str(path))


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _safetensors_bytes(ckpt: Mapping[str, Any], path: Path) -> bytes:
    """Serialise ``ckpt`` to safetensors bytes: the state dict as tensors, the rest as JSON metadata."""
    save = _import_safetensors().torch.save
    sd = None
    for key in _STATE_DICT_KEYS:
        if isinstance(ckpt.get(key), Mapping):
            sd, sd_key = ckpt[key], key
            break
    if sd is None or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        raise ValueError(
            f"cannot save '{path}' as safetensors: the checkpoint needs a 'model' entry mapping names to tensors"
        )
    meta = {k: v for k, v in ckpt.items() if k != sd_key}
    try:
        meta_json = json.dumps(meta)
    except (TypeError, ValueError) as exc:
        bad = [k for k, v in meta.items() if not _json_ok(v)]
        raise ValueError(
            f"cannot save '{path}' as safetensors: fields {bad} are not JSON-serialisable ({exc}); "
            "use a .pt path to keep them"
        ) from exc
    header = {
        SAFETENSORS_META_KEY: meta_json,
        _SAFETENSORS_ORDER_KEY: json.dumps(list(sd)),
        "format": "pt",
    }
    return save(_standalone_tensors(sd), metadata=header)


def _standalone_tensors(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors that own their memory (safetensors refuses shared storage)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, tensor in sd.items():
        t = tensor.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        shares = ptr in seen or storage.nbytes() != t.numel() * t.element_size()
        if shares and t.numel() > 0:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[key] = t
    return out


def _target_mode(path: Path) -> int:
    """File mode for the new file: keep an existing target's mode, else 0o666 minus the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where Linux allows, else the common 0o022."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (POSIX); best effort, a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------------
# Locating and downloading
# --------------------------------------------------------------------------------------------------


def weights_dir() -> Path:
    """Directory where downloaded weights are cached: ``$LIBREYOLO_WEIGHTS_DIR`` or ``~/.cache/libreyolo/weights``."""
    env = os.environ.get("LIBREYOLO_WEIGHTS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "libreyolo" / "weights"


def default_repo_for(filename: str | os.PathLike[str]) -> str:
    """Hub repo that publishes ``filename``: LibreYOLO puts each weight in its own repo named after it.

    ``LibreYOLO9t.pt`` -> ``LibreYOLO/LibreYOLO9t``; ``LibreYOLOXs-seg.pt`` -> ``LibreYOLO/LibreYOLOXs-seg``.
    """
    stem = Path(filename).name
    for suffix in (".pt", ".pth", _SAFETENSORS_SUFFIX):
        if stem.lower().endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    return f"{HF_ORG}/{stem}"


def downloads_allowed(download: bool | None = None) -> tuple[bool, str]:
    """Whether a weight download may happen, and a short reason when it may not.

    An explicit ``download`` wins; otherwise downloading is on unless ``LIBREYOLO_OFFLINE`` or
    ``HF_HUB_OFFLINE`` says offline.
    """
    if download is not None:
        return bool(download), "" if download else "download=False was passed"
    for var in ("LIBREYOLO_OFFLINE", "HF_HUB_OFFLINE"):
        value = os.environ.get(var, "")
        if value.strip().lower() in _TRUE:
            return False, f"downloads are disabled by {var}={value}"
    return True, ""


def resolve_weights(
    name_or_path: str | os.PathLike[str],
    *,
    download: bool | None = None,
    repo_id: str | None = None,
) -> Path:
    """Find a weight file: the given path, then the weights cache, then the Hugging Face hub.

    Downloads go into :func:`weights_dir` through ``huggingface_hub.hf_hub_download`` (progress bar,
    atomic rename), after one HEAD request for the file (no retries, at most :func:`hub_timeout`
    seconds) has shown that the hub (:func:`hub_endpoint`) answers; without network the download
    is skipped at once. The repo is ``repo_id``, else ``$LIBREYOLO_HF_REPO``, else
    :func:`default_repo_for`. When nothing is found, one ``FileNotFoundError`` lists every place
    looked and how to get weights; there is never a fallback to random weights.
    """
    given = Path(name_or_path).expanduser()
    if given.exists():
        return given

    filename = given.name
    looked: list[str] = [f"{given.absolute()} (the given path): not found"]
    cached = weights_dir() / filename
    if cached.is_file():
        return cached
    if cached.absolute() != given.absolute():
        looked.append(f"{cached.absolute()} (weights cache, set LIBREYOLO_WEIGHTS_DIR to change): not found")

    repo = repo_id or os.environ.get("LIBREYOLO_HF_REPO") or default_repo_for(filename)
    allowed, why_not = downloads_allowed(download)
    if allowed:
        timeout = hub_timeout()  # a bad LIBREYOLO_HUB_TIMEOUT is the user's error, raised as such
        try:
            return _download(repo, filename, cached.parent, timeout)
        except _HubUnreachable as exc:
            looked.append(f"Hugging Face hub repo '{repo}', file '{filename}': download skipped: {exc}")
        except Exception as exc:  # 404, auth, disk, ...: all end in the one error below
            looked.append(f"Hugging Face hub repo '{repo}', file '{filename}': download failed: {_short(exc)}")
    else:
        looked.append(f"Hugging Face hub repo '{repo}', file '{filename}': not tried ({why_not})")

    hints = [
        f"download the file and pass its path, e.g. LibreYOLO('/path/to/{filename}')",
        "or set LIBREYOLO_HF_REPO to a hub repo that holds it (downloads need LIBREYOLO_OFFLINE "
        "and HF_HUB_OFFLINE unset)",
        'or build an untrained model explicitly, e.g. libreyolo.LibreYOLO.new("yolo9", "t")',
    ]
    if allowed:  # the hub was tried and failed
        hints.append("without network, set LIBREYOLO_OFFLINE=1 to skip the hub attempt (files on disk and "
                     "in the weights cache still load)")
    raise FileNotFoundError(
        f"weights '{name_or_path}' not found. Looked in:\n"
        + "".join(f"  - {line}\n" for line in looked)
        + "To get weights:\n"
        + "\n".join(f"  - {hint}" for hint in hints)
    )


def hub_endpoint() -> str:
    """The hub's base URL: ``$HF_ENDPOINT`` when set, else ``huggingface_hub.constants.ENDPOINT``."""
    env = os.environ.get("HF_ENDPOINT", "").strip()
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def hub_timeout() -> float:
    """Seconds the hub's reachability check may take: ``$LIBREYOLO_HUB_TIMEOUT``, default 2."""
    raw = os.environ.get(HUB_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_HUB_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{HUB_TIMEOUT_ENV}={raw!r} is not a positive number of seconds")
    return value


class HubUnreachable(OSError):
    """The hub did not answer the reachability check; the message is the reason."""


_HubUnreachable = HubUnreachable


def probe_hub(repo: str, filename: str, endpoint: str, timeout: float, revision: str | None = None) -> None:
    """One HEAD request for the file, no retries, bounded by ``timeout`` seconds in all.

    Returns when the hub has the file. Raises :class:`_HubUnreachable` when no answer came in time
    (no network, DNS failure, a refused or silent port), or the hub's own HTTP error (404, 401,
    5xx) when it answered with one. ``hf_hub_download`` is only called after a successful check:
    on a network error its first metadata request is followed by a backoff loop (five retries,
    "Retrying in 1s [Retry 1/5]" ... about 25 s) that it offers no switch for.

    The request runs in a daemon thread joined with ``timeout`` so that the bound also covers what
    an HTTP timeout does not (a hanging DNS lookup). huggingface_hub builds the request (token,
    proxies, user agent) and follows the hub's redirects.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo, filename, revision=revision, endpoint=endpoint)
    kwargs: dict[str, Any] = {"timeout": timeout}
    if "retry_on_errors" in inspect.signature(get_hf_file_metadata).parameters:
        kwargs["retry_on_errors"] = False  # newer releases; older ones never retried this request
    hub_call(lambda: get_hf_file_metadata(url, **kwargs), endpoint, timeout)


_probe_hub = probe_hub   # the name resolve_weights calls (tests replace it)


def hub_call(fn: Any, endpoint: str, timeout: float) -> Any:
    """``fn()`` (one request to the hub at ``endpoint``) in a daemon thread joined with
    ``timeout`` seconds; its result. Raises :class:`HubUnreachable` (an ``OSError``) when no
    answer came in time or the request failed without one (no network, DNS, a refused port), and
    the hub's own HTTP error (``HfHubHTTPError``: 404, 401, 5xx) when it answered with one."""
    from urllib.parse import urlparse

    from huggingface_hub.utils import HfHubHTTPError

    outcome: dict[str, Any] = {}

    def attempt() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=attempt, name="libreyolo-hub-check", daemon=True)
    worker.start()
    worker.join(timeout)
    host = urlparse(endpoint).netloc or endpoint
    reason = f"the hub ({host}) could not be reached within {timeout:g} s"
    hint = f"; set {HUB_TIMEOUT_ENV} to wait longer"
    if worker.is_alive():
        raise _HubUnreachable(f"{reason} (no answer){hint}")
    error = outcome.get("error")
    if error is None:
        return outcome.get("value")
    if isinstance(error, HfHubHTTPError):
        raise error  # the hub answered: 404 (no such repo or file), 401, 5xx
    raise _HubUnreachable(f"{reason} ({_short(error, 200)}){hint}") from error


def _download(repo: str, filename: str, local_dir: Path, timeout: float) -> Path:
    """Fetch ``filename`` from hub repo ``repo`` into ``local_dir`` and return its path.

    A quick check comes first (:func:`_probe_hub`, at most ``timeout`` seconds), so an offline
    machine fails at once instead of sitting through huggingface_hub's retries.
    """
    from huggingface_hub import hf_hub_download  # imported lazily: only needed to download

    endpoint = hub_endpoint()
    _probe_hub(repo, filename, endpoint, timeout)
    local_dir.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s from Hugging Face hub repo %s into %s", filename, repo, local_dir)
    result = Path(hf_hub_download(repo_id=repo, filename=filename, local_dir=local_dir, endpoint=endpoint))
    if not result.is_file():
        raise FileNotFoundError(f"hf_hub_download returned '{result}', which is not a file")
    return result


# --------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------


def _import_safetensors() -> Any:
    """Import safetensors on demand so ``.pt`` checkpoints work without it."""
    try:
        import safetensors
        import safetensors.torch  # noqa: F401  (registers the submodule attribute)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading or writing .safetensors checkpoints needs `pip install safetensors`") from exc
    return safetensors


def _int_keys(d: Mapping[Any, Any]) -> dict[Any, Any]:
    """Turn decimal-string keys back into ints (JSON object keys are always strings)."""
    out: dict[Any, Any] = {}
    for key, value in d.items():
        if isinstance(key, str) and key.lstrip("-").isdigit():
            key = int(key)
        out[key] = value
    return out


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
