"""Instance segmentation: boxes with a mask per instance (``Results.boxes`` + ``Results.masks``)."""
from .results import InstanceMasks
from .task import SegmentTask

__all__ = ["InstanceMasks", "SegmentTask"]
