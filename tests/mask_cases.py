"""Boxes that test an instance-mask sampler's edges (tests/unit/test_segment.py,
tests/unit/test_mask_sample.py, tests/gpu/test_mask_sample_gpu.py): random ones, some across the
image's edges, then in rows 0-5 the whole image and beyond, one outside, one holding no pixel
centre, one holding exactly one, one with a NaN corner and one with infinite edges."""
import torch


def edge_boxes(n: int, h: int, w: int, g: torch.Generator) -> torch.Tensor:
    """(n, 4) float32 xyxy boxes in an (h, w) image's pixels, n >= 6 (see the module docstring)."""
    xy = torch.rand(n, 2, generator=g) * torch.tensor([w * 1.2, h * 1.2]) - torch.tensor([w * 0.1, h * 0.1])
    wh = torch.rand(n, 2, generator=g) * torch.tensor([w * 0.6, h * 0.6])
    boxes = torch.cat((xy, xy + wh), 1)
    boxes[0] = torch.tensor([-5.0, -5.0, w + 5.0, h + 5.0])              # the whole image and beyond
    boxes[1] = torch.tensor([w + 1.0, 2.0, w + 9.0, 9.0])                # outside
    boxes[2] = torch.tensor([10.0, 10.0, 10.2, 10.4])                    # no pixel centre inside
    boxes[3] = torch.tensor([3.5, 4.5, 3.5, 4.5])                        # one pixel centre exactly
    boxes[4] = torch.tensor([float("nan"), 1.0, 5.0, 6.0])               # NaN: no pixel
    boxes[5] = torch.tensor([float("-inf"), 2.0, float("inf"), h / 2])   # infinite edges: whole rows
    return boxes
