"""The Darknet cfg files of YOLOv2, YOLOv3 and YOLOv4, as layer lists.

A layer's position in its list is its index in the cfg (the ``[net]`` section not counted), which
is also its checkpoint name: ``<family>.layers.<index>.*``. Routes and shortcuts refer to other
layers as the cfg does: a negative number counts back from the layer itself, a non-negative one
is an absolute index. Parameter-free layers (max-pool, route, shortcut, upsample, reorg, the
``[yolo]`` / ``[region]`` heads) take a position too, so their indices are absent from the state
dict.

Sources (Darknet is public domain): ``yolov2-tiny.cfg``, ``yolov2.cfg`` (the COCO version: 5
anchors, 80 classes), ``yolov3-tiny.cfg``, ``yolov3.cfg``, ``yolov3-spp.cfg`` from
pjreddie/darknet; ``yolov4-tiny.cfg``, ``yolov4.cfg`` from AlexeyAB/darknet (its ``scale_x_y``
1.2 / 1.1 / 1.05; pjreddie's later copy of yolov4.cfg sets 1.0).
"""
from __future__ import annotations

from dataclasses import dataclass

# ------------------------------------------------------------------------------------ layers


def conv(filters: int, size: int = 1, stride: int = 1, act: str = "leaky") -> tuple:
    """``[convolutional]`` with ``batch_normalize=1``, ``pad=1``."""
    return ("conv", filters, size, stride, act)


def head() -> tuple:
    """The linear 1x1 ``[convolutional]`` (with bias, no BatchNorm) before a ``[yolo]`` or
    ``[region]`` layer; its filters follow from the class count: anchors x (5 + nc)."""
    return ("head",)


def maxpool(size: int, stride: int) -> tuple:
    return ("maxpool", size, stride)


def route(*layers: int, groups: int = 1, group_id: int = 0) -> tuple:
    """``[route]``: the channels of ``layers`` concatenated; with ``groups`` only the
    ``group_id``-th of ``groups`` equal channel chunks of each (YOLOv4-tiny)."""
    return ("route", tuple(layers), groups, group_id)


def shortcut(frm: int = -3) -> tuple:
    """``[shortcut]`` with ``activation=linear``: the previous layer plus layer ``frm``."""
    return ("shortcut", frm)


def upsample(stride: int = 2) -> tuple:
    return ("upsample", stride)


def reorg(stride: int = 2) -> tuple:
    return ("reorg", stride)


def yolo(mask: tuple[int, ...], scale_x_y: float = 1.0) -> tuple:
    """``[yolo]``: the anchors ``mask`` (indices into the cfg's anchor list) of this head."""
    return ("yolo", tuple(mask), float(scale_x_y))


def region() -> tuple:
    """``[region]``: every anchor of the cfg, softmax classes (YOLOv2)."""
    return ("region",)


@dataclass(frozen=True)
class DarknetCfg:
    """One Darknet cfg: its layers, its anchors and the loss settings of its head sections.

    ``anchors`` are (w, h) in input pixels for ``[yolo]`` heads and in grid cells (of the stride-32
    output) for ``[region]``. ``ignore_thresh``: a prediction whose box overlaps a ground truth by
    more than this gets no no-object loss (``[yolo]`` ``ignore_thresh``, ``[region]`` ``thresh``).
    ``iou_thresh``: besides its best anchor, a ground truth is also assigned every anchor whose
    shape IoU exceeds this (YOLOv4's ``iou_thresh``; 1.0 = off). ``box``: ``"coord"`` (Darknet's
    sigmoid-offset / log-size regression scaled by 2 - w*h) or ``"ciou"`` (YOLOv4's
    ``iou_loss=ciou``); ``box_scale``: its weight (YOLOv4's ``iou_normalizer`` 0.07, else 1).
    ``object_scale`` / ``noobject_scale`` / ``rescore``: the ``[region]`` objectness weights and its
    IoU target. ``imgsz``: the cfg's network width; ``learning_rate`` and ``momentum``: its
    ``[net]`` optimizer settings.
    """

    name: str
    layers: tuple
    anchors: tuple[tuple[float, float], ...]
    imgsz: int
    ignore_thresh: float = 0.7
    iou_thresh: float = 1.0
    box: str = "coord"
    box_scale: float = 1.0
    object_scale: float = 1.0
    noobject_scale: float = 1.0
    rescore: bool = False
    learning_rate: float = 0.001
    momentum: float = 0.9

    @property
    def region(self) -> bool:
        return any(layer[0] == "region" for layer in self.layers)


# -------------------------------------------------------------------------------- YOLOv2

#: yolov2.cfg / yolov2-tiny.cfg (COCO): anchors in grid cells of the stride-32 map
ANCHORS_V2 = ((0.57273, 0.677385), (1.87446, 2.06253), (3.33843, 5.47434), (7.88282, 3.52778),
              (9.77052, 9.16828))
_REGION = dict(ignore_thresh=0.6, object_scale=5.0, noobject_scale=1.0, rescore=True)


def _yolov2_tiny() -> list:
    d = []
    for c in (16, 32, 64, 128, 256):
        d += [conv(c, 3), maxpool(2, 2)]
    d += [conv(512, 3), maxpool(2, 1), conv(1024, 3)]
    d += [conv(512, 3), head(), region()]
    return d


def _yolov2() -> list:
    """Darknet-19 and the passthrough (reorg of layer 16, concatenated with layer 24)."""
    d = [conv(32, 3), maxpool(2, 2), conv(64, 3), maxpool(2, 2)]
    d += [conv(128, 3), conv(64, 1), conv(128, 3), maxpool(2, 2)]
    d += [conv(256, 3), conv(128, 1), conv(256, 3), maxpool(2, 2)]
    d += [conv(512, 3), conv(256, 1), conv(512, 3), conv(256, 1), conv(512, 3), maxpool(2, 2)]   # 16: passthrough
    d += [conv(1024, 3), conv(512, 1), conv(1024, 3), conv(512, 1), conv(1024, 3)]
    d += [conv(1024, 3), conv(1024, 3)]                                                         # 24
    d += [route(-9), conv(64, 1), reorg(2), route(-1, -4)]
    d += [conv(1024, 3), head(), region()]
    return d


YOLOV2_TINY = DarknetCfg("yolov2-tiny", tuple(_yolov2_tiny()), ANCHORS_V2, 416, **_REGION)
YOLOV2 = DarknetCfg("yolov2", tuple(_yolov2()), ANCHORS_V2, 608, **_REGION)

# -------------------------------------------------------------------------------- YOLOv3

ANCHORS_V3 = ((10, 13), (16, 30), (33, 23), (30, 61), (62, 45), (59, 119), (116, 90), (156, 198), (373, 326))
ANCHORS_TINY = ((10, 14), (23, 27), (37, 58), (81, 82), (135, 169), (344, 319))


def _tiny_trunk() -> list:
    """The Tiny YOLOv3 backbone: 3x3 convs and stride-2 max-pools, then a stride-1 pool (0-12)."""
    d = []
    for c in (16, 32, 64, 128, 256):
        d += [conv(c, 3), maxpool(2, 2)]
    return d + [conv(512, 3), maxpool(2, 1), conv(1024, 3)]


def _yolov3_tiny() -> list:
    d = _tiny_trunk()
    d += [conv(256, 1), conv(512, 3), head(), yolo((3, 4, 5))]
    d += [route(-4), conv(128, 1), upsample(2), route(-1, 8)]
    d += [conv(256, 3), head(), yolo((0, 1, 2))]
    return d


def _residual(c: int, n: int, act: str = "leaky") -> list:
    """``n`` Darknet residual blocks of width ``c``: 1x1 (c/2), 3x3 (c), shortcut -3."""
    return [conv(c // 2, 1, act=act), conv(c, 3, act=act), shortcut(-3)] * n


def _darknet53() -> list:
    """Darknet-53 (layers 0-74); the stride-8 and stride-16 outputs are layers 36 and 61."""
    d = [conv(32, 3), conv(64, 3, 2)] + _residual(64, 1)
    d += [conv(128, 3, 2)] + _residual(128, 2)
    d += [conv(256, 3, 2)] + _residual(256, 8)
    d += [conv(512, 3, 2)] + _residual(512, 8)
    d += [conv(1024, 3, 2)] + _residual(1024, 4)
    return d


def _spp() -> list:
    """Max-pools 5, 9, 13 (stride 1) of the previous layer, concatenated with it."""
    return [maxpool(5, 1), route(-2), maxpool(9, 1), route(-4), maxpool(13, 1), route(-1, -3, -5, -6)]


def _yolov3(spp: bool) -> list:
    d = _darknet53()
    d += [conv(512, 1), conv(1024, 3), conv(512, 1)]
    if spp:
        d += _spp() + [conv(512, 1)]
    d += [conv(1024, 3), conv(512, 1), conv(1024, 3), head(), yolo((6, 7, 8))]
    d += [route(-4), conv(256, 1), upsample(2), route(-1, 61)]
    d += [conv(256, 1), conv(512, 3), conv(256, 1), conv(512, 3), conv(256, 1), conv(512, 3), head(), yolo((3, 4, 5))]
    d += [route(-4), conv(128, 1), upsample(2), route(-1, 36)]
    d += [conv(128, 1), conv(256, 3), conv(128, 1), conv(256, 3), conv(128, 1), conv(256, 3), head(), yolo((0, 1, 2))]
    return d


YOLOV3_TINY = DarknetCfg("yolov3-tiny", tuple(_yolov3_tiny()), ANCHORS_TINY, 416)
YOLOV3 = DarknetCfg("yolov3", tuple(_yolov3(spp=False)), ANCHORS_V3, 608)
YOLOV3_SPP = DarknetCfg("yolov3-spp", tuple(_yolov3(spp=True)), ANCHORS_V3, 608)

# -------------------------------------------------------------------------------- YOLOv4

ANCHORS_V4 = ((12, 16), (19, 36), (40, 28), (36, 75), (76, 55), (72, 146), (142, 110), (192, 243), (459, 401))
_YOLO4 = dict(ignore_thresh=0.7, iou_thresh=0.213, box="ciou", box_scale=0.07)
_YOLO4_TINY = dict(ignore_thresh=0.7, box="ciou", box_scale=0.07)      # yolov4-tiny.cfg sets no iou_thresh


def _tiny_csp(c: int) -> list:
    """One YOLOv4-tiny CSP stage on a ``c``-channel input: the second half of the channels
    through two 3x3 convs, their concatenation through a 1x1, joined with the input."""
    return [route(-1, groups=2, group_id=1), conv(c // 2, 3), conv(c // 2, 3), route(-1, -2), conv(c, 1),
            route(-6, -1)]


def _yolov4_tiny() -> list:
    d = [conv(32, 3, 2), conv(64, 3, 2), conv(64, 3)] + _tiny_csp(64) + [maxpool(2, 2)]
    d += [conv(128, 3)] + _tiny_csp(128) + [maxpool(2, 2)]
    d += [conv(256, 3)] + _tiny_csp(256) + [maxpool(2, 2)]                     # 23: the stride-16 tap
    d += [conv(512, 3), conv(256, 1), conv(512, 3), head(), yolo((3, 4, 5), 1.05)]
    d += [route(-4), conv(128, 1), upsample(2), route(-1, 23)]
    d += [conv(256, 3), head(), yolo((1, 2, 3), 1.05)]
    return d


def _csp_stage(c: int, n: int, first: bool = False) -> list:
    """One CSPDarknet53 stage (Mish): a 3x3 stride-2 conv to ``c`` channels, a 1x1 shortcut
    branch and a 1x1 main branch through ``n`` residual blocks, concatenated and mixed by a 1x1.
    The first stage keeps ``c`` channels in both branches (its block's 1x1 halves them)."""
    h = c if first else c // 2
    d = [conv(c, 3, 2, "mish"), conv(h, 1, act="mish"), route(-2), conv(h, 1, act="mish")]
    d += [conv(c // 2, 1, act="mish"), conv(h, 3, act="mish"), shortcut(-3)] * n
    d += [conv(h, 1, act="mish"), route(-1, -(3 * n + 4)), conv(c, 1, act="mish")]
    return d


def _yolov4() -> list:
    """CSPDarknet53 (0-104; stride-8 / 16 taps 54 and 85), SPP, PAN, heads at strides 8, 16, 32."""
    d = [conv(32, 3, act="mish")] + _csp_stage(64, 1, first=True)
    d += _csp_stage(128, 2) + _csp_stage(256, 8) + _csp_stage(512, 8) + _csp_stage(1024, 4)
    d += [conv(512, 1), conv(1024, 3), conv(512, 1)] + _spp()
    d += [conv(512, 1), conv(1024, 3), conv(512, 1)]                                       # 116
    d += [conv(256, 1), upsample(2), route(85), conv(256, 1), route(-1, -3)]
    d += [conv(256, 1), conv(512, 3), conv(256, 1), conv(512, 3), conv(256, 1)]             # 126
    d += [conv(128, 1), upsample(2), route(54), conv(128, 1), route(-1, -3)]
    d += [conv(128, 1), conv(256, 3), conv(128, 1), conv(256, 3), conv(128, 1)]             # 136
    d += [conv(256, 3), head(), yolo((0, 1, 2), 1.2)]
    d += [route(-4), conv(256, 3, 2), route(-1, -16)]
    d += [conv(256, 1), conv(512, 3), conv(256, 1), conv(512, 3), conv(256, 1)]
    d += [conv(512, 3), head(), yolo((3, 4, 5), 1.1)]
    d += [route(-4), conv(512, 3, 2), route(-1, -37)]
    d += [conv(512, 1), conv(1024, 3), conv(512, 1), conv(1024, 3), conv(512, 1)]
    d += [conv(1024, 3), head(), yolo((6, 7, 8), 1.05)]
    return d


YOLOV4_TINY = DarknetCfg("yolov4-tiny", tuple(_yolov4_tiny()), ANCHORS_TINY, 416, learning_rate=0.00261,
                         **_YOLO4_TINY)
YOLOV4 = DarknetCfg("yolov4", tuple(_yolov4()), ANCHORS_V4, 608, learning_rate=0.0013, momentum=0.949, **_YOLO4)
