"""YOLOv1 detector family (Darknet's 2016 release: yolov1-tiny and yolov1, fixed 448 input)."""
from .model import Yolo1
from .nn import Yolo1Net

__all__ = ["Yolo1", "Yolo1Net"]
