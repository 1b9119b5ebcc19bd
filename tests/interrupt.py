"""Interrupting a training run at a chosen point, for the resume tests."""
from __future__ import annotations

import contextlib

import pytest
from tuning import tune_defaults  # tests/tuning.py

import libreyolo.weights as weights


@contextlib.contextmanager
def interrupted_after_last_pt(monkeypatch):
    """Inside the block, the first write of ``last.pt`` completes and then raises
    KeyboardInterrupt (a run stopped right after its first epoch's checkpoint); the block expects
    that interruption, and the real writer is back after it. The checkpoints are written in the
    training process (a child writer process does not see the patched writer)."""
    real_save = weights.save_checkpoint

    def save_then_die(ck, path):
        out = real_save(ck, path)
        if str(path).endswith("last.pt"):
            raise KeyboardInterrupt("simulated interruption after epoch 1")
        return out

    monkeypatch.setattr(weights, "save_checkpoint", save_then_die)
    tune_defaults(monkeypatch, checkpoint_process=False)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        monkeypatch.setattr(weights, "save_checkpoint", real_save)
