"""Batched predict on the CPU: the overlapped loop (the next chunk prepared while this one's stage
runs, Results built a chunk behind) gives exactly the Results of the sequential loop, for any
number of images and batch; errors while preparing a chunk come after the chunks before it;
the ``decode`` option's checks and its CPU fallback; the JPEG probe and the EXIF orientation
applied as PIL applies it; the bench's batch arm. The copy stream and the GPU decode themselves
are covered in tests/gpu/test_batched_predict_gpu.py."""
import contextlib
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.data import jpeg
from libreyolo.data.sources import SourceItem, decode_image, load_sources, pending_sources
from libreyolo.engine.verify import input_sensitive
from libreyolo.options import OptionError

SIZE = 64


@pytest.fixture(scope="module")
def model():
    return input_sensitive(LibreYOLO.new("yolox", "n", device="cpu", seed=0))


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    # two sizes, so that some chunks mix them (the per-image preprocessing) and some do not
    shapes = [(48, 64)] * 4 + [(40, 40)] + [(48, 64)] * 2
    return [rng.integers(0, 256, (*s, 3), dtype=np.uint8) for s in shapes]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.path == y.path and x.orig_shape == y.orig_shape
        assert torch.equal(x.boxes.data, y.boxes.data)


@pytest.fixture
def sequential(model):
    """Predict through the sequential loop (today's per-image uploads, no lookahead)."""
    p = model.get_predictor()

    def run(*args, **kw):
        p.overlap = False
        try:
            return model.predict(*args, **kw)
        finally:
            p.overlap = True
    return run


@pytest.mark.parametrize("batch", [1, 3, 4, 7, 10])
def test_overlapped_chunks_equal_the_sequential_loop(model, images, sequential, batch):
    got = model.predict(images, imgsz=SIZE, batch=batch, conf=0.01)
    _same(got, sequential(images, imgsz=SIZE, batch=batch, conf=0.01))
    assert [r.path for r in got] == [f"image{i}" for i in range(len(images))]
    assert all(len(r) > 0 for r in got)   # the head was made input-sensitive: boxes to compare


def test_streamed_chunks_equal_the_list_and_one_by_one_equals_batch_1(model, images, sequential):
    listed = model.predict(images, imgsz=SIZE, batch=3, conf=0.01)
    _same(list(model.predict(images, imgsz=SIZE, batch=3, conf=0.01, stream=True)), listed)
    one_by_one = [model.predict(im, imgsz=SIZE, conf=0.01) for im in images]
    for r, i in zip(one_by_one, range(len(images))):
        r.path = f"image{i}"
    _same(one_by_one, model.predict(images, imgsz=SIZE, batch=1, conf=0.01))


def test_an_error_preparing_a_chunk_comes_after_the_chunks_before_it(model, images):
    p = model.get_predictor()
    plan = p.plan(SIZE, conf=0.01)
    plan.mode, plan.amp_dtype, plan.half = False, None, None

    def chunks():
        yield [SourceItem(f"a{i}", im) for i, im in enumerate(images[:2])]
        yield [SourceItem(f"b{i}", im) for i, im in enumerate(images[2:4])]
        raise ValueError("cannot decode image 'broken.jpg': test")
    seen = []
    with pytest.raises(ValueError, match="broken.jpg"):
        for _items, results in p._steps(chunks(), SIZE, False, None, plan, 0.0, staged=True, lookahead=True,
                                       profile=False, repeating=False):
            seen.extend(r.path for r in results)
    assert seen == ["a0", "a1", "b0", "b1"]


def test_speed_is_filled_per_image(model, images):
    for r in model.predict(images, imgsz=SIZE, batch=3, conf=0.01):
        assert set(r.speed) == {"load", "preprocess", "inference", "postprocess"}
        assert all(v >= 0 for v in r.speed.values()), r.speed


# ------------------------------------------------------------ the CUDA path, stood in on the CPU


class _Stream:
    def synchronize(self):
        pass

    def wait_event(self, event):
        assert event.recorded, "the compute stream waits for an event that was never recorded"


class _Event:
    def __init__(self):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def synchronize(self):
        assert self.recorded


@pytest.fixture
def standin_cuda(monkeypatch):
    """The staged path's CUDA calls stood in on the CPU: the real upload ring without pinned
    memory, streams and events that check their use, torchvision's CPU JPEG decoder for
    nvjpeg. It runs every line of the staged path's bookkeeping (offsets, views, the stacked
    batch, downloads) that the GPU tests run for real."""
    from libreyolo.engine import predictor as pred
    from libreyolo.engine.staging import UploadRing

    class Ring(UploadRing):
        PINNED = False

        def __init__(self):
            self.device, self.stream = torch.device("cpu"), _Stream()
            self._host, self._copied, self._next = [None] * self.SLOTS, [None] * self.SLOTS, 0
    ring = Ring()
    monkeypatch.setattr(pred.Predictor, "_ring", lambda self: ring)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(pred, "gpu_decode_problem", lambda device: None)
    return ring


@pytest.mark.parametrize("batch", [2, 3])
def test_staged_uploads_equal_the_sequential_loop(model, images, sequential, standin_cuda, batch):
    got = model.predict(images, imgsz=SIZE, batch=batch, conf=0.01)
    _same(got, sequential(images, imgsz=SIZE, batch=batch, conf=0.01))
    assert standin_cuda._host[0] is not None   # the ring was used


def test_upload_ring_lays_out_one_size_back_to_back_and_mixed_sizes_aligned(standin_cuda, images):
    same = [torch.from_numpy(im) for im in images[:3]]
    views, base = standin_cuda.upload(same)
    assert base.numel() == sum(t.numel() for t in same)
    assert torch.equal(base.view(3, *same[0].shape), torch.stack(same))   # what torch.stack gives
    mixed = [torch.from_numpy(im) for im in images[3:6]]   # 48x64, 40x40, 48x64
    views, base = standin_cuda.upload(mixed)
    for v, t in zip(views, mixed):
        assert (v.data_ptr() - base.data_ptr()) % standin_cuda.ALIGN == 0 and torch.equal(v, t)
    assert standin_cuda._next == 0 and standin_cuda._copied[0].recorded and standin_cuda._copied[1].recorded


def test_staged_gpu_decode_gives_upright_pixels_and_the_arrays_results(model, tmp_path, sequential, standin_cuda):
    rng = np.random.default_rng(6)
    base = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    for i, o in enumerate((1, 6, 8, 3, 1)):
        _jpeg(tmp_path / f"{i}.jpg", np.roll(base, i, axis=1), orientation=o)
    _jpeg(tmp_path / "5_grey.jpg", base[:, :, 0])
    Image.fromarray(base).save(tmp_path / "6.png")
    got = model.predict(tmp_path, imgsz=SIZE, batch=3, conf=0.01, decode="gpu")
    for r in got:
        f = jpeg.probe(r.path)
        if f is None:
            want = decode_image(r.path)
        else:
            want = jpeg.decode_files([f], torch.device("cpu"))[0].numpy()
        assert isinstance(r.orig_img, np.ndarray) and np.array_equal(r.orig_img, want), r.path
    _same(got, sequential(tmp_path, imgsz=SIZE, batch=3, conf=0.01, decode="gpu"))
    # chunks [0-2] mix sizes (per-image tensors), [3-5] share one (the stacked batch), [6] is the
    # PNG (the staged upload): each gives the Results of the same pixels handed over as arrays
    as_arrays = model.predict([r.orig_img for r in got], imgsz=SIZE, batch=3, conf=0.01, color_format="rgb")
    for r, g in zip(as_arrays, got):
        r.path = g.path
    _same(got, as_arrays)


# ------------------------------------------------------------------------------------ decode


def _jpeg(path, arr, orientation=None, **kw):
    im = Image.fromarray(arr)
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    im.save(path, format="JPEG", quality=92, **kw)
    return path


def test_decode_option_is_checked(model, images):
    with pytest.raises(OptionError, match="decode must be one of cpu, gpu, auto"):
        model.predict(images[0], imgsz=SIZE, decode="nvjpeg")
    with pytest.raises(ValueError, match=r"decode='gpu' cannot run here: the model is on 'cpu'"):
        model.predict(images[0], imgsz=SIZE, decode="gpu")


def test_decode_auto_falls_back_to_the_cpu_decode(model, tmp_path):
    rng = np.random.default_rng(1)
    for i in range(3):
        _jpeg(tmp_path / f"{i}.jpg", rng.integers(0, 256, (40, 56, 3), dtype=np.uint8))
    Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(tmp_path / "3.png")
    auto = model.predict(tmp_path, imgsz=SIZE, batch=2, conf=0.01, decode="auto")
    cpu = model.predict(tmp_path, imgsz=SIZE, batch=2, conf=0.01)
    _same(auto, cpu)
    for r in auto:
        assert isinstance(r.orig_img, np.ndarray) and np.array_equal(r.orig_img, decode_image(r.path))


def test_a_corrupt_file_raises_the_cpu_decoders_error_naming_it(model, tmp_path):
    arr = np.zeros((32, 32, 3), np.uint8)
    good = _jpeg(tmp_path / "good.jpg", arr)
    (tmp_path / "truncated.jpg").write_bytes(good.read_bytes()[:200])
    for decode in ("cpu", "auto"):
        with pytest.raises(ValueError, match=r"cannot decode image '.*truncated\.jpg'"):
            model.predict(tmp_path, imgsz=SIZE, decode=decode, strict=True)
        # without strict a file the folder holds is skipped with a warning (tests/unit/test_reliability_data.py)
        assert [r.path for r in model.predict(tmp_path, imgsz=SIZE, decode=decode)] == [str(good)]


def test_pending_sources_resolve_like_load_sources_without_decoding(tmp_path, images):
    _jpeg(tmp_path / "a.jpg", images[0])
    src = [tmp_path / "a.jpg", images[1]]
    pend = pending_sources(src)
    loaded = load_sources(src)
    assert [p.name for p in pend] == [it.name for it in loaded] == [str(tmp_path / "a.jpg"), "image1"]
    assert pend[0].path == tmp_path / "a.jpg" and pend[1].path is None
    for p, it in zip(pend, loaded):
        assert np.array_equal(p.load().image, it.image)
    with pytest.raises(FileNotFoundError):
        pending_sources(tmp_path / "missing.jpg")


def test_threaded_file_decode_gives_the_same_items_and_the_first_error(tmp_path):
    rng = np.random.default_rng(5)
    for i in range(5):
        arr = rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)
        _jpeg(tmp_path / f"{i}.jpg", arr, orientation=6 if i == 2 else None)
    Image.fromarray(arr).save(tmp_path / "5.png")
    one, many = load_sources(tmp_path), load_sources(tmp_path, workers=4)
    assert [it.name for it in one] == [it.name for it in many]
    assert all(np.array_equal(a.image, b.image) for a, b in zip(one, many))
    (tmp_path / "1.jpg").write_bytes(b"not an image")
    (tmp_path / "3.jpg").write_bytes(b"not an image either")
    with pytest.raises(ValueError, match=r"cannot decode image '.*1\.jpg'"):
        load_sources(tmp_path, workers=4)


def test_probe_sends_only_plain_complete_jpegs_to_the_gpu_decoder(tmp_path):
    rng = np.random.default_rng(2)
    arr = rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)
    f = jpeg.probe(_jpeg(tmp_path / "rgb.jpg", arr, orientation=6))
    assert f is not None and f.orientation == 6 and f.hw == (24, 40) and f.data.dtype == np.uint8
    assert jpeg.probe(_jpeg(tmp_path / "grey.jpg", arr[:, :, 0])) is not None
    Image.fromarray(arr).convert("CMYK").save(tmp_path / "cmyk.jpg", format="JPEG")
    assert jpeg.probe(tmp_path / "cmyk.jpg") is None
    Image.fromarray(arr).save(tmp_path / "png.jpg", format="PNG")   # a PNG named .jpg
    assert jpeg.probe(tmp_path / "png.jpg") is None
    (tmp_path / "cut.jpg").write_bytes((tmp_path / "rgb.jpg").read_bytes()[:-50])
    assert jpeg.probe(tmp_path / "cut.jpg") is None
    (tmp_path / "junk.jpg").write_bytes(b"\xff\xd8 not a jpeg \xff\xd9")
    assert jpeg.probe(tmp_path / "junk.jpg") is None
    assert jpeg.probe(tmp_path / "missing.jpg") is None


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_transposes_as_pil_does(orientation):
    arr = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    method = jpeg.ORIENTATIONS.get(orientation)
    want = arr if method is None else np.asarray(Image.fromarray(arr).transpose(getattr(Image.Transpose, method)))
    assert np.array_equal(jpeg.orient(torch.from_numpy(arr), orientation).numpy(), want)


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_decode_files_gives_the_upright_image_exif_transpose_gives(tmp_path, orientation):
    """torchvision's CPU decoder stands in for nvjpeg (the same call with device='cpu'): the
    probe's orientation and :func:`jpeg.orient` make the decoded image upright as PIL does."""
    arr = np.random.default_rng(3).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    path = _jpeg(tmp_path / "o.jpg", arr, orientation=orientation)
    got = jpeg.decode_files([jpeg.probe(path)], torch.device("cpu"))[0]
    upright = decode_image(path)
    assert tuple(got.shape) == upright.shape
    raw = np.array(Image.open(path).convert("RGB"))   # PIL, orientation not applied
    want = jpeg.orient(torch.from_numpy(raw), orientation).numpy()
    assert np.array_equal(got.numpy(), want)


def test_a_file_the_gpu_decoder_refuses_is_decoded_on_the_cpu(tmp_path, monkeypatch, caplog):
    rng = np.random.default_rng(4)
    paths = [_jpeg(tmp_path / f"{i}.jpg", rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)) for i in range(3)]
    files = [jpeg.probe(p) for p in paths]
    refused = files[1].data.tobytes()
    real = jpeg._decode

    def decode(datas, device):
        if any(d.tobytes() == refused for d in datas):
            raise RuntimeError("Error while decoding JPEG images: test")
        return real(datas, device)
    monkeypatch.setattr(jpeg, "_decode", decode)
    caplog.set_level(logging.WARNING, logger="libreyolo")
    out = jpeg.decode_files(files, torch.device("cpu"))
    assert isinstance(out[0], torch.Tensor) and isinstance(out[2], torch.Tensor)
    assert isinstance(out[1], np.ndarray) and np.array_equal(out[1], decode_image(paths[1]))
    assert "refused" in caplog.text and "1.jpg" in caplog.text


def test_gpu_decode_problem_names_a_non_cuda_device():
    assert "cpu" in jpeg.gpu_decode_problem(torch.device("cpu"))


# ------------------------------------------------------------------------------------- bench


def test_bench_batch_arm_reports_images_per_second_on_the_cpu(model):
    from libreyolo.benchmark import bench_model
    res = bench_model(model, imgsz=SIZE, batch=2, runs=1, warmup=0, chunks=2, compile_arms=False,
                      image=np.zeros((48, 64, 3), np.uint8))
    arm = res["arms"]["batch_eager"]
    assert arm["images"] == 4 and arm["batch"] == 2 and arm["chunks"] == 2
    assert arm["images_per_s"] == pytest.approx(4e3 / arm["median_ms"])
    assert "batch_graph" not in res["arms"] and "batch_fast" not in res["arms"]
    assert any("batch graph and fast arms skipped: no CUDA device" in n for n in res["notes"])
    assert res["ratios"]["batch_graph_over_eager_images_per_s"] is None


def test_cli_bench_batch_prints_and_writes_the_batch_arms(tmp_path, capsys):
    import json

    from libreyolo.cli import main
    out = tmp_path / "b.json"
    assert main(["bench", "model=yoloxn", f"imgsz={SIZE}", "batch=2", "chunks=2", "runs=1", "warmup=0",
                 "device=cpu", "compile=false", f"json={out}"]) == 0
    res = json.loads(out.read_text())
    assert res["arms"]["batch_eager"]["images"] == 4 and res["arms"]["batch_eager"]["images_per_s"] > 0
    assert "batched predict (2 x 2 images per call), images/s: eager" in " ".join(capsys.readouterr().out.split())
