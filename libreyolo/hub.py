"""The Hugging Face hub both ways: ``LibreYOLO("owner/repo")`` / ``LibreYOLO("hf://owner/repo@rev/file.pt")``
load any repo's checkpoint (its metadata decides the family), ``model.push_to_hub("owner/repo")``
publishes one (safetensors weights and a model card).

Everything goes through ``huggingface_hub`` at :func:`libreyolo.weights.hub_endpoint`
(``$HF_ENDPOINT``); a token comes from ``token=``, else huggingface_hub's own (``$HF_TOKEN``,
``hf auth login``). Downloads land in huggingface_hub's cache (``$HF_HOME``), one folder per
revision, and load as every checkpoint does (:func:`libreyolo.weights.load_checkpoint`:
safetensors or ``torch.load(weights_only=True)``, never an arbitrary pickle). The first request
to the hub is bounded by :func:`libreyolo.weights.hub_timeout`, so an offline machine is told at
once; with downloads off (``download=False``, ``LIBREYOLO_OFFLINE`` or ``HF_HUB_OFFLINE``) only
the cache is read.
"""
from __future__ import annotations

import json
import logging
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models.base import Model

__all__ = ["HUB_FILE", "HubRef", "hub_checkpoint", "model_card", "parse_hub_ref", "push_to_hub"]

log = logging.getLogger(__name__)

#: The file :func:`push_to_hub` writes the weights to (and the one picked from a repo holding several).
HUB_FILE = "model.safetensors"
#: Files of a repo that are checkpoints, in order of preference.
_CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth")

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_BARE = re.compile(rf"^({_NAME})/({_NAME})(?:@([^/\s]+))?$")
_URL = re.compile(rf"^hf://({_NAME})/({_NAME})(?:@([^/\s]+))?(?:/(.+))?$")


@dataclass(frozen=True)
class HubRef:
    """A checkpoint on the hub: repo ``owner/name``, a revision (branch, tag or commit; None: the
    default branch) and a file in the repo (None: the repo's one checkpoint)."""

    repo_id: str
    revision: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"hf://{self.repo_id}{rev}" + (f"/{self.filename}" if self.filename else "")


def parse_hub_ref(text: str) -> HubRef | None:
    """``hf://owner/repo[@rev][/path/in/repo]``, or a bare ``owner/repo[@rev]`` (no file suffix),
    as a :class:`HubRef`; None for anything else (a path, a family name). A ``hf://`` text that
    does not parse is a ValueError saying the form."""
    text = str(text).strip()
    if text.startswith("hf://"):
        m = _URL.match(text)
        if m is None:
            raise ValueError(f"{text!r} is not a hub reference: the form is hf://owner/repo, "
                             "hf://owner/repo@revision or hf://owner/repo@revision/file.safetensors")
        owner, name, rev, filename = m.groups()
        return HubRef(f"{owner}/{name}", rev or None, (filename or "").strip("/") or None)
    m = _BARE.match(text)
    if m is None or Path(m.group(2)).suffix.lower() in (*_CHECKPOINT_SUFFIXES, ".onnx"):
        return None
    owner, name, rev = m.groups()
    return HubRef(f"{owner}/{name}", rev or None, None)


def hub_checkpoint(ref: HubRef, download: bool | None = None) -> Path:
    """The local path of ``ref``'s checkpoint: downloaded into huggingface_hub's cache, or found
    there when downloads are off. Without a file name the repo's checkpoint is the one file of
    ``.safetensors``/``.pt``/``.pth`` (:data:`HUB_FILE` where there are several), from the repo's
    file list (``model_info``: one request, bounded like the download's check). Every failure
    is one ``FileNotFoundError`` naming the repo, the revision and what to do."""
    from .weights import downloads_allowed

    allowed, why_not = downloads_allowed(download)
    if not allowed:
        return _from_cache(ref, why_not)
    return _download(ref)


def _download(ref: HubRef) -> Path:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.utils import HfHubHTTPError

    from .weights import HubUnreachable, hub_call, hub_endpoint, hub_timeout, probe_hub

    endpoint, timeout = hub_endpoint(), hub_timeout()
    where = _where(ref, endpoint)
    try:
        filename = ref.filename
        if filename is None:   # the listing is the reachability check (model_info: one request, no retries)
            api = HfApi(endpoint=endpoint)
            info = hub_call(lambda: api.model_info(ref.repo_id, revision=ref.revision, timeout=timeout),
                            endpoint, timeout)
            filename = _pick([s.rfilename for s in info.siblings or ()], ref, where)
        else:
            probe_hub(ref.repo_id, filename, endpoint, timeout, revision=ref.revision)
        log.info("downloading %s from %s", filename, where)
        return Path(hf_hub_download(ref.repo_id, filename, revision=ref.revision, endpoint=endpoint))
    except HubUnreachable as exc:
        raise FileNotFoundError(f"cannot load {ref}: {exc}. Without network, set LIBREYOLO_OFFLINE=1 to "
                                "load it from the hub cache, where an earlier download left it") from None
    except HfHubHTTPError as exc:
        raise FileNotFoundError(f"cannot load {ref}: {_http_reason(exc, ref, where)}") from None


def _from_cache(ref: HubRef, why_not: str) -> Path:
    """``ref``'s checkpoint from huggingface_hub's cache, without a request."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import LocalEntryNotFoundError

    patterns = [ref.filename] if ref.filename else [f"*{s}" for s in _CHECKPOINT_SUFFIXES]
    try:
        folder = Path(snapshot_download(ref.repo_id, revision=ref.revision, allow_patterns=patterns,
                                        local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        raise FileNotFoundError(f"cannot load {ref}: it is not in the hub cache, and {why_not}; download "
                                f"it once with downloads on ({type(exc).__name__})") from None
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    filename = ref.filename or _pick(files, ref, "the hub cache")
    path = folder / filename
    if not path.is_file():
        raise FileNotFoundError(f"cannot load {ref}: '{filename}' is not in the hub cache, and {why_not}")
    return path


def _pick(files: list[str], ref: HubRef, where: str) -> str:
    """The repo's checkpoint among ``files``: the only one, else :data:`HUB_FILE`."""
    found = [f for f in files if f.lower().endswith(_CHECKPOINT_SUFFIXES)]
    if len(found) == 1:
        return found[0]
    if HUB_FILE in found:
        return HUB_FILE
    if not found:
        listed = ", ".join(files[:20]) or "no files"
        raise FileNotFoundError(f"cannot load {ref}: {where} holds no checkpoint (.safetensors, .pt, .pth); "
                                f"its files: {listed}")
    raise FileNotFoundError(f"cannot load {ref}: {where} holds several checkpoints ({', '.join(found[:20])}); "
                            f"name one: LibreYOLO('hf://{ref.repo_id}{'@' + ref.revision if ref.revision else ''}"
                            f"/{found[0]}')")


def _where(ref: HubRef, endpoint: str) -> str:
    rev = f" at revision '{ref.revision}'" if ref.revision else ""
    return f"hub repo '{ref.repo_id}'{rev} ({endpoint})"


def _http_reason(exc: Exception, ref: HubRef, where: str) -> str:
    """What the hub's HTTP error means for ``ref``, in one line."""
    from huggingface_hub.utils import (
        EntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, RevisionNotFoundError):
        return f"{where}: there is no revision '{ref.revision}' (a branch, tag or commit of the repo)"
    if isinstance(exc, RepositoryNotFoundError):
        return (f"{where} does not exist, or is private or gated: check the name, and for a private repo set "
                "HF_TOKEN (or run hf auth login)")
    if isinstance(exc, EntryNotFoundError):
        return f"{where} has no file '{ref.filename}'"
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return f"{where} answered HTTP {code}: {' '.join(str(exc).split())[:300]}"


# --------------------------------------------------------------------------------------------------
# Publishing
# --------------------------------------------------------------------------------------------------


def push_to_hub(model: Model, repo_id: str, *, revision: str | None = None, private: bool | None = None,
                token: str | None = None, commit_message: str | None = None, exist_ok: bool = True) -> Any:
    """Publish ``model`` to hub repo ``repo_id`` (created when missing; ``private`` for a new
    one): its checkpoint as :data:`HUB_FILE` (safetensors: tensors and JSON metadata, loaded
    without pickle) and ``README.md``, a model card (:func:`model_card`) with the training
    metrics and the exact preprocess record. One commit on ``revision`` (default: the repo's
    main branch). Returns huggingface_hub's ``CommitInfo`` (``commit_url``, ``oid``).
    ``exist_ok=False`` refuses a repo that exists already."""
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import HfHubHTTPError

    from .weights import hub_endpoint, save_checkpoint

    if not isinstance(repo_id, str) or not _BARE.match(repo_id) or "@" in repo_id:
        raise ValueError(f"push_to_hub needs a repo id 'owner/name', got {repo_id!r}")
    ckpt = _jsonable_meta(model.checkpoint())
    if not ckpt.get("train_metrics"):
        metrics = _file_metrics(getattr(model, "ckpt_path", None))
        if metrics:
            ckpt["train_metrics"] = metrics
    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=exist_ok, repo_type="model")
        with tempfile.TemporaryDirectory(prefix="libreyolo-push-") as tmp:
            weights = save_checkpoint(ckpt, Path(tmp) / HUB_FILE)
            card = Path(tmp) / "README.md"
            card.write_text(model_card(ckpt, repo_id), encoding="utf-8")
            ops = [CommitOperationAdd(path_in_repo=HUB_FILE, path_or_fileobj=str(weights)),
                   CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=str(card))]
            info = api.create_commit(repo_id, ops, revision=revision, commit_message=commit_message or
                                     f"LibreYOLO {ckpt.get('model_family')}-{ckpt.get('size')} weights and model card")
    except HfHubHTTPError as exc:
        response = getattr(exc, "response", None)
        code = getattr(response, "status_code", None)
        hint = (" (a write token is needed: pass token=, set HF_TOKEN or run hf auth login)"
                if code in (401, 403) else "")
        raise OSError(f"push_to_hub('{repo_id}') to {endpoint} failed: HTTP {code}{hint}: "
                      f"{' '.join(str(exc).split())[:300]}") from None
    log.info("pushed %s and README.md to %s: %s", HUB_FILE, repo_id, info.commit_url)
    return info


def model_card(ckpt: dict[str, Any], repo_id: str) -> str:
    """The ``README.md`` of a pushed checkpoint: hub metadata (``library_name``, tags), what the
    model is, how to load it, its training metrics, the exact preprocess record and its classes."""
    family, size, task = ckpt.get("model_family", "?"), ckpt.get("size", "?"), ckpt.get("task", "detect")
    names = ckpt.get("names") or {}
    pipeline = {"detect": "object-detection", "classify": "image-classification", "segment": "image-segmentation",
                "semantic": "image-segmentation", "depth": "depth-estimation", "matte": "image-segmentation",
                "pose": "keypoint-detection", "ocr": "image-to-text"}.get(str(task))
    lines = ["---", "library_name: libreyolo", "tags:", "- libreyolo", f"- {family}", f"- {task}"]
    if pipeline:
        lines.append(f"pipeline_tag: {pipeline}")
    lines += ["---", "", f"# {repo_id}", "",
              f"A LibreYOLO **{family}-{size}** model for **{task}**: {len(names) or ckpt.get('nc', '?')} classes, "
              f"input size {ckpt.get('imgsz', '?')}.", "", "## Use", "", "```python", "from libreyolo import LibreYOLO",
              "", f'model = LibreYOLO("{repo_id}")   # or "hf://{repo_id}@<revision>/{HUB_FILE}"',
              'results = model("image.jpg")', "```", "",
              f"`{HUB_FILE}` holds the weights as safetensors and the checkpoint's metadata as JSON in its "
              "header: it loads without unpickling anything.", ""]
    metrics = _scalars(ckpt.get("train_metrics") or {})
    lines += ["## Training metrics", ""]
    if metrics:
        lines += ["| metric | value |", "| --- | --- |"] + [f"| {k} | {v:.6g} |" for k, v in metrics.items()]
    else:
        lines.append("No training metrics were recorded with these weights.")
    lines += ["", "## Preprocessing", "",
              "The exact preprocessing the weights expect (the checkpoint's `preprocess` record, which "
              "`LibreYOLO` applies when it loads them):", "", "```json",
              json.dumps(ckpt.get("preprocess"), indent=2, sort_keys=True), "```", ""]
    if names:
        shown = list(names.items())[:100]
        lines += ["## Classes", "", ", ".join(f"{k}: {v}" for k, v in shown)
                  + (f", ... ({len(names)} in all)" if len(names) > len(shown) else ""), ""]
    return "\n".join(lines)


def _scalars(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of ``metrics`` (nested dicts flattened with ``/``; lists left out)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(_scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"{prefix}{key}"] = float(value)
    return out


def _file_metrics(path: Any) -> dict[str, Any] | None:
    """The ``train_metrics`` of the checkpoint file a model holds the weights of (after training: its best.pt)."""
    if not path or not Path(path).is_file():
        return None
    from .weights import load_checkpoint
    try:
        return _jsonable(load_checkpoint(path, check_finite=False).get("train_metrics")) or None
    except (OSError, ValueError):
        return None


def _jsonable_meta(ckpt: dict[str, Any]) -> dict[str, Any]:
    """``ckpt`` with its metadata made JSON (what a safetensors header holds): numpy and torch
    scalars as numbers, tuples as lists, other objects as their text; the state dict as it is."""
    return {k: (v if k == "model" else _jsonable(v)) for k, v in ckpt.items() if k != "train_state"}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {(k if isinstance(k, (str, int)) else str(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return _jsonable(item())
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _jsonable(tolist())
    return str(value)
