"""Which op makes a model's training-mode forward differ between eager and a CUDA-graph replay:
step-0 loss eager vs captured, as the model is, with dropout off, and with SDPA forced to math."""
import sys

import torch

sys.path[:0] = ["tests", "tests/gpu", "tests/fixtures"]
import test_tasks_gpu as T  # noqa: E402

spec = ("segformer", "b0")
m0 = T.build(spec)
data = m0.task_def.resolve_data("shapes-seg")
_, val, collate = m0.task_def.datasets(data, 128, m0, m0.task_def.Options())
inputs = T.to_dev(collate([val[j] for j in range(8)]))


def arm(name, tweak):
    out = []
    for graphed in (False, True):
        _, net, step = T.make(spec, data.nc)
        tweak(net)
        if graphed:
            g = T.CudaGraphCapturer().capture(step, inputs, module=net)
            loss, _ = g.replay(inputs)
        else:
            loss, _ = step(*inputs)
        out.append(loss)
    torch.cuda.synchronize()
    print(f"{name}: eager {out[0].item():.9f} graph {out[1].item():.9f} equal {torch.equal(*out)}", flush=True)


def no_dropout(net):
    for mod in net.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0


arm("as is", lambda net: None)
arm("dropout off", no_dropout)
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
    arm("sdpa math", lambda net: None)
