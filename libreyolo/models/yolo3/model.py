"""YOLOv3 declarations (the network, decode and loss are the shared Darknet ones)."""
from __future__ import annotations

from ..darknet.cfgs import YOLOV3, YOLOV3_SPP, YOLOV3_TINY
from ..darknet.model import DarknetModel


class Yolo3(DarknetModel):
    """YOLOv3 in the LibreYOLO layout: ``yolo3.layers.<i>.*``.

    Sizes: t (``yolov3-tiny.cfg``: two heads, strides 32 and 16), b (``yolov3.cfg``: Darknet-53,
    three heads at strides 32, 16, 8) and spp (``yolov3-spp.cfg``: b with a max-pool 5/9/13 SPP
    block before the first head). ``[yolo]`` heads: 3 anchors each, sigmoid classes.
    """

    FAMILY = "yolo3"
    FILE_PREFIX = "LibreYOLO3"
    CFGS = {"t": YOLOV3_TINY, "b": YOLOV3, "spp": YOLOV3_SPP}
    SIZES = tuple(CFGS)
    # the GPU parity protocol, graph predict == eager and the training rows passed (docs/families.md)
    SUPPORTS_CUDA_GRAPH = True
    SUPPORTS_CUDA_GRAPH_TRAIN = True
    DEFAULT_IMGSZ_BY_SIZE = {size: cfg.imgsz for size, cfg in CFGS.items()}
