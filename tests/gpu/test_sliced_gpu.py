"""predict's tiling=True and augment=True on CUDA (libreyolo.engine.sliced): with Triton each
pass selects its detections inside the stage (the packed rows) and the merge runs on the device;
the tile batches replay one captured graph with the eager numbers, and the boxes are the CPU's
(docs/benchmarks.md, "Tiled inference and test-time augmentation", gives the command)."""
import numpy as np
import pytest
import torch

from libreyolo import LibreYOLO
from libreyolo.engine.verify import input_sensitive
from libreyolo.ops import nms_graph

pytestmark = pytest.mark.cuda


def build(device):
    return input_sensitive(LibreYOLO.new("yolox", "n", nc=3, device=device, seed=0))


def same_boxes(a: torch.Tensor, b: torch.Tensor, share: float = 0.95) -> bool:
    """Most of ``a``'s boxes have a twin in ``b`` (same class; IoU above 0.99, or every corner within
    0.05 px - an untrained network's boxes clipped at the image's edge can have no area, whose IoU
    is 0): the CPU's and the GPU's float32 differ in the last bits, which can move a box across a
    threshold."""
    from torchvision.ops import box_iou
    if len(a) == 0 or len(b) == 0:
        return len(a) == len(b)
    same_cls = a[:, None, 5] == b[None, :, 5]
    iou = box_iou(a[:, :4].float(), b[:, :4].float()) * same_cls
    near = ((a[:, None, :4] - b[None, :, :4]).abs().amax(-1) <= 0.05) & same_cls
    return bool(((iou > 0.99) | near).any(1).float().mean() >= share)


def test_tiles_replay_one_graph_with_the_eager_numbers_and_match_the_cpu():
    assert nms_graph.available(torch.device("cuda")), "the in-stage selection (Triton) is what this test covers"
    img = np.random.default_rng(1).integers(0, 256, (300, 460, 3), dtype=np.uint8)
    gpu = build("cuda")
    opts = dict(imgsz=128, conf=0.05, tiling=True, overlap_ratio=0.2, batch=4)
    eager = gpu(img, **opts)
    graph = [gpu(img, cuda_graph=True, **opts) for _ in range(3)]
    assert len(eager.boxes) > 0
    for r in graph:
        assert torch.equal(r.boxes.data, eager.boxes.data)
    # 3 rows x 5 columns of tiles: 3 forwards of 4 per call through one graph, and one of 3
    tile_graphs = [g for g in gpu.graph_info()["graphs"] if g["inputs"][0].startswith("(4, 128, 128, 3):uint8")]
    assert len(tile_graphs) == 1 and tile_graphs[0]["replays"] >= 6, gpu.graph_info()["graphs"]
    cpu = build("cpu")
    assert same_boxes(eager.boxes.data, cpu(img, **opts).boxes.data)
    for merge in ("iou", "ios"):
        g = gpu(img, tile_merge=merge, tile_full=False, **opts).boxes.data
        assert same_boxes(g, cpu(img, tile_merge=merge, tile_full=False, **opts).boxes.data)


def test_tta_on_cuda_matches_the_cpu():
    img = np.random.default_rng(2).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    gpu, cpu = build("cuda"), build("cpu")
    eager = gpu(img, imgsz=160, conf=0.05, augment=True)
    graph = gpu(img, imgsz=160, conf=0.05, augment=True, cuda_graph=True)
    assert len(eager.boxes) > 0 and torch.equal(graph.boxes.data, eager.boxes.data)
    assert same_boxes(eager.boxes.data, cpu(img, imgsz=160, conf=0.05, augment=True).boxes.data)
