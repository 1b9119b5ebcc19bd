"""Batched predict on a GPU: the overlapped loop (uploads on a copy stream into pinned staging
buffers used in turn, the next chunk prepared while this one's stage runs) gives bit for bit the
Results of the sequential loop, eager and graphed; the staging buffers are never overwritten
while a copy reads them; the GPU JPEG decode (nvjpeg) has the CPU decode's geometry and pixels
within a few levels, and its overlapped and sequential runs agree bit for bit. Run through
scripts/gpu-check (tests/unit/test_batched_predict.py covers the loop's order on the CPU)."""
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.data.sources import decode_image
from libreyolo.engine.verify import input_sensitive

pytestmark = pytest.mark.cuda

FAMILIES = [("yolox", "n"), ("yolo9", "t")]


@pytest.fixture(scope="module")
def frames():
    """Seven 1280x720 frames (the sample, shifted) and one 640x480 crop: chunks of 3 mix sizes once."""
    base = decode_image(SAMPLE_IMAGE)
    out = [np.ascontiguousarray(np.roll(base, 37 * i, axis=1)) for i in range(7)]
    out.insert(5, np.ascontiguousarray(base[100:580, 200:840]))
    return out


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: "-".join(f))
def model(request):
    family, size = request.param
    return input_sensitive(LibreYOLO.new(family, size, device="cuda", seed=0))


def _predict(model, source, overlap=True, **kw):
    p = model.get_predictor()
    p.overlap = overlap
    try:
        return model.predict(source, imgsz=640, conf=0.1, **kw)
    finally:
        p.overlap = True


def _assert_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.path == y.path and x.orig_shape == y.orig_shape
        assert torch.equal(x.boxes.data, y.boxes.data), x.path


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("batch", [3, 5])   # 8 frames: 3 and 2 chunks (one chunk takes the sequential loop)
def test_overlapped_batched_predict_equals_the_sequential_loop(model, frames, cuda_graph, batch):
    model.release_graphs()
    seq = _predict(model, frames, overlap=False, batch=batch, cuda_graph=cuda_graph)
    model.release_graphs()
    for _ in range(3):   # graph: the first call captures, the next ones replay
        _assert_equal(_predict(model, frames, batch=batch, cuda_graph=cuda_graph), seq)
    assert sum(len(r) for r in seq) > 0


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("batch", [1, 3])
def test_bgr_frames_reordered_on_the_device_equal_the_host_reorder(model, frames, cuda_graph, batch):
    """The default on CUDA (Predictor.bgr_on_device): BGR arrays uploaded as they are and flipped on
    the device; the same Results bit for bit - boxes and the RGB orig_img - as the host's reorder
    before the upload, one image at a time (the latency path, the repeat path) and in staged chunks."""
    p = model.get_predictor()
    src = frames if batch > 1 else frames[0]
    kept = [f.copy() for f in frames]
    out = {}
    for on in (False, True):
        p.bgr_on_device = on
        model.release_graphs()
        try:
            runs = [_predict(model, src, batch=batch, cuda_graph=cuda_graph) for _ in range(3)]
        finally:
            p.bgr_on_device = None
        out[on] = [r if isinstance(r, list) else [r] for r in runs]
    assert all(np.array_equal(f, k) for f, k in zip(frames, kept))   # the callers' arrays never written
    for a, b in zip(out[True], out[False]):
        _assert_equal(a, b)
        assert all(np.array_equal(x.orig_img, y.orig_img) for x, y in zip(a, b))
    assert sum(len(r) for r in out[True][0]) > 0


def test_staging_buffers_are_never_overwritten_while_copied(frames):
    """Many chunks uploaded back to back, each read on the compute stream behind a slow kernel:
    every device copy must equal its source."""
    from libreyolo.engine.staging import UploadRing
    ring = UploadRing(torch.device("cuda"))
    compute = torch.cuda.current_stream()
    slow = torch.randn(2048, 2048, device="cuda")
    got, want = [], []
    for i in range(12):
        imgs = [torch.from_numpy(np.roll(f, i, axis=0)) for f in frames[:4]]
        views, base = ring.upload(imgs)
        done = torch.cuda.Event()
        done.record(ring.stream)
        compute.wait_event(done)
        base.record_stream(compute)
        for _ in range(4):
            slow = slow @ slow / 2048 ** 0.5   # keeps the compute stream behind the copies
        got.append([v.clone() for v in views])
        want.append([im.clone() for im in imgs])
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert torch.equal(a.cpu(), b)


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
    """The sample as JPEG files: as shipped, EXIF-rotated (6, 8, 3), greyscale, progressive,
    4:4:4, and one PNG (always the CPU decoder). Skips where torchvision has no nvjpeg."""
    from libreyolo.data.jpeg import gpu_decode_problem
    problem = gpu_decode_problem(torch.device("cuda"))
    if problem is not None:
        pytest.skip(f"no GPU JPEG decoder here: {problem}")
    d = tmp_path_factory.mktemp("jpegs")
    shutil.copy(SAMPLE_IMAGE, d / "a_sample.jpg")
    im = Image.open(SAMPLE_IMAGE).convert("RGB")
    for o in (6, 8, 3):
        exif = Image.Exif()
        exif[0x0112] = o
        im.save(d / f"b_orient{o}.jpg", quality=90, exif=exif.tobytes())
    im.convert("L").save(d / "c_grey.jpg", quality=90)
    im.save(d / "d_progressive.jpg", quality=85, progressive=True)
    im.save(d / "e_444.jpg", quality=95, subsampling=0)
    im.resize((640, 360)).save(d / "f_small.png")
    return d


def test_gpu_decode_has_the_cpu_geometry_and_pixels_within_a_few_levels(jpeg_dir, record_property):
    m = input_sensitive(LibreYOLO.new("yolo9", "t", device="cuda", seed=0))
    cpu = m.predict(jpeg_dir, imgsz=640, batch=4, conf=0.1, decode="cpu")
    gpu = m.predict(jpeg_dir, imgsz=640, batch=4, conf=0.1, decode="gpu")
    assert [r.path for r in gpu] == [r.path for r in cpu]
    for a, b in zip(cpu, gpu):
        assert isinstance(b.orig_img, np.ndarray) and b.orig_img.shape == a.orig_img.shape, b.path
        diff = np.abs(a.orig_img.astype(np.int16) - b.orig_img.astype(np.int16))
        record_property(f"{b.path.rsplit('/', 1)[-1]}_mean_max_p999",
                        (float(diff.mean()), int(diff.max()), float(np.quantile(diff, 0.999))))
        print(f"{b.path}: |gpu - cpu| mean {diff.mean():.3f}, p99.9 {np.quantile(diff, 0.999):.0f}, max {diff.max()}")
        if b.path.endswith(".png"):
            assert diff.max() == 0
        else:   # a different IDCT / chroma upsampling: a few levels, not a different picture (a wrong
            # orientation or channel order gives a mean of tens of levels)
            assert diff.mean() <= 2.0 and np.quantile(diff, 0.99) <= 12 and np.quantile(diff, 0.999) <= 24, b.path
        assert abs(len(a) - len(b)) <= max(2, 0.2 * len(a)), (b.path, len(a), len(b))


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "graph"])
def test_gpu_decoded_overlapped_predict_equals_its_sequential_run(jpeg_dir, cuda_graph):
    m = input_sensitive(LibreYOLO.new("yolox", "n", device="cuda", seed=0))
    seq = _predict(m, jpeg_dir, overlap=False, batch=3, cuda_graph=cuda_graph, decode="gpu")
    m.release_graphs()
    got = _predict(m, jpeg_dir, batch=3, cuda_graph=cuda_graph, decode="gpu")
    _assert_equal(got, seq)
    for a, b in zip(got, seq):
        assert np.array_equal(a.orig_img, b.orig_img)


def test_gpu_decode_same_size_chunks_equal_the_decoded_arrays_predicted(jpeg_dir):
    """The stage on a GPU-decoded batch equals the stage on the same pixels handed over as arrays."""
    m = input_sensitive(LibreYOLO.new("yolox", "n", device="cuda", seed=0))
    files = sorted(str(p) for p in jpeg_dir.glob("*.jpg") if "orient" not in p.name)
    gpu = m.predict(files, imgsz=640, batch=4, conf=0.1, decode="gpu")
    # Results.orig_img is RGB; a numpy source is BGR unless bgr=False says otherwise
    again = m.predict([r.orig_img.copy() for r in gpu], imgsz=640, batch=4, conf=0.1, bgr=False)
    for a, b in zip(gpu, again):
        assert torch.equal(a.boxes.data, b.boxes.data), a.path


def test_bench_batch_arms_report_images_per_second_beside_the_graphed_forward():
    from libreyolo.benchmark import bench_model
    m = LibreYOLO.new("yolox", "n", device="cuda", seed=0)
    res = bench_model(m, imgsz=640, batch=4, runs=3, warmup=1, chunks=2, compile_arms=False)
    for name in ("eager", "graph"):
        arm = res["arms"][f"batch_{name}"]
        assert arm["images"] == 8 and arm["images_per_s"] > 0 and arm["ms_per_batch"] > 0
    r = res["ratios"]
    assert r["batch_graph_over_eager_images_per_s"] > 0 and r["batch_graph_ms_per_batch_over_forward_graph"] > 0
    # the fast arm runs only where the family's contract allows it; otherwise a note says why
    assert "batch_fast" in res["arms"] or any(n.startswith("batch fast arm skipped") for n in res["notes"])
