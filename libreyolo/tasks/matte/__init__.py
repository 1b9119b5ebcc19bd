"""Matting (foreground alpha per pixel): predict plan, results."""
from .results import Alpha
from .task import MattePlan, MatteTask

__all__ = ["Alpha", "MattePlan", "MatteTask"]
