"""The public names of LibreYOLO 1.6.0 (the library this one replaces) that exist here too.

Code written for that library imports per-family classes (``from libreyolo import LibreYOLO9``)
and builds models with them: ``LibreYOLO9("LibreYOLO9t.pt", size="t")`` loads a checkpoint,
``LibreYOLO9(None, size="t", nb_classes=3)`` builds an untrained network. Here a family is one
:class:`~libreyolo.models.base.Model` subclass chosen by the factory, so each such name is a
:class:`FamilyAlias`: calling it goes through :class:`~libreyolo.factory.LibreYOLO` (which checks
that the file holds that family), ``isinstance(model, LibreYOLO9)`` asks whether ``model`` is a
model of that family, and its other attributes (``SIZES``, ``FAMILY``, ``new``...) are the family
class's. Which of that library's names are offered and why the others are not: docs/reference-api.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .models.registry import get_family, naming

if TYPE_CHECKING:
    from .models.base import Model

#: the alias name -> our family, for every family (its weight-file prefix is its name there)
FAMILY_ALIASES: dict[str, str] = {prefix: fam for fam, (prefix, _) in naming().items()}



class FamilyAlias(type):
    """The metaclass of the per-family names: a call builds or loads a model of the family."""

    family: str

    def __call__(cls, model_path: Any = None, size: str | None = None, nb_classes: int | None = None,
                 device: Any = "auto", task: str | None = None, **kwargs: Any):
        from .factory import LibreYOLO
        fam = get_family(cls.family)
        if model_path is None:   # that library's untrained construction
            if size is None:
                raise TypeError(f"{cls.__name__}(None, size=...) builds an untrained {fam.FAMILY}: name its size "
                                f"(one of {', '.join(fam.SIZES)})")
            if kwargs:
                raise TypeError(f"{cls.__name__}() got unexpected keyword arguments {sorted(kwargs)}")
            variant = family_for_task(fam, task)   # task= picks the family's variant (ec: pose)
            check_task(task, variant.TASK, f"{cls.__name__}")
            return variant.new(size, nc=nb_classes, device=device)
        path = Path(str(model_path))
        if path.suffix.lower() not in (".pt", ".pth", ".safetensors") and not path.exists():
            raise ValueError(f"{cls.__name__}({model_path!r}): give a checkpoint file of the {fam.FAMILY} family "
                             f"(or None with size= for an untrained network)")
        model = LibreYOLO(model_path, device=device, nb_classes=nb_classes, size=size, task=task, **kwargs)
        if not isinstance(model, fam):
            raise ValueError(f"{model_path} holds a {model.FAMILY} model, not {fam.FAMILY}: load it with "
                             f"LibreYOLO({str(model_path)!r})")
        return model

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, get_family(cls.family))

    def __subclasscheck__(cls, sub: type) -> bool:
        return isinstance(sub, type) and issubclass(sub, get_family(cls.family))

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(get_family(cls.family), name)

    def __repr__(cls) -> str:
        return f"<libreyolo family {cls.family!r} ({cls.__name__})>"


def family_alias(name: str) -> FamilyAlias:
    """The per-family name ``name`` (``"LibreYOLO9"``) as a :class:`FamilyAlias`."""
    fam = FAMILY_ALIASES[name]
    doc = (f"The {fam} family under its LibreYOLO 1.6.0 name: ``{name}(path)`` loads a {fam} checkpoint, "
           f"``{name}(None, size=..., nb_classes=...)`` builds an untrained one.")
    return FamilyAlias(name, (), {"family": fam, "__doc__": doc, "__module__": "libreyolo"})


def family_for_task(fam: type[Model], task: Any) -> type[Model]:
    """``fam``'s class serving ``task`` when the family has a variant for it (``ec`` and
    ``"pose"``: ECPose), else ``fam`` itself (:func:`check_task` then says what is wrong)."""
    if not isinstance(task, str) or task == fam.TASK:
        return fam
    return next((v for v in fam.task_variants() if v.TASK == task), fam)


def check_task(task: Any, own: str, what: str) -> None:
    """Accept ``task`` when it names ``own``, the model's task (``None``: no request); else raise
    naming both. That library names the promptable-segmentation task ``segment`` too, so
    ``"segment"`` is accepted for a ``segment-prompt`` model (MobileSAM)."""
    if task is None:
        return
    if not isinstance(task, str):
        raise TypeError(f"task must be a task name (text), got {type(task).__name__}")
    if task == own or (task == "segment" and own == "segment-prompt"):
        return
    raise ValueError(f"{what} is a {own} model; task={task!r} asks for another task")


#: our task names that LibreYOLO 1.6.0 knows under another name: a checkpoint's ``task`` field is
#: written in its vocabulary, so that it loads what is saved here (it refuses a task it does not
#: know). The others (detect, classify, pose, segment, ...) are its names too. Here the family
#: decides how a checkpoint loads; the field picks only among a family's task variants (ec: detect
#: or pose; rtmdet: detect or segment)
CHECKPOINT_TASK_NAMES: dict[str, str] = {"segment-prompt": "segment"}


def checkpoint_task(task: str) -> str:
    """The ``task`` field a checkpoint of a ``task`` model carries."""
    return CHECKPOINT_TASK_NAMES.get(task, task)


#: the result types under that library's names -> (module, attribute) here
RESULT_TYPES: dict[str, tuple[str, str]] = {
    "Results": (".results", "Results"),
    "Boxes": (".results", "Boxes"),
    "Probs": (".tasks.classify.results", "Probs"),
    "SemanticMask": (".tasks.semantic.results", "SemanticMask"),
    "DepthMap": (".tasks.depth.results", "DepthMap"),
    "Matte": (".tasks.matte.results", "Alpha"),
    "OCRRegions": (".tasks.ocr.results", "TextLines"),
    "Masks": (".tasks.segment_prompt.results", "PromptMasks"),
    "Keypoints": (".tasks.pose.results", "Keypoints"),
    "PanopticSegmentation": (".tasks.panoptic.results", "PanopticSegmentation"),
    "Points": (".tasks.point.results", "Points"),
}
