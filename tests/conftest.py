import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fixtures"))
FIXTURES_DIR = ROOT / "fixtures"


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LIBREYOLO_SLOW", "") not in ("1", "true", "yes"):
        slow = pytest.mark.skip(reason="slow (set LIBREYOLO_SLOW=1 to run)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu-check on the GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield


@pytest.fixture
def one_thread():
    """One torch thread for the test (per-image work is many small ops, as in a DataLoader
    worker: on a busy machine intra-op threads mostly wait for each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
