"""Turn whatever the user hands to ``predict`` into a list of RGB images.

Every accepted input kind ends up as a :class:`SourceItem`: a name (the file path, or ``imageN`` for
in-memory inputs) and an HxWx3 ``uint8`` RGB image. Files, PIL images and numpy arrays become numpy
arrays; torch tensors stay torch tensors on their own device, so a GPU batch is never copied to the
host just to be copied back.

Accepted inputs:

* a ``str`` / :class:`pathlib.Path` naming an image file, a directory (its images, sorted by name,
  not recursive, hidden files skipped) or a glob pattern (``"imgs/*.jpg"``, ``**`` recurses; matches
  without an image extension are skipped);
* a :class:`PIL.Image.Image` of any mode (EXIF orientation applied, like a file). Files and PIL
  images of more than 8 bits are scaled to 8 bits by their range (16-bit: ``round(v / 257)``),
  not clipped; see :func:`pil_to_rgb` for every mode;
* a numpy array HxW, HxWx1, HxWx3 or HxWx4 of ``uint8``, or of finite floats in [0, 1] (converted
  with ``round(x * 255)``; 0..255 floats, NaN and infinities are refused). Numpy arrays are
  taken as BGR(A), OpenCV's order (``cv2.imread`` and video frames), as LibreYOLO and Ultralytics
  read them, unless ``bgr=False`` or ``color_format="rgb"`` says they are RGB(A)
  (:func:`parse_color`);
* a torch tensor CHW or BCHW, ``uint8`` or floating in [0, 1] (the same check as arrays, made on
  the tensor's device), with 1, 3 or 4 channels (a BCHW tensor gives B items). Tensors are always
  RGB(A);
* a list or tuple mixing any of the above (not nested).

Grayscale is replicated to three channels; a fourth (alpha) channel is dropped.

Unreadable files found in a directory or by a glob pattern: with ``strict=False`` (what predict
passes unless ``strict=True`` is asked) such a file is skipped with one warning naming it, and the
other images go on; a file named directly (a path, or a path in a list) always raises. A
directory or glob of which no image decodes raises all the same. :func:`stream_sources` decodes
lazily, a few files ahead in threads, for ``predict(stream=True)``.

Errors are raised before any file is decoded where possible, each naming the offending input:
``FileNotFoundError`` for a missing path, an empty directory or a glob without matches,
``ValueError`` for an undecodable file, an array/tensor of the wrong shape or dtype, float values
outside [0, 1], a tensor without data (the ``meta`` device) (and for an empty list), ``TypeError``
for anything else.
"""

from __future__ import annotations

import glob
import logging
import math
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

__all__ = ["IMAGE_EXTENSIONS", "SourceItem", "PendingItem", "Source", "SourceStream", "load_sources",
           "iter_sources", "stream_sources", "pending_sources", "decode_image", "pil_to_rgb"]

LOGGER = logging.getLogger(__name__)

#: How many files :func:`stream_sources` decodes ahead of the consumer (each in its own thread):
#: enough to keep the device fed, few enough that memory stays bounded whatever the folder's size.
STREAM_AHEAD = 4

#: File suffixes (lower case, with the dot) treated as images in directories and glob matches.
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
)

_GLOB_CHARS = frozenset("*?[")

#: One accepted input; ``load_sources`` also takes a list/tuple of these.
Source = str | os.PathLike | Image.Image | np.ndarray | torch.Tensor


@dataclass
class SourceItem:
    """One input image, ready for preprocessing.

    ``image`` is HxWx3 ``uint8`` RGB and C-contiguous: a numpy array for files, PIL images and numpy
    inputs, a torch tensor (on the input's device) for tensor inputs. It never shares memory with
    the caller's object, so later changes to that object cannot alter the image - unless it was
    loaded with ``borrow=True`` and ``borrowed`` is True: then :meth:`own` must be called before
    the caller's object may change (the predictor does so while the GPU works).
    """

    name: str
    image: np.ndarray | torch.Tensor
    borrowed: bool = False
    #: the borrowed image's channels are BGR, the caller's array as it was given (only with
    #: ``load_sources(..., keep_bgr=True)``): whoever uploads it reorders the channels on the
    #: device, and :meth:`own` makes the RGB copy
    bgr: bool = False
    #: for video frames: position in the source, seconds since its first frame, which source of a
    #: ``.streams`` list it came from, and that source's frame rate (None for images)
    frame_index: int | None = None
    timestamp: float | None = None
    stream: int | None = None
    fps: float | None = None

    def own(self) -> None:
        """Replace a borrowed image by a private copy (no-op otherwise), RGB: a BGR one's
        channels reordered on the way."""
        if self.borrowed:
            self.image = _pick_channels(self.image, (2, 1, 0)) if self.bgr else _parallel_copy(self.image)
            self.borrowed = self.bgr = False


def _parallel_copy(a: np.ndarray) -> np.ndarray:
    """A copy of a C-contiguous array made by torch's multi-threaded copy: on many cores a video
    frame is copied several times faster than by numpy's single thread, and the calling core's
    caches are left mostly alone."""
    out = np.empty_like(a)
    if a.flags.writeable and a.flags.c_contiguous and torch.get_num_threads() > 1:
        torch.from_numpy(out).copy_(torch.from_numpy(a))
    else:  # torch warns on read-only arrays; on one thread numpy's copy is as fast
        np.copyto(out, a)
    return out


def load_sources(source: Any, *, bgr: bool | None = None, borrow: bool = False, workers: int = 1,
                 strict: bool = True, keep_bgr: bool = False) -> list[SourceItem]:
    """Load ``source`` (see the module docstring for the accepted kinds) into a list of items.

    ``bgr``: the channel order of numpy arrays, BGR(A) (True, or None: the default) or RGB(A)
    (False); it has no effect on other kinds (PIL images and tensors are RGB).
    ``borrow=True`` lets a numpy input that needs no conversion (uint8, RGB, C-contiguous) be
    used in place instead of copied; such items say ``borrowed`` (see :meth:`SourceItem.own`).
    ``keep_bgr=True`` (with ``borrow``) lends a BGR uint8 HxWx3 C-contiguous array as it is too,
    marked ``bgr``: its reorder moves off the host's critical path (the predictor reorders the
    uploaded bytes on the GPU, where it costs microseconds, and ``own`` makes the host's RGB
    copy while the device works).
    ``workers`` > 1 decodes several files at once in threads (Pillow releases the GIL while it
    decodes): the same items in the same order, and the same error - the first failing file's
    in source order - as one at a time. ``strict=False`` skips an unreadable file found in a
    directory or by a glob with a warning naming it (see the module docstring).
    """
    loaders = _resolve(source, bgr)
    if workers <= 1 or sum(1 for _, load in loaders if hasattr(load, "path")) < 2:
        loaded = [_load(name, load, borrow, strict, keep_bgr) for name, load in loaders]
    else:
        with ThreadPoolExecutor(max_workers=min(int(workers), len(loaders)),
                                thread_name_prefix="libreyolo-decode") as ex:
            loaded = list(ex.map(lambda entry: _load(entry[0], entry[1], borrow, strict, keep_bgr), loaders))
    items = [it for it in loaded if it is not None]
    _check_any_left(loaders, len(items))
    return items


def iter_sources(source: Any, *, bgr: bool | None = None, borrow: bool = False, strict: bool = True,
                 workers: int = 1, ahead: int = 0) -> Iterator[SourceItem]:
    """Like :func:`load_sources`, but decode files lazily as the iterator advances (one at a time,
    or ``ahead`` files ahead in ``workers`` threads: see :func:`stream_sources`).

    Everything that can be checked without decoding (paths exist, directories hold images, globs
    match, arrays and tensors have a valid shape and dtype) is checked when this function is
    called, so a bad input fails before any work is done; only a corrupt file can fail later.
    """
    return iter(stream_sources(source, bgr=bgr, borrow=borrow, strict=strict, workers=workers, ahead=ahead))


def stream_sources(source: Any, *, bgr: bool | None = None, borrow: bool = False, strict: bool = True,
                   workers: int = 1, ahead: int = STREAM_AHEAD) -> SourceStream:
    """``source`` resolved and checked now (as :func:`load_sources` checks it), its items decoded
    as they are iterated: at most ``ahead`` files are decoded ahead of the consumer, in up to
    ``workers`` threads (``ahead=0``: each file when it is asked for). ``len()`` is the number of
    items resolved (skipped files included). In-memory inputs are converted when they are reached,
    on the consumer's thread. A failing file raises when it is reached, after the items before
    it; ``strict=False`` skips one found in a directory or by a glob, with a warning."""
    return SourceStream(_resolve(source, bgr), borrow=borrow, strict=strict, workers=workers, ahead=ahead)


class SourceStream:
    """The lazily decoded items of a source (:func:`stream_sources`): iterate once; ``len()`` the
    items resolved; :meth:`close` (also at the end of the iteration) stops the decode threads."""

    def __init__(self, loaders: list[tuple[str, _Loader]], *, borrow: bool, strict: bool, workers: int,
                 ahead: int):
        self.loaders = loaders
        self.borrow, self.strict = borrow, strict
        self.ahead = max(0, int(ahead))
        self.workers = max(1, min(int(workers), self.ahead or 1))
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self.loaders)

    def __iter__(self) -> Iterator[SourceItem]:
        return self._items()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _items(self) -> Iterator[SourceItem]:
        borrow, strict = self.borrow, self.strict
        files = sum(1 for _, load in self.loaders if hasattr(load, "path"))
        if self.ahead and files > 1:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="libreyolo-decode")
        pending: deque = deque()   # (name, loader, future or None) in source order
        entries = iter(self.loaders)
        in_flight = 0
        yielded = 0

        def refill() -> None:
            nonlocal in_flight
            while in_flight < max(1, self.ahead):
                entry = next(entries, None)
                if entry is None:
                    return
                name, load = entry
                fut = None
                if self._pool is not None and hasattr(load, "path"):
                    fut = self._pool.submit(_load, name, load, borrow, strict)
                    in_flight += 1
                pending.append((name, load, fut))   # without a future: loaded when reached

        try:
            refill()
            while pending:
                name, load, fut = pending.popleft()
                if fut is not None:
                    item = fut.result()
                    in_flight -= 1
                else:
                    item = _load(name, load, borrow, strict)
                refill()
                if item is not None:
                    yielded += 1
                    yield item
            _check_any_left(self.loaders, yielded)
        finally:
            for _, _, fut in pending:
                if fut is not None:
                    fut.cancel()
            self.close()


@dataclass
class PendingItem:
    """One input resolved but not loaded yet (:func:`pending_sources`): its name, the file's path
    for an image file (None for in-memory inputs) and :meth:`load`, which gives the
    :class:`SourceItem` that :func:`load_sources` would give (decoding a file on the CPU)."""

    name: str
    path: Path | None
    loader: _Loader

    def load(self, borrow: bool = False, strict: bool = True) -> SourceItem | None:
        """The item; None when ``strict=False`` skipped the file (see :func:`load_sources`)."""
        return _load(self.name, self.loader, borrow, strict)


def pending_sources(source: Any, *, bgr: bool | None = None) -> list[PendingItem]:
    """Resolve ``source`` like :func:`load_sources` - with the same checks and errors before
    anything is decoded - without loading any item: predict's GPU decode reads the files itself."""
    return [PendingItem(name, getattr(load, "path", None), load) for name, load in _resolve(source, bgr)]


def _load(name: str, load: _Loader, borrow: bool, strict: bool, keep_bgr: bool = False) -> SourceItem | None:
    """:func:`_item`, or None (with a warning naming the file) for an unreadable file that a
    directory or glob pattern found, unless ``strict``: one broken file among many does not stop
    the others. A file named directly always raises."""
    try:
        return _item(name, load, borrow, keep_bgr)
    except (ValueError, OSError) as e:
        found_in = getattr(load, "found_in", None)
        if strict or found_in is None:
            raise
        LOGGER.warning("skipping '%s' (found in '%s'): %s; strict=True stops at such a file instead",
                       name, found_in, e)
        return None


def _check_any_left(loaders: list[tuple[str, _Loader]], loaded: int) -> None:
    """Refuse a source of which every file was skipped: a folder of unreadable files is an error,
    not an empty result."""
    if loaded == 0 and loaders:
        where = sorted({str(getattr(load, "found_in", "")) for _, load in loaders} - {""})
        raise ValueError(f"none of the {len(loaders)} image file(s) in {', '.join(repr(w) for w in where)} "
                         "could be decoded (each is named in a warning above)")


def _item(name: str, load: _Loader, borrow: bool, keep_bgr: bool = False) -> SourceItem:
    raw_bgr = getattr(load, "raw_bgr", None)
    if raw_bgr is not None and borrow and keep_bgr:   # the caller's BGR array, reordered later
        return SourceItem(name, raw_bgr, borrowed=True, bgr=True)
    image = load()
    if getattr(load, "borrows", False):   # the loader handed back the caller's own array
        if borrow:
            return SourceItem(name, image, borrowed=True)
        image = image.copy()
    return SourceItem(name, image)


# --------------------------------------------------------------------------------------------------
# Resolution: input -> list of (name, loader) without decoding anything.

_Loader = Callable[[], "np.ndarray | torch.Tensor"]


def _resolve(source: Any, bgr: bool | None) -> list[tuple[str, _Loader]]:
    if isinstance(source, (list, tuple)):
        if len(source) == 0:
            raise ValueError("no images given: the source list is empty")
        entries: list[tuple[str | None, _Loader]] = []
        for i, item in enumerate(source):
            if isinstance(item, (list, tuple)):
                raise TypeError(
                    f"source[{i}] is a nested {type(item).__name__}; give one flat list of images"
                )
            entries.extend(_resolve_one(item, bgr, f"source[{i}]"))
    else:
        entries = _resolve_one(source, bgr, "source")
    # In-memory inputs are named by their position in the output, so result i is "image{i}".
    return [(name if name is not None else f"image{i}", load) for i, (name, load) in enumerate(entries)]


def _resolve_one(item: Any, bgr: bool | None, where: str) -> list[tuple[str | None, _Loader]]:
    if isinstance(item, (str, os.PathLike)):
        files = _expand_path(item)
        # files a directory or glob found (not named directly) may be skipped when unreadable
        found_in = None if len(files) == 1 and _names_file(item) else os.fspath(item)
        return [(str(p), _file_loader(p, found_in)) for p in files]
    if isinstance(item, Image.Image):
        return [(None, _pil_loader(item))]
    if isinstance(item, np.ndarray):
        return [(None, _numpy_loader(item, bgr, where))]
    if isinstance(item, torch.Tensor):
        return [(None, loader) for loader in _tensor_loaders(item, where)]
    raise TypeError(
        f"unsupported {where} of type {type(item).__module__}.{type(item).__qualname__}: expected a "
        "path, directory, glob pattern, PIL image, numpy array, torch tensor, or a list of these"
    )


def _names_file(item: str | os.PathLike) -> bool:
    """Whether a path names one file itself (not a directory, not a glob pattern)."""
    path = Path(os.fspath(item)).expanduser()
    return path.is_file()


def _is_image_file(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".") and p.is_file()


def _expand_path(item: str | os.PathLike) -> list[Path]:
    """Return the image files a path, directory or glob stands for (at least one)."""
    text = os.fspath(item)
    if isinstance(text, bytes):
        raise TypeError(f"bytes paths are not supported: {text!r}; decode it to str first")
    path = Path(text).expanduser()
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if _is_image_file(p)), key=lambda p: p.name)
        if not files:
            raise FileNotFoundError(
                f"no images in directory '{text}' (looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
            )
        return files
    if path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"'{text}' is neither a file nor a directory")
        return [path]
    if _GLOB_CHARS & set(text):
        matches = sorted(glob.glob(os.path.expanduser(text), recursive=True))
        files = [Path(m) for m in matches if _is_image_file(Path(m))]
        if not files:
            detail = (
                f"{len(matches)} match(es), none an image file" if matches else "no matches"
            )
            raise FileNotFoundError(f"glob pattern '{text}' found no images ({detail})")
        return files
    hint = (" (only rtsp, rtmp and http(s) URLs are read, as video streams; download other files first)"
            if "://" in text else "")
    raise FileNotFoundError(f"image file or directory not found: '{text}'{hint}")


# --------------------------------------------------------------------------------------------------
# Loaders.


def _file_loader(path: Path, found_in: str | None = None) -> _Loader:
    def load() -> np.ndarray:
        return decode_image(path)
    load.path = path  # type: ignore[attr-defined]  # for pending_sources
    if found_in is not None:
        load.found_in = found_in  # type: ignore[attr-defined]  # the directory or glob (see _load)
    return load


def decode_image(path: str | os.PathLike) -> np.ndarray:
    """Decode an image file to HxWx3 uint8 RGB, upright according to its EXIF orientation.

    The one decoder of predict and training (see :func:`pil_to_rgb` for how each pixel format
    becomes 8-bit RGB). Raises ``FileNotFoundError``/``PermissionError`` as ``open`` does, and
    ``ValueError`` naming the file for anything that does not decode (unknown format, truncated
    or corrupt data, decompression bomb, unsupported pixel format).
    """
    try:
        with Image.open(path) as im:
            im.load()  # PIL opens lazily; load() is where truncation and corruption surface
            # upright in place: this image is ours (pil_to_rgb copies a caller's image for it)
            ImageOps.exif_transpose(im, in_place=True)
            return _upright_to_rgb(im)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as e:  # UnidentifiedImageError, truncated data, decompression bombs, ...
        raise ValueError(f"cannot decode image '{path}': {e}") from e


def _pil_loader(image: Image.Image) -> _Loader:
    return lambda: pil_to_rgb(image)


#: Pillow's 16-bit greyscale modes (native, little- and big-endian storage).
_GREY16_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def pil_to_rgb(image: Image.Image) -> np.ndarray:
    """A PIL image of any mode as a new HxWx3 uint8 RGB array, upright by its EXIF orientation.

    Pillow's own ``convert("RGB")`` clips every value above 255, so a 16-bit image of 100 * 257
    comes out white; here every mode Pillow has is scaled to 8 bits by its range:

    * 16-bit grey (``I;16``, ``I;16L``, ``I;16B``, ``I;16N``): ``round(v / 257)``, i.e.
      ``(v + 128) // 257``. 257 is 65535 / 255, so 0 -> 0, 65535 -> 255 and ``k * 257`` -> ``k``
      exactly (the inverse of the usual 8 -> 16 bit widening ``k * 257``); each value goes to the
      nearest 8-bit level, where ``v >> 8`` would truncate (a bias of up to one level downward).
      16-bit RGB(A) files are reduced to 8 bits per channel by Pillow itself when it opens them.
    * 32-bit int (``I``): Pillow's mode for 16-bit data of some formats and for 32-bit integer
      TIFFs. Values within [0, 65535] are scaled as 16-bit; an image with values outside that
      range is stretched linearly from its own minimum..maximum to 0..255.
    * 32-bit float (``F``): values within [0, 1] are scaled by 255 (the convention of float
      arrays); any other range is stretched from its minimum..maximum to 0..255. NaN and
      infinities become 0.
    * palette (``P``, ``PA``) and alpha modes (``LA``, ``La``, ``RGBA``, ``RGBa``): the colour of
      each pixel, alpha dropped (as for 4-channel arrays and tensors); premultiplied modes are
      un-premultiplied first. ``LAB`` goes through an ICC Lab -> sRGB transform.
    * ``1``, ``L``, ``CMYK``, ``YCbCr``, ``HSV``, ``RGBX``: Pillow's conversion to RGB.

    Raises ``ValueError`` for a mode Pillow cannot convert to RGB.
    """
    upright = ImageOps.exif_transpose(image)
    if upright is None:  # older Pillow returns None when in_place is set; be defensive
        upright = image
    return _upright_to_rgb(upright)


def _upright_to_rgb(upright: Image.Image) -> np.ndarray:
    """:func:`pil_to_rgb` of an image already upright (its EXIF orientation applied)."""
    mode = upright.mode
    if mode == "RGB":
        out = np.array(upright, dtype=np.uint8)  # np.array copies: never shares the PIL buffer
    elif mode in _GREY16_MODES:
        out = _grey_to_rgb(_scale_16bit(np.asarray(upright)))
    elif mode == "I":
        a = np.asarray(upright, dtype=np.int64)
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        out = _grey_to_rgb(_scale_16bit(a) if 0 <= lo and hi <= 65535 else _stretch(a, lo, hi))
    elif mode == "F":
        a = np.asarray(upright, dtype=np.float64)
        finite = np.isfinite(a)
        vals = a[finite]
        lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 0.0)
        a = np.where(finite, a, lo)
        g = np.rint(a * 255.0).astype(np.uint8) if 0.0 <= lo and hi <= 1.0 else _stretch(a, lo, hi)
        out = _grey_to_rgb(np.where(finite, g, 0).astype(np.uint8))
    else:
        out = _convert_8bit(upright)
    return np.ascontiguousarray(out)


def _scale_16bit(a: np.ndarray) -> np.ndarray:
    """16-bit values (any integer dtype, within [0, 65535]) to the nearest 8-bit level."""
    return ((a.astype(np.uint32) + 128) // 257).astype(np.uint8)


def _stretch(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Values stretched linearly from ``lo``..``hi`` (their minimum and maximum) to uint8
    0..255; a constant image (``hi == lo``) gives 0."""
    if hi <= lo:
        return np.zeros(a.shape, np.uint8)
    scaled = (a.astype(np.float64) - lo) * (255.0 / (float(hi) - float(lo)))
    return np.rint(scaled).clip(0, 255).astype(np.uint8)


def _grey_to_rgb(g: np.ndarray) -> np.ndarray:
    return np.repeat(g[:, :, None], 3, axis=2)


def _convert_8bit(image: Image.Image) -> np.ndarray:
    """An 8-bit mode (anything but RGB and the 16/32-bit ones) as an HxWx3 uint8 array."""
    mode = image.mode
    try:
        if mode in ("P", "PA"):
            # through RGBA: the palette colours with any transparency resolved, alpha then dropped
            # (a direct RGB conversion warns about transparency given as bytes)
            return np.array(image.convert("RGBA"), dtype=np.uint8)[:, :, :3]
        if mode == "La":
            image = image.convert("LA")  # un-premultiply; Pillow has no La -> RGB conversion
        elif mode == "LAB":
            from PIL import ImageCms

            lab_to_srgb = ImageCms.buildTransform(ImageCms.createProfile("LAB"),
                                                  ImageCms.createProfile("sRGB"), "LAB", "RGB")
            return np.array(ImageCms.applyTransform(image, lab_to_srgb), dtype=np.uint8)
        return np.array(image.convert("RGB"), dtype=np.uint8)
    except (ValueError, OSError, ImportError) as e:
        raise ValueError(f"cannot convert a PIL image of mode {mode!r} to RGB: {e}") from e


def _describe(x: np.ndarray | torch.Tensor, where: str) -> str:
    kind = "numpy array" if isinstance(x, np.ndarray) else "torch tensor"
    return f"{where} ({kind} with shape {tuple(x.shape)} and dtype {x.dtype})"


def _numpy_loader(arr: np.ndarray, bgr: bool | None, where: str) -> _Loader:
    bgr = NUMPY_BGR if bgr is None else bool(bgr)
    expected = "expected HxW, HxWx1, HxWx3 or HxWx4 (channels last)"
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)):
        hint = ""
        if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[2] not in (1, 3, 4):
            hint = "; it looks channels-first, use arr.transpose(1, 2, 0)"
        raise ValueError(f"bad shape for {_describe(arr, where)}: {expected}{hint}")
    if arr.size == 0:
        raise ValueError(f"empty image: {_describe(arr, where)} has zero size")
    if arr.dtype == np.uint8:
        pass
    elif arr.dtype.kind == "f":
        _check_float_range(arr, where)
    else:
        hint = ("; for 16-bit data pass (arr / 65535) or ((arr.astype(np.uint32) + 128) // 257)"
                ".astype(np.uint8)" if arr.dtype == np.uint16 else "")
        raise ValueError(
            f"bad dtype for {_describe(arr, where)}: expected uint8, or float in [0, 1]{hint}"
        )
    plain = arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3 and arr.flags.c_contiguous
    if plain and not bgr:
        def as_is() -> np.ndarray:  # nothing to convert: the caller's array itself (see _item)
            return arr
        as_is.borrows = True  # type: ignore[attr-defined]
        return as_is

    def convert() -> np.ndarray:
        return _numpy_to_rgb(arr, bgr)
    if plain:   # BGR: lent as it is where keep_bgr asks (see _item)
        convert.raw_bgr = arr  # type: ignore[attr-defined]
    return convert


#: numpy arrays' channel order when the caller says nothing: BGR, OpenCV's (and the ecosystem's)
NUMPY_BGR = True
COLOR_FORMATS = ("auto", "bgr", "rgb")


def parse_color(bgr: Any = None, color_format: Any = None) -> bool | None:
    """predict's ``bgr`` / ``color_format`` options -> the ``bgr`` of :func:`load_sources` (None:
    the default, BGR). ``color_format``: "auto" (the default), "bgr" or "rgb"; both given must
    agree."""
    if bgr is not None and not isinstance(bgr, (bool, np.bool_)):
        raise ValueError(f"bgr must be True or False, got {bgr!r}")
    if color_format is None or color_format == "auto":
        return None if bgr is None else bool(bgr)
    if not isinstance(color_format, str) or color_format.lower() not in COLOR_FORMATS:
        raise ValueError(f"color_format must be one of {', '.join(COLOR_FORMATS)}, got {color_format!r}")
    said = color_format.lower() == "bgr"
    if bgr is not None and bool(bgr) != said:
        raise ValueError(f"bgr={bgr!r} and color_format={color_format!r} contradict each other; pass one of them")
    return said


def _numpy_to_rgb(arr: np.ndarray, bgr: bool) -> np.ndarray:
    if arr.dtype != np.uint8:
        arr = np.rint(np.clip(arr.astype(np.float64) * 255.0, 0.0, 255.0)).astype(np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    c = arr.shape[2]
    if c == 1:
        return np.array(np.repeat(arr, 3, axis=2), dtype=np.uint8, order="C", copy=True)
    if c == 3 and not bgr:
        # np.array(copy=True) so the item owns its memory even when no conversion was needed.
        return np.array(arr, dtype=np.uint8, order="C", copy=True)
    return _pick_channels(arr, (2, 1, 0) if bgr else (0, 1, 2))


def _pick_channels(arr: np.ndarray, order: tuple[int, int, int]) -> np.ndarray:
    """A new C-contiguous HxWx3 uint8 array whose channel i is ``arr``'s channel ``order[i]``:
    the same bytes as ``np.array(arr[:, :, order], order="C")``. OpenCV's ``cvtColor`` where it is
    installed (anyone handing us BGR arrays most likely has it: 0.23 ms for a 1280x720 frame on one
    core, as fast as a plain copy), else numpy one channel plane at a time (1.3 ms; numpy copies a
    reversed or gapped last axis of three elements element by element, slower still)."""
    code = _cv2_code(arr.shape[2], order)
    if code is not None:
        return _CV2.cvtColor(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr), code)
    out = np.empty(arr.shape[:2] + (3,), dtype=np.uint8)
    for i, c in enumerate(order):
        out[:, :, i] = arr[:, :, c]
    return out


_CV2: Any = None    # the cv2 module once imported; False: not installed


def _cv2_code(channels: int, order: tuple[int, int, int]) -> int | None:
    """OpenCV's conversion code picking ``order`` from ``channels`` uint8 channels, or None
    (OpenCV absent, or no such conversion)."""
    global _CV2
    if _CV2 is None:
        try:
            import cv2
            _CV2 = cv2
        except ImportError:
            _CV2 = False
    if _CV2 is False:
        return None
    codes = {(3, (2, 1, 0)): "COLOR_BGR2RGB", (4, (2, 1, 0)): "COLOR_BGRA2RGB", (4, (0, 1, 2)): "COLOR_RGBA2RGB"}
    name = codes.get((channels, tuple(order)))
    return None if name is None else getattr(_CV2, name)


#: Slack on the [0, 1] range of float images, for rounding error (0..255 data is far outside).
FLOAT_RANGE_TOLERANCE = 1e-3


def _check_float_range(x: np.ndarray | torch.Tensor, where: str) -> None:
    """Refuse a float array/tensor with NaN, infinities or values outside [0, 1] (+- tolerance).

    The same rule for numpy and torch. A tensor is reduced on its own device; reading the two
    numbers back synchronises once, which only float inputs pay (uint8 never comes here).
    """
    if isinstance(x, np.ndarray):
        lo, hi = float(np.min(x)), float(np.max(x))  # NaN propagates through both
    else:
        with torch.no_grad():
            lo_t, hi_t = torch.aminmax(x.detach())
        lo, hi = float(lo_t), float(hi_t)
    ok = math.isfinite(lo) and math.isfinite(hi)
    if ok and -FLOAT_RANGE_TOLERANCE <= lo and hi <= 1 + FLOAT_RANGE_TOLERANCE:
        return
    fix = ("arr / 255, or pass uint8: arr.astype(np.uint8)" if isinstance(x, np.ndarray)
           else "t / 255, or pass uint8: t.to(torch.uint8)")
    what = "hold NaN or infinite values" if not ok else f"span [{lo:g}, {hi:g}]"
    raise ValueError(
        f"float values of {_describe(x, where)} {what}: float images must be finite and lie in "
        f"[0, 1]; for 0..255 data divide by 255 ({fix})"
    )


def _tensor_loaders(t: torch.Tensor, where: str) -> list[_Loader]:
    if t.is_meta:   # no data to read: torch itself fails later ("Cannot copy out of meta tensor")
        raise ValueError(f"{where} (torch tensor with shape {tuple(t.shape)} and dtype {t.dtype}) is on the "
                         f"'{t.device}' device: it has a shape but no values to predict on; pass a tensor holding "
                         "the image, on the CPU or a GPU")
    expected = "expected CHW or BCHW with 1, 3 or 4 channels"
    if t.ndim not in (3, 4) or t.shape[-3] not in (1, 3, 4):
        hint = ""
        if t.ndim in (3, 4) and t.shape[-1] in (1, 3, 4):
            hint = "; it looks channels-last, use t.permute(2, 0, 1) (or (0, 3, 1, 2) for a batch)"
        raise ValueError(f"bad shape for {_describe(t, where)}: {expected}{hint}")
    if t.numel() == 0:
        raise ValueError(f"empty image: {_describe(t, where)} has zero size")
    if t.dtype != torch.uint8 and not t.dtype.is_floating_point:
        raise ValueError(
            f"bad dtype for {_describe(t, where)}: expected uint8, or floating point in [0, 1]"
        )
    if t.dtype.is_floating_point:
        _check_float_range(t, where)
    if t.ndim == 3:
        return [lambda: _tensor_to_rgb(t)]
    return [(lambda i=i: _tensor_to_rgb(t[i])) for i in range(t.shape[0])]


def _tensor_to_rgb(chw: torch.Tensor) -> torch.Tensor:
    """CHW (uint8 or float in [0, 1]) -> HWC uint8 RGB on the same device, owning its memory."""
    with torch.no_grad():
        x = chw.detach()
        if x.dtype != torch.uint8:
            if x.dtype in (torch.float16, torch.bfloat16):
                x = x.float()  # 255 * x in half precision cannot hold every integer step exactly
            x = (x.clamp(0, 1) * 255).round().to(torch.uint8)
        x = x[:3] if x.shape[0] == 4 else x
        hwc = x.permute(1, 2, 0)
        if hwc.shape[2] == 1:
            hwc = hwc.expand(-1, -1, 3)
        out = hwc.contiguous()
        if out.data_ptr() == chw.data_ptr():  # channels-last uint8 input: contiguous() was a view
            out = out.clone()
        return out


def is_single_image(source: Any) -> bool:
    """Whether ``source`` is one image, for which ``model(source)`` returns one Results (a list,
    a directory, a glob pattern, a video source, a 4-D batch array or tensor give a list): a PIL
    image, a 2-D or 3-D array or tensor, or a path naming one file that is not a video or a list
    of streams. ``None`` (a promptable model's current image) is one image too."""
    if source is None or isinstance(source, Image.Image):
        return True
    if isinstance(source, (np.ndarray, torch.Tensor)):
        return source.ndim in (2, 3)
    if isinstance(source, (str, os.PathLike)) and not isinstance(source, bool):
        from .video import is_video_source
        return not is_video_source(source) and _names_file(source)
    return False


def one_or_all(source: Any, results: Any) -> Any:
    """What ``model(source)`` returns from the predictor's ``results``: the one Results of a single
    image (:func:`is_single_image`), else ``results`` as they are (a list, or a generator)."""
    if isinstance(results, list) and len(results) == 1 and is_single_image(source):
        return results[0]
    return results
