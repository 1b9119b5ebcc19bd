"""Test-time augmentation geometry (libreyolo.ops.tta)."""
import pytest
import torch

from libreyolo.ops.tta import tta_sizes, unflip_boxes


def test_tta_sizes_are_stride_multiples():
    assert tta_sizes(640, 32) == [640, 544, 448]
    for s in tta_sizes(416, 32):
        assert s % 32 == 0 and 32 <= s <= 416
    with pytest.raises(ValueError, match="positive"):
        tta_sizes(0, 32)


def test_unflip_boxes_inverts_the_flip_and_stays_inside():
    w = 100
    boxes = torch.tensor([[10.0, 5.0, 30.0, 25.0], [0.0, 0.0, 100.0, 50.0]])
    flipped = unflip_boxes(boxes, w)  # the same map flips and un-flips
    assert torch.equal(flipped[0], torch.tensor([70.0, 5.0, 90.0, 25.0]))
    assert torch.equal(unflip_boxes(flipped, w), boxes)
    assert bool((flipped[:, 0] <= flipped[:, 2]).all()) and float(flipped.min()) >= 0 and float(flipped.max()) <= w
