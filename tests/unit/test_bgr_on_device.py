"""BGR arrays reordered on the device (Predictor.bgr_on_device, SourceItem.bgr, staging.reorder_bgr).

On CUDA a BGR uint8 frame (OpenCV's) is uploaded as it is and its channels are flipped on the
device before the stage; the host makes the RGB copy the Results keep while the device works.
Here the same way is forced on the CPU (``bgr_on_device = True``) and compared with the host's
reorder at load time (``False``): the same Results bit for bit - boxes, probabilities,
``orig_img`` - for every loop (per-image uploads, staged chunks, the stand-in graph's uint8
stage, the repeat path) and for chunks mixing BGR arrays with other sources, and the caller's
array is never written.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from standin import StandInCapturer

from libreyolo import LibreYOLO
from libreyolo.data.sources import SourceItem
from libreyolo.engine.staging import Chunk, reorder_bgr
from libreyolo.engine.verify import input_sensitive

SIZE = 64


@pytest.fixture(scope="module")
def detector():
    m = input_sensitive(LibreYOLO.new("yolox", "n", device="cpu", seed=0))
    m._warned_untrained = True
    return m


@pytest.fixture(scope="module")
def classifier():
    m = LibreYOLO.new("resnet", "18", nc=10, imgsz=32, device="cpu", seed=0)
    m._warned_untrained = True
    return m


def frames(n: int, shapes=((48, 64),)) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.integers(0, 256, (*shapes[i % len(shapes)], 3), dtype=np.uint8) for i in range(n)]


def both_ways(m, source, **kw):
    """(device reorder, host reorder) Results of the same call; the caller's arrays unchanged."""
    p = m.get_predictor()
    arrays = [a for a in (source if isinstance(source, list) else [source]) if isinstance(a, np.ndarray)]
    kept = [a.copy() for a in arrays]
    out = []
    for on in (True, False):
        p.bgr_on_device = on
        try:
            out.append(m.predict(source, **kw))
        finally:
            p.bgr_on_device = None
    for a, k in zip(arrays, kept):
        assert np.array_equal(a, k)
    return out


def same_boxes(a, b) -> None:
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert torch.equal(x.boxes.data, y.boxes.data)
        assert np.array_equal(x.orig_img, y.orig_img) and x.orig_img.flags.c_contiguous
        assert x.orig_shape == y.orig_shape and x.path == y.path
    assert any(len(x) > 0 for x in a)


@pytest.mark.parametrize("batch", [1, 3])
def test_detector_results_equal_the_host_reorder(detector, batch):
    src = frames(5, shapes=((48, 64), (40, 40)))   # staged chunks, some of mixed sizes
    dev, host = both_ways(detector, src, imgsz=SIZE, batch=batch, conf=0.01)
    same_boxes(dev, host)
    # orig_img is the RGB image: the array's channels reversed
    assert np.array_equal(dev[0].orig_img, src[0][:, :, ::-1])


def test_mixed_sources_in_one_chunk(detector):
    a, b, c = frames(3)
    pil = Image.fromarray(b)   # RGB already: not reordered
    src = [a, pil, c, np.ascontiguousarray(b[:, :, ::-1])]   # the last: b given as BGR
    dev, host = both_ways(detector, src, imgsz=SIZE, batch=4, conf=0.01)
    same_boxes(dev, host)
    assert torch.equal(dev[1].boxes.data, dev[3].boxes.data)   # the same picture both ways
    dev, host = both_ways(detector, src, imgsz=SIZE, batch=4, conf=0.01, bgr=False)   # RGB arrays: borrowed
    same_boxes(dev, host)


def test_graph_stage_and_repeat_path(classifier):
    m = classifier
    m.runner.capturer = StandInCapturer()
    p = m.get_predictor()
    try:
        for im in frames(4):   # the second sight of the size: the uint8 stage, then repeats
            dev, host = both_ways(m, im, cuda_graph=True)
            assert torch.equal(dev.probs.data, host.probs.data)
            assert np.array_equal(dev.orig_img, host.orig_img)
        assert p.repeats > 0 and m.runner.capturer.captures
    finally:
        m.runner.capturer = None
        m.release_graphs()


def test_reorder_bgr_flips_only_the_bgr_items():
    imgs = [torch.arange(24, dtype=torch.uint8).reshape(2, 4, 3) + 30 * i for i in range(3)]
    items = [SourceItem(f"i{i}", imgs[i].numpy(), borrowed=True, bgr=i != 1) for i in range(3)]
    batch = torch.stack(imgs)
    ch = Chunk(items, list(batch.unbind(0)), batch)
    reorder_bgr(ch)
    assert ch.batch is None   # a partial flip: the stage stacks the images again
    for i in range(3):
        assert torch.equal(ch.images[i], imgs[i].flip(-1) if i != 1 else imgs[i])
    items = [SourceItem(f"i{i}", imgs[i].numpy(), borrowed=True, bgr=True) for i in range(3)]
    ch = Chunk(items, list(batch.unbind(0)), batch)
    reorder_bgr(ch)
    assert torch.equal(ch.batch, batch.flip(-1))
    assert all(torch.equal(a, b) for a, b in zip(ch.images, ch.batch.unbind(0)))
    assert torch.equal(batch, torch.stack(imgs))   # the uploaded buffer itself is not written
