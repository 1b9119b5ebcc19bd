"""Training curves as a PNG (matplotlib, headless).

Drawn on a bare :class:`matplotlib.figure.Figure` (rendered by Agg at ``savefig``), not through
pyplot: no global figure registry - so it can draw in any thread - and no pyplot import, which is
most of matplotlib's import time. During training it draws in a child interpreter
(:class:`PlotProcess`): this file imports nothing of the package, so the child runs it alone. The
child also runs a task's own drawing function from a file of its own that imports no more than
numpy and matplotlib (:meth:`PlotProcess.send`: the detection evaluator's curves)."""
from __future__ import annotations

import csv
from pathlib import Path


def plot_results(csv_path: str | Path, out: str | Path | None = None) -> Path | None:
    """results.csv -> results.png: one panel per loss, metric and lr column against epoch, and one
    panel for the ``time/`` columns together (seconds per epoch, one line each, with a legend)."""
    csv_path = Path(csv_path)
    rows = list(csv.DictReader(csv_path.open()))
    if not rows:
        return None
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    keys = [k for k in rows[0] if k != "epoch"]
    times = [k for k in keys if k.startswith("time/")]
    # a panel is a title and its columns; the time columns share one (seven small panels of
    # seconds were 40 % of the drawing's time and harder to compare than one with a legend)
    panels = [(k, [k]) for k in keys if k not in times] + ([("time per epoch (s)", times)] if times else [])
    epochs = [int(r["epoch"]) for r in rows]
    cols = 4
    nrows = -(-len(panels) // cols)
    width, height = 4.0 * cols, 3.0 * nrows
    fig = Figure(figsize=(width, height))
    # fixed margins in inches (tick labels left, title above, x label below each panel) rather
    # than tight_layout, which measures every text first and was 40 % of the drawing's time
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, bottom=0.5 / height, top=1 - 0.3 / height,
                        wspace=0.75 / (4.0 - 0.75), hspace=0.85 / (3.0 - 0.85))
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, (title, columns) in zip(axes.flat, panels):
        for key in columns:
            ys = [float(r[key]) if r.get(key) not in (None, "", "nan") else float("nan") for r in rows]
            ax.plot(epochs, ys, marker="o", markersize=3 if len(columns) == 1 else 2, linewidth=1.5,
                    label=key.removeprefix("time/").removesuffix("_s"))
        if len(columns) > 1:
            ax.legend(fontsize=7, ncols=2, frameon=False)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        if len(epochs) <= 12:   # whole epochs on the axis (one epoch drew 0.96 ... 1.04)
            ax.set_xticks(epochs)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    out = Path(out or csv_path.with_name("results.png"))
    tmp = out.with_name(out.name + ".tmp.png")
    try:   # to a temp file, then renamed: a failed write (a full disk) leaves the old picture whole
        fig.savefig(tmp, dpi=110)
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _call(request: dict, modules: dict):
    """``fn(**kwargs)`` of the module in ``file`` (loaded once, alone, like this file)."""
    import importlib.util
    file = request["file"]
    mod = modules.get(file)
    if mod is None:
        spec = importlib.util.spec_from_file_location(f"libreyolo_plots_{len(modules)}", file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        modules[file] = mod
    return getattr(mod, request["fn"])(**request.get("kwargs", {}))


def serve() -> None:
    """The child's loop (:class:`PlotProcess`): one JSON request per stdin line, ``{"csv": ...,
    "out": ...}`` (:func:`plot_results`) or ``{"call": {"file", "fn", "kwargs"}}`` (a task's
    drawing function), one JSON reply per stdout line, ``{"ok": result}`` (a path or null, or the
    function's JSON result) or ``{"error": text}``; the line ``quit`` ends it."""
    import json
    import signal
    import sys
    # Ctrl-C reaches the whole process group: the trainer decides (it ends this child itself)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    modules: dict = {}
    for line in sys.stdin:
        if line.strip() == "quit":   # childproc.end_children's message
            return
        try:
            req = json.loads(line)
            if "call" in req:
                reply = {"ok": _call(req["call"], modules)}
            else:
                out = plot_results(req["csv"], req.get("out"))
                reply = {"ok": None if out is None else str(out)}
        except Exception as exc:  # reported to the parent, which warns; the child lives on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class PlotProcess:
    """results.png drawn by a child interpreter that imports matplotlib alone.

    A drawing in a thread of the trainer's process shares its interpreter lock with the step
    loop: each time the loop waits on the device it must then wait for the lock as well, and the
    first drawing (matplotlib's import) made the epoch beside it three times as long. The child
    starts at the first :meth:`draw` and serves every later one; the caller (the trainer's
    plotter thread) blocks on its reply without holding the lock. When the child cannot start or
    dies, the drawing is done in this process (one debug line) from then on.
    """

    def __init__(self) -> None:
        import threading
        self._proc = None
        self.failed: str | None = None
        self._busy = threading.Lock()   # held from a send to its reply: one request at a time

    def start(self) -> None:
        """Start the child now (it imports matplotlib meanwhile) rather than at the first drawing."""
        with self._busy:
            self._child()

    def _child(self):
        if self._proc is None and self.failed is None:
            from ..childproc import start_child
            try:
                self._proc = start_child(__file__, "libreyolo_plots_child", text=True)
            except OSError as exc:
                self._fail(f"could not start: {exc}")
        return self._proc

    def _fail(self, why: str) -> None:
        import logging
        logging.getLogger(__name__).debug("plots drawn in this process from now on (plot child %s)", why)
        self.failed = why
        self.close()

    def draw(self, csv_path: str | Path, out: str | Path | None = None) -> Path | None:
        """:func:`plot_results` in the child; an error it reports (a full disk) is raised here."""
        from ..childproc import ChildGone
        reply = self.send({"csv": str(csv_path), "out": None if out is None else str(out)})
        if reply is not None:
            try:
                ok = reply()
            except ChildGone:
                return plot_results(csv_path, out)
            return None if ok is None else Path(ok)
        return plot_results(csv_path, out)

    def send(self, request: dict):
        """Send ``request`` to the child at once and return a function that waits for its reply
        (the drawing's result; an error the child reports is raised as RuntimeError, the child's
        exit before it replied as :class:`~libreyolo.childproc.ChildGone`); None when there is no
        child or it died (the caller then draws in this process). ``{"call": {"file", "fn", "kwargs"}}``
        asks for ``fn(**kwargs)`` of the module ``file``, which must import no more than numpy and
        matplotlib. One request at a time: the reply's function is called before the next send."""
        import json

        from ..childproc import ChildGone
        self._busy.acquire()
        proc = self._child()
        if proc is None:
            self._busy.release()
            return None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except (OSError, ValueError):
            self._fail(f"exited with {proc.poll()}")
            self._busy.release()
            return None

        def reply():
            try:
                line = proc.stdout.readline()
            except (OSError, ValueError):
                line = ""
            finally:
                self._busy.release()
            if not line:
                self._fail(f"exited with {proc.poll()}")
                raise ChildGone("the plot child exited before it replied")
            answer = json.loads(line)
            if "error" in answer:
                raise RuntimeError(answer["error"])
            return answer["ok"]
        return reply

    def close(self) -> None:
        """End the child (the quit line; killed if it has not exited within 10 s)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            from ..childproc import end_children
            end_children([proc], "quit\n")
