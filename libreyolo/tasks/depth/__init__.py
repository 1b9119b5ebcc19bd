"""Monocular depth (a relative depth value per pixel): predict plan, results."""
from .results import DepthMap
from .task import DepthPlan, DepthTask, resize_depth

__all__ = ["DepthMap", "DepthPlan", "DepthTask", "resize_depth"]
