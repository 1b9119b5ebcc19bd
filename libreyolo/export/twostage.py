"""The tasks whose predict runs two networks with host work between them, exported as two ONNX graphs.

* OCR (PP-OCR): ``<stem>.onnx`` is the DB detector (:class:`~libreyolo.export.onnx.RawGraph`: the
  sigmoid shrink map, ``out0`` (B, 1, H, W)); ``<stem>.rec.onnx`` is the CTC recognizer
  (:class:`RecGraph`: uint8 text-line crops (B, 48, W, 3) and their valid widths (B,) int32 -> the
  per-step class probabilities (B, W/8, C)), batch and width symbolic. Between and after them
  :class:`OnnxOcrModel` runs the OCR task's own host code: the binarization, the DB boxes, the
  reading order, the crops and their batching by width, and the greedy CTC decode.
* Promptable segmentation (MobileSAM): ``<stem>.onnx`` is the image encoder
  (:class:`~libreyolo.export.onnx.PromptImageGraph`); ``<stem>.decoder.onnx`` the prompt encoder
  and mask decoder (:class:`PromptDecoderGraph`: embeddings, points (B, P, 2), labels (B, P),
  boxes (B, K, 4) in the frame's pixels -> the four mask tokens' low-resolution logits
  (B, 4, S/4, S/4) and predicted IoUs (B, 4)), batch, P and K symbolic. :class:`OnnxPromptModel`
  runs the task's own predictor (:class:`~libreyolo.tasks.segment_prompt.predictor.PromptPredictor`:
  prompt checks and mapping, the mask post-processing) with the two sessions as its stages.
  SAM, SAM 2, EdgeTAM and SAM 3 export the same way: the image graph outputs every map of the
  family's image stage (SAM 2-style: two high-resolution skip features, then the embedding), the
  decoder graph (:class:`SamDecoderGraph`, :class:`MapsDecoderGraph`) takes them all plus the
  prompts and answers both ways (multimask and single-mask); PicoSAM3, which has no prompt
  decoder, is refused by name.

The first graph's metadata names the second (``parts``: ``{"rec": file}`` or ``{"decoder": file}``,
beside it); the second is written first, so a reader that finds the first finds both. Each second
graph is run once at export at other shapes than the traced ones (another batch and width; a
prompt without boxes, one without points) next to the PyTorch module, and refused if it disagrees.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .onnx import OnnxExportError, trace_graph, write_atomic
from .onnx_model import OnnxModel, Ready

#: the second graph's role per task, and the suffix of its file (``<stem><suffix>``)
PARTS = {"ocr": ("rec", ".rec.onnx"), "segment-prompt": ("decoder", ".decoder.onnx")}


# ------------------------------------------------------------------------------------ graphs
class RecGraph(nn.Module):
    """crops (B, 48, W, 3) uint8 RGB, widths (B,) int32 -> CTC probabilities (B, W/8, C):
    ``PPOCR.infer_rec`` (BGR order, [-1, 1], mid-grey right of each line's width, the recognizer)."""

    def __init__(self, model, net: nn.Module):
        super().__init__()
        self.net = net
        twin = copy.copy(model)
        twin.model = net
        self.rec = twin.infer_rec

    def forward(self, crops, widths):
        return self.rec(crops, widths)


class PromptDecoderGraph(nn.Module):
    """embeddings (B, 256, s, s), points (B, P, 2), labels (B, P) float, boxes (B, K, 4) in the
    ``size`` frame's pixels -> low-resolution mask logits (B, 4, 4s, 4s), IoU predictions (B, 4).

    ``MobileSAMNet.decode`` without its last step, the choice of tokens (1-3 with ``multimask``,
    else 0), which the loader makes: both choices from one graph. Points and boxes are both graph
    inputs, so the prompt encoder's "boxes present" branch is the traced one: a prompt without
    boxes gets SAM's padding point (label -1) from the loader and K = 0, one without points P = 0.
    """

    def __init__(self, net: nn.Module, size: int):
        super().__init__()
        self.net, self.size = net, int(size)

    def forward(self, embeddings, points, labels, boxes):
        b, _, h, w = embeddings.shape
        enc = self.net.prompt_encoder
        sparse = enc(points, labels, boxes, b, self.size)
        src = embeddings + enc.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(b, -1, h, w)
        pe = enc.pe_layer.grid(h, w).unsqueeze(0)
        return self.net.mask_decoder(src, pe, sparse)


class SamDecoderGraph(nn.Module):
    """SAM (transformers' modules): embeddings (B, 256, s, s), points (B, P, 2), labels (B, P),
    boxes (B, K, 4) in the frame's pixels -> the multimask answer (logits (B, 3, 4s, 4s), IoU
    (B, 3)) and the single-mask one ((B, 1, 4s, 4s), (B, 1)): ``SamNet.decode`` both ways.
    Points and boxes are both inputs, so the "boxes present" branch is traced (no padding point
    added: the loader appends SAM's padding point when a prompt has no box, K = 0)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, embeddings, points, labels, boxes):
        net = self.net
        b, c, h, w = embeddings.shape
        enc = net.prompt_encoder
        sparse = torch.cat([enc._embed_points(points[:, None], labels[:, None].to(points.dtype), pad=False),
                            enc._embed_boxes(boxes).reshape(b, 1, -1, c)], dim=2)
        dense = enc.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(b, -1, h, w)
        pe = net.image_pe(h, w).expand(b, -1, -1, -1)
        out: list[torch.Tensor] = []
        for multimask in (True, False):
            masks, iou = net.mask_decoder(embeddings, pe, sparse, dense, multimask)
            out += [masks[:, 0], iou[:, 0]]
        return tuple(out)


class MapsDecoderGraph(nn.Module):
    """SAM 2, EdgeTAM, SAM 3 (transformers' modules): the image stage's maps (the high-resolution
    skip features, then the embedding (B, 256, s, s)), points (B, P, 2), labels (B, P), boxes
    (B, K, 4) (K <= 1, the prompt encoder pairs one box with the points) in the frame's pixels ->
    the multimask answer (logits (B, 3, 4s, 4s), IoU (B, 3)) and the single-mask one ((B, 1, 4s,
    4s), (B, 1): SAM 2's choice by stability included): ``PromptableMixin.decode`` both ways. The
    sparse tokens are the prompt encoder's (points, then each box's three tokens), built so that
    P = 0 and K = 0 run in one graph; a prompt without a box gets the padding point (label -1)
    from the loader, as the prompt encoder appends it."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, *args):
        *maps, points, labels, boxes = args
        net, emb = self.net, maps[-1]
        b, c, h, w = emb.shape
        enc = net.prompt_encoder
        sparse = torch.cat([enc._embed_points(points[:, None], labels[:, None].to(torch.int64), pad=False),
                            enc._embed_boxes(boxes).reshape(b, 1, -1, c)], dim=2)
        dense = enc.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(b, -1, h, w)
        pe = net.get_image_wide_positional_embeddings().repeat(b, 1, 1, 1)
        out: list[torch.Tensor] = []
        for multimask in (True, False):
            low, iou, _, _ = net.mask_decoder(image_embeddings=emb, image_positional_embeddings=pe,
                                              sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                              multimask_output=multimask, high_resolution_features=list(maps[:-1]))
            out += [low[:, 0], iou[:, 0]]
        return tuple(out)


def decoder_kind(net: nn.Module) -> str | None:
    """Which prompt-decoder graph a segment-prompt network exports to: ``"maps"`` (SAM 2-style:
    several image maps, transformers' SAM 2 modules), ``"sam"`` (transformers' SAM modules) or
    ``"tokens"`` (MobileSAM's decoder: the four mask tokens, the loader picks); None for a network
    without a prompt encoder and mask decoder (PicoSAM3: one forward per cropped box region)."""
    if hasattr(net, "get_image_wide_positional_embeddings") and hasattr(net, "mask_decoder"):
        return "maps"
    if hasattr(net, "image_pe") and hasattr(net, "sparse_tokens"):
        return "sam"
    if hasattr(net, "prompt_encoder") and hasattr(net, "mask_decoder"):
        return "tokens"
    return None


def part_path(path: Path, task: str) -> Path:
    """The second graph's file beside ``path`` (``<stem>.rec.onnx`` / ``<stem>.decoder.onnx``)."""
    return path.with_name(path.stem + PARTS[task][1])


def export_second_graph(model, net: nn.Module, path: Path, *, size: int, dynamic: bool, half: bool,
                        opset: int) -> dict[str, str]:
    """Write the task's second graph beside ``path``; returns the metadata entries the first
    graph carries (``parts`` and what the loader needs: OCR's alphabet and recognition widths)."""
    if half:
        raise ValueError(f"half=True: the {model.TASK} export writes float32 graphs (its second graph's inputs are "
                         "uint8 crops or prompt coordinates); export with half=False")
    role, _ = PARTS[model.TASK]
    target = part_path(path, model.TASK)
    g = torch.Generator().manual_seed(0)
    if model.TASK == "ocr":
        width = int(model.REC_BUCKETS[min(1, len(model.REC_BUCKETS) - 1)])
        graph: nn.Module = RecGraph(model, net)
        inputs: tuple = (torch.randint(0, 256, (2, 48, width, 3), generator=g, dtype=torch.uint8),
                         torch.tensor([width, width // 2], dtype=torch.int32))
        names, outs = ["crops", "widths"], ["probs"]
        axes = {"crops": {0: "batch", 2: "width"}, "widths": {0: "batch"}, "probs": {0: "batch", 1: "steps"}}
        probes = [(torch.randint(0, 256, (3, 48, width // 2, 3), generator=g, dtype=torch.uint8),
                   torch.tensor([width // 2, 9, width // 4], dtype=torch.int32))]
        extra = {"charset": json.dumps(list(model.charset), ensure_ascii=False),
                 "rec_buckets": json.dumps([int(w) for w in model.REC_BUCKETS])}
    else:
        graph, inputs, names, outs, axes, probes = _prompt_decoder(model, net, size, g)
        extra = {"decoder": decoder_kind(net)}
    proto = trace_graph(model, graph, inputs, names, outs, axes, opset)
    meta = {"libreyolo_format": "1", "family": model.FAMILY, "size": model.size, "task": model.TASK,
            "part": role, "imgsz": str(size)}
    for k, v in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    data = proto.SerializeToString()
    _check_probes(model, graph, data, names, probes)
    write_atomic(data, target)
    return {"parts": json.dumps({role: target.name}), **extra}


def _prompt_decoder(model, net: nn.Module, size: int, g: torch.Generator):
    """(graph, traced inputs, input names, output names, dynamic axes, probes) of a segment-prompt
    family's decoder graph; the image maps' shapes are the image graph's (run once here)."""
    from .onnx import PromptImageGraph, prompt_map_names, prompt_square_frame, prompt_trace_width
    kind = decoder_kind(net)
    if kind is None:
        raise OnnxExportError(f"{model.FAMILY}-{model.size} has no segment-prompt ONNX export: the export writes an "
                              f"image-encoder graph and a prompt-decoder graph, and {model.FAMILY}'s network has no prompt "
                              "encoder or mask decoder (it runs once per box on the cropped region); predict with the "
                              "PyTorch model")
    w = size if prompt_square_frame(model) else prompt_trace_width(model, size)
    with torch.no_grad():
        out = PromptImageGraph(model, net, size)(torch.rand((1, 3, size, w), generator=g))
    maps = out if isinstance(out, tuple) else (out,)
    shapes = [tuple(m.shape[1:]) for m in maps]
    map_names = prompt_map_names(len(maps))

    def emb(b):
        return tuple(torch.randn((b, *s), generator=g) for s in shapes)
    if kind == "tokens":
        graph: nn.Module = PromptDecoderGraph(net, size)
        outs = ["low_res_masks", "iou"]
    else:
        graph = MapsDecoderGraph(net) if kind == "maps" else SamDecoderGraph(net)
        outs = ["low_res_masks", "iou", "low_res_mask_single", "iou_single"]
    # a family's prompt encoder pairs at most one box with the points (SAM 2-style)
    two_boxes = kind != "maps"
    inputs = (*emb(1), size * torch.rand((1, 2, 2), generator=g), torch.tensor([[1.0, 0.0]]),
              torch.tensor([[[size / 8, size / 8, size / 2, size / 2]]]))
    names = [*map_names, "points", "labels", "boxes"]
    axes = {**{n: {0: "batch"} for n in map_names}, "points": {0: "batch", 1: "points"},
            "labels": {0: "batch", 1: "points"}, "boxes": {0: "batch", 1: "boxes"}, **{o: {0: "batch"} for o in outs}}
    e2 = emb(2)
    boxes3 = (torch.tensor([[[0.0, 0.0, size / 4, size / 4], [5.0, 5.0, size - 1.0, size / 2]]]) if two_boxes
              else torch.tensor([[[5.0, 5.0, size - 1.0, size / 2]]]))
    probes = [  # points only (with SAM's padding point), boxes only, three points and a box (two where taken)
        (*e2, size * torch.rand((2, 2, 2), generator=g), torch.tensor([[1.0, -1.0]] * 2), torch.zeros((2, 0, 4))),
        (*(e[:1] for e in e2), torch.zeros((1, 0, 2)), torch.zeros((1, 0)),
         torch.tensor([[[10.0, 20.0, size / 2, size / 3]]])),
        (*(e[1:] for e in e2), size * torch.rand((1, 3, 2), generator=g), torch.tensor([[1.0, 0.0, 1.0]]), boxes3)]
    return graph, inputs, names, outs, axes, probes


def _check_probes(model, graph: nn.Module, data: bytes, names: list[str], probes: list[tuple]) -> None:
    """The second graph at shapes other than the traced ones, next to the module in torch; a
    graph that fails or disagrees is refused (tracing fixes Python values taken from shapes)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    for probe in probes:
        with torch.no_grad():
            ref = graph(*probe)
        ref = ref if isinstance(ref, tuple) else (ref,)
        shapes = ", ".join("x".join(str(d) for d in t.shape) for t in probe)
        try:
            got = sess.run(None, {n: t.numpy() for n, t in zip(names, probe)})
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OnnxExportError(f"{model.FAMILY}-{model.size}: the {model.TASK} export's second graph fails at "
                                  f"inputs {shapes}: {first}") from exc
        for r, o in zip(ref, got):
            r = r.numpy()
            if r.shape != o.shape or np.abs(r - o).max() > 1e-3 * max(1.0, float(np.abs(r).max())):
                raise OnnxExportError(f"{model.FAMILY}-{model.size}: the {model.TASK} export's second graph differs "
                                      f"from the PyTorch module at inputs {shapes}")


# ------------------------------------------------------------------------------------ runtime
class _NowRunner:
    """What the task's host code calls as the model's graph runner (``model.runner(key, fn,
    args, mode, host=..., constant=...)``): here the stage function runs now, its ONNX sessions
    inside; ``host=True`` wraps the outputs as the engine's host copy does."""

    def __call__(self, key: Any, fn, inputs, mode: Any = False, clone: bool = True, host: bool = False,
                 constant: Any = ()) -> Any:
        out = fn(*inputs)
        return Ready(out) if host else out


def _open_part(model: OnnxModel, role: str):
    """The second graph's session, on the first graph's providers; its file is checked to be the
    part the first names (same family, task and role)."""
    from .onnx import read_metadata
    parts = json.loads(model.meta.get("parts", "{}"))
    if role not in parts:
        raise ValueError(f"{model.path} is a {model.TASK} export without its {role} graph in its metadata; "
                         "export it again")
    p = model.path.with_name(parts[role])
    if not p.is_file():
        raise FileNotFoundError(f"{model.path.name} needs its {role} graph {p.name} beside it ({str(p)!r} not found); "
                                "copy both files, or export again")
    meta = read_metadata(p)
    if meta.get("part") != role or meta.get("family") != model.FAMILY or meta.get("task") != model.TASK:
        raise ValueError(f"{p} is not the {role} graph of {model.path.name} (its metadata: family "
                         f"{meta.get('family')!r}, task {meta.get('task')!r}, part {meta.get('part')!r}); export again")
    return model._session(p), p


class OnnxOcrModel(OnnxModel):
    """An OCR export (the detector's ``.onnx`` and the recognizer's ``.rec.onnx`` beside it) with
    the predict API of the PyTorch model: the detector through onnxruntime, then the OCR task's
    host stage with the recognizer's session where the engine runs ``infer_rec``."""

    def __init__(self, path: str | os.PathLike, device: Any = "auto", *, threads: int | None = None):
        super().__init__(path, device, threads=threads)
        self.charset = json.loads(self.meta["charset"])
        self.REC_BUCKETS = tuple(json.loads(self.meta["rec_buckets"]))
        self.runner = _NowRunner()

    def to(self, device: Any) -> OnnxOcrModel:
        super().to(device)
        self.rec_session, self.rec_path = _open_part(self, "rec")
        return self

    def infer_rec(self, crops_u8: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
        """The recognizer graph: (B, 48, W, 3) uint8 lines, (B,) widths -> (B, W/8, C) probabilities."""
        out = self.rec_session.run(None, {"crops": crops_u8.cpu().numpy(),
                                          "widths": widths.cpu().numpy().astype(np.int32)})
        return torch.from_numpy(out[0])

    def _results(self, plan, out: dict[str, np.ndarray], chunk, size: int, speed: dict) -> list:
        n = len(chunk)
        prob = torch.from_numpy(np.ascontiguousarray(out["out0"][:n]))
        thresh = torch.tensor([plan.det_thresh], dtype=torch.float32)   # the engine's cached threshold
        return plan.results(Ready(plan.finish(prob, thresh)), chunk, size, speed)


class OnnxPromptModel(OnnxModel):
    """A promptable-segmentation export (the image encoder's ``.onnx`` and the prompt decoder's
    ``.decoder.onnx`` beside it) with the PyTorch model's predict API (``model(image,
    points=..., labels=..., boxes=..., multimask=...)``, ``set_image``): the task's own predictor
    with the two sessions as its stages."""

    def __init__(self, path: str | os.PathLike, device: Any = "auto", *, threads: int | None = None):
        super().__init__(path, device, threads=threads)
        self.runner = _NowRunner()
        self.AMP_DTYPE = torch.float16
        self._predictor = None

    def to(self, device: Any) -> OnnxPromptModel:
        super().to(device)
        self.decoder_session, self.decoder_path = _open_part(self, "decoder")
        self.decoder_kind = self.meta.get("decoder", "tokens")
        self._map_names = [o.name for o in self.session.get_outputs()]
        self._decoder_inputs = {i.name for i in self.decoder_session.get_inputs()}
        return self

    @property
    def postprocess_masks(self):
        """The family's mask post-processing where it has its own (a family whose images are
        stretched to the frame upsamples straight to the image), else the predictor's default."""
        from ..models.registry import get_family
        post = getattr(get_family(self.FAMILY), "postprocess_masks", None)
        if post is None:
            from ..tasks.segment_prompt.predictor import postprocess_masks as post
        return post

    def infer(self, x: torch.Tensor) -> Any:
        """The image encoder graph: the preprocessed images (longer side, or both sides, the
        frame) -> the embedding, or the family's tuple of maps (SAM 2-style)."""
        if max(int(x.shape[-2]), int(x.shape[-1])) != self.imgsz:
            raise ValueError(f"{self.path.name} embeds images in a {self.imgsz} frame (fixed at export); got an input "
                             f"of {int(x.shape[-2])}x{int(x.shape[-1])}")
        out = self.session.run(None, {"images": x.cpu().numpy().astype(np.float32)})
        maps = tuple(torch.from_numpy(o) for o in out)
        return maps[0] if len(maps) == 1 else maps

    def decode(self, embeddings: Any, points: torch.Tensor | None, labels: torch.Tensor | None,
               boxes: torch.Tensor | None, multimask: bool, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder graph, with the PyTorch model's ``decode`` arguments (one map, or the
        family's tuple of maps) and outputs."""
        maps = tuple(embeddings) if isinstance(embeddings, (tuple, list)) else (embeddings,)
        b = int(maps[-1].shape[0])
        if boxes is not None and self.decoder_kind == "maps" and int(boxes.shape[1]) != 1:
            raise ValueError(f"{self.FAMILY} takes at most one box per prompt (its prompt encoder pairs one box with the "
                             f"points), got {int(boxes.shape[1])}: prompt each box in its own call")
        if points is None:
            pts, lab = np.zeros((b, 0, 2), np.float32), np.zeros((b, 0), np.float32)
        else:
            pts, lab = points.cpu().numpy().astype(np.float32), labels.cpu().numpy().astype(np.float32)
        if boxes is None:
            bx = np.zeros((b, 0, 4), np.float32)
            if points is not None:   # SAM's padding point (label -1), as the prompt encoder appends it
                pts = np.concatenate([pts, np.zeros((b, 1, 2), np.float32)], 1)
                lab = np.concatenate([lab, np.full((b, 1), -1.0, np.float32)], 1)
        else:
            bx = boxes.cpu().numpy().astype(np.float32)
        feeds = {n: m.cpu().numpy() for n, m in zip(self._map_names, maps)}
        feeds.update(points=pts, labels=lab, boxes=bx)
        out = self.decoder_session.run(None, {k: v for k, v in feeds.items() if k in self._decoder_inputs})
        if self.decoder_kind == "tokens":   # the four mask tokens: 1-3 with multimask, else 0
            sel = slice(1, None) if multimask else slice(0, 1)
            return torch.from_numpy(out[0][:, sel]), torch.from_numpy(out[1][:, sel])
        low, iou = (out[0], out[1]) if multimask else (out[2], out[3])
        return torch.from_numpy(low), torch.from_numpy(iou)

    def get_predictor(self):
        if self._predictor is None:
            from ..tasks.segment_prompt.predictor import PromptPredictor
            self._predictor = PromptPredictor(self)
        return self._predictor

    def _check_call(self, kwargs: dict) -> None:
        from ..graphs.runner import normalize_mode
        from ..options import check_imgsz, parse_amp
        if normalize_mode(kwargs.get("cuda_graph", False)) is True:
            raise NotImplementedError(f"cuda_graph=True needs the PyTorch engine; {self.path.name} is an {self.KIND} "
                                      f"model run by {self.BACKEND}")
        if parse_amp(kwargs.get("amp", False)) is not None:
            raise NotImplementedError(f"amp is fixed when an {self.KIND} model is exported ({self.path.name}: float32)")
        if kwargs.get("imgsz") is not None and check_imgsz(kwargs["imgsz"], self.STRIDE) != self.imgsz:
            raise ValueError(f"imgsz={kwargs['imgsz']}, but {self.path.name} embeds images in the {self.imgsz} frame "
                             f"it was exported with; export again with imgsz={kwargs['imgsz']}")

    def predict(self, source: Any = None, **kwargs: Any) -> Any:
        """As ``MobileSAM.predict``: masks for a prompt on ``source``'s images, or on the image of
        :meth:`set_image` when ``source`` is None; ``save`` writes the annotated pictures."""
        from ..models.mobilesam.model import MobileSAM
        self._check_call(kwargs)
        return MobileSAM.predict(self, source, **kwargs)   # type: ignore[arg-type]

    __call__ = predict

    def set_image(self, source: Any, **kwargs: Any) -> OnnxPromptModel:
        """Embed one image now; later prompt calls without an image reuse its embedding."""
        self._check_call(kwargs)
        self.get_predictor().set_image(source, **kwargs)
        return self


#: the loader class per task, where it is not :class:`OnnxModel`
LOADERS = {"ocr": OnnxOcrModel, "segment-prompt": OnnxPromptModel}
