"""Training/validation dataset for detectors: letterbox, mosaic, affine, flip, HSV; padded collate.

:class:`DetectionDataset` turns a list of :class:`~libreyolo.data.datasets.Sample` into
``(image uint8 (3, S, S) RGB, targets float32 (n, 5) [cls, x1, y1, x2, y2] in pixels)``.

* ``augment=False`` letterboxes exactly like predict (:func:`libreyolo.ops.letterbox.letterbox`
  with the family's ``resize`` mode: "topleft" - scaled to fit, top-left, grey 114, bilinear -,
  "center", or "stretch" to the square as the DETRs and PicoDet do), so validation boxes and
  predictions live in the same coordinates and the network sees what predict feeds it.
* ``augment=True``: with probability ``mosaic`` four images (this one and three random ones) are
  tiled around a random centre of a 2S x 2S canvas; then one random affine (rotation within
  ``degrees``, scale in ``1 +- scale``, translation up to ``translate * S``) maps the canvas to the
  S x S output in a single resampling; then HSV-style colour jitter (one 3x3 colour matrix) and
  a horizontal flip. Boxes follow every step, are clipped to the image and dropped when they keep
  less than 20% of their area or become narrower than 2 pixels.
* ``policy="detr"``: a sample that is not a mosaic goes through the RT-DETR / D-FINE recipe
  instead of the random affine and HSV jitter (torchvision.transforms.v2): photometric distortion
  (p 0.5), zoom-out onto a black canvas (p 0.5, up to 4x), a random IoU crop (p 0.8), horizontal
  flip, then the dataset's resize (predict's own). Boxes left under 1 pixel are dropped by
  ``SanitizeBoundingBoxes``. :meth:`close_mosaic` leaves only the flip, as those recipes' final
  epochs do.
* with probability ``mixup`` (off by default) a second augmented sample is blended in (ratio
  uniform in [0.45, 0.55]) and both label sets are kept: detection MixUp as YOLOX, YOLOv5 and
  the DEIM line train with (YOLOX blends exactly 0.5, YOLOv5 draws Beta(32, 32); all near one
  half). :meth:`close_mosaic` turns it off together with mosaic, as those recipes do.
* ``dense_mosaic=True`` (off by default) makes each mosaic DEIM's "Dense O2O" stitch: the four
  tiles meet at the canvas centre and the whole 2S canvas is shrunk to S (the affine's zoom is
  halved for mosaic samples), so an image carries the targets of all four at about half size and
  one-to-one matching gets about four times the positives. Non-mosaic samples are unchanged.

* ``gpu_augment=True`` (the YOLO recipe only): no augmentation here - each sample is the
  letterboxed image, its targets and its letterbox geometry, and
  :class:`~libreyolo.data.gpu_augment.DeviceAugment` runs mosaic, affine, HSV, flip and MixUp on
  the whole batch on the training device (the workers only decode, or read the cache).

All randomness comes from torch's global generator, so a run is reproducible under
``torch.manual_seed`` (and per DataLoader worker, whose torch seed the DataLoader sets).

:func:`collate_detections` pads the targets of a batch to a row count rounded up to a multiple of
``bucket``, so the loss sees a handful of fixed shapes that repeat: that is what makes the training
step capturable in a CUDA graph.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..ops.letterbox import MODES as LETTERBOX_MODES
from ..ops.letterbox import PAD_VALUE, LetterboxParams, letterbox_params
from .datasets import Sample
from .sources import decode_image

__all__ = ["DetectionDataset", "collate_detections", "max_targets_bucket",
           "MIN_BOX_SIDE", "MIN_AREA_KEPT"]

#: ``policy``: "yolo" (mosaic, random affine, HSV, flip) or "detr" (see the module docstring)
POLICIES = ("yolo", "detr")


def _detr_transforms(fliplr: float):
    """The DETR recipe's torchvision transforms, built once per dataset: (until close_mosaic, after
    it: the flip alone, or None when there is nothing to do)."""
    # torchvision is imported by the DETR recipe alone: its import pulls in torch._dynamo, seconds
    # of a training process's start (and of each loader worker's, were it imported there)
    from torchvision.transforms import v2
    flip = [v2.RandomHorizontalFlip(p=fliplr)] if fliplr > 0 else []
    strong = v2.Compose([v2.RandomPhotometricDistort(p=0.5), v2.RandomZoomOut(fill=0, p=0.5),
                         v2.RandomApply([v2.RandomIoUCrop()], p=0.8), v2.SanitizeBoundingBoxes(min_size=1), *flip])
    return strong, (v2.Compose(flip) if flip else None)


LOGGER = logging.getLogger(__name__)

#: Boxes narrower or shorter than this many pixels after augmentation are dropped.
MIN_BOX_SIDE = 2.0
#: Boxes keeping less than this fraction of their (scaled) area after cropping are dropped.
MIN_AREA_KEPT = 0.2


#: cache="auto" keeps the letterboxed images in RAM when they need at most this share of the
#: available memory ...
AUTO_CACHE_FRACTION = 0.25
#: ... and at most this many bytes (4 GiB: ~3,400 images at 640 px, ~14,000 at 320)
AUTO_CACHE_MAX_BYTES = 4 << 30


class DetectionDataset(Dataset):
    """Images and pixel-space targets for detector training (``augment=True``) or validation.

    ``mosaic`` is kept in shared memory, so :meth:`close_mosaic` reaches DataLoader workers that
    are already running (``persistent_workers=True``); batches they had prefetched keep mosaic.
    """

    def __init__(
        self,
        samples: Sequence[Sample],
        imgsz: int,
        augment: bool = False,
        *,
        mosaic: float = 1.0,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale: float = 0.5,
        fliplr: float = 0.5,
        hsv_h: float = 0.015,
        hsv_s: float = 0.7,
        hsv_v: float = 0.4,
        dense_mosaic: bool = False,
        mixup: float = 0.0,
        resize: str = "topleft",
        policy: str = "yolo",
        gpu_augment: bool = False,
        antialias: bool = False,
    ) -> None:
        if imgsz < 1:
            raise ValueError(f"imgsz must be positive, got {imgsz}")
        if resize not in LETTERBOX_MODES:
            raise ValueError(f"resize must be one of {LETTERBOX_MODES}, got {resize!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if gpu_augment and (not augment or policy != "yolo"):
            raise ValueError("gpu_augment=True defers the YOLO recipe (augment=True, policy='yolo') to the device; "
                             f"got augment={augment}, policy={policy!r}")
        if not 0.0 <= scale < 1.0:
            raise ValueError(f"scale must be in [0, 1) (zoom range 1 +- scale), got {scale}")
        for name, v in (("mosaic", mosaic), ("fliplr", fliplr), ("mixup", mixup)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} is a probability in [0, 1], got {v}")
        for name, v in (("degrees", degrees), ("translate", translate), ("hsv_h", hsv_h),
                        ("hsv_s", hsv_s), ("hsv_v", hsv_v)):
            if v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        self.samples = list(samples)
        self.imgsz = int(imgsz)
        self.augment = bool(augment)
        self._mosaic = torch.tensor([float(mosaic)], dtype=torch.float64).share_memory_()
        self._mixup = torch.tensor([float(mixup)], dtype=torch.float64).share_memory_()
        self.degrees = float(degrees)
        self.translate = float(translate)
        self.scale = float(scale)
        self.fliplr = float(fliplr)
        self.hsv_h = float(hsv_h)
        self.hsv_s = float(hsv_s)
        self.hsv_v = float(hsv_v)
        self.dense_mosaic = bool(dense_mosaic)
        self.resize = resize
        self.antialias = bool(antialias)   # predict's resampling (``Preprocess.antialias``)
        self.policy = policy
        self.gpu_augment = bool(gpu_augment)
        self._strong = torch.ones(1, dtype=torch.float64).share_memory_()  # the DETR recipe's zoom/crop/colour
        # 1 where a sample's image failed to decode during this run (shared with the workers, so
        # each bad file is warned about once and not retried)
        self._undecodable = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()
        self._detr_ops = _detr_transforms(self.fliplr) if policy == "detr" else None
        self._cache: list | None = None   # cache_images(): per sample (image or .npy path, params)

    # ---- public ---------------------------------------------------------------------------------

    @property
    def mosaic(self) -> float:
        """Probability of a 4-image mosaic (only with ``augment=True``)."""
        return float(self._mosaic[0])

    @property
    def mixup(self) -> float:
        """Probability of blending in a second augmented sample (only with ``augment=True``)."""
        return float(self._mixup[0])

    def close_mosaic(self) -> None:
        """Turn mosaic, MixUp and the DETR recipe's zoom/crop/colour off, for the final epochs
        (also in running DataLoader workers)."""
        self._mosaic.fill_(0.0)
        self._mixup.fill_(0.0)
        self._strong.fill_(0.0)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        """(image uint8 (3, S, S) RGB, targets float32 (n, 5) [cls, x1, y1, x2, y2] pixels); with
        ``gpu_augment`` the image letterboxed, not augmented, and a third item, its geometry
        (int32 (4,) [new_h, new_w, pad_y, pad_x]), for :class:`~libreyolo.data.gpu_augment.
        DeviceAugment`, which augments the batch on the device."""
        if self.gpu_augment:
            image, p, targets = self.load_letterboxed(index)
            return image, targets, torch.tensor([p.new_h, p.new_w, p.pad_y, p.pad_x], dtype=torch.int32)
        if not self.augment:
            image, _, targets = self.load_letterboxed(index)
            return image, targets
        image, targets = self._augmented(index)
        if self.mixup > 0 and float(torch.rand(())) < self.mixup:
            other, more = self._augmented(int(torch.randint(len(self.samples), ())))
            r = 0.45 + 0.1 * float(torch.rand(()))
            image = (image.float() * r + other.float() * (1.0 - r)).round_().clamp_(0, 255).to(torch.uint8)
            targets = torch.cat((targets, more))
        return image.contiguous(), targets

    def _augmented(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``index`` through mosaic (maybe), the random affine, colour jitter and flip
        (or, not a mosaic under ``policy="detr"``, the DETR recipe)."""
        s = self.imgsz
        if float(torch.rand(())) < self.mosaic:
            canvas, targets, ref_area = self._load_mosaic(index)
            center = (float(s), float(s))
            dense = self.dense_mosaic
        elif self.policy == "detr":
            return self._detr_recipe(index)
        else:
            region, p, targets = self._tile(index)
            canvas = _Canvas(s, [(region, p.pad_y, p.pad_x)])   # the letterboxed image, never built
            targets = torch.from_numpy(targets)
            ref_area = _areas(targets)
            center = (s / 2.0, s / 2.0)
            dense = False
        image, targets = self._transform(canvas, targets, ref_area, center, 0.5 if dense else 1.0)   # dense: 2S into S
        if self.fliplr > 0 and float(torch.rand(())) < self.fliplr:
            image = image.flip(-1)   # what torchvision's horizontal_flip does to a plain tensor
            if len(targets):
                x1 = s - targets[:, 3]
                targets[:, 3] = s - targets[:, 1]
                targets[:, 1] = x1
        return image, targets

    def cache_images(self, mode: str, *, progress: bool = True, max_fraction: float = 0.6,
                     threads: int | None = None) -> bool:
        """Decode and letterbox every image once, before training, and keep the results: ``"ram"``
        in this process (DataLoader workers started by fork share it copy-on-write) or ``"disk"``
        as ``.npy`` files under the libreyolo cache, keyed by the files, their sizes and mtimes,
        the size and the resize mode (a later run reuses them). Every later epoch then skips
        decoding and resizing; augmentation still runs per sample. Only the letterboxed path
        (validation, the YOLO recipe and its mosaic tiles) reads the cache: the DETR recipe
        transforms the original image.

        ``"ram"`` is refused with one warning (and the files are read as before) when the images
        need more than ``max_fraction`` of the available memory. ``"auto"`` (training's default)
        is ``"ram"`` when the images need at most :data:`AUTO_CACHE_FRACTION` of the available
        memory and :data:`AUTO_CACHE_MAX_BYTES`, else no cache; one info line says which. A cached
        sample is the same bytes as one read from its file. The images are decoded and
        letterboxed by ``threads`` threads (default: up to 8, one per core). Returns whether a
        cache is used.
        """
        if mode not in ("ram", "disk", "auto"):
            raise ValueError(f"cache must be 'ram', 'disk', 'auto' or false, got {mode!r}")
        n, s = len(self.samples), self.imgsz
        need = n * 3 * s * s
        if mode == "auto":
            avail = _available_memory()
            limit = min(AUTO_CACHE_FRACTION * avail, AUTO_CACHE_MAX_BYTES) if avail is not None else 0
            if need > limit:
                LOGGER.info("cache=auto: %d images at %d px need %.2f GB, over the automatic RAM "
                            "cache's %.2f GB; reading the image files every epoch (cache=ram or cache=disk "
                            "caches them anyway)", n, s, need / 1e9, limit / 1e9)
                return False
            LOGGER.info("cache=auto: keeping %d images at %d px in RAM (%.2f GB; cache=false reads "
                        "the files every epoch)", n, s, need / 1e9)
            mode = "ram"
        elif mode == "ram":
            avail = _available_memory()
            if avail is not None and need > max_fraction * avail:
                LOGGER.warning("cache=ram needs %.1f GB for %d images at %d px but %.1f GB are "
                               "available; reading the image files instead (cache=disk keeps them on disk)",
                               need / 1e9, n, s, avail / 1e9)
                return False
        folder = (_disk_cache_folder(self.samples, s, self.resize + ("|antialias" if self.antialias else ""))
                  if mode == "disk" else None)
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=n, desc=f"  caching images ({mode}, {need / 1e9:.2f} GB)", unit="img", leave=False)
        cache: list = [None] * n
        # threads: PIL's decode and torch's resize release the GIL; each entry is computed alone,
        # so the bytes are those of a serial fill
        threads = min(8, os.cpu_count() or 1) if threads is None else max(1, int(threads))
        with ThreadPoolExecutor(threads) as pool:
            for i, entry in enumerate(pool.map(lambda i: self._cached_entry(i, folder), range(n))):
                cache[i] = entry
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        self._cache = cache
        return True

    def _cached_entry(self, i: int, folder):
        """(image (3, S, S) uint8 - or its .npy path -, letterbox parameters) of sample ``i``."""
        sample = self.samples[i]
        p = letterbox_params(int(sample.height), int(sample.width), self.imgsz, self.resize)
        if folder is not None:
            path = folder / f"{i}.npy"
            if path.is_file():
                return path, p
        try:
            image, p = self._letterbox_u8(torch.from_numpy(decode_image(sample.image)))
        except (ValueError, OSError):
            return None   # _decode's skip-and-warn handles it when the sample is drawn
        if folder is None:
            return image, p
        tmp = folder / f".{i}.{os.getpid()}.tmp.npy"
        np.save(tmp, image.numpy())
        os.replace(tmp, path)
        return path, p

    def load_letterboxed(self, index: int) -> tuple[torch.Tensor, LetterboxParams, torch.Tensor]:
        """Image ``index`` letterboxed like predict: (uint8 (3, S, S), its letterbox parameters,
        targets px).

        The image occupies ``new_h`` x ``new_w`` at ``(pad_y, pad_x)`` (zero but for "center";
        "stretch": all of it); targets are scaled per axis by new/original size and shifted by
        the padding, exactly as predict maps its boxes back.
        """
        entry = self._cache[index] if self._cache is not None else None
        if entry is not None:
            sample = self.samples[index]
            image, p = entry
            image = torch.from_numpy(np.load(image)) if not isinstance(image, torch.Tensor) else image.clone()
        else:
            sample, hwc = self._decode(index)
            image, p = self._letterbox_u8(torch.from_numpy(hwc))
        return image, p, torch.from_numpy(_pixel_targets(sample, p))

    def _tile(self, index: int) -> tuple[torch.Tensor, LetterboxParams, np.ndarray]:
        """What :meth:`load_letterboxed` gives, without building the padded square: (the image's
        region of it, (3, new_h, new_w) - uint8, or float32 holding the same whole numbers -, its
        letterbox parameters, targets px on the square as a float32 numpy array). The region is a
        view of the cache or of the decoded image where it can be: read it, do not write it."""
        entry = self._cache[index] if self._cache is not None else None
        if entry is not None:
            image, p = entry
            if not isinstance(image, torch.Tensor):
                image = torch.from_numpy(np.load(image))
            region = image[:, p.pad_y:p.pad_y + p.new_h, p.pad_x:p.pad_x + p.new_w]
            return region, p, _pixel_targets(self.samples[index], p)
        sample, hwc = self._decode(index)
        region, p = self._letterbox_region(torch.from_numpy(hwc))
        return region, p, _pixel_targets(sample, p)

    def _detr_recipe(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RT-DETR / D-FINE training transforms on the decoded image, then predict's resize."""
        sample, decoded = self._decode(index)
        hwc = torch.from_numpy(decoded)
        h, w = int(hwc.shape[0]), int(hwc.shape[1])
        labels = torch.from_numpy(sample.labels).to(torch.float32).reshape(-1, 5)
        chw, boxes, cls = hwc.permute(2, 0, 1), labels[:, 1:] * torch.tensor([w, h, w, h], dtype=torch.float32), labels[:, 0]
        ops = self._detr_ops[0 if float(self._strong[0]) > 0 else 1]
        if ops is not None:
            from torchvision import tv_tensors
            out = ops({"image": tv_tensors.Image(chw.contiguous()),
                       "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w)), "labels": cls})
            chw, boxes, cls = (out[k].as_subclass(torch.Tensor) for k in ("image", "boxes", "labels"))
        h, w = int(chw.shape[1]), int(chw.shape[2])
        image, p = self._letterbox_u8(chw.permute(1, 2, 0))
        b = boxes.to(torch.float32).reshape(-1, 4)
        b[:, 0::2] = (b[:, 0::2] * (p.new_w / w) + p.pad_x).clamp_(0, self.imgsz)
        b[:, 1::2] = (b[:, 1::2] * (p.new_h / h) + p.pad_y).clamp_(0, self.imgsz)
        targets = torch.cat((cls.to(torch.float32).reshape(-1, 1), b), 1)
        keep = ((targets[:, 3] - targets[:, 1]) >= MIN_BOX_SIDE) & ((targets[:, 4] - targets[:, 2]) >= MIN_BOX_SIDE)
        return image, targets[keep]

    def _decode(self, index: int) -> tuple[Sample, np.ndarray]:
        """Sample ``index`` and its decoded image; if that image does not decode, the next
        sample (``index + 1``, ``index + 2``, ... cyclically) whose image does.

        The dataset check decodes every image before training, so this only happens to a file
        that changed (or broke) since: the run goes on without it, with one warning per file,
        instead of dying at the batch that holds it.
        """
        n = len(self.samples)
        for k in range(n):
            i = (index + k) % n
            if self._undecodable[i]:
                continue
            sample = self.samples[i]
            try:
                return sample, decode_image(sample.image)
            except (ValueError, OSError) as e:  # undecodable, deleted or unreadable since the check
                already = bool(self._undecodable[i])
                self._undecodable[i] = 1
                if not already:
                    LOGGER.warning("skipping dataset sample %d for the rest of the run, the next "
                                   "decodable sample stands in for it: %s", i, e)
        raise RuntimeError(f"none of the {n} images of the dataset can be decoded any more (each was "
                           "warned about above); check the dataset's files")

    def _letterbox_u8(self, hwc: torch.Tensor):
        """(H, W, 3) uint8 -> ((3, S, S) uint8 in the dataset's resize mode, its letterbox parameters):
        the same pixels as ``letterbox()`` (predict's) times 255, rounded - its padding, 114 / 255
        * 255, rounds back to 114 -, with only the image's region computed in float."""
        region, p = self._letterbox_region(hwc)
        if (p.new_h, p.new_w) == (self.imgsz, self.imgsz):
            return region.to(torch.uint8, memory_format=torch.contiguous_format), p
        image = torch.full((3, self.imgsz, self.imgsz), int(PAD_VALUE), dtype=torch.uint8)
        image[:, p.pad_y:p.pad_y + p.new_h, p.pad_x:p.pad_x + p.new_w] = region
        return image, p

    def _letterbox_region(self, hwc: torch.Tensor) -> tuple[torch.Tensor, LetterboxParams]:
        """(H, W, 3) uint8 -> (the image's (3, new_h, new_w) region of its letterboxed square, its
        letterbox parameters), the pixels ``letterbox()`` gives there, times 255 and rounded.

        Not resized: a (permuted) view of ``hwc`` itself - exact, as every uint8 ``k`` comes back
        from ``k / 255 * 255`` rounded (tests/unit/test_augment.py checks all 256). Resized: float32
        whole numbers, the same operations as ``letterbox()`` and the rounding after it (bilinear
        ``interpolate``, ``/ 255``, ``* 255``, round, clamp), on the region only.
        """
        h, w = int(hwc.shape[0]), int(hwc.shape[1])
        p = letterbox_params(h, w, self.imgsz, self.resize)
        chw = hwc.permute(2, 0, 1)
        if (p.new_h, p.new_w) == (h, w):
            return chw, p
        x = chw.unsqueeze(0).to(torch.float32, memory_format=torch.contiguous_format)
        x = F.interpolate(x, size=(p.new_h, p.new_w), mode="bilinear", align_corners=False,
                          antialias=self.antialias)[0]
        return x.div_(255.0).mul_(255.0).round_().clamp_(0, 255), p

    # ---- mosaic and affine ----------------------------------------------------------------------

    def _load_mosaic(self, index: int) -> tuple[_Canvas, torch.Tensor, torch.Tensor]:
        """Four images tiled around a random centre of a 2S canvas: (canvas, targets, ref area).

        The canvas is a :class:`_Canvas` - the tiles and where they sit; ``.dense()`` builds it -
        as the warp reads only the part of it the output samples. ``ref area`` is each box's area
        before the canvas cut it, for the area-kept filter. With ``dense_mosaic`` the centre is
        the canvas centre (no tile is cut).
        """
        s = self.imgsz
        if self.dense_mosaic:
            xc = yc = s
        else:
            xc = int(torch.randint(s // 2, s + s // 2 + 1, ()))
            yc = int(torch.randint(s // 2, s + s // 2 + 1, ()))
        others = torch.randint(len(self.samples), (3,)).tolist()
        tiles, all_targets, all_ref = [], [], []
        for k, i in enumerate([index, *others]):
            tile, p, targets = self._tile(i)   # the image itself, without its padding
            nh, nw = p.new_h, p.new_w
            targets[:, 1::2] -= p.pad_x
            targets[:, 2::2] -= p.pad_y
            x0 = xc - nw if k in (0, 2) else xc  # top-left corner of the tile on the canvas
            y0 = yc - nh if k in (0, 1) else yc
            cx0, cy0 = max(x0, 0), max(y0, 0)
            cx1, cy1 = min(x0 + nw, 2 * s), min(y0 + nh, 2 * s)
            tiles.append((tile[:, cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0], cy0, cx0))
            if len(targets):   # float32 numpy: the same operations torch would do, for less overhead
                all_ref.append(_areas(targets))
                targets[:, 1::2] = np.clip(targets[:, 1::2] + x0, cx0, cx1)
                targets[:, 2::2] = np.clip(targets[:, 2::2] + y0, cy0, cy1)
                all_targets.append(targets)
        canvas = _Canvas(2 * s, tiles)
        if not all_targets:
            return canvas, torch.zeros((0, 5)), torch.zeros((0,))
        return canvas, torch.from_numpy(np.concatenate(all_targets)), torch.from_numpy(np.concatenate(all_ref))

    def _transform(self, canvas: torch.Tensor | _Canvas, targets: torch.Tensor, ref_area: torch.Tensor,
                   center: tuple[float, float], zoom_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The random affine - rotate/scale about ``center``, translate, resample to S x S in one
        pass - then the colour jitter, rounded once: (uint8 (3, S, S) image, targets).

        ``canvas``: a :class:`_Canvas` or a uint8 (3, H, W) picture. ``zoom_scale`` multiplies the
        random zoom (0.5 for a dense mosaic). The affine's draws come first, then the colour's;
        the resampling, colour matrix and rounding run together (:func:`_render`).
        """
        canvas = canvas if isinstance(canvas, _Canvas) else _Canvas.of(canvas)
        a, b, zoom, identity = self._affine_params(canvas, center, zoom_scale)
        targets = self._affine_boxes(targets, ref_area, a, b, zoom)
        return _render(canvas, a, b, self.imgsz, self._colour_matrix(), identity), targets

    def _affine_params(self, canvas, center: tuple[float, float], zoom_scale: float = 1.0):
        """The random affine's draws: (A, b, zoom, whether it is the identity) with output point
        ``A @ (p - center) + (S/2 + t)`` for canvas point p (continuous pixel coordinates)."""
        s = self.imgsz
        angle = math.radians(_uniform(-self.degrees, self.degrees)) if self.degrees else 0.0
        zoom = _uniform(1.0 - self.scale, 1.0 + self.scale) if self.scale else 1.0
        if zoom_scale != 1.0:
            zoom = zoom * zoom_scale
        tx = _uniform(-self.translate, self.translate) * s if self.translate else 0.0
        ty = _uniform(-self.translate, self.translate) * s if self.translate else 0.0
        cos, sin = math.cos(angle) * zoom, math.sin(angle) * zoom
        a = torch.tensor([[cos, -sin], [sin, cos]], dtype=torch.float64)
        c = torch.tensor(center, dtype=torch.float64)
        b = torch.tensor([s / 2.0 + tx, s / 2.0 + ty], dtype=torch.float64) - a @ c
        identity = canvas.shape[-1] == s and angle == 0.0 and zoom == 1.0 and tx == 0.0 and ty == 0.0
        return a, b, zoom, identity

    def _affine_boxes(self, targets: torch.Tensor, ref_area: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      zoom: float) -> torch.Tensor:
        """Targets through the affine: the bounding box of each box's four corners, clipped, and
        dropped when narrower than MIN_BOX_SIDE or keeping less than MIN_AREA_KEPT of its area."""
        s = self.imgsz
        if len(targets) == 0:
            return targets.reshape(0, 5)
        xy = targets[:, [1, 2, 3, 2, 3, 4, 1, 4]].reshape(-1, 4, 2).to(torch.float64)
        xy = xy @ a.T + b  # the four corners of each box
        out = torch.cat([xy.amin(1), xy.amax(1)], dim=1).clamp_(0, s)
        w, h = out[:, 2] - out[:, 0], out[:, 3] - out[:, 1]
        kept = (w * h) / (ref_area.to(torch.float64) * zoom * zoom).clamp_min(1e-9)
        keep = (w >= MIN_BOX_SIDE) & (h >= MIN_BOX_SIDE) & (kept >= MIN_AREA_KEPT)
        result = torch.cat([targets[:, :1].to(torch.float64), out], dim=1)[keep]
        return result.to(torch.float32)

    def _colour_matrix(self) -> torch.Tensor | None:
        """The colour jitter's draws as one float32 3x3 matrix (None: the identity, nothing to do).

        Hue: a rotation about the grey axis by ``+-hsv_h`` of the colour circle; saturation: a
        blend with luma by a gain in ``1 +- hsv_s``; value: a gain in ``1 +- hsv_v``. Grey (the
        padding included) keeps its hue and saturation. One small matmul replaces three
        colour-space round trips (torchvision's ``adjust_hue`` alone costs more than the warp).
        """
        hue = _uniform(-self.hsv_h, self.hsv_h) * 2.0 * math.pi if self.hsv_h else 0.0
        sat = _uniform(1.0 - self.hsv_s, 1.0 + self.hsv_s) if self.hsv_s else 1.0
        val = _uniform(1.0 - self.hsv_v, 1.0 + self.hsv_v) if self.hsv_v else 1.0
        if hue == 0.0 and sat == 1.0 and val == 1.0:
            return None
        return (val * (_saturation_matrix(sat) @ _hue_matrix(hue))).to(torch.float32)


_LUMA = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)


def _available_memory() -> int | None:
    """Bytes of memory available for new allocations (Linux's MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _disk_cache_folder(samples: Sequence[Sample], imgsz: int, resize: str):
    """The folder of a dataset's letterboxed images under the libreyolo cache: its name hashes
    every image's path, size and mtime with the size and resize mode, so a changed file or
    another size gets a new folder."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha1(f"{imgsz}|{resize}".encode())
    for sample in samples:
        path = Path(sample.image)
        try:
            st = path.stat()
            h.update(f"|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f"|{path}|missing".encode())
    root = Path(os.environ.get("LIBREYOLO_CACHE_DIR") or Path.home() / ".cache" / "libreyolo").expanduser()
    folder = root / "letterboxed" / h.hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_K = 1.0 / math.sqrt(3.0)   # each coordinate of the grey axis' unit vector
_EYE = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
_KX = ((0.0, -_K, _K), (_K, 0.0, -_K), (-_K, _K, 0.0))   # its cross-product matrix


def _hue_matrix(theta: float) -> torch.Tensor:
    """Rotation of RGB space by ``theta`` radians about the grey axis (1, 1, 1) (Rodrigues):
    ``cos I + sin [k]x + (1 - cos) k k^T``, entry by entry in float64 (a handful of Python float
    operations instead of a dozen tiny tensors; the same numbers)."""
    c, s = math.cos(theta), math.sin(theta)
    kk = _K * _K
    return torch.tensor([[c * _EYE[i][j] + s * _KX[i][j] + (1.0 - c) * kk for j in range(3)] for i in range(3)],
                        dtype=torch.float64)


def _saturation_matrix(gain: float) -> torch.Tensor:
    """``gain * rgb + (1 - gain) * luma``: 0 is greyscale, 1 the identity, >1 more saturated."""
    luma = _LUMA.tolist()
    return torch.tensor([[gain * _EYE[i][j] + (1.0 - gain) * luma[j] for j in range(3)] for i in range(3)],
                        dtype=torch.float64)


def _uniform(lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), dtype=torch.float64))


def _areas(targets):
    """Box areas of (n, 5) targets, a tensor or a numpy array."""
    return (targets[:, 3] - targets[:, 1]) * (targets[:, 4] - targets[:, 2])


def _pixel_targets(sample: Sample, p: LetterboxParams) -> np.ndarray:
    """A sample's normalized labels as float32 (n, 5) pixel targets on its letterboxed square
    (numpy's float32 arithmetic: the same numbers as torch's)."""
    targets = np.array(sample.labels, dtype=np.float32).reshape(-1, 5)
    targets[:, 1::2] = targets[:, 1::2] * np.float32(p.new_w) + np.float32(p.pad_x)
    targets[:, 2::2] = targets[:, 2::2] * np.float32(p.new_h) + np.float32(p.pad_y)
    return targets


class _Canvas:
    """A uint8 (3, H, W) picture - a mosaic's 2S canvas, or one letterboxed image - held as its
    tiles on grey 114 instead of built: ``tiles`` are (content (3, h, w) - uint8, or float32
    whole numbers -, top, left), inside the picture and not overlapping. The warp fills in only
    the part of it that the output samples (see :func:`_warp`)."""

    def __init__(self, size: int | tuple[int, int], tiles: Sequence[tuple[torch.Tensor, int, int]]):
        self.h, self.w = (size, size) if isinstance(size, int) else size
        self.tiles = list(tiles)

    @classmethod
    def of(cls, image: torch.Tensor) -> _Canvas:
        """A built uint8 (3, H, W) picture as a one-tile canvas."""
        return cls((int(image.shape[1]), int(image.shape[2])), [(image, 0, 0)])

    @property
    def shape(self) -> tuple[int, int, int]:
        return (3, self.h, self.w)

    def dense(self) -> torch.Tensor:
        """The picture, uint8 (3, H, W)."""
        out = torch.full((3, self.h, self.w), int(PAD_VALUE), dtype=torch.uint8)
        for tile, y0, x0 in self.tiles:
            out[:, y0:y0 + tile.shape[1], x0:x0 + tile.shape[2]] = tile
        return out

    def fill_minus_pad(self, out: torch.Tensor, y0: int, y1: int, x0: int, x1: int) -> None:
        """``out[:, y0:y1, x0:x1]`` = the picture's pixels there, minus 114, as float32 (what
        ``dense().float() - 114`` holds there: the same numbers)."""
        out[:, y0:y1, x0:x1].zero_()
        for tile, ty, tx in self.tiles:
            ya, yb = max(y0, ty), min(y1, ty + tile.shape[1])
            xa, xb = max(x0, tx), min(x1, tx + tile.shape[2])
            if ya < yb and xa < xb:
                # uint8 (or float whole numbers) + -114.0 in float32: exactly float(v) - 114
                torch.add(tile[:, ya - ty:yb - ty, xa - tx:xb - tx], -PAD_VALUE, out=out[:, ya:yb, xa:xb])


def _warp(canvas: _Canvas, a: torch.Tensor, b: torch.Tensor, size: int) -> torch.Tensor:
    """Resample the uint8 (3, H, W) picture ``canvas`` to float (3, size, size): output point q
    shows canvas point ``A^-1 (q - b)`` (continuous pixel coordinates, pixel i spanning [i, i + 1)).

    One bilinear ``grid_sample`` at the output resolution, whatever the canvas size; outside the
    canvas is grey 114 (see :func:`_warp_source`).
    """
    src, grid = _warp_source(canvas, a, b, size)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]
    return out.add_(PAD_VALUE)


def _render(canvas: _Canvas, a: torch.Tensor, b: torch.Tensor, size: int, colour: torch.Tensor | None,
            identity: bool) -> torch.Tensor:
    """uint8 (3, size, size): :func:`_warp` (or, for the identity, the canvas itself), times the
    float32 colour matrix (None: none), rounded and clamped - the same numbers as those steps one
    after the other over the whole image, done here a band of rows at a time (:func:`_band_rows`),
    so that a band stays in the CPU's cache through its five passes: each output pixel's
    arithmetic is its own (tests/unit/test_augment.py compares with the whole-image steps)."""
    if identity:
        return _finish(canvas.dense().to(torch.float32), colour)
    rows = _band_rows(size)
    if rows >= size:
        return _finish(_warp(canvas, a, b, size), colour)
    src, grid = _warp_source(canvas, a, b, size)
    image = torch.empty((3, size, size), dtype=torch.uint8)
    for r0 in range(0, size, rows):
        band = F.grid_sample(src, grid[:, r0:r0 + rows], mode="bilinear", padding_mode="zeros", align_corners=False)
        image[:, r0:r0 + rows] = _finish(band[0].add_(PAD_VALUE), colour)
    return image


def _band_rows(size: int) -> int:
    """Output rows per band of :func:`_render`: the whole image up to 2 MB of float32 (320 px is
    1.2 MB: there bands only add calls), else bands of about 512 KB, which stay in a core's L2
    cache (68 rows at 640 px)."""
    if 12 * size * size <= 2 ** 21:
        return size
    return max(8, 2 ** 19 // (12 * size))


def _finish(x: torch.Tensor, colour: torch.Tensor | None) -> torch.Tensor:
    """Float (3, h, w) on the 0..255 scale -> the colour matrix applied, rounded, uint8."""
    if colour is not None:
        x = (colour @ x.reshape(3, -1)).reshape(x.shape)
    return x.round_().clamp_(0, 255).to(torch.uint8)


def _warp_source(canvas: _Canvas, a: torch.Tensor, b: torch.Tensor, size: int):
    """The input and grid of :func:`_warp`'s ``grid_sample``: (float32 (1, 3, H, W) canvas - 114,
    (1, size, size, 2) grid).

    ``grid_sample`` reads only the pixels next to its sampling points, so only the canvas' window
    around them (the four corners of the grid - it is affine -, widened by two pixels) is filled
    in: on average a third of a mosaic's 2S canvas. The rest of the tensor is left unwritten and
    never read; the output is that of the whole canvas.
    """
    h, w = canvas.h, canvas.w
    inv = torch.linalg.inv(a)
    # affine_grid works in normalized coordinates: q = (S/2)(o + 1) and p_n = D p - 1.
    d = torch.diag(torch.tensor([2.0 / w, 2.0 / h], dtype=torch.float64))
    half = size / 2.0
    lin = d @ inv * half
    off = d @ inv @ (torch.full((2,), half, dtype=torch.float64) - b) - 1.0
    theta = torch.cat([lin, off[:, None]], dim=1).to(torch.float32)
    grid = _affine_grid(theta, size)
    # the source pixels bilinear sampling reads: floor(i) and floor(i) + 1 of each unnormalized
    # coordinate i = ((g + 1) * W - 1) / 2 (align_corners=False) of the grid, whose extremes are at
    # its four corners; computed here in float64 from theta, hence the margin
    t = theta.tolist()
    e = _GRID_BASE[size][0]
    lo, hi = float(e[0]), float(e[-1])
    gx = [t[0][0] * u + t[0][1] * v + t[0][2] for u in (lo, hi) for v in (lo, hi)]
    gy = [t[1][0] * u + t[1][1] * v + t[1][2] for u in (lo, hi) for v in (lo, hi)]
    x0 = max(0, math.floor(((min(gx) + 1.0) * w - 1.0) / 2.0) - 2)
    x1 = min(w, math.floor(((max(gx) + 1.0) * w - 1.0) / 2.0) + 4)
    y0 = max(0, math.floor(((min(gy) + 1.0) * h - 1.0) / 2.0) - 2)
    y1 = min(h, math.floor(((max(gy) + 1.0) * h - 1.0) / 2.0) + 4)
    src = torch.empty((1, 3, h, w), dtype=torch.float32)
    if x0 < x1 and y0 < y1:
        canvas.fill_minus_pad(src[0], y0, y1, x0, x1)
    return src, grid


#: per output size: (x, y) of the pixel centres as F.affine_grid places them (align_corners=False)
_GRID_BASE: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _affine_grid(theta: torch.Tensor, size: int) -> torch.Tensor:
    """The recipe's sampling grid for a (2, 3) float32 ``theta``: (1, size, size, 2), each
    coordinate the float32 ``(t0 * x + t1 * y) + t2`` at F.affine_grid's pixel centres
    (x, y) - what ``F.affine_grid(theta[None], [1, 3, size, size], align_corners=False)``
    computes, at a fraction of its cost.

    affine_grid multiplies its base grid (x, y, 1) by theta with a batched matmul (~70 % of a
    320 px sample's grid time), and how that matmul rounds (fused multiply-adds or not, for all
    thetas or some) is the BLAS's choice, which changes with the CPU and the BLAS build, so its
    grid can differ from one machine to the next in the last bit. Separate float32 multiplies and
    adds round the same everywhere: the same augmented bytes on every machine, within an ulp
    or two of F.affine_grid's grid.
    """
    entry = _GRID_BASE.get(size)
    if entry is None:
        # the identity's grid is the base itself on any BLAS (products with 0 and 1 are exact)
        ident = F.affine_grid(torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]), [1, 3, size, size],
                              align_corners=False)[0]
        entry = _GRID_BASE[size] = (ident[0, :, 0].clone(), ident[:, 0, 1].clone())
    return _elementwise_grid(theta, *entry)


def _elementwise_grid(theta: torch.Tensor, bx: torch.Tensor, by: torch.Tensor) -> torch.Tensor:
    """(1, H, W, 2) grid: ``(theta[r, 0] * bx[j] + theta[r, 1] * by[i]) + theta[r, 2]``, as a view of
    (2, H, W) planes (written contiguously; grid_sample reads any strides, and as fast)."""
    planes = torch.empty((2, len(by), len(bx)), dtype=torch.float32)
    for r in range(2):
        torch.add((theta[r, 0] * bx)[None, :], (theta[r, 1] * by)[:, None], out=planes[r])
        planes[r].add_(theta[r, 2])
    return planes.permute(1, 2, 0).unsqueeze(0)


# --------------------------------------------------------------------------------------------------
# Collate.


def max_targets_bucket(counts: Sequence[int], bucket: int = 16) -> int:
    """Row count for a batch's padded targets: the smallest ``bucket * 2**k`` (k >= 0) that holds
    the largest count (so batches without objects share the smallest shape).

    Every row count is a shape of the loss, so a captured training step (two graphs per count:
    accumulating and updating) and its capture cost per count: doubling keeps the counts few
    however crowded the images - 16, 32, 64, 128 up to 128 objects, where multiples of 16 made
    eight. The padded rows are masked out of the loss (the detection losses give the same bits
    at any padding)."""
    if bucket < 1:
        raise ValueError(f"bucket must be >= 1, got {bucket}")
    most = max((int(c) for c in counts), default=0)
    rows = bucket
    while rows < most:
        rows *= 2
    return rows


def collate_detections(
    batch: Sequence[tuple[torch.Tensor, ...]], bucket: int = 16
) -> tuple[torch.Tensor, ...]:
    """Stack a batch: (images uint8 (B, 3, S, S), targets float32 (B, M, 5), mask bool (B, M)),
    and, for samples of a ``gpu_augment`` dataset (which carry their letterbox geometry), a
    fourth item: geometry int32 (B, 4).

    ``M = max_targets_bucket(counts, bucket)``; padded rows are zero with ``mask`` False. Use
    ``functools.partial(collate_detections, bucket=...)`` as a DataLoader ``collate_fn``.
    """
    if len(batch) == 0:
        raise ValueError("cannot collate an empty batch")
    images = torch.stack([item[0] for item in batch])
    counts = [int(item[1].shape[0]) for item in batch]
    m = max_targets_bucket(counts, bucket)
    targets = torch.zeros((len(batch), m, 5), dtype=torch.float32)
    mask = torch.zeros((len(batch), m), dtype=torch.bool)
    for i, item in enumerate(batch):
        n = counts[i]
        if n:
            targets[i, :n] = item[1].to(torch.float32)
            mask[i, :n] = True
    if len(batch[0]) == 3:
        return images, targets, mask, torch.stack([item[2] for item in batch])
    return images, targets, mask
