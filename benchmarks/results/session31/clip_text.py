"""CLIP / SigLIP 2 GPU proof, part 2 (the text stage): the command of docs/families.md, "CLIP and SigLIP 2"."""
import torch

from libreyolo import LibreYOLO
from libreyolo.graphs.parity import check_parity

short, long = ["a cat", "a dog", "a red circle"], ["a photo of a very long prompt about " + "things " * 8]
for fam, size in [("clip", "b32"), ("clip", "b16"), ("siglip2", "b16")]:
    m = LibreYOLO.new(fam, size, device="cuda", seed=0)
    with torch.no_grad():
        for name, fn, a, b in m.verify_cases(m.imgsz, 8, (480, 640)):
            r = check_parity(f"{fam}-{size} {name}", fn, a, b, module=m.model); print(r)
            assert r.passed, r
    ref_s, ref_l = m.embed_text(short), m.embed_text(long)            # eager (rows filled up to 64 too)
    m.SUPPORTS_CUDA_GRAPH = True; m.text_runner.supported = True      # this instance only
    for _ in range(2):
        assert torch.equal(m.embed_text(short, cuda_graph=True), ref_s), (fam, size)
        assert torch.equal(m.embed_text(long, cuda_graph=True), ref_l), (fam, size)
    m.set_classes(short, cuda_graph=True)                            # a replay: no new capture
    assert torch.equal(m.class_head().cpu(), ref_s), (fam, size)
    text = m.graph_info()["text"]
    assert text["captures"] == (2 if fam == "clip" else 1) and text["replays"] >= 4, text
