"""Family name -> class; sizes; file-name and state-dict sniffing.

Adding a family is one import and one line in ``FAMILIES``.
"""
from __future__ import annotations

import re
from pathlib import Path

from .base import Model
from .birefnet.model import BiRefNet
from .convnext.model import ConvNeXt
from .deim.model import Deim
from .deimv2.model import Deimv2
from .depth_anything.model import DepthAnything
from .dfine.model import Dfine
from .ec.model import EC
from .efficientnetv2.model import EfficientNetV2
from .mobilenetv4.model import MobileNetV4
from .mobilesam.model import MobileSAM
from .picodet.model import Picodet
from .ppocr.model import PPOCR
from .resnet.model import ResNet
from .rtdetr.model import RTDETR
from .rtdetrv2.model import RTDETRv2
from .rtdetrv4.model import RTDETRv4
from .rtmdet.model import Rtmdet
from .segformer.model import Segformer
from .yolo7.model import Yolo7
from .yolo9.model import Yolo9
from .yolox.model import Yolox

FAMILIES: dict[str, type[Model]] = {
    "yolo9": Yolo9,
    "yolox": Yolox,
    "yolo7": Yolo7,
    "rtmdet": Rtmdet,
    "picodet": Picodet,
    "rtdetr": RTDETR,
    "rtdetrv2": RTDETRv2,
    "dfine": Dfine,
    "deim": Deim,
    "deimv2": Deimv2,
    "ec": EC,
    "rtdetrv4": RTDETRv4,
    "resnet": ResNet,
    "efficientnetv2": EfficientNetV2,
    "mobilenetv4": MobileNetV4,
    "convnext": ConvNeXt,
    "segformer": Segformer,
    "mobilesam": MobileSAM,
    "depth_anything": DepthAnything,
    "birefnet": BiRefNet,
    "ppocr": PPOCR,
}


def get_family(name: str) -> type[Model]:
    key = name.lower().replace("_", "").replace("-", "")
    for fam, cls in FAMILIES.items():
        if fam.replace("_", "") == key:
            return cls
    raise ValueError(f"unknown model family {name!r}; known families: {', '.join(FAMILIES)}")


def parse_spec(text: str) -> tuple[type[Model], str] | None:
    """'yolo9t', 'yolo9-t', 'LibreYOLO9t', 'LibreYOLO9t.pt' -> (Yolo9, 't'); else None."""
    stem = Path(str(text)).name
    stem = re.sub(r"\.(pt|pth|safetensors)$", "", stem, flags=re.IGNORECASE)
    low = stem.lower()
    for cls in sorted(FAMILIES.values(), key=lambda c: -len(c.FAMILY)):
        prefixes = {cls.FAMILY.lower(), cls.FILE_PREFIX.lower()}
        for prefix in sorted(prefixes, key=len, reverse=True):
            if prefix and low.startswith(prefix):
                rest = low[len(prefix):].lstrip("-_")
                for size in sorted(cls.SIZES, key=len, reverse=True):
                    if rest == size.lower():
                        return cls, size
    return None


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


def list_models() -> list[dict]:
    """Every family and size with its task and graph support.

    ``cuda_graph_train``: the whole training step (or forward+backward) is captured;
    ``cuda_graph_train_seam``: a fixed-shape front part is (DETRs: backbone + encoder forward and
    backward, the rest eager); ``cuda_graph_predict_seam``: predict captures a front part only
    (BiRefNet: the encoder; the deformable-convolution decoder runs eager)."""
    return [{"family": f, "sizes": list(c.SIZES), "task": c.TASK, "file_prefix": c.FILE_PREFIX,
             "cuda_graph": c.SUPPORTS_CUDA_GRAPH, "cuda_graph_predict_seam": c.PREDICT_SEAM,
             "cuda_graph_train": c.SUPPORTS_CUDA_GRAPH_TRAIN,
             "cuda_graph_train_seam": c.SUPPORTS_CUDA_GRAPH_TRAIN_SEAM and not c.SUPPORTS_CUDA_GRAPH_TRAIN}
            for f, c in FAMILIES.items()]
