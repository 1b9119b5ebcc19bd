"""``libreyolo verify``: the parity protocol for one model on this machine's GPU."""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from ..graphs.capture import CudaGraphCapturer
from ..graphs.parity import ParityResult, all_equal, check_parity, clone_outputs, max_abs_diff


def _probes_float(batch: int, size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    a = torch.randn((batch, 3, size, size), generator=g)
    b = 3 * torch.rand((batch, 3, size, size), generator=g) + 2
    return a.to(device), b.to(device)


def _probes_u8(batch: int, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4321)
    a = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8)
    b = torch.randint(90, 140, (batch, h, w, 3), generator=g, dtype=torch.uint8)
    return a.to(device), b.to(device)


def input_sensitive(model, seed: int = 0):
    """The model itself if trained; for an untrained one, a re-drawn copy (seeded).

    A freshly initialised detector is nearly constant (class bias -10, flat box logits,
    activations that saturate under fp16), so two different probes can give identical
    outputs and the protocol would prove nothing. The copy gets well-scaled weights:
    N(0, 1/fan_in) for kernels, BatchNorm scale 1 + N(0, 0.01), statistics mean N(0, 0.01)
    and variance U(0.5, 1.5), small biases - every output then depends on the input.

    A family whose blocks add several such branches (``REDRAW_CALIBRATE``: PP-OCR's
    re-parameterizable convolutions) grows its activations block after block until they
    overflow float16 - its AMP probes then compare NaN with NaN, which never equal. For those
    the copy's convolutions and linear layers are then rescaled on a calibration pass
    (:func:`unit_activations`), as layer-sequential unit-variance initialization does.
    """
    if model.trained:
        return model
    twin = copy.copy(model)
    twin._attach(copy.deepcopy(model.model))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in twin.model.state_dict().items():
            if not t.is_floating_point():
                continue
            shape = tuple(t.shape)
            if name.endswith("running_var"):
                v = 0.5 + torch.rand(shape, generator=g)
            elif name.endswith("running_mean"):
                v = 0.1 * torch.randn(shape, generator=g)
            elif len(shape) >= 2:
                v = torch.randn(shape, generator=g) / max(1, t[0].numel()) ** 0.5
            elif name.endswith(("weight", "scale")):  # norm weights, learnable affine scales
                v = 1 + 0.1 * torch.randn(shape, generator=g)
            else:
                v = 0.1 * torch.randn(shape, generator=g)
            t.copy_(v.to(t))
    if model.REDRAW_CALIBRATE:
        with unit_activations(twin.model):
            twin.calibration_pass(torch.Generator().manual_seed(seed + 1))
    return twin


@contextlib.contextmanager
def unit_activations(net: torch.nn.Module):
    """While active, every forward of a Conv2d / Linear of ``net`` (in eval mode, no grad)
    divides its weight and bias by the standard deviation of its output, and the output with
    them: after one pass each layer's output has unit spread on the calibration input."""
    def hook(mod, args, out):
        std = out.float().std()
        if torch.isfinite(std) and std > 0:
            mod.weight.div_(std)
            if mod.bias is not None:
                mod.bias.div_(std)
            return out / std
        return out
    handles = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    was = net.training
    try:
        with torch.no_grad():
            net.eval()
            yield
    finally:
        net.train(was)
        for h in handles:
            h.remove()


def check_seam(name: str, whole: Callable[..., Any], front: Callable[..., Any], back: Callable[..., Any],
               probe_a: tuple[torch.Tensor, ...], probe_b: tuple[torch.Tensor, ...],
               module: torch.nn.Module | None = None) -> ParityResult:
    """A seam's claim, on two probes: ``back`` run eager on the replayed outputs of a graph of
    ``front`` equals ``whole`` (the same computation with no seam) run all eager, bit for bit, on
    each probe; the probes give different outputs and the replay of B is not A's result. Never
    raises for a failed check."""
    try:
        eager_a = clone_outputs(whole(*probe_a))
        eager_b = clone_outputs(whole(*probe_b))
        graph = CudaGraphCapturer().capture(front, probe_a, module=module)
        got_a = clone_outputs(back(*graph.replay(probe_a, clone=True)))
        got_b = clone_outputs(back(*graph.replay(probe_b, clone=True)))
        torch.cuda.synchronize()
    except Exception as exc:  # reported, not raised
        return ParityResult(name, 0, False, False, False, False, float("nan"), 0.0,
                            error=f"{type(exc).__name__}: {exc}")
    return ParityResult(name=name, outputs=len(eager_a), probes_differ=not all_equal(eager_a, eager_b),
                        replay_a_equal=all_equal(got_a, eager_a), replay_b_equal=all_equal(got_b, eager_b),
                        not_stale=not all_equal(got_b, eager_a),
                        max_abs_diff=max(max_abs_diff(got_a, eager_a), max_abs_diff(got_b, eager_b)),
                        capture_ms=graph.capture_ms)


def verify_model(model, *, imgsz: int | None = None, batches: tuple[int, ...] = (1, 8),
                 amp_dtypes: tuple[Any, ...] | None = None,
                 source_hw: tuple[int, int] = (480, 640), precisions: tuple[str, ...] = (),
                 fast: bool | str = False) -> list[ParityResult]:
    """Parity of the raw network forward and of the full predict stage (uint8 in). For a family
    with a predict seam (``PREDICT_SEAM``) both end at the seam - what predict captures is the
    front part (``infer_front``) - and one more case per setting checks the seam's claim
    (:func:`check_seam` on the predict stage).

    ``precisions`` ("fp16", "bf16"): also the half path (``fast``: compiled), each graph against
    the same half path run eagerly - the fast path's own bitwise contract (its tolerance against
    fp32 is ``scripts/fast_contract.py``'s)."""
    if model.device.type != "cuda":
        raise RuntimeError("verify needs the model on a CUDA device (this runs the CUDA-graph parity protocol)")
    size = int(imgsz or model.imgsz)
    if amp_dtypes is None:
        amp_dtypes = (None, model.AMP_DTYPE)
    model = input_sensitive(model)
    net = model.model.eval()
    seam = bool(model.PREDICT_SEAM)
    front = model.infer_front if seam else net          # the captured network part
    infer = model.infer_front if seam else model.infer
    part = "encoder (seam)" if seam else "network"
    pred = model.get_predictor()
    own = getattr(pred, "plan", None) is None   # a task predictor with its own stages: task.verify_cases
    if not own:
        plan = verify_plan(model, pred, size)
        from_u8 = pred._stage_fns(size, plan)[1]
    prep = model.preprocess
    out: list[ParityResult] = []
    for amp in amp_dtypes:
        tag = "fp32" if amp is None else f"amp-{str(amp).replace('torch.', '')}"
        ctx = (lambda: torch.autocast("cuda", dtype=amp)) if amp is not None else contextlib.nullcontext
        for b in batches:
            if own:   # e.g. segment-prompt: network, image stage, prompt stage
                with torch.no_grad(), ctx():
                    for name, fn, a, bb in model.task_def.verify_cases(model, size, b, tuple(source_hw)):
                        out.append(check_parity(f"{model.FAMILY}-{model.size} {name} {tag} b{b} {size}", fn, a, bb,
                                                module=net))
                continue
            with torch.no_grad(), ctx():
                pa, pb = _probes_float(b, size, model.device)
                out.append(check_parity(f"{model.FAMILY}-{model.size} {part} {tag} b{b} {size}",
                                        lambda x: front(x), (pa,), (pb,), module=net))
                ua, ub = _probes_u8(b, *source_hw, model.device)
                stage = f"{model.FAMILY}-{model.size} predict-stage {tag} b{b} {source_hw[0]}x{source_hw[1]}->{size}"
                out.append(check_parity(stage, lambda u: infer(prep(u, size)), (ua,), (ub,), module=net))
                # the stage predict really captures: + the task's post-processing (detection: top-k,
                # and with Triton NMS and the selection)
                extra = plan.extra((tuple(source_hw),) * b, size)
                out.append(check_parity(stage + " +post", from_u8, (ua, *extra), (ub, *extra), module=net))
                if seam:   # the claim of the seam: captured front + eager rest == all eager
                    out.append(check_seam(stage + " seam: replayed front + eager rest == all eager",
                                          lambda u: plan.finish(model.infer(prep(u, size)), *extra),
                                          lambda u: from_u8(u, *extra),
                                          lambda *f: pred.after_seam(f, plan, extra), (ua,), (ub,), module=net))
                # further stages the task runs after the first (OCR: recognition per bucket width)
                for name, fn, pa_, pb_ in plan.parity_stages(b, model.device):
                    out.append(check_parity(f"{model.FAMILY}-{model.size} {name} {tag} b{b}", fn, pa_, pb_, module=net))
        family_stages = None if own else getattr(model, "verify_cases", None)
        if family_stages is not None:   # a family's stages besides predict's (CLIP, SigLIP 2: the text tower per length)
            with torch.no_grad(), ctx():
                for name, fn, pa_, pb_ in family_stages(size, max(batches), tuple(source_hw)):
                    out.append(check_parity(f"{model.FAMILY}-{model.size} {name} {tag}", fn, pa_, pb_, module=net))
    if not own:
        out.extend(verify_half(model, size, batches, source_hw, precisions, fast))
    return out


#: the confidence threshold of the "+post" cases: the task's default predict options otherwise. A
#: threshold is an input of the captured stage (one graph serves every value), so a low one changes
#: nothing captured; it keeps candidates in the outputs of an untrained network, whose scores all
#: stay under predict's 0.25 for some families (YOLOv1, YOLOv2): two probes with no detection each
#: give equal outputs, and the stale-graph check could not tell a replay that read the wrong input
VERIFY_CONF = 0.001


def verify_plan(model, pred, size: int):
    """The predict plan the parity cases capture: the task's default options, ``conf`` at
    :data:`VERIFY_CONF` where the task takes one."""
    opts = {"conf": VERIFY_CONF} if "conf" in getattr(model.task_def, "predict_defaults", {}) else {}
    return pred.plan(size, **opts)


def verify_half(model, size: int, batches: tuple[int, ...], source_hw: tuple[int, int],
                precisions: tuple[str, ...], fast: bool | str) -> list[ParityResult]:
    """The parity protocol on the half / fast path: its network stage (half NHWC input) and its
    whole predict stage (uint8 in, post-processing included), graph replay vs the same path eager."""
    from .fastpath import arm_name, half_network, parse_precision
    pred = model.get_predictor()
    plan = verify_plan(model, pred, size)
    out: list[ParityResult] = []
    for p in precisions:
        p = parse_precision(p)
        if p == "fp32":
            continue
        half = half_network(model, p, fast)
        from_u8 = pred._stage_fns(size, plan, half)[1]
        tag = arm_name(p, fast)
        for b in batches:
            with torch.no_grad():
                pa, pb = (t.to(half.dtype, memory_format=torch.channels_last) for t in _probes_float(b, size, model.device))
                out.append(check_parity(f"{model.FAMILY}-{model.size} network {tag} b{b} {size}",
                                        lambda x: half(x), (pa,), (pb,), module=half.net))
                ua, ub = _probes_u8(b, *source_hw, model.device)
                extra = plan.extra((tuple(source_hw),) * b, size)
                out.append(check_parity(f"{model.FAMILY}-{model.size} predict-stage {tag} b{b} "
                                        f"{source_hw[0]}x{source_hw[1]}->{size} +post", from_u8,
                                        (ua, *extra), (ub, *extra), module=half.net))
    return out
