"""Point detection (an object's centre, class and confidence): predict plan, results, datasets, loss, metrics."""
from .results import Points
from .task import CentroidLoss, PointEvaluator, PointOptions, PointPlan, PointTask, point_candidates

__all__ = ["CentroidLoss", "PointEvaluator", "PointOptions", "PointPlan", "PointTask", "Points", "point_candidates"]
