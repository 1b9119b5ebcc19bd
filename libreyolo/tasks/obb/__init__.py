"""Oriented boxes: predict plan, the OBB result field, rotated geometry, data and metric."""
from .results import OBB
from .task import ObbPlan, ObbTask

__all__ = ["OBB", "ObbPlan", "ObbTask"]
