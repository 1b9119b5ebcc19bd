"""YOLOv9-E2E training loss: YOLOv9's TAL loss on both heads (YOLOv10's consistent dual assignment).

The one-to-many head is assigned as YOLOv9 assigns (top-10 task-aligned anchors per object), the
one-to-one head with the same metric but the top 1 anchor per object; the loss is the sum of the
two, each with YOLOv9's gains and normalisation. Both use the fixed-shape
:class:`~libreyolo.models.yolo9.loss.Yolo9Loss`, so the sum is CUDA-graph capturable as it is.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..yolo9.loss import Yolo9Loss


class Yolo9E2ELoss(nn.Module):
    """``forward({"one2many": maps, "one2one": maps}, targets, mask) -> (loss, items)``: the sum of
    the two heads' YOLOv9 losses; ``items`` are the summed ``[box, cls, dfl]`` (detached)."""

    item_names = Yolo9Loss.item_names
    DDP_REDUCTION = Yolo9Loss.DDP_REDUCTION

    def __init__(self, nc: int, one2many_topk: int = 10, one2one_topk: int = 1):
        super().__init__()
        self.one2many = Yolo9Loss(nc, topk=one2many_topk)
        self.one2one = Yolo9Loss(nc, topk=one2one_topk)

    def forward(self, outputs: dict, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        many, many_items = self.one2many(outputs["one2many"], targets, mask)
        one, one_items = self.one2one(outputs["one2one"], targets, mask)
        return many + one, many_items + one_items
