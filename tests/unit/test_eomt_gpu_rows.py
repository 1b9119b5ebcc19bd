"""The CPU side of EoMT's GPU rows (tests/gpu/test_tasks_gpu.py): the state those rows put the
model in before capture (``PREPARE_OF_FAMILY``: the mask annealing finished) survives verify's
re-draw of an untrained model, so predict is repeatable - the premise of "graph == eager".

A small configuration (as tests/unit/test_eomt.py) keeps each case well under a second.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from libreyolo.engine.verify import input_sensitive
from libreyolo.models.eomt.model import Eomt
from libreyolo.models.eomt.nn import EomtConfig

SMALL = EomtConfig(64, 3, 2, 2, queries=12)
FIELD = {"semantic": "masks", "segment": "masks", "panoptic": "panoptic"}
OPTS = {"panoptic": {"threshold": 0.0}}   # as the GPU rows: every query a candidate


@pytest.mark.parametrize("task,nc", [("semantic", 5), ("segment", 3), ("panoptic", 4)])
def test_annealed_state_survives_the_redraw_and_predict_repeats(task, nc):
    model = Eomt.custom(SMALL, nc=nc, imgsz=64, device="cpu", seed=0, task=task)
    assert model.model.mask_active == [True, True]   # untrained: probabilities 1, masking in eval
    model.model.set_mask_probs([0.0] * SMALL.blocks)   # what the GPU rows do first
    twin = input_sensitive(model)
    assert twin.model is not model.model and twin.model.mask_active == [False, False]
    img = np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)
    a, b = (torch.as_tensor(getattr(twin(img, **OPTS.get(task, {})), FIELD[task]).data) for _ in range(2))
    assert torch.equal(a, b)
    assert a.shape[-2:] == (48, 80)
