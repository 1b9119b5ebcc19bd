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
    def acquire(cls, run_dir: Path) -> RunLock | None:
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
                log.debug("the run folder %s is not locked (%s)", run_dir, exc)
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


def resume_path(run) -> Path:
    """The ``last.pt`` a run resumes from (``run``: a :class:`~libreyolo.engine.config.RunConfig`):
    the path given, or the run folder's."""
    return (Path(run.resume) if isinstance(run.resume, (str, Path)) and run.resume is not True
            else Path(run.project) / run.name / "weights" / "last.pt")


class RunFolder:
    """A run's folder, held for the run: its path (None: a resumed run whose folder is missing,
    which the checkpoint's load reports), its lock, and whether this run created it."""

    def __init__(self, path: Path | None = None, lock: RunLock | None = None, made: bool = False):
        self.path, self.lock, self.made = path, lock, made

    @classmethod
    def claim(cls, run) -> RunFolder:
        """The run folder (``resume``: the checkpoint's; ``exist_ok=False``: the first free
        ``name``, ``name2``, ... claimed by creating it, so that runs started together get folders
        of their own), locked for the run (:class:`RunLock`): a second run into a folder in use
        stops here with a :class:`RunFolderBusy` naming it and the process that holds it."""
        from .paths import next_run_dir
        made = True
        if run.resume:
            run_dir = resume_path(run).parent.parent
            if not run_dir.is_dir():
                return cls()   # the checkpoint's load says what is missing
            made = False
        elif run.exist_ok:
            run_dir = next_run_dir(run.project, run.name, True)
            made = not run_dir.exists()
            run_dir.mkdir(parents=True, exist_ok=True)
        else:
            while True:
                run_dir = next_run_dir(run.project, run.name, False)
                try:
                    run_dir.mkdir(parents=True)
                    break
                except FileExistsError:   # another run took it since: the next name
                    continue
        lock = RunLock.acquire(run_dir)   # RunFolderBusy: the folder is left as it is
        (run_dir / "weights").mkdir(exist_ok=True)
        return cls(run_dir, lock, made)

    def release(self, failed_setup: bool = False) -> None:
        """The lock released (its file removed); after a set-up that failed, a folder this run
        created and left empty is removed as well."""
        lock, self.lock = self.lock, None
        if lock is not None:
            lock.release()
        if failed_setup and self.made and self.path is not None:
            for folder in (self.path / "weights", self.path):
                try:
                    folder.rmdir()   # only if empty
                except OSError:
                    break


def interrupted_message(epoch: int | None, run_dir: Path | None, total: int, saved: int | None) -> str:
    """What a run stopped by Ctrl-C in ``epoch`` (None: in its set-up) has on disk - ``saved``,
    the epoch ``last.pt`` holds - and the option that continues it."""
    if epoch is None or run_dir is None:
        return "training interrupted during set-up; nothing was saved"
    last = run_dir / "weights" / "last.pt"
    where = f"training interrupted in epoch {epoch + 1}/{total}"
    if saved is None:
        return f"{where}; no epoch had been completed, nothing was saved"
    return f"{where}: {last} holds epoch {saved}/{total}; continue with the same options and resume={last}"


def last_pt_kept(run_dir: Path, saved: int | None) -> str:
    """What ``last.pt`` holds (``saved``: its epoch), for a run stopping on an error."""
    last = run_dir / "weights" / "last.pt"
    return (f"{last} holds epoch {saved} and is intact: continue with resume=True" if saved is not None
            else "nothing had been saved yet in this run")
