"""Why EdgeTAM's float16-autocast cases fail the parity protocol on the GPU (fp32 passes): is eager
itself repeatable under autocast, which outputs differ and by how much, and does cuDNN's
deterministic mode change it."""
import sys

import torch

from libreyolo import LibreYOLO
from libreyolo.engine.verify import verify_model

m = LibreYOLO.new("edgetam", "edge", device="cuda", seed=0)
m.SUPPORTS_CUDA_GRAPH = True
m.runner.supported = True
net = m.model
x = torch.rand(1, 3, 1024, 1024, device="cuda")
with torch.no_grad(), torch.autocast("cuda", torch.float16):
    outs = [m.infer(x) for _ in range(3)]
flat = [o if isinstance(o, (list, tuple)) else [o] for o in outs]
for i, (a, b) in enumerate(zip(flat[0], flat[1])):
    if torch.is_tensor(a):
        print("eager repeat, output", i, tuple(a.shape), a.dtype, "equal", torch.equal(a, b),
              "max diff", (a.float() - b.float()).abs().max().item())
for det in (False, True):
    torch.backends.cudnn.deterministic = det
    torch.backends.cudnn.benchmark = False
    rs = verify_model(m, imgsz=1024, batches=(1,), amp_dtypes=(torch.float16,))
    for r in rs:
        print("cudnn.deterministic", det, {k: v for k, v in r.as_dict().items() if k != "error"},
              (r.error or "")[:300])
sys.stdout.flush()
