"""pil_to_rgb / decode_image: every PIL mode and bit depth becomes the 8-bit RGB computed by hand."""

from __future__ import annotations

import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from libreyolo.data.augment import DetectionDataset
from libreyolo.data.datasets import Sample
from libreyolo.data.sources import decode_image, load_sources, pil_to_rgb


def png_bytes(arr: np.ndarray, color_type: int, bit_depth: int) -> bytes:
    """A minimal PNG of ``arr`` (H, W[, C]) written by hand: Pillow cannot write 16-bit colour."""
    h, w = arr.shape[:2]
    dtype = ">u2" if bit_depth == 16 else "u1"
    raw = b"".join(b"\x00" + np.ascontiguousarray(arr[y]).astype(dtype).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def one_row(mode: str, values: list) -> Image.Image:
    im = Image.new(mode, (len(values), 1))
    for x, v in enumerate(values):
        im.putpixel((x, 0), v)
    return im


def grey(values: list[int]) -> np.ndarray:
    return np.repeat(np.array(values, np.uint8)[None, :, None], 3, axis=2)


# 16-bit value -> nearest 8-bit level round(v / 257): 128/257 = 0.498 -> 0, 129 -> 0.502 -> 1,
# 385 -> 1.498 -> 1, 386 -> 1.502 -> 2, 100 * 257 -> 100, 65535 -> 255
V16 = [0, 128, 129, 385, 386, 100 * 257, 65535]
E16 = [0, 0, 1, 1, 2, 100, 255]


@pytest.mark.parametrize("mode", ["I;16", "I;16L", "I;16B", "I;16N"])
def test_16bit_grey_modes_scale_by_257(mode):
    np.testing.assert_array_equal(pil_to_rgb(one_row(mode, V16)), grey(E16))


def test_16bit_big_endian_bytes():
    im = Image.frombytes("I;16B", (2, 1), bytes([0x64, 0x64, 0xFF, 0xFF]))  # 0x6464 = 100 * 257
    np.testing.assert_array_equal(pil_to_rgb(im), grey([100, 255]))


def test_16bit_grey_png_is_not_white(tmp_path):
    """The reported case: a 16-bit grey PNG of 100 * 257 decoded to mean 255."""
    path = tmp_path / "g.png"
    Image.fromarray(np.full((64, 64), 100 * 257, np.uint16)).save(path)
    with Image.open(path) as im:
        assert im.mode == "I;16"
    out = decode_image(path)
    assert out.shape == (64, 64, 3) and out.dtype == np.uint8
    assert (out == 100).all()
    (item,) = load_sources(str(path))
    np.testing.assert_array_equal(item.image, out)


def test_16bit_colour_pngs(tmp_path):
    """16-bit RGB, RGBA and grey+alpha PNGs: Pillow itself reduces these to 8 bits per channel."""
    rgb = np.zeros((2, 3, 3), np.uint16)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 100 * 257, 0, 65535
    rgba = np.dstack([rgb, np.zeros((2, 3), np.uint16)])   # transparent: alpha dropped
    la = np.dstack([np.full((2, 3), 50 * 257, np.uint16), np.full((2, 3), 65535, np.uint16)])
    for name, arr, ctype, expected in (("rgb", rgb, 2, (100, 0, 255)), ("rgba", rgba, 6, (100, 0, 255)),
                                       ("la", la, 4, (50, 50, 50))):
        path = tmp_path / f"{name}.png"
        path.write_bytes(png_bytes(arr, ctype, 16))
        out = decode_image(path)
        assert out.shape == (2, 3, 3)
        assert (out == np.array(expected, np.uint8)).all(), name


def test_32bit_int_within_16_bits_and_beyond():
    np.testing.assert_array_equal(pil_to_rgb(one_row("I", [0, 100 * 257, 65535])), grey([0, 100, 255]))
    # outside [0, 65535]: stretched from its own range -100..155 (width 255) to 0..255
    np.testing.assert_array_equal(pil_to_rgb(one_row("I", [-100, 0, 155])), grey([0, 100, 255]))
    np.testing.assert_array_equal(pil_to_rgb(one_row("I", [70000, 70000])), grey([0, 0]))  # constant


def test_32bit_float_unit_range_and_beyond():
    np.testing.assert_array_equal(pil_to_rgb(one_row("F", [0.0, 0.2, 1.0])), grey([0, 51, 255]))
    # 0..255 floats: stretched from 0..255, i.e. kept
    np.testing.assert_array_equal(pil_to_rgb(one_row("F", [0.0, 100.0, 255.0])), grey([0, 100, 255]))
    # NaN and infinities become 0; the range is that of the finite values
    np.testing.assert_array_equal(pil_to_rgb(one_row("F", [float("nan"), 0.2, 1.0, float("inf")])),
                                  grey([0, 51, 255, 0]))
    np.testing.assert_array_equal(pil_to_rgb(one_row("F", [-1.0, 0.0, 1.0])), grey([0, 128, 255]))


def test_float_tiff_file(tmp_path):
    path = tmp_path / "f.tif"
    Image.fromarray(np.array([[0.0, 0.2], [0.6, 1.0]], np.float32)).save(path)
    np.testing.assert_array_equal(decode_image(path)[..., 0], np.array([[0, 51], [153, 255]], np.uint8))


@pytest.mark.parametrize("mode, pixel, expected", [
    ("L", 77, (77, 77, 77)),
    ("LA", (77, 0), (77, 77, 77)),                  # alpha dropped
    ("La", (10, 51), (50, 50, 50)),                 # premultiplied: 10 / (51 / 255) = 50
    ("RGBA", (1, 2, 3, 0), (1, 2, 3)),
    ("RGBa", (10, 20, 30, 51), (50, 100, 150)),
    ("RGBX", (1, 2, 3, 0), (1, 2, 3)),
    ("1", 1, (255, 255, 255)),
    ("1", 0, (0, 0, 0)),
    ("CMYK", (0, 0, 0, 0), (255, 255, 255)),
    ("CMYK", (255, 0, 0, 0), (0, 255, 255)),
    ("CMYK", (0, 0, 0, 255), (0, 0, 0)),
    ("YCbCr", (100, 128, 128), (100, 100, 100)),
    ("HSV", (0, 255, 255), (255, 0, 0)),
    ("HSV", (85, 255, 255), (0, 255, 0)),           # 85 / 255 of the circle = 120 degrees
    ("HSV", (0, 0, 200), (200, 200, 200)),
])
def test_8bit_modes(mode, pixel, expected):
    out = pil_to_rgb(Image.new(mode, (2, 1), pixel))
    assert out.shape == (1, 2, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert (out == np.array(expected, np.uint8)).all()


def test_lab_goes_through_a_colour_transform():
    black, white = (pil_to_rgb(Image.new("LAB", (1, 1), v))[0, 0].astype(int) for v in ((0, 128, 128), (255, 128, 128)))
    assert black.max() <= 2 and white.min() >= 253
    mid = pil_to_rgb(Image.new("LAB", (1, 1), (128, 128, 128)))[0, 0].astype(int)
    assert mid.max() - mid.min() <= 1 and 100 < mid[0] < 140  # neutral grey stays neutral


@pytest.mark.parametrize("transparency", [1, b"\xff\x00"])
def test_palette_with_transparency_gives_the_palette_colour_without_warnings(transparency):
    im = Image.new("P", (2, 1))
    im.putpalette([10, 20, 30, 40, 50, 60])
    im.putpixel((0, 0), 0)
    im.putpixel((1, 0), 1)
    im.info["transparency"] = transparency
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = pil_to_rgb(im)
    np.testing.assert_array_equal(out[0], [[10, 20, 30], [40, 50, 60]])


def test_palette_png_with_transparency_file(tmp_path):
    im = Image.new("P", (2, 1))
    im.putpalette([10, 20, 30, 40, 50, 60])
    im.putpixel((1, 0), 1)
    path = tmp_path / "p.png"
    im.save(path, transparency=1)
    with Image.open(path) as check:
        assert check.mode == "P" and "transparency" in check.info
    np.testing.assert_array_equal(decode_image(path)[0], [[10, 20, 30], [40, 50, 60]])


def test_pa_mode():
    im = Image.new("PA", (1, 1))
    im.putpalette([10, 20, 30, 40, 50, 60])
    im.putpixel((0, 0), (1, 0))
    np.testing.assert_array_equal(pil_to_rgb(im)[0, 0], [40, 50, 60])


@pytest.mark.parametrize("mode", Image.MODES)
def test_every_pillow_mode_gives_uint8_rgb(mode):
    """A new Pillow mode would show up here first."""
    out = pil_to_rgb(Image.new(mode, (5, 3)))
    assert out.shape == (3, 5, 3) and out.dtype == np.uint8 and out.flags.c_contiguous


def test_exif_orientation_applies_to_16bit(tmp_path):
    im = Image.fromarray(np.arange(6, dtype=np.uint16).reshape(2, 3) * 257 * 40)
    exif = Image.Exif()
    exif[274] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "r.png"
    im.save(path, exif=exif)
    out = decode_image(path)
    assert out.shape == (3, 2, 3)
    np.testing.assert_array_equal(out[..., 0], np.rot90(np.arange(6).reshape(2, 3) * 40, -1).astype(np.uint8))


def test_training_decodes_16bit_like_predict(tmp_path: Path):
    """The dataset loads images through the same helper: a 16-bit grey image trains as grey 100."""
    path = tmp_path / "g.png"
    Image.fromarray(np.full((32, 32), 100 * 257, np.uint16)).save(path)
    ds = DetectionDataset([Sample(path, np.zeros((0, 5), np.float32), 32, 32)], 32, augment=False)
    image, _ = ds[0]
    assert image.shape == (3, 32, 32) and (image == 100).all()
