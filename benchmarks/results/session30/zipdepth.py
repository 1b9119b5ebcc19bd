"""ZipDepth's GPU proof (docs/families.md, "Depth estimation"): the parity protocol on the raw
network and the predict stage at 384, then graph predict == eager."""
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import input_sensitive, verify_model

m = LibreYOLO.new("zipdepth", "b", device="cuda", seed=0)
m.SUPPORTS_CUDA_GRAPH = True; m.runner.supported = True   # this instance only, as tests/gpu does
rs = verify_model(m, imgsz=384, batches=(1, 8))
for r in rs:
    print(r)
m = input_sensitive(m)
a = m(SAMPLE_IMAGE, imgsz=384).depth.data
for _ in range(3):   # first sight, the uint8 stage's capture, replay
    b = m(SAMPLE_IMAGE, imgsz=384, cuda_graph=True).depth.data
print("verify all passed:", all(r.passed for r in rs))
print("graph predict == eager:", torch.equal(a, b), "replays:", m.graph_info()["replays"])
