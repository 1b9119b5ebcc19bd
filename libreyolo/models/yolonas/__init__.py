"""YOLO-NAS family (detection; the pose variant in :mod:`.pose`)."""
from .model import YoloNAS

__all__ = ["YoloNAS"]
