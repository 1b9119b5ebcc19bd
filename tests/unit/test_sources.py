"""load_sources: every accepted input kind, colour handling, and every error path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from libreyolo.data.sources import IMAGE_EXTENSIONS, SourceItem, iter_sources, load_sources


def rgb_array(h: int = 6, w: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def write(path: Path, arr: np.ndarray, **kw) -> Path:
    Image.fromarray(arr).save(path, **kw)
    return path


def check_item(item: SourceItem, shape: tuple[int, int]) -> None:
    assert isinstance(item.image, (np.ndarray, torch.Tensor))
    assert tuple(item.image.shape) == (*shape, 3)
    if isinstance(item.image, np.ndarray):
        assert item.image.dtype == np.uint8 and item.image.flags.c_contiguous
    else:
        assert item.image.dtype == torch.uint8 and item.image.is_contiguous()


# ---- files, directories, globs --------------------------------------------------------------------


def test_png_file_roundtrips_exactly(tmp_path):
    arr = rgb_array()
    path = write(tmp_path / "a.png", arr)
    for src in (str(path), path):
        (item,) = load_sources(src)
        check_item(item, (6, 8))
        assert item.name == str(path)
        np.testing.assert_array_equal(item.image, arr)


def test_jpeg_file_decodes_close(tmp_path):
    arr = np.full((16, 16, 3), (200, 100, 50), np.uint8)
    path = write(tmp_path / "a.JPG", arr, quality=95)  # upper-case suffix works too
    (item,) = load_sources(path)
    check_item(item, (16, 16))
    assert np.abs(item.image.astype(int) - arr).max() <= 4


def test_grayscale_and_rgba_files_become_rgb(tmp_path):
    gray = np.arange(48, dtype=np.uint8).reshape(6, 8)
    rgba = np.dstack([rgb_array(), np.zeros((6, 8), np.uint8)])  # fully transparent: alpha dropped
    (g,) = load_sources(write(tmp_path / "g.png", gray))
    (c,) = load_sources(write(tmp_path / "c.png", rgba))
    np.testing.assert_array_equal(g.image, np.repeat(gray[:, :, None], 3, axis=2))
    np.testing.assert_array_equal(c.image, rgba[:, :, :3])


def test_exif_orientation_is_applied(tmp_path):
    arr = rgb_array(4, 10)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = tmp_path / "rot.jpg"
    Image.fromarray(arr).save(path, exif=exif, quality=95)
    (item,) = load_sources(path)
    assert item.image.shape == (10, 4, 3)
    (pil_item,) = load_sources(Image.open(path))  # PIL inputs are made upright the same way
    assert pil_item.image.shape == (10, 4, 3)


def test_directory_sorted_non_recursive_images_only(tmp_path):
    for name in ("b.png", "a.jpeg", "c.WEBP"):
        write(tmp_path / name, rgb_array())
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / ".hidden.png").write_bytes(b"junk")
    sub = tmp_path / "sub"
    sub.mkdir()
    write(sub / "d.png", rgb_array())
    items = load_sources(tmp_path)
    assert [Path(i.name).name for i in items] == ["a.jpeg", "b.png", "c.WEBP"]
    for item in items:
        check_item(item, (6, 8))


def test_glob_pattern_sorted(tmp_path):
    for name in ("x2.png", "x1.png", "y.png"):
        write(tmp_path / name, rgb_array())
    items = load_sources(str(tmp_path / "x*.png"))
    assert [Path(i.name).name for i in items] == ["x1.png", "x2.png"]


def test_image_extensions_constant():
    assert isinstance(IMAGE_EXTENSIONS, frozenset)
    assert {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"} == IMAGE_EXTENSIONS


# ---- in-memory inputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "P"])
def test_pil_image_any_mode(mode):
    pil = Image.fromarray(rgb_array()).convert(mode)
    (item,) = load_sources(pil)
    check_item(item, (6, 8))
    assert item.name == "image0"
    np.testing.assert_array_equal(item.image, np.asarray(pil.convert("RGB")))


def test_numpy_rgb_is_copied_not_aliased():
    arr = rgb_array()
    (item,) = load_sources(arr, bgr=False)
    np.testing.assert_array_equal(item.image, arr)
    arr[:] = 0
    assert item.image.any()


@pytest.mark.parametrize("shape", [(6, 8), (6, 8, 1)])
def test_numpy_grayscale_replicated(shape):
    gray = np.arange(48, dtype=np.uint8).reshape(shape)
    (item,) = load_sources(gray)
    check_item(item, (6, 8))
    for c in range(3):
        np.testing.assert_array_equal(item.image[:, :, c], gray.reshape(6, 8))


def test_numpy_is_bgr_by_default_rgb_when_said_and_rgba_drops_alpha():
    arr = np.zeros((2, 2, 3), np.uint8)
    arr[0, 0] = (255, 0, 0)  # red in RGB order, blue in OpenCV's BGR
    (rgb,) = load_sources(arr, bgr=False)
    (bgr,) = load_sources(arr)  # numpy arrays are BGR unless said otherwise (OpenCV, the ecosystem)
    (said,) = load_sources(arr, bgr=True)
    assert tuple(rgb.image[0, 0]) == (255, 0, 0)
    assert tuple(bgr.image[0, 0]) == (0, 0, 255) == tuple(said.image[0, 0])
    assert bgr.image.flags.c_contiguous
    bgra = np.dstack([arr, np.full((2, 2), 7, np.uint8)])
    (out,) = load_sources(bgra)
    assert tuple(out.image[0, 0]) == (0, 0, 255) and out.image.shape == (2, 2, 3)
    (out,) = load_sources(bgra, bgr=False)
    assert tuple(out.image[0, 0]) == (255, 0, 0)
    # PIL images and tensors stay RGB
    (pil,) = load_sources(Image.fromarray(arr))
    (ten,) = load_sources(torch.from_numpy(arr).permute(2, 0, 1))
    assert tuple(pil.image[0, 0]) == (255, 0, 0) and tuple(ten.image[0, 0].tolist()) == (255, 0, 0)


@pytest.mark.parametrize("opencv", [True, False])
def test_channel_reorder_is_the_same_bytes_with_and_without_opencv(opencv, monkeypatch):
    """BGR / BGRA / RGBA -> RGB through OpenCV's cvtColor where it is installed, numpy's plane
    copies where not: the bytes of numpy's fancy indexing either way, contiguous or not."""
    from libreyolo.data import sources
    if opencv:
        pytest.importorskip("cv2")
        monkeypatch.setattr(sources, "_CV2", None)    # found again
    else:
        monkeypatch.setattr(sources, "_CV2", False)   # as if not installed
    rng = np.random.default_rng(0)
    for shape in [(37, 53, 3), (37, 53, 4), (2, 4, 3), (720, 1280, 3)]:
        arr = rng.integers(0, 256, shape, dtype=np.uint8)
        views = [arr, arr[::2, 1::3], np.asfortranarray(arr)]
        for a in views:
            for bgr in (True, False):
                if a.shape[2] == 3 and not bgr:
                    continue   # nothing to reorder
                (item,) = load_sources(a, bgr=bgr)
                ref = np.ascontiguousarray(a[:, :, [2, 1, 0] if bgr else [0, 1, 2]])
                assert item.image.flags.c_contiguous and item.image.dtype == np.uint8
                np.testing.assert_array_equal(item.image, ref)
    assert (sources._CV2 is not False) == opencv


@pytest.mark.parametrize("channels", [3, 4])
@pytest.mark.parametrize("bgr", [True, False])
@pytest.mark.parametrize("view", ["contiguous", "strided", "float"])
def test_numpy_channel_order_is_numpys_own_slicing(channels, bgr, view):
    """The channel copy (one plane at a time) gives exactly the bytes of numpy's slicing of the
    array, owned, C-contiguous and writable, for contiguous, strided and float inputs."""
    rng = np.random.default_rng(channels + 2 * bgr)
    arr = rng.integers(0, 256, (13, 17, channels), dtype=np.uint8)
    if view == "strided":
        arr = np.asfortranarray(arr)[::2, 1::3]
    elif view == "float":
        arr = arr.astype(np.float32) / 255
    (item,) = load_sources(arr, bgr=bgr)
    u8 = arr if arr.dtype == np.uint8 else np.rint(np.clip(arr.astype(np.float64) * 255, 0, 255)).astype(np.uint8)
    want = np.ascontiguousarray(u8[:, :, 2::-1] if bgr else u8[:, :, :3])
    assert item.image.dtype == np.uint8 and item.image.flags.c_contiguous and item.image.flags.writeable
    assert item.image.flags.owndata and not np.shares_memory(item.image, arr)
    np.testing.assert_array_equal(item.image, want)


def test_parse_color_reads_bgr_and_color_format():
    from libreyolo.data.sources import parse_color
    assert parse_color() is None and parse_color(None, "auto") is None
    assert parse_color(None, "rgb") is False and parse_color(None, "BGR") is True
    assert parse_color(False) is False and parse_color(True, "bgr") is True
    with pytest.raises(ValueError, match="contradict"):
        parse_color(True, "rgb")
    with pytest.raises(ValueError, match="color_format must be one of auto, bgr, rgb"):
        parse_color(None, "hsv")
    with pytest.raises(ValueError, match="bgr must be True or False"):
        parse_color("yes")


def test_numpy_float_in_unit_range():
    arr = np.array([[[0.0, 0.5, 1.0]]], np.float32)
    (item,) = load_sources(arr, bgr=False)
    assert item.image.dtype == np.uint8
    assert tuple(item.image[0, 0]) == (0, round(0.5 * 255), 255)


def test_numpy_non_contiguous_view():
    arr = rgb_array(12, 16)[::2, ::2]
    (item,) = load_sources(arr, bgr=False)
    assert item.image.flags.c_contiguous
    np.testing.assert_array_equal(item.image, arr)


def test_tensor_chw_float_and_uint8():
    arr = rgb_array()
    chw_u8 = torch.from_numpy(arr).permute(2, 0, 1)
    (a,) = load_sources(chw_u8)
    assert isinstance(a.image, torch.Tensor) and a.image.device == chw_u8.device
    check_item(a, (6, 8))
    assert torch.equal(a.image, torch.from_numpy(arr))
    (b,) = load_sources(chw_u8.float() / 255)
    assert torch.equal(b.image, torch.from_numpy(arr))
    (c,) = load_sources((chw_u8.float() / 255).half())
    assert torch.equal(c.image, torch.from_numpy(arr))


def test_tensor_float_within_the_rounding_slack_is_clamped():
    t = torch.tensor([-0.0005, 0.2, 1.0005]).reshape(3, 1, 1)
    (item,) = load_sources(t)
    assert item.image[0, 0].tolist() == [0, 51, 255]


@pytest.mark.parametrize("make", [
    lambda: torch.rand(3, 8, 8) * 255,                       # 0..255 data as float
    lambda: torch.tensor([-0.5, 0.2, 0.5]).reshape(3, 1, 1),
    lambda: torch.rand(2, 3, 4, 4).double() * 2,             # a batch: one check for all of it
    lambda: (torch.rand(3, 4, 4) * 255).half(),
])
def test_tensor_float_outside_unit_range_is_refused_with_the_fix(make):
    with pytest.raises(ValueError, match=r"torch tensor .* span \[.*\]: float images must be finite and lie "
                                         r"in \[0, 1\]; for 0..255 data divide by 255 \(t / 255, or pass "
                                         r"uint8: t.to\(torch.uint8\)\)"):
        load_sources(make())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_are_refused_for_arrays_and_tensors(bad):
    arr = np.full((4, 4, 3), 0.5, np.float32)
    arr[1, 2, 0] = bad
    t = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
    for src, kind in ((arr, "numpy array"), (t, "torch tensor"), (t.to(torch.bfloat16), "torch tensor")):
        with pytest.raises(ValueError, match=f"{kind} .* hold NaN or infinite values: float images must be "
                                             "finite"):
            load_sources(src)


def test_numpy_and_tensor_range_errors_agree():
    arr = np.full((4, 4, 3), 200.0)
    t = torch.from_numpy(arr).permute(2, 0, 1)
    msgs = []
    for src in (arr, t):
        with pytest.raises(ValueError) as info:
            load_sources(src)
        msgs.append(str(info.value).split(": ", 1)[1])
    assert msgs[0].replace("arr.astype(np.uint8)", "X").replace("arr / 255", "Y") == \
        msgs[1].replace("t.to(torch.uint8)", "X").replace("t / 255", "Y")


def test_uint8_tensor_skips_the_value_check(monkeypatch):
    import libreyolo.data.sources as sources

    monkeypatch.setattr(sources, "_check_float_range", lambda *a: pytest.fail("uint8 input was range-checked"))
    (item,) = load_sources(torch.zeros(3, 4, 4, dtype=torch.uint8))
    check_item(item, (4, 4))


@pytest.mark.parametrize("channels", [1, 4])
def test_tensor_gray_and_rgba(channels):
    t = torch.rand(channels, 5, 7)
    (item,) = load_sources(t)
    check_item(item, (5, 7))
    expected = (t[:1].expand(3, -1, -1) if channels == 1 else t[:3]).clamp(0, 1).mul(255).round()
    assert torch.equal(item.image, expected.to(torch.uint8).permute(1, 2, 0))


def test_tensor_bchw_expands_and_names():
    batch = torch.rand(3, 3, 5, 7, requires_grad=True)
    items = load_sources(batch)
    assert [i.name for i in items] == ["image0", "image1", "image2"]
    for k, item in enumerate(items):
        check_item(item, (5, 7))
        expected = (batch[k].detach() * 255).round().to(torch.uint8).permute(1, 2, 0)
        assert torch.equal(item.image, expected)


def test_channels_last_uint8_tensor_is_not_aliased():
    t = torch.from_numpy(rgb_array()).permute(2, 0, 1)  # a channels-last view: HWC is contiguous
    (item,) = load_sources(t)
    t.zero_()
    assert item.image.any()


def test_list_mixing_kinds(tmp_path):
    path = write(tmp_path / "f.png", rgb_array())
    write(tmp_path / "d1.png", rgb_array())
    write(tmp_path / "d2.png", rgb_array())
    pil = Image.fromarray(rgb_array())
    items = load_sources([str(path), rgb_array(), pil, torch.rand(2, 3, 6, 8), str(tmp_path / "d*.png")])
    assert len(items) == 7
    assert items[0].name == str(path)
    assert [i.name for i in items[1:5]] == ["image1", "image2", "image3", "image4"]
    assert [Path(i.name).name for i in items[5:]] == ["d1.png", "d2.png"]
    assert isinstance(items[3].image, torch.Tensor) and isinstance(items[2].image, np.ndarray)
    for item in items:
        check_item(item, (6, 8))
    assert len(load_sources((rgb_array(),))) == 1  # tuples work too


def test_iter_sources_is_lazy_but_validates_up_front(tmp_path):
    good = write(tmp_path / "good.png", rgb_array())
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    it = iter_sources([good, bad])  # paths exist: no error yet
    assert next(it).name == str(good)
    with pytest.raises(ValueError, match="bad.png"):
        next(it)
    with pytest.raises(FileNotFoundError):
        iter_sources([good, tmp_path / "missing.png"])  # missing paths fail before any decoding


# ---- errors ---------------------------------------------------------------------------------------


def test_corrupt_file(tmp_path):
    path = tmp_path / "corrupt.jpg"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 500, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match=r"cannot decode image '.*corrupt\.jpg'"):
        load_sources(path)


def test_truncated_file(tmp_path):
    good = write(tmp_path / "full.png", rgb_array(64, 64))
    path = tmp_path / "trunc.png"
    path.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match="trunc.png"):
        load_sources(path)


def test_missing_paths(tmp_path):
    missing = tmp_path / "nope.jpg"
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        load_sources(missing)
    with pytest.raises(FileNotFoundError, match=r"nodir"):
        load_sources(str(tmp_path / "nodir" / ""))
    with pytest.raises(FileNotFoundError, match=r"zz\*\.png"):
        load_sources(str(tmp_path / "zz*.png"))
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        load_sources([rgb_array(), missing])


def test_empty_directory(tmp_path):
    (tmp_path / "readme.txt").write_text("no images here")
    with pytest.raises(FileNotFoundError, match=str(tmp_path).replace("\\", "\\\\")):
        load_sources(tmp_path)


def test_empty_list():
    with pytest.raises(ValueError, match="no images given"):
        load_sources([])
    with pytest.raises(ValueError, match="no images given"):
        load_sources(())


@pytest.mark.parametrize(
    "arr, needle",
    [
        (np.zeros((4, 4, 2), np.uint8), r"\(4, 4, 2\)"),
        (np.zeros((2, 4, 4, 3), np.uint8), r"\(2, 4, 4, 3\)"),
        (np.zeros((0, 4, 3), np.uint8), r"zero size"),
        (np.zeros((4, 4, 3), np.int64), "int64"),
        (np.zeros((4, 4, 3), bool), "bool"),
        (np.zeros((4, 4, 3), np.complex64), "complex64"),
        (np.full((4, 4, 3), 200.0), r"\[0, 1\]"),
        (np.zeros((4, 4, 3), np.uint16), r"uint16.*for 16-bit data pass \(arr / 65535\)"),
    ],
)
def test_bad_numpy_arrays(arr, needle):
    with pytest.raises(ValueError, match=needle) as info:
        load_sources(arr)
    assert "numpy array" in str(info.value)


@pytest.mark.parametrize(
    "t, needle",
    [
        (torch.zeros(1, 2, 3, 4, 4), r"\(1, 2, 3, 4, 4\)"),
        (torch.zeros(2, 4, 4), r"\(2, 4, 4\)"),
        (torch.zeros(4, 4), r"\(4, 4\)"),
        (torch.zeros(0, 3, 4, 4), "zero size"),
        (torch.zeros(3, 4, 4, dtype=torch.int64), "int64"),
        (torch.zeros(3, 4, 4, dtype=torch.bool), "bool"),
    ],
)
def test_bad_tensors(t, needle):
    with pytest.raises(ValueError, match=needle) as info:
        load_sources(t)
    assert "torch tensor" in str(info.value)


def test_error_in_list_names_position():
    with pytest.raises(ValueError, match=r"source\[1\]"):
        load_sources([rgb_array(), np.zeros((4, 4, 2), np.uint8)])


@pytest.mark.parametrize("bad", [42, 3.5, None, {"a": 1}, b"bytes"])
def test_unsupported_types(bad):
    with pytest.raises(TypeError, match=type(bad).__name__):
        load_sources(bad)
    with pytest.raises(TypeError, match=r"source\[0\]"):
        load_sources([bad])


def test_nested_list_rejected():
    with pytest.raises(TypeError, match="nested"):
        load_sources([[rgb_array()]])


def test_bundled_sample_image_loads():
    from libreyolo.assets import SAMPLE_IMAGE

    assert Path(SAMPLE_IMAGE).is_absolute() and Path(SAMPLE_IMAGE).stat().st_size < 300_000
    (item,) = load_sources(SAMPLE_IMAGE)
    check_item(item, (720, 1280))
    assert item.image.std() > 20  # a real scene, not a flat fill


def test_borrow_uses_rgb_uint8_arrays_in_place_until_owned():
    arr = np.random.default_rng(0).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    (copied,) = load_sources(arr, bgr=False)
    assert not copied.borrowed and not np.shares_memory(copied.image, arr)
    (item,) = load_sources(arr, bgr=False, borrow=True)
    assert item.borrowed and item.image is arr
    item.own()
    assert not item.borrowed and not np.shares_memory(item.image, arr)
    np.testing.assert_array_equal(item.image, arr)
    big = np.random.default_rng(1).integers(0, 256, (480, 640, 3), dtype=np.uint8)  # torch's threaded copy
    for frozen in (False, True):  # a read-only array is copied by numpy (torch warns on those)
        big.flags.writeable = not frozen
        (item,) = load_sources(big, bgr=False, borrow=True)
        item.own()
        assert item.image.flags.writeable and not np.shares_memory(item.image, big)
        np.testing.assert_array_equal(item.image, big)
    # arrays that need a conversion (BGR, the default) are not borrowed, unless keep_bgr says so
    (bgr,) = load_sources(arr, borrow=True)
    assert not bgr.borrowed and not bgr.bgr and not np.shares_memory(bgr.image, arr)


def test_keep_bgr_lends_bgr_uint8_arrays_as_they_are_and_own_makes_them_rgb():
    arr = np.random.default_rng(2).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    rgb = arr[:, :, ::-1]
    (item,) = load_sources(arr, borrow=True, keep_bgr=True)
    assert item.borrowed and item.bgr and item.image is arr
    item.own()
    assert not item.borrowed and not item.bgr and not np.shares_memory(item.image, arr)
    np.testing.assert_array_equal(item.image, rgb)
    assert item.image.flags.c_contiguous
    # the same RGB bytes as the host's reorder at load time
    (host,) = load_sources(arr)
    np.testing.assert_array_equal(item.image, host.image)
    # only BGR uint8 HxWx3 C-contiguous arrays are lent so; everything else converts as before
    others = [arr[:, ::2], arr[:, :, :1].copy(),
              np.concatenate([arr, arr[:, :, :1]], axis=2), arr.astype(np.float32) / 255.0]
    for other in others:
        (it,) = load_sources(other, borrow=True, keep_bgr=True)
        assert not it.bgr and it.image.shape[2] == 3 and it.image is not other
        (ref,) = load_sources(other)
        np.testing.assert_array_equal(it.image, ref.image)
    (it,) = load_sources(arr, bgr=False, borrow=True, keep_bgr=True)   # RGB: borrowed as before
    assert it.borrowed and not it.bgr and it.image is arr
    (it,) = load_sources(arr, keep_bgr=True)   # without borrow: converted at once
    assert not it.borrowed and not it.bgr
    np.testing.assert_array_equal(it.image, rgb)


def test_predict_result_does_not_change_when_the_callers_array_does():
    from libreyolo import LibreYOLO
    model = LibreYOLO.new("yolo9", "t", nc=3, device="cpu", seed=0)
    arr = np.random.default_rng(1).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    keep = arr.copy()
    res = model(arr, imgsz=64, conf=0.0, color_format="rgb")
    arr[:] = 0
    np.testing.assert_array_equal(res.orig_img, keep)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_decode_image_is_pil_to_rgb_of_the_file(tmp_path, orientation):
    """decode_image turns its own image upright in place: the same pixels as pil_to_rgb, which
    copies a caller's image to turn it, for every EXIF orientation."""
    from libreyolo.data.sources import decode_image, pil_to_rgb

    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"o{orientation}.jpg"
    Image.fromarray(rgb_array(6, 10)).save(path, exif=exif, quality=95)
    with Image.open(path) as im:
        want = pil_to_rgb(im)
    got = decode_image(path)
    assert got.flags.writeable and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
