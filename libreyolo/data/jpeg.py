"""JPEG files decoded on the GPU (nvjpeg, through ``torchvision.io.decode_jpeg``) for predict's
``decode="gpu"`` / ``"auto"``.

Only the compressed bytes cross PCIe (a 1280x720 photo: ~0.1-0.3 MB instead of 2.7 MB of
pixels), and a chunk's files are decoded in one batched call. What goes to the GPU decoder is
decided per file by :func:`probe`, from the header alone (PIL opens lazily): a baseline or
progressive JPEG whose pixels are YCbCr (PIL mode RGB, without an Adobe marker saying the
components are stored as RGB) or greyscale and whose data ends with the JPEG end-of-image marker. Everything else - PNG, WebP, CMYK/YCCK JPEGs, truncated files, files PIL
cannot identify - goes to the CPU decoder (:func:`~libreyolo.data.sources.decode_image`), which
decodes it or raises today's error naming the file. A file the GPU decoder refuses is retried
alone on the GPU and then on the CPU, so a corrupt JPEG raises the CPU decoder's error.

Orientation: nvjpeg ignores EXIF, so the orientation is read from the header the same way
``ImageOps.exif_transpose`` reads it (``Image.getexif()``: the EXIF tag, or the XMP
``tiff:Orientation`` when there is no EXIF one) and applied with the same transposes
(:func:`orient`), on the device.

Pixel values: nvjpeg's inverse DCT and chroma upsampling are not libjpeg-turbo's (which PIL
uses: integer "islow" IDCT, "fancy" triangular chroma upsampling), so decoded pixels may differ by
a few levels from the CPU decode; the geometry (size, orientation) is identical. That is why the
GPU decode is an option and not the default: ``decode="cpu"`` keeps predict's numbers equal to
those of training and validation, which decode with PIL.
"""
from __future__ import annotations

import io
import logging
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

log = logging.getLogger(__name__)

#: the values of predict's ``decode`` option
DECODES = ("cpu", "gpu", "auto")

#: PIL modes of a JPEG that nvjpeg decodes to the same colours as PIL's RGB conversion
_GPU_MODES = frozenset({"RGB", "L"})

#: EXIF orientation -> the transform ImageOps.exif_transpose applies (PIL's Transpose names)
ORIENTATIONS = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
                6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"}


def parse_decode(value: Any) -> str:
    """``decode`` as predict takes it: "cpu" (default: PIL, today's numbers), "gpu" (JPEG files
    with nvjpeg, everything else on the CPU) or "auto" (the GPU decode where it can run: CUDA
    device and a torchvision with nvjpeg; else the CPU)."""
    from ..options import check_choice
    return "cpu" if value is None else check_choice("decode", value, DECODES)


@dataclass
class JpegFile:
    """A JPEG file for the GPU decoder: its bytes, EXIF orientation (1-8) and decoded size
    (h, w) before orientation."""

    path: str
    data: np.ndarray
    orientation: int
    hw: tuple[int, int]


def probe(path: str | os.PathLike) -> JpegFile | None:
    """The file as a :class:`JpegFile` when the GPU decoder should take it, else None (the CPU
    decoder takes it: see the module docstring). Reads the whole file, decodes nothing."""
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError:
        return None   # the CPU decoder raises open()'s error, as today
    # A truncated JPEG has no end-of-image marker; PIL refuses it, nvjpeg might not.
    if data.size < 4 or data[0] != 0xFF or data[1] != 0xD8 or data[-2] != 0xFF or data[-1] != 0xD9:
        return None
    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:   # header only; bomb check included
            if im.format != "JPEG" or im.mode not in _GPU_MODES:
                return None
            if im.mode == "RGB" and im.info.get("adobe_transform") == 0:
                return None   # components stored as RGB, not YCbCr (Adobe APP14): left to libjpeg
            orientation = int(im.getexif().get(0x0112, 1) or 1)
            w, h = im.size
    except Exception:   # noqa: BLE001 - anything PIL does not like: the CPU decoder reports it
        return None
    return JpegFile(str(path), data, orientation if orientation in ORIENTATIONS else 1, (h, w))


def orient(hwc: torch.Tensor, orientation: int) -> torch.Tensor:
    """An HxWxC image as ``ImageOps.exif_transpose`` turns it for ``orientation`` (a view where
    possible; ``flip`` copies). 1 or unknown: unchanged."""
    if orientation == 2:     # FLIP_LEFT_RIGHT
        return hwc.flip(1)
    if orientation == 3:     # ROTATE_180
        return hwc.flip(0, 1)
    if orientation == 4:     # FLIP_TOP_BOTTOM
        return hwc.flip(0)
    if orientation == 5:     # TRANSPOSE: across the main diagonal
        return hwc.transpose(0, 1)
    if orientation == 6:     # ROTATE_270: PIL turns counter-clockwise, so 90 degrees clockwise
        return torch.rot90(hwc, -1, (0, 1))
    if orientation == 7:     # TRANSVERSE: across the anti-diagonal
        return hwc.flip(0, 1).transpose(0, 1)
    if orientation == 8:     # ROTATE_90: 90 degrees counter-clockwise
        return torch.rot90(hwc, 1, (0, 1))
    return hwc


def _decode(datas: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg
    with warnings.catch_warnings():   # torchvision 0.29 deprecates its image I/O in favour of torchcodec
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg([torch.from_numpy(d) for d in datas], mode=ImageReadMode.RGB, device=device)


def decode_files(files: list[JpegFile], device: torch.device) -> list[torch.Tensor | np.ndarray]:
    """Decode ``files`` on ``device`` in one batched call, each upright: an HxWx3 uint8 view of
    the decoded CHW tensor (allocated on the current stream, which waits for the decoder), or -
    for a file the GPU decoder refuses - the CPU decoder's HxWx3 numpy array (raising its
    ``ValueError`` naming the file when that fails too)."""
    if not files:
        return []
    try:
        chws: list[Any] = _decode([f.data for f in files], device)
    except RuntimeError:
        chws = []
        for f in files:   # find the file(s) at fault; the others keep the GPU decode
            try:
                chws.append(_decode([f.data], device)[0])
            except RuntimeError as exc:
                chws.append(_cpu_fallback(f, exc))
    out: list[torch.Tensor | np.ndarray] = []
    for f, chw in zip(files, chws):
        if isinstance(chw, np.ndarray):
            out.append(chw)
        else:
            out.append(orient(chw.permute(1, 2, 0), f.orientation))
    return out


def _cpu_fallback(f: JpegFile, exc: Exception) -> np.ndarray:
    from .sources import decode_image
    image = decode_image(f.path)   # raises today's error naming the file when PIL fails as well
    log.warning("the GPU JPEG decoder refused '%s' (%s); decoded on the CPU instead", f.path,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return image


_problems: dict[str, str | None] = {}
_problems_lock = threading.Lock()


def gpu_decode_problem(device: torch.device) -> str | None:
    """Why JPEG files cannot be decoded on ``device`` (None: they can). Tried once per device
    with a tiny JPEG: torchvision wheels without nvjpeg fail there."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"the model is on '{device}' (the GPU decoder needs a CUDA device)"
    key = str(device)
    with _problems_lock:
        if key not in _problems:
            buf = io.BytesIO()
            Image.new("RGB", (16, 16), (200, 100, 50)).save(buf, format="JPEG")
            try:
                _decode([np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()], device)
                _problems[key] = None
            except Exception as exc:   # noqa: BLE001 - any failure means: not available here
                _problems[key] = f"torchvision's nvjpeg decode failed: {type(exc).__name__}: {exc}"
        return _problems[key]


def is_jpeg_path(path: str | os.PathLike) -> bool:
    """Whether the file's suffix names a JPEG (predict probes only those for the GPU decoder)."""
    return Path(path).suffix.lower() in (".jpg", ".jpeg", ".jpe", ".jfif")
