"""gpu_augment: the YOLO recipe on a batch of tensors (libreyolo.data.gpu_augment), run on the CPU.

The same code runs on CUDA tensors; tests/gpu/test_gpu_augment_gpu.py checks that both agree.
"""
from __future__ import annotations

import functools
import math

import pytest
import torch
from interrupt import interrupted_after_last_pt  # tests/interrupt.py
from torch.utils.data import DataLoader

import libreyolo.data.augment as augment_mod
from libreyolo.data.augment import MIN_BOX_SIDE, DetectionDataset, _areas, collate_detections, max_targets_bucket
from libreyolo.data.datasets import resolve_data
from libreyolo.data.gpu_augment import DeviceAugment, _Draw, hue_matrices, saturation_matrices
from libreyolo.data.synthetic import make_shapes_dataset

NO_AUG = dict(mosaic=0.0, degrees=0.0, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
#: rectangle colours, one per source image, and how each is recognised after resampling
COLOURS = [(230, 20, 20), (20, 230, 20), (20, 20, 230), (230, 230, 20)]


def is_colour(image: torch.Tensor, j: int) -> torch.Tensor:
    """(H, W) mask of the pixels of (3, H, W) uint8 ``image`` clearly of colour ``j``."""
    hi = torch.tensor([c > 128 for c in COLOURS[j]])[:, None, None]
    x = image.int()
    return torch.where(hi, x > 150, x < 90).all(0)


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpuaug") / "s"
    return resolve_data(make_shapes_dataset(root, n_train=12, n_val=2, imgsz=128))


def rect_batch(n: int, s: int, seed: int):
    """``n`` letterboxed-looking images (grey 60 content in a random letterbox region, 114
    padding) with one rectangle of colour ``j % 4`` each (class ``j % 4``): the batch as
    ``collate_detections`` gives it for a gpu_augment dataset."""
    g = torch.Generator().manual_seed(seed)
    images = torch.full((n, 3, s, s), 114, dtype=torch.uint8)
    targets = torch.zeros((n, 16, 5))
    mask = torch.zeros((n, 16), dtype=torch.bool)
    geometry = torch.zeros((n, 4), dtype=torch.int32)
    for j in range(n):
        nh = s if j % 2 == 0 else int(s * 0.75)
        nw = s if j % 3 else int(s * 0.6)
        py, px = (s - nh) // 2 * (j % 4 == 1), (s - nw) // 2 * (j % 4 == 1)   # some "center" letterboxes
        images[j, :, py:py + nh, px:px + nw] = 60
        w = int(torch.randint(nw // 3, nw // 2, (), generator=g))
        h = int(torch.randint(nh // 3, nh // 2, (), generator=g))
        x1 = px + int(torch.randint(4, nw - w - 4, (), generator=g))
        y1 = py + int(torch.randint(4, nh - h - 4, (), generator=g))
        images[j, :, y1:y1 + h, x1:x1 + w] = torch.tensor(COLOURS[j % 4], dtype=torch.uint8)[:, None, None]
        targets[j, 0] = torch.tensor([j % 4, x1, y1, x1 + w, y1 + h], dtype=torch.float32)
        mask[j, 0] = True
        geometry[j] = torch.tensor([nh, nw, py, px])
    return images, targets, mask, geometry


def gpu_dataset(samples, s, **hyp):
    return DetectionDataset(samples, s, augment=True, gpu_augment=True, **hyp)


class _Hyp:
    """A stand-in for the training dataset: DeviceAugment reads its options from it."""

    def __init__(self, s, **hyp):
        full = {**NO_AUG, "dense_mosaic": False, "mixup": 0.0, **hyp}
        self.imgsz, self.policy = s, "yolo"
        self.mosaic, self.mixup = full.pop("mosaic"), full.pop("mixup")
        for k, v in full.items():
            setattr(self, k, v)


# ---- parity with the CPU recipe -----------------------------------------------------------------


@pytest.mark.parametrize("resize", ["topleft", "center"])
@pytest.mark.parametrize("mosaic", [False, True])
def test_equals_the_cpu_recipe_for_the_same_random_numbers(shapes, monkeypatch, resize, mosaic):
    """Given the random numbers the CPU recipe draws (mosaic centre and partners from torch's
    generator, every range at the same fraction), the batched version gives the same image
    (within one grey level on a few pixels: the mosaic is sampled tile by tile, and the sampling
    grid is computed elementwise instead of by affine_grid) and the same boxes."""
    s, frac = 64, 0.8
    hyp = dict(mosaic=1.0 if mosaic else 0.0, degrees=12.0, translate=0.1, scale=0.4, fliplr=0.0,
               hsv_h=0.015, hsv_s=0.7, hsv_v=0.4)
    cpu = DetectionDataset(shapes.train, s, augment=True, resize=resize, **hyp)
    dev = gpu_dataset(shapes.train, s, resize=resize, **hyp)
    batch = collate_detections([dev[i] for i in range(len(dev))])
    aug = DeviceAugment(dev)
    monkeypatch.setattr(augment_mod, "_uniform", lambda lo, hi: lo + frac * (hi - lo))
    n = len(dev)
    for i in (0, 3, 7):
        torch.manual_seed(100 + i)
        if mosaic:
            canvas, targets, ref = cpu._load_mosaic(i)
            centre = (float(s), float(s))
        else:
            canvas, _, targets = cpu.load_letterboxed(i)
            ref, centre = _areas(targets), (s / 2.0, s / 2.0)
        image, want = cpu._transform(canvas, targets, ref, centre)   # the affine, colour, rounding
        # the same draws for sample i of the batched version (the batch is the whole dataset)
        torch.manual_seed(100 + i)
        xc, yc = int(torch.randint(s // 2, s + s // 2 + 1, ())), int(torch.randint(s // 2, s + s // 2 + 1, ()))
        others = torch.randint(n, (3,))
        u = torch.full((n, 9), frac, dtype=torch.float64)
        u[:, 0] = 0.0 if mosaic else 0.999   # mosaic or not
        u[:, 8] = 0.999                      # no flip
        centre_t = torch.tensor([[xc, yc]]).expand(n, 2)
        src = torch.cat([torch.arange(n)[:, None], others.expand(n, 3)], 1)
        got, boxes, keep = aug._pass(*batch, _Draw(aug, u, centre_t, src))
        diff = (got[i].int() - image.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, (diff.max(), (diff > 0).float().mean())
        out = boxes[i][keep[i]]
        assert len(out) == len(want) and len(want) > 0
        torch.testing.assert_close(out, want, atol=1e-3, rtol=0)


@pytest.mark.parametrize("resize", ["topleft", "center"])
def test_equals_the_cpu_recipe_for_random_numbers(shapes, monkeypatch, resize):
    """As above with each sample's own random numbers - mosaic or not, every range at its own
    fraction, flipped or not -: the same boxes (the same ones kept) and the image within one grey
    level, so the device recipe is the CPU recipe but for where its numbers come from."""
    s = 64
    hyp = dict(mosaic=0.5, degrees=10.0, translate=0.1, scale=0.5, fliplr=0.5, hsv_h=0.015, hsv_s=0.7, hsv_v=0.4)
    cpu = DetectionDataset(shapes.train, s, augment=True, resize=resize, **hyp)
    dev = gpu_dataset(shapes.train, s, resize=resize, **hyp)
    batch = collate_detections([dev[i] for i in range(len(dev))])
    aug = DeviceAugment(dev)
    n, kinds = len(dev), set()
    for trial in range(16):
        i = trial % n
        u = torch.rand(9, generator=torch.Generator().manual_seed(trial), dtype=torch.float64)
        fractions = iter(u[1:8].tolist())   # angle, zoom, tx, ty, hue, saturation, value: _Draw's columns
        monkeypatch.setattr(augment_mod, "_uniform", lambda lo, hi: lo + next(fractions) * (hi - lo))
        mosaic, flip = bool(u[0] < 0.5), bool(u[8] < 0.5)
        kinds.add((mosaic, flip))
        torch.manual_seed(trial)
        if mosaic:
            canvas, targets, ref = cpu._load_mosaic(i)
            centre = (float(s), float(s))
            torch.manual_seed(trial)   # its centre and partners, drawn again
            xc, yc = int(torch.randint(s // 2, s + s // 2 + 1, ())), int(torch.randint(s // 2, s + s // 2 + 1, ()))
            others = torch.randint(n, (3,))
        else:
            canvas, _, targets = cpu.load_letterboxed(i)
            ref, centre = _areas(targets), (s / 2.0, s / 2.0)
            xc = yc = 0
            others = torch.zeros(3, dtype=torch.long)
        image, want = cpu._transform(canvas, targets, ref, centre)
        if flip:   # _augmented's flip
            image = image.flip(-1)
            want = torch.stack([want[:, 0], s - want[:, 3], want[:, 2], s - want[:, 1], want[:, 4]], 1)
        rows = torch.full((n, 9), 0.999, dtype=torch.float64)
        rows[i] = u
        src = torch.cat([torch.arange(n)[:, None], others.expand(n, 3)], 1)
        got, boxes, keep = aug._pass(*batch, _Draw(aug, rows, torch.tensor([[xc, yc]]).expand(n, 2), src))
        diff = (got[i].int() - image.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-2, (trial, diff.max(), (diff > 0).float().mean())
        out = boxes[i][keep[i]]
        assert len(out) == len(want), (trial, len(out), len(want))
        torch.testing.assert_close(out, want, atol=1e-3, rtol=0)
    assert len(kinds) == 4   # mosaic or not, flipped or not: each was compared


def test_flip_alone_equals_the_cpu_flip(shapes):
    """Flip only (probability 1): the letterboxed image mirrored exactly, boxes mirrored."""
    s = 64
    cpu = DetectionDataset(shapes.train, s, augment=True, **{**NO_AUG, "fliplr": 1.0})
    dev = gpu_dataset(shapes.train, s, **{**NO_AUG, "fliplr": 1.0})
    aug = DeviceAugment(dev)
    aug.seed(0, 0)
    images, targets, mask = aug(*collate_detections([dev[i] for i in range(4)]))
    for i in range(4):
        want_img, want = cpu[i]
        assert torch.equal(images[i], want_img)
        torch.testing.assert_close(targets[i][mask[i]], want, atol=1e-4, rtol=0)


def test_colour_matrices_are_the_cpu_recipes():
    hue = torch.tensor([-0.3, 0.0, 0.05, 1.0], dtype=torch.float64)
    sat = torch.tensor([0.3, 1.0, 1.2, 1.7], dtype=torch.float64)
    for k in range(4):
        torch.testing.assert_close(hue_matrices(hue)[k], augment_mod._hue_matrix(float(hue[k])))
        torch.testing.assert_close(saturation_matrices(sat)[k], augment_mod._saturation_matrix(float(sat[k])))


# ---- boxes follow the image -------------------------------------------------------------------------


@pytest.mark.parametrize("dense", [False, True])
def test_boxes_follow_the_rectangles(dense):
    """Each source image holds one filled rectangle of its own colour; through mosaic (and not),
    rotation, zoom, translation, clipping and flips, every output box bounds the pixels of its
    rectangle (IoU with the colour mask's bounding box), and no rectangle is left without a box -
    with mosaic partners from the earlier batches of the pool too."""
    s, scale = 96, 0.3
    aug = DeviceAugment(_Hyp(s, mosaic=0.6, degrees=10.0, translate=0.1, scale=scale, fliplr=0.5,
                             dense_mosaic=dense))
    checked = 0
    batches = [rect_batch(4, s, seed) for seed in range(6)]
    area = max(float(((t[:, 0, 3] - t[:, 0, 1]) * (t[:, 0, 4] - t[:, 0, 2])).max()) for _, t, _, _ in batches)
    aug.seed(0, 0)   # once: later batches draw partners from the earlier ones too (the pool)
    for seed, batch in enumerate(batches):
        images, targets, mask = aug(*batch)
        for i in range(4):
            covered = torch.zeros((4, s, s), dtype=torch.bool)
            for cls, x1, y1, x2, y2 in targets[i][mask[i]].tolist():
                j = int(cls)
                a, b = max(0, int(x1) - 2), max(0, int(y1) - 2)
                c, d = min(s, int(math.ceil(x2)) + 2), min(s, int(math.ceil(y2)) + 2)
                covered[j, b:d, a:c] = True
                region = is_colour(images[i, :, b:d, a:c], j)
                assert region.any(), "a box without its object"
                ys, xs = torch.nonzero(region, as_tuple=True)
                mx1, my1, mx2, my2 = a + int(xs.min()), b + int(ys.min()), a + int(xs.max()) + 1, b + int(ys.max()) + 1
                iw = max(0.0, min(x2, mx2) - max(x1, mx1))
                ih = max(0.0, min(y2, my2) - max(y1, my1))
                inter = iw * ih
                iou = inter / ((x2 - x1) * (y2 - y1) + (mx2 - mx1) * (my2 - my1) - inter)
                assert iou > 0.7, (seed, i, iou, (x1, y1, x2, y2), (mx1, my1, mx2, my2))
                checked += 1
            for j in range(4):   # pixels of a rectangle outside every box of its class: a dropped box
                stray = int((is_colour(images[i], j) & ~covered[j]).sum())
                assert stray <= MIN_AREA_SLACK * float(area) * (1 + scale) ** 2, (seed, i, j, stray)
    assert checked >= 30


#: a box is dropped when it keeps less than 20% of its area: what it leaves visible is less than that
MIN_AREA_SLACK = 0.2


# ---- mosaic partners ----------------------------------------------------------------------------------


def _distinct_images_per_batch(batches, s, n_images):
    """Per output batch: how many distinct source images it shows. Each image's one target is
    its whole picture with class = the image's index, so the kept classes name the images."""
    out = []
    for _images, targets, mask in batches:
        ids = targets[..., 0][mask].long()
        assert ids.min() >= 0 and ids.max() < n_images
        out.append(len(torch.unique(ids)))
    return out


def _whole_image_samples(shapes, n):
    """``n`` samples over the fixture's images, each with one box - its whole picture - of class
    = its index."""
    import numpy as np

    from libreyolo.data.datasets import Sample
    base = shapes.train
    return [Sample(base[i % len(base)].image, np.array([[i, 0.0, 0.0, 1.0, 1.0]], dtype=np.float32),
                   base[i % len(base)].width, base[i % len(base)].height) for i in range(n)]


def test_mosaic_partners_are_about_as_diverse_as_the_cpu_recipes(shapes):
    """The CPU recipe draws each mosaic's three partners from the whole dataset: a batch of 16
    mosaics shows about 16 + 48 distinct images. Partners drawn from the batch alone would show
    16 (a quarter of the diversity per step); the pool of earlier batches brings the device
    recipe within 15% of the CPU recipe's count once it holds POOL_IMAGES images (from the 9th
    batch of an epoch at batch 16), and above the batch-local count from the 2nd batch on. Dense
    mosaics (the whole 2S canvas shrunk into S) keep every tile's box, so the boxes' classes name
    every tile's image."""
    from libreyolo.data.gpu_augment import POOL_IMAGES
    s, n, b = 32, 256, 16
    samples = _whole_image_samples(shapes, n)
    hyp = dict(NO_AUG, mosaic=1.0, dense_mosaic=True)
    col = functools.partial(collate_detections, bucket=16)
    torch.manual_seed(0)
    cpu = _distinct_images_per_batch(
        DataLoader(DetectionDataset(samples, s, augment=True, **hyp), batch_size=b, shuffle=True, collate_fn=col),
        s, n)
    dev_set = gpu_dataset(samples, s, **hyp)
    loader = DataLoader(dev_set, batch_size=b, shuffle=True, collate_fn=col,
                        generator=torch.Generator().manual_seed(0))
    for pool, name in ((POOL_IMAGES, "pooled"), (0, "batch-local")):
        aug = DeviceAugment(dev_set, pool=pool)
        aug.seed(0, 0)
        got = _distinct_images_per_batch((aug(*raw) for raw in loader), s, n)
        if name == "batch-local":
            assert max(got) <= b, got
            continue
        full = POOL_IMAGES // b   # batches before the pool is full
        steady = sum(got[full:]) / len(got[full:])
        want = sum(cpu) / len(cpu)
        assert want > 3 * b, cpu   # the CPU recipe's diversity, about 16 + 48 draws from 256 images
        assert steady >= 0.85 * want, (steady, want, got)
        assert got[0] <= b and min(got[1:]) > b, got   # the epoch's first batch has no earlier batches
        assert len(aug._earlier) == full   # the pool keeps only as many batches as it needs


def test_the_pool_starts_empty_every_epoch():
    """seed() forgets the earlier batches: a batch right after seed() is augmented as by a fresh
    DeviceAugment (what a resumed run does at its first epoch), and earlier batches change it."""
    hyp = dict(mosaic=1.0, degrees=5.0, translate=0.1, scale=0.5, fliplr=0.5, mixup=0.5)
    first, second = rect_batch(8, 48, 0), rect_batch(8, 48, 1)
    fresh = DeviceAugment(_Hyp(48, **hyp))
    fresh.seed(3, 0)
    alone = fresh(*second)
    used = DeviceAugment(_Hyp(48, **hyp))
    used.seed(3, 1)
    used(*first)
    used.seed(3, 0)
    again = used(*second)
    assert all(torch.equal(x, y) for x, y in zip(again, alone))
    # the same random numbers as ``alone``, but the first batch in the pool: partners drawn from 16 images
    used.seed(3, 0)
    state = used.generator.get_state()
    used(*first)
    used.generator.set_state(state)
    pooled = used(*second)
    assert not torch.equal(pooled[0], alone[0])


# ---- randomness ------------------------------------------------------------------------------------


def test_seeded_runs_repeat_and_epochs_differ():
    aug = DeviceAugment(_Hyp(64, mosaic=0.5, degrees=5.0, translate=0.1, scale=0.5, fliplr=0.5, hsv_h=0.015,
                             hsv_s=0.7, hsv_v=0.4, mixup=0.3))
    batch = rect_batch(6, 64, 0)
    runs = []
    for epoch in (0, 1, 0):
        aug.seed(7, epoch)
        runs.append([aug(*batch) for _ in range(2)])
    for a, b in zip(runs[0], runs[2]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(runs[0][0][0], runs[1][0][0])
    assert not torch.equal(runs[0][0][0], runs[0][1][0])   # the stream moves on within an epoch


def test_random_parameters_follow_the_options():
    s, n = 64, 4000
    aug = DeviceAugment(_Hyp(s, mosaic=0.7, degrees=10.0, translate=0.1, scale=0.5, fliplr=0.5, hsv_h=0.015,
                             hsv_s=0.7, hsv_v=0.4))
    aug.seed(0, 0)
    d = _Draw.sample(aug, torch.arange(n))
    assert abs(d.flip.float().mean() - 0.5) < 0.03 and abs(d.mosaic.float().mean() - 0.7) < 0.03
    assert d.zoom.min() >= 0.5 and d.zoom.max() <= 1.5 and abs(d.zoom.mean() - 1.0) < 0.02
    angle = torch.rad2deg(torch.atan2(d.a[:, 1, 0], d.a[:, 0, 0]))
    assert angle.abs().max() <= 10.0 + 1e-9 and angle.abs().max() > 9.5 and abs(angle.mean()) < 0.5
    assert d.centre.min() >= s // 2 and d.centre.max() <= s + s // 2
    assert torch.equal(d.src[:, 0], torch.arange(n)) and d.src.max() == n - 1 and d.src.min() == 0
    # the translation: where the canvas centre lands, relative to the output's centre
    c = torch.where(d.mosaic[:, None], torch.tensor([float(s)] * 2, dtype=torch.float64),
                    torch.tensor([s / 2.0] * 2, dtype=torch.float64))
    t = (d.a @ c[:, :, None])[..., 0] + d.b - s / 2.0
    assert t.abs().max() <= 0.1 * s + 1e-9 and t.abs().max() > 0.09 * s
    off = DeviceAugment(_Hyp(s, mosaic=0.0, fliplr=0.0))
    d = _Draw.sample(off, torch.arange(100))
    assert not d.mosaic.any() and not d.flip.any() and torch.equal(d.zoom, torch.ones(100, dtype=torch.float64))


def test_flip_rate_in_the_images():
    """Half-red images through flip alone: about half come out mirrored, boxes with them."""
    s, n = 16, 400
    images = torch.full((n, 3, s, s), 60, dtype=torch.uint8)
    images[:, 0, :, : s // 2] = 230
    targets = torch.zeros((n, 16, 5))
    targets[:, 0] = torch.tensor([0.0, 0.0, 0.0, s / 2, s])
    mask = torch.zeros((n, 16), dtype=torch.bool)
    mask[:, 0] = True
    geometry = torch.tensor([s, s, 0, 0], dtype=torch.int32).expand(n, 4)
    aug = DeviceAugment(_Hyp(s, fliplr=0.5))
    aug.seed(1, 0)
    out, t, k = aug(images, targets, mask, geometry)
    flipped = out[:, 0, 0, -1] == 230
    assert torch.equal(out[flipped], images[flipped].flip(-1)) and torch.equal(out[~flipped], images[~flipped])
    assert abs(flipped.float().mean() - 0.5) < 0.07
    assert torch.equal(t[:, 0, 1] == s / 2, flipped) and k[:, 0].all()


def test_grey_stays_grey():
    """The colour jitter turns no grey (the padding) into a colour: a rotation about the grey
    axis and a blend with luma keep r = g = b."""
    s = 32
    aug = DeviceAugment(_Hyp(s, mosaic=0.5, degrees=20.0, scale=0.5, hsv_h=0.5, hsv_s=0.9, hsv_v=0.5))
    images = torch.full((4, 3, s, s), 114, dtype=torch.uint8)
    images[:, :, 8:20, 4:30] = 77
    aug.seed(0, 0)
    out, _, _ = aug(images, torch.zeros((4, 16, 5)), torch.zeros((4, 16), dtype=torch.bool),
                    torch.tensor([s, s, 0, 0], dtype=torch.int32).expand(4, 4))
    spread = out.int().amax(1) - out.int().amin(1)
    assert spread.max() <= 1


# ---- the batch the loss sees --------------------------------------------------------------------


def test_output_format_is_the_cpu_pipelines(shapes):
    """Same tuple, dtypes and shapes as the CPU recipe's collate; targets padded to the bucketed
    kept count with zero rows; every kept box inside the image and wide enough."""
    s, bucket = 64, 8
    hyp = dict(mosaic=1.0, degrees=5.0, mixup=0.5)
    cpu = next(iter(DataLoader(DetectionDataset(shapes.train, s, augment=True, **hyp), batch_size=6,
                               collate_fn=lambda b: collate_detections(b, bucket=bucket))))
    dev_set = gpu_dataset(shapes.train, s, **hyp)
    raw = next(iter(DataLoader(dev_set, batch_size=6, collate_fn=lambda b: collate_detections(b, bucket=bucket))))
    assert len(raw) == 4 and raw[3].dtype == torch.int32 and raw[3].shape == (6, 4)
    aug = DeviceAugment(dev_set, bucket=bucket)
    aug.seed(0, 0)
    out = aug(*raw)
    assert len(out) == len(cpu) == 3
    for a, b in zip(out, cpu):
        assert a.dtype == b.dtype and a.shape[0] == b.shape[0] and a.shape[2:] == b.shape[2:] and a.is_contiguous()
    images, targets, mask = out
    assert images.shape == (6, 3, s, s)
    counts = mask.sum(1)
    assert targets.shape[1] == max_targets_bucket(counts.tolist(), bucket) == mask.shape[1]
    assert torch.equal(mask, torch.arange(mask.shape[1])[None] < counts[:, None])   # kept rows first
    assert (targets[~mask] == 0).all()
    kept = targets[mask]
    assert (kept[:, 1:] >= 0).all() and (kept[:, 1:] <= s).all()
    assert (kept[:, 3] - kept[:, 1] >= MIN_BOX_SIDE).all() and (kept[:, 4] - kept[:, 2] >= MIN_BOX_SIDE).all()
    assert (kept[:, 0] == kept[:, 0].round()).all() and kept[:, 0].max() < 5


def test_close_mosaic_reaches_the_device_recipe(shapes):
    dev_set = gpu_dataset(shapes.train, 64, mosaic=1.0, mixup=1.0)
    aug = DeviceAugment(dev_set)
    aug.seed(0, 0)
    raw = collate_detections([dev_set[i] for i in range(4)])
    d = _Draw.sample(aug, torch.arange(4))
    assert d.mosaic.all() and aug.mixup == 1.0
    dev_set.close_mosaic()
    assert not _Draw.sample(aug, torch.arange(4)).mosaic.any() and aug.mixup == 0.0
    assert aug(*raw)[0].shape == (4, 3, 64, 64)


def test_bad_combinations_are_refused(shapes):
    from libreyolo.cli import TRAIN, _parse
    from libreyolo.options import OptionError
    from libreyolo.tasks.detect.task import DetectOptions
    with pytest.raises(ValueError, match="gpu_augment"):
        DetectionDataset(shapes.train, 64, augment=False, gpu_augment=True)
    with pytest.raises(ValueError, match="gpu_augment"):
        DetectionDataset(shapes.train, 64, augment=True, policy="detr", gpu_augment=True)
    with pytest.raises(OptionError, match="gpu_augment=True .* augment_policy='detr'"):
        DetectOptions(gpu_augment=True, augment_policy="detr").check()
    o = DetectOptions(gpu_augment="true")
    o.check()
    assert o.gpu_augment is True
    assert _parse(["--gpu-augment"], TRAIN, "train")["gpu_augment"] is True
    default = _parse([], TRAIN, "train")
    assert default["gpu_augment"] is False and "gpu_augment" not in default.given   # not passed: the API's


# ---- in the trainer --------------------------------------------------------------------------------


def test_trainer_runs_the_device_recipe_and_learns(tmp_path, monkeypatch):
    """Two epochs with gpu_augment=True on the CPU: the loader yields raw batches (four items), the
    trainer augments every one of them where it reaches the device, and the loss of a fixed
    augmented batch falls. (The epoch means of so short a run follow the batch composition and
    the assigner - more positives as predictions sharpen - more than the learning: see
    test_trainer.py's note; the fixed batch measures the weights alone.)"""
    from libreyolo import LibreYOLO
    data = str(make_shapes_dataset(tmp_path / "ds", n_train=64, n_val=4, imgsz=96, seed=0))
    ds = gpu_dataset(resolve_data(data).train, 96)
    fixed_aug = DeviceAugment(ds)
    fixed_aug.seed(123, 0)
    fixed = fixed_aug(*collate_detections([ds[i] for i in range(16)]))

    def fixed_loss(m):
        net, loss_fn = m.model.train(), m.build_loss()
        with torch.no_grad():
            out = m.train_forward(net, m.preprocess.normalize(fixed[0].float().div(255)), *fixed[1:])
            return float(loss_fn(out, *fixed[1:])[0])

    calls, seeds = [], []
    real, real_seed = DeviceAugment.__call__, DeviceAugment.seed

    def counted(self, *batch):
        calls.append(len(batch))
        return real(self, *batch)

    def seeded(self, seed, epoch, rank=0):
        seeds.append((seed, epoch))
        return real_seed(self, seed, epoch, rank)

    monkeypatch.setattr(DeviceAugment, "__call__", counted)
    monkeypatch.setattr(DeviceAugment, "seed", seeded)
    model = LibreYOLO.new("yolo9", "t", nc=5, device="cpu", seed=0)
    before = fixed_loss(model)
    res = model.train(data=data, epochs=2, batch=8, imgsz=96, workers=0, project=str(tmp_path), name="run",
                      close_mosaic=0, warmup_epochs=0.5, nbs=8, verbose=False, seed=0, gpu_augment=True,
                      val=False, plots=False, optimizer="AdamW", lr0=0.002)
    assert calls == [4] * 16 and res["epochs"] == 2 and seeds == [(0, 0), (0, 1)]   # re-seeded per epoch
    assert all(math.isfinite(v) for epoch in res["losses"] for v in epoch), res["losses"]
    after = fixed_loss(model)
    assert after < 0.95 * before, (before, after)


@pytest.mark.slow   # three short runs (~15 s); the per-epoch seeding itself is checked in the test above
def test_resumed_run_augments_as_an_uninterrupted_one(tmp_path, monkeypatch):
    """The device recipe is re-seeded from (seed, epoch) at every epoch: a gpu_augment run
    interrupted after epoch 1 and resumed ends with the weights of an uninterrupted one."""
    from libreyolo import LibreYOLO
    from libreyolo.weights import load_checkpoint
    data = str(make_shapes_dataset(tmp_path / "ds", n_train=8, n_val=2, imgsz=64, seed=0))
    args = dict(data=data, epochs=2, batch=4, imgsz=64, workers=0, name="run", close_mosaic=0, warmup_epochs=1,
                verbose=False, seed=0, nbs=4, gpu_augment=True, mixup=0.5, val=False, plots=False)
    LibreYOLO.new("yolo9", "t", device="cpu", seed=0).train(project=str(tmp_path / "a"), **args)
    with interrupted_after_last_pt(monkeypatch):
        LibreYOLO.new("yolo9", "t", device="cpu", seed=0).train(project=str(tmp_path / "b"), **args)
    LibreYOLO.new("yolo9", "t", device="cpu", seed=0).train(project=str(tmp_path / "b"), resume=True, **args)
    a = load_checkpoint(tmp_path / "a" / "run" / "weights" / "last.pt")["train_state"]["model_raw"]
    b = load_checkpoint(tmp_path / "b" / "run" / "weights" / "last.pt")["train_state"]["model_raw"]
    for k, v in a.items():
        assert torch.allclose(v.float(), b[k].float(), atol=1e-6), k


def test_cached_images_feed_the_device_recipe(shapes):
    """cache=ram: the workers' samples (letterboxed image, targets, geometry) come from the cache,
    equal to decoding the files."""
    plain = gpu_dataset(shapes.train, 64, resize="center")
    cached = gpu_dataset(shapes.train, 64, resize="center")
    assert cached.cache_images("ram", progress=False)
    for i in range(len(plain)):
        assert all(torch.equal(a, b) for a, b in zip(plain[i], cached[i]))
