"""What the optimizer sees and the weights it averages: parameter groups (:func:`param_groups`),
the moving average of the weights (:class:`ModelEMA`), optimizer state laid out as its parameters
(:func:`match_state_layouts`), frozen layers (:func:`layers`, :func:`freeze_prefixes`,
:func:`freeze`) and a group's learning rate set in place (:func:`set_lr`).
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
from torch import nn

log = logging.getLogger(__name__)


class ModelEMA:
    """Exponential moving average of weights with a warm-up of the decay (tau iterations).

    The update count lives in a device tensor and the decay is computed from it on the
    device, so one update is a fixed sequence of kernels with no Python-side number in it:
    the same code runs eager and inside a captured whole training step.
    """

    def __init__(self, net: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0,
                 frozen: Sequence[str] = ()):
        self.frozen = tuple(frozen)   # name prefixes of frozen layers: copied, not blended (bitwise kept)
        self.ema = copy.deepcopy(net).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay, self.tau = decay, tau
        dev = next(self.ema.parameters()).device
        self.count = torch.full((), float(updates), device=dev)
        self._pairs(net)

    def _pairs(self, net: nn.Module) -> None:
        """One (average, source) pair per tensor: a tensor the state dict lists under several
        names (a convolution shared across levels, as RTMDet's head ties them) is blended once -
        listed twice, the in-place update would scale it by ``d**k`` and add ``k * (1 - d)`` times
        the source, an average ``k`` times too large early in training."""
        src, dst = net.state_dict(), self.ema.state_dict()
        seen: set[tuple[int, int]] = set()
        keys = []
        for k, v in dst.items():
            ident = (v.untyped_storage().data_ptr(), v.storage_offset())
            if v.numel() and ident in seen:
                continue
            seen.add(ident)
            keys.append(k)
        blend = {k for k in keys if dst[k].dtype.is_floating_point and not under(k, self.frozen)}
        self._float = [(dst[k], src[k]) for k in keys if k in blend]
        self._other = [(dst[k], src[k]) for k in keys if k not in blend]

    @property
    def updates(self) -> int:
        return int(self.count.item())

    @updates.setter
    def updates(self, value: int) -> None:
        self.count.fill_(float(value))

    @torch.no_grad()
    def update(self, net: nn.Module | None = None) -> None:
        """Blend in the weights of the network given at construction (``net`` is accepted for
        symmetry; the pairs are fixed so that a captured step reads stable addresses)."""
        self.count.add_(1.0)
        d = self.decay * (1 - torch.exp(-self.count / self.tau))
        ema = [e for e, _ in self._float]
        torch._foreach_mul_(ema, d)
        torch._foreach_add_(ema, torch._foreach_mul([s.detach() for _, s in self._float], 1 - d))
        for e, s in self._other:
            e.copy_(s)

    def tensors(self) -> list[torch.Tensor]:
        return [e for e, _ in self._float] + [e for e, _ in self._other] + [self.count]


def match_state_layouts(opt: torch.optim.Optimizer) -> int:
    """Lay each optimizer state tensor shaped like its parameter out as the parameter is (its
    strides); returns how many were converted. A checkpoint may hold a channels_last
    parameter's momentum contiguous (written by another tool, or before this run's layout was
    chosen), and the fused optimizers pair the elements of parameter, gradient and state by
    memory position: a layout mismatch there is a silently wrong update, not an error."""
    converted = 0
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p)
            for key, v in (state or {}).items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape and v.stride() != p.stride():
                    state[key] = torch.empty_like(p, dtype=v.dtype).copy_(v)   # p's strides (dense)
                    converted += 1
    return converted


def param_groups(net: nn.Module, weight_decay: float):
    """Decayed weights, undecayed norm weights, biases; trainable only, each tensor once (a
    parameter registered under two modules, like D-FINE's shared ``up``, is listed once)."""
    decay, no_decay, bias = [], [], []
    seen: set[int] = set()
    for module in net.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if name == "bias":
                bias.append(p)
            elif isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm, nn.GroupNorm, nn.LayerNorm)):
                no_decay.append(p)
            else:
                decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0},
            {"params": bias, "weight_decay": 0.0}]


def under(name: str, prefixes: Sequence[str]) -> bool:
    """Whether ``name`` (a parameter, buffer or module name) is one of ``prefixes`` or inside one."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layers(net: nn.Module) -> list[str]:
    """The network's layers in order, as ``freeze=N`` counts them: the children of each top-level
    part (``backbone.conv0``, ``backbone.conv1``, ..., ``neck.*``, ``head.*``; a part without
    children is one layer) that hold parameters."""
    out = []
    for name, part in net.named_children():
        subs = [f"{name}.{sub}" for sub, _ in part.named_children()]
        out += subs or [name]
    return [n for n in out if any(True for _ in net.get_submodule(n).parameters())]


def freeze_prefixes(net: nn.Module, spec: int | Sequence[str]) -> list[str]:
    """``freeze`` (a layer count, or parameter-name prefixes) -> the frozen name prefixes; a count
    beyond the network's layers or a prefix that names no parameter is an OptionError."""
    from ..options import OptionError
    names = [n for n, _ in net.named_parameters()]
    if isinstance(spec, int):
        all_layers = layers(net)
        if spec > len(all_layers):
            raise OptionError(f"freeze={spec} but this network has {len(all_layers)} layers "
                              f"({', '.join(all_layers)})")
        return all_layers[:spec]
    missing = [p for p in spec if not any(under(n, [p]) for n in names)]
    if missing:
        tops = sorted({n.split(".")[0] for n in names})
        raise OptionError(f"freeze: {', '.join(map(repr, missing))} names no parameter of this network (prefixes "
                          f"are parameter names cut at a dot, under {', '.join(tops)}; freeze=N counts layers "
                          f"{', '.join(layers(net)[:4])}, ...)")
    return list(spec)


def freeze(net: nn.Module, prefixes: Sequence[str]) -> tuple[list[nn.Parameter], list[nn.Module]]:
    """Stop gradients to the parameters under ``prefixes`` (so the optimizer never sees them).
    Returns the parameters this turned off (to be turned on again after the run; parameters that
    were fixed already stay so) and the normalization layers among them, which the trainer keeps
    in eval mode: their running statistics stay as they are, so a frozen layer computes what it
    did before training."""
    if not prefixes:
        return [], []
    frozen, total, changed = 0, 0, []
    for name, p in net.named_parameters():
        total += p.numel()
        if under(name, prefixes):
            if p.requires_grad:
                changed.append(p)
            p.requires_grad_(False)
            p.grad = None   # a gradient left by an earlier run would still be clipped, never applied
            frozen += p.numel()
    norms = [m for name, m in net.named_modules()
             if under(name, prefixes) and isinstance(m, nn.modules.batchnorm._NormBase)]
    log.info("freeze: %s frozen (%d of %d parameters, %d BatchNorm layers in eval mode)",
             ", ".join(prefixes) if len(prefixes) <= 6 else f"{', '.join(prefixes[:6])}, ... ({len(prefixes)})",
             frozen, total, len(norms))
    return changed, norms


def set_lr(group: dict, value: float) -> None:
    """Set a param group's lr; a tensor lr (captured whole steps read it) is updated in place."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)
    else:
        group["lr"] = value
