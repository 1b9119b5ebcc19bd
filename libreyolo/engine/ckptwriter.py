"""The trainer's checkpoint files written by a child interpreter.

Writing a checkpoint is Python-heavy: splitting the packed snapshot into its 3,000-odd tensors
and pickling them (``torch.save`` calls a Python hook for every object it pickles) holds the GIL
for a few hundred milliseconds. In a thread of the training process that overlaps the next
epoch's steps, and every operator call of the step loop gives the GIL up and waits behind the
writer to get it back, so the device waits on the host for a large part of the epoch (the
figures: docs/benchmarks.md, "Training run levers"). The child does that work in
its own interpreter. The trainer's writer thread only hands it the snapshot - a few flat
buffers, sent through a pipe without being pickled - and waits for its reply, the GIL released.

A child that cannot start, or that dies, leaves the writing to the caller (the thread writes the
files itself, as before, one log line); an error of the write (a full disk) comes back as the
exception the write raised. Files are written as :func:`~libreyolo.weights.save_checkpoint`
writes them: temp file, fsync, rename.
"""
from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

_HEAD = struct.Struct("<QQ")   # the pickle's length, the number of out-of-band buffers
_LEN = struct.Struct("<Q")

# the package's folder first on the child's path: it imports this file's package as the parent
# does, also where the parent found it through a path it set itself
_SNIPPET = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from libreyolo.engine.ckptwriter import serve; serve()")


def send(stream: BinaryIO, obj: Any) -> None:
    """Write ``obj`` to ``stream``: a pickle (protocol 5) whose buffers (the snapshot's flat
    arrays) follow it out of band, as raw bytes."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    stream.write(_HEAD.pack(len(head), len(buffers)))
    stream.write(head)
    for buf in buffers:
        raw = buf.raw()
        stream.write(_LEN.pack(raw.nbytes))
        stream.write(raw)
    stream.flush()


def _read(stream: BinaryIO, n: int) -> bytearray:
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            raise EOFError(f"the stream ended {n - got} bytes short")
        got += k
    return data


def receive(stream: BinaryIO) -> Any:
    """The next object :func:`send` wrote; None when the stream ends between objects."""
    first = stream.read(_HEAD.size)
    if not first:
        return None
    if len(first) < _HEAD.size:
        first += _read(stream, _HEAD.size - len(first))
    n_head, n_buffers = _HEAD.unpack(first)
    head = _read(stream, n_head)
    buffers = [_read(stream, _LEN.unpack(_read(stream, _LEN.size))[0]) for _ in range(n_buffers)]
    return pickle.loads(head, buffers=buffers)


def write_snapshot(snapshot, paths: list, written: list | None = None) -> None:
    """The files of one epoch: ``snapshot`` (:class:`~libreyolo.weights.PackedSnapshot`) split into
    the checkpoint and saved to each path atomically, in order; ``best.pt`` without the training
    state (a third of the size). Each path is appended to ``written`` once its file is on disk."""
    from ..weights import save_checkpoint
    resumable = snapshot.unpack()
    for path in paths:
        path = Path(path)
        ckpt = {k: v for k, v in resumable.items() if k != "train_state"} if path.name == "best.pt" else resumable
        save_checkpoint(ckpt, path)
        if written is not None:
            written.append(path)


def serve() -> None:
    """The child's loop: ("write", paths, snapshot) -> ("ok", None, written) or ("error",
    exception, written) - ``written`` the paths whose files are on disk - until ("quit",) or the
    end of stdin."""
    import signal

    import torch
    # Ctrl-C reaches the whole process group: the trainer decides (it joins the write in flight,
    # then ends this process), so a write under way completes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        msg = receive(inp)
        if msg is None or msg[0] == "quit":
            return
        written: list = []
        try:
            write_snapshot(msg[2], msg[1], written)
            reply: tuple = ("ok", None, [str(p) for p in written])
        except Exception as exc:  # noqa: BLE001 - the parent raises it in the trainer
            reply = ("error", exc, [str(p) for p in written])
        try:
            send(out, reply)
        except (pickle.PicklingError, TypeError, AttributeError):   # an exception that does not pickle
            send(out, ("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}"), reply[2]))


class WriterProcess:
    """A child interpreter that writes checkpoints (see the module docstring). :meth:`write`
    returns False where the child is not there (it could not start, or it died): the caller
    writes the files itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        root = str(Path(__file__).resolve().parents[2])
        # no CUDA in the child: it writes host memory only
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _SNIPPET, root], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except OSError as exc:
            log.info("checkpoints are written in the training process (no writer process: %s)", exc)

    def write(self, snapshot, paths: list, written: list | None = None) -> bool:
        """Write ``snapshot`` to ``paths`` in the child, waiting for it; the paths whose files are
        on disk are appended to ``written`` (also when the write fails: then its error is raised)."""
        with self._lock:
            if self.proc is None:
                return False
            try:
                send(self.proc.stdin, ("write", [str(p) for p in paths], snapshot))
                reply = receive(self.proc.stdout)
                if reply is None:
                    raise EOFError("it exited")
            except (OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
                log.warning("the checkpoint writer process is gone (%s); the training process "
                            "writes the checkpoints from now on", exc)
                self._end(kill=True)
                return False
        if written is not None:
            written.extend(Path(p) for p in reply[2])
        if reply[0] == "error":
            raise reply[1]
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Tell the child to quit; a daemon thread waits for its exit (an interpreter's teardown:
        the trainer need not wait for it) and kills it after ``timeout`` seconds. The message, not
        the pipe's end, ends it: a DataLoader worker forked after it started holds a copy of the
        pipe. Every write was answered before (writes wait for their reply)."""
        with self._lock:
            if self.proc is None:
                return
            try:
                send(self.proc.stdin, ("quit",))
            except (OSError, ValueError):
                pass
            self._end(kill=False, timeout=timeout)

    def _end(self, kill: bool, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        if kill:
            proc.kill()

        def reap() -> None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        threading.Thread(target=reap, name="libreyolo-checkpoint-process-reaper", daemon=True).start()
