"""Test-time augmentation geometry (libreyolo.ops.tta)."""
import pytest
import torch

from libreyolo.ops.tta import TTA_VIEWS, tta_views, unflip_boxes


def test_tta_views_are_stride_multiples_one_flipped():
    assert tta_views(640, 32) == [(640, False), (544, True), (448, False)]
    for s, _ in tta_views(416, 32):
        assert s % 32 == 0 and 32 <= s <= 416
    assert sum(flip for _, flip in TTA_VIEWS) == 1
    assert tta_views(64, 32, ((1.0, False),)) == [(64, False)]
    with pytest.raises(ValueError, match="positive"):
        tta_views(0, 32)
    with pytest.raises(ValueError, match="scale must be positive"):
        tta_views(640, 32, ((0.0, False),))


def test_unflip_boxes_inverts_the_flip_and_stays_inside():
    w = 100
    boxes = torch.tensor([[10.0, 5.0, 30.0, 25.0, 0.9, 1.0], [0.0, 0.0, 100.0, 50.0, 0.8, 0.0]])
    flipped = unflip_boxes(boxes, w)  # the same map flips and un-flips
    assert torch.equal(flipped[0], torch.tensor([70.0, 5.0, 90.0, 25.0, 0.9, 1.0]))
    assert torch.equal(unflip_boxes(flipped, w), boxes)
    assert bool((flipped[:, 0] <= flipped[:, 2]).all()) and float(flipped[:, :4].min()) >= 0
    assert float(flipped[:, :4].max()) <= w
    per_row = unflip_boxes(boxes, torch.tensor([100.0, 200.0]))   # each row its own image's width
    assert per_row[1, :4].tolist() == [100.0, 0.0, 200.0, 50.0]
