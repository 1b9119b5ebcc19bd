"""A synthetic printed page (black text lines on white) for OCR benchmarks and tests."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from .results import text_font

#: the page's sentences (ASCII: every font draws them), used in turn
SENTENCES = (
    "The quick brown fox jumps over the lazy dog",
    "Pack my box with five dozen liquor jugs 2024",
    "CUDA graphs replay captured kernels exactly",
    "Invoice 10482 total due 318.40 EUR",
    "Sphinx of black quartz, judge my vow",
    "Meeting moved to Thursday at 14:30",
    "How vexingly quick daft zebras jump",
    "Order no. 55-1207 shipped on 3 March",
    "Bright vixens jump; dozy fowl quack",
    "Text detection then recognition of lines",
)


def text_page(lines: int = 10, width: int = 960, line_height: int | None = None) -> np.ndarray:
    """An (H, ``width``, 3) uint8 RGB page with ``lines`` left-aligned printed lines, one per
    row of ``line_height`` pixels (default ``width / 16``), text about 60 % of the row high."""
    if lines < 0 or width < 32:
        raise ValueError(f"text_page needs lines >= 0 and width >= 32, got {lines} and {width}")
    lh = int(line_height or max(12, width // 16))
    h = max(32, lh * lines + lh)
    page = Image.new("RGB", (width, h), (255, 255, 255))
    draw = ImageDraw.Draw(page)
    font = text_font(max(8, int(lh * 0.6)))
    margin = max(4, width // 24)
    for i in range(lines):
        draw.text((margin, lh // 2 + i * lh), SENTENCES[i % len(SENTENCES)], fill=(0, 0, 0), font=font)
    return np.asarray(page, dtype=np.uint8).copy()
