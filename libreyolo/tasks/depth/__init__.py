"""Monocular depth (a relative depth value per pixel): predict plan, results, datasets, loss, metrics."""
from .results import DepthMap
from .task import (
                   DepthEvaluator,
                   DepthOptions,
                   DepthPlan,
                   DepthTask,
                   ScaleShiftInvariantLoss,
                   align_scale_shift,
                   depth_metrics,
                   resize_depth,
)

__all__ = ["DepthEvaluator", "DepthMap", "DepthOptions", "DepthPlan", "DepthTask", "ScaleShiftInvariantLoss",
           "align_scale_shift", "depth_metrics", "resize_depth"]
