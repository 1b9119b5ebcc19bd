"""YOLOv1 declarations and its capturable inference stage."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import Preprocess
from ..base import Model
from ..common.names import default_names
from .nn import CONFIGS, INPUT_SIZE, VOC_NAMES, Yolo1Net, input_size_error, split_output


def check_fixed_imgsz(value: Any) -> int:
    """``value`` (an imgsz as the options take it) if it is 448, else a ValueError saying why."""
    from ...options import check_imgsz
    size = check_imgsz(value)
    if size != INPUT_SIZE:
        raise input_size_error(f"imgsz={value!r}")
    return size


def decode(out: torch.Tensor, nc: int, boxes: int, side: int, size: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output vectors (B, S*S*(nc + 5N)) -> boxes (B, S*S*N, 4) xyxy in pixels of the ``size``
    square, score (B, S*S*N), class (B, S*S*N); cell-major, then box, as Darknet's
    ``get_detection_boxes`` enumerates them.

    cx = (x + col) / S * size, w = raw_w^2 * size (likewise y, h); a box's score for class c is
    its confidence times the cell's probability of c (Darknet's ``scale * prob``), and each box
    keeps its best class.
    """
    probs, conf, coords = split_output(out, nc, boxes, side)
    idx = torch.arange(side * side, device=out.device)
    cell = torch.stack((idx % side, idx // side), -1).to(out.dtype).view(1, -1, 1, 2)   # (col, row)
    centre = (coords[..., :2] + cell) / side * size
    half = coords[..., 2:].square() * (size / 2)
    xyxy = torch.cat((centre - half, centre + half), -1).flatten(1, 2)
    score, cls = (conf.unsqueeze(-1) * probs.unsqueeze(2)).max(-1)                     # (B, S*S, N)
    return xyxy, score.flatten(1), cls.flatten(1)


class Yolo1(Model):
    """YOLOv1 detector (Darknet's 2016 release), sizes t (``yolov1-tiny.cfg``) and b (``yolov1.cfg``).

    The input is fixed at 448 x 448: the fully connected head was built for the 7 x 7 grid it
    gives, so predict, validation, training and export refuse any other ``imgsz`` (one error
    says so). Images are stretched to the square (PIL's bilinear on uint8 pixels, no letterbox),
    RGB in [0, 1] with no mean/std, as the reference does. The head predicts 2 boxes per cell
    and one class distribution per cell; each box's score is its confidence
    times its best class probability, then top-k and NMS as the other detectors. The default
    label set is Pascal VOC's 20 classes.
    """

    FAMILY = "yolo1"
    TASK = "detect"
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibreYOLO1"
    # No GPU parity run yet: docs/families.md gives the commands that would declare them.
    SUPPORTS_CUDA_GRAPH = False
    SUPPORTS_CUDA_GRAPH_TRAIN = True   # the GPU training rows passed (docs/families.md)
    DEFAULT_IMGSZ = INPUT_SIZE
    #: the network's total downsampling (448 -> 7)
    STRIDE = INPUT_SIZE // 7
    DEFAULT_NC = len(VOC_NAMES)
    #: stretched to the square with PIL's bilinear on uint8 pixels, RGB [0, 1], as the reference does
    PREPROCESS = Preprocess("stretch", antialias=True, quantize=True)
    #: the paper's recipe: no mosaic, random scaling and translation up to 20 %, exposure and
    #: saturation up to a factor 1.5, at the fixed 448
    TRAIN_DEFAULTS = {"imgsz": INPUT_SIZE, "mosaic": 0.0, "close_mosaic": 0, "translate": 0.2, "scale": 0.2,
                      "hsv_s": 0.5, "hsv_v": 0.5}

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        return Yolo1Net(size, nc)

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        """Pascal VOC's names (Darknet's order) when ``nc`` is 20, else the library's defaults."""
        return dict(enumerate(VOC_NAMES)) if nc == len(VOC_NAMES) else default_names(nc)

    # ---------------------------------------------------------------- the fixed input size
    @property
    def imgsz(self) -> int:
        """Always 448 (setting anything else raises)."""
        return self._imgsz

    @imgsz.setter
    def imgsz(self, value: int) -> None:
        self._imgsz = check_fixed_imgsz(value)

    def get_predictor(self):
        """The engine's predictor, refusing any input size but 448 (predict, track, capture_graph)."""
        if self._predictor is None:
            from .predict import FixedSizePredictor
            self._predictor = FixedSizePredictor(self)
        return self._predictor

    def train(self, **kwargs) -> dict:
        """:meth:`Model.train` at the fixed 448 (another ``imgsz`` is refused before anything loads)."""
        if kwargs.get("imgsz") is not None:
            check_fixed_imgsz(kwargs["imgsz"])
        return super().train(**kwargs)

    def val(self, data: str | None = None, **kwargs) -> dict:
        """:meth:`Model.val` at the fixed 448 (another ``imgsz`` is refused before anything loads)."""
        if kwargs.get("imgsz") is not None:
            check_fixed_imgsz(kwargs["imgsz"])
        return super().val(data, **kwargs)

    def export(self, format: str = "onnx", **kwargs):
        """:meth:`Model.export` at the fixed 448: another ``imgsz`` and ``dynamic=True`` (symbolic
        height and width) are refused."""
        if kwargs.get("imgsz") is not None:
            check_fixed_imgsz(kwargs["imgsz"])
        if kwargs.get("dynamic"):
            raise ValueError("YOLOv1 cannot be exported with dynamic=True: its fully connected head fixes the "
                             f"input at {INPUT_SIZE}x{INPUT_SIZE}; export with dynamic=False (the default)")
        return super().export(format, **kwargs)

    # ---------------------------------------------------------------- checkpoints
    @classmethod
    def _head(cls, state_dict) -> tuple[str, torch.Tensor] | None:
        """(size, output weight) of the size whose connected output layer ``state_dict`` holds."""
        for size, cfg in CONFIGS.items():
            w = state_dict.get(f"yolo1.layers.{cfg.head_index}.linear.weight")
            if w is not None and "yolo1.layers.0.conv.weight" in state_dict:
                return size, w
        return None

    @classmethod
    def _owns_own(cls, state_dict) -> bool:
        return cls._head(state_dict) is not None

    @classmethod
    def nc_from_state_dict(cls, state_dict) -> int | None:
        head = cls._head(state_dict)
        if head is None:
            return None
        cfg = CONFIGS[head[0]]
        cells, out = cfg.side * cfg.side, int(head[1].shape[0])
        nc = out // cells - 5 * cfg.boxes
        return nc if out % cells == 0 and nc > 0 else None

    # ---------------------------------------------------------------- training and predict
    def build_loss(self) -> nn.Module:
        """The paper's sum-squared loss (lambda_coord 5, lambda_noobj 0.5, sqrt w/h, rescore)."""
        from .loss import Yolo1Loss
        cfg = CONFIGS[self.size]
        return Yolo1Loss(self.nc, cfg.boxes, cfg.side, imgsz=INPUT_SIZE)

    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, 448, 448) RGB in [0, 1] -> boxes (B, S*S*N, 4) xyxy canvas pixels, score (B, S*S*N),
        class (B, S*S*N) (see :func:`decode`)."""
        net = self.model
        out = net(x)[0].float()
        return decode(out, net.nc, net.boxes, net.side, int(x.shape[-1]))
