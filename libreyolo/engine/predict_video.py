"""Video sources in a predict call: their frames as chunks (:func:`video_chunks`), the frame count
for the progress bar (:func:`declared_frames`), the annotated video's file name (:func:`video_stem`)
and the window that shows the annotated frames (:class:`Viewer`).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from ..data.sources import SourceItem
from ..data.video import VideoSources, VideoStream
from ..results import Results, display_problem

log = logging.getLogger(__name__)


def video_chunks(videos: VideoSources, batch: int) -> Iterator[list[SourceItem]]:
    """Video frames as predict chunks: ``batch`` consecutive frames of a single source, or one
    frame of each running source of a ``.streams`` list per step."""
    def item(f) -> SourceItem:
        src = videos.streams[f.stream]
        return SourceItem(src.name, f.image, frame_index=f.index, timestamp=f.timestamp, stream=f.stream,
                          fps=src.fps)
    if len(videos) > 1:
        for step in videos.steps():
            yield [item(f) for f in step]
        return
    chunk: list[SourceItem] = []
    for step in videos.steps():
        chunk.append(item(step[0]))
        if len(chunk) == batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def declared_frames(videos: VideoSources) -> int | None:
    """The frames predict will yield when every source declares its length, else None."""
    counts = [s.frames for s in videos.streams]
    if any(c is None for c in counts):
        return None
    return sum(-(-c // s.vid_stride) for c, s in zip(counts, videos.streams))


def video_stem(src: VideoStream) -> str:
    """The annotated video's file stem: the file's stem, ``camera0``, or a URL's last path part."""
    if src.kind == "file":
        return Path(src.name).stem or "video"
    if src.kind == "camera":
        return "camera" + "".join(ch for ch in src.name if ch.isdigit())
    tail = src.name.split("://", 1)[-1].split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(tail).stem)
    return stem or f"stream{src.stream}"


_warned_no_window = False


class Viewer:
    """A window showing one video's annotated frames as they come (matplotlib), where a display
    and an interactive backend exist; elsewhere one warning per process and nothing else."""

    def __init__(self, title: str):
        self.title, self.fig, self.im = title, None, None
        problem = display_problem()
        if problem is None:
            import matplotlib
            backend = matplotlib.get_backend().lower()
            if backend in ("agg", "pdf", "ps", "svg", "cairo", "template") or backend.startswith("module://"):
                problem = f"matplotlib's backend '{matplotlib.get_backend()}' cannot open windows"
        self.problem = problem
        if problem is not None:
            global _warned_no_window
            if not _warned_no_window:
                _warned_no_window = True
                log.warning("show=True cannot open a window: %s; use save=True to write the annotated "
                            "video instead (this warning is shown once)", problem)

    def show(self, r: Results) -> None:
        if self.problem is not None:
            return
        import matplotlib.pyplot as plt
        frame = r.plot()
        if self.fig is None or not plt.fignum_exists(self.fig.number):
            self.fig = plt.figure(self.title)
            ax = self.fig.add_axes((0, 0, 1, 1))
            ax.set_axis_off()
            self.im = ax.imshow(frame)
            plt.show(block=False)
        else:
            self.im.set_data(frame)
        plt.pause(0.001)  # lets the GUI draw; the window keeps up as fast as frames come

    def close(self) -> None:
        if self.fig is not None:
            import matplotlib.pyplot as plt
            plt.close(self.fig)
            self.fig = None
