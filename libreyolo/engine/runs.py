"""A training run's folder lock (:class:`RunLock`) and the errors that stop a run."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training stopped for a reason outside the model (a DataLoader worker died, ...); the message
    says why, and what of the run is on disk."""


class TrainingDiverged(TrainingError, FloatingPointError):
    """The loss was not finite for ``nan_patience`` epochs in a row (or in the run's last epoch):
    the message says what to change, and what ``best.pt`` and ``last.pt`` hold."""


class RunFolderBusy(TrainingError):
    """Another training run holds the run folder (:class:`RunLock`)."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (a KeyboardInterrupt) stopped a run; raised by :meth:`Trainer.train` after the run
    stopped cleanly (the checkpoint write in flight finished, the workers and helper processes
    ended), its message - already logged - saying what ``last.pt`` holds and how to continue."""


class RunLock:
    """An advisory lock on a run folder for the run's length: ``fcntl.flock`` on
    ``<run>/.libreyolo.lock``, which holds the holder's pid, host and start time. Two runs into
    one folder (``exist_ok=True``, or ``resume`` of a run still going) would write over each
    other's results.csv and checkpoints: the second stops at once (:class:`RunFolderBusy`). The
    lock goes with the process (also when it is killed); :meth:`release` removes the file. Where
    ``flock`` does not exist (Windows) or is refused (some network file systems) nothing is locked."""

    NAME = ".libreyolo.lock"

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    @classmethod
    def acquire(cls, run_dir: Path) -> "RunLock | None":
        try:
            import fcntl
        except ImportError:
            return None
        path = Path(run_dir) / cls.NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder = os.read(fd, 512).decode("utf-8", "replace").strip()
                finally:
                    os.close(fd)
                holder = holder or "its process is starting"
                raise RunFolderBusy(
                    f"the run folder {run_dir} is in use by another training run ({holder}): this run would "
                    "overwrite its results.csv and checkpoints. Wait for it to end, or train into another folder "
                    "(another name=, or exist_ok=False for a new numbered one)") from None
            except OSError as exc:   # no locks on this file system
                os.close(fd)
                log.debug("libreyolo: the run folder %s is not locked (%s)", run_dir, exc)
                return None
            try:   # the holder may have removed the file between our open and our lock: lock the new one
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        import socket
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}, started {stamp}\n".encode())
        return cls(fd, path)

    def release(self) -> None:
        import fcntl
        if self.fd < 0:
            return
        try:
            self.path.unlink()
        except OSError:
            pass
        try:   # LOCK_UN releases it even where a forked process still holds a copy of the descriptor
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = -1
