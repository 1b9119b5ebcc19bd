"""BatchNorm folding for the timm-built classifiers (:class:`~.timm_net.TimmClassifier`).

In inference a BatchNorm whose input is a convolution's output is an affine map per channel,
so it can be folded into that convolution's weight and bias. Folding removes one kernel per
BatchNorm from a batch-1 predict graph (there, kernel launches rather than arithmetic set the
time); the numerics differ from the unfused network by rounding only.

A fold is valid only where the BatchNorm's input is exactly the convolution's output and that
output has no other user (a residual add or a second branch reading the raw convolution output
would see the folded values). Those pairs are found on the network's ``torch.fx`` graph, not by
module names or order: timm's modules name their layers freely (``conv``/``bn``, ``conv_stem``/
``bn1``, ``conv_dw``/``bn2`` ...) and a name pair says nothing about the data flow. The tracer
keeps timm's norm + activation modules (``BatchNormAct2d``: BatchNorm, then ``.drop``, then
``.act``) and timm's no-trace modules as leaves, so each BatchNorm is one ``call_module`` node.
A network that cannot be traced folds nothing.

Only modules whose forward is known to be a plain affine use of their parameters are folded:
convolutions of type ``nn.Conv2d`` or timm's ``Conv2dSame`` (padding, then the same convolution;
not weight-standardized convolutions, whose forward rescales the weight), and BatchNorms of type
``nn.BatchNorm2d`` or timm's ``BatchNormAct2d`` with running statistics (eval semantics). Each
module must be called once in the graph and its parameters not read elsewhere. The folded
weights are written into the original modules (``fuse_conv_bn_weights``); the BatchNorm is
replaced by ``nn.Identity()`` or, for ``BatchNormAct2d``, by ``nn.Sequential(drop, act)``: the
network stays an ordinary eager module with its own forward.
"""
from __future__ import annotations

import inspect
import logging
from collections import Counter

import torch
from torch import fx, nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

log = logging.getLogger(__name__)


def _timm_leaf_types() -> tuple[tuple[type[nn.Module], ...], tuple, tuple[type[nn.Module], ...],
                                tuple[type[nn.Module], ...]]:
    """(leaf module types, autowrap functions, foldable conv types, BatchNormAct types) of timm."""
    import importlib

    from timm.layers.conv2d_same import Conv2dSame
    timm_fx = importlib.import_module("timm.layers._fx")   # (the package's names shadow some modules)
    norm_act = importlib.import_module("timm.layers.norm_act")
    norm_acts = tuple(c for _, c in inspect.getmembers(norm_act, inspect.isclass)
                      if issubclass(c, nn.Module) and c.__module__ == norm_act.__name__)
    leaves = tuple({*timm_fx.get_notrace_modules(), *norm_acts})
    wrap = tuple(f for f in timm_fx.get_notrace_functions() if callable(f))
    convs: tuple[type[nn.Module], ...] = (nn.Conv2d, Conv2dSame)
    return leaves, wrap, convs, (norm_act.BatchNormAct2d,)


class _TimmTracer(fx.Tracer):
    """torch.fx's tracer with timm's norm + activation and no-trace modules kept as leaves."""

    def __init__(self, leaves: tuple[type[nn.Module], ...], autowrap_functions: tuple = ()):
        super().__init__(autowrap_functions=autowrap_functions)
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, module_qualified_name)


def fold_batchnorms(net: nn.Module) -> int:
    """Fold every BatchNorm of ``net`` whose input is exactly a convolution's output (with no other
    user) into that convolution, in place; returns how many were folded (0 where ``net`` cannot be
    traced). For inference only: the folded network no longer has those BatchNorms."""
    leaves, wrap, conv_types, bn_act_types = _timm_leaf_types()
    try:
        graph = _TimmTracer(leaves, wrap).trace(net)
    except Exception as e:   # not FX-traceable: fold nothing rather than guess the data flow
        log.info("BatchNorm not folded: %s is not FX-traceable (%s: %s)", type(net).__name__, type(e).__name__, e)
        return 0
    calls = Counter(n.target for n in graph.nodes if n.op == "call_module")
    # modules whose parameters or buffers the graph reads directly (get_attr): theirs stay as they are
    read = {str(n.target).rpartition(".")[0] for n in graph.nodes if n.op == "get_attr"}
    bn_types = (nn.BatchNorm2d, *bn_act_types)
    pairs: list[tuple[str, str]] = []
    for node in graph.nodes:
        if node.op != "call_module" or calls[node.target] != 1 or node.target in read:
            continue
        conv = net.get_submodule(str(node.target))
        if type(conv) not in conv_types or len(node.users) != 1:
            continue
        (user,) = node.users
        if user.op != "call_module" or calls[user.target] != 1 or user.target in read \
                or user.args != (node,) or user.kwargs:
            continue
        bn = net.get_submodule(str(user.target))
        if type(bn) not in bn_types or not bn.track_running_stats \
                or bn.running_mean is None or bn.running_var is None:
            continue
        pairs.append((str(node.target), str(user.target)))
    for conv_name, bn_name in pairs:
        conv, bn = net.get_submodule(conv_name), net.get_submodule(bn_name)
        assert isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)
        assert bn.running_mean is not None and bn.running_var is not None
        with torch.no_grad():
            w, b = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                                        bn.weight, bn.bias)
        b.requires_grad_(w.requires_grad)   # a conv without bias gets a new one: as its weight
        conv.weight, conv.bias = w, b
        parent_name, _, attr = bn_name.rpartition(".")
        parent = net.get_submodule(parent_name)
        rest: nn.Module = nn.Identity()
        if isinstance(bn, bn_act_types):   # BatchNormAct2d: BatchNorm, then .drop, then .act
            rest = nn.Sequential(bn.get_submodule("drop"), bn.get_submodule("act"))
        setattr(parent, attr, rest)
    return len(pairs)
