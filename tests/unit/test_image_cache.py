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
    with pytest.raises(OptionError, match="cache must be ram, disk or false"):
        model.train(data=data, epochs=1, cache="gpu")
