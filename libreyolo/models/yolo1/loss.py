"""YOLOv1 training loss (the paper's sum-squared error, Darknet's ``[detection]`` layer), fixed-shape.

Redmon et al., "You Only Look Once" (CVPR 2016), eq. 3, with the assignment of Darknet's
``forward_detection_layer`` (``rescore=1``, ``sqrt=1``):

* Each object belongs to the cell holding its centre (``col = floor(cx * S)``, clamped to the
  grid). A cell holds at most one object: where several centres fall in one cell, the first of
  them in the target order is kept (Darknet keeps the first box written to a cell).
* Of the cell's N boxes, the responsible one is the box whose prediction overlaps the object
  most (IoU, on the detached prediction); when none overlaps it at all, the box of least RMSE
  between (x/S, y/S, w, h) and the object's (Darknet's fallback). Ties go to the first box.
* Terms, summed over cells and boxes: ``coord`` = lambda_coord (5) x [(x - x*)^2 + (y - y*)^2 +
  (sqrt(w) - sqrt(w*))^2 + (sqrt(h) - sqrt(h*))^2] on the responsible boxes (the network predicts
  sqrt(w), sqrt(h) directly; x, y are offsets within the cell); ``obj`` = (C - IoU)^2 on the
  responsible boxes (the target confidence is the box's IoU with the object, held constant);
  ``noobj`` = lambda_noobj (0.5) x C^2 on every other box, also the other boxes of an object's
  cell; ``cls`` = sum over classes of (p(c) - onehot(c))^2 in the cells holding an object.
* The sums are divided by the batch size (Darknet divides its update by the batch), so the loss
  is per image; a distributed run divides by the global batch (``DDP_REDUCTION = "sum"``).

Written so that it can be captured in a CUDA graph: targets come padded to a fixed ``M`` with a
validity mask, and every step is a tensor operation on (B, M, S*S) or (B, S*S, N) grids; nothing
reads a value on the host. Padded rows never reach a cell, so the loss of padded targets equals
the unpadded loss bit for bit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...distributed import global_batch
from ...ops.iou import bbox_iou, cxcywh_to_xyxy
from .nn import split_output


class Yolo1Loss(nn.Module):
    """The YOLOv1 loss on the network's output vector; CUDA-graph capturable.

    ``forward(outputs, targets, mask)``: ``outputs`` what :class:`~.nn.Yolo1Net` returns (``[out]``,
    ``out`` (B, S*S*(nc + 5N))), ``targets`` (B, M, 5) ``[cls, x1, y1, x2, y2]`` in input pixels
    (the ``imgsz`` x ``imgsz`` canvas), ``mask`` (B, M) bool. Returns ``(loss, items)``: the sum
    of the four terms per image and the detached terms in the order of :attr:`item_names`.
    Computed in float32 with autocast off.
    """

    item_names: tuple[str, ...] = ("coord", "obj", "noobj", "cls")
    #: distributed runs: each rank divides by the global batch (its share of the loss)
    DDP_REDUCTION = "sum"

    def __init__(self, nc: int, boxes: int, side: int = 7, imgsz: int = 448, lambda_coord: float = 5.0,
                 lambda_noobj: float = 0.5):
        super().__init__()
        self.nc, self.boxes, self.side, self.imgsz = int(nc), int(boxes), int(side), int(imgsz)
        self.lambda_coord, self.lambda_noobj = float(lambda_coord), float(lambda_noobj)

    def forward(self, outputs, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        out = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
        with torch.autocast(device_type=out.device.type, enabled=False):
            return self._compute(out.float(), targets.float(), mask.bool())

    def assign(self, coords: Tensor, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Which cells hold an object and which box is responsible for it.

        ``coords`` (B, S*S, N, 4) the raw box outputs, ``targets`` / ``mask`` as in
        :meth:`forward` (M >= 1). Returns ``has_obj`` (B, S*S) bool, ``resp`` (B, S*S, N) bool,
        ``target`` (B, S*S, 5) = [class, x offset in the cell, y offset, sqrt(w), sqrt(h)] of each
        cell's object (meaningless where ``has_obj`` is False) and ``iou`` (B, S*S, N), each
        box's IoU with its cell's object.
        """
        s, cells = self.side, self.side * self.side
        t = torch.where(mask.unsqueeze(-1), targets, 0)                    # padded rows: zeros
        cxcywh = torch.cat(((t[..., 1:3] + t[..., 3:5]) / 2, t[..., 3:5] - t[..., 1:3]), -1) / self.imgsz
        grid_xy = cxcywh[..., :2] * s
        col_row = grid_xy.floor().clamp(0, s - 1)
        cell = (col_row[..., 1] * s + col_row[..., 0]).long()               # (B, M)
        in_cell = (cell.unsqueeze(-1) == torch.arange(cells, device=cell.device)) & mask.unsqueeze(-1)
        has_obj = in_cell.any(1)                                            # (B, S*S)
        # each cell's first object in the target order (argmax gives the first maximal index); 0 where none
        owner = in_cell.to(torch.uint8).argmax(1)                           # (B, S*S)
        per_row = torch.cat((t[..., :1], grid_xy - col_row, cxcywh[..., 2:].clamp_min(0).sqrt(),
                             cxcywh[..., 2:]), -1)                          # (B, M, 7)
        cell_t = per_row.gather(1, owner.unsqueeze(-1).expand(-1, -1, per_row.shape[-1]))   # (B, S*S, 7)

        # the boxes in Darknet's frame for the choice: x, y within the cell / S, w and h of the image
        pred = coords.detach()
        pred_box = torch.cat((pred[..., :2] / s, pred[..., 2:].square()), -1)            # (B, S*S, N, 4)
        true_box = torch.cat((cell_t[..., 1:3] / s, cell_t[..., 5:7]), -1).unsqueeze(2)   # (B, S*S, 1, 4)
        iou = bbox_iou(cxcywh_to_xyxy(pred_box), cxcywh_to_xyxy(true_box))              # (B, S*S, N)
        rmse = (pred_box - true_box).square().sum(-1).sqrt()
        key = torch.where(iou.amax(-1, keepdim=True) > 0, iou, -rmse)
        resp = F.one_hot(key.argmax(-1), self.boxes).bool() & has_obj.unsqueeze(-1)
        return has_obj, resp, cell_t[..., :5], iou

    def _compute(self, out: Tensor, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        b = out.shape[0]
        probs, conf, coords = split_output(out, self.nc, self.boxes, self.side)
        if targets.shape[1] == 0:   # shape-level (static) decision: one all-padding row
            targets, mask = targets.new_zeros(b, 1, 5), mask.new_zeros(b, 1)
        has_obj, resp, target, iou = self.assign(coords, targets, mask)

        coord_err = (coords - target[..., 1:5].unsqueeze(2)).square().sum(-1)          # (B, S*S, N)
        loss_coord = self.lambda_coord * torch.where(resp, coord_err, 0).sum()
        loss_obj = torch.where(resp, (conf - iou.detach()).square(), 0).sum()
        loss_noobj = self.lambda_noobj * torch.where(resp, 0, conf.square()).sum()
        onehot = F.one_hot(target[..., 0].long().clamp(0, self.nc - 1), self.nc).to(probs.dtype)
        loss_cls = torch.where(has_obj.unsqueeze(-1), (probs - onehot).square(), 0).sum()

        items = torch.stack((loss_coord, loss_obj, loss_noobj, loss_cls)) / global_batch(b)
        return items.sum(), items.detach()
