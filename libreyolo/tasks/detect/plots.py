"""Pictures of a detection validation: PR curves, the confusion matrix, a validation batch.

The two matplotlib figures (:func:`plot_curves`) import nothing of the package at run time, so
the training run's plot child (:class:`~libreyolo.engine.plots.PlotProcess`) draws them from the
arrays :func:`save_curves` wrote (:func:`draw_saved_curves`), while the trainer's process draws
the batch pictures (PIL, through ``Results.plot``) and never imports matplotlib."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .curves import PRSummary

#: the fields of a PRSummary that :func:`save_curves` keeps
CURVE_FIELDS = ("conf_grid", "precision", "recall", "present", "best_conf", "p", "r")


def _figure(**kw):
    """A bare matplotlib Figure (Agg at savefig): no pyplot import, no global figure state."""
    from matplotlib.figure import Figure
    return Figure(**kw)


def plot_pr_curves(pr: PRSummary, names: dict[int, str], path: Path) -> Path:
    """Precision against recall per class (thin) and their mean (thick), IoU 0.5."""
    fig = _figure(figsize=(7, 6), dpi=110)
    ax = fig.subplots()
    present = np.where(pr.present)[0]
    for c in present:
        ax.plot(pr.recall[c], pr.precision[c], lw=1, alpha=0.7, label=str(names.get(int(c), c)))
    if len(present):
        ax.plot(pr.recall[present].mean(0), pr.precision[present].mean(0), lw=3, color="black",
                label=f"all classes (P {pr.p:.3f}, R {pr.r:.3f} at conf {pr.best_conf:.2f})")
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title="precision-recall (IoU 0.5)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_confusion_matrix(matrix: np.ndarray, names: dict[int, str], path: Path, conf: float) -> Path:
    """Column-normalised confusion matrix (each true class's column sums to 1), background last."""
    n = matrix.shape[0]
    labels = [str(names.get(i, i)) for i in range(n - 1)] + ["background"]
    norm = matrix / np.maximum(matrix.sum(0, keepdims=True), 1)
    size = max(5.0, 0.45 * n + 2)
    fig = _figure(figsize=(size + 1, size), dpi=110)
    ax = fig.subplots()
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        for i in range(n):
            for j in range(n):
                if matrix[i, j]:
                    ax.text(j, i, f"{norm[i, j]:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if norm[i, j] > 0.5 else "black")
    ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(n), labels, fontsize=7)
    ax.set(xlabel="true", ylabel="predicted", title=f"confusion matrix (conf >= {conf}, IoU 0.45)")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_curves(pr: PRSummary, matrix: np.ndarray, names: dict[int, str], run_dir: str | Path,
                conf: float) -> list[Path]:
    """pr_curve.png and confusion_matrix.png in ``run_dir``."""
    run_dir = Path(run_dir)
    return [plot_pr_curves(pr, names, run_dir / "pr_curve.png"),
            plot_confusion_matrix(matrix, names, run_dir / "confusion_matrix.png", conf)]


def save_curves(path: str | Path, pr: PRSummary, matrix: np.ndarray) -> None:
    """What :func:`plot_curves` draws, as one uncompressed ``.npz`` at ``path``."""
    np.savez(path, matrix=matrix, **{f: np.asarray(getattr(pr, f)) for f in CURVE_FIELDS})


def draw_saved_curves(npz: str, run_dir: str, names: dict[str, str], conf: float) -> list[str]:
    """The plot child's entry: :func:`plot_curves` from the file :func:`save_curves` wrote (its
    writer removes it); ``names`` as JSON has string keys."""
    from types import SimpleNamespace
    with np.load(npz) as z:
        pr = SimpleNamespace(**{f: z[f] if z[f].ndim else z[f].item() for f in CURVE_FIELDS})
        matrix = z["matrix"]
    return [str(p) for p in plot_curves(pr, matrix, {int(k): v for k, v in names.items()}, run_dir, conf)]


def plot_batch(images: np.ndarray, boxes: list[np.ndarray], names: dict[int, str], path: Path,
               with_conf: bool) -> Path:
    """A grid of up to 16 (B, 3, S, S) uint8 canvases with their boxes (labels: (m, 5) cls + xyxy;
    predictions: (n, 6) xyxy, conf, cls)."""
    from ...results import Boxes, Results
    tiles = []
    for img, b in zip(images[:16], boxes[:16]):
        hwc = np.ascontiguousarray(np.transpose(img, (1, 2, 0)))
        rows = np.asarray(b, dtype=np.float32)
        if not with_conf:   # [cls, x1, y1, x2, y2] -> [x1, y1, x2, y2, 1, cls]
            rows = np.concatenate([rows[:, 1:5], np.ones((len(rows), 1), np.float32), rows[:, :1]], 1) \
                if len(rows) else np.zeros((0, 6), np.float32)
        r = Results(hwc, "batch", names, Boxes(rows.reshape(-1, 6), hwc.shape[:2]))
        tiles.append(r.plot(conf=with_conf))
    n = len(tiles)
    cols = int(np.ceil(np.sqrt(n)))
    rows_n = int(np.ceil(n / cols))
    s = tiles[0].shape[0]
    grid = np.full((rows_n * s, cols * s, 3), 255, np.uint8)
    for k, t in enumerate(tiles):
        r, c = divmod(k, cols)
        grid[r * s:(r + 1) * s, c * s:(c + 1) * s] = t
    from PIL import Image
    Image.fromarray(grid).save(path, quality=90)
    return path
