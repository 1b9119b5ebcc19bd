"""Tasks: what is task-specific (datasets, on-device post-processing, results, evaluator, loss glue).

One folder per task; a family declares its task by name (``Model.TASK``) and the engine's loops
call the task object (:class:`~libreyolo.tasks.base.Task`). Adding a task = one folder + one line
in ``TASKS``.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..lazytable import LazyTable
from .base import Evaluator, PredictPlan, Task, TaskOptions

#: task name -> where its Task class lives; a task's module is imported the first time the task
#: is asked for (several import torchvision, whose import pulls in torch._dynamo: seconds of the
#: start of a process that trains a detector and needs none of them)
_TASK_CLASSES = {
    "detect": ".detect:DetectTask",
    "classify": ".classify:ClassifyTask",
    "semantic": ".semantic:SemanticTask",
    "segment-prompt": ".segment_prompt:SegmentPromptTask",
    "depth": ".depth:DepthTask",
    "matte": ".matte:MatteTask",
    "ocr": ".ocr:OcrTask",
    "pose": ".pose:PoseTask",
    "segment": ".segment:SegmentTask",
    "obb": ".obb:ObbTask",
    "embed": ".embed:EmbedTask",
    "panoptic": ".panoptic:PanopticTask",
    "restore": ".restore:RestoreTask",
    "point": ".point:PointTask",
}

#: name -> the task's one Task object, made at first use
TASKS: Mapping[str, Task] = LazyTable(_TASK_CLASSES, __name__, make=lambda cls: cls())


def get_task(name: str) -> Task:
    """The task object registered under ``name``."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}") from None


__all__ = ["TASKS", "Evaluator", "PredictPlan", "Task", "TaskOptions", "get_task"]
