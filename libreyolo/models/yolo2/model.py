"""YOLOv2 declarations (the network, decode and loss are the shared Darknet ones)."""
from __future__ import annotations

from ..darknet.cfgs import YOLOV2, YOLOV2_TINY
from ..darknet.model import DarknetModel


class Yolo2(DarknetModel):
    """YOLOv2 (YOLO9000's detector) in the LibreYOLO layout: ``yolo2.layers.<i>.*``.

    Sizes: t (``yolov2-tiny.cfg``: nine 3x3 convs and max-pools) and b (``yolov2.cfg``:
    Darknet-19 with the reorg passthrough). One ``[region]`` head at stride 32: 5 anchors in grid
    cells, softmax classes, score = objectness x class probability.
    """

    FAMILY = "yolo2"
    FILE_PREFIX = "LibreYOLO2"
    # the GPU parity protocol (its "+post" cases at conf 0.001) and graph predict == eager passed
    # for both sizes (docs/families.md); its training capture has no GPU run yet
    SUPPORTS_CUDA_GRAPH = True
    CFGS = {"t": YOLOV2_TINY, "b": YOLOV2}
    SIZES = tuple(CFGS)
    DEFAULT_IMGSZ_BY_SIZE = {size: cfg.imgsz for size, cfg in CFGS.items()}
