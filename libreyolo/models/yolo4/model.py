"""YOLOv4 declarations (the network, decode and loss are the shared Darknet ones)."""
from __future__ import annotations

from ..darknet.cfgs import YOLOV4, YOLOV4_TINY
from ..darknet.model import DarknetModel


class Yolo4(DarknetModel):
    """YOLOv4 in the LibreYOLO layout: ``yolo4.layers.<i>.*``.

    Sizes: t (``yolov4-tiny.cfg``: CSP-style tiny backbone, heads at strides 32 and 16) and b
    (``yolov4.cfg``: CSPDarknet53 with Mish, SPP, PAN, heads at strides 8, 16, 32). ``[yolo]``
    heads with ``scale_x_y`` (t: 1.05; b: 1.2, 1.1, 1.05), sigmoid classes; trained with CIoU.
    """

    FAMILY = "yolo4"
    FILE_PREFIX = "LibreYOLO4"
    CFGS = {"t": YOLOV4_TINY, "b": YOLOV4}
    SIZES = tuple(CFGS)
    # the GPU parity protocol, graph predict == eager and the training rows passed (docs/families.md)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    DEFAULT_IMGSZ_BY_SIZE = {size: cfg.imgsz for size, cfg in CFGS.items()}
