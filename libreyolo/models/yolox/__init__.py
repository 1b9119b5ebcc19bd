"""YOLOX detector family (Megvii's anchor-free YOLO with a decoupled head)."""
from .model import Yolox
from .nn import YoloxNet

__all__ = ["Yolox", "YoloxNet"]
