"""A network's size at a glance: layers, parameters, gradients, GFLOPs, task and graph support.

:func:`model_summary` measures a plain ``nn.Module`` and returns a dict; :func:`format_summary`
turns it into one line. ``Model.info()`` is meant to be built on these two.

GFLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` over one forward at batch 1 of
a ``1 x 3 x imgsz x imgsz`` input, and are ``flops / 1e9`` where a multiply-add counts as 2 flops
(the convention most detector papers use for "GFLOPs"). The counter covers the heavy operators
(convolutions, matrix products, attention); element-wise work (normalisation, activations,
additions) and operators without a registered formula count 0, so the figure is a lower bound
that is slightly below counts that include them.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["model_summary", "format_summary", "count_flops"]


def model_summary(net: nn.Module, imgsz: int, task: str, family: str, size: str,
                  cuda_graph: bool) -> dict[str, Any]:
    """Describe ``net`` (a family's network) at input size ``imgsz``.

    Keys: ``family``, ``size``, ``task``, ``imgsz``, ``layers`` (leaf modules), ``parameters``
    (all parameter elements), ``gradients`` (elements of parameters with ``requires_grad``),
    ``flops`` and ``gflops`` (``flops / 1e9``; see the module docstring), ``flops_counted_on`` (``"meta"`` when counted without
    computing, else the device the forward ran on) and ``cuda_graph`` (the family's graph
    support, passed in). ``net`` is left as it was (weights, train/eval mode, device).
    """
    imgsz = int(imgsz)
    if imgsz <= 0:
        raise ValueError(f"imgsz must be a positive number of pixels, got {imgsz}")
    params = list(net.parameters())
    flops, counted_on = count_flops(net, imgsz)
    return {
        "family": family,
        "size": size,
        "task": task,
        "imgsz": imgsz,
        "layers": sum(1 for m in net.modules() if next(m.children(), None) is None),
        "parameters": sum(p.numel() for p in params),
        "gradients": sum(p.numel() for p in params if p.requires_grad),
        "flops": flops,
        "gflops": flops / 1e9,
        "flops_counted_on": counted_on,
        "cuda_graph": bool(cuda_graph),
    }


def format_summary(d: dict[str, Any]) -> str:
    """One line from a :func:`model_summary` dict, e.g.
    ``yolox-n summary: 250 layers, 912,159 parameters, 912,159 gradients, 2.5 GFLOPs at 640x640,
    task detect, CUDA graphs: supported``."""
    graphs = "supported" if d["cuda_graph"] else "not supported"
    return (f"{d['family']}-{d['size']} summary: {d['layers']:,} layers, {d['parameters']:,} parameters, "
            f"{d['gradients']:,} gradients, {d['gflops']:.1f} GFLOPs at {d['imgsz']}x{d['imgsz']}, "
            f"task {d['task']}, CUDA graphs: {graphs}")


def count_flops(net: nn.Module, imgsz: int) -> tuple[int, str]:
    """Flops of one eval-mode forward of ``net`` at batch 1, and where they were counted.

    First on a copy of ``net`` on the meta device (shapes only: nothing is computed and ``net``
    is untouched). A network the meta device cannot run (for example one that keeps tensors
    outside its parameters and buffers, or reads values with ``.item()``) is counted on its own
    device instead, in eval mode under ``no_grad`` and then put back in its mode. That forward
    runs attention through its composite path (``nn.MultiheadAttention``'s fused inference
    kernel off, ``scaled_dot_product_attention`` on its math backend): the counter has no formula
    for the fused CPU kernels and would count such attention as 0, while on the meta device
    attention already takes the composite path.
    """
    try:
        meta = copy.deepcopy(net).to("meta")
        return _counted_forward(meta, imgsz, torch.device("meta")), "meta"
    except Exception:  # the meta device cannot run this network: count a real forward instead
        pass
    device = next((p.device for p in net.parameters()), torch.device("cpu"))
    with _composite_attention():
        return _counted_forward(net, imgsz, device), str(device)


def _counted_forward(net: nn.Module, imgsz: int, device: torch.device) -> int:
    was_training = net.training
    dtype = next((p.dtype for p in net.parameters() if p.is_floating_point()), torch.float32)
    x = torch.zeros(1, 3, imgsz, imgsz, device=device, dtype=dtype)
    net.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            net(x)
    finally:
        net.train(was_training)
    return int(counter.get_total_flops())


@contextlib.contextmanager
def _composite_attention() -> Iterator[None]:
    """Attention as matrix products the counter sees: no fused MHA kernel, SDPA's math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mha = torch.backends.mha
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        mha.set_fastpath_enabled(before)
