"""YOLOv1 networks: Darknet's ``yolov1-tiny.cfg`` (size t) and ``yolov1.cfg`` (size b).

Layout (attribute names are checkpoint keys, as LibreYOLO 1.6.0 writes them): one flat list
``yolo1.layers.<i>`` in cfg order, where parameter-free layers (max pools, dropout) keep their
index. A ``[convolutional]`` layer is ``conv`` (no bias) -> ``bn`` -> LeakyReLU 0.1; a
``[local]`` layer (size b) holds ``weight`` (L, filters, C*k*k) and ``bias`` (filters, L) for its
L = 7 x 7 locations, Darknet's byte order; a ``[connected]`` layer is ``linear`` on the previous
map flattened channel-major ``(C, H, W)``, Darknet's order.

The last layer gives one vector per image of ``S*S*(C + N*5)`` values (S = 7, C classes, N boxes
per cell), three blocks as Darknet's ``[detection]`` layer reads them: class probabilities
``[S*S, C]``, box confidences ``[S*S, N]``, box coordinates ``[S*S, N, 4]`` (x, y offset in the
cell, sqrt(w), sqrt(h) of the image), cell-major (row, then column). The input is fixed at
448 x 448: the connected layer was built for the 7 x 7 map it gives.

Sizes:

* ``t``: ``yolov1-tiny.cfg``, 8 convolutions (16 ... 1024, 256; six 2x2 max pools) and the
  connected layer, N = 2 (the ``yolo1-t`` fixture pins it).
* ``b``: ``yolov1.cfg``, the Darknet release of YOLOv1 whose weights were published: 24
  convolutions, a 3x3 locally connected layer of 256 filters, dropout 0.5 and the connected
  layer, N = 2 (1470 outputs for 20 classes), the layout of the published ``yolov1.weights``
  (its 194,254,718 floats are this network's state dict; the cfg in Darknet's repository today
  says ``num=3``, 1715 outputs, which those weights do not fit). The paper's head (two fully
  connected layers, 4096 and 1470) was not published as weights; docs/families.md gives both
  parameter counts.

BatchNorm: Darknet normalizes with ``(x - mean) / (sqrt(var) + 1e-6)`` (epsilon added to the
standard deviation), which :class:`DarknetBatchNorm2d` applies in eval mode, and its layers keep
no ``num_batches_tracked`` counter, so the checkpoints hold none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: the input side every size takes (the connected layer fixes it)
INPUT_SIZE = 448
#: Darknet's BatchNorm epsilon, added to the standard deviation (``normalize_cpu``)
DARKNET_BN_EPS = 1e-6
#: Darknet's rolling-statistics update, ``rolling = .99 * rolling + .01 * batch``
DARKNET_BN_MOMENTUM = 0.01

#: Pascal VOC's 20 classes in Darknet's ``data/voc.names`` order (the order the head emits them)
VOC_NAMES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
             "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
             "tvmonitor")


@dataclass(frozen=True)
class Yolo1Config:
    """One size: its layers in cfg order and its ``[detection]`` geometry.

    ``layers``: ``("conv", filters, size, stride)``, ``("max",)`` (2x2, stride 2),
    ``("local", filters, size)`` (stride 1, 'same' padding), ``("dropout", p)``; the connected
    output layer follows them. ``boxes``: N, boxes per cell; ``side``: S.
    """

    layers: tuple[tuple, ...]
    boxes: int
    side: int = 7

    @property
    def head_index(self) -> int:
        """The index of the connected output layer (``yolo1.layers.<i>.linear``)."""
        return len(self.layers)


def _conv(filters: int, size: int, stride: int = 1) -> tuple:
    return ("conv", filters, size, stride)


_MAX = ("max",)

CONFIGS: dict[str, Yolo1Config] = {
    "t": Yolo1Config(
        layers=(_conv(16, 3), _MAX, _conv(32, 3), _MAX, _conv(64, 3), _MAX, _conv(128, 3), _MAX,
                _conv(256, 3), _MAX, _conv(512, 3), _MAX, _conv(1024, 3), _conv(256, 3)),
        boxes=2),
    "b": Yolo1Config(
        layers=(_conv(64, 7, 2), _MAX, _conv(192, 3), _MAX,
                _conv(128, 1), _conv(256, 3), _conv(256, 1), _conv(512, 3), _MAX,
                *(_conv(256, 1), _conv(512, 3)) * 4, _conv(512, 1), _conv(1024, 3), _MAX,
                *(_conv(512, 1), _conv(1024, 3)) * 2,
                _conv(1024, 3), _conv(1024, 3, 2), _conv(1024, 3), _conv(1024, 3),
                ("local", 256, 3), ("dropout", 0.5)),
        boxes=2),
}


class DarknetBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose eval mode is Darknet's: ``(x - mean) / (sqrt(var) + eps) * w + b``.

    Training normalizes with the batch statistics as torch's BatchNorm does (biased variance,
    ``eps`` under the root: at ``eps`` = 1e-6 the two rules differ by under 1e-6 relative for any
    variance above 1e-6) and updates the running statistics with ``momentum``. No
    ``num_batches_tracked`` buffer: Darknet's layers keep none, and neither do the checkpoints.
    """

    def __init__(self, num_features: int, eps: float = DARKNET_BN_EPS, momentum: float = DARKNET_BN_MOMENTUM):
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.register_buffer("num_batches_tracked", None)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # nn.Module's loader: BatchNorm's would add the counter this layer does not keep
        nn.Module._load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                                        unexpected_keys, error_msgs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, True,
                                self.momentum, self.eps)
        shape = (1, -1, 1, 1)
        return ((x - self.running_mean.view(shape)) / (self.running_var.sqrt() + self.eps).view(shape)
                * self.weight.view(shape) + self.bias.view(shape))

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The eval-mode affine map ``x * scale + shift`` (what :meth:`ConvBN.fuse` folds)."""
        scale = self.weight / (self.running_var.sqrt() + self.eps)
        return scale, self.bias - self.running_mean * scale


class ConvBN(nn.Module):
    """Darknet ``[convolutional]`` with ``batch_normalize=1``: conv (no bias, padding size // 2)
    -> :class:`DarknetBatchNorm2d` -> LeakyReLU 0.1. After :meth:`fuse`: the conv with a bias."""

    def __init__(self, c_in: int, c_out: int, size: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, size, stride, size // 2, bias=False)
        self.bn: DarknetBatchNorm2d | None = DarknetBatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return F.leaky_relu(x, 0.1)

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the BatchNorm (eval rule) into the convolution."""
        if self.bn is None:
            return
        bn = self.bn
        if isinstance(bn, DarknetBatchNorm2d):
            scale, shift = bn.scale_shift()
        else:   # torch's BatchNorm2d, as a sync_bn run's SyncBatchNorm reverts to
            scale = bn.weight / (bn.running_var + bn.eps).sqrt()
            shift = bn.bias - bn.running_mean * scale
        conv = nn.Conv2d(self.conv.in_channels, self.conv.out_channels, self.conv.kernel_size, self.conv.stride,
                         self.conv.padding, bias=True).to(self.conv.weight)
        conv.weight.copy_(self.conv.weight * scale.view(-1, 1, 1, 1))
        conv.bias.copy_(shift)
        self.conv, self.bn = conv, None


class Local(nn.Module):
    """Darknet ``[local]``: a convolution without weight sharing (every output location has its
    own filters), then LeakyReLU 0.1.

    ``weight`` (L, filters, C*k*k) and ``bias`` (filters, L) for the L = H*W output locations
    (row-major), Darknet's byte order. The patches are ``F.unfold``'s (N, C*k*k, L), whose
    element order (channel, kernel row, kernel column) is Darknet's ``im2col``.
    """

    def __init__(self, c_in: int, c_out: int, size: int, side: int):
        super().__init__()
        self.size, self.side, self.c_out = size, side, c_out
        fan_in = c_in * size * size
        bound = 1.0 / math.sqrt(fan_in)   # nn.Conv2d's default initialisation, per location
        self.weight = nn.Parameter(torch.empty(side * side, c_out, fan_in).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(c_out, side * side).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = F.unfold(x, self.size, padding=self.size // 2)                 # (N, C*k*k, L)
        out = torch.einsum("lok,nkl->nol", self.weight, cols) + self.bias     # (N, filters, L)
        return F.leaky_relu(out.view(x.shape[0], self.c_out, self.side, self.side), 0.1)


class Connected(nn.Module):
    """Darknet ``[connected]`` with a linear activation: ``linear`` on the map flattened (C, H, W)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.linear = nn.Linear(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.flatten(x, 1))


class Darknet(nn.Module):
    """The layer list (``layers``) of one cfg."""

    def __init__(self, cfg: Yolo1Config, nc: int):
        super().__init__()
        layers: list[nn.Module] = []
        c, side = 3, INPUT_SIZE
        for spec in cfg.layers:
            kind = spec[0]
            if kind == "conv":
                _, filters, size, stride = spec
                layers.append(ConvBN(c, filters, size, stride))
                c, side = filters, (side + 2 * (size // 2) - size) // stride + 1
            elif kind == "max":
                layers.append(nn.MaxPool2d(2, 2))
                side //= 2
            elif kind == "local":
                _, filters, size = spec
                layers.append(Local(c, filters, size, side))
                c = filters
            elif kind == "dropout":
                layers.append(nn.Dropout(spec[1]))
            else:
                raise ValueError(f"unknown YOLOv1 layer kind {kind!r}")
        if side != cfg.side:
            raise ValueError(f"the layers give a {side}x{side} map, the [detection] grid is {cfg.side}x{cfg.side}")
        layers.append(Connected(c * side * side, cfg.side * cfg.side * (nc + 5 * cfg.boxes)))
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Yolo1Net(nn.Module):
    """A YOLOv1 network: ``forward(x)`` with ``x`` (B, 3, 448, 448) RGB in [0, 1] returns
    ``[out]``, ``out`` (B, S*S*(nc + 5N)) the raw output vector (see the module docstring), in
    training and in eval mode alike."""

    def __init__(self, size: str, nc: int):
        super().__init__()
        if size not in CONFIGS:
            raise ValueError(f"unknown YOLOv1 size {size!r}; sizes: {', '.join(CONFIGS)}")
        cfg = CONFIGS[size]
        self.nc, self.boxes, self.side = int(nc), cfg.boxes, cfg.side
        self.yolo1 = Darknet(cfg, self.nc)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        check_input_shape(x)
        return [self.yolo1(x)]

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The output vector (B, S*S*(nc + 5N)) as its three blocks: class probabilities
        (B, S*S, nc), confidences (B, S*S, N), coordinates (B, S*S, N, 4)."""
        return split_output(out, self.nc, self.boxes, self.side)

    def fuse(self) -> Yolo1Net:
        """Fold every BatchNorm into its convolution (inference only)."""
        for m in self.modules():
            if isinstance(m, ConvBN):
                m.fuse()
        return self


def split_output(out: torch.Tensor, nc: int, boxes: int, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See :meth:`Yolo1Net.split` (views of ``out``)."""
    b, cells = out.shape[0], side * side
    if out.shape[1] != cells * (nc + 5 * boxes):
        raise ValueError(f"YOLOv1 output has {out.shape[1]} values per image, expected "
                         f"{side}*{side}*({nc} + 5*{boxes}) = {cells * (nc + 5 * boxes)}")
    probs = out[:, :cells * nc].view(b, cells, nc)
    conf = out[:, cells * nc:cells * (nc + boxes)].view(b, cells, boxes)
    coords = out[:, cells * (nc + boxes):].view(b, cells, boxes, 4)
    return probs, conf, coords


def input_size_error(got) -> ValueError:
    """The error for an input size other than 448 (one wording for every entry point)."""
    return ValueError(f"YOLOv1 takes a fixed {INPUT_SIZE}x{INPUT_SIZE} input (its fully connected head was built "
                      f"for the 7x7 grid of a {INPUT_SIZE} input), got {got}: leave imgsz out or pass "
                      f"imgsz={INPUT_SIZE}")


def check_input_shape(x: torch.Tensor) -> None:
    """Raise :func:`input_size_error` unless ``x`` is (B, 3, 448, 448)."""
    if x.dim() != 4 or tuple(x.shape[1:]) != (3, INPUT_SIZE, INPUT_SIZE):
        raise input_size_error(f"an input of shape {tuple(x.shape)}")
