"""predict's tiling=True (sliced inference) and augment=True (test-time augmentation):
libreyolo.engine.sliced through the real predictor."""
import numpy as np
import pytest
import torch
from standin import StandInCapturer

from libreyolo import LibreYOLO
from libreyolo.engine import sliced
from libreyolo.engine.verify import input_sensitive
from libreyolo.options import OptionError
from libreyolo.results import Results

SIZE = 64


@pytest.fixture(scope="module")
def net():
    """A small detector whose every output depends on the input (random weights, re-drawn)."""
    return input_sensitive(LibreYOLO.new("yolox", "n", nc=3, device="cpu", seed=0))


@pytest.fixture(scope="module")
def picture():
    return np.random.default_rng(0).integers(0, 256, (48, 60, 3), dtype=np.uint8)


def white_box_detector(x: torch.Tensor):
    """A stand-in network: one candidate per input, the box (canvas pixels) around its white
    pixels, scored by the box's area (0 without any): exact boxes, so the tiles' mapping back
    can be checked to the pixel."""
    white = (x > 0.98).all(1)                       # (B, S, S)
    s = white.shape[-1]
    idx = torch.arange(s)
    cols, rows = white.any(1), white.any(2)          # (B, S): x, y
    x1 = torch.where(cols, idx, s).min(1).values
    x2 = torch.where(cols, idx + 1, 0).max(1).values
    y1 = torch.where(rows, idx, s).min(1).values
    y2 = torch.where(rows, idx + 1, 0).max(1).values
    area = ((x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)).float()
    boxes = torch.stack([x1, y1, x2, y2], 1).float()[:, None]
    return boxes, (area / (area + 100))[:, None], torch.zeros(x.shape[0], 1, dtype=torch.long)


@pytest.fixture
def oracle(monkeypatch):
    m = LibreYOLO.new("yolo9", "t", nc=3, device="cpu", seed=0)
    monkeypatch.setattr(m, "infer", white_box_detector)
    m.trained = True   # no untrained-model warning
    return m


def scene():
    """A 200x300 black image with one white 30x10 object at x 30..60, y 20..30. Tiles of 64 px,
    overlap 0.25 (step 48): the tile at x=0 holds it whole, the one at x=48 its right 40%."""
    img = np.zeros((200, 300, 3), np.uint8)
    img[20:30, 30:60] = 255
    return img


def test_a_small_object_is_found_whole_by_tiling(oracle):
    img = scene()
    plain = oracle(img, imgsz=SIZE)
    tiled = oracle(img, imgsz=SIZE, tiling=True, overlap_ratio=0.25)
    # the tile holding the object sees it at its own scale: the exact box, scored higher than the
    # whole image shrunk to 64 px gives it; the cut copy in the next tile and the full pass's
    # coarse box are merged away (IoS)
    assert isinstance(tiled, Results) and tiled.orig_shape == (200, 300)
    assert torch.equal(tiled.boxes.data, torch.tensor([[30.0, 20.0, 60.0, 30.0, 0.75, 0.0]]))
    assert len(plain.boxes) <= 1 and (len(plain.boxes) == 0 or float(plain.boxes.conf[0]) < 0.5)
    # merged by IoU instead, the cut copy (IoU 0.4 with the whole box) stays
    iou = oracle(img, imgsz=SIZE, tiling=True, overlap_ratio=0.25, tile_full=False, tile_merge="iou")
    assert iou.boxes.data[:, :4].tolist() == [[30.0, 20.0, 60.0, 30.0], [48.0, 20.0, 60.0, 30.0]]
    # tiles of 48 px, each enlarged to 64: the box found in the tile at x=24 mapped back (to within
    # the pixel the bilinear enlargement blurs), the cut copies merged away
    up = oracle(img, imgsz=SIZE, tiling=True, tile=48, overlap_ratio=0.5, tile_full=False)
    assert len(up.boxes) == 1
    assert (up.boxes.xyxy[0] - torch.tensor([30.0, 20.0, 60.0, 30.0])).abs().max() <= 1.0


def test_tile_batches_go_through_one_captured_stage(oracle):
    img = scene()
    eager = oracle(img, imgsz=SIZE, tiling=True, overlap_ratio=0.25, batch=8)
    oracle.runner.capturer = cap = StandInCapturer()
    first = oracle(img, imgsz=SIZE, tiling=True, overlap_ratio=0.25, batch=8, cuda_graph=True)
    again = oracle(img, imgsz=SIZE, tiling=True, overlap_ratio=0.25, batch=8, cuda_graph=True)
    # 4 rows x 6 columns of tiles = 3 forwards of 8 per call: one capture of the tile stage
    tile_shapes = [s for s in cap.captures if tuple(s[0]) == (8, 64, 64, 3)]
    assert len(tile_shapes) == 1, cap.captures
    assert torch.equal(first.boxes.data, eager.boxes.data) and torch.equal(again.boxes.data, eager.boxes.data)


def test_tiling_an_image_of_one_tile_is_plain_predict(net, picture):
    plain = net(picture, imgsz=SIZE, conf=0.01)
    assert len(plain.boxes) > 5
    for tile in (None, 64, 200):   # the 48x60 image fits any of these
        tiled = net(picture, imgsz=SIZE, conf=0.01, tiling=True, tile=tile)
        assert torch.equal(tiled.boxes.data, plain.boxes.data)
    pair = [picture, picture[:40]]   # a chunk of two sizes, as plain predict batches it
    both = net(pair, imgsz=SIZE, conf=0.01, tiling=True, tile_full=False, batch=2)
    for a, b in zip(both, net(pair, imgsz=SIZE, conf=0.01, batch=2)):
        assert torch.equal(a.boxes.data, b.boxes.data)


def test_tta_of_the_identity_view_is_plain_predict(net, picture, monkeypatch):
    plain = net(picture, imgsz=SIZE, conf=0.01)
    monkeypatch.setattr(sliced, "TTA_VIEWS", ((1.0, False),))
    same = net(picture, imgsz=SIZE, conf=0.01, augment=True)
    assert torch.equal(same.boxes.data, plain.boxes.data)
    # the flipped view alone: predict of the mirrored image, its boxes mirrored back
    monkeypatch.setattr(sliced, "TTA_VIEWS", ((1.0, True),))
    flipped = net(picture, imgsz=SIZE, conf=0.01, augment=True)
    mirrored = net(np.ascontiguousarray(picture[:, ::-1]), imgsz=SIZE, conf=0.01).boxes.data.clone()
    mirrored[:, [0, 2]] = 60 - mirrored[:, [2, 0]]
    assert torch.equal(flipped.boxes.data, mirrored)


def test_tta_merges_the_three_views(net, picture):
    seen = []
    real = type(net.get_predictor()).run_batch

    def spy(self, images, size, *a, **k):
        if not isinstance(k.get("plan", a[2] if len(a) > 2 else None), sliced.SlicedPlan):
            seen.append((size, images[0].clone()))
        return real(self, images, size, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(net.get_predictor()), "run_batch", spy)
        out = net(picture, imgsz=128, conf=0.01, augment=True, max_det=20)
    assert [s for s, _ in seen] == [128, 128, 96]   # 1, 0.83 and 0.67 of 128, rounded up to the stride 32
    rgb = torch.from_numpy(np.ascontiguousarray(picture[..., ::-1]))
    assert torch.equal(seen[0][1], rgb) and torch.equal(seen[1][1], rgb.flip(1)) and torch.equal(seen[2][1], rgb)
    assert isinstance(out, Results) and 0 < len(out.boxes) <= 20
    conf = out.boxes.conf
    assert bool((conf[:-1] >= conf[1:]).all())


@pytest.mark.parametrize("opts, err, msg", [
    ({"tiling": True, "overlap_ratio": 1.0}, OptionError, r"overlap_ratio must be a number in \[0, 1\), got 1.0"),
    ({"tiling": True, "overlap_ratio": -0.2}, OptionError, "overlap_ratio must be a number"),
    ({"tiling": True, "tile": 0}, OptionError, "tile must be an integer >= 1, got 0"),
    ({"tiling": True, "tile_merge": "wbf"}, OptionError, "tile_merge"),
    ({"tiling": True, "augment": True}, ValueError, "exclude each other"),
])
def test_bad_options_are_one_clear_error(net, opts, err, msg):
    with pytest.raises(err, match=msg):
        net(np.zeros((8, 8, 3), np.uint8), imgsz=SIZE, **opts)


def test_other_tasks_refuse_naming_the_task():
    m = LibreYOLO.new("mobilenetv4", "s", device="cpu")
    for opt in ("tiling", "augment"):
        with pytest.raises(ValueError, match=f"{opt}=True is offered for detection models; mobilenetv4-s is a "
                                             "classify model"):
            m(np.zeros((32, 32, 3), np.uint8), **{opt: True})


def test_packed_rows_of_the_device_selection():
    """The in-stage selection's packed tensor (rows in score order, count last) -> its counted
    rows and their image, as the tiles' merge reads it on CUDA."""
    md = 3
    packed = torch.full((2, md * 6 + 1), -7.0)   # past each count: whatever the kernel left
    packed[0, :12] = torch.arange(12.0)
    packed[0, -1], packed[1, -1] = 2, 0
    rows, which = sliced.packed_rows(packed, md)
    assert torch.equal(rows, torch.arange(12.0).view(2, 6)) and which.tolist() == [0, 0]
    packed[1, :6], packed[1, -1] = 5.0, 1
    rows, which = sliced.packed_rows(packed, md)
    assert rows.shape == (3, 6) and which.tolist() == [0, 0, 1] and torch.equal(rows[2], torch.full((6,), 5.0))


def test_tta_refused_for_a_model_of_one_input_size():
    m = LibreYOLO.new("yolo1", "t", device="cpu")
    with pytest.raises(ValueError, match=r"augment=True predicts at the sizes \[448, 384, 320\], which yolo1-t "
                                         "cannot: YOLOv1 takes a fixed 448x448 input"):
        m(np.zeros((32, 32, 3), np.uint8), augment=True)


def test_track_takes_tiling(oracle):
    for _ in range(3):   # a stream of frames: the tiled boxes reach the tracker
        r = oracle.track(scene(), persist=True, imgsz=SIZE, tiling=True, overlap_ratio=0.25)[0]
    assert torch.equal(r.boxes.data, torch.tensor([[30.0, 20.0, 60.0, 30.0, 0.75, 0.0]]))
    assert r.boxes.id is not None and len(r.boxes.id) == 1
