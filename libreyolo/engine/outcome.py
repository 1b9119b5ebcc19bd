"""What a finished training run hands back: the model with its final weights in predict's layout
(the EMA's, then ``best.pt``'s) and the run's account (metrics, history, timing, graph info)."""
from __future__ import annotations

import logging
import time

import torch

from ..logs import info_shown

log = logging.getLogger(__name__)


def run_outcome(trainer) -> dict:
    """The trained model handed back (the EMA's weights, then best.pt's on the main rank,
    predict's layout, eval mode) and the run's account, :meth:`Trainer.train`'s return value."""
    t = trainer
    if t.seam is not None:
        t.model.set_train_seam(t.net, None)
    # the trained weights the Model keeps are the EMA's
    if t.ema is not None:
        t.net.load_state_dict(t.ema.ema.state_dict())
    if t.dist is None or t.dist.is_main:
        load_best(t)
    if t.channels_last:   # predict's layout is the contiguous one (its graphs and numbers)
        t.net.to(memory_format=torch.contiguous_format)
    t.net.eval()
    t.model.trained = True
    final = t.history[-1] if t.history else {}
    item_names, timing = t.item_names, t.timing
    runner, seam = t.step_runner, t.seam
    best = t.best_metrics or {}
    return {"run_dir": str(t.run_dir), "epochs": len(t.history), "time_s": time.time() - t.t_start,
            "timing": {k: dict(v) if isinstance(v, dict) else v for k, v in timing.items()},
            **{k: final.get(k) for k in t.metric_keys}, "best_metrics": best,
            "best_epoch": t.best_epoch, "best_fitness": t.best_fitness, "history": t.history,
            "stop_reason": t.stop_reason,
            "loss_names": list(item_names),
            "losses": [[h[f"train/{n}_loss"] for n in item_names] for h in t.history],
            "cuda_graph": runner.info() if seam is None else {**runner.info(), "seam": seam.info()},
            "best": str(t.run_dir / "weights" / "best.pt"), "last": str(t.run_dir / "weights" / "last.pt")}


def load_best(trainer) -> None:
    """The model takes best.pt's weights (the epoch of best validation fitness), as
    ``LibreYOLO("best.pt")`` would have them; ``model.ckpt_path`` names the file. Without a
    best.pt (no epoch with finite losses) it keeps the last epoch's, and says so."""
    from ..weights import load_checkpoint
    t = trainer
    say = (lambda *a: info_shown(log, *a)) if t.cfg.run.verbose else log.info
    weights = t.run_dir / "weights"
    best, last = weights / "best.pt", weights / "last.pt"
    if not best.is_file():
        t.model.ckpt_path = str(last) if last.is_file() else None
        say("no best.pt was written: the model keeps the last epoch's weights")
        return
    t.net.load_state_dict(load_checkpoint(best)["model"])
    t.model.ckpt_path = str(best)
    say("the model holds the weights of %s (epoch %s, the best validation fitness)", best,
        t.best_epoch if t.best_epoch is not None else len(t.history))
