"""``LibreYOLO(...)``: the one entry point that turns a name or a file into a model."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .models.base import Model
from .models.registry import TASK_SUFFIXES, family_for_checkpoint, get_family, naming, parse_spec

if TYPE_CHECKING:
    from .export.onnx_model import OnnxModel

log = logging.getLogger(__name__)

_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".safetensors")


class LibreYOLO:
    """Factory: ``LibreYOLO(path_or_name, device="auto")`` returns the family's Model.

    * An existing checkpoint file (``.pt``/``.pth``/``.safetensors``) is loaded safely
      (``weights_only=True``); its family comes from its metadata, else its file name
      (``LibreYOLO9t.pt`` -> yolo9, size t), else its state-dict keys.
    * A missing weight file (``LibreYOLO9t.pt``) is looked for in the weights cache and
      downloaded from the Hugging Face hub where allowed; otherwise ``FileNotFoundError``
      says where it looked and how to get weights. Never a silent random init.
    * A missing file whose name is none of ours (``yolov8n.pt``, ``best.pt``) is a
      ``FileNotFoundError`` at once, listing the families and their file names, without
      contacting the hub (unless ``download=True`` or ``$LIBREYOLO_HF_REPO`` asks for it).
    * A Hugging Face hub repo, ``"owner/repo"`` or ``"hf://owner/repo@revision/file.safetensors"``
      (any repo; revision and file optional): its checkpoint is downloaded into huggingface_hub's
      cache (``$HF_ENDPOINT`` is honoured) and loaded as above, its metadata deciding the family
      (:mod:`libreyolo.hub`; ``model.push_to_hub("owner/repo")`` is the other way).
    * A ``.onnx`` file written by ``model.export(format="onnx")`` loads as an
      :class:`~libreyolo.export.onnx_model.OnnxModel` (onnxruntime; same predict API and Results);
      a directory written by ``model.export(format="openvino")`` (or its ``.xml``) as an
      :class:`~libreyolo.export.openvino_model.OpenvinoModel` (OpenVINO's CPU plugin).
    * ``nc`` is checked against a checkpoint's (or an ONNX file's) own class count: a different
      one raises, saying how to re-head (``model.reset_classes(nc)``); it never re-heads silently.
    * A bare family/size name without extension (``"yolo9t"``, ``"yolo9-s"``) builds an
      UNTRAINED model explicitly, as does ``LibreYOLO.new("yolo9", "t")``.
    * LibreYOLO 1.6.0's keywords are accepted: ``nb_classes`` (``nc``), ``size`` (checked against
      the size the checkpoint holds; it picks the size of a file that does not say) and ``task``
      (checked against the model's task; a family/size name builds the family's variant for that
      task; its ``"segment"`` names MobileSAM's ``segment-prompt``).

    Args:
        model: a checkpoint file (.pt, .pth, .safetensors), a weight file name to find in the cache or
            on the hub, a hub repo (owner/repo, hf://owner/repo@revision/file), an exported .onnx file,
            or a family/size name (untrained)
        device: auto (CUDA when present, else the CPU), cpu, cuda, cuda:1
        download: True or False to allow or refuse a hub download (default: allowed unless
            LIBREYOLO_OFFLINE or HF_HUB_OFFLINE is set)
        nc: number of classes: an untrained model's, or the one a checkpoint must have
        names: class names of an untrained model
        imgsz: the model's default image size (default: the family's, or the checkpoint's)
        nb_classes: nc under LibreYOLO 1.6.0's name
        size: the size the checkpoint or name must hold (LibreYOLO 1.6.0's argument); it picks the
            size of a file that does not say
        task: the task the model must serve (LibreYOLO 1.6.0's argument): a family/size name builds
            the family's variant for it, a file must hold a model of it

    Returns:
        Model: the family's model (an OnnxModel for a .onnx file).
    """

    # a factory: it returns the family's model (or an OnnxModel), never a LibreYOLO instance
    def __new__(cls, model: str | Path, device: Any = "auto", *,  # type: ignore[misc]
                download: bool | None = None, nc: int | None = None, names: Any = None, imgsz: int | None = None,
                nb_classes: int | None = None, size: str | None = None,
                task: str | None = None) -> Model | OnnxModel:
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model must be a checkpoint path or a family/size name such as 'yolo9t', got "
                            f"{type(model).__name__} {model!r}")
        text = str(model)
        if not text.strip():   # Path("") is the current folder: never load that
            raise ValueError("model is empty: give a checkpoint path or a family/size name such as 'yolo9t'")
        path = Path(text)
        if nb_classes is not None:   # LibreYOLO 1.6.0's name for nc
            if nc is not None and nc != nb_classes:
                raise ValueError(f"nc={nc} and nb_classes={nb_classes} name the same class count differently: pass one")
            nc = nb_classes
        if nc is not None:
            from .options import check_int
            nc = check_int("nc", nc, 1)
        if imgsz is not None:   # checked before anything is loaded (0 is not 'the default')
            from .options import check_imgsz
            imgsz = check_imgsz(imgsz)
        from .export.openvino import is_openvino_path
        if path.suffix.lower() in (".onnx", ".engine") or is_openvino_path(path):   # an export of ours (libreyolo/export)
            if path.suffix.lower() == ".onnx":   # run by onnxruntime
                from .export.onnx_model import OnnxModel
                onnx = OnnxModel(path, device=device)
            elif path.suffix.lower() == ".engine":   # a TensorRT engine (needs CUDA and tensorrt)
                from .export.tensorrt import TensorrtModel
                onnx = TensorrtModel(path, device=device)
            else:   # an OpenVINO IR (its directory or .xml), run by OpenVINO's CPU plugin
                from .export.openvino_model import OpenvinoModel
                onnx = OpenvinoModel(path, device=device)
            if nc is not None and nc != onnx.nc:
                raise ValueError(f"nc={nc}, but the {onnx.KIND} model '{path}' has {onnx.nc} classes, fixed when it was "
                                 f"exported: export again from a model with {nc} classes (or leave nc out)")
            _check_size(size, onnx.size, onnx, str(path))
            _check_task(task, onnx)
            return onnx
        if not path.exists():   # a hub repo: hf://owner/repo[@rev][/file], or a bare owner/repo[@rev]
            from .hub import hub_checkpoint, parse_hub_ref
            ref = parse_hub_ref(text)
            if ref is not None:
                return LibreYOLO(hub_checkpoint(ref, download), device, nc=nc, imgsz=imgsz)
        is_file_like = path.suffix.lower() in _CHECKPOINT_SUFFIXES or path.exists()
        if not is_file_like:
            spec = parse_spec(text)
            if spec is None:
                raise ValueError(f"{text!r} is neither a checkpoint file (.pt, .pth, .safetensors) nor a "
                                 "family/size name such as 'yolo9t'. Known families and their weight "
                                 f"files:\n{_families_and_file_names()}")
            fam, spec_size = spec
            _check_size(size, spec_size, fam, text)
            size = spec_size
            if task is not None and fam is get_family(fam.FAMILY):   # no task suffix: task= picks the variant
                from .compat import family_for_task
                fam = family_for_task(fam, task)
            variant = next((f"-{k}" for k, t in TASK_SUFFIXES.items()
                            if t == fam.TASK and fam is not get_family(fam.FAMILY)), "")
            from .compat import check_task
            check_task(task, fam.TASK, f"{fam.FAMILY}-{size}{variant}")   # before building anything
            log.warning("building an UNTRAINED %s-%s%s from its configuration (random weights): "
                        "its outputs are meaningless until it is trained", fam.FAMILY, size, variant)
            m = fam.new(size, nc=nc, names=names, imgsz=imgsz, device=device)
            m._warned_untrained = True  # said here once; the predictor's first-call warning checks this
            return m
        from .weights import load_checkpoint, resolve_weights
        if not path.exists():
            _refuse_unknown_name(text, download)
        resolved = resolve_weights(text, download=download)
        ckpt = load_checkpoint(resolved)
        fam, found_size, how = family_for_checkpoint(ckpt, resolved.name)
        log.debug("%s is %s (decided by %s)", resolved, fam.FAMILY, how)
        if size is not None and size not in fam.SIZES:
            raise ValueError(f"size={size!r}, but {fam.FAMILY} has sizes {', '.join(fam.SIZES)}")
        m = fam.from_checkpoint(ckpt, size=found_size or size, device=device, source=str(resolved))
        _check_size(size, m.size, fam, str(resolved))
        _check_task(task, m)
        if nc is not None and nc != m.nc:   # never silently ignored, never a silent re-head
            raise ValueError(
                f"nc={nc}, but checkpoint '{resolved}' has {m.nc} classes (a loaded model keeps its checkpoint's "
                f"classes): leave nc out, or re-head the loaded model with model.reset_classes({nc}) (weights that "
                f"still fit are kept, the new class head is untrained) or by training it on a {nc}-class dataset")
        if imgsz:
            m.imgsz = int(imgsz)
        return m

    @staticmethod
    def new(family: str, size: str, nc: int | None = None, names: Any = None, *, imgsz: int | None = None,
            device: Any = "auto", seed: int | None = None, task: str | None = None) -> Model:
        """Build an untrained model of ``family`` and ``size`` (e.g. ``LibreYOLO.new("yolo9", "t")``);
        ``nc`` defaults to the family's usual label set (80 COCO classes for detectors, ImageNet's 1000
        for classifiers, ADE20K's 150 for SegFormer). ``task`` picks the family's variant for another
        task it serves (``LibreYOLO.new("ec", "s", task="pose")``)."""
        return get_family(family).new(size, nc=nc, names=names, imgsz=imgsz, device=device, seed=seed,
                                      task=task)


def _check_size(asked: str | None, found: str, fam: Any, what: str) -> None:
    """``size=`` (LibreYOLO 1.6.0's argument) must agree with the size the file or name holds."""
    if asked is not None and str(asked) != found:
        raise ValueError(f"size={asked!r}, but {what} is {fam.FAMILY}-{found}: leave size out (it is read from "
                         "the checkpoint) or pass the file of that size")


def _check_task(task: str | None, model: Any) -> None:
    """``task=`` (LibreYOLO 1.6.0's argument) must name the model's task."""
    from .compat import check_task
    check_task(task, model.TASK, f"{model.FAMILY}-{model.size}")


def _is_libreyolo_file_name(name: str) -> bool:
    """Whether ``name`` reads like a published LibreYOLO weight file: a family's file prefix first.

    Covers names :func:`parse_spec` does not resolve to a size, such as task variants
    (``LibreYOLO9c-seg.pt``), which may still exist on the hub."""
    low = name.lower()
    return any(low.startswith(prefix.lower()) for prefix, _ in naming().values() if prefix)


def _families_and_file_names() -> str:
    """One line per family: its weight-file pattern, sizes and an example."""
    rows = []
    for family, (prefix, sizes) in naming().items():
        rows.append(f"  - {family}: {prefix}<size>.pt, sizes {', '.join(sizes)} (e.g. {prefix}{sizes[0]}.pt)")
    return "\n".join(rows)


def _refuse_unknown_name(text: str, download: bool | None) -> None:
    """Raise at once for a missing file whose name is not one of ours, instead of asking the hub.

    The hub publishes only LibreYOLO files (``LibreYOLO/<stem>``), so ``yolov8n.pt`` can only come
    back as a 404 after a network round trip (or a long wait offline). Let the lookup go on when
    the name is ours, when the file is in the weights cache, when ``$LIBREYOLO_HF_REPO`` names a
    repo of the user's own, or when ``download=True`` asks for the hub explicitly.
    """
    from .weights import weights_dir

    name = Path(text).name
    if parse_spec(text) is not None or _is_libreyolo_file_name(name):
        return
    cached = weights_dir() / name
    if cached.is_file() or download is True or os.environ.get("LIBREYOLO_HF_REPO"):
        return
    stem = Path(name).stem
    raise FileNotFoundError(
        f"weights '{text}' not found: there is no such file ({Path(text).expanduser().absolute()}) and none "
        f"in the weights cache ({cached.absolute()}), and '{stem}' is not a libreyolo model family, so "
        "there is nothing to download (the hub was not contacted).\n"
        "Known families and their weight files:\n"
        f"{_families_and_file_names()}\n"
        "Pass the path of an existing checkpoint (any file name loads), one of these file names, or a "
        "family/size name such as 'yolo9t' for an untrained model; to fetch this file from a hub repo "
        f"of your own, set LIBREYOLO_HF_REPO (or pass download=True to try LibreYOLO/{stem})."
    )
