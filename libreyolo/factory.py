"""``LibreYOLO(...)``: the one entry point that turns a name or a file into a model."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .models.base import Model
from .models.registry import family_for_checkpoint, get_family, parse_spec

log = logging.getLogger("libreyolo")


class LibreYOLO:
    """Factory: ``LibreYOLO(path_or_name, device="auto")`` returns the family's Model.

    * An existing checkpoint file (``.pt``/``.pth``/``.safetensors``) is loaded safely
      (``weights_only=True``); its family comes from its metadata, else its file name
      (``LibreYOLO9t.pt`` -> yolo9, size t), else its state-dict keys.
    * A missing weight file (``LibreYOLO9t.pt``) is looked for in the weights cache and
      downloaded from the Hugging Face hub where allowed; otherwise ``FileNotFoundError``
      says where it looked and how to get weights. Never a silent random init.
    * A bare family/size name without extension (``"yolo9t"``, ``"yolo9-s"``) builds an
      UNTRAINED model explicitly, as does ``LibreYOLO.new("yolo9", "t")``.
    """

    def __new__(cls, model: str | Path, device: Any = "auto", *, download: bool | None = None,
                nc: int | None = None, names: Any = None, imgsz: int | None = None) -> Model:
        text = str(model)
        path = Path(text)
        is_file_like = path.suffix.lower() in (".pt", ".pth", ".safetensors") or path.exists()
        if not is_file_like:
            spec = parse_spec(text)
            if spec is None:
                raise ValueError(f"{text!r} is neither a checkpoint file (.pt, .pth, .safetensors) nor a "
                                 "family/size name such as 'yolo9t'")
            fam, size = spec
            log.warning("libreyolo: building an UNTRAINED %s-%s from its configuration (random weights)",
                        fam.FAMILY, size)
            return fam.new(size, nc=nc or 80, names=names, imgsz=imgsz, device=device)
        from .weights import load_checkpoint, resolve_weights
        resolved = resolve_weights(text, download=download)
        ckpt = load_checkpoint(resolved)
        fam, size, how = family_for_checkpoint(ckpt, resolved.name)
        log.debug("libreyolo: %s is %s (decided by %s)", resolved, fam.FAMILY, how)
        m = fam.from_checkpoint(ckpt, size=size, device=device, source=str(resolved))
        if imgsz:
            m.imgsz = int(imgsz)
        return m

    @staticmethod
    def new(family: str, size: str, nc: int = 80, names: Any = None, *, imgsz: int | None = None,
            device: Any = "auto", seed: int | None = None) -> Model:
        """Build an untrained model of ``family`` and ``size`` (e.g. ``LibreYOLO.new("yolo9", "t")``)."""
        return get_family(family).new(size, nc=nc, names=names, imgsz=imgsz, device=device, seed=seed)
