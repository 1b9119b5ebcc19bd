"""Turn whatever the user hands to ``predict`` into a list of RGB images.

Every accepted input kind ends up as a :class:`SourceItem`: a name (the file path, or ``imageN`` for
in-memory inputs) and an HxWx3 ``uint8`` RGB image. Files, PIL images and numpy arrays become numpy
arrays; torch tensors stay torch tensors on their own device, so a GPU batch is never copied to the
host just to be copied back.

Accepted inputs:

* a ``str`` / :class:`pathlib.Path` naming an image file, a directory (its images, sorted by name,
  not recursive, hidden files skipped) or a glob pattern (``"imgs/*.jpg"``, ``**`` recurses; matches
  without an image extension are skipped);
* a :class:`PIL.Image.Image` (EXIF orientation applied, like a file);
* a numpy array HxW, HxWx1, HxWx3 or HxWx4 of ``uint8``, or of floats in [0, 1] (converted with
  ``round(x * 255)``). Numpy arrays are taken as RGB(A) unless ``bgr=True``: pass that for images from
  OpenCV (``cv2.imread`` returns BGR);
* a torch tensor CHW or BCHW, ``uint8`` or floating in [0, 1], with 1, 3 or 4 channels (a BCHW tensor
  gives B items). Tensors are always RGB(A);
* a list or tuple mixing any of the above (not nested).

Grayscale is replicated to three channels; a fourth (alpha) channel is dropped.

Errors are raised before any file is decoded where possible, each naming the offending input:
``FileNotFoundError`` for a missing path, an empty directory or a glob without matches,
``ValueError`` for an undecodable file or an array/tensor of the wrong shape or dtype (and for an
empty list), ``TypeError`` for anything else.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Union

import numpy as np
import torch
from PIL import Image, ImageOps

__all__ = ["IMAGE_EXTENSIONS", "SourceItem", "Source", "load_sources", "iter_sources"]

#: File suffixes (lower case, with the dot) treated as images in directories and glob matches.
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
)

_GLOB_CHARS = frozenset("*?[")

#: One accepted input; ``load_sources`` also takes a list/tuple of these.
Source = Union[str, os.PathLike, Image.Image, np.ndarray, torch.Tensor]


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

    def own(self) -> None:
        """Replace a borrowed image by a private copy (no-op otherwise)."""
        if self.borrowed:
            self.image = _parallel_copy(self.image)
            self.borrowed = False


def _parallel_copy(a: np.ndarray) -> np.ndarray:
    """A copy of a C-contiguous array made by torch's multi-threaded copy: a 1280x720 frame in
    ~20 us on 16 threads where numpy's single thread takes ~250 us, and the calling core's caches
    are left mostly alone (docs/benchmarks.md, session 5)."""
    out = np.empty_like(a)
    if a.flags.writeable and a.flags.c_contiguous and torch.get_num_threads() > 1:
        torch.from_numpy(out).copy_(torch.from_numpy(a))
    else:  # torch warns on read-only arrays; on one thread numpy's copy is as fast
        np.copyto(out, a)
    return out


def load_sources(source: Any, *, bgr: bool = False, borrow: bool = False) -> list[SourceItem]:
    """Load ``source`` (see the module docstring for the accepted kinds) into a list of items.

    ``bgr=True`` says numpy arrays are in OpenCV's BGR(A) order; it has no effect on other kinds.
    ``borrow=True`` lets a numpy input that needs no conversion (uint8, RGB, C-contiguous) be
    used in place instead of copied; such items say ``borrowed`` (see :meth:`SourceItem.own`).
    """
    return list(iter_sources(source, bgr=bgr, borrow=borrow))


def iter_sources(source: Any, *, bgr: bool = False, borrow: bool = False) -> Iterator[SourceItem]:
    """Like :func:`load_sources`, but decode files one at a time as the iterator advances.

    Everything that can be checked without decoding (paths exist, directories hold images, globs
    match, arrays and tensors have a valid shape and dtype) is checked when this function is
    called, so a bad input fails before any work is done; only a corrupt file can fail later.
    """
    loaders = _resolve(source, bgr)
    return (_item(name, load, borrow) for name, load in loaders)


def _item(name: str, load: "_Loader", borrow: bool) -> SourceItem:
    image = load()
    if getattr(load, "borrows", False):   # the loader handed back the caller's own array
        if borrow:
            return SourceItem(name, image, borrowed=True)
        image = image.copy()
    return SourceItem(name, image)


# --------------------------------------------------------------------------------------------------
# Resolution: input -> list of (name, loader) without decoding anything.

_Loader = Callable[[], "np.ndarray | torch.Tensor"]


def _resolve(source: Any, bgr: bool) -> list[tuple[str, _Loader]]:
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


def _resolve_one(item: Any, bgr: bool, where: str) -> list[tuple[str | None, _Loader]]:
    if isinstance(item, (str, os.PathLike)):
        return [(str(p), _file_loader(p)) for p in _expand_path(item)]
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
    hint = " (URLs are not supported; download the file first)" if "://" in text else ""
    raise FileNotFoundError(f"image file or directory not found: '{text}'{hint}")


# --------------------------------------------------------------------------------------------------
# Loaders.


def _file_loader(path: Path) -> _Loader:
    return lambda: _decode_file(path)


def _decode_file(path: Path) -> np.ndarray:
    """Decode an image file to HxWx3 uint8 RGB, upright according to its EXIF orientation."""
    try:
        with Image.open(path) as im:
            im.load()  # PIL opens lazily; load() is where truncation and corruption surface
            return _pil_to_rgb(im)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as e:  # UnidentifiedImageError, truncated data, decompression bombs, ...
        raise ValueError(f"cannot decode image '{path}': {e}") from e


def _pil_loader(image: Image.Image) -> _Loader:
    return lambda: _pil_to_rgb(image)


def _pil_to_rgb(image: Image.Image) -> np.ndarray:
    # Applied to PIL inputs as well as files so model("a.jpg") and model(Image.open("a.jpg")) agree.
    upright = ImageOps.exif_transpose(image)
    if upright is None:  # older Pillow returns None when in_place is set; be defensive
        upright = image
    rgb = upright if upright.mode == "RGB" else upright.convert("RGB")
    out = np.array(rgb, dtype=np.uint8)  # np.array copies: never shares the PIL buffer
    return np.ascontiguousarray(out)


def _describe(x: np.ndarray | torch.Tensor, where: str) -> str:
    kind = "numpy array" if isinstance(x, np.ndarray) else "torch tensor"
    return f"{where} ({kind} with shape {tuple(x.shape)} and dtype {x.dtype})"


def _numpy_loader(arr: np.ndarray, bgr: bool, where: str) -> _Loader:
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
        lo, hi = float(np.min(arr)), float(np.max(arr))
        # A little slack for rounding error; anything further out is a real mistake (often 0..255).
        if not (np.isfinite(lo) and np.isfinite(hi)) or lo < -1e-3 or hi > 1 + 1e-3:
            raise ValueError(
                f"float values of {_describe(arr, where)} span [{lo:g}, {hi:g}]: float images must "
                "lie in [0, 1] (for 0..255 data use arr.astype(np.uint8))"
            )
    else:
        raise ValueError(
            f"bad dtype for {_describe(arr, where)}: expected uint8, or float in [0, 1]"
        )
    if arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3 and not bgr and arr.flags.c_contiguous:
        def as_is() -> np.ndarray:  # nothing to convert: the caller's array itself (see _item)
            return arr
        as_is.borrows = True  # type: ignore[attr-defined]
        return as_is
    return lambda: _numpy_to_rgb(arr, bgr)


def _numpy_to_rgb(arr: np.ndarray, bgr: bool) -> np.ndarray:
    if arr.dtype != np.uint8:
        arr = np.rint(np.clip(arr.astype(np.float64) * 255.0, 0.0, 255.0)).astype(np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    c = arr.shape[2]
    if c == 1:
        out = np.repeat(arr, 3, axis=2)
    else:
        out = arr[:, :, 2::-1] if bgr else arr[:, :, :3]
    # np.array(copy=True) so the item owns its memory even when no conversion was needed.
    return np.array(out, dtype=np.uint8, order="C", copy=True)


def _tensor_loaders(t: torch.Tensor, where: str) -> list[_Loader]:
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
