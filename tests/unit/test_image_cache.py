"""cache=ram|disk: every image decoded and letterboxed once; samples identical to reading the files."""
import logging

import pytest
import torch

import libreyolo.data.augment as augment
from libreyolo.data.augment import DetectionDataset
from libreyolo.data.datasets import resolve_data
from libreyolo.data.synthetic import make_shapes_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return resolve_data(str(make_shapes_dataset(tmp_path_factory.mktemp("c") / "s", n_train=6, n_val=2, imgsz=64,
                                                seed=0)))


def _samples(ds, n, seed=0):
    torch.manual_seed(seed)
    return [ds[i] for i in range(n)]


@pytest.mark.parametrize("augmented", [False, True])
@pytest.mark.parametrize("mode", ["ram", "disk"])
def test_cached_samples_equal_the_files(data, tmp_path, monkeypatch, mode, augmented):
    monkeypatch.setenv("LIBREYOLO_CACHE_DIR", str(tmp_path))
    plain = DetectionDataset(data.train, 64, augment=augmented)
    cached = DetectionDataset(data.train, 64, augment=augmented)
    assert cached.cache_images(mode, progress=False)
    for (a, ta), (b, tb) in zip(_samples(plain, 6), _samples(cached, 6)):
        assert torch.equal(a, b) and torch.equal(ta, tb)
    if mode == "disk":
        files = list(tmp_path.glob("letterboxed/*/*.npy"))
        assert len(files) == 6
        # a later run reuses the files: nothing is decoded again
        monkeypatch.setattr(augment, "decode_image", lambda p: (_ for _ in ()).throw(AssertionError("decoded")))
        again = DetectionDataset(data.train, 64, augment=augmented)
        assert again.cache_images("disk", progress=False)
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(_samples(cached, 6), _samples(again, 6)))


def test_ram_cache_refused_when_memory_is_short(data, monkeypatch, caplog):
    monkeypatch.setattr(augment, "_available_memory", lambda: 1000)
    ds = DetectionDataset(data.train, 64)
    with caplog.at_level(logging.WARNING, logger="libreyolo"):
        assert not ds.cache_images("ram", progress=False)
    assert any("cache=ram needs" in m and "available" in m for m in caplog.messages)
    assert ds[0][0].shape == (3, 64, 64)


def test_trainer_cache_option(tmp_path):
    from libreyolo import LibreYOLO
    from libreyolo.options import OptionError
    model = LibreYOLO.new("yolox", "n", device="cpu", seed=0)
    data = str(make_shapes_dataset(tmp_path / "s", n_train=8, n_val=4, imgsz=64, seed=0))
    res = model.train(data=data, epochs=1, batch=4, imgsz=64, workers=0, project=str(tmp_path), cache="ram",
                      verbose=False, plots=False, warmup_epochs=0)
    assert res["epochs"] == 1
    with pytest.raises(OptionError, match="cache must be ram, disk, auto or false"):
        model.train(data=data, epochs=1, cache="gpu")


def test_auto_cache_keeps_small_sets_in_ram_with_the_same_samples(data, caplog):
    """cache="auto" (training's default): a set that fits caches in RAM - the same bytes as reading
    the files - with one info line; the fill's threads give the entries a serial fill gives."""
    plain = DetectionDataset(data.train, 64, augment=True)
    auto = DetectionDataset(data.train, 64, augment=True)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        assert auto.cache_images("auto", progress=False, threads=3)
    assert any("cache=auto: keeping 6 images at 64 px in RAM" in m for m in caplog.messages)
    serial = DetectionDataset(data.train, 64, augment=True)
    assert serial.cache_images("ram", progress=False, threads=1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(auto._cache, serial._cache))
    for (a, ta), (b, tb) in zip(_samples(plain, 6), _samples(auto, 6)):
        assert torch.equal(a, b) and torch.equal(ta, tb)


@pytest.mark.parametrize("avail", [None, 10_000, 1 << 50])
def test_auto_cache_declines_what_does_not_fit(data, monkeypatch, caplog, avail):
    """Unknown memory, a quarter of it too small, or past the 4 GiB cap: no cache, files read, info."""
    monkeypatch.setattr(augment, "_available_memory", lambda: avail)
    if avail == 1 << 50:
        monkeypatch.setattr(augment, "AUTO_CACHE_MAX_BYTES", 1000)
    ds = DetectionDataset(data.train, 64)
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        assert not ds.cache_images("auto", progress=False)
    assert ds._cache is None and any("reading the image files every epoch" in m for m in caplog.messages)


def test_trainer_auto_cache_default_and_start_method(tmp_path, monkeypatch, caplog):
    """Training caches by default (cache="auto"); not when its workers would not be forked (each
    spawned worker would get a copy), and not with cache=false."""
    from libreyolo import LibreYOLO
    from libreyolo.engine import loaders as LD
    filled = []
    real = DetectionDataset.cache_images
    monkeypatch.setattr(DetectionDataset, "cache_images",
                        lambda self, mode, **k: filled.append(mode) or real(self, mode, **k))
    model = LibreYOLO.new("yolox", "n", device="cpu", seed=0)
    data = str(make_shapes_dataset(tmp_path / "s", n_train=8, n_val=4, imgsz=64, seed=0))
    kw = dict(data=data, epochs=1, batch=4, imgsz=64, project=str(tmp_path), verbose=False, plots=False,
              warmup_epochs=0, exist_ok=True)
    model.train(workers=0, **kw)
    assert filled == ["auto", "auto"]
    filled.clear()
    model.train(workers=0, cache=False, **kw)
    assert filled == []
    monkeypatch.setattr(LD, "start_method", lambda: "spawn")
    with caplog.at_level(logging.INFO, logger="libreyolo"):
        model.train(workers=1, **kw)
    assert filled == [] and any("start by spawn" in m for m in caplog.messages)
