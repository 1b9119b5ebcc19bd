"""Rendered test pages with known text for OCR with real weights, and the character error rate.

English pages use DejaVu Sans (PIL's fallback chain: the DejaVu that matplotlib ships);
Chinese pages use Noto Sans CJK from the ``rinoh-typeface-notosanscjk`` wheel (SIL OFL, the
``test`` extra): :func:`cjk_font_path` is None where it is not installed.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

ENGLISH = (
    "The quick brown fox jumps over the lazy dog",
    "Invoice 10482 total due 318.40 EUR",
    "Meeting moved to Thursday at 14:30",
    "Sphinx of black quartz, judge my vow",
    "Order no. 55-1207 shipped on 3 March",
    "How vexingly quick daft zebras jump",
    "Pack my box with five dozen liquor jugs",
    "Bright vixens jump; dozy fowl quack",
)
CHINESE = (
    "今天天气很好我们去公园散步",
    "文字识别系统读取图片中的文本",
    "北京上海广州深圳四个城市",
    "请在下午三点之前提交报告",
    "人工智能正在改变我们的生活",
)


def latin_font_path() -> str:
    """DejaVu Sans: the system's, else the copy matplotlib ships (a dependency)."""
    sys_font = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
    if sys_font.is_file():
        return str(sys_font)
    import matplotlib
    return str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf")


def cjk_font_path() -> str | None:
    """Noto Sans CJK (regular) from the rinoh-typeface-notosanscjk wheel, or None."""
    spec = importlib.util.find_spec("rinoh_typeface_notosanscjk")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "notosanscjkjp-regular.otf"
    return str(path) if path.is_file() else None


def render(lines: list[tuple[str, int]], font_path: str, width: int = 960, margin: int = 40,
           gap: float = 0.9) -> np.ndarray:
    """An RGB page (white, black text) with one (text, pixel size) per row, left-aligned."""
    fonts = [ImageFont.truetype(font_path, size) for _, size in lines]
    heights = [int(size * (1 + gap)) for _, size in lines]
    page = Image.new("RGB", (width, margin * 2 + sum(heights)), (255, 255, 255))
    draw = ImageDraw.Draw(page)
    y = margin
    for (text, _), font, h in zip(lines, fonts, heights):
        draw.text((margin, y), text, fill=(0, 0, 0), font=font)
        y += h
    return np.asarray(page, dtype=np.uint8).copy()


def english_page() -> tuple[np.ndarray, list[str]]:
    """Eight English lines at 18 to 40 px."""
    sizes = (18, 22, 26, 30, 34, 40, 24, 20)
    lines = list(zip(ENGLISH, sizes))
    return render(lines, latin_font_path(), width=1100), [t for t, _ in lines]


def chinese_page(font: str) -> tuple[np.ndarray, list[str]]:
    """Five Chinese lines at 20 to 40 px."""
    lines = list(zip(CHINESE, (20, 26, 32, 40, 24)))
    return render(lines, font, width=960), [t for t, _ in lines]


def dense_page() -> tuple[np.ndarray, list[str]]:
    """Thirty English lines at 16 px (two columns' worth of text in one)."""
    texts = [f"{ENGLISH[i % len(ENGLISH)]} {i + 1}" for i in range(30)]
    return render([(t, 16) for t in texts], latin_font_path(), width=800, margin=24, gap=0.7), texts


def rotated_page(angle: float = 4.0) -> tuple[np.ndarray, list[str]]:
    """Five English lines at 26 px, the page turned ``angle`` degrees (white fill)."""
    texts = list(ENGLISH[:5])
    page = render([(t, 26) for t in texts], latin_font_path(), width=900)
    rot = Image.fromarray(page).rotate(angle, resample=Image.BICUBIC, expand=True, fillcolor=(255, 255, 255))
    return np.asarray(rot, dtype=np.uint8).copy(), texts


def blank_page() -> np.ndarray:
    return np.full((600, 800, 3), 255, np.uint8)


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def cer(read: list[str], truth: list[str]) -> float:
    """Character error rate of the lines read (reading order, joined by newlines) against the truth."""
    ref = "\n".join(truth)
    return levenshtein("\n".join(read), ref) / max(1, len(ref))
