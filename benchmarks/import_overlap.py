"""Does `import torchvision` (torch._dynamo through torchvision.ops) overlap with CUDA's start-up
(context, cuDNN and cuBLAS loading) when run in a thread? One arm per fresh process:
`python benchmarks/import_overlap.py serial|thread` (CUDA machine)."""
import sys
import threading
import time

t0 = time.perf_counter()
import torch

t_torch = time.perf_counter() - t0

def cuda_up():
    torch.cuda.init()
    x = torch.randn(16, 32, 80, 80, device="cuda", requires_grad=True).to(memory_format=torch.channels_last)
    c = torch.nn.Conv2d(32, 32, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    bn = torch.nn.BatchNorm2d(32).cuda()
    with torch.autocast("cuda", torch.float16):
        y = torch.nn.functional.silu(bn(c(x))).sum()
    y.backward()
    (torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")).sum().item()
    torch.cuda.synchronize()

arm = sys.argv[1]
t1 = time.perf_counter()
if arm == "serial":
    __import__("torchvision")   # the import is what is timed
    t_tv = time.perf_counter() - t1
    cuda_up()
    t_cuda = time.perf_counter() - t1 - t_tv
else:
    th = threading.Thread(target=lambda: __import__("torchvision"))
    th.start()
    cuda_up()
    t_cuda = time.perf_counter() - t1
    th.join()
    t_tv = float("nan")
print(f"{arm}: torch {t_torch:.2f} s, torchvision {t_tv:.2f}, cuda {t_cuda:.2f}, after torch {time.perf_counter() - t1:.2f}, total {time.perf_counter() - t0:.2f}")
