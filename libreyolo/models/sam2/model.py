"""SAM 2 declarations (promptable segmentation of images and video) and what SAM-2-style families share."""
from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..base import Model
from ..mobilesam.model import MobileSAM

log = logging.getLogger(__name__)

#: how the network being built is shaped: its frame (the config's image size; None: the family's
#: ``DEFAULT_IMGSZ``, see :meth:`Sam2Family.build_shape`) and whether it has the video memory (set
#: by :meth:`Sam2Family.new` / :meth:`Sam2Family.from_checkpoint` around the base class's
#: construction, which calls ``build_network(size, nc)``)
_BUILD: contextvars.ContextVar[tuple[int | None, bool]] = contextvars.ContextVar("sam2_build", default=(None, False))

#: the install line of the optional dependency
SAM_EXTRA = "pip install 'libreyolo-graphs[sam]'"


def needs_transformers(family: str) -> None:
    """A clear error when transformers (the ``sam`` extra) is missing."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ImportError(f"{family} runs transformers' modules (the reference layout): {SAM_EXTRA}") from None


@contextlib.contextmanager
def building(frame: int | None, video: bool) -> Iterator[None]:
    token = _BUILD.set((None if frame is None else int(frame), bool(video)))
    try:
        yield
    finally:
        _BUILD.reset(token)


class Sam2Family(MobileSAM):
    """What SAM 2 and EdgeTAM share: transformers' networks, a stretched 1024 frame with ImageNet
    normalization, three image-embedding maps (two skip features and the embedding), one box per
    prompt, and video propagation (:meth:`track`).

    A checkpoint in the LibreYOLO 1.6.0 layout holds the image network only (transformers'
    image model's state dict): it predicts on images, and ``track`` says it lacks the memory. A
    checkpoint with the memory modules (the released video models' layout) and ``new()`` build
    the video network, which does both.
    """

    FAMILY = ""
    SUPPORTS_CUDA_GRAPH = True   # proven on a GPU: docs/families.md (session 31's rows, benchmarks/results/session31/)
    #: mask prompts (``mask_input``): the prompt encoder's mask embedding, as SAM 2's image predictor
    MASK_PROMPTS = True
    DEFAULT_IMGSZ = 1024
    STRIDE = 16
    #: stretched to the square frame (transformers' Sam2ImageProcessor: uint8 resize, antialiased
    #: bilinear), scaled to [0, 1], ImageNet mean / std
    PREPROCESS = Preprocess("stretch", mean=IMAGENET_MEAN, std=IMAGENET_STD, antialias=True, quantize=True)
    #: graphs kept: the image stage per size, prompt stages per count, the video step per bank fill
    MAX_GRAPHS = 48
    #: the first key of the memory modules (a checkpoint with it builds the video network)
    VIDEO_KEY: ClassVar[str] = "memory_attention."

    # ---------------------------------------------------------------- networks
    @classmethod
    def checked_frame(cls, size: int) -> int:
        """``size`` if it is a frame the network builds at, else a clear error (the rule lives
        with the network, whose module imports transformers)."""
        from .nn import check_frame
        return check_frame(size)

    @classmethod
    def build_shape(cls) -> tuple[int, bool]:
        """(frame, with the video memory) of the network being built: what :func:`building`
        set, the frame ``DEFAULT_IMGSZ`` where unset."""
        frame, video = _BUILD.get()
        return cls.checked_frame(cls.DEFAULT_IMGSZ if frame is None else frame), video

    @classmethod
    def image_network(cls, size: str, frame: int) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def video_network(cls, size: str, frame: int) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def build_network(cls, size: str, nc: int = 1) -> nn.Module:
        """The image network (the LibreYOLO 1.6.0 layout) or, inside ``new`` and for checkpoints
        with the memory modules, the video network; ``nc`` is ignored (class-agnostic masks)."""
        needs_transformers(cls.FAMILY)
        frame, video = cls.build_shape()
        return (cls.video_network if video else cls.image_network)(size, frame)

    @classmethod
    def new(cls, size: str, nc: int = 1, names: Any = None, *, imgsz: int | None = None, video: bool = True,
            **kw: Any) -> Model:
        """An untrained model (random weights) at frame ``imgsz`` (default ``DEFAULT_IMGSZ``, as
        released); ``video=False`` builds the image network alone."""
        frame = cls.checked_frame(imgsz or cls.DEFAULT_IMGSZ)
        with building(frame, video):
            return Model.new.__func__(cls, size, 1, None, imgsz=frame, **kw)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, *, size: str | None = None, device: Any = "auto",
                        source: str | None = None) -> Model:
        """As :meth:`Model.from_checkpoint`, the network shaped by the file: its frame (``imgsz``)
        and, where its state dict has the memory modules, the video network."""
        video = any(k.startswith(cls.VIDEO_KEY) for k in ckpt["model"])
        with building(cls.checked_frame(ckpt.get("imgsz") or cls.DEFAULT_IMGSZ), video):
            return super().from_checkpoint(ckpt, size=size, device=device, source=source)

    @classmethod
    def sniff_size(cls, state_dict: dict[str, torch.Tensor], nc: int) -> str | None:
        video = any(k.startswith(cls.VIDEO_KEY) for k in state_dict)
        frame, _ = _BUILD.get()
        with building(frame, video):
            return super().sniff_size(state_dict, nc)

    @property
    def has_video(self) -> bool:
        """Whether the network has SAM 2's memory (``track`` needs it)."""
        return hasattr(self.model, "memory_attention")

    def _attach(self, net: nn.Module) -> None:
        Model._attach(self, net)
        self.runner.max_graphs = self.MAX_GRAPHS
        if int(net.frame) != self.imgsz:
            raise ValueError(f"{self.FAMILY}: the network's frame is {net.frame}, the model's imgsz {self.imgsz}")

    @property
    def imgsz(self) -> int:
        """The network's square frame (fixed by its config: ``DEFAULT_IMGSZ`` as released)."""
        return self._imgsz

    @imgsz.setter
    def imgsz(self, value: int) -> None:
        value = self.checked_frame(int(value))
        net = getattr(self, "model", None)
        if net is not None and int(net.frame) != value:
            raise ValueError(f"{self.FAMILY}-{self.size}'s network is built for {net.frame}x{net.frame} frames; "
                             f"build one for imgsz={value} with LibreYOLO.new({self.FAMILY!r}, {self.size!r}, imgsz={value})")
        self._imgsz = value

    # ------------------------------------------------------------------ stages
    def infer(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) normalized frames -> (skip s0, skip s1, image embedding)."""
        s = int(x.shape[-1])
        if s != self.model.frame or int(x.shape[-2]) != s:
            raise ValueError(f"{self.FAMILY}-{self.size}'s network takes {self.model.frame}x{self.model.frame} frames "
                             f"(imgsz={self.model.frame}), got {tuple(x.shape[-2:])}: predict at imgsz={self.model.frame} "
                             f"or build the model at another imgsz with LibreYOLO.new")
        return self.model.embed(x)

    def decode(self, embeddings: Any, points: torch.Tensor | None, labels: torch.Tensor | None,
               boxes: torch.Tensor | None, multimask: bool, size: int,
               mask_input: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The three embedding maps + prompts in the frame (``mask_input``: (B, 1, S/4, S/4) mask
        logits, the prompt encoder's dense prompt) -> (B, M, S/4, S/4) logits, (B, M) IoU."""
        low, iou, _ = self.model.decode(*embeddings, points, labels, boxes, multimask, masks=mask_input)
        return low, iou

    @staticmethod
    def postprocess_masks(low: torch.Tensor, size: int, resized: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
        """(B, M, s, s) logits -> (B, M, h, w) masks: bilinear straight to the image's size, > 0
        (the image was stretched to the frame; transformers' ``post_process_masks``)."""
        return F.interpolate(low, hw, mode="bilinear", align_corners=False) > 0.0

    # ------------------------------------------------------------ verification
    def verify_cases(self, size: int, batch: int, source_hw: tuple[int, int]) -> list[tuple]:
        """(name, fn, probe A, probe B) of the parity protocol: the network (embedding and a
        two-point decode), the image stage from uint8 images, the prompt stage (decoder and the
        masks at ``source_hw``, without and with a mask prompt), ``batch`` images each; with the
        memory, the video step at a full bank (7 memories, 16 pointers) for one object and for
        three objects tracked as one batch, and the frame stage."""
        from ...tasks.segment_prompt.predictor import PromptPredictor, low_res_side
        dev, net, frame = self.device, self.model, int(self.model.frame)
        g = torch.Generator().manual_seed(2024)
        h, w = source_hw
        r = lambda *shape: torch.rand(shape, generator=g)   # noqa: E731
        lab = torch.tensor([[1.0, 0.0]]).expand(batch, 2).contiguous().to(dev)

        def network(x, p, lb):
            return net.decode(*net.embed(x), p, lb, None, True)

        xa, xb = torch.randn((batch, 3, frame, frame), generator=g).to(dev), (2 * r(batch, 3, frame, frame) - 1).to(dev)
        pa, pb = (frame * r(batch, 2, 2)).to(dev), (frame / 4 + frame / 4 * r(batch, 2, 2)).to(dev)
        ua = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8).to(dev)
        ub = torch.randint(90, 140, (batch, h, w, 3), generator=g, dtype=torch.uint8).to(dev)
        with torch.no_grad():
            ea, eb = net.embed(xa), net.embed(xb)

        def packed(lo, hi):   # 2 points (x, y), their labels, 1 box, in the frame
            p = lo + (hi - lo) * r(batch, 2, 2)
            box = torch.cat([p.min(1).values, p.max(1).values], 1)
            return torch.cat([p.reshape(batch, 4), torch.tensor([[1.0, 0.0]]).expand(batch, 2), box], 1).to(dev)
        pred = PromptPredictor(self)
        prompt = pred.prompt_stage(frame, (frame, frame), (h, w), 2, 1, True)
        with_mask = pred.prompt_stage(frame, (frame, frame), (h, w), 2, 1, True, mask=True)
        s = low_res_side(frame, int(self.STRIDE))
        ma = (20 * r(batch, 1, s, s) - 10).to(dev)
        mb = torch.randn((batch, 1, s, s), generator=g).to(dev)
        cases = [("network", network, (xa, pa, lab), (xb, pb, lab)),
                 (f"image-stage {h}x{w}->{frame}", pred.encoder_stage(frame), (ua,), (ub,)),
                 (f"prompt-stage {h}x{w}", prompt, (*ea, packed(0, frame)), (*eb, packed(10, frame / 2))),
                 (f"prompt-stage+mask {h}x{w}", with_mask, (*ea, packed(0, frame), ma),
                  (*eb, packed(10, frame / 2), mb))]
        if self.has_video:
            from ...tasks.segment_prompt.video import VideoPropagator
            prop = VideoPropagator(self, [])
            with torch.no_grad():
                fa, fb = net.frame_features(xa[:1]), net.frame_features(xb[:1])
                mem = net.track_step(*fa, None, None, None, None, pa[:1], lab[:1].long(), True)[3:]
            hw = mem[0].shape[0]

            def bank(scale, n=1):   # 7 remembered frames and 16 object pointers of n objects
                m = (scale * torch.randn((7 * hw, n, mem[0].shape[-1]), generator=g)).to(dev)
                return (m.to(mem[0].dtype), torch.randn(m.shape, generator=g).to(dev),
                        torch.randn((16, n, 1, net.hidden_dim), generator=g).to(dev),
                        torch.tensor([20.0] + [float(d) for d in range(1, 16)], device=dev))
            cases += [("video-step (full bank)", prop._track_stage(), (*fa, *bank(1.0)), (*fb, *bank(0.5))),
                      ("video-step (full bank, 3 objects)", prop._track_stage(), (*fa, *bank(1.0, 3)),
                       (*fb, *bank(0.5, 3))),
                      (f"video-frame-stage {h}x{w}", prop._frame_stage(), (ua[:1],), (ub[:1],))]
        return cases

    # ------------------------------------------------------------------- video
    def track(self, source: Any, **kwargs: Any) -> Any:
        """Propagate prompted objects through a video: ``model.track("clip.mp4", points=[[x, y]],
        labels=[1], frame=0)`` (or ``boxes=``, or ``mask=``; several objects or later refinements
        with ``prompts=[{"frame": 0, "id": 1, "points": ...}, ...]``). One Results per frame with
        ``Results.masks`` (a :class:`~libreyolo.tasks.segment_prompt.video.TrackMasks`: one mask
        per object, its id and object score); ``stream=True`` yields them, ``save=True`` writes
        the overlaid video. See :mod:`libreyolo.tasks.segment_prompt.video`."""
        from ...tasks.segment_prompt.video import track_video
        return track_video(self, source, **kwargs)


class Sam2(Sam2Family):
    """SAM 2.1 (Hiera image encoder, FPN neck, SAM 2's prompt encoder and mask decoder; memory
    attention, memory encoder and object pointers for video), sizes tiny, small, base-plus, large,
    on transformers' ``Sam2Model`` / ``Sam2VideoModel``."""

    FAMILY = "sam2"
    SIZES = ("tiny", "small", "base-plus", "large")
    FILE_PREFIX = "LibreSAM2"
    SIGNATURE_KEYS = ("no_memory_embedding", "vision_encoder.backbone.pos_embed_window",
                      "mask_decoder.conv_s0.weight")

    @classmethod
    def image_network(cls, size: str, frame: int) -> nn.Module:
        from .nn import Sam2ImageNet
        return Sam2ImageNet(size, frame)

    @classmethod
    def video_network(cls, size: str, frame: int) -> nn.Module:
        from .nn import Sam2VideoNet
        return Sam2VideoNet(size, frame)
