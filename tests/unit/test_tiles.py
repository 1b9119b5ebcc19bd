"""Sliced-inference geometry and the merge of detections (libreyolo.ops.tiles)."""
import pytest
import torch

from libreyolo.ops.tiles import check_tiling, cut_tiles, merge_detections, shift_to_image, tile_origins, tile_shape


@pytest.mark.parametrize("h,w,tile,ov", [(1000, 1500, 640, 0.2), (640, 640, 640, 0.2), (300, 2000, 256, 0.0),
                                         (700, 701, 320, 0.5), (200, 900, 320, 0.2)])
def test_tiles_cover_the_image_with_the_overlap(h, w, tile, ov):
    origins = tile_origins(h, w, tile, ov)
    th, tw = tile_shape(h, w, tile)
    covered = torch.zeros(h, w, dtype=torch.bool)
    for y, x in origins:
        assert 0 <= y and 0 <= x and y + th <= h and x + tw <= w   # every tile inside the image
        covered[y:y + th, x:x + tw] = True
    assert bool(covered.all())
    for starts in (sorted({x for _, x in origins}), sorted({y for y, _ in origins})):
        for a, b in zip(starts, starts[1:]):
            assert tile - (b - a) >= int(round(ov * tile))


def test_image_of_one_tile_is_one_tile():
    assert tile_origins(640, 640, 640, 0.2) == [(0, 0)]
    assert tile_origins(100, 50, 640, 0.2) == [(0, 0)] and tile_shape(100, 50, 640) == (100, 50)
    assert tile_shape(1000, 300, 640) == (640, 300)


def test_cut_tiles_one_shape_exact_pixels():
    img = torch.arange(10 * 13 * 3, dtype=torch.int32).reshape(10, 13, 3)
    origins = tile_origins(10, 13, 8, 0.25)
    tiles = cut_tiles(img, origins, tile_shape(10, 13, 8))
    assert tiles.shape == (len(origins), 8, 8, 3) and tiles.is_contiguous()
    for t, (y, x) in zip(tiles, origins):
        assert torch.equal(t, img[y:y + 8, x:x + 8])
    with pytest.raises(ValueError, match="leaves the 10x13 image"):
        cut_tiles(img, [(4, 0)], (8, 8))


def test_box_in_a_tile_maps_to_the_image():
    origins = [(0, 0), (0, 512), (384, 512)]
    dets = torch.tensor([[5.0, 6.0, 25.0, 30.0, 0.9, 1.0], [18.0, 10.0, 88.0, 60.0, 0.8, 2.0],
                         [0.0, 0.5, 639.0, 640.0, 0.7, 0.0]])
    out = shift_to_image(dets, torch.tensor([0, 1, 2]), origins)
    assert torch.equal(out, torch.tensor([[5.0, 6.0, 25.0, 30.0, 0.9, 1.0], [530.0, 10.0, 600.0, 60.0, 0.8, 2.0],
                                          [512.0, 384.5, 1151.0, 1024.0, 0.7, 0.0]]))
    assert torch.equal(dets[1], torch.tensor([18.0, 10.0, 88.0, 60.0, 0.8, 2.0]))   # the input is kept


def test_duplicates_in_the_overlap_merged_once():
    # tiles at x=0 and x=512 of a 1152-wide image; one object at x 530..600 seen whole by both
    origins = [(0, 0), (0, 512)]
    dets = torch.tensor([[530.0, 10.0, 600.0, 60.0, 0.9, 2.0], [18.0, 10.0, 88.0, 60.0, 0.8, 2.0]])
    rows = shift_to_image(dets, torch.tensor([0, 1]), origins)
    for metric in ("iou", "ios"):
        out = merge_detections(rows, image_size=(640, 1152), metric=metric)
        assert out.shape == (1, 6) and torch.equal(out[0], torch.tensor([530.0, 10.0, 600.0, 60.0, 0.9, 2.0]))
        # another class at the same place is kept (class-aware), unless agnostic
        other = rows.clone()
        other[1, 5] = 3
        assert merge_detections(other, image_size=(640, 1152), metric=metric).shape[0] == 2
        assert merge_detections(other, image_size=(640, 1152), metric=metric, agnostic=True).shape[0] == 1


def test_a_box_cut_by_a_tile_edge_goes_with_ios_not_iou():
    # the whole object (x 30..60) in one tile, its left 40% cut off in the next (x 48..60): IoU 0.4
    rows = torch.tensor([[30.0, 20.0, 60.0, 30.0, 0.75, 0.0], [48.0, 20.0, 60.0, 30.0, 0.5, 0.0]])
    assert merge_detections(rows, image_size=(100, 100), metric="iou", iou=0.45).shape[0] == 2
    out = merge_detections(rows, image_size=(100, 100), metric="ios", iou=0.45)
    assert torch.equal(out, rows[:1])


def test_ios_merge_is_the_greedy_pass():
    """The fixed point equals the textbook greedy loop (a kept box suppresses the later boxes it
    matches), on random boxes with chains of matches."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(160, 2, generator=g) * 150
    wh = torch.rand(160, 2, generator=g) * 40 + 2
    rows = torch.cat([xy, xy + wh, torch.rand(160, 1, generator=g), torch.randint(0, 3, (160, 1), generator=g)], 1)
    out = merge_detections(rows, image_size=(400, 400), metric="ios", iou=0.5, max_det=1000)
    order = rows[:, 4].argsort(descending=True)
    b = rows[order]
    kept: list[int] = []
    for i in range(len(b)):
        ok = True
        for j in kept:
            if b[j, 5] != b[i, 5]:
                continue
            iw = (torch.minimum(b[i, 2], b[j, 2]) - torch.maximum(b[i, 0], b[j, 0])).clamp(min=0)
            ih = (torch.minimum(b[i, 3], b[j, 3]) - torch.maximum(b[i, 1], b[j, 1])).clamp(min=0)
            small = torch.minimum((b[i, 2] - b[i, 0]) * (b[i, 3] - b[i, 1]), (b[j, 2] - b[j, 0]) * (b[j, 3] - b[j, 1]))
            if iw * ih / small > 0.5:
                ok = False
                break
        if ok:
            kept.append(i)
    assert 20 < len(kept) < 140   # chains of matches: the test means something
    assert torch.equal(out, b[kept])


def test_merge_clips_keeps_max_det_and_takes_nothing():
    rows = torch.tensor([[-5.0, 0.0, 10.0, 10.0, 0.5, 0.0], [600.0, 0.0, 700.0, 150.0, 0.6, 0.0],
                         [1.0, 1.0, 10.0, 10.0, 0.7, 1.0]])
    out = merge_detections(rows, image_size=(100, 640))
    assert out.shape[0] == 3 and float(out[:, [0, 2]].min()) >= 0 and float(out[:, 2].max()) <= 640
    assert float(out[:, 3].max()) <= 100 and out[:, 4].tolist() == pytest.approx([0.7, 0.6, 0.5])
    assert merge_detections(rows, image_size=(100, 640), max_det=1).shape == (1, 6)
    assert merge_detections(torch.zeros(0, 6), image_size=(10, 10), metric="ios").shape == (0, 6)
    with pytest.raises(ValueError, match="merge metric"):
        merge_detections(rows, image_size=(10, 10), metric="giou")


@pytest.mark.parametrize("tile,ov,msg", [(640, 1.0, "overlap_ratio"), (640, -0.1, "overlap_ratio"),
                                         (0, 0.2, "tile: expected a positive integer"), (1.5, 0.2, "tile")])
def test_bad_tiling_is_one_clear_error(tile, ov, msg):
    with pytest.raises(ValueError, match=msg):
        check_tiling(tile, ov)
