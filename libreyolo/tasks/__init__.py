"""Tasks: what is task-specific (datasets, on-device post-processing, results, evaluator, loss glue).

One folder per task; a family declares its task by name (``Model.TASK``) and the engine's loops
call the task object (:class:`~libreyolo.tasks.base.Task`). Adding a task = one folder + one line
in ``TASKS``.
"""
from __future__ import annotations

from .base import Evaluator, PredictPlan, Task, TaskOptions
from .classify import ClassifyTask
from .depth import DepthTask
from .detect import DetectTask
from .segment_prompt import SegmentPromptTask
from .matte import MatteTask
from .ocr import OcrTask
from .semantic import SemanticTask

TASKS: dict[str, Task] = {
    "detect": DetectTask(),
    "classify": ClassifyTask(),
    "semantic": SemanticTask(),
    "segment-prompt": SegmentPromptTask(),
    "depth": DepthTask(),
    "matte": MatteTask(),
    "ocr": OcrTask(),
}


def get_task(name: str) -> Task:
    """The task object registered under ``name``."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}") from None


__all__ = ["TASKS", "Evaluator", "PredictPlan", "Task", "TaskOptions", "get_task"]
