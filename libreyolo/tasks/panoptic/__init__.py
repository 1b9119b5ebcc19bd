"""Panoptic segmentation task (merge in ``merge``, result type in ``results``, datasets in ``data``)."""
from .task import PanopticOptions, PanopticTask

__all__ = ["PanopticOptions", "PanopticTask"]
