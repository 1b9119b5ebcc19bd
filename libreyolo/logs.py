"""How the package's log records are shown by the handlers the package installs itself.

Every module logs through ``logging.getLogger(__name__)``: its logger is a child of
``logging.getLogger("libreyolo")``, so a level or handler set there governs every module, and a
record's ``name`` (``libreyolo.data.video``) says which module wrote it. Messages carry no prefix of
their own; a handler of the package (the command line's) shows each record of the package as
``libreyolo: <message>`` through :class:`PrefixFormatter`. Imports nothing but ``logging``, so the
command line can use it before it imports torch.
"""
from __future__ import annotations

import logging
from typing import TextIO

PACKAGE = "libreyolo"
PREFIX = f"{PACKAGE}: "


def from_package(record: logging.LogRecord) -> bool:
    """Whether ``record`` was logged by the package (its ``libreyolo`` logger or a child of it)."""
    return record.name == PACKAGE or record.name.startswith(PACKAGE + ".")


class PrefixFormatter(logging.Formatter):
    """The message alone (``%(message)s``), with ``libreyolo: `` before each record of the
    package; records of other libraries are shown as they are. A message that already starts with
    the prefix is not given it twice."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if from_package(record) and not text.startswith(PREFIX):
            text = PREFIX + text
        return text


def package_logger() -> logging.Logger:
    """The package's logger, ``libreyolo``: the parent of every module's. Its level and handlers
    govern them all; the package sets them only where it shows its own output (the command line,
    a verbose training run started from Python) or quiets a distributed run's other ranks."""
    return logging.getLogger(PACKAGE)


def stream_handler(stream: TextIO | None = None) -> logging.StreamHandler:
    """A handler writing to ``stream`` (standard error by default) through :class:`PrefixFormatter`."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(PrefixFormatter())
    return handler


def info_shown(logger: logging.Logger, message: str, *args: object) -> None:
    """Log ``message % args`` at INFO through ``logger``; where nothing shows the package's
    records (no handler on the way to the root, the package logger's level not set) - a Python
    session that configured no logging - also write it to standard error as the command line
    shows it (``libreyolo: <message>``): where the output went, which weights the model holds."""
    logger.info(message, *args)
    if not logger.hasHandlers() and package_logger().level == logging.NOTSET:
        import sys
        print(PREFIX + (message % args if args else message), file=sys.stderr)
