"""Tasks: what is task-specific (datasets, on-device post-processing, results, evaluator, loss glue).

One folder per task; a family declares its task by name (``Model.TASK``) and the engine's loops
call the task object (:class:`~libreyolo.tasks.base.Task`). Adding a task = one folder + one line
in ``TASKS``.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

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
}


class _Tasks(Mapping):
    """name -> the task's one :class:`Task` object, made at first use."""

    def __init__(self) -> None:
        self._made: dict[str, Task] = {}

    def __getitem__(self, name: str) -> Task:
        task = self._made.get(name)
        if task is None:
            module, cls = _TASK_CLASSES[name].split(":")   # KeyError for an unknown name, as a dict
            task = self._made[name] = getattr(importlib.import_module(module, __name__), cls)()
        return task

    def __iter__(self) -> Iterator[str]:
        return iter(_TASK_CLASSES)

    def __len__(self) -> int:
        return len(_TASK_CLASSES)


TASKS: Mapping[str, Task] = _Tasks()


def get_task(name: str) -> Task:
    """The task object registered under ``name``."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}") from None


__all__ = ["TASKS", "Evaluator", "PredictPlan", "Task", "TaskOptions", "get_task"]
