"""The recognizer's CTC alphabet: index 0 is the blank, then the dictionary, then a space.

A LibreYOLO PP-OCR checkpoint may carry its alphabet (metadata key ``charset``: a list of the
18,385 class strings, the blank's entry first); otherwise the bundled PP-OCRv5 dictionary
(:data:`libreyolo.assets.PPOCRV5_DICT`, PaddleOCR's, Apache-2.0) gives it, as the PP-OCRv5
recognizers were trained with: blank + the 18,383 dictionary characters + " ".
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

BLANK = ""   # the blank decodes to nothing


@lru_cache(maxsize=2)
def bundled_charset() -> tuple[str, ...]:
    """Blank + the PP-OCRv5 dictionary (one character per line, split on "\\n" only: some
    characters are Unicode separators that ``str.splitlines`` would split on) + space."""
    from ...assets import PPOCRV5_DICT
    with open(PPOCRV5_DICT, encoding="utf-8") as f:
        chars = f.read().split("\n")
    if chars and chars[-1] == "":
        chars.pop()
    return (BLANK, *chars, " ")


def load_charset(meta: Any, num_classes: int, source: str | None = None) -> tuple[str, ...]:
    """The alphabet of a model with ``num_classes`` CTC classes: the checkpoint's ``charset``
    metadata when given, else the bundled one; either must have exactly ``num_classes`` entries."""
    where = source or "checkpoint"
    if meta is None:
        cs = bundled_charset()
        what = "the bundled PP-OCRv5 dictionary (blank + characters + space)"
    else:
        if isinstance(meta, str) or not isinstance(meta, (list, tuple)):
            raise ValueError(f"{where}: metadata 'charset' must be a list of strings, got {type(meta).__name__}")
        cs = tuple(str(c) for c in meta)
        cs = (BLANK, *cs[1:]) if cs else cs
        what = f"{where}'s 'charset' metadata"
    if len(cs) != num_classes:
        raise ValueError(f"the recognizer has {num_classes} CTC classes but {what} has {len(cs)} entries")
    return cs
