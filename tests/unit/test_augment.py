"""DetectionDataset (letterbox, mosaic, affine, flip, colour), collate_detections, DataLoader use."""

from __future__ import annotations

import functools
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import libreyolo.data.augment as augment_mod
from libreyolo.data.augment import (
    MIN_BOX_SIDE,
    DetectionDataset,
    collate_detections,
    max_targets_bucket,
)
from libreyolo.data.datasets import Sample, resolve_data
from libreyolo.data.synthetic import make_shapes_dataset
from libreyolo.ops.letterbox import letterbox, letterbox_params

NO_AUG = dict(mosaic=0.0, degrees=0.0, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0,
              hsv_v=0.0)
RED = (230, 20, 20)


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes") / "s"
    return resolve_data(make_shapes_dataset(root, n_train=16, n_val=4, imgsz=128))


def rect_sample(path: Path, w: int, h: int, box: tuple[int, int, int, int], cls: int = 1) -> Sample:
    """A grey PNG with one red rectangle (pixel box x1, y1, x2, y2, exclusive) and its label."""
    img = np.full((h, w, 3), 60, np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = RED
    Image.fromarray(img).save(path)
    labels = np.array([[cls, x1 / w, y1 / h, x2 / w, y2 / h]], np.float32)
    return Sample(path, labels, w, h)


def red_extent(image: torch.Tensor) -> tuple[int, int, int, int]:
    """Box (x1, y1, x2, y2) around clearly red pixels of a (3, H, W) uint8 image."""
    r, g, b = image.int()
    ys, xs = torch.nonzero((r > 150) & (g < 90) & (b < 90), as_tuple=True)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def check_targets(t: torch.Tensor, size: int, nc: int = 5) -> None:
    assert t.dtype == torch.float32 and t.ndim == 2 and t.shape[1] == 5
    if len(t):
        assert (t[:, 1:] >= 0).all() and (t[:, 1:] <= size).all()
        assert (t[:, 3] - t[:, 1] >= MIN_BOX_SIDE).all() and (t[:, 4] - t[:, 2] >= MIN_BOX_SIDE).all()
        assert (t[:, 0] == t[:, 0].round()).all() and t[:, 0].min() >= 0 and t[:, 0].max() < nc


# ---- without augmentation: the predict letterbox ---------------------------------------------------


@pytest.mark.parametrize("mode", ["topleft", "center", "stretch"])
def test_letterbox_matches_predict(shapes, mode):
    """Validation images are what predict feeds the network, in the family's resize mode."""
    ds = DetectionDataset(shapes.train, 96, augment=False, resize=mode)
    seen_non_square = False
    for i in range(len(ds)):
        image, targets = ds[i]
        s = shapes.train[i]
        assert image.dtype == torch.uint8 and image.shape == (3, 96, 96)
        with Image.open(s.image) as im:
            raw = torch.from_numpy(np.asarray(im.convert("RGB")).copy())
        ref = letterbox(raw.unsqueeze(0), 96, mode)[0].mul(255).round().to(torch.uint8)
        assert torch.equal(image, ref)
        p = letterbox_params(s.height, s.width, 96, mode)
        seen_non_square |= s.height != s.width
        # predict maps boxes back by new/original size per axis and the padding; so do the targets
        expected = torch.from_numpy(s.labels).clone()
        expected[:, 1::2] = expected[:, 1::2] * p.new_w + p.pad_x
        expected[:, 2::2] = expected[:, 2::2] * p.new_h + p.pad_y
        torch.testing.assert_close(targets, expected)
        if mode == "topleft":
            assert (image[:, p.new_h:, :] == 114).all() and (image[:, :, p.new_w:] == 114).all()
    assert seen_non_square


@pytest.mark.parametrize("mode", ["topleft", "center", "stretch"])
@pytest.mark.parametrize("augment", [False, True])
def test_letterbox_box_encloses_the_object(tmp_path, mode, augment):
    """In every resize mode, also through a (four-tile) mosaic, the target box is the red box."""
    s = rect_sample(tmp_path / "r.png", 200, 100, (30, 20, 90, 70))
    ds = DetectionDataset([s], 64, augment=augment, resize=mode, **{**NO_AUG, "mosaic": 1.0 if augment else 0.0})
    image, targets = ds[0]
    if augment:   # four copies of the same image around the canvas: check the first box only
        assert len(targets) >= 1
        targets = targets[:1]
        crop = image.clone()
        x1, y1, x2, y2 = [int(round(v)) for v in targets[0, 1:].tolist()]
        keep = torch.zeros_like(crop, dtype=torch.bool)
        keep[:, max(0, y1 - 2):y2 + 2, max(0, x1 - 2):x2 + 2] = True
        image = torch.where(keep, crop, torch.full_like(crop, 60))
    x1, y1, x2, y2 = red_extent(image)
    tx1, ty1, tx2, ty2 = targets[0, 1:].tolist()
    assert targets[0, 0] == 1
    assert abs(tx1 - x1) <= 1 and abs(ty1 - y1) <= 1 and abs(tx2 - x2) <= 1 and abs(ty2 - y2) <= 1


# ---- augmentation -----------------------------------------------------------------------------------


def test_augmented_items_are_valid_and_inside(shapes):
    ds = DetectionDataset(shapes.train, 96, augment=True, degrees=15.0)
    torch.manual_seed(0)
    total = 0
    for _ in range(2):
        for i in range(len(ds)):
            image, targets = ds[i]
            assert image.dtype == torch.uint8 and image.shape == (3, 96, 96) and image.is_contiguous()
            check_targets(targets, 96)
            total += len(targets)
    assert total > 0


def test_deterministic_under_manual_seed(shapes):
    ds = DetectionDataset(shapes.train, 64, augment=True, degrees=10.0)
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append([ds[i] for i in range(4)])
    for (ia, ta), (ib, tb) in zip(*runs):
        assert torch.equal(ia, ib) and torch.equal(ta, tb)
    torch.manual_seed(124)
    other = [ds[i] for i in range(4)]
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("degrees", [0.0, 30.0])
def test_affine_and_flip_move_boxes_with_the_pixels(tmp_path, degrees):
    s = rect_sample(tmp_path / "r.png", 120, 80, (20, 30, 70, 60))
    params = dict(NO_AUG, degrees=degrees, translate=0.2, scale=0.4, fliplr=0.5)
    ds = DetectionDataset([s], 96, augment=True, **params)
    torch.manual_seed(1)
    checked = 0
    for _ in range(12):
        image, targets = ds[0]
        check_targets(targets, 96)
        if len(targets) == 0:
            continue
        x1, y1, x2, y2 = red_extent(image)
        tx1, ty1, tx2, ty2 = targets[0, 1:].tolist()
        # the box encloses every red pixel (bilinear edges: 1 px slack) ...
        assert tx1 <= x1 + 1 and ty1 <= y1 + 1 and tx2 >= x2 - 1 and ty2 >= y2 - 1
        if degrees == 0.0:  # ... and without rotation it is also tight
            assert x1 <= tx1 + 1.5 and y1 <= ty1 + 1.5 and x2 >= tx2 - 1.5 and y2 >= ty2 - 1.5
        checked += 1
    assert checked >= 6


def test_boxes_cut_by_the_border_are_dropped(tmp_path):
    # translate far enough that the box usually leaves the image: never an invalid box
    s = rect_sample(tmp_path / "r.png", 64, 64, (0, 0, 12, 12))
    ds = DetectionDataset([s], 64, augment=True, **dict(NO_AUG, translate=0.5))
    torch.manual_seed(0)
    counts = []
    for _ in range(30):
        _, t = ds[0]
        check_targets(t, 64)
        counts.append(len(t))
    assert 0 in counts and 1 in counts


def test_colour_jitter_keeps_grey_and_changes_colour(tmp_path):
    s = rect_sample(tmp_path / "r.png", 64, 64, (10, 10, 40, 40))
    plain = DetectionDataset([s], 64, augment=True, **NO_AUG)[0][0]
    ds = DetectionDataset([s], 64, augment=True, **dict(NO_AUG, hsv_h=0.1, hsv_s=0.7))
    torch.manual_seed(0)
    image = ds[0][0]
    grey = image[:, 50:, 50:]
    assert (grey.max(0).values.int() - grey.min(0).values.int()).abs().max() <= 1  # still grey
    assert not torch.equal(image[:, 20, 20], plain[:, 20, 20])


def test_mosaic_holds_objects_of_four_images(tmp_path):
    # one central object per image: after the 2S-canvas cut at least a quarter of each survives
    samples = []
    for k in range(4):
        img = np.full((64, 64, 3), 40 * k, np.uint8)
        Image.fromarray(img).save(tmp_path / f"{k}.png")
        samples.append(Sample(tmp_path / f"{k}.png", np.array([[k, 0.4, 0.4, 0.6, 0.6]], np.float32), 64, 64))
    ds = DetectionDataset(samples, 64, augment=True, **dict(NO_AUG, mosaic=1.0))
    torch.manual_seed(0)
    seen = set()
    for i in range(8):
        canvas, targets, ref = ds._load_mosaic(i % 4)
        assert canvas.shape == (3, 128, 128) and len(targets) == 4 and len(ref) == 4
        assert targets[0, 0] == i % 4  # the requested image is always the first tile
        assert ((targets[:, 3] - targets[:, 1]) * (targets[:, 4] - targets[:, 2]) >= 0.25 * ref - 1e-3).all()
        seen |= set(targets[:, 0].int().tolist())
    assert seen == {0, 1, 2, 3}


def test_dense_mosaic_keeps_all_four_images_at_half_size(tmp_path):
    # DEIM's Dense O2O stitch: tiles meet at the canvas centre, the whole 2S canvas goes into S
    samples = []
    for k in range(4):
        Image.fromarray(np.full((64, 64, 3), 40 * k, np.uint8)).save(tmp_path / f"{k}.png")
        samples.append(Sample(tmp_path / f"{k}.png", np.array([[k, 0.4, 0.4, 0.6, 0.6]], np.float32), 64, 64))
    ds = DetectionDataset(samples, 64, augment=True, dense_mosaic=True, **dict(NO_AUG, mosaic=1.0))
    torch.manual_seed(0)
    for i in range(4):
        image, targets = ds[i]
        assert image.shape == (3, 64, 64) and len(targets) == 4 and targets[0, 0] == i
        want = torch.tensor([[12.8 + ox, 12.8 + oy, 19.2 + ox, 19.2 + oy]
                             for ox, oy in ((0, 0), (32, 0), (0, 32), (32, 32))])
        torch.testing.assert_close(targets[:, 1:], want, atol=1e-3, rtol=0)
    # the top-left quadrant is tile 0 at half size
    assert int(image[0, 8, 8]) == 40 * 3


def test_mosaic_warp_without_zoom_is_the_centre_crop(shapes):
    ds = DetectionDataset(shapes.train, 64, augment=True, **dict(NO_AUG, mosaic=1.0))
    torch.manual_seed(3)
    canvas, targets, ref = ds._load_mosaic(0)
    image, out = ds._transform(canvas, targets, ref, (64.0, 64.0))   # no colour jitter: NO_AUG
    crop = canvas.dense()[:, 32:96, 32:96].float()
    assert (image - crop).abs().max() <= 0.01
    kept = targets.clone()
    kept[:, 1:] = (kept[:, 1:] - 32).clamp(0, 64)
    assert all(any(torch.allclose(o, k, atol=1e-4) for k in kept) for o in out)


def test_close_mosaic(shapes, monkeypatch):
    ds = DetectionDataset(shapes.train, 64, augment=True)
    assert ds.mosaic == 1.0
    ds.close_mosaic()
    assert ds.mosaic == 0.0
    monkeypatch.setattr(ds, "_load_mosaic", lambda i: pytest.fail("mosaic after close_mosaic"))
    for i in range(4):
        check_targets(ds[i][1], 64)


def test_mixup_blends_two_samples_and_keeps_both_label_sets(tmp_path):
    """mixup=1 with nothing else on: the image is r*A + (1-r)*B (r in [0.45, 0.55]) of two letterboxed
    samples, and its targets are A's followed by B's."""
    samples = [rect_sample(tmp_path / "a.png", 64, 64, (4, 4, 30, 30), cls=0),
               rect_sample(tmp_path / "b.png", 64, 64, (34, 20, 60, 50), cls=2)]
    plain = DetectionDataset(samples, 64, augment=True, **NO_AUG)
    ref = [plain[i] for i in range(2)]
    ds = DetectionDataset(samples, 64, augment=True, **NO_AUG, mixup=1.0)
    torch.manual_seed(0)
    seen = set()
    for _ in range(12):
        image, targets = ds[0]
        j = 0 if len(targets) == 2 and targets[1, 0] == 0 else 1
        seen.add(j)
        assert torch.equal(targets, torch.cat((ref[0][1], ref[j][1])))
        a, b = ref[0][0].double(), ref[j][0].double()
        if j == 0:
            assert torch.equal(image, ref[0][0])
            continue
        d = (a - b).flatten()
        r = float(((image.double().flatten() - b.flatten()) * d).sum() / (d * d).sum())
        assert 0.45 - 0.01 <= r <= 0.55 + 0.01, r
        assert (image.double() - (r * a + (1 - r) * b)).abs().max() <= 1.0
    assert seen == {0, 1}
    ds.close_mosaic()
    assert ds.mixup == 0.0 and torch.equal(ds[0][1], ref[0][1])


@pytest.mark.parametrize("mode", ["stretch", "topleft"])
def test_detr_policy_items_are_valid_and_reproducible(shapes, mode):
    ds = DetectionDataset(shapes.train, 96, augment=True, mosaic=0.0, policy="detr", resize=mode)
    items = []
    for seed in (0, 0):
        torch.manual_seed(seed)
        items.append([ds[i] for i in range(len(ds))])
    total = 0
    for (a, ta), (b, tb) in zip(*items):
        assert a.dtype == torch.uint8 and a.shape == (3, 96, 96) and torch.equal(a, b) and torch.equal(ta, tb)
        check_targets(ta, 96)
        total += len(ta)
    assert total > 0


def test_detr_policy_boxes_follow_the_pixels(tmp_path):
    """Zoom-out, IoU crop, flip and the stretch resize move the target with the object (a white box
    on black: photometric distortion keeps it the brightest thing in the picture)."""
    img = np.zeros((90, 160, 3), np.uint8)
    img[20:60, 40:100] = 255
    Image.fromarray(img).save(tmp_path / "w.png")
    sample = Sample(tmp_path / "w.png", np.array([[3, 40 / 160, 20 / 90, 100 / 160, 60 / 90]], np.float32), 160, 90)
    ds = DetectionDataset([sample], 64, augment=True, mosaic=0.0, policy="detr", resize="stretch")
    torch.manual_seed(1)
    checked = 0
    for _ in range(30):
        image, targets = ds[0]
        if not len(targets):
            continue
        lum = image.float().mean(0)
        ys, xs = torch.nonzero(lum > (lum.max() + lum.min()) / 2, as_tuple=True)
        x1, y1, x2, y2 = targets[0, 1:].tolist()
        assert targets[0, 0] == 3
        assert abs(xs.min() - x1) <= 1.5 and abs(xs.max() + 1 - x2) <= 1.5, (xs.min(), xs.max(), x1, x2)
        assert abs(ys.min() - y1) <= 1.5 and abs(ys.max() + 1 - y2) <= 1.5, (ys.min(), ys.max(), y1, y2)
        checked += 1
    assert checked >= 20


def test_detr_policy_after_close_is_the_plain_resize(shapes):
    ds = DetectionDataset(shapes.train, 96, augment=True, mosaic=0.0, policy="detr", resize="stretch", fliplr=0.0)
    plain = DetectionDataset(shapes.train, 96, augment=False, resize="stretch")
    ds.close_mosaic()
    for i in range(4):
        a, ta = ds[i]
        b, tb = plain[i]
        assert torch.equal(a, b)
        torch.testing.assert_close(ta, tb)


def test_picklable(shapes):
    ds = DetectionDataset(shapes.train, 64, augment=True, degrees=5.0)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.imgsz == 64 and copy.degrees == 5.0 and len(copy) == len(ds)


def test_argument_checks(shapes):
    with pytest.raises(ValueError, match="scale"):
        DetectionDataset(shapes.train, 64, augment=True, scale=1.0)
    with pytest.raises(ValueError, match="mosaic"):
        DetectionDataset(shapes.train, 64, augment=True, mosaic=1.5)
    with pytest.raises(ValueError, match="policy"):
        DetectionDataset(shapes.train, 64, augment=True, policy="rtdetr")
    with pytest.raises(ValueError, match="mixup"):
        DetectionDataset(shapes.train, 64, augment=True, mixup=-0.1)


# ---- collate and DataLoader -------------------------------------------------------------------------


def test_max_targets_bucket():
    assert max_targets_bucket([0, 3, 17], 16) == 32
    assert max_targets_bucket([16], 16) == 16
    assert max_targets_bucket([0, 0], 16) == 16  # batches without objects share the smallest shape
    assert max_targets_bucket([], 8) == 8
    assert max_targets_bucket([5], 1) == 8
    assert max_targets_bucket([33, 2], 16) == 64 and max_targets_bucket([64], 16) == 64
    assert max_targets_bucket([65], 16) == 128                 # doubling: few shapes however crowded
    assert len({max_targets_bucket([n], 16) for n in range(300)}) == 6   # 16 ... 512
    with pytest.raises(ValueError):
        max_targets_bucket([1], 0)


def test_collate_pads_buckets_and_masks():
    def item(n):
        t = torch.arange(n * 5, dtype=torch.float32).reshape(n, 5) + 1
        return torch.full((3, 8, 8), n, dtype=torch.uint8), t

    batch = [item(0), item(3), item(17)]
    images, targets, mask = collate_detections(batch, bucket=16)
    assert images.shape == (3, 3, 8, 8) and images.dtype == torch.uint8
    assert targets.shape == (3, 32, 5) and targets.dtype == torch.float32
    assert mask.shape == (3, 32) and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [0, 3, 17]
    for i, (_, t) in enumerate(batch):
        n = len(t)
        assert torch.equal(targets[i, :n], t) and (targets[i, n:] == 0).all()
        assert mask[i, :n].all() and not mask[i, n:].any()
    assert collate_detections(batch[:2], bucket=4)[1].shape == (2, 4, 5)


class MosaicProbe(Dataset):
    """Reports the mosaic probability a worker sees."""

    def __init__(self, ds: DetectionDataset):
        self.ds = ds

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(self.ds.mosaic)


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_dataloader_with_workers_one_epoch(shapes):
    ds = DetectionDataset(shapes.train, 64, augment=True)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, pin_memory=True,
                        collate_fn=functools.partial(collate_detections, bucket=8))
    seen = 0
    for images, targets, mask in loader:
        assert images.shape == (4, 3, 64, 64) and images.dtype == torch.uint8
        assert targets.shape[1] % 8 == 0 and targets.shape[:2] == mask.shape
        assert (targets[~mask] == 0).all()
        seen += len(images)
    assert seen == len(ds)


def test_close_mosaic_reaches_persistent_workers(shapes):
    probe = MosaicProbe(DetectionDataset(shapes.train, 64, augment=True))
    loader = DataLoader(probe, batch_size=2, num_workers=2, persistent_workers=True)
    assert torch.cat(list(loader)).tolist() == [1.0] * 4
    probe.ds.close_mosaic()
    assert torch.cat(list(loader)).tolist() == [0.0] * 4


# ---- an image that breaks after the dataset check ---------------------------------------------------


def three_samples(tmp_path: Path) -> list[Sample]:
    return [rect_sample(tmp_path / f"{i}.png", 48, 32, (4 + 8 * i, 4, 20 + 8 * i, 20), cls=i) for i in range(3)]


@pytest.mark.parametrize("augment, policy", [(False, "yolo"), (True, "yolo"), (True, "detr")])
def test_image_corrupted_after_the_check_is_skipped_with_one_warning(tmp_path, caplog, augment, policy):
    samples = three_samples(tmp_path)
    kw = dict(NO_AUG, policy=policy) if augment else {}
    ds = DetectionDataset(samples, 48, augment=augment, **kw)
    expected = ds[2]
    samples[1].image.write_bytes(b"not an image any more")
    with caplog.at_level("WARNING", logger="libreyolo"):
        for _ in range(3):
            if policy == "detr":  # the recipe is random: compare shapes and labels only
                torch.manual_seed(0)
            image, targets = ds[1]
            assert image.shape == (3, 48, 48) and image.dtype == torch.uint8
            assert targets[:, 0].tolist() == [2.0]  # the next sample stands in, with its own labels
            if policy != "detr":
                assert torch.equal(image, expected[0]) and torch.equal(targets, expected[1])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "skipping dataset sample 1" in warnings[0] and "1.png" in warnings[0]


def test_skipped_sample_wraps_around_and_mosaic_survives(tmp_path, caplog):
    samples = three_samples(tmp_path)
    ds = DetectionDataset(samples, 48, augment=True, **dict(NO_AUG, mosaic=1.0))
    samples[2].image.unlink()   # deleted since the check: the same skip
    image, targets = ds.load_letterboxed(2)[0], ds.load_letterboxed(2)[2]
    assert torch.equal(image, ds.load_letterboxed(0)[0]) and targets[:, 0].tolist() == [0.0]
    torch.manual_seed(0)
    for i in range(3):
        img, t = ds[i]
        assert img.shape == (3, 48, 48)
        assert 2.0 not in t[:, 0].tolist()
    assert sum(r.levelname == "WARNING" for r in caplog.records) == 1


def test_no_decodable_image_left_is_a_clear_error(tmp_path):
    samples = three_samples(tmp_path)
    ds = DetectionDataset(samples, 48)
    for s in samples:
        s.image.write_bytes(b"")
    with pytest.raises(RuntimeError, match="none of the 3 images of the dataset can be decoded"):
        ds[0]


def test_undecodable_flags_are_shared_with_dataloader_workers(tmp_path, caplog):
    samples = three_samples(tmp_path)
    ds = DetectionDataset(samples, 48)
    samples[0].image.write_bytes(b"broken")
    loader = DataLoader(ds, batch_size=3, num_workers=1, collate_fn=collate_detections)
    (images, targets, mask), = list(loader)
    assert targets[0, 0, 0] == 1.0  # sample 0 was replaced by sample 1
    assert ds._undecodable.tolist() == [1, 0, 0]  # seen by the main process too: not retried


# ---- the sample is the recipe's reference arithmetic, bit for bit -----------------------------------
#
# DetectionDataset builds a sample without its padded squares or its 2S mosaic canvas, computes the
# affine grid elementwise and fills in only the part of the canvas the warp reads. The reference
# below is the recipe the plain way (letterboxed squares cropped, the canvas built, the whole canvas
# in float, the affine grid at F.affine_grid's pixel centres, torch's colour matrices): the same random draws in the same order must
# give the same bytes.


def _reference_hue(theta: float) -> torch.Tensor:
    k = torch.full((3,), 1.0 / math.sqrt(3.0), dtype=torch.float64)
    kx = torch.tensor([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]], dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.float64)
    return math.cos(theta) * eye + math.sin(theta) * kx + (1.0 - math.cos(theta)) * torch.outer(k, k)


def _reference_saturation(gain: float) -> torch.Tensor:
    luma = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    return gain * torch.eye(3, dtype=torch.float64) + (1.0 - gain) * luma.expand(3, 3)


def _uniform(lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), dtype=torch.float64))


def _reference_grid(theta: torch.Tensor, size: int) -> torch.Tensor:
    """The recipe's grid the plain way: F.affine_grid's pixel centres (its identity grid), each
    coordinate (t0 * x + t1 * y) + t2 in float32 (F.affine_grid's own matmul may fuse the
    multiply-adds, differently on different machines)."""
    base = torch.nn.functional.affine_grid(torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]),
                                           [1, 3, size, size], align_corners=False)
    x, y = base[..., 0], base[..., 1]
    return torch.stack([(theta[r, 0] * x + theta[r, 1] * y) + theta[r, 2] for r in range(2)], -1)


def _reference_warp(canvas: torch.Tensor, a: torch.Tensor, b: torch.Tensor, size: int) -> torch.Tensor:
    _, h, w = canvas.shape
    inv = torch.linalg.inv(a)
    d = torch.diag(torch.tensor([2.0 / w, 2.0 / h], dtype=torch.float64))
    half = size / 2.0
    lin = d @ inv * half
    off = d @ inv @ (torch.full((2,), half, dtype=torch.float64) - b) - 1.0
    theta = torch.cat([lin, off[:, None]], dim=1).to(torch.float32)
    grid = _reference_grid(theta, size)
    src = canvas.to(torch.float32).sub_(114.0).unsqueeze(0)
    return torch.nn.functional.grid_sample(src, grid, mode="bilinear", padding_mode="zeros",
                                           align_corners=False)[0].add_(114.0)


def _reference_mosaic(ds: DetectionDataset, index: int):
    s = ds.imgsz
    canvas = torch.full((3, 2 * s, 2 * s), 114, dtype=torch.uint8)
    if ds.dense_mosaic:
        xc = yc = s
    else:
        xc = int(torch.randint(s // 2, s + s // 2 + 1, ()))
        yc = int(torch.randint(s // 2, s + s // 2 + 1, ()))
    others = torch.randint(len(ds.samples), (3,)).tolist()
    all_targets, all_ref = [], []
    for k, i in enumerate([index, *others]):
        tile, p, targets = ds.load_letterboxed(i)   # predict's letterbox (test_letterbox_matches_predict)
        nh, nw = p.new_h, p.new_w
        tile = tile[:, p.pad_y:p.pad_y + nh, p.pad_x:p.pad_x + nw]
        targets[:, 1::2] -= p.pad_x
        targets[:, 2::2] -= p.pad_y
        x0 = xc - nw if k in (0, 2) else xc
        y0 = yc - nh if k in (0, 1) else yc
        cx0, cy0 = max(x0, 0), max(y0, 0)
        cx1, cy1 = min(x0 + nw, 2 * s), min(y0 + nh, 2 * s)
        canvas[:, cy0:cy1, cx0:cx1] = tile[:, cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0]
        if len(targets):
            all_ref.append((targets[:, 3] - targets[:, 1]) * (targets[:, 4] - targets[:, 2]))
            targets[:, 1::2] = (targets[:, 1::2] + x0).clamp_(cx0, cx1)
            targets[:, 2::2] = (targets[:, 2::2] + y0).clamp_(cy0, cy1)
            all_targets.append(targets)
    if not all_targets:
        return canvas, torch.zeros((0, 5)), torch.zeros((0,))
    return canvas, torch.cat(all_targets), torch.cat(all_ref)


def _reference_sample(ds: DetectionDataset, index: int):
    """One ``augment=True`` YOLO-recipe sample (no MixUp) the plain way."""
    s = ds.imgsz
    zoom_scale = 1.0
    if float(torch.rand(())) < ds.mosaic:
        canvas, targets, ref = _reference_mosaic(ds, index)
        center = (float(s), float(s))
        zoom_scale = 0.5 if ds.dense_mosaic else 1.0
    else:
        canvas, _, targets = ds.load_letterboxed(index)
        ref = (targets[:, 3] - targets[:, 1]) * (targets[:, 4] - targets[:, 2])
        center = (s / 2.0, s / 2.0)
    angle = math.radians(_uniform(-ds.degrees, ds.degrees)) if ds.degrees else 0.0
    zoom = (_uniform(1.0 - ds.scale, 1.0 + ds.scale) if ds.scale else 1.0) * zoom_scale
    tx = _uniform(-ds.translate, ds.translate) * s if ds.translate else 0.0
    ty = _uniform(-ds.translate, ds.translate) * s if ds.translate else 0.0
    cos, sin = math.cos(angle) * zoom, math.sin(angle) * zoom
    a = torch.tensor([[cos, -sin], [sin, cos]], dtype=torch.float64)
    b = torch.tensor([s / 2.0 + tx, s / 2.0 + ty], dtype=torch.float64) - a @ torch.tensor(center, dtype=torch.float64)
    identity = canvas.shape[-1] == s and angle == 0.0 and zoom == 1.0 and tx == 0.0 and ty == 0.0
    image = canvas.to(torch.float32) if identity else _reference_warp(canvas, a, b, s)
    if len(targets):
        xy = targets[:, [1, 2, 3, 2, 3, 4, 1, 4]].reshape(-1, 4, 2).to(torch.float64) @ a.T + b
        out = torch.cat([xy.amin(1), xy.amax(1)], dim=1).clamp_(0, s)
        w, h = out[:, 2] - out[:, 0], out[:, 3] - out[:, 1]
        kept = (w * h) / (ref.to(torch.float64) * zoom * zoom).clamp_min(1e-9)
        keep = (w >= MIN_BOX_SIDE) & (h >= MIN_BOX_SIDE) & (kept >= 0.2)
        targets = torch.cat([targets[:, :1].to(torch.float64), out], dim=1)[keep].to(torch.float32)
    else:
        targets = targets.reshape(0, 5)
    hue = _uniform(-ds.hsv_h, ds.hsv_h) * 2.0 * math.pi if ds.hsv_h else 0.0
    sat = _uniform(1.0 - ds.hsv_s, 1.0 + ds.hsv_s) if ds.hsv_s else 1.0
    val = _uniform(1.0 - ds.hsv_v, 1.0 + ds.hsv_v) if ds.hsv_v else 1.0
    if not (hue == 0.0 and sat == 1.0 and val == 1.0):
        m = val * (_reference_saturation(sat) @ _reference_hue(hue))
        image = (m.to(torch.float32) @ image.reshape(3, -1)).reshape(image.shape)
    image = image.round_().clamp_(0, 255).to(torch.uint8)
    if ds.fliplr > 0 and float(torch.rand(())) < ds.fliplr:
        image = image.flip(-1)
        if len(targets):
            x1 = s - targets[:, 3]
            targets[:, 3] = s - targets[:, 1]
            targets[:, 1] = x1
    return image.contiguous(), targets


@pytest.mark.parametrize("size", [128, 96, 160])   # images of long side 128: not resized, shrunk, enlarged
@pytest.mark.parametrize("mode", ["topleft", "center", "stretch"])
@pytest.mark.parametrize("hyp", [{}, {"degrees": 20.0, "scale": 0.9, "translate": 0.3}, {"mosaic": 0.5},
                                 {"dense_mosaic": True}, {"mosaic": 0.0, "degrees": 5.0}],
                         ids=["defaults", "wide", "half-mosaic", "dense", "solo"])
def test_sample_is_the_reference_recipe_bit_for_bit(shapes, size, mode, hyp):
    ds = DetectionDataset(shapes.train, size, augment=True, resize=mode, **hyp)
    boxes = 0
    for i in range(8):
        torch.manual_seed(500 + i)
        image, targets = ds[i]
        torch.manual_seed(500 + i)
        want_image, want = _reference_sample(ds, i)
        assert torch.equal(image, want_image), (i, (image.int() - want_image.int()).abs().max())
        assert torch.equal(targets, want), i
        boxes += len(targets)
    assert boxes > 0


@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_cached_sample_is_the_reference_recipe(shapes, tmp_path, monkeypatch, cache):
    """From cache=ram|disk the tiles are views of the cached squares: the same bytes."""
    monkeypatch.setenv("LIBREYOLO_CACHE_DIR", str(tmp_path))
    ds = DetectionDataset(shapes.train, 96, augment=True, resize="center", degrees=10.0)
    assert ds.cache_images(cache, progress=False)
    for i in range(6):
        torch.manual_seed(900 + i)
        image, targets = ds[i]
        torch.manual_seed(900 + i)
        want_image, want = _reference_sample(ds, i)
        assert torch.equal(image, want_image) and torch.equal(targets, want), i


def test_random_draws_stay_in_step_with_the_reference(shapes):
    """The generator is left where the reference leaves it: a run of samples matches throughout."""
    ds = DetectionDataset(shapes.train, 96, augment=True, mosaic=0.5, degrees=10.0)
    torch.manual_seed(7)
    got = [ds[i % len(ds)] for i in range(12)]
    torch.manual_seed(7)
    want = [_reference_sample(ds, i % len(ds)) for i in range(12)]
    for (gi, gt), (wi, wt) in zip(got, want):
        assert torch.equal(gi, wi) and torch.equal(gt, wt)


@pytest.mark.parametrize("angle, zoom, shift", [(0.0, 1.0, (0, 0)), (45.0, 0.5, (0, 0)), (30.0, 1.7, (40, -25)),
                                                (0.0, 0.4, (300, 0)), (10.0, 1.0, (-400, 0)), (0.0, 2.0, (0, 190))])
def test_warp_of_the_window_is_the_warp_of_the_whole_canvas(angle, zoom, shift):
    """Extreme affines - the whole canvas read, a corner of it, none of it (all grey) -: filling in
    only the window the warp reads gives the warp of the whole built canvas."""
    g = torch.Generator().manual_seed(3)
    s = 64
    tiles = [(torch.randint(0, 256, (3, 50, 70), dtype=torch.uint8, generator=g), 14, 0),
             (torch.randint(0, 256, (3, 64, 30), dtype=torch.uint8, generator=g), 0, 70),
             (torch.rand((3, 40, 40), generator=g).mul(255).round(), 64, 20)]   # a float tile of whole numbers
    canvas = augment_mod._Canvas(2 * s, tiles)
    r = math.radians(angle)
    a = torch.tensor([[math.cos(r), -math.sin(r)], [math.sin(r), math.cos(r)]], dtype=torch.float64) * zoom
    b = torch.tensor([s / 2.0 + shift[0], s / 2.0 + shift[1]], dtype=torch.float64) - a @ torch.tensor([64.0, 64.0],
                                                                                                        dtype=torch.float64)
    got = augment_mod._warp(canvas, a, b, s)
    assert torch.equal(got, _reference_warp(canvas.dense(), a, b, s))
    if shift == (300, 0):
        assert (got == 114).all()   # nothing of the canvas in view


@pytest.mark.parametrize("size", [64, 97, 320])
def test_affine_grid_is_the_elementwise_grid_and_f_affine_grids_to_an_ulp(size):
    g = torch.Generator().manual_seed(size)
    for _ in range(20):
        theta = (torch.rand((2, 3), generator=g) * 4 - 2).to(torch.float32)
        got = augment_mod._affine_grid(theta, size)
        assert got.shape == (1, size, size, 2) and got.dtype == torch.float32
        assert torch.equal(got, _reference_grid(theta, size))
        # F.affine_grid's batched matmul, fused multiply-adds or not: |grid| <= 6, an ulp <= 4.8e-7
        torch.testing.assert_close(got, torch.nn.functional.affine_grid(theta[None], [1, 3, size, size],
                                                                        align_corners=False), rtol=0, atol=2e-6)


def test_every_uint8_survives_the_letterbox_round_trip():
    """Why an image that needs no resize is pasted as it is: predict's letterbox divides by 255,
    the dataset multiplies back and rounds, and every value - the padding's 114 among them - comes
    back unchanged."""
    values = torch.arange(256, dtype=torch.uint8)
    hwc = values.reshape(16, 16, 1).expand(16, 16, 3).contiguous()   # all 256 values in each channel
    full = letterbox(hwc.unsqueeze(0), 16)[0].mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)
    assert torch.equal(full, hwc.permute(2, 0, 1))
    half = letterbox(hwc[:8].unsqueeze(0).contiguous(), 16)[0].mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)
    assert torch.equal(half[:, :8], hwc[:8].permute(2, 0, 1)) and (half[:, 8:] == 114).all()


@pytest.mark.parametrize("size, colour", [(600, True), (600, False), (96, True)])
def test_render_in_bands_is_the_whole_image_steps(size, colour):
    """_render (warp, colour matrix, rounding; at 600 px in bands of rows, the last one short) gives
    the bytes of those steps one after the other over the whole image."""
    g = torch.Generator().manual_seed(size)
    canvas = augment_mod._Canvas(2 * size, [(torch.randint(0, 256, (3, size, size + 40), dtype=torch.uint8,
                                                            generator=g), size // 3, size // 2)])
    assert (augment_mod._band_rows(size) < size) == (size == 600)
    r = math.radians(7.0)
    a = torch.tensor([[math.cos(r), -math.sin(r)], [math.sin(r), math.cos(r)]], dtype=torch.float64) * 0.8
    b = torch.tensor([size / 2.0, size / 2.0], dtype=torch.float64) - a @ torch.tensor([float(size)] * 2,
                                                                                      dtype=torch.float64)
    m = (torch.eye(3) * 1.1 + 0.05 * torch.rand((3, 3), generator=g)) if colour else None
    whole = _reference_warp(canvas.dense(), a, b, size)
    if m is not None:
        whole = (m @ whole.reshape(3, -1)).reshape(whole.shape)
    want = whole.round_().clamp_(0, 255).to(torch.uint8)
    assert torch.equal(augment_mod._render(canvas, a, b, size, m, False), want)


def test_detection_targets_pad_to_more_rows_as_the_collate_pads():
    from libreyolo.tasks import TASKS
    task = TASKS["detect"]
    items = [(torch.zeros(3, 8, 8, dtype=torch.uint8), torch.tensor([[1.0, 0, 0, 4, 4]] * n)) for n in (3, 20)]
    _, boxes, mask = collate_detections(items, bucket=16)
    assert task.target_rows([boxes, mask]) == 32
    _, want_boxes, want_mask = collate_detections(items, bucket=64)
    got = task.pad_target_rows([boxes, mask], 64)
    assert torch.equal(got[0], want_boxes) and torch.equal(got[1], want_mask)
    with pytest.raises(ValueError, match="cannot pad 32 target rows to 16"):
        task.pad_target_rows([boxes, mask], 16)
