"""Depth estimation on the CPU: Depth Anything V2's network pieces, predict end to end (the map
back at each image's size, inside the uint8 stage), DepthMap (summary, colour map, colour bar,
raw saves), the CLI, and the clear errors."""
import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from libreyolo import LibreYOLO
from libreyolo.engine.verify import _probes_u8, input_sensitive
from libreyolo.models.depth_anything.nn import CONFIGS, NATIVE_GRID, DepthAnythingNet
from libreyolo.ops.preprocess import Preprocess
from libreyolo.results import Results
from libreyolo.tasks.depth import DepthMap, resize_depth
from libreyolo.tasks.depth.results import colormap_lut

SIZE = 42   # a 3 x 3 patch grid: the network's pieces at their cheapest


@pytest.fixture(scope="module")
def model():
    # the verify/bench re-draw: a freshly initialised head is nearly flat after its final ReLU
    return input_sensitive(LibreYOLO.new("depth_anything", "s", device="cpu", seed=0))


def _image(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------ network

def test_sizes_follow_the_release_and_build_on_meta():
    """Parameter counts of the Depth Anything V2 release (24.8M / 97.5M / 335.3M); s is also the
    fixture's exact count (tests/unit/test_fixtures.py)."""
    counts = {}
    for size in CONFIGS:
        with torch.device("meta"):
            counts[size] = sum(p.numel() for p in DepthAnythingNet(size).parameters())
    assert counts == {"s": 24_785_089, "b": 97_470_785, "l": 335_315_649}


def test_position_embedding_keeps_native_grid_and_orients_other_grids(model):
    vit = copy.deepcopy(model.model.pretrained)
    assert vit.position_embedding(NATIVE_GRID, NATIVE_GRID) is vit.pos_embed
    with torch.no_grad():   # channel 0 = row index, channel 1 = column index of the native grid
        grid = torch.zeros(NATIVE_GRID, NATIVE_GRID, vit.pos_embed.shape[-1])
        grid[..., 0] = torch.arange(NATIVE_GRID, dtype=torch.float32)[:, None]
        grid[..., 1] = torch.arange(NATIVE_GRID, dtype=torch.float32)[None, :]
        vit.pos_embed[0, 1:] = grid.reshape(-1, grid.shape[-1])
        vit.pos_embed[0, 0] = 7.0
        pos = vit.position_embedding(3, 5)
    assert pos.shape == (1, 1 + 15, vit.pos_embed.shape[-1])
    assert torch.all(pos[0, 0] == 7.0)   # the class token's entry is kept as it is
    g = pos[0, 1:].reshape(3, 5, -1)
    rows, cols = g[..., 0], g[..., 1]
    assert torch.allclose(rows, rows[:, :1].expand(3, 5), atol=1e-4) and bool((rows[1:, 0] > rows[:-1, 0]).all())
    assert torch.allclose(cols, cols[:1].expand(3, 5), atol=1e-4) and bool((cols[0, 1:] > cols[0, :-1]).all())


def test_network_needs_multiples_of_the_patch(model):
    with pytest.raises(ValueError, match="multiples of 14, got 40x42"):
        model.model(torch.rand(1, 3, 40, 42))
    with torch.no_grad():
        out = model.model(torch.rand(2, 3, 28, 56))   # non-square grids work
    assert out.shape == (2, 1, 28, 56) and bool((out >= 0).all())


# ------------------------------------------------------------------------------------------ predict

def test_predict_maps_back_to_each_image_and_equals_the_network(model, tmp_path):
    img = _image(50, 70, 0)
    r = model(img, imgsz=SIZE, color_format="rgb")
    d = r.depth
    assert isinstance(d, DepthMap) and r.boxes is None and r.masks is None
    assert d.shape == (50, 70) and d.data.dtype == torch.float32 and d.data.device.type == "cpu"
    with torch.no_grad():   # the network on the resized image, resized back (align_corners=True)
        ref = model.infer(model.preprocess(torch.from_numpy(img)[None], SIZE))
    ref = F.interpolate(ref, size=(50, 70), mode="bilinear", align_corners=True)[0, 0]
    assert torch.equal(d.data, ref)
    assert d.min < d.max
    row = json.loads(r.to_json())
    assert row["shape"] == [50, 70] and row["min"] == round(d.min, 5) and row["max"] == round(d.max, 5)
    assert isinstance(r.numpy().depth.data, np.ndarray)


def test_uint8_stage_resizes_back_inside_and_equals_the_batch_stage(model):
    """The stage from uint8 images (the one predict captures for a repeated size) returns maps at
    the image size; the stage from a preprocessed batch returns the network size, which
    results() maps back with the same function: the same numbers."""
    pred = model.get_predictor()
    plan = pred.plan(SIZE)
    net, from_u8 = pred._stage_fns(SIZE, plan)
    u8 = torch.from_numpy(np.stack([_image(30, 45, 1), _image(30, 45, 2)]))
    with torch.no_grad():
        inside = from_u8(u8)
        batch = net(model.preprocess(u8, SIZE))
    assert inside.shape == (2, 30, 45) and batch.shape == (2, *model.preprocess.input_hw(30, 45, SIZE))
    assert torch.equal(inside, resize_depth(batch, 30, 45))


def test_verify_probes_reach_the_stage_and_change_its_output(model):
    """What `libreyolo verify` runs on the GPU (the uint8 stage with verify's two probe
    distributions) works on the CPU, and the two probes give different maps, so the parity
    protocol can tell a stale graph from a fresh one."""
    pred = model.get_predictor()
    plan = pred.plan(SIZE)
    from_u8 = pred._stage_fns(SIZE, plan)[1]
    ua, ub = _probes_u8(1, 24, 32, "cpu")
    extra = plan.extra(((24, 32),), SIZE)
    with torch.no_grad():
        a, b = from_u8(ua, *extra), from_u8(ub, *extra)
    assert a.shape == b.shape == (1, 24, 32) and not torch.equal(a, b)


def test_mixed_size_batch_matches_one_by_one(model):
    """The network input keeps each image's aspect ratio ("cover"), so images of different sizes
    cannot share a batch (one error says so); images of one size can, and each gets its own map
    back, equal to the image alone to float32 rounding (the ViT's matrix products block
    differently for 2 rows of tokens than for 1, so batch and single runs are not bitwise equal
    in eager either)."""
    with pytest.raises(ValueError, match="keeps each image's aspect ratio.*batch=1"):
        model([_image(50, 70, 3), _image(80, 40, 4)], imgsz=SIZE, batch=2)
    images = [_image(50, 70, 3), _image(50, 70, 4)]
    batched = model(images, imgsz=SIZE, batch=2)
    for img, r in zip(images, batched):
        alone = model(img, imgsz=SIZE)
        assert r.depth.shape == img.shape[:2]
        torch.testing.assert_close(r.depth.data, alone.depth.data, rtol=1e-4, atol=1e-5)


def test_resize_depth_keeps_corners_and_skips_same_size():
    d = torch.rand(2, 6, 9)
    assert resize_depth(d, 6, 9) is d
    up = resize_depth(d, 11, 17)
    assert up.shape == (2, 11, 17)
    for (i, j), (k, m) in (((0, 0), (0, 0)), ((0, -1), (0, -1)), ((-1, 0), (-1, 0)), ((-1, -1), (-1, -1))):
        assert torch.equal(up[:, i, j], d[:, k, m])


def test_a_letterbox_preprocess_is_refused_by_name(model, monkeypatch):
    monkeypatch.setattr(model, "preprocess", Preprocess("center"))
    with pytest.raises(ValueError, match="resize of the whole image without padding.*'center'"):
        model(_image(20, 20, 0), imgsz=SIZE)


def test_checkpoint_round_trip_keeps_task_and_family(model, tmp_path):
    path = model.save(tmp_path / "LibreDepthAnythingV2s.pt")
    back = LibreYOLO(str(path), device="cpu")
    assert (back.FAMILY, back.size, back.TASK, back.nc, back.imgsz) == ("depth_anything", "s", "depth", 1, 518)
    img = _image(30, 30, 6)
    assert torch.equal(back(img, imgsz=SIZE).depth.data, model(img, imgsz=SIZE).depth.data)


# ------------------------------------------------------------------------------------------ results

def _ramp(h=40, w=60):
    return DepthMap(torch.linspace(0.0, 2.0, h * w).reshape(h, w))


def test_colorize_spans_the_colour_map_and_the_bar_reads_near_at_the_top():
    d = _ramp()
    lut = colormap_lut("inferno")
    pic = d.colorize("inferno")
    assert pic.shape == (40, 60, 3) and pic.dtype == np.uint8
    assert tuple(pic[0, 0]) == tuple(lut[0]) and tuple(pic[-1, -1]) == tuple(lut[255])
    img = np.zeros((40, 60, 3), np.uint8)
    shown = d.plot_on(img, cmap="inferno")
    assert shown.shape[0] == 40 and shown.shape[1] > 60
    assert np.array_equal(shown[:, :60], pic)
    strip = shown[:, 60:]
    top = min(range(40), key=lambda y: np.abs(strip[y].astype(int) - lut[255]).sum(-1).min())
    bottom = min(range(40), key=lambda y: np.abs(strip[y].astype(int) - lut[0]).sum(-1).min())
    assert top < bottom   # the nearest value (largest inverse depth) at the top
    assert np.array_equal(d.plot_on(img, cmap="inferno", colorbar=False), pic)


def test_an_all_zero_map_is_explained_in_the_log(monkeypatch, caplog):
    """An untrained model's all-zero map draws one colour and a 0-0-0 bar: one warning says why."""
    from libreyolo.tasks.depth import results as depth_results
    monkeypatch.setattr(depth_results, "_said_constant", set())
    img = np.zeros((40, 60, 3), np.uint8)
    with caplog.at_level("WARNING", logger="libreyolo"):
        DepthMap(torch.zeros(40, 60)).plot_on(img)
        DepthMap(torch.zeros(40, 60)).plot_on(img)   # said once (a video would repeat it every frame)
        _ramp().plot_on(img)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "the same value (0) everywhere" in said[0] and "untrained depth model" in said[0]


def test_results_plot_and_save_write_the_colour_mapped_picture(tmp_path):
    img = _image(40, 60, 0)
    r = Results(img, "x.jpg", {0: "depth"}, depth=_ramp())
    pic = r.plot()
    assert pic.shape[0] == 40 and pic.shape[1] > 60
    out = r.save(tmp_path / "d.png")
    assert np.array_equal(np.asarray(Image.open(out).convert("RGB")), pic)
    assert "depth=DepthMap(shape=(40, 60)" in repr(r)


def test_raw_saves_npy_tif_exact_and_png_16_bit(tmp_path):
    d = DepthMap(torch.rand(13, 17) * 5)
    assert np.array_equal(np.load(d.save(tmp_path / "a.npy")), d.data.numpy())
    assert np.array_equal(np.asarray(Image.open(d.save(tmp_path / "a.tif"))), d.data.numpy())
    png = np.asarray(Image.open(d.save(tmp_path / "a.png")))
    assert png.dtype == np.uint16 and png.min() == 0 and png.max() == 65535
    assert np.array_equal(png, np.rint(d.normalized() * 65535).astype(np.uint16))
    with pytest.raises(ValueError, match=r"cannot save the depth map as '.*a\.jpg': use one of \.npy"):
        d.save(tmp_path / "a.jpg")


def test_depth_map_errors_name_the_problem():
    with pytest.raises(TypeError, match="torch tensor or numpy array, got list"):
        DepthMap([[1.0]])
    with pytest.raises(ValueError, match=r"an \(H, W\) map, got shape \(1, 4, 4\)"):
        DepthMap(torch.zeros(1, 4, 4))
    with pytest.raises(ValueError, match="floating point, got dtype torch.int64"):
        DepthMap(torch.zeros(4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown matplotlib colour map 'nope'"):
        _ramp().colorize("nope")
    bad = torch.ones(4, 4)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        DepthMap(bad).colorize()
    flat = DepthMap(torch.full((4, 4), 3.0))
    assert np.array_equal(flat.normalized(), np.zeros((4, 4), np.float32))   # constant: no division by 0
    with pytest.raises(ValueError, match=r"does not match the depth map \(40, 60\)"):
        _ramp().plot_on(np.zeros((10, 10, 3), np.uint8))


# ---------------------------------------------------------------------------------------------- CLI

def test_cli_predict_saves_the_picture_and_json(tmp_path, monkeypatch):
    from libreyolo.cli import main
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.png"
    Image.fromarray(_image(30, 40, 7)).save(src)
    out = tmp_path / "pred.json"
    assert main(["predict", "model=depth_anything-s", f"source={src}", f"imgsz={SIZE}", "device=cpu",
                 f"save_dir={tmp_path / 'pics'}", f"json={out}"]) == 0
    pic = Image.open(tmp_path / "pics" / "in.jpg")
    assert pic.size[1] == 30 and pic.size[0] > 40
    rows = json.loads(out.read_text())
    assert rows[0]["detections"]["shape"] == [30, 40]


def test_cli_bench_runs_the_depth_arms_on_the_cpu(tmp_path):
    """`libreyolo bench` for the family (the GPU run adds the graph arms and the end-to-end over
    graphed-network ratio the depth target is stated in)."""
    from libreyolo.cli import main
    out = tmp_path / "b.json"
    assert main(["bench", "model=depth_anything-s", f"imgsz={SIZE}", "runs=1", "warmup=0", "device=cpu",
                 f"json={out}"]) == 0
    res = json.loads(out.read_text())
    assert res["model"] == "depth_anything-s" and res["task"] == "depth" and res["imgsz"] == SIZE
    assert {"forward_eager", "predict_eager"} <= set(res["arms"])


# ----------------------------------------------------------------------------------------- training
from libreyolo.tasks.depth import DepthEvaluator, ScaleShiftInvariantLoss, align_scale_shift, depth_metrics  # noqa: E402
from libreyolo.tasks.depth.data import DepthDataset, check_samples, collate_depth, read_target, resolve_depth_data  # noqa: E402
from libreyolo.tasks.depth.synthetic import make_shapes_depth_dataset, render_depth_scene  # noqa: E402


def test_alignment_recovers_scale_and_shift_over_valid_pixels_only():
    g = torch.Generator().manual_seed(0)
    pred = torch.rand(2, 8, 9, generator=g)
    target = torch.stack([3.0 * pred[0] + 2.0, -0.5 * pred[1] + 1.0])
    valid = torch.rand(2, 8, 9, generator=g) > 0.3
    target_noisy = torch.where(valid, target, torch.full_like(target, 1e3))   # invalid pixels: anything
    torch.testing.assert_close(align_scale_shift(pred, target_noisy, valid)[valid], target[valid])
    loss_fn = ScaleShiftInvariantLoss()
    loss, items = loss_fn(pred[:, None], target_noisy, valid)
    assert loss.item() < 1e-5 and items.shape == (1,)
    other = torch.rand(2, 1, 8, 9, generator=g)
    a, _ = loss_fn(other, target, valid)
    b, _ = loss_fn(7.0 * other - 3.0, target, valid)     # invariant to the prediction's scale and shift
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_loss_is_finite_for_flat_maps_and_empty_masks_and_has_gradients():
    loss_fn = ScaleShiftInvariantLoss()
    target = torch.rand(2, 6, 6)
    flat = torch.full((2, 1, 6, 6), 0.5, requires_grad=True)
    loss, _ = loss_fn(flat, target, torch.ones(2, 6, 6, dtype=torch.bool))
    assert torch.isfinite(loss)                          # no scale to fit: s = 0, t = the target's mean
    none, _ = loss_fn(flat, target, torch.zeros(2, 6, 6, dtype=torch.bool))
    assert none.item() == 0.0
    pred = torch.rand(2, 1, 6, 6, requires_grad=True)
    loss, _ = loss_fn(pred, target, torch.ones(2, 6, 6, dtype=torch.bool))
    loss.backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0


def test_metrics_of_a_perfect_and_a_wrong_prediction():
    target = torch.rand(1, 10, 10) + 0.5
    valid = torch.ones(1, 10, 10, dtype=torch.bool)
    ev = DepthEvaluator()
    ev.reset()
    ev.process((2.0 * target + 1.0)[:, None], (None, target, valid))   # an affine copy: perfect
    m = ev.evaluate()
    assert m["delta1"] == pytest.approx(1.0) and m["abs_rel"] == pytest.approx(0.0, abs=1e-5)
    absrel, hits, n = depth_metrics(torch.rand(1, 10, 10), target, valid)
    assert n.item() == 100 and 0 <= hits.item() <= 100 and absrel.item() > 0
    ev.reset()
    assert np.isnan(ev.evaluate()["delta1"])


def _write_pair(root, split, stem, img, depth, suffix=".npy"):
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "depth" / split).mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).save(root / "images" / split / f"{stem}.png")
    if suffix == ".npy":
        np.save(root / "depth" / split / f"{stem}.npy", depth)
    else:
        Image.fromarray(depth).save(root / "depth" / split / f"{stem}.png")


def test_targets_are_read_as_disparity_with_holes_invalid(tmp_path):
    d = np.array([[2.0, 0.0], [np.nan, 4.0]], np.float32)
    np.save(tmp_path / "a.npy", d)
    disp, valid = read_target(tmp_path / "a.npy", "depth")
    assert valid.tolist() == [[True, False], [False, True]]
    assert disp.tolist() == [[0.5, 0.0], [0.0, 0.25]]
    same, _ = read_target(tmp_path / "a.npy", "disparity")
    assert same[0, 0] == 2.0
    Image.fromarray(np.array([[2000, 0]], np.uint16)).save(tmp_path / "b.png")   # 16-bit, millimetres
    disp, valid = read_target(tmp_path / "b.png", "depth", 1000.0)
    assert disp.tolist() == [[0.5, 0.0]] and valid.tolist() == [[True, False]]
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(tmp_path / "c.png")
    with pytest.raises(ValueError, match="one channel.*RGB"):
        read_target(tmp_path / "c.png")


def test_dataset_problems_are_reported_together_naming_each_file(tmp_path):
    root = tmp_path / "ds"
    img = _image(12, 16, 0)
    _write_pair(root, "train", "ok", img, np.ones((12, 16), np.float32))
    _write_pair(root, "train", "small", img, np.ones((6, 16), np.float32))
    _write_pair(root, "val", "holes", img, np.zeros((12, 16), np.float32))
    Image.fromarray(img).save(root / "images" / "val" / "lonely.png")
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\n")
    data = resolve_depth_data(root)
    with pytest.raises(ValueError) as e:
        check_samples(data)
    msg = str(e.value)
    assert "has 3 problems" in msg
    assert "depth/train/small.npy: map is 16x6 but its image images/train/small.png is 16x12" in msg
    assert "depth/val/holes.npy: no valid pixel" in msg
    assert "images/val/lonely.png: depth map not found (expected depth/val/lonely.png" in msg
    (root / "bad.yaml").write_text("path: .\ntrain: images/train\nval: images/val\ntarget: metres\n")
    with pytest.raises(ValueError, match="'target' must be one of depth, disparity, got 'metres'"):
        resolve_depth_data(root / "bad.yaml")
    with pytest.raises(FileNotFoundError, match="expected 'shapes-depth'"):
        resolve_depth_data(tmp_path / "nowhere.yaml")


def test_flip_moves_image_and_map_together(tmp_path):
    root = tmp_path / "ds"
    rng = np.random.default_rng(0)
    img, depth = render_depth_scene(rng, 40, 30)
    _write_pair(root, "train", "a", img, depth)
    _write_pair(root, "val", "a", img, depth)
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\n")
    data = resolve_depth_data(root)
    plain = DepthDataset(data.train, 28)[0]
    flipped = DepthDataset(data.train, 28, augment=True, fliplr=1.0, color_jitter=0.0)[0]
    for a, b in zip(plain, flipped):
        assert torch.equal(a.flip(-1), b)
    x, t, v = collate_depth([plain, flipped])
    assert x.shape == (2, 3, 28, 28) and x.dtype == torch.uint8 and t.dtype == torch.float32 and v.dtype == torch.bool
    assert float(t[0].max()) <= 1 / 1.5 + 1e-6 and float(t[0].min()) >= 1 / 10 - 1e-6


def test_shapes_depth_is_deterministic_and_layered(tmp_path):
    a = make_shapes_depth_dataset(tmp_path / "a", n_train=3, n_val=2, imgsz=48)
    b = make_shapes_depth_dataset(tmp_path / "b", n_train=3, n_val=2, imgsz=48)
    fa = json.loads((a.parent / "manifest.json").read_text())["files"]
    fb = json.loads((b.parent / "manifest.json").read_text())["files"]
    assert fa == fb
    pixels, depth = render_depth_scene(np.random.default_rng(1), 64, 48)
    assert pixels.shape == (48, 64, 3) and depth.shape == (48, 64)
    assert depth.min() >= 1.5 - 1e-6 and depth.max() == pytest.approx(10.0)
    assert depth[0].min() == pytest.approx(10.0) and depth[-1].mean() < depth[0].mean()   # wall far, floor near


def test_one_step_training_then_checkpoint_predicts(tmp_path):
    """The mechanics through the shared trainer: the loss is finite, the metrics are reported,
    best.pt loads as a depth model and predicts (learning itself is measured in docs/families.md)."""
    yaml_path = make_shapes_depth_dataset(tmp_path / "sd", n_train=4, n_val=2, imgsz=40)
    m = LibreYOLO.new("depth_anything", "s", device="cpu", seed=0)
    res = m.train(data=str(yaml_path), epochs=1, imgsz=28, batch=4, workers=0, project=str(tmp_path / "runs"),
                  plots=False)
    assert all(np.isfinite(v) for row in res["losses"] for v in row)
    assert 0 <= res["delta1"] <= 1 and res["abs_rel"] >= 0 and res["best_epoch"] == 1
    best = LibreYOLO(res["best"], device="cpu")
    assert best.TASK == "depth" and best.trained
    assert best(_image(20, 30, 0), imgsz=28).depth.shape == (20, 30)
