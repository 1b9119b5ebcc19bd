"""Training curves as a PNG (matplotlib, headless).

Drawn on a bare :class:`matplotlib.figure.Figure` (rendered by Agg at ``savefig``), not through
pyplot: no global figure registry - so the trainer can draw in a thread of its own - and no
pyplot import, which is most of matplotlib's import time."""
from __future__ import annotations

import csv
from pathlib import Path


def plot_results(csv_path: str | Path, out: str | Path | None = None) -> Path | None:
    """results.csv -> results.png: one panel per column (losses, lr, metrics) against epoch."""
    csv_path = Path(csv_path)
    rows = list(csv.DictReader(csv_path.open()))
    if not rows:
        return None
    from matplotlib.figure import Figure

    keys = [k for k in rows[0] if k != "epoch"]
    epochs = [int(r["epoch"]) for r in rows]
    cols = 4
    nrows = -(-len(keys) // cols)
    fig = Figure(figsize=(4 * cols, 3 * nrows))
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, key in zip(axes.flat, keys):
        ys = [float(r[key]) if r[key] not in ("", "nan") else float("nan") for r in rows]
        ax.plot(epochs, ys, marker="o", markersize=3, linewidth=1.5)
        ax.set_title(key)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out or csv_path.with_name("results.png"))
    tmp = out.with_name(out.name + ".tmp.png")
    try:   # to a temp file, then renamed: a failed write (a full disk) leaves the old picture whole
        fig.savefig(tmp, dpi=110)
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
