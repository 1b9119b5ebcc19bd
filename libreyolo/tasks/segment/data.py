"""Instance-segmentation datasets: YOLO-seg polygon labels and the built-in ``shapes-inst`` set.

A COCO dataset YAML (``format: coco``) reads polygons and RLEs through faster-coco-eval's mask
API. A YOLO-seg label file holds one row per instance, ``class x1 y1 x2 y2 ... xn yn`` with the
polygon's vertices normalized by the image's width and height (at least 3 vertices). Every bad
row of a split is reported together (file and line) before training starts.

A training sample is the letterboxed image (the model's resize), its boxes (the polygons'
extents, input pixels) and each instance's bitmap at stride 4 (the mask loss's resolution,
rasterized from the polygon with PIL); batches pad the instances to a bucketed count, as
detection's, so the loss has fixed shapes.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from ...data.builtin import PairedSet
from ...data.datasets import DataProblems, label_path_for, list_split_images, names_from_spec, read_yaml
from ...ops.letterbox import letterbox_params

__all__ = ["MASK_STRIDE", "SHAPES_INST_NAMES", "InstanceSample", "SegmentData", "SegmentDataset",
           "collate_instances", "make_shapes_inst_dataset", "parse_polygon_file", "resolve_segment_data"]

#: stride of the training masks (input pixels per mask pixel)
MASK_STRIDE = 4
SHAPES_INST_NAMES = ("triangle", "square", "pentagon", "star", "circle")
_VERSION = "shapes-inst-v1"


@dataclass
class InstanceSample:
    """One image: ``polygons`` one (k, 2) float32 array per instance (normalized x, y), ``cls``
    (n,); a COCO sample has ``rles`` instead (one COCO RLE per instance at the image's size) and
    ``boxes`` (n, 4) xyxy pixels."""

    image: Path
    cls: np.ndarray
    polygons: list[np.ndarray]
    width: int
    height: int
    rles: list[dict] | None = None
    boxes: np.ndarray | None = None


@dataclass
class SegmentData:
    root: Path
    nc: int
    names: dict[int, str]
    train: list[InstanceSample]
    val: list[InstanceSample]
    source: str


# ----------------------------------------------------------------------------- label files
def parse_polygon_file(path: Path, nc: int, where: str, found: list[str]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The rows of one YOLO-seg label file; each bad row appends ``"<where> line N: why"`` to
    ``found`` (and is left out)."""
    cls, polys = [], []
    if not path.is_file():
        return np.zeros(0, np.int64), []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            values = [float(v) for v in fields]
        except ValueError:
            found.append(f"{where} line {n}: a value is not a number")
            continue
        c, coords = values[0], values[1:]
        if c != int(c) or not 0 <= c < nc:
            found.append(f"{where} line {n}: class '{fields[0]}' is not an integer in [0, {nc - 1}]")
            continue
        if len(coords) % 2:
            found.append(f"{where} line {n}: {len(coords)} coordinates (a polygon is x y pairs)")
            continue
        if len(coords) < 6:
            found.append(f"{where} line {n}: a polygon needs at least 3 points, got {len(coords) // 2}")
            continue
        if not all(math.isfinite(v) and -0.01 <= v <= 1.01 for v in coords):
            found.append(f"{where} line {n}: coordinates outside [0, 1] (they must be normalized by the image size)")
            continue
        cls.append(int(c))
        polys.append(np.clip(np.asarray(coords, np.float32).reshape(-1, 2), 0.0, 1.0))
    return np.asarray(cls, np.int64), polys


def resolve_segment_data(data) -> SegmentData:
    """``"shapes-inst"`` (the built-in set, made on first use) or a YOLO-seg dataset YAML
    (``path``, ``train``, ``val``, ``names``) -> the splits' samples; every bad label row of
    both splits is reported in one error."""
    if isinstance(data, str) and data == "shapes-inst":
        data = make_shapes_inst_dataset()
    yaml_path = Path(os.fspath(data)).absolute()
    if not yaml_path.is_file():
        raise FileNotFoundError(f"dataset not found: '{data}' (expected 'shapes-inst' or a dataset YAML file)")
    spec = read_yaml(yaml_path, "path/train/val/names")
    root = Path(os.path.expanduser(str(spec.get("path", "."))))
    root = Path(os.path.normpath(root if root.is_absolute() else yaml_path.parent / root))
    if str(spec.get("format", "yolo")).lower() == "coco":
        return _resolve_coco_segments(yaml_path, spec, root)
    nc, names = names_from_spec(yaml_path, spec)
    if nc is None:
        raise ValueError(f"{yaml_path}: give 'names' (a list or {{id: name}}) or 'nc'")
    names = names or {i: f"class{i}" for i in range(nc)}
    problems = DataProblems(root, yaml_path)
    splits: dict[str, list[InstanceSample]] = {}
    for split in ("train", "val"):
        if spec.get(split) in (None, "", []):
            raise FileNotFoundError(f"{yaml_path}: required entry '{split}' is missing")
        images, listed = list_split_images(yaml_path, split, spec[split], root, problems)
        problems.extend(listed)
        found: list[str] = []
        samples = []
        for img in images:
            lab = label_path_for(img)
            cls, polys = parse_polygon_file(lab, nc, problems.rel(lab), found)
            with Image.open(img) as im:
                w, h = im.size
            samples.append(InstanceSample(img, cls, polys, w, h))
        problems.extend(found)
        if not images:
            problems.extend([f"{split}: no images found in {spec[split]!r}"])
        splits[split] = samples
    problems.raise_if_any()
    return SegmentData(root, nc, names, splits["train"], splits["val"], str(yaml_path))


def _resolve_coco_segments(yaml_path: Path, spec: dict, root: Path) -> SegmentData:
    """A COCO instance-segmentation dataset (``format: coco``, each split ``{images: <folder>,
    annotations: <file.json>}``): polygons and RLEs both become RLEs through faster-coco-eval's
    mask API; crowd annotations are left out. Classes are the train file's categories in id order."""
    import json

    from faster_coco_eval.core import mask as mask_api
    problems = DataProblems(root, yaml_path)
    out: dict[str, list[InstanceSample]] = {}
    cat_map: dict[int, int] | None = None
    names: dict[int, str] = {}
    for split in ("train", "val"):
        entry = spec.get(split)
        if not isinstance(entry, dict) or not entry.get("images") or not entry.get("annotations"):
            raise ValueError(f"{yaml_path}: '{split}' must be {{images: <folder>, annotations: <file.json>}} "
                             "for format: coco")
        img_dir = Path(os.path.normpath(root / os.path.expanduser(str(entry["images"]))))
        ann_path = Path(os.path.normpath(root / os.path.expanduser(str(entry["annotations"]))))
        if not ann_path.is_file():
            raise FileNotFoundError(f"{yaml_path}: '{split}.annotations' file not found: {ann_path}")
        doc = json.loads(ann_path.read_text(encoding="utf-8"))
        where = problems.rel(ann_path)
        if cat_map is None:
            cats = sorted(doc.get("categories", []), key=lambda c: c["id"])
            cat_map = {c["id"]: i for i, c in enumerate(cats)}
            names = {i: str(c.get("name", i)) for i, c in enumerate(cats)}
        images = {im["id"]: im for im in doc.get("images", [])}
        per_image: dict[int, list] = {i: [] for i in images}
        for a in doc.get("annotations", []):
            if a.get("iscrowd", 0):
                continue
            im = images.get(a.get("image_id"))
            seg = a.get("segmentation")
            if im is None or a.get("category_id") not in cat_map or not seg:
                problems.extend([f"{where} annotation {a.get('id')}: unknown image or category, or no segmentation"])
                continue
            h, w = int(im["height"]), int(im["width"])
            if isinstance(seg, list):
                short = [len(p) // 2 for p in seg if len(p) < 6 or len(p) % 2]
                if short:
                    problems.extend([f"{where} annotation {a.get('id')}: a polygon needs at least 3 points "
                                     f"(x y pairs), got {short[0]}"])
                    continue
                rle = mask_api.merge(mask_api.frPyObjects(seg, h, w))
            else:
                rle = mask_api.frPyObjects(seg, h, w) if isinstance(seg.get("counts"), list) else seg
            x, y, bw, bh = mask_api.toBbox(rle).tolist()
            per_image[im["id"]].append((cat_map[a["category_id"]], rle, [x, y, x + bw, y + bh]))
        samples = []
        for iid, im in images.items():
            rows = per_image[iid]
            samples.append(InstanceSample(img_dir / im["file_name"], np.asarray([r[0] for r in rows], np.int64), [],
                                          int(im["width"]), int(im["height"]), [r[1] for r in rows],
                                          np.asarray([r[2] for r in rows], np.float32).reshape(-1, 4)))
        out[split] = samples
    problems.raise_if_any()
    return SegmentData(root, len(names), names, out["train"], out["val"], str(yaml_path))


# ---------------------------------------------------------------------------- the dataset
def rasterize(polygons: list[np.ndarray], h: int, w: int) -> np.ndarray:
    """(n, h, w) bool bitmaps of polygons given in the bitmap's pixel units."""
    out = np.zeros((len(polygons), h, w), bool)
    for i, p in enumerate(polygons):
        im = Image.new("L", (w, h), 0)
        ImageDraw.Draw(im).polygon([tuple(v) for v in p.tolist()], fill=1)
        out[i] = np.asarray(im, bool)
    return out


class SegmentDataset(torch.utils.data.Dataset):
    """Samples ``(image uint8 (3, S, S), labels float32 (n, 5) [cls, x1, y1, x2, y2] input pixels,
    masks bool (n, S/4, S/4))``: the image letterboxed as the model's predict does, with a
    horizontal flip of probability ``fliplr`` when ``augment``."""

    def __init__(self, samples: list[InstanceSample], imgsz: int, resize: str = "topleft", augment: bool = False,
                 fliplr: float = 0.5, seed: int = 0):
        if imgsz % 32:
            raise ValueError(f"imgsz must be a multiple of 32 for instance segmentation, got {imgsz}")
        self.samples, self.imgsz, self.resize = samples, int(imgsz), resize
        self.augment, self.fliplr = augment, float(fliplr)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        s, size = self.samples[i], self.imgsz
        with Image.open(s.image) as im:
            im = im.convert("RGB")
            w, h = im.size
            p = letterbox_params(h, w, size, self.resize)
            resized = im.resize((p.new_w, p.new_h), Image.BILINEAR)
        canvas = np.full((size, size, 3), 114, np.uint8)
        canvas[p.pad_y:p.pad_y + p.new_h, p.pad_x:p.pad_x + p.new_w] = np.asarray(resized)
        m = size // MASK_STRIDE
        flip = self.augment and self.rng.random() < self.fliplr
        if s.rles is not None:
            labels, masks = self._from_rles(s, p, size)
        else:
            scale = np.array([p.new_w, p.new_h], np.float32)
            pad = np.array([p.pad_x, p.pad_y], np.float32)
            polys = [q * scale + pad for q in s.polygons]                     # input pixels
            labels = np.zeros((len(polys), 5), np.float32)
            for k, q in enumerate(polys):
                labels[k] = [s.cls[k], q[:, 0].min(), q[:, 1].min(), q[:, 0].max(), q[:, 1].max()]
            masks = rasterize([q / MASK_STRIDE - 0.5 for q in polys], m, m)
        if flip:
            canvas = canvas[:, ::-1]
            masks = masks[:, :, ::-1].copy()
            labels[:, [1, 3]] = size - labels[:, [3, 1]]
        img = torch.from_numpy(np.ascontiguousarray(canvas.transpose(2, 0, 1)))
        return img, torch.from_numpy(labels), torch.from_numpy(masks)


    @staticmethod
    def _from_rles(s: InstanceSample, p, size: int) -> tuple[np.ndarray, np.ndarray]:
        """A COCO sample's labels (boxes letterboxed) and stride-4 bitmaps: each RLE decoded at the
        image's size, resized into the letterboxed canvas (nearest), read at the stride-4 cells'
        centres."""
        from faster_coco_eval.core import mask as mask_api
        n = len(s.rles)
        m = size // MASK_STRIDE
        labels = np.zeros((n, 5), np.float32)
        masks = np.zeros((n, m, m), bool)
        if n == 0:
            return labels, masks
        sx, sy = p.new_w / s.width, p.new_h / s.height
        labels[:, 0] = s.cls
        labels[:, 1:5] = s.boxes * [sx, sy, sx, sy] + [p.pad_x, p.pad_y, p.pad_x, p.pad_y]
        bitmaps = mask_api.decode(s.rles)                                   # (h, w, n)
        c = MASK_STRIDE // 2
        for k in range(n):
            full = np.zeros((size, size), bool)
            resized = Image.fromarray(bitmaps[:, :, k] * 255).resize((p.new_w, p.new_h), Image.NEAREST)
            full[p.pad_y:p.pad_y + p.new_h, p.pad_x:p.pad_x + p.new_w] = np.asarray(resized) > 127
            masks[k] = full[c::MASK_STRIDE, c::MASK_STRIDE]
        return labels, masks


def collate_instances(batch, bucket: int = 16):
    """(images uint8 (B, 3, S, S), targets float32 (B, M, 5), mask bool (B, M), masks uint8
    (B, M, S/4, S/4)): M the bucketed instance count (padding rows zero, ``mask`` False)."""
    from ...data.augment import max_targets_bucket
    images = torch.stack([b[0] for b in batch])
    counts = [int(b[1].shape[0]) for b in batch]
    m = max_targets_bucket(counts, bucket)
    hw = batch[0][2].shape[-2:]
    targets = torch.zeros((len(batch), m, 5), dtype=torch.float32)
    mask = torch.zeros((len(batch), m), dtype=torch.bool)
    masks = torch.zeros((len(batch), m, *hw), dtype=torch.uint8)
    for i, (_, lab, bm) in enumerate(batch):
        n = counts[i]
        targets[i, :n], mask[i, :n], masks[i, :n] = lab, True, bm.to(torch.uint8)
    return images, targets, mask, masks



# ------------------------------------------------------------------------- shapes-inst
def _regular(n: int, r: float, cx: float, cy: float, angle: float, star: bool = False) -> np.ndarray:
    k = 2 * n if star else n
    t = angle + np.arange(k) * 2 * np.pi / k
    rad = np.where(np.arange(k) % 2 == 1, r * 0.45, r) if star else np.full(k, r)
    return np.stack((cx + rad * np.cos(t), cy + rad * np.sin(t)), 1)


def draw_instances(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One image of 1 to 5 filled polygons (classes :data:`SHAPES_INST_NAMES`; circles as
    32-gons) on a flat or gradient background, and each instance's exact polygon (pixels).
    Their boxes may overlap; their pixels never do (a shape is redrawn elsewhere, up to 25
    times, until it touches no earlier one), so each polygon is exactly what shows."""
    base = rng.integers(0, 256, 3)
    ramp = np.linspace(0, 1, w)[None, :, None] * rng.integers(-60, 61, 3) if rng.random() < 0.5 else 0
    img = np.clip(np.broadcast_to(base, (h, w, 3)) + ramp, 0, 255).astype(np.uint8)
    pil = Image.fromarray(img)
    draw = ImageDraw.Draw(pil)
    taken = np.zeros((h, w), bool)
    out = []
    short = min(w, h)
    for _ in range(int(rng.integers(1, 6))):
        for _attempt in range(25):
            c = int(rng.integers(len(SHAPES_INST_NAMES)))
            r = rng.uniform(0.08, 0.25) * short
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            a = rng.uniform(0, 2 * np.pi)
            poly = {0: lambda: _regular(3, r, cx, cy, a), 1: lambda: _regular(4, r, cx, cy, a),
                    2: lambda: _regular(5, r, cx, cy, a), 3: lambda: _regular(5, r, cx, cy, a, star=True),
                    4: lambda: _regular(32, r, cx, cy, 0.0)}[c]()
            m = rasterize([poly - 0.5], h, w)[0]
            if m.sum() < 16 or (m & taken).any():
                continue
            color = tuple(int(v) for v in (255 - base + rng.integers(-40, 41, 3)).clip(0, 255))
            draw.polygon([tuple(v) for v in (poly - 0.5).tolist()], fill=color)
            taken |= m
            out.append((c, poly))
            break
    return np.asarray(pil), out


def _save_polygons(path: Path, label) -> None:
    shapes, w, h = label
    rows = []
    for c, poly in shapes:
        norm = (poly / np.array([w, h])).clip(0, 1)
        rows.append(" ".join([str(c)] + [f"{v:.6f}" for v in norm.reshape(-1).tolist()]))
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")


def _draw(rng: np.random.Generator, w: int, h: int):
    img, shapes = draw_instances(rng, w, h)
    return img, (shapes, w, h)


_NAMES_YAML = "\n".join(f"  {k}: {n}" for k, n in enumerate(SHAPES_INST_NAMES))
_SET = PairedSet(
    kind="shapes-inst", version=_VERSION, streams=(6, 7), label_dir="labels", label_suffix=".txt",
    draw=_draw, save_label=_save_polygons,
    data_yaml="# libreyolo built-in synthetic instance-segmentation dataset (libreyolo.tasks.segment.data)\n"
              f"path: .\ntrain: images/train\nval: images/val\nnames:\n{_NAMES_YAML}\n",
)


def make_shapes_inst_dataset(root: Path | str | None = None, n_train: int = 200, n_val: int = 50,
                             imgsz: int = 128, seed: int = 0) -> Path:
    """Write (or reuse) the synthetic instance-segmentation set and return its ``data.yaml``'s
    path (``<datasets dir>/shapes-inst-v1-<n_train>-<n_val>-<imgsz>-<seed>`` by default). The
    default size is the other task sets' (``shapes-seg``, ``shapes-pose``, ``shapes-obb``): with
    fewer images a short run of the default recipe gets few updates (at batch 16 and a nominal
    batch of 64, 30 epochs of 96 images are 45)."""
    return _SET.make(root, n_train, n_val, imgsz, seed)
