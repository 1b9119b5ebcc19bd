"""Family name -> class; sizes; file-name and state-dict sniffing.

Adding a family is one line in ``_TABLE``. A family's module is imported the first time its class
is needed (``get_family``, ``FAMILIES[name]``), not when the registry is: naming a model
(``parse_spec``, weight-file names) reads the table alone. So building a YOLO imports neither the
DETRs' modules nor BiRefNet's, which import torchvision - and torchvision's import pulls in
torch._dynamo, seconds of every process's start. ``tests/unit/test_model.py`` checks the table
against the classes.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ..lazytable import LazyTable
from .base import Model

#: family -> (``module:Class`` under libreyolo.models, the class's FILE_PREFIX, its SIZES)
_TABLE: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "yolo9": (".yolo9.model:Yolo9", "LibreYOLO9", ("t", "s", "m", "c")),
    "yolo9_p2": (".yolo9_p2.model:Yolo9P2", "LibreYOLO9P2", ("t", "s")),
    "yolo9_e2e": (".yolo9_e2e.model:Yolo9E2E", "LibreYOLO9E2E", ("t", "s", "m", "c")),
    "yolox": (".yolox.model:Yolox", "LibreYOLOX", ("n", "t", "s", "m", "l", "x")),
    "yolo7": (".yolo7.model:Yolo7", "LibreYOLO7", ("b", "tiny")),
    "yolo2": (".yolo2.model:Yolo2", "LibreYOLO2", ("t", "b")),
    "yolo3": (".yolo3.model:Yolo3", "LibreYOLO3", ("t", "b", "spp")),
    "yolo4": (".yolo4.model:Yolo4", "LibreYOLO4", ("t", "b")),
    "rtmdet": (".rtmdet.model:Rtmdet", "LibreRTMDet", ("t", "s", "m", "l")),
    "picodet": (".picodet.model:Picodet", "LibrePICODET", ("s", "m", "l")),
    "ppyoloe": (".ppyoloe.model:PPYoloE", "LibrePPYOLOE", ("s", "m", "l", "x")),
    "yolonas": (".yolonas.model:YoloNAS", "LibreYOLONAS", ("s", "m", "l")),
    "rtdetr": (".rtdetr.model:RTDETR", "LibreRTDETR", ("r18", "r34", "r50", "r101")),
    "rtdetrv2": (".rtdetrv2.model:RTDETRv2", "LibreRTDETRv2", ("r18", "r34", "r50", "r101")),
    "dfine": (".dfine.model:Dfine", "LibreDFINE", ("n", "s", "m", "l", "x")),
    "deim": (".deim.model:Deim", "LibreDEIM", ("n", "s", "m", "l", "x")),
    "deimv2": (".deimv2.model:Deimv2", "LibreDEIMv2", ("atto", "femto", "pico", "n", "s", "m", "l", "x")),
    "ec": (".ec.model:EC", "LibreEC", ("s", "m", "l", "x")),
    "rtdetrv4": (".rtdetrv4.model:RTDETRv4", "LibreRTDETRv4", ("s", "m", "l", "x")),
    "resnet": (".resnet.model:ResNet", "LibreResNet", ("18", "34", "50", "101", "152")),
    "efficientnetv2": (".efficientnetv2.model:EfficientNetV2", "LibreEfficientNetV2",
                       ("b0", "b1", "b2", "b3", "s", "m", "l")),
    "mobilenetv4": (".mobilenetv4.model:MobileNetV4", "LibreMobileNetV4", ("s", "m", "l", "hm", "hl")),
    "convnext": (".convnext.model:ConvNeXt", "LibreConvNeXt", ("t", "s", "b", "l")),
    "segformer": (".segformer.model:Segformer", "LibreSegformer", ("b0", "b1", "b2", "b3", "b4", "b5")),
    "mobilesam": (".mobilesam.model:MobileSAM", "LibreMobileSAM", ("tiny",)),
    "sam": (".sam.model:SAM", "LibreSAM1", ("base", "large", "huge")),
    "picosam3": (".picosam3.model:PicoSAM3", "LibrePicoSAM3", ("pico",)),
    "depth_anything": (".depth_anything.model:DepthAnything", "LibreDepthAnythingV2", ("s", "b", "l")),
    "depth_anything3": (".depth_anything3.model:DepthAnything3", "LibreDepthAnything3", ("l",)),
    "zipdepth": (".zipdepth.model:ZipDepth", "LibreZipDepth", ("b",)),
    "birefnet": (".birefnet.model:BiRefNet", "LibreBiRefNet", ("t", "l")),
    "feynobg": (".feynobg.model:FeyNobg", "LibreFeyNobg", ("l",)),
    "ppocr": (".ppocr.model:PPOCR", "LibrePPOCR", ("t",)),
    "yolo1": (".yolo1.model:Yolo1", "LibreYOLO1", ("t", "b")),
    "pidnet": (".pidnet.model:Pidnet", "LibrePIDNet", ("s", "m", "l")),
    "lingbotvision": (".lingbotvision.model:LingBotVision", "LibreLingBotVision", ("s", "b", "l", "g")),
    "clip": (".clip.model:CLIP", "LibreCLIP", ("b32", "b16", "l14")),
    "siglip2": (".siglip2.model:SigLIP2", "LibreSigLIP2", ("b16", "so400m")),
    "eomt": (".eomt.model:Eomt", "LibreEoMT", ("s", "b", "l")),
    "nafnet": (".nafnet.model:NAFNet", "LibreNAFNet", ("s", "l")),
    "realesrgan": (".realesrgan.model:RealESRGAN", "LibreRealESRGAN", ("x4", "x2", "x4t")),
    "swinir": (".swinir.model:SwinIR", "LibreSwinIR", ("s", "m", "l")),
    "sam2": (".sam2.model:Sam2", "LibreSAM2", ("tiny", "small", "base-plus", "large")),
    "edgetam": (".edgetam.model:EdgeTAM", "LibreEdgeTAM", ("edge",)),
    "fomo": (".fomo.model:Fomo", "LibreFOMO", ("s", "m", "l")),
    "sam3": (".sam3.model:Sam3", "LibreSAM3", ("large",)),
}


#: family name -> its class, imported at first use (iterating the values imports them all)
FAMILIES: Mapping[str, type[Model]] = LazyTable({fam: row[0] for fam, row in _TABLE.items()}, __package__)


def naming() -> dict[str, tuple[str, tuple[str, ...]]]:
    """family -> (weight-file prefix, sizes), without importing any family."""
    return {fam: (prefix, sizes) for fam, (_, prefix, sizes) in _TABLE.items()}


def get_family(name: str) -> type[Model]:
    key = name.lower().replace("_", "").replace("-", "")
    for fam in _TABLE:
        if fam.replace("_", "") == key:
            return FAMILIES[fam]
    raise ValueError(f"unknown model family {name!r}; known families: {', '.join(FAMILIES)}")


#: a name's suffix naming a family's task variant ('ec-s-pose'), as the fixtures and the original
#: works name them, and the task it stands for
TASK_SUFFIXES = {"pose": "pose", "seg": "segment", "obb": "obb"}
TASK_SUFFIXES.update(cls="classify", embed="embed")   # LibreCLIPb32-cls.pt, clip-b32-embed
TASK_SUFFIXES["panoptic"] = "panoptic"   # EoMT's panoptic checkpoints: LibreEoMTs-panoptic.pt
TASK_SUFFIXES["restore"] = "restore"   # LibreYOLO 1.6.0's restore checkpoints: LibreNAFNets-restore.pt
TASK_SUFFIXES["point"] = "point"   # LibreYOLO 1.6.0 names FOMO checkpoints LibreFOMOs-point.pt


def parse_spec(text: str) -> tuple[type[Model], str] | None:
    """'yolo9t', 'yolo9-t', 'LibreYOLO9t', 'LibreYOLO9t.pt' -> (Yolo9, 't'); a task suffix picks the
    family's variant for that task ('ec-s-pose' -> (ECPose, 's')); else None (also for a task the
    family does not serve here)."""
    stem = Path(str(text)).name
    stem = re.sub(r"\.(pt|pth|safetensors)$", "", stem, flags=re.IGNORECASE)
    low = stem.lower()
    suffix = re.search(r"[-_](" + "|".join(TASK_SUFFIXES) + r")$", low)
    if suffix:
        task = TASK_SUFFIXES[suffix.group(1)]
        for fam, rest in _family_prefixes(low[:suffix.start()]):
            cls = FAMILIES[fam]
            if task not in (cls.TASK, *(v.TASK for v in cls.task_variants())):
                continue
            variant = cls.for_task(task)   # a variant may come in sizes of its own (yolonas-n-pose)
            for size in sorted(variant.SIZES, key=len, reverse=True):
                if rest == size.lower():
                    return variant, size
            for size in _TABLE[fam][2]:   # a family size the variant lacks: new() names the variant's sizes
                if rest == size.lower():
                    return variant, size
        return None   # e.g. the reference's LibreYOLO9c-seg.pt: a hub file, not a variant we build
    for fam, rest in _family_prefixes(low):
        for size in sorted(_TABLE[fam][2], key=len, reverse=True):
            if rest == size.lower():
                return FAMILIES[fam], size
    return None


def _family_prefixes(low: str) -> list[tuple[str, str]]:
    """(family, the rest of the name) for each family whose name or file prefix ``low`` starts
    with, longest family name first (the table alone: no family is imported)."""
    out = []
    for fam in sorted(_TABLE, key=lambda f: -len(f)):
        prefixes = {fam.lower(), _TABLE[fam][1].lower()}
        for prefix in sorted(prefixes, key=len, reverse=True):
            if prefix and low.startswith(prefix):
                out.append((fam, low[len(prefix):].lstrip("-_")))
    return out


def family_for_checkpoint(ckpt: dict, filename: str | None) -> tuple[type[Model], str | None, str]:
    """Pick the family: metadata first, then the file name, then the state-dict keys.

    Returns (class, size or None, how it was decided).
    """
    fam = ckpt.get("model_family")
    if fam:
        return get_family(str(fam)), ckpt.get("size"), "metadata"
    if filename:
        hit = parse_spec(filename)
        if hit:
            return hit[0], hit[1], "file name"
    sd = ckpt["model"]
    for cls in FAMILIES.values():
        if cls.owns_state_dict(sd):
            return cls, None, "state-dict keys"
    raise ValueError(f"cannot tell which model family {filename or 'this checkpoint'} holds: no "
                     f"'model_family' metadata, an unrecognised file name and unrecognised state-dict keys "
                     f"(known families: {', '.join(FAMILIES)})")


def _graph_row(c: type[Model]) -> dict:
    """One class's task, sizes and graph support (the keys of :func:`list_models`' rows)."""
    return {"sizes": list(c.SIZES), "task": c.TASK, "cuda_graph": c.SUPPORTS_CUDA_GRAPH,
            "cuda_graph_predict_seam": c.PREDICT_SEAM, "cuda_graph_train": c.SUPPORTS_CUDA_GRAPH_TRAIN,
            "cuda_graph_train_seam": c.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM and not c.SUPPORTS_CUDA_GRAPH_TRAIN}


def list_models() -> list[dict]:
    """Every family and size with its task and graph support.

    ``cuda_graph_train``: the whole training step (or forward+backward) is captured;
    ``cuda_graph_train_seam``: a fixed-shape front part is (DETRs: backbone + encoder forward and
    backward, the rest eager); ``cuda_graph_predict_seam``: predict captures a front part only
    (BiRefNet: the encoder; the deformable-convolution decoder runs eager). ``variants``: the
    family's classes for its other tasks (``task=`` of ``LibreYOLO.new``; RTMDet's instance
    segmentation, EC's pose, ...), each with the same keys."""
    return [{"family": f, "file_prefix": c.FILE_PREFIX, **_graph_row(c),
             "variants": [_graph_row(v) for v in c.task_variants()]}
            for f, c in FAMILIES.items()]
