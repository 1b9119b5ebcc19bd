"""Sliced-inference geometry and the cross-tile merge (libreyolo.ops.tiles)."""
import pytest
import torch

from libreyolo.ops.tiles import check_tiling, cut_tiles, merge_tiles, tile_origins


@pytest.mark.parametrize("h,w,tile,ov", [(1000, 1500, 640, 0.2), (640, 640, 640, 0.2), (300, 2000, 256, 0.0),
                                         (700, 701, 320, 0.5)])
def test_tiles_cover_the_image_with_the_overlap(h, w, tile, ov):
    origins = tile_origins(h, w, tile, ov)
    covered = torch.zeros(h, w, dtype=torch.bool)
    for y, x in origins:
        assert 0 <= y and 0 <= x and (y + tile <= h or y == 0) and (x + tile <= w or x == 0)
        covered[y:y + tile, x:x + tile] = True
    assert bool(covered.all())
    xs = sorted({x for _, x in origins})
    for a, b in zip(xs, xs[1:]):
        assert tile - (b - a) >= int(round(ov * tile))


def test_image_of_one_tile_is_one_tile():
    assert tile_origins(640, 640, 640, 0.2) == [(0, 0)]
    assert tile_origins(100, 50, 640, 0.2) == [(0, 0)]


def test_cut_tiles_one_shape_padded_edges():
    img = torch.arange(3 * 10 * 13, dtype=torch.float32).reshape(3, 10, 13)
    origins = tile_origins(10, 13, 8, 0.25)
    tiles = cut_tiles(img, origins, 8, pad_value=-1.0)
    assert tiles.shape == (len(origins), 3, 8, 8)
    for t, (y, x) in zip(tiles, origins):
        crop = img[:, y:y + 8, x:x + 8]
        assert torch.equal(t[:, :crop.shape[1], :crop.shape[2]], crop)
    small = cut_tiles(torch.ones(3, 5, 6), [(0, 0)], 8, pad_value=0.5)
    assert bool((small[0, :, 5:, :] == 0.5).all()) and bool((small[0, :, :, 6:] == 0.5).all())


def test_box_in_an_overlap_merged_once():
    # tiles at x=0 and x=512 of a 1152-wide image; one object at x 530..600 seen by both
    origins = [(0, 0), (0, 512)]
    t0 = (torch.tensor([[530.0, 10.0, 600.0, 60.0]]), torch.tensor([0.9]), torch.tensor([2]))
    t1 = (torch.tensor([[18.0, 10.0, 88.0, 60.0]]), torch.tensor([0.8]), torch.tensor([2]))
    b, s, c = merge_tiles([t0, t1], origins, image_size=(640, 1152))
    assert b.shape == (1, 4) and torch.equal(b[0], torch.tensor([530.0, 10.0, 600.0, 60.0]))
    assert float(s[0]) == pytest.approx(0.9) and int(c[0]) == 2
    # another class at the same place is kept (class-aware), unless agnostic
    t1c = (t1[0], t1[1], torch.tensor([3]))
    assert merge_tiles([t0, t1c], origins, image_size=(640, 1152))[0].shape[0] == 2
    assert merge_tiles([t0, t1c], origins, image_size=(640, 1152), agnostic=True)[0].shape[0] == 1


def test_merge_full_pass_clip_and_max_det():
    origins = [(0, 0)]
    tile = (torch.tensor([[0.0, 0.0, 10.0, 10.0], [600.0, 0.0, 700.0, 50.0]]), torch.tensor([0.5, 0.6]),
            torch.tensor([0, 0]))
    full = (torch.tensor([[1.0, 1.0, 10.0, 10.0]]), torch.tensor([0.7]), torch.tensor([0]))
    b, s, _ = merge_tiles([tile], origins, image_size=(100, 640), full=full)
    assert b.shape[0] == 2 and float(b[:, 2].max()) <= 640 and float(b[:, 3].max()) <= 100
    assert float(s[0]) == pytest.approx(0.7)
    assert merge_tiles([tile], origins, image_size=(100, 640), full=full, max_det=1)[0].shape[0] == 1


@pytest.mark.parametrize("tile,ov,stride,msg", [(640, 1.0, 32, "overlap_ratio"), (640, -0.1, 32, "overlap_ratio"),
                                                (650, 0.2, 32, "multiple of the model's stride"),
                                                (0, 0.2, 1, "tile_size")])
def test_bad_tiling_is_one_clear_error(tile, ov, stride, msg):
    with pytest.raises(ValueError, match=msg):
        check_tiling(tile, ov, stride)
