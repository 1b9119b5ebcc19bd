"""Registry-parametrized test rows: adding a family adds rows here, not new test files."""

# (family, size, fixture name) for every architecture fixture a family reproduces.
FIXTURES = [
    ("yolo9", "t", "yolo9-t"),
    ("yolo9", "s", "yolo9-s"),
    ("yolo9_p2", "t", "yolo9_p2-t"),
    ("yolo9_e2e", "t", "yolo9_e2e-t"),
    ("yolox", "n", "yolox-n"),
    ("yolox", "t", "yolox-t"),
    ("yolox", "s", "yolox-s"),
    ("yolo7", "b", "yolo7-b"),
    ("rtmdet", "t", "rtmdet-t"),
    ("rtmdet", "t", "rtmdet-t-seg"),
    ("picodet", "s", "picodet-s"),
    ("ppyoloe", "s", "ppyoloe-s"),
    ("yolonas", "s", "yolonas-s"),
    ("yolonas", "n", "yolonas-n-pose"),
    ("yolonas", "s", "yolonas-s-obb"),
    ("rtdetr", "r18", "rtdetr-r18"),
    ("rtdetrv2", "r18", "rtdetrv2-r18"),
    ("dfine", "n", "dfine-n"),
    ("dfine", "n", "dfine-n-seg"),
    ("deim", "n", "deim-n"),
    ("rtdetrv4", "s", "rtdetrv4-s"),
    ("deimv2", "atto", "deimv2-atto"),
    ("ec", "s", "ec-s"),
    ("ec", "s", "ec-s-pose"),
    ("ec", "s", "ec-s-seg"),
    ("rtdetrv2", "n", "rtdetrv2-n-obb"),
    ("resnet", "18", "resnet-18"),
    ("efficientnetv2", "b0", "efficientnetv2-b0"),
    ("mobilenetv4", "s", "mobilenetv4-s"),
    ("convnext", "t", "convnext-t"),
    ("segformer", "b0", "segformer-b0"),
    ("mobilesam", "tiny", "mobilesam-tiny"),
    ("depth_anything", "s", "depth_anything-s"),
    ("zipdepth", "b", "zipdepth-b"),
    # 334 M parameters: each of its rows fills and loads ~1.3 GB (about a minute on two cores)
    ("depth_anything3", "l", "depth_anything3-l"),
    ("birefnet", "t", "birefnet-t"),
    ("feynobg", "l", "feynobg-l"),
    ("ppocr", "t", "ppocr-t-det"),
    ("ppocr", "t", "ppocr-t-rec"),
    ("yolo1", "t", "yolo1-t"),
    ("yolo2", "t", "yolo2-t"),
    ("yolo3", "t", "yolo3-t"),
    ("yolo4", "t", "yolo4-t"),
    ("pidnet", "s", "pidnet-s"),
    ("lingbotvision", "s", "lingbotvision-s"),
    ("clip", "b32", "clip-b32"),
    ("siglip2", "b16", "siglip2-b16"),
    ("eomt", "s", "eomt-s"),
    ("eomt", "s", "eomt-s-seg"),
    ("eomt", "s", "eomt-s-panoptic"),
    ("nafnet", "s", "nafnet-s"),
    ("realesrgan", "x4t", "realesrgan-x4t"),
    ("swinir", "s", "swinir-s"),
    ("sam2", "tiny", "sam2-tiny"),
    ("edgetam", "edge", "edgetam-edge"),
    ("fomo", "s", "fomo-s"),
    # SAM ViT-B runs at its fixed 1024 frame: a minute or two per row on one core (slow rows)
    ("sam", "base", "sam-base"),
    ("picosam3", "pico", "picosam3-pico"),
    # SAM 3's tracker (458 M parameters) at its fixed 1008 frame: a slow row
    ("sam3", "large", "sam3-large"),
]

# Fixtures of large networks (seconds to fill, build and run on one core): their rows in
# tests/unit/test_fixtures.py are marked slow (LIBREYOLO_SLOW=1 runs them). Fixture -> why.
SLOW_FIXTURES = {
    "feynobg-l": "262.8 M parameters (BiRefNet with a 24-block Swin-L stage): 16-35 s per row on one core",
    "depth_anything3-l": "334.2 M parameters (ViT-L/14 + DPT): about 40 s per row on one core",
    "clip-b32": "151.3 M parameters (both towers): 5-10 s per row on one core; tests/unit/test_embed.py checks "
                "the towers' parity with the image tower's fixture entries loaded alone",
    "siglip2-b16": "375.2 M parameters (a 256,000-token embedding): 16-30 s per row on one core",
    "eomt-s": "23.7 M parameters at 512 (1,129 tokens) and a 150 x 100 x 512 x 512 semantic sum: 3.7-7.4 s "
              "per row on one core (tests/unit/test_eomt.py: the fast small-config rows of each head)",
    "eomt-s-seg": "23.9 M parameters at 640 (1,705 tokens), masks upsampled to 100 x 640 x 640: 1.7-6.5 s per row",
    "eomt-s-panoptic": "23.9 M parameters at 640 (1,705 tokens), masks upsampled to 100 x 640 x 640: 2-7.2 s per row",
    "sam2-tiny": "the fixed 1024x1024 frame through Hiera-tiny: about 13 s per row on one core "
                 "(tests/unit/test_sam2.py runs the same code at a 256 frame)",
    "edgetam-edge": "the fixed 1024x1024 frame through RepViT-M1: about 6 s per row on one core "
                    "(tests/unit/test_sam2.py runs the same code at a 256 frame)",
    "sam-base": "SAM ViT-B at its fixed 1024x1024 frame: 15-115 s per row on one core (fast twin: "
                "tests/unit/test_sam.py on a small config)",
    "sam3-large": "SAM 3's tracker, 458.3 M parameters (ViT-L/14, 32 blocks) at its fixed 1008x1008 frame: "
                  "minutes per row on one core (fast twin: tests/unit/test_sam3.py on a small config)",
}

# The sub-network a fixture's forward ran (its json's "forward"), where it is not the whole network.
FIXTURE_FORWARD = {
    "ppocr-t-det": "det",
    "ppocr-t-rec": "rec",
}

# The task variant a fixture's network serves, where it is not its family's own task.
FIXTURE_TASK = {
    "ec-s-pose": "pose",
    "rtmdet-t-seg": "segment",
    "dfine-n-seg": "segment",
    "ec-s-seg": "segment",
    "rtdetrv2-n-obb": "obb",
    "yolonas-n-pose": "pose",
    "yolonas-s-obb": "obb",
    "eomt-s-seg": "segment",
    "eomt-s-panoptic": "panoptic",
}

# Fixtures whose top-k query selection has an exact tie at its boundary (their README and
# ``topk_selection``): that many reference rows may be another query in a correct implementation
# (the reference itself, re-run, picks another), so the order-free comparison leaves them out.
FIXTURE_BOUNDARY_TIES = {
    "rtdetrv2-n-obb": 1,
}

# Families whose checkpoints share another family's layout key for key: a bare state dict (no
# metadata, anonymous file name) is read as the family given here (documented on the classes).
SNIFFED_AS = {
    "deim": "dfine",
    "rtdetrv4": "dfine",
}

# (family, size) built untrained for the fast CPU predict / checkpoint tests.
SMALL_MODELS = [
    ("yolo9", "t"),
    ("yolox", "n"),
    ("yolo7", "tiny"),
    ("rtmdet", "t"),
    ("picodet", "s"),
]

# (family, size) that must pass the GPU parity protocol.
GRAPH_MODELS = [
    ("yolo9", "t"),
    ("yolo9", "s"),
    ("yolox", "n"),
    ("yolo7", "tiny"),
    ("rtmdet", "t"),
    ("picodet", "s"),
    ("rtdetr", "r18"),
    ("rtdetrv2", "r18"),
    ("ec", "s"),
    ("dfine", "n"),
    ("deim", "n"),
    ("rtdetrv4", "s"),
    ("deimv2", "atto"),
]

# Families whose fixture fill is no probe weight set under fp16 autocast: it drives their HGNetv2
# backbone below half precision's resolution, so two different probes give one fp16 output and
# the parity protocol cannot conclude (session-3 run B: every replay still equalled eager). Their
# parity test runs on verify's own seeded re-draw instead, as scripts/gpu_families.py does.
PARITY_REDRAW = {"dfine", "deim", "rtdetrv4", "deimv2"}

# (family, size) whose training step (fwd+bwd and whole step) must pass the GPU training parity tests.
TRAIN_GRAPH_MODELS = [
    ("yolo9", "t"),
    ("yolox", "n"),
    ("yolo7", "tiny"),
    ("rtmdet", "t"),
    ("picodet", "s"),
    ("yolo9_p2", "t"),
    ("yolo9_e2e", "t"),
    ("ppyoloe", "s"),
    ("yolonas", "s"),
    ("yolo2", "t"),
    ("yolo3", "t"),
    ("yolo4", "t"),
]

# (family, size) of set-prediction detectors trained with their backbone+encoder captured (the seam).
SEAM_MODELS = [
    ("rtdetr", "r18"),
    ("dfine", "n"),
    ("rtdetrv2", "r18"),
    ("deim", "n"),
    ("rtdetrv4", "s"),
    ("deimv2", "atto"),
    ("ec", "s"),
]

# (family, size, training options) for the CPU smoke test: two tiny epochs on the built-in shapes
# data through the shared trainer with the loss falling (tests/unit/test_trainer.py). The options
# are the row's own lr0 / optimizer on top of the test's shared settings.
TRAIN_MODELS = [
    ("yolo9", "t", {}),
    ("yolox", "n", {"lr0": 0.03}),
    ("yolo7", "tiny", {}),
    ("rtmdet", "t", {"optimizer": "AdamW", "lr0": 0.008}),
    ("picodet", "s", {}),
    ("yolo9_p2", "t", {}),
    ("yolo9_e2e", "t", {}),
    ("ppyoloe", "s", {}),
    ("yolo2", "t", {}),
    ("yolo3", "t", {}),
    ("yolo4", "t", {}),
]

# (family, size) of classifiers for the fast CPU classification tests (tests/unit/test_classify.py).
CLASSIFY_SMALL_MODELS = [
    ("resnet", "18"),
    ("efficientnetv2", "b0"),
    ("mobilenetv4", "s"),
    ("convnext", "t"),
]

# (family, size) of classifiers that must pass the GPU parity protocol (predict stage: crop,
# normalization, network, softmax and top-k) and the training-step parity tests.
CLASSIFY_GRAPH_MODELS = [
    ("resnet", "18"),
    ("efficientnetv2", "b0"),
    ("mobilenetv4", "s"),
    ("convnext", "t"),
]

# (family, size) of semantic-segmentation models that must pass the GPU parity protocol (predict
# stage with the argmax inside the graph; training step) before their SUPPORTS_CUDA_GRAPH* flags flip.
SEMANTIC_GRAPH_MODELS = [
    ("segformer", "b0"),
    ("pidnet", "s"),
    ("lingbotvision", "s"),
    ("eomt", "s"),   # EoMT's semantic head at its native 512 (IMGSZ_OF_FAMILY in tests/gpu/test_tasks_gpu.py)
]

# (family, size) of promptable-segmentation models that must pass the GPU parity protocol (network,
# image stage, prompt stage with the mask post-processing) before SUPPORTS_CUDA_GRAPH flips.
SEGMENT_PROMPT_GRAPH_MODELS = [
    ("mobilesam", "tiny"),
    ("sam2", "tiny"),
    ("edgetam", "edge"),
    ("sam", "base"),
    ("picosam3", "pico"),
    ("sam3", "large"),
]

# (family, size) of depth models that must pass the GPU parity protocol (predict stage: stretch to
# the square, network, and the map resized back to the image inside the uint8 stage's graph)
# before SUPPORTS_CUDA_GRAPH flips. No training rows: the family does not train.
DEPTH_GRAPH_MODELS = [
    ("depth_anything", "s"),
    ("depth_anything3", "l"),
]
# Not in DEPTH_GRAPH_MODELS: zipdepth, whose network takes multiples of 32 while these rows probe the
# raw network at 518 (IMGSZ in tests/gpu/test_tasks_gpu.py); its GPU command is in docs/families.md.

# (family, size) of point-detection models that must pass the GPU parity protocol (predict stage: the
# stretch, the network and the peaks' max-pool and top-k inside the graph) and the training-step rows
# (tests/gpu/test_tasks_gpu.py) before their SUPPORTS_CUDA_GRAPH* flags flip.
POINT_GRAPH_MODELS = [
    ("fomo", "s"),
]

# (family, size) of matting models that must pass the GPU parity protocol (with a predict seam: the
# captured encoder, and the seam's claim that replayed encoder + eager decoder == all eager).
MATTE_GRAPH_MODELS = [
    ("birefnet", "t"),
    ("feynobg", "l"),
]

# (family, size) of OCR models that must pass the GPU parity protocol (detection stage with the
# binarization inside the graph; the recognition stage with greedy CTC at every bucket width)
# before SUPPORTS_CUDA_GRAPH flips. OCR does not train.
OCR_GRAPH_MODELS = [
    ("ppocr", "t"),
]

# (family, size, task) task variants of detection families that must pass the GPU parity protocol and
# graph predict == eager (tests/gpu/test_tasks_gpu.py) before their SUPPORTS_CUDA_GRAPH flips.
VARIANT_GRAPH_MODELS = [
    ("rtmdet", "t", "segment"),
    ("ec", "s", "pose"),
    ("yolonas", "n", "pose"),
    ("rtdetrv2", "n", "obb"),
    ("dfine", "n", "segment"),
    ("yolonas", "s", "obb"),
    ("ec", "s", "segment"),
    ("eomt", "s", "segment"),   # EoMT's segment variant at its native 640
    ("eomt", "s", "panoptic"),   # EoMT's panoptic variant at its native 640 (the semantic head: SEMANTIC_GRAPH_MODELS)
]

# (family, size, task) variants whose whole training step is fixed-shape: their training rows in
# tests/gpu/test_tasks_gpu.py must pass before SUPPORTS_CUDA_GRAPH_TRAIN flips.
VARIANT_TRAIN_GRAPH_MODELS = [
    ("rtmdet", "t", "segment"),
    ("yolonas", "n", "pose"),
    ("yolonas", "s", "obb"),
]

# Families whose capture is built but not proven: their GPU rows still run (with the declaration set
# on the test's model instance only), and what fails today is marked xfail(strict=True), so the day
# it passes the suite says so and the family can declare SUPPORTS_CUDA_GRAPH. Family -> why.
GRAPH_PENDING: dict[str, str] = {}
# (family, size) of restoration models that must pass the GPU parity protocol (the network on imgsz
# tiles, the uint8 tile stage) and graph predict == eager (tiles blended) before SUPPORTS_CUDA_GRAPH
# flips; tests/gpu/test_tasks_gpu.py. No training rows: the training capture is not built for them.
RESTORE_GRAPH_MODELS = [
    ("nafnet", "s"),
    ("realesrgan", "x4t"),
    ("realesrgan", "x2"),
    ("swinir", "s"),
]
# Families whose training capture is built but not declared (SUPPORTS_CUDA_GRAPH_TRAIN False): the
# GPU training rows of tests/gpu/test_tasks_gpu.py run for them too, marked xfail(strict=False) -
# the report shows which rows pass (XPASS) and which do not. Family -> why it is not declared.
TRAIN_PENDING: dict[str, str] = {}
# Detection families whose half / fast path scripts/fast_contract.py has not measured on a GPU yet
# (predict refuses precision="fp16"/"bf16" for them as unmeasured); a family leaves this table once
# libreyolo/assets/fast_contract.json holds its figures. Family -> why.
FAST_PENDING: dict[str, str] = {}
FAST_PENDING["yolo3"] = "predict graphs proven on a GPU; its half / fast paths not measured yet (scripts/fast_contract.py)"
FAST_PENDING["yolo4"] = "predict graphs proven on a GPU; its half / fast paths not measured yet (scripts/fast_contract.py)"
FAST_PENDING["yolo2"] = "predict graphs proven on a GPU; its half / fast paths not measured yet (scripts/fast_contract.py)"
# (family, size) exported to ONNX and compared with eager predict through onnxruntime on the CPU
# (tests/unit/test_export_onnx.py): every family, in every run (each costs 5-25 s of export on
# two cores); scripts/onnx_parity.py prints the table of all.
ONNX_MODELS = [
    ("yolo9", "t"),
    ("yolox", "n"),
    ("yolo7", "tiny"),
    ("rtmdet", "t"),
    ("picodet", "s"),
    ("yolo9_e2e", "t"),
    ("ppyoloe", "s"),
    ("rtdetr", "r18"),
    ("rtdetrv2", "r18"),
    ("dfine", "n"),
    ("deim", "n"),
    ("rtdetrv4", "s"),
    ("deimv2", "atto"),
    ("ec", "s"),
    ("resnet", "18"),
    ("efficientnetv2", "b0"),
    ("mobilenetv4", "s"),
    ("convnext", "t"),
    ("segformer", "b0"),
    ("yolo2", "t"),
    ("yolo3", "t"),
    ("yolo4", "t"),
    ("pidnet", "s"),
    ("lingbotvision", "s"),
    ("fomo", "s"),
]
# Not in ONNX_MODELS: yolo9_p2. It exports (static and dynamic), but under the fill weights its
# stride-4 level holds many anchors of exactly equal score, and eager and onnxruntime break those
# ties in another order, so NMS keeps other (equal-score, shifted) boxes and the one-to-one match
# of this test cannot hold.
# Not in ONNX_MODELS, TRAIN_MODELS, SMALL_MODELS: nafnet, realesrgan, swinir (restore): their export is the
# network on one batch of tiles (no detection output), trained on paired images; their ONNX parity, two-epoch
# training and predict checks are in tests/unit/test_restore.py.
# Their load-back (LibreYOLO("x.onnx"): the task's tiling around the session) is in tests/unit/test_restore_onnx.py;
# CLIP's and SigLIP 2's two-tower export and its load-back in tests/unit/test_embed.py / test_embed_onnx.py.
# Not in ONNX_MODELS, TRAIN_MODELS, SMALL_MODELS: yolo1, whose input is fixed at 448 (these rows run
# at 64-160 px); its ONNX parity, trainer run and predict checks are in tests/unit/test_yolo1.py.
# Families whose traced graph fixes a size-dependent shape (their decoder's anchor grid), so the
# exporter refuses dynamic=True for them; the others are also exported dynamic and compared at
# another size.
ONNX_STATIC_ONLY = {"rtdetr", "rtdetrv2"}
