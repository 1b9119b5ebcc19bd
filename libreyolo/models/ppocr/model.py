"""PP-OCR declarations (text detection + recognition, task ``ocr``) and its capturable stages."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ...tasks.ocr.postprocess import REC_BUCKETS
from ..base import Model, load_strict
from .nn import CONFIGS, PPOCRNet

#: sizes of the original works whose LibreYOLO checkpoint layout is not known here, with why
UNAVAILABLE_SIZES = {
    "l": "PP-OCR size 'l' (PP-OCRv5 server: a PP-HGNetV2 backbone for both detector and recognizer) is not "
         "available: only size t's LibreYOLO checkpoint layout is pinned by an architecture fixture "
         "(ppocr-t-det / ppocr-t-rec), and a network built without one could not be shown to load "
         "LibreYOLO's LibrePPOCRl files unchanged. Use size 't'.",
}


class PPOCR(Model):
    """PP-OCR (PP-OCRv5 mobile architecture): a DB text detector and a CTC text recognizer in one
    checkpoint (``det.`` and ``rec.`` sub-networks), task ``ocr``.

    Both networks were trained on BGR images (PaddleOCR decodes with OpenCV) with the ImageNet
    constants applied to the B, G, R channels in that order; the shared preprocessing therefore
    only letterboxes (image at the top-left, so polygons map back by one scale factor) and
    :meth:`infer` reorders and normalizes inside the stage. :meth:`infer` returns the detector's
    sigmoid shrink map; the recognizer runs in the task's second stage (:meth:`infer_rec`).
    """

    FAMILY = "ppocr"
    TASK = "ocr"
    # Declared once the GPU parity protocol passed on both stages (fp32 and float16 autocast,
    # batch 1 and 8; recognition at every bucket width): see docs/families.md, OCR.
    SUPPORTS_CUDA_GRAPH = True
    SIZES = tuple(CONFIGS)
    FILE_PREFIX = "LibrePPOCR"   # the LibreYOLO checkpoint names: LibrePPOCRt-ocr.pt
    DEFAULT_IMGSZ = 960          # PP-OCR's detection side limit
    STRIDE = 32
    #: PP-OCR's detection resize (LibreYOLO's too): the aspect ratio kept, only an image whose longer
    #: side exceeds imgsz shrunk, each side rounded to a multiple of 32, OpenCV's INTER_LINEAR;
    #: mean/std None: infer() normalizes (BGR order)
    PREPROCESS = Preprocess("limit", multiple=32, quantize=True)
    #: recognition widths (at height 48) a text line is padded to, one captured stage each
    REC_BUCKETS: tuple[int, ...] = REC_BUCKETS

    SIGNATURE_KEYS = ("det.head.binarize.conv1.weight", "rec.head.ctc_head.fc.weight",
                      "det.backbone.conv1.conv.weight")

    @classmethod
    def _check_size(cls, size: str) -> None:
        if size in UNAVAILABLE_SIZES:
            raise ValueError(UNAVAILABLE_SIZES[size])

    @classmethod
    def build_network(cls, size: str, nc: int) -> nn.Module:
        cls._check_size(size)
        return PPOCRNet(size)

    DEFAULT_NC = 1   # the detector's one class: text

    @classmethod
    def default_names(cls, nc: int) -> dict[int, str]:
        return {0: "text"}

    @classmethod
    def new(cls, size: str, nc: int | None = None, names: Any = None, *, imgsz: int | None = None,
            device: Any = "auto", seed: int | None = None, task: str | None = None) -> PPOCR:
        """An untrained PP-OCR model (``nc`` is always 1: the detector has one class, text)."""
        cls._check_size(size)
        return super().new(size, 1, names, imgsz=imgsz, device=device, seed=seed, task=task)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, *, size: str | None = None, device: Any = "auto",
                        source: str | None = None) -> PPOCR:
        size = ckpt.get("size") or size
        if size is None and "det.backbone.stem.stem1.conv.weight" in ckpt["model"]:
            size = "l"   # a PP-HGNetV2 stem: the server layout
        if size is not None:
            cls._check_size(str(size))
        size = size or "t"
        if size not in cls.SIZES:
            raise ValueError(f"{source or 'checkpoint'}: unknown {cls.FAMILY} size {size!r}")
        sd = ckpt["model"]
        fc = sd.get("rec.head.ctc_head.fc.weight")
        if fc is None:
            raise ValueError(f"{source or 'checkpoint'}: no 'rec.head.ctc_head.fc.weight' tensor: not a "
                             f"{cls.FAMILY} checkpoint (it holds no recognizer classifier)")
        net = PPOCRNet(str(size), num_classes=int(fc.shape[0]))   # the classifier follows the checkpoint
        load_strict(net, sd, f"{cls.FAMILY}-{size}", source)
        meta = {k: v for k, v in ckpt.items() if k not in ("model", "train_state")}
        return cls(net, size=str(size), nc=1, names=ckpt.get("names"), imgsz=ckpt.get("imgsz"),
                   device=device, trained=True, source=source, meta=meta)

    @classmethod
    def nc_from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> int | None:
        return 1

    #: predict (and bench) run the re-parameterized network: :meth:`PPOCRNet.fuse` applied to a copy
    #: kept beside the model's own, which stays in the checkpoint layout (``save()`` still works).
    #: The fused network equals the loaded one up to float32 rounding; False: the loaded network.
    predict_fused: bool = True

    def __init__(self, net: nn.Module, **kwargs: Any):
        kwargs["nc"] = 1
        self._fused_copy: tuple | None = None   # (source network, its fingerprint, fused copy)
        super().__init__(net, **kwargs)
        from .charset import load_charset
        self.charset = load_charset(self.meta.get("charset"), net.cfg.num_classes, self.source)

    @property
    def version(self) -> str:
        """The PP-OCR generation of the weights (checkpoint metadata ``ppocr_version``): "v5" (the
        default architecture and alphabet) or "v4" (same networks, its own 6,625-class alphabet)."""
        return str(self.meta.get("ppocr_version") or "v5")

    # ------------------------------------------------------------------ the fused network
    def get_predictor(self):
        self._refresh_fused()
        return super().get_predictor()

    def _refresh_fused(self) -> None:
        """(Re)build the fused copy when predict should use one and the network changed since
        (weights loaded, moved, re-drawn): outside any capture, before a predict starts."""
        if self.fused or not self.predict_fused or self.model.training:
            self._fused_copy = None
            return
        fp = self.runner.fingerprint()
        c = self._fused_copy
        if c is None or c[0] is not self.model or c[1] != fp:
            import copy
            net = copy.deepcopy(self.model).fuse().eval()
            if self.device.type == "cpu":   # oneDNN's depthwise convs: faster in channels-last on the CPU
                net = net.to(memory_format=torch.channels_last)
            self._fused_copy = (self.model, fp, net)

    def _net(self) -> PPOCRNet:
        """The network the stages run: the fused copy while it is current, else the model's own
        (a twin from :meth:`infer_with`, a changed network not yet refreshed)."""
        c = self._fused_copy
        if c is not None and c[0] is self.model and self.predict_fused and not self.fused \
                and c[1] == self.runner.fingerprint():
            return c[2]
        return self.model  # type: ignore[return-value]

    def _attach(self, net: nn.Module) -> None:
        """As every family's, with room in the graph cache for the recognition graphs on top of
        the usual cap the detection stage lives under."""
        super()._attach(net)
        self._fused_copy = None
        self.runner.max_graphs = self.runner.max_graphs + len(self.REC_BUCKETS)


    # ------------------------------------------------------------------ stages
    @staticmethod
    def _bgr_normalize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
        """RGB [0, 1] batch -> BGR channel order, then ``(x - mean[i]) / std[i]`` per channel i."""
        return torch.cat([(x[:, 2 - i:3 - i] - m) / s for i, (m, s) in enumerate(zip(mean, std))], 1)

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) RGB in [0, 1] (letterboxed) -> (B, 1, S, S) float32 shrink map (text probability)."""
        return self._net().det(self._bgr_normalize(x, IMAGENET_MEAN, IMAGENET_STD)).float()

    def infer_rec(self, crops_u8: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
        """(B, 48, W, 3) uint8 RGB text-line crops, each valid in its first ``widths[i]`` columns ->
        (B, W / 8, classes) float32 CTC probabilities.

        BGR order, ``x / 127.5 - 1`` (PaddleOCR's ``(x / 255 - 0.5) / 0.5``), and 0 (mid-grey) to
        the right of each crop's width, as PaddleOCR pads its recognition batches.
        """
        x = crops_u8.permute(0, 3, 1, 2).flip(1).to(torch.float32)
        x = (x / 255.0 - 0.5) / 0.5
        cols = torch.arange(x.shape[-1], device=x.device)
        x = torch.where(cols < widths.view(-1, 1, 1, 1), x, torch.zeros((), device=x.device))
        return self._net().rec(x).float()

    #: the summed branches of the re-parameterizable blocks grow re-drawn weights' activations past
    #: float16's range: verify's probe weights are calibrated (engine/verify.py: input_sensitive)
    REDRAW_CALIBRATE = True

    def calibration_pass(self, g: torch.Generator) -> None:
        """One forward of each sub-network on random inputs (``input_sensitive``'s calibration)."""
        s = int(self.imgsz)
        self.infer(torch.rand(1, 3, s, s, generator=g).to(self.device))
        crops = torch.randint(0, 256, (2, 48, 320, 3), generator=g, dtype=torch.uint8).to(self.device)
        self.infer_rec(crops, torch.tensor([320, 200], device=self.device))

    def checkpoint_of(self, net: nn.Module, host: bool = True) -> dict:
        ckpt = super().checkpoint_of(net, host)
        ckpt.setdefault("charset", list(self.charset))
        return ckpt

    def train(self, **kwargs) -> dict:
        raise NotImplementedError("training is not implemented for the ppocr family (inference only; the "
                                  "library it replaces trains no OCR model either)")

    def val(self, *args, **kwargs) -> dict:
        raise NotImplementedError("validation is not implemented for the ppocr family (no OCR metric yet)")
