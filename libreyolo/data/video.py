"""Video files, cameras and network streams in, annotated videos out - through PyAV (FFmpeg).

A *video source* is one of:

* a video file (``.mp4``, ``.mkv``, ``.avi``, ``.mov``, ``.webm``, ``.m4v``, ``.mpg``, ``.mpeg``,
  ``.ts``, ``.wmv``, ``.flv``);
* a camera: an ``int`` index (``0``), its text (``"0"``) or a ``/dev/videoN`` path, opened through
  FFmpeg's ``v4l2`` input on Linux and ``avfoundation`` on macOS;
* an ``rtsp://``, ``rtsps://``, ``rtmp://``, ``rtmps://``, ``http://`` or ``https://`` URL;
* a ``.streams`` or ``.txt`` file listing several of the above, one a line (blank lines and lines
  starting with ``#`` are skipped; relative paths are taken from the list file's folder).

:func:`open_video_sources` opens every source at once, so that a file that does not decode, a
camera that does not open or a URL that does not answer within ``timeout`` seconds fails before
any work is done, with one :class:`VideoSourceError` naming the source. Each source then decodes in
its own thread into a small bounded queue (constant memory for any length; decoding overlaps the
caller's work): files and HTTP(S) never lose a frame (the reader waits for the consumer), cameras
and RTSP/RTMP keep the newest frames when the consumer is slower than the source (a live source
cannot wait; the count of frames dropped is logged when it closes).

When a source stops mid-way: a file that raises a decoding error is corrupt - a
:class:`VideoSourceError` naming the file and the frame; a file that ends well before its declared
length is truncated - a warning, and the frames decoded are kept; a camera or URL that drops, or
sends nothing for ``timeout`` seconds, ends its frames with a warning (frames already delivered are
kept).

:class:`VideoWriter` writes RGB frames to an ``.mp4``: H.264 through libx264 when this PyAV
build has it, else MPEG-4 part 2 (the encoder is named in a log line).
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_error

__all__ = ["VIDEO_EXTENSIONS", "STREAM_LIST_EXTENSIONS", "DEFAULT_TIMEOUT", "VideoSourceError", "Frame",
           "VideoStream", "VideoSources", "VideoWriter", "is_video_source", "open_video_sources",
           "video_encoder"]

log = logging.getLogger(__name__)

#: File suffixes (lower case, with the dot) read as video files.
VIDEO_EXTENSIONS: frozenset[str] = frozenset(
    {".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".wmv", ".flv"})
#: File suffixes read as lists of video sources, one a line.
STREAM_LIST_EXTENSIONS: frozenset[str] = frozenset({".streams", ".txt"})
#: URL schemes read as network streams; those of live protocols drop frames rather than wait.
URL_SCHEMES: tuple[str, ...] = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https")
LIVE_SCHEMES: tuple[str, ...] = ("rtsp", "rtsps", "rtmp", "rtmps")
#: Seconds a camera or URL may take to open, and to deliver each next piece of data.
DEFAULT_TIMEOUT = 10.0
#: Decoded frames held per source between its reader thread and the consumer.
QUEUE_FRAMES = 4
#: A file whose last frame ends this many seconds (or frame intervals, whichever is more) before
#: its declared duration is reported as truncated (the container's duration may include a
#: slightly longer audio track, hence a warning and not an error).
_TRUNCATION_SLACK_S, _TRUNCATION_SLACK_FRAMES = 0.2, 3


class VideoSourceError(ValueError):
    """A video source that cannot be used: it does not open, does not decode or does not answer.
    The message names the source."""


@dataclass
class Frame:
    """One decoded frame: ``image`` HxWx3 uint8 RGB; ``index`` its position in the source (every
    frame counted, also those skipped by ``vid_stride``); ``timestamp`` seconds since the source's
    first frame; ``stream`` the source's position in a ``.streams`` list (0 otherwise)."""

    image: np.ndarray
    index: int
    timestamp: float
    stream: int = 0


def _require_av():
    try:
        import av
    except ImportError as exc:  # pragma: no cover - the `video` extra is part of the test extra
        raise ImportError("video sources need PyAV: pip install 'libreyolo-graphs[video]' (or pip install av)") from exc
    return av


def _scheme(text: str) -> str | None:
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.lower() in URL_SCHEMES else None


def is_video_source(source: Any) -> bool:
    """Whether ``source`` is read as video (see the module docstring); lists never are."""
    if isinstance(source, bool):
        return False
    if isinstance(source, int):
        return True
    if not isinstance(source, (str, os.PathLike)):
        return False
    text = os.fspath(source)
    if not isinstance(text, str):
        return False
    if _scheme(text) is not None:
        return True
    if text.strip().isdigit() and not Path(text).exists():
        return True
    if text.startswith("/dev/video"):
        return True
    return Path(text).suffix.lower() in VIDEO_EXTENSIONS | STREAM_LIST_EXTENSIONS


# --------------------------------------------------------------------------------------------------
# Opening one source.


def _target(spec: Any, timeout: float) -> tuple[str, str, str, dict[str, Any]]:
    """``spec`` -> (kind, display name, what av.open is given, av.open keyword arguments)."""
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()
                                 and not Path(spec).exists()):
        return _camera(int(spec), timeout)
    text = os.fspath(spec)
    if text.startswith("/dev/video"):
        return _camera(text, timeout)
    scheme = _scheme(text)
    if scheme is not None:
        # timeout=(open, read): FFmpeg's interrupt callback ends a connect or a read that takes
        # longer; RTSP over TCP is the robust default (UDP loses packets behind NAT and firewalls).
        options = {"rtsp_transport": "tcp"} if scheme.startswith("rtsp") else {}
        return "live" if scheme in LIVE_SCHEMES else "url", text, text, {"timeout": (timeout, timeout),
                                                                         "options": options}
    path = Path(text).expanduser()
    if not path.exists():
        hint = (" (glob patterns of videos are not expanded: list the files in a .streams file)"
                if set("*?[") & set(text) else "")
        raise FileNotFoundError(f"video file not found: '{text}'{hint}")
    if not path.is_file():
        raise VideoSourceError(f"'{text}' is not a video file")
    return "file", text, str(path), {}


def _camera(index: int | str, timeout: float) -> tuple[str, str, str, dict[str, Any]]:
    if sys.platform.startswith("linux"):
        dev = index if isinstance(index, str) else f"/dev/video{index}"
        name = f"camera {index}" if isinstance(index, int) else dev
        if not Path(dev).exists():
            raise VideoSourceError(f"{name} does not open: {dev} does not exist (no camera with that index "
                                   "is connected, or the container has no access to it)")
        return "camera", name, dev, {"format": "v4l2", "timeout": (timeout, timeout)}
    if sys.platform == "darwin":
        if isinstance(index, str):
            raise VideoSourceError(f"'{index}' is a Linux camera path; on macOS give the camera's index (source=0)")
        return "camera", f"camera {index}", str(index), {"format": "avfoundation", "options": {"framerate": "30"},
                                                          "timeout": (timeout, timeout)}
    raise VideoSourceError(f"camera {index} does not open: camera indices are supported on Linux (v4l2) and "
                           f"macOS (avfoundation), not on {sys.platform}; give the camera's stream URL instead")


def _open_error(name: str, kind: str, exc: Exception, started: float, timeout: float, av) -> VideoSourceError:
    took = time.monotonic() - started
    # FFmpeg's interrupt callback surfaces as "immediate exit requested", or (RTSP) as invalid data
    # once the handshake was cut short: the clock says which it was
    if isinstance(exc, av.error.ExitError) or (kind != "file" and took >= timeout * 0.9):
        return VideoSourceError(f"video source '{name}' did not answer within {timeout:g} s (timeout=)")
    if isinstance(exc, ConnectionRefusedError):
        return VideoSourceError(f"video source '{name}' refused the connection (nothing is listening there)")
    if isinstance(exc, av.error.InvalidDataError):
        return VideoSourceError(f"cannot decode video '{name}': not a video, or a corrupt or truncated file "
                                f"(FFmpeg: {exc.strerror or exc})")
    if isinstance(exc, av.error.FFmpegError):
        return VideoSourceError(f"video source '{name}' does not open: {exc.strerror or exc}")
    return VideoSourceError(f"video source '{name}' does not open: {type(exc).__name__}: {exc}")


_END = object()


class _Failure:
    def __init__(self, exc: BaseException, decoded: int):
        self.exc, self.decoded = exc, decoded


class VideoStream:
    """One opened video source, decoding in its own thread (see the module docstring).

    Attributes: ``name`` (the path, URL or ``camera N``), ``kind`` (``file``, ``camera``,
    ``url`` or ``live``), ``fps`` (the source's average frame rate, None when it does not say),
    ``width``, ``height``, ``frames`` (the declared frame count, None when unknown), ``stream``
    (position in a ``.streams`` list), ``dropped`` (frames a live source dropped so far).
    """

    def __init__(self, spec: Any, *, stream: int = 0, vid_stride: int = 1, timeout: float = DEFAULT_TIMEOUT):
        av = _require_av()
        self._av = av
        self.stream, self.vid_stride, self.timeout = int(stream), int(vid_stride), float(timeout)
        self.kind, self.name, target, kwargs = _target(spec, self.timeout)
        started = time.monotonic()
        try:
            self.container = av.open(target, **kwargs)
        except Exception as exc:
            raise _open_error(self.name, self.kind, exc, started, self.timeout, av) from exc
        try:
            self._setup()
        except BaseException:
            self.container.close()
            raise
        self.dropped = 0
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_FRAMES)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False

    def _setup(self) -> None:
        videos = self.container.streams.video
        if not videos:
            kinds = sorted({s.type for s in self.container.streams}) or ["none"]
            raise VideoSourceError(f"'{self.name}' has no video stream (streams: {', '.join(kinds)})")
        v = videos[0]
        ctx = v.codec_context
        if ctx is None:
            raise VideoSourceError(f"cannot decode video '{self.name}': unsupported codec (this FFmpeg build "
                                   "has no decoder for it)")
        v.thread_type = "AUTO"  # frame and slice threads in FFmpeg's decoder
        self.video = v
        self.codec = ctx.name
        rate = v.average_rate or v.guessed_rate
        self.fps: float | None = float(rate) if rate else None
        self.width, self.height = int(ctx.width), int(ctx.height)
        self.frames: int | None = int(v.frames) or None
        if v.duration is not None and v.time_base is not None:
            self.duration: float | None = float(v.duration * v.time_base)
        elif self.container.duration:
            self.duration = self.container.duration / 1e6  # microseconds (av.time_base)
        else:
            self.duration = None

    def __repr__(self) -> str:
        return (f"VideoStream({self.name!r}, kind={self.kind}, codec={self.codec}, {self.width}x{self.height}, "
                f"fps={self.fps}, frames={self.frames})")

    # ---------------------------------------------------------------- reader thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._read, name=f"libreyolo-video-{self.stream}", daemon=True)
            self._thread.start()

    def _put(self, item: Any) -> None:
        q = self._queue
        if self.kind in ("camera", "live") and isinstance(item, Frame):
            while not self._stop.is_set():  # keep the newest frames: a live source cannot wait
                try:
                    q.put_nowait(item)
                    return
                except queue.Full:
                    try:
                        q.get_nowait()
                        self.dropped += 1
                    except queue.Empty:
                        pass
            return
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _read(self) -> None:
        decoded = 0
        t0: float | None = None
        try:
            for frame in self.container.decode(self.video):
                if self._stop.is_set():
                    return
                index = decoded
                decoded += 1
                t = frame.time
                if t is None:
                    t = index / self.fps if self.fps else float(index)
                if t0 is None:
                    t0 = t
                self._last_time = t - t0
                if index % self.vid_stride:
                    continue  # decoded (later frames depend on it) but not converted to RGB
                image = frame.to_ndarray(format="rgb24")
                self._put(Frame(np.ascontiguousarray(image), index, float(t - t0), self.stream))
            self._decoded = decoded
            self._put(_END)
        except BaseException as exc:  # handed to the consumer, which raises or warns
            self._decoded = decoded
            self._put(_Failure(exc, decoded))

    # ---------------------------------------------------------------- consumer
    def __iter__(self) -> Iterator[Frame]:
        """The frames (every ``vid_stride``-th), decoded in the background; see the module docstring
        for how a source that stops mid-way ends."""
        self.start()
        wait = None if self.kind == "file" else self.timeout + 1.0
        while True:
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                log.warning("video source '%s' sent no frame for %.3g s: ending it (frames already "
                            "delivered are kept)", self.name, wait)
                self._finished = True
                return
            if isinstance(item, Frame):
                yield item
                continue
            self._finished = True
            if item is _END:
                self._check_length()
                return
            self._failed(item)
            return

    def _failed(self, failure: _Failure) -> None:
        exc, n = failure.exc, failure.decoded
        if self.kind == "file":
            raise VideoSourceError(f"cannot decode video '{self.name}' at frame {n}: the file is corrupt "
                                   f"({type(exc).__name__}: {getattr(exc, 'strerror', None) or exc})") from exc
        if isinstance(exc, self._av.error.ExitError):  # FFmpeg's interrupt callback: the read timeout
            why = f"it sent nothing for {self.timeout:g} s (timeout=)"
        else:
            why = f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
        log.warning("video source '%s' stopped after %d frame(s) (%s); ending it (frames already "
                    "delivered are kept)", self.name, n, why)

    def _check_length(self) -> None:
        if self.kind != "file":
            return
        n = getattr(self, "_decoded", 0)
        if n == 0:
            raise VideoSourceError(f"cannot decode video '{self.name}': no frame could be decoded (a truncated "
                                   "or corrupt file)")
        interval = 1.0 / self.fps if self.fps else 0.0
        slack = max(_TRUNCATION_SLACK_S, _TRUNCATION_SLACK_FRAMES * interval)
        ended = getattr(self, "_last_time", 0.0) + interval
        short_by_time = self.duration is not None and ended + slack < self.duration
        short_by_count = self.frames is not None and n + max(_TRUNCATION_SLACK_FRAMES, 1) < self.frames
        if short_by_time or short_by_count:
            declared = (f"{self.frames} frames" if self.frames else f"{self.duration:.2f} s")
            log.warning("video '%s' ended after %d frame(s) (%.2f s) of its declared %s: the file looks "
                        "truncated; the frames decoded are kept", self.name, n, ended, declared)

    def close(self) -> None:
        """Stop the reader thread and close the source (idempotent)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            while thread.is_alive():
                try:  # unblock a reader waiting on a full queue
                    while True:
                        self._queue.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.05)
                if thread.is_alive() and self.kind != "file" and not self._finished:
                    thread.join(timeout=self.timeout + 1.0)  # a network read ends within its timeout
                    break
        if thread is None or not thread.is_alive():
            self.container.close()
        if self.dropped:
            log.info("'%s': %d frame(s) dropped because processing was slower than the source",
                     self.name, self.dropped)


# --------------------------------------------------------------------------------------------------
# Several sources, step by step.


def _read_stream_list(path: Path) -> list[Any]:
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as exc:
        raise VideoSourceError(f"stream list '{path}' is not a text file") from exc
    specs: list[Any] = []
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if not (_scheme(text) or text.isdigit() or text.startswith("/dev/video")):
            p = Path(text).expanduser()
            if not p.is_absolute():
                p = path.parent / p
            if p.suffix.lower() not in VIDEO_EXTENSIONS:
                raise VideoSourceError(f"stream list '{path}', line {n}: '{text}' is not a video file, camera "
                                       f"index or stream URL (video suffixes: {', '.join(sorted(VIDEO_EXTENSIONS))})")
            text = str(p)
        specs.append(text)
    if not specs:
        raise VideoSourceError(f"stream list '{path}' names no source (one path, camera index or URL a line)")
    return specs


class VideoSources:
    """One or more opened :class:`VideoStream` s; iterate :meth:`steps` for one frame of each per
    step, or a single stream directly. Close with :meth:`close` (or use it as a context manager)."""

    def __init__(self, streams: list[VideoStream]):
        self.streams = streams

    def __len__(self) -> int:
        return len(self.streams)

    def __enter__(self) -> VideoSources:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def steps(self) -> Iterator[list[Frame]]:
        """Lists of frames, one from each source still running; a source that ends leaves the
        steps (logged when there are several), the others go on."""
        iters = {s.stream: iter(s) for s in self.streams}
        for s in self.streams:
            s.start()
        while iters:
            step = []
            for k in list(iters):
                try:
                    step.append(next(iters[k]))
                except StopIteration:
                    del iters[k]
                    if len(self.streams) > 1:
                        log.info("stream %d ('%s') ended; %d still running", k,
                                 self.streams[k].name, len(iters))
            if step:
                yield step

    def close(self) -> None:
        for s in self.streams:
            s.close()


def open_video_sources(source: Any, *, vid_stride: int = 1, timeout: float = DEFAULT_TIMEOUT) -> VideoSources:
    """Open ``source`` (a video file, camera, URL or ``.streams``/``.txt`` list; see the module
    docstring) and return its streams, every one opened (or a :class:`VideoSourceError`,
    ``FileNotFoundError`` naming the one that is not; those opened before it are closed)."""
    text = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    if text is not None and Path(text).suffix.lower() in STREAM_LIST_EXTENSIONS and not _scheme(text):
        path = Path(text).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"stream list not found: '{text}'")
        specs = _read_stream_list(path)
    else:
        specs = [source]
    streams: list[VideoStream] = []
    try:
        for i, spec in enumerate(specs):
            streams.append(VideoStream(spec, stream=i, vid_stride=vid_stride, timeout=timeout))
    except BaseException:
        for s in streams:
            s.close()
        raise
    return VideoSources(streams)


# --------------------------------------------------------------------------------------------------
# Writing.


def video_encoder() -> tuple[str, str]:
    """(FFmpeg encoder, what it writes) for annotated videos: libx264 (H.264) when this PyAV
    build has it, else its built-in mpeg4 (MPEG-4 part 2, which every build has)."""
    av = _require_av()
    try:
        av.codec.Codec("libx264", "w")
        return "libx264", "H.264"
    except Exception:
        return "mpeg4", "MPEG-4 part 2"


class VideoWriter:
    """Write HxWx3 uint8 RGB frames of one size to an ``.mp4`` at ``fps`` (see :func:`video_encoder`).

    The file appears when :meth:`close` is called (written under a temporary name in the same
    folder, then renamed), so a reader never sees a half-written video.
    """

    def __init__(self, path: str | os.PathLike, fps: float | None, width: int, height: int):
        av = self._av = _require_av()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.codec, what = video_encoder()
        self.fps = float(fps) if fps and fps > 0 else 30.0
        rate = Fraction(self.fps).limit_denominator(1001)   # 29.97 -> 30000/1001
        self._frame_time = 1 / rate
        self.width, self.height = int(width), int(height)
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            self.container = av.open(str(self._tmp), "w", format="mp4")
        except OSError as exc:   # a read-only folder, a full disk: name the video, not the temp file
            raise write_error(self.path, exc, what="save the video") from exc
        try:
            self.video = self.container.add_stream(self.codec, rate=rate)
            self.video.width, self.video.height = self.width, self.height
            # 4:2:0 needs even sizes in H.264; an odd-sized frame is written 4:4:4 instead
            even = self.width % 2 == 0 and self.height % 2 == 0
            self.video.pix_fmt = "yuv420p" if even or self.codec != "libx264" else "yuv444p"
            if self.codec == "mpeg4":
                self.video.bit_rate = max(1_000_000, self.width * self.height * 4)
        except BaseException:
            self.container.close()
            self._tmp.unlink(missing_ok=True)
            raise
        self.count = 0
        log.info("writing %s with %s (%s), %dx%d at %.6g fps", self.path, self.codec, what,
                 self.width, self.height, self.fps)

    def write(self, rgb: np.ndarray) -> None:
        if rgb.shape[:2] != (self.height, self.width):
            raise ValueError(f"video '{self.path}' is {self.width}x{self.height}, got a frame of "
                             f"{rgb.shape[1]}x{rgb.shape[0]} (one size per video)")
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = self.count
        frame.time_base = self._frame_time
        self.count += 1
        try:
            for packet in self.video.encode(frame):
                self.container.mux(packet)
        except OSError as exc:   # the disk filled: the caller aborts, which removes the temp file
            raise write_error(self.path, exc, what="save the video") from exc

    def close(self) -> str:
        """Flush the encoder, finish the file and return its path (idempotent). A failed write
        (a full disk) removes the unfinished file and names the video."""
        if self.container is not None:
            try:
                try:
                    for packet in self.video.encode():
                        self.container.mux(packet)
                finally:
                    self.container.close()
                    self.container = None
                os.replace(self._tmp, self.path)
            except OSError as exc:
                try:
                    self._tmp.unlink(missing_ok=True)
                except OSError:   # never created (a read-only folder)
                    pass
                raise write_error(self.path, exc, what="save the video") from exc
        return str(self.path)

    def abort(self) -> None:
        """Close and delete the unfinished file."""
        if self.container is not None:
            try:
                self.container.close()
            except OSError:   # the file is discarded: a full disk failing its last write changes nothing
                pass
            finally:
                self.container = None
                try:
                    self._tmp.unlink(missing_ok=True)
                except OSError:   # never created (a read-only folder)
                    pass
