"""Session 21 call 1: PackedSnapshot before (906ad97) and after, alternated in one process."""
import importlib.util
import statistics
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from checkpoint_snapshot import setup

from libreyolo import weights as NEW
from libreyolo.models.base import _weights

# .gpu/weights_old.py: `git show 906ad97:libreyolo/weights.py` (the module before the change)
spec = importlib.util.spec_from_file_location("weights_old", ".gpu/weights_old.py")
OLD = importlib.util.module_from_spec(spec); spec.loader.exec_module(OLD)
m, net, ema, opt = setup("yolo9", "t", "cuda", True)
def ck():
    c = m.checkpoint_of(ema, host=False)
    c["train_state"] = {"model_raw": _weights(net, False), "optimizer": opt.state_dict(), "epoch": 3}
    return c
c = ck()
ts = {"old": [], "new": [], "ck": []}
for _r in range(31):
    for name, mod in (("old", OLD), ("new", NEW)):
        torch.cuda.synchronize(); t = time.perf_counter(); s = mod.PackedSnapshot(c, contiguous=("model", "train_state.model_raw")); ts[name].append((time.perf_counter()-t)*1e3)
    t = time.perf_counter(); ck(); ts["ck"].append((time.perf_counter()-t)*1e3)
print({k: round(statistics.median(v), 2) for k, v in ts.items()})
a = OLD.PackedSnapshot(c, contiguous=("model", "train_state.model_raw")).unpack()
b = NEW.PackedSnapshot(c, contiguous=("model", "train_state.model_raw")).unpack()
from torch.utils._pytree import tree_flatten

la, sa = tree_flatten(a); lb, sb = tree_flatten(b)
print("same spec", sa == sb, "same leaves", all((torch.equal(x, y) and x.stride()==y.stride() and x.dtype==y.dtype) if isinstance(x, torch.Tensor) else x == y for x, y in zip(la, lb)))
# how much is the copy itself
from torch._utils import _flatten_dense_tensors

tl = [l for l in tree_flatten(c)[0] if isinstance(l, torch.Tensor)]
def cat():
    torch.cuda.synchronize(); t = time.perf_counter(); _flatten_dense_tensors(tl).cpu(); return (time.perf_counter()-t)*1e3
print("cat+copy only", statistics.median([cat() for _ in range(15)]))
