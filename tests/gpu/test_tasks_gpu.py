"""CUDA graphs for the tasks beyond detection (classification, semantic segmentation, promptable
segmentation, depth, matting, OCR, and the task variants of detection families: instance
segmentation, pose, oriented boxes), on a GPU.

Parametrized over rows.CLASSIFY_GRAPH_MODELS, SEMANTIC_GRAPH_MODELS, SEGMENT_PROMPT_GRAPH_MODELS,
DEPTH_GRAPH_MODELS, MATTE_GRAPH_MODELS, OCR_GRAPH_MODELS, POINT_GRAPH_MODELS and VARIANT_GRAPH_MODELS
((family, size, task) rows; their training rows: VARIANT_TRAIN_GRAPH_MODELS): the parity protocol
on the predict stages, predict with graphs equal to eager, and training capture (step-0 loss and
BatchNorm buffers bitwise, the whole step with the update, a 20-step curve within eager's noise,
the trainer replaying the captured step). A family may declare SUPPORTS_CUDA_GRAPH* only after
these pass. Run through scripts/gpu-check.
"""
import numpy as np
import pytest
import rows
import torch
from PIL import Image
from whole_step import Whole, step0_eager_and_whole, whole_step

from libreyolo import SAMPLE_IMAGE, LibreYOLO
from libreyolo.engine.verify import input_sensitive, verify_model
from libreyolo.graphs.capture import CudaGraphCapturer
from libreyolo.graphs.training import TrainStepRunner, backward_into_grads
from libreyolo.models.registry import get_family

pytestmark = pytest.mark.cuda

GROUPS = [getattr(rows, name, []) for name in ("CLASSIFY_GRAPH_MODELS", "SEMANTIC_GRAPH_MODELS",
                                               "SEGMENT_PROMPT_GRAPH_MODELS", "DEPTH_GRAPH_MODELS",
                                               "MATTE_GRAPH_MODELS", "OCR_GRAPH_MODELS",
                                               "VARIANT_GRAPH_MODELS")]
GROUPS.append(getattr(rows, "RESTORE_GRAPH_MODELS", []))   # restore: the tile stage, blended pictures
GROUPS.append(getattr(rows, "POINT_GRAPH_MODELS", []))   # point detection (FOMO)
MODELS = [spec for group in GROUPS for spec in group]


def family_class(spec):
    """The model class of a (family, size) or (family, size, task) row."""
    cls = get_family(spec[0])
    return cls.for_task(spec[2]) if len(spec) > 2 else cls


# training capture rows: the models whose family declares it (a family enrols by declaring), those
# of rows.TRAIN_PENDING (run, their failures expected: see trains()), and the task variants' rows
# that must pass before their flag is declared
VARIANT_TRAIN = [spec for spec in getattr(rows, "VARIANT_TRAIN_GRAPH_MODELS", [])]
TRAIN = [spec for spec in MODELS if family_class(spec).SUPPORTS_CUDA_GRAPH_TRAIN or spec[0] in rows.TRAIN_PENDING
         or spec in VARIANT_TRAIN]
TRAIN += [spec for spec in VARIANT_TRAIN if spec not in TRAIN]   # training rows before the predict rows' enrolment
FIRSTS = [next(s for s in group if s in TRAIN) for group in GROUPS if any(s in TRAIN for s in group)]
FIRSTS += [s for s in VARIANT_TRAIN if s not in FIRSTS]   # each variant trains on its own task's data
DATA = {"classify": "shapes-cls", "semantic": "shapes-seg", "segment": "shapes-inst", "pose": "shapes-pose",
        "obb": "shapes-obb"}
IMGSZ = {"classify": 224, "semantic": 256, "segment-prompt": 1024, "depth": 518, "matte": 256, "ocr": 320,
         "segment": 640, "pose": 640, "obb": 640}
FIELD = {"classify": "probs", "semantic": "masks", "segment-prompt": "masks", "depth": "depth", "matte": "alpha",
         "ocr": "texts", "segment": "masks", "pose": "keypoints", "obb": "obb"}
DATA_OF: dict = {}   # task -> its built-in training data, once resolved (task_batches)
OPTS = {"segment-prompt": {"points": "center"}}   # predict options a task needs (a prompt)
IMGSZ["restore"], FIELD["restore"] = 64, "image"   # restore: 64 px tiles, Results.image
DATA["point"], IMGSZ["point"], FIELD["point"] = "shapes-point", 96, "points"
OPTS_OF_FAMILY = {"picosam3": {"boxes": [[40, 60, 300, 400]]}}   # box prompts only (inside every test image)
IMGSZ_OF_FAMILY = {"sam3": 1008}   # a network whose fixed frame is not its task's size (SAM 3: 72 patches of 14)
# panoptic (EoMT): the built-in set, Results.panoptic (the segment-id map), COCO's 640
DATA["panoptic"], IMGSZ["panoptic"], FIELD["panoptic"] = "shapes-panoptic", 640, "panoptic"
OPTS["panoptic"] = {"threshold": 0.0}   # every query a candidate: the merge runs on segments, not on none
# what a row's model needs before capture, as a trained checkpoint has it. EoMT: the masked-attention
# annealing finished (probabilities 0: no masking in eval); an untrained model holds 1, and verify's
# re-draw would make them random, so the masks would be drawn anew at every forward
PREPARE_OF_FAMILY = {"eomt": lambda m: m.model.set_mask_probs([0.0] * m.model.cfg.blocks)}
# a (family, task) key: one family whose heads have different fixed sizes (EoMT's position embeddings:
# ADE20K's semantic checkpoints 512; its segment and panoptic heads take the tasks' 640)
IMGSZ_OF_FAMILY[("eomt", "semantic")] = 512


def imgsz_of(model) -> int:
    """The size a row runs at: its (family, task) override, its family's, else its task's."""
    return IMGSZ_OF_FAMILY.get((model.FAMILY, model.TASK), IMGSZ_OF_FAMILY.get(model.FAMILY, IMGSZ[model.TASK]))


def ids(spec):
    return "-".join(spec)


def build(spec, nc=None, seed=0):
    kw = {} if nc is None else {"nc": nc}
    if len(spec) > 2:
        kw["task"] = spec[2]
    model = LibreYOLO.new(spec[0], spec[1], device="cuda", seed=seed, **kw)
    if model.task in DATA_OF:   # fitted to the training data as the trainer does (pose: its keypoints)
        model.task_def.prepare_model(model, DATA_OF[model.task])
    # the task's training-only settings at their defaults, as the trainer sets them (pose: the
    # keypoint branch's gradient scale)
    model.task_def.prepare_training(model, model.model, model.task_def.Options())
    if spec[0] in PREPARE_OF_FAMILY:
        PREPARE_OF_FAMILY[spec[0]](model)
    if spec[0] in rows.GRAPH_PENDING:   # built for capture, not declared: exercise it here only
        model.SUPPORTS_CUDA_GRAPH = True
        model.runner.supported = True
    return model


def pending(specs, table=rows.GRAPH_PENDING, strict=True):
    """``specs`` with the rows of ``table``'s families (rows.GRAPH_PENDING: predict capture not
    declared, strict; rows.TRAIN_PENDING: training capture, not strict) marked xfail."""
    return [pytest.param(s, marks=pytest.mark.xfail(strict=strict, reason=table[s[0]]))
            if s[0] in table else s for s in specs]


def trains(specs):
    return pending(specs, rows.TRAIN_PENDING, strict=False)


@pytest.fixture(scope="module")
def images():
    pil = Image.open(SAMPLE_IMAGE).convert("RGB")
    return [np.asarray(pil), np.asarray(pil.resize((333, 517))), np.asarray(pil.rotate(180))]


@pytest.mark.parametrize("spec", pending(MODELS), ids=ids)
def test_parity_protocol_fp32_and_amp_batch_1_and_8(spec):
    model = build(spec)
    results = verify_model(model, imgsz=imgsz_of(model), batches=(1, 8),
                           amp_dtypes=(None, model.AMP_DTYPE))
    # a seam adds its claim per setting; a task's further stages add theirs (OCR: recognition per bucket)
    assert len(results) >= (16 if model.PREDICT_SEAM else 12)
    failed = [r.as_dict() for r in results if not r.passed]
    assert not failed, failed


@pytest.mark.parametrize("spec", MODELS, ids=ids)
def test_predict_with_graph_equals_eager(spec, images):
    model = input_sensitive(build(spec))
    field = FIELD[model.TASK]
    size = imgsz_of(model)
    # an aspect-keeping resize ("cover", "limit") gives each image size its own input: such a
    # family batches only images of one size (a mixed batch is refused, tested on the CPU)
    mixed = 1 if model.preprocess.resize in ("cover", "limit") else 3
    for batch, imgs in ((1, images[:1]), (1, images[1:2]), (2, images[:1] * 2), (mixed, images)):
        opts = OPTS_OF_FAMILY.get(model.FAMILY, OPTS.get(model.TASK, {}))
        eager = model(imgs, batch=batch, imgsz=size, **opts)
        for _ in range(3):  # first use, uint8-stage capture, replay
            got = model(imgs, batch=batch, imgsz=size, cuda_graph=True, **opts)
            assert all(torch.equal(torch.as_tensor(getattr(a, field).data), torch.as_tensor(getattr(b, field).data))
                       for a, b in zip(got, eager))
    assert model.graph_info()["replays"] > 0


#: instance segmentation and pose: on CUDA with Triton their NMS and selection run in the stage
IN_STAGE = [spec for spec in MODELS if family_class(spec).TASK in ("segment", "pose")]


@pytest.mark.parametrize("spec", IN_STAGE, ids=ids)
def test_segment_and_pose_select_in_the_stage(spec, images):
    """On CUDA with Triton the segment and pose plans run NMS, the selection and the mapping back
    inside the stage (``post``), so test_predict_with_graph_equals_eager's rows of these tasks
    prove that path (masks / keypoints). Here: the path is on; graph predict equals eager on the
    boxes, scores and classes too (a batch of three sizes); and the host path (a class filter
    naming every class keeps it) selects the same instances - its boxes within float32 rounding:
    on CUDA a division by a Python scalar multiplies by its reciprocal, where the stage divides by
    a tensor."""
    model = input_sensitive(build(spec))
    size = imgsz_of(model)
    plan = model.get_predictor().plan(size, conf=0.05)
    assert plan.post is not None and "post" in plan.tag, plan.tag
    eager = model(images, batch=3, imgsz=size, conf=0.05)
    assert sum(len(r.boxes.data) for r in eager) > 0
    for _ in range(3):  # first use, capture, replay
        got = model(images, batch=3, imgsz=size, conf=0.05, cuda_graph=True)
        assert all(torch.equal(a.boxes.data, b.boxes.data) for a, b in zip(got, eager))
    assert model.graph_info()["replays"] > 0
    host = model(images, batch=3, imgsz=size, conf=0.05, classes=list(range(model.nc)))
    assert model.get_predictor().plan(size, classes=list(range(model.nc))).post is None
    for a, b in zip(host, eager):
        assert a.boxes.data.shape == b.boxes.data.shape
        assert torch.equal(a.boxes.data[:, 4:], b.boxes.data[:, 4:])   # scores and classes
        torch.testing.assert_close(a.boxes.data[:, :4], b.boxes.data[:, :4], rtol=1e-5, atol=1e-3)


DEPTH = [spec for spec in MODELS if family_class(spec).TASK == "depth"]


@pytest.mark.parametrize("spec", DEPTH, ids=ids)
def test_depth_uint8_stage_is_one_graph_with_the_resize_back(spec, images):
    """Stretch to 518 -> network -> map resized back to the image: one captured graph. The uint8
    stage's replayed output is already at the image's size and equals eager bitwise, as does
    the predict result that a repeated image size replays."""
    model = input_sensitive(build(spec))
    size = IMGSZ["depth"]
    img = images[1]                                   # 517 x 333: not the square, not a multiple of 14
    eager = model(img, imgsz=size).depth.data
    for _ in range(3):
        got = model(img, imgsz=size, cuda_graph=True).depth.data
    assert got.shape == img.shape[:2] and torch.equal(got, eager)
    assert any("'u8'" in g["stage"] for g in model.graph_info()["graphs"]), model.graph_info()["graphs"]
    pred = model.get_predictor()
    plan = pred.plan(size)
    from_u8 = pred._stage_fns(size, plan)[1]
    u8 = torch.from_numpy(np.ascontiguousarray(img)).cuda()[None]
    with torch.no_grad():
        ref = from_u8(u8)
        for _ in range(2):   # capture, replay
            out = model.runner(("u8-probe", size, *plan.tag), from_u8, (u8,), True)
    torch.cuda.synchronize()
    assert out.shape == (1, *img.shape[:2]) and torch.equal(out, ref)
    from libreyolo.tasks.depth.task import download  # the maps' way to the host, through pinned memory
    t = torch.rand(720, 1280, device="cuda")
    host = download(t)
    assert host.device.type == "cpu" and not host.is_pinned() and torch.equal(host, t.cpu())


# ------------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def task_batches():
    cache = {}

    def get(model):
        task = model.task_def
        if task.name not in cache:
            data = task.resolve_data(DATA[task.name])
            DATA_OF[task.name] = data
            task.prepare_model(model, data)
            _, val, collate = task.datasets(data, 128, model, task.Options())
            cache[task.name] = (data.nc, [collate([val[j] for j in range(i, i + 8)]) for i in (0, 8)])
        return cache[task.name]
    return get


LAYOUTS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


def make(spec, nc, amp=False, seed=0, layout="nchw"):
    torch.manual_seed(seed)
    m = build(spec, nc=nc, seed=seed)
    net = m.model.train().to(memory_format=LAYOUTS[layout])
    loss_fn = m.build_loss().cuda()
    prep = m.preprocess
    params = [p for p in net.parameters() if p.requires_grad]

    def step(x, *t):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            loss, items = loss_fn(m.train_forward(net, prep.normalize(x), *t), *t)
        backward_into_grads(loss, params)   # as the trainer
        return loss.detach(), items.detach()

    return m, net, step


def to_dev(b):
    imgs, *t = b
    return (imgs.cuda().float().div_(255), *[v.cuda() for v in t])


def whole(spec, nc, amp=False, optim="adamw", seed=0, layout="nchw") -> Whole:
    _, net, step = make(spec, nc, amp, seed, layout)
    return whole_step(net, step, optim)


def _nc(spec, task_batches):
    return task_batches(build(spec))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resize_bilinear_backward_is_the_same_bits_every_run_and_in_a_graph(dtype, record_property):
    """SegFormer's upsampling (ops.interpolate): F.interpolate's forward bits; a backward that is
    the same bits on every eager run and replayed on another input (torch's own backward sums with
    atomics), and within one rounding of a float64 reference (torch's bf16 backward accumulates in
    bf16, so the reference is float64, not torch's kernel)."""
    from libreyolo.ops.interpolate import resize_bilinear
    torch.manual_seed(0)
    x = torch.randn(8, 256, 16, 16, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn(8, 256, 128, 128, device="cuda", dtype=dtype)

    def grad():   # as a training step takes it: backward from a scalar loss into a leaf's .grad
        x.grad = None
        out = resize_bilinear(x, (128, 128))
        (out * g).sum().backward()   # the upsampling's output gradient is g, exactly
        # detached: an output kept with its graph keeps x's gradient accumulator, made on the stream
        # of that eager run, and a capture's backward would then wait on that (uncapturable) stream
        return out.detach(), x.grad

    runs = [grad() for _ in range(3)]
    ref = torch.nn.functional.interpolate(x.detach(), size=(128, 128), mode="bilinear", align_corners=False)
    assert all(torch.equal(out, ref) for out, _ in runs), "the forward is not F.interpolate's bits"
    spread = max((runs[0][1].float() - h.float()).abs().max().item() for _, h in runs[1:])
    assert spread == 0, f"eager backward not reproducible: {spread}"
    x64 = x.detach().double().requires_grad_(True)
    out64 = torch.nn.functional.interpolate(x64, size=(128, 128), mode="bilinear", align_corners=False)
    ref_grad = torch.autograd.grad(out64, x64, g.double())[0]
    off = lambda h: ((h.double() - ref_grad).abs() / (ref_grad.abs() + 1)).max().item()  # noqa: E731
    err = off(runs[0][1])
    xt = x.detach().clone().requires_grad_(True)
    torch.nn.functional.interpolate(xt, size=(128, 128), mode="bilinear", align_corners=False).backward(g)
    record_property("err", err)
    record_property("torch_err", off(xt.grad))   # torch's own backward, for docs/families.md
    # float32 products rounded once to the dtype: one bf16 rounding is at most 2**-8 (0.0039) of the value
    assert err <= (1e-5 if dtype == torch.float32 else 4e-3), f"backward off the float64 reference: {err}"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grad()   # warm-up: the weight matrices are built and kept outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, static = grad()
    g.copy_(torch.rand_like(g) * 3)   # another distribution: a stale graph would not follow
    graph.replay()
    torch.cuda.synchronize()
    eager = grad()[1]
    gap = (static.float() - eager.float()).abs().max().item()
    assert gap == 0 and torch.equal(static, eager), f"replay differs from eager: {gap}"


@pytest.mark.parametrize("spec", trains(TRAIN), ids=ids)
@pytest.mark.parametrize("amp", [False, True])
def test_step0_loss_and_bn_buffers_bitwise_equal(spec, amp, task_batches):
    nc, batches = _nc(spec, task_batches)
    inputs = to_dev(batches[0])
    _, net_e, step_e = make(spec, nc, amp)
    loss_e, _ = step_e(*inputs)
    _, net_g, step_g = make(spec, nc, amp)
    graph = CudaGraphCapturer().capture(step_g, inputs, module=net_g)
    for p in net_g.parameters():
        p.grad = None if p.grad is None else p.grad.zero_()
    loss_g, _ = graph.replay(inputs)
    torch.cuda.synchronize()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("spec", trains(TRAIN), ids=ids)
@pytest.mark.parametrize("optim", ["adamw", "sgd"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])   # nhwc: channels_last, the trainer's CUDA default for CHANNELS_LAST families
def test_whole_step_step0_bitwise_equal(spec, optim, layout, task_batches, record_property):
    nc, batches = _nc(spec, task_batches)
    if layout == "nhwc" and not family_class(spec).CHANNELS_LAST:
        pytest.skip(f"{spec[0]} does not train in channels_last")
    inputs = to_dev(batches[0])
    inputs = (inputs[0].contiguous(memory_format=LAYOUTS[layout]), *inputs[1:])
    # cuDNN's deterministic kernels: its weight gradients otherwise sum with atomics, and AdamW's
    # first step (g / (sqrt(g^2) + eps)) turns that noise near g = 0 into updates of up to lr, so
    # the update could only be compared within a noise estimated from a few runs
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                    allow_tf32=torch.backends.cudnn.allow_tf32):
        e, loss_e, g, loss_g, runner = step0_eager_and_whole(lambda: whole(spec, nc, optim=optim, layout=layout),
                                                             inputs)
        net_e, net_g = e.net, g.net
        others = [net_e]   # two more eager steps: with the first, their spread is eager's own noise
        for _ in range(2):
            e2 = whole(spec, nc, optim=optim, layout=layout)
            e2.step(*inputs)
            e2.update()
            others.append(e2.net)
    assert runner.info()["captures"] == 1 and runner.info()["replays"] == 1, runner.info()
    assert torch.equal(loss_e, loss_g)
    for a, b in zip(net_e.buffers(), net_g.buffers()):
        assert torch.equal(a, b)
    gap = lambda n1, n2: max((a - b).abs().max().item() for a, b in zip(n1.parameters(), n2.parameters()))  # noqa: E731
    moved = max(gap(net_g, n) for n in others)
    noise = max(gap(n1, n2) for i, n1 in enumerate(others) for n2 in others[i + 1:])
    record_property("moved", moved)
    record_property("noise", noise)
    if noise == 0:   # eager is reproducible: the update inside the graph must be the same bits
        assert moved == 0, moved
    else:            # an op outside cuDNN (an upsample's backward) still sums with atomics
        assert moved <= max(2 * noise, 1e-5), (moved, noise)   # within eager's spread (see test_training_gpu)


@pytest.mark.parametrize("amp", [False, True])
def test_yolonas_pose_keypoint_gradient_scale_captures_bitwise(amp, task_batches, monkeypatch):
    """YOLO-NAS-Pose trained with its keypoint branch's gradient scaled (``kpt_grad``; the
    family's default 1 adds nothing): the step-0 loss and BatchNorm buffers, and the whole step
    with its update, replay eager's bits."""
    from libreyolo.models.yolonas.pose import YoloNASPose
    monkeypatch.setattr(YoloNASPose, "KPT_GRAD", 0.25)
    spec = ("yolonas", "n", "pose")
    assert {m.kpt_grad for m in build(spec).model.modules() if hasattr(m, "kpt_grad")} == {0.25}
    test_step0_loss_and_bn_buffers_bitwise_equal(spec, amp, task_batches)
    test_whole_step_step0_bitwise_equal(spec, "adamw", "nchw", task_batches, lambda *a: None)


@pytest.mark.parametrize("spec", trains(FIRSTS), ids=ids)
def test_20_step_whole_step_curve_within_eager_noise(spec, task_batches, record_property):
    nc, batches = _nc(spec, task_batches)

    def curve(graph):
        w = whole(spec, nc)
        runner = TrainStepRunner(w.net, w.step, enabled=graph, family="test", supported=True, update=w.update,
                                 state=w.state)
        out = [float(runner(*to_dev(batches[i % 2]), whole=True)[0]) for i in range(20)]
        return out, runner.info()

    # cuDNN's deterministic kernels, as in the step-0 test: with them every family's eager curve
    # here is reproducible, so the captured curve must be the same numbers, not only near them
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True,
                                    allow_tf32=torch.backends.cudnn.allow_tf32):
        eager = [curve(False)[0] for _ in range(4)]
        g, info = curve(True)
    assert info["captures"] >= 1 and info["replays"] >= 10, info
    gap = lambda a, b: max(abs(x - y) for x, y in zip(a, b))  # noqa: E731
    noise = max(gap(a, b) for i, a in enumerate(eager) for b in eager[i + 1:])
    diff = max(gap(g, e) for e in eager)
    record_property("noise", noise)
    record_property("diff", diff)
    if noise == 0:
        assert diff == 0, (g, eager[0])
    else:   # an op with no deterministic kernel left in the family's backward
        assert diff <= max(noise * 2, 1e-5 * max(abs(v) for v in eager[0])), (noise, diff)


@pytest.mark.parametrize("spec", trains(FIRSTS), ids=ids)
def test_trainer_replays_the_whole_step(spec, tmp_path):
    model = build(spec)
    model.SUPPORTS_CUDA_GRAPH_TRAIN = True
    res = model.train(data=DATA[model.TASK], epochs=2, batch=8, nbs=16, imgsz=128, workers=2, project=str(tmp_path),
                      cuda_graph=True, amp="bf16", warmup_epochs=0, verbose=False)
    g = res["cuda_graph"]
    # one graph per padded-target signature seen twice: how many depends on the set's instance counts
    assert g["replays"] > 0 and g["graphs"] >= 1 and g["captures"] == g["graphs"], g
    assert g["disabled_reason"] is None, g
    assert all(v == v for row in res["losses"] for v in row)
