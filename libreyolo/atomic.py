"""Writing a file atomically, and the one error a failed write raises.

Every file the library writes for the caller (a saved image or depth map, an exported ONNX graph,
a checkpoint) goes to a hidden temp file beside its target, ``.<name>.XXXXXXXX.tmp``, which is
renamed onto the target once complete, so a reader sees either the old file or the whole new one.
The temp file is an implementation detail: when the write fails (a read-only folder, a full disk,
no permission) the error names the target the caller asked for, the folder and, for a full disk,
the space left - never the temp file alone.
"""
from __future__ import annotations

import errno as _errno
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["FileWriteError", "atomic_write", "describe_os_error", "temp_path", "write_error"]


class FileWriteError(OSError):
    """A file could not be written. ``filename`` is the target (not the temp file the bytes went
    to), ``errno`` the operating system's code; the message says what went wrong and what was
    left: the previous file at the target is intact, or nothing was written there."""

    def __init__(self, message: str, *, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errno = errno
        self.filename = filename

    def __str__(self) -> str:  # OSError's own would print "[Errno 28] None: 'file'"
        return self.message


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def describe_os_error(exc: OSError, folder: Path, needed: int | None = None) -> tuple[str, bool]:
    """``exc`` in words without the temp file's name, and whether the disk is full: the code and
    the system's text (``[Errno 30] Read-only file system``), then what it means for ``folder``
    (read-only, not writable, the space free there and ``needed`` bytes where known)."""
    code = exc.errno
    text = f"[Errno {code}] {exc.strerror}" if code is not None and exc.strerror else f"{type(exc).__name__}: {exc}"
    try:
        free: int | None = shutil.disk_usage(folder).free
    except OSError:
        free = None
    full = code in (_errno.ENOSPC, _errno.EDQUOT)
    if full:
        text += (f"; it needs about {_size(needed)}" if needed else "") + (
            f"; {_size(free)} free on the filesystem of '{folder}' (the disk is full)" if free is not None
            else " (the disk is full)")
    elif code == _errno.EROFS:
        text += f" ('{folder}' is on a read-only filesystem)"
    elif code in (_errno.EACCES, _errno.EPERM):
        text += f" (no permission to write in '{folder}')"
    return text, full


def write_error(target: str | os.PathLike[str], exc: OSError, needed: int | None = None,
                what: str = "write") -> FileWriteError:
    """The :class:`FileWriteError` for a write of ``target`` that failed with ``exc`` (raised
    while creating, writing or renaming its temp file): it names ``target``, the cause and, for a
    full disk, the space needed (``needed`` bytes, where known) and free."""
    target = Path(target)
    cause, full = describe_os_error(exc, target.parent, needed)
    kept = f"the previous '{target}' is intact" if target.exists() else f"nothing was written at '{target}'"
    advice = ("" if exc.errno is None else ": free some space or write elsewhere" if full
              else ": check that the folder exists and is writable, or write elsewhere")
    return FileWriteError(f"cannot {what} '{target}': {cause}; {kept}{advice}",
                          errno=exc.errno, filename=str(target))


def temp_path(target: Path) -> Path:
    """The hidden temp file a write of ``target`` goes through: ``.<name>.<12 hex>.tmp``."""
    return target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")


@contextmanager
def atomic_write(target: str | os.PathLike[str], *, fsync: bool = False, mode: int | None = None,
                 what: str = "write") -> Iterator[IO[bytes]]:
    """A binary file to write ``target``'s bytes into; on leaving the block it is renamed onto
    ``target`` (after an fsync with ``fsync=True``, and a chmod to ``mode`` where given; else the
    mode follows the umask, as a new file's does). Parent folders are created. On any error the
    temp file is removed and ``target`` is left as it was; an ``OSError`` (read-only folder, full
    disk, no permission) becomes :class:`FileWriteError` naming ``target``."""
    target = Path(target)
    tmp = temp_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:   # "x": never clobber
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:   # never created (a read-only folder answers EROFS, not ENOENT, on some systems)
            pass
        if isinstance(exc, OSError) and not isinstance(exc, FileWriteError):
            raise write_error(target, exc, what=what) from exc
        raise
