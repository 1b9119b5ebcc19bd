"""Matting (BiRefNet) on the CPU: predict end to end, Results.alpha / plot / RGBA save, the input
patches, the predict seam (driven through a stand-in capturer), sizes, bad input."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from standin import StandInCapturer

from libreyolo import LibreYOLO
from libreyolo.models.birefnet.model import BiRefNet
from libreyolo.models.birefnet.nn import BiRefNetNet, image_patches
from libreyolo.ops.preprocess import Preprocess
from libreyolo.results import Results
from libreyolo.tasks.matte import Alpha
from libreyolo.tasks.matte.results import checkerboard

SIZE = 64   # the smallest input the two-scale encoder takes comfortably (half scale: 32)


@pytest.fixture(scope="module")
def model():
    return LibreYOLO.new("birefnet", "t", device="cpu", seed=0)


def _image(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------ predict
def test_predict_end_to_end_gives_the_alpha_at_the_original_size(model, tmp_path):
    img = _image(50, 70, 0)
    r = model(img, imgsz=SIZE, color_format="rgb")
    a = r.alpha
    assert isinstance(a, Alpha) and r.boxes is None and r.masks is None and len(r) == 0
    assert a.shape == (50, 70) and a.data.dtype == torch.float32
    assert float(a.data.min()) >= 0.0 and float(a.data.max()) <= 1.0
    # the alpha is the network's sigmoid, stretched back bilinearly (BiRefNet stretches to the square)
    with torch.no_grad():
        logits = model.infer(model.preprocess(torch.from_numpy(img)[None], SIZE))
    ref = F.interpolate(logits.sigmoid(), size=(50, 70), mode="bilinear", align_corners=False)[0, 0]
    assert torch.equal(a.data, ref)
    s = json.loads(r.to_json())
    assert s["shape"] == [50, 70] and 0.0 <= s["foreground"] <= 1.0
    assert abs(s["mean_alpha"] - float(a.data.mean())) < 1e-5
    picture = r.plot()
    assert picture.shape == img.shape and picture.dtype == np.uint8
    out = r.save(tmp_path / "cut.png")
    png = np.asarray(Image.open(out))
    assert png.shape == (50, 70, 4)
    assert np.array_equal(png[..., :3], img)
    assert np.array_equal(png[..., 3], np.rint(a.data.numpy() * 255).astype(np.uint8))
    assert r.save_suffix == ".png" and r.numpy().alpha.data.dtype == np.float32


def test_predict_save_writes_png_cutouts(model, tmp_path):
    r = model([_image(40, 40, 1), _image(64, 32, 2)], imgsz=SIZE, save=True, save_dir=tmp_path)
    assert [Image.open(x.saved_to).mode for x in r] == ["RGBA", "RGBA"]
    assert all(x.saved_to.endswith(".png") for x in r)


def test_alpha_of_each_image_in_a_batch_of_different_sizes(model):
    imgs = [_image(40, 40, 3), _image(30, 90, 4)]
    batch = model(imgs, imgsz=SIZE, batch=2)
    alone = [model(im, imgsz=SIZE) for im in imgs]
    for got, ref, im in zip(batch, alone, imgs):
        assert got.alpha.shape == im.shape[:2]
        assert torch.allclose(got.alpha.data, ref.alpha.data, atol=1e-5)


# ------------------------------------------------------------------------------------------ results
def test_plot_is_the_cutout_over_a_checkerboard():
    img = np.full((20, 30, 3), 250, dtype=np.uint8)
    alpha = np.zeros((20, 30), dtype=np.float32)
    alpha[:, :15] = 1.0
    r = Results(img, "x.jpg", {0: "foreground"}, alpha=Alpha(alpha))
    p = r.plot()
    board = checkerboard(20, 30)
    assert np.array_equal(p[:, :15], img[:, :15]) and np.array_equal(p[:, 15:], board[:, 15:])
    assert len(np.unique(board.reshape(-1, 3), axis=0)) == 2       # light and dark cells
    assert np.array_equal(Alpha(alpha).mask(), alpha > 0.5)


def test_alpha_rejects_bad_data_and_save_refuses_formats_without_alpha(tmp_path):
    with pytest.raises(TypeError, match="torch tensor or numpy array"):
        Alpha([[0.5]])
    with pytest.raises(ValueError, match=r"\(H, W\) map"):
        Alpha(torch.zeros(1, 4, 4))
    with pytest.raises(ValueError, match="floating point"):
        Alpha(torch.zeros(4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="threshold"):
        Alpha(torch.zeros(4, 4)).mask(1.5)
    with pytest.raises(ValueError, match="does not match the alpha"):
        Alpha(torch.zeros(4, 4)).rgba(np.zeros((5, 4, 3), dtype=np.uint8))
    r = Results(np.zeros((4, 4, 3), dtype=np.uint8), "x.jpg", {0: "fg"}, alpha=Alpha(torch.zeros(4, 4)))
    with pytest.raises(ValueError, match="RGBA cut-out.*JPEG"):
        r.save(tmp_path / "x.jpg")
    assert Image.open(r.save(tmp_path / "x.webp")).mode == "RGBA"


# ------------------------------------------------------------------------------------------ network
def test_image_patches_stack_tiles_channel_major_then_row_major():
    x = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    got = image_patches(x, 2, 3)               # a 4 x 4 grid of 2 x 3 tiles
    assert got.shape == (2, 3 * 16, 2, 3)
    for c in range(3):
        for r in range(4):
            for q in range(4):
                assert torch.equal(got[:, (c * 4 + r) * 4 + q], x[:, c, r * 2:(r + 1) * 2, q * 3:(q + 1) * 3])


def test_seam_halves_compose_to_the_whole_network(model):
    x = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.infer_back(*model.infer_front(x)), model.infer(x))


def test_sizes_follow_birefnet_with_swin_t_and_swin_l():
    """Size l is BiRefNet's Swin-L configuration (220.2 M parameters); its backbone has exactly
    the parameters of timm's independent Swin-L plus the three extra stage norms BiRefNet adds.
    Counted on the meta device (nothing computed)."""
    timm = pytest.importorskip("timm")
    for size, name, total in (("t", "swin_tiny_patch4_window7_224", 44_313_720),
                              ("l", "swin_large_patch4_window12_384", 220_176_498)):
        with torch.device("meta"):
            net = BiRefNetNet(size)
            ref = timm.create_model(name, pretrained=False, num_classes=0)
        bb = sum(p.numel() for p in net.bb.parameters()) - 2 * sum(net.bb.widths[:3])
        assert bb == sum(p.numel() for p in ref.parameters()), size
        assert sum(p.numel() for p in net.parameters()) == total, size


# ------------------------------------------------------------------------------------------ the seam
def _traced_model(seam: bool):
    """A model whose runner captures through the stand-in, logging where the squeeze module (the
    first deformable convolutions) runs: inside a replay or eager."""
    m = LibreYOLO.new("birefnet", "t", device="cpu", seed=0)
    m.PREDICT_SEAM = seam
    log: list[str] = []
    m.runner.supported = True
    m.runner.capturer = StandInCapturer(on_replay=log.append)
    m.model.squeeze_module.register_forward_pre_hook(lambda *a: log.append("deform"))
    return m, log


@pytest.mark.parametrize("seam", [True, False])
def test_predict_seam_replays_the_encoder_and_runs_the_deformable_decoder_eager(seam):
    img = _image(48, 64, 5)
    m, log = _traced_model(seam)
    eager = m(img, imgsz=SIZE).alpha.data
    log.clear()
    got = [m(img, imgsz=SIZE, cuda_graph=True).alpha.data for _ in range(3)]
    assert all(torch.equal(g, eager) for g in got)                 # same numbers either way
    inside = [log[i + 1] == "deform" for i, e in enumerate(log) if e == "replay"]
    assert inside and all(v is not seam for v in inside), log      # seam: never inside a replay
    assert log.count("deform") == 3                                 # the decoder ran once per call
    assert m.graph_info()["replays"] >= 3


# ------------------------------------------------------------------------------------------ bad input
def test_bad_input_gives_clear_errors(model):
    with pytest.raises(ValueError, match="one alpha matte"):
        LibreYOLO.new("birefnet", "t", nc=2, device="cpu")
    with pytest.raises(ValueError, match="unknown size"):
        LibreYOLO.new("birefnet", "xl", device="cpu")
    with pytest.raises(TypeError, match="unknown predict option"):
        model(_image(40, 40, 0), imgsz=SIZE, conf=0.5)
    cropped = LibreYOLO.new("birefnet", "t", device="cpu", seed=0)
    cropped.preprocess = Preprocess("crop", mean=(0.5,) * 3, std=(0.5,) * 3)
    with pytest.raises(ValueError, match="crops"):
        cropped(_image(40, 40, 0), imgsz=SIZE)


def test_a_size_off_the_stride_is_rounded_up_and_odd_grids_work(model, caplog):
    """imgsz 80 -> 96 (the library's rule, with a warning): 96 / 32 = 3, so the deepest maps are
    3 x 3 at full scale and 2 x 2 (padded odd merge) at half scale."""
    r = model(_image(30, 20, 6), imgsz=80)
    assert r.alpha.shape == (30, 20) and "using 96" in caplog.text


def test_declarations():
    assert BiRefNet.TASK == "matte" and BiRefNet.SIZES == ("t", "l") and BiRefNet.DEFAULT_IMGSZ == 1024
    assert BiRefNet.PREPROCESS.resize == "stretch" and BiRefNet.PREPROCESS.mean == (0.485, 0.456, 0.406)


def test_bench_runs_its_eager_arms_on_the_cpu_and_names_the_seam(model):
    from libreyolo.benchmark import bench_model
    res = bench_model(model, imgsz=SIZE, runs=1, warmup=0)
    assert res["task"] == "matte" and res["captured"] == "front part (seam), rest eager"
    assert {"forward_eager", "predict_eager"} <= set(res["arms"]) and "forward_graph" not in res["arms"]
