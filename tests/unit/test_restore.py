"""The restore task (NAFNet, Real-ESRGAN, SwinIR): tiled predict and its blending, Results.image,
the CLI, paired-folder datasets and their errors, training on the built-in set, PSNR / SSIM
validation, ONNX export. The fixture rows are in tests/unit/test_fixtures.py (rows.FIXTURES)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.models.registry import get_family
from libreyolo.tasks.restore.data import resolve_restore_data
from libreyolo.tasks.restore.synthetic import degrade, make_shapes_restore_dataset
from libreyolo.tasks.restore.task import RestoreEvaluator, blend_window, pad_to, restore_metrics

#: (family, size, tile imgsz) of the fast rows: every family at a small tile
FAST = [("nafnet", "s", 32), ("realesrgan", "x4t", 16), ("swinir", "s", 16)]


def _image(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _model(family, size, imgsz, seed=0):
    torch.manual_seed(seed)
    return get_family(family).new(size, device="cpu", imgsz=imgsz)


# ------------------------------------------------------------------------------------------- networks

def test_tlc_local_pool_is_a_sliding_mean_and_global_when_the_window_covers():
    from libreyolo.models.nafnet.nn import LocalAvgPool
    x = torch.randn(2, 5, 13, 17, dtype=torch.float64)
    k = 6
    want = F.avg_pool2d(x, k, stride=1)                       # (13-6+1) x (17-6+1), then edge-replicated
    oh, ow = want.shape[-2:]
    want = F.pad(want, ((17 - ow) // 2, (17 - ow + 1) // 2, (13 - oh) // 2, (13 - oh + 1) // 2), mode="replicate")
    assert torch.allclose(LocalAvgPool(k)(x), want, atol=1e-12)
    assert torch.allclose(LocalAvgPool(17)(x), x.mean((-2, -1), keepdim=True))   # the window covers the map
    assert LocalAvgPool(None)(x).shape == (2, 5, 1, 1)


def test_nafnet_tlc_windows_follow_the_train_size():
    """The reference's NAFNetLocal: each level's window is 1.5 x its feature size at the train size;
    a checkpoint's imgsz sets it, and a tile of the train size pools globally everywhere."""
    from libreyolo.models.nafnet.nn import NAFNetNet
    net = NAFNetNet("s", train_size=256)
    kernels = [net.encoders[i][0].sca[0].kernel for i in range(4)] + [net.middle_blks[0].sca[0].kernel]
    assert kernels == [384, 192, 96, 48, 24]
    assert [net.decoders[i][0].sca[0].kernel for i in range(4)] == [48, 96, 192, 384]
    m = get_family("nafnet").new("s", device="cpu", imgsz=64)
    assert m.model.encoders[0][0].sca[0].kernel == 96


def test_swinir_shift_mask_and_any_input_size():
    from libreyolo.models.swinir.nn import shift_mask
    m = shift_mask(16, 24, 8, 4)
    assert m.shape == (6, 64, 64) and set(m.unique().tolist()) <= {0.0, -100.0}
    assert (m[0] == 0).all()                        # a window away from the rolled edges: one region
    net = get_family("swinir").build_network("s").eval()
    with torch.no_grad():
        out = net(torch.rand(1, 3, 13, 21))         # reflect-padded to 16 x 24 inside, cropped back
    assert out.shape == (1, 3, 52, 84)


def test_realesrgan_x2_needs_even_sides():
    net = get_family("realesrgan").build_network("x2").eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 6, 8)).shape == (1, 3, 12, 16)
        with pytest.raises(ValueError, match="even height and width"):
            net(torch.rand(1, 3, 7, 8))


# ------------------------------------------------------------------------------------------- predict

def test_blend_window_and_reflect_padding():
    w = blend_window(8, 2)
    assert w.min() > 0 and w[3:5, 3:5].eq(1).all() and torch.equal(w, w.flip(0)) and torch.equal(w, w.T)
    assert torch.equal(blend_window(6, 0), torch.ones(6, 6))
    im = torch.arange(3 * 2).view(3, 2, 1)
    want = np.pad(im.numpy(), ((0, 4), (0, 5), (0, 0)), mode="reflect")   # numpy's reflect, padded past the size
    assert (pad_to(im, 7, 7).numpy() == want).all()


@pytest.mark.parametrize("family,size,scale", [("nafnet", "s", 1), ("realesrgan", "x4t", 4)])
def test_tiles_blend_seamlessly(family, size, scale, monkeypatch):
    """With a pixel-wise network every tile agrees on every pixel, so the blend of the overlapping
    tiles must give exactly the whole-image answer (no seam, no border shift), for any image size."""
    m = _model(family, size, 32)
    # 0.5 x + 0.25 on whole levels k / 255 is 0.5 k + 63.75 levels: never a rounding tie
    monkeypatch.setattr(type(m), "infer", lambda self, x: F.interpolate(
        0.5 * x + 0.25, scale_factor=float(scale), mode="nearest") if scale > 1 else 0.5 * x + 0.25)
    for h, w in ((70, 45), (20, 90), (32, 32)):
        img = _image(h, w, seed=h)
        r = m(img, bgr=False, tile_overlap=8, tile_batch=3)
        want = (0.5 * torch.from_numpy(img).float() / 255 + 0.25).mul(255).round().to(torch.uint8)
        want = want.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        assert r.image.shape == (h * scale, w * scale)
        assert torch.equal(r.image.data, want), (h, w)


def test_an_image_of_one_tile_is_the_network_on_it():
    m = _model("realesrgan", "x4t", 24)
    img = _image(24, 24)
    r = m(img, bgr=False, tile_overlap=4)
    with torch.no_grad():
        net = m.model(torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255)
    want = net[0].clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 0)
    assert torch.equal(r.image.data, want)


@pytest.mark.parametrize("family,size,imgsz", FAST)
def test_predict_gives_the_picture_at_the_output_scale(family, size, imgsz, tmp_path):
    m = _model(family, size, imgsz)
    scale = m.scale
    img = _image(19, 29)
    r = m(img, tile_overlap=4, tile_batch=2)
    assert r.image.shape == (19 * scale, 29 * scale) and r.image.data.dtype == torch.uint8
    assert r.restored is r.image and r.image.scale == scale
    assert r.summary() == {"shape": [19 * scale, 29 * scale], "scale": scale}
    assert json.loads(r.to_json()) == r.summary()
    assert isinstance(r.numpy().image.data, np.ndarray) and np.array_equal(r.cpu().image.array, r.image.array)
    plot = r.plot()
    assert plot.shape == (19 * scale, 2 * 29 * scale + 4, 3)
    assert np.array_equal(plot[:, -29 * scale:], r.image.array)        # the restored picture on the right
    saved = Image.open(r.save(tmp_path / "out.png"))
    assert saved.size == (29 * scale, 19 * scale) and np.array_equal(np.asarray(saved), r.image.array)
    assert r.save_suffix == ".png"
    assert np.array_equal(np.asarray(Image.open(r.image.save(tmp_path / "pic.png"))), r.image.array)


def test_reference_names_resolve():
    """LibreYOLO 1.6.0's restore file names (``-restore`` suffix) and its class names."""
    import libreyolo
    from libreyolo.models.registry import parse_spec
    assert [(c.FAMILY, s) for c, s in map(parse_spec, ("LibreNAFNets-restore.pt", "LibreRealESRGANx4t-restore.pt",
                                                       "LibreSwinIRm-restore.pt", "realesrgan-x2"))] == \
        [("nafnet", "s"), ("realesrgan", "x4t"), ("swinir", "m"), ("realesrgan", "x2")]
    assert isinstance(_model("swinir", "s", 16), libreyolo.LibreSwinIR)
    m = libreyolo.LibreNAFNet(None, size="s", device="cpu")
    assert (m.FAMILY, m.restore_scale, m.TASK) == ("nafnet", 1, "restore")


def test_bad_predict_options_are_refused():
    m = _model("realesrgan", "x4t", 16)
    img = _image(20, 20)
    with pytest.raises(ValueError, match="tile_overlap=8 leaves no inside"):
        m(img, tile_overlap=8)
    assert m(img).image.shape == (80, 80)   # the default overlap: a quarter of a small tile
    with pytest.raises(ValueError, match="tile_overlap"):
        m(img, tile_overlap=-1)
    with pytest.raises(ValueError, match="offered for detection models"):
        m(img, tiling=True, tile_overlap=4)
    with pytest.raises(TypeError, match="unknown predict option"):
        m(img, conf=0.5)


def test_checkpoint_round_trip_and_cli_predict(tmp_path, monkeypatch):
    from libreyolo.cli import main
    m = _model("realesrgan", "x4t", 16)
    ckpt = m.save(tmp_path / "LibreRealESRGANx4t.pt")
    back = LibreYOLO(str(ckpt), device="cpu")
    assert (back.FAMILY, back.size, back.names, back.scale) == ("realesrgan", "x4t", {0: "image"}, 4)
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.png"
    Image.fromarray(_image(18, 22, 3)).save(src)
    out = tmp_path / "pred.json"
    assert main(["predict", f"model={ckpt}", f"source={src}", "imgsz=16", "device=cpu", "tile_overlap=4",
                 f"save_dir={tmp_path / 'pics'}", f"json={out}"]) == 0
    pic = Image.open(tmp_path / "pics" / "in.png")
    assert pic.size == (88, 72)
    want = back(str(src), imgsz=16, tile_overlap=4).image.array
    assert np.array_equal(np.asarray(pic), want)
    assert json.loads(out.read_text())[0]["detections"] == {"shape": [72, 88], "scale": 4}


# ------------------------------------------------------------------------------------------- data

def _pair_folder(root, pairs):
    for split_dir, name, lq_hw, gt_hw in pairs:
        for kind, hw in (("lq", lq_hw), ("gt", gt_hw)):
            if hw is not None:
                (root / split_dir / kind).mkdir(parents=True, exist_ok=True)
                Image.fromarray(_image(*hw)).save(root / split_dir / kind / f"{name}.png")


def test_paired_folder_problems_are_one_error_naming_each_file(tmp_path):
    from libreyolo.tasks.restore.data import check_pairs
    _pair_folder(tmp_path, [(".", "ok", (20, 20), (80, 80)), (".", "nogt", (20, 20), None),
                            (".", "nolq", None, (80, 80)), (".", "size", (20, 20), (80, 84)),
                            (".", "small", (10, 12), (40, 48))])
    data = resolve_restore_data(tmp_path)
    with pytest.raises(ValueError) as err:
        check_pairs(data, 4, 16)
    text = str(err.value)
    assert "has 4 problems" in text
    assert "lq/nogt.png: no gt image" in text and "gt/nolq.png: no lq image" in text
    assert "gt/size.png is 84x80 but its lq image lq/size.png is 20x20" in text and "scale 4" in text
    assert "lq/small.png is 12x10, smaller than the 16x16 training patch" in text


def test_data_argument_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds neither data.yaml"):
        resolve_restore_data(tmp_path)
    (tmp_path / "train" / "gt").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="needs a gt/ folder"):
        resolve_restore_data(tmp_path)
    with pytest.raises(ValueError, match="data is required"):
        resolve_restore_data(None)


def test_builtin_set_is_deterministic_and_its_degradations_have_the_right_sizes(tmp_path):
    a = make_shapes_restore_dataset(tmp_path / "a", n_train=2, n_val=1, imgsz=32)
    b = make_shapes_restore_dataset(tmp_path / "b", n_train=2, n_val=1, imgsz=32)
    for rel in ("train/gt/train_000000.png", "train/lq/train_000000.png", "val/lq_x4/val_000000.png"):
        assert (a.parent / rel).read_bytes() == (b.parent / rel).read_bytes()
    sizes = {f: Image.open(a.parent / "train" / f / "train_000001.png").size for f in ("gt", "lq", "lq_x2", "lq_x4")}
    assert sizes == {"gt": (32, 32), "lq": (32, 32), "lq_x2": (16, 16), "lq_x4": (8, 8)}
    clean = _image(16, 16)
    noisy = degrade(clean, 1, np.random.default_rng(0))
    assert noisy.shape == clean.shape and not np.array_equal(noisy, clean)
    with pytest.raises(ValueError, match="multiple of 4"):
        make_shapes_restore_dataset(tmp_path / "c", n_train=1, n_val=1, imgsz=34)


# ------------------------------------------------------------------------------------------- metrics

def test_evaluator_is_torchmetrics_psnr_and_ssim_per_image():
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure
    g = torch.Generator().manual_seed(0)
    gt = torch.randint(0, 256, (3, 3, 32, 32), generator=g, dtype=torch.uint8)
    lq = torch.randint(0, 256, (3, 3, 16, 16), generator=g, dtype=torch.uint8)
    pred = (gt.float() / 255 + 0.05 * torch.randn(gt.shape, generator=g)).clamp(0, 1)
    ev = RestoreEvaluator(scale=2)
    ev.reset()
    ev.process(ev.finish(pred[:2]), (lq[:2], gt[:2]))
    ev.process(ev.finish(pred[2:]), (lq[2:], gt[2:]))
    got = ev.evaluate()
    t = gt.float() / 255
    psnr = [float(peak_signal_noise_ratio(pred[i:i + 1], t[i:i + 1], data_range=1.0)) for i in range(3)]
    ssim = [float(structural_similarity_index_measure(pred[i:i + 1], t[i:i + 1], data_range=1.0)) for i in range(3)]
    assert got["psnr"] == pytest.approx(np.mean(psnr), abs=1e-4)
    assert got["ssim"] == pytest.approx(np.mean(ssim), abs=1e-5)
    up = F.interpolate(lq.float() / 255, scale_factor=2.0, mode="bicubic").clamp(0, 1)
    assert got["psnr_input"] == pytest.approx(float(restore_metrics(up, t)[0].mean()), abs=1e-4)


# ------------------------------------------------------------------------------------------- training

def _train_and_compare(family, size, imgsz, data, tmp_path, **kw):
    m = _model(family, size, imgsz)
    before = m.val(data=str(data), imgsz=imgsz, batch=4)
    res = m.train(data=str(data), epochs=2, batch=4, imgsz=imgsz, project=str(tmp_path / "runs"), name="r",
                  workers=0, plots=False, verbose=False, seed=0, **kw)
    after = m.val(data=str(data), imgsz=imgsz, batch=4)
    assert res["best_metrics"]["psnr"] == pytest.approx(after["psnr"], abs=1e-4)
    assert after["psnr"] > before["psnr"] + 0.1, (before, after)
    assert after["psnr_input"] == pytest.approx(before["psnr_input"])
    return m, after


def test_two_epochs_on_the_builtin_set_beat_the_untrained_model(tmp_path):
    data = make_shapes_restore_dataset(tmp_path / "ds", n_train=8, n_val=4, imgsz=64)
    _train_and_compare("realesrgan", "x4t", 16, data, tmp_path, lr0=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("family,size,imgsz", [("nafnet", "s", 32), ("swinir", "s", 16)])
def test_two_epochs_every_family(family, size, imgsz, tmp_path):
    data = make_shapes_restore_dataset(tmp_path / "ds", n_train=16, n_val=8, imgsz=64)
    _train_and_compare(family, size, imgsz, data, tmp_path)


def test_val_on_a_user_paired_folder(tmp_path):
    """One lq/ + gt/ folder (validation on the same images), a scale-1 model; and its SR refusal."""
    root = tmp_path / "pairs"
    for i in range(3):
        clean = _image(40, 48, i)
        (root / "gt").mkdir(parents=True, exist_ok=True)
        (root / "lq").mkdir(exist_ok=True)
        Image.fromarray(clean).save(root / "gt" / f"{i}.png")
        Image.fromarray(degrade(clean, 1, np.random.default_rng(i))).save(root / "lq" / f"{i}.png")
    m = _model("nafnet", "s", 32)
    got = m.val(data=str(root), imgsz=32, batch=2)
    assert set(got) >= {"psnr", "ssim", "psnr_input"} and 10 < got["psnr_input"] < 40
    sr = _model("realesrgan", "x4t", 16)
    with pytest.raises(ValueError, match="scale 4 needs the gt image to be 4 times its lq image"):
        sr.val(data=str(root), imgsz=16, batch=2)


# ------------------------------------------------------------------------------------------- export

def _onnx_parity(family, size, imgsz, tmp_path):
    import onnxruntime as ort
    m = _model(family, size, imgsz)
    path = m.export(file=str(tmp_path / f"{family}.onnx"), imgsz=imgsz)
    x = torch.rand(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(3))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"images": x.numpy()})[0]
    with torch.no_grad():
        want = m.infer(x).clamp(0, 1).numpy()
    assert got.shape == (1, 3, imgsz * m.scale, imgsz * m.scale)
    assert np.abs(got - want).max() < 1e-4
    return path


def test_onnx_export_matches_eager(tmp_path):
    path = _onnx_parity("realesrgan", "x4t", 16, tmp_path)
    from libreyolo.export.onnx import read_metadata
    meta = read_metadata(path)
    assert (meta["task"], meta["scale"]) == ("restore", "4")
    # LibreYOLO(path) tiles and blends around the session: tests/unit/test_restore_onnx.py
    assert LibreYOLO(str(path), device="cpu")(_image(16, 16)).image.array.shape == (64, 64, 3)


@pytest.mark.slow
@pytest.mark.parametrize("family,size,imgsz", [("nafnet", "s", 32), ("swinir", "s", 16), ("realesrgan", "x2", 16)])
def test_onnx_export_matches_eager_every_family(family, size, imgsz, tmp_path):
    _onnx_parity(family, size, imgsz, tmp_path)
