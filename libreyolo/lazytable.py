"""A name -> object table whose objects live in modules imported at first use.

The model registry and the task table use it: several families' and tasks' modules import
torchvision, whose import pulls in torch._dynamo (seconds of a process's start), so a process
imports only the ones it asks for.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class LazyTable(Mapping):
    """``where[name]`` is ``"module:attr"`` (``module`` relative to ``package``); the value is that
    attribute, passed through ``make`` (default: as it is), imported and made once, at the first
    lookup. An unknown name is a KeyError, as in a dict; iterating the values imports them all."""

    def __init__(self, where: Mapping[str, str], package: str, make: Callable[[Any], Any] | None = None) -> None:
        self._where, self._package, self._make = where, package, make
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            module, attr = self._where[name].split(":")
            value = getattr(importlib.import_module(module, self._package), attr)
            self._made[name] = value if self._make is None else self._make(value)
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)
