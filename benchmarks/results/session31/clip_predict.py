"""CLIP / SigLIP 2 GPU proof, part 1 (predict): the command of docs/families.md, "CLIP and SigLIP 2"."""
import torch

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import verify_model

for fam, size, imgsz in [("clip", "b32", 224), ("clip", "b16", 224), ("siglip2", "b16", 256)]:
    for task in ("classify", "embed"):
        m = LibreYOLO.new(fam, size, device="cuda", seed=0, task=task)
        m.set_classes(["a cat", "a dog", "a red circle"])   # the text head, cached before any capture
        rs = verify_model(m, imgsz=imgsz, batches=(1, 8)); [print(r) for r in rs]
        assert all(r.passed for r in rs), (fam, size, task)
        m.SUPPORTS_CUDA_GRAPH = True; m.runner.supported = True   # this instance only, as tests/gpu does
        a = m([SAMPLE_IMAGE])[0]
        for _ in range(3):   # first use, capture, replay
            b = m([SAMPLE_IMAGE], cuda_graph=True)[0]
            if task == "classify":
                assert torch.equal(a.probs.data, b.probs.data), (fam, size, task)
            else:
                assert torch.equal(a.embedding.data, b.embedding.data), (fam, size, task)
        assert m.graph_info()["replays"] > 0, (fam, size, task)
