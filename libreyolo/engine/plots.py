"""Training curves as a PNG (matplotlib, headless).

Drawn on a bare :class:`matplotlib.figure.Figure` (rendered by Agg at ``savefig``), not through
pyplot: no global figure registry - so the trainer can draw in a thread of its own - and no
pyplot import, which is most of matplotlib's import time."""
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
