"""ONNX export of an image-text model's two towers (CLIP, SigLIP 2).

Two graphs (torch.onnx's TorchScript-based exporter, as the other tasks' exports):

* ``<file>``: ``images`` (B, 3, S, S) float32 RGB in [0, 1] (the family's resize done: S is its
  fixed input size) -> ``embedding`` (B, D), the image tower with the family's mean / std first
  and the L2 normalization last;
* ``<file stem>-text.onnx``: ``input_ids`` (T, L) int64 (``model.tokenize``'s output: CLIP at
  any of its bucketed lengths 16 / 32 / 77, SigLIP 2 at 64) -> ``text_embedding`` (T, D),
  L2-normalized.

Zero-shot logits are ``logit_scale.exp() * embedding @ text_embedding.T`` (+ ``logit_bias`` for
SigLIP 2); both numbers are written into the graphs' metadata (``logit_scale``, ``logit_bias``)
with the family, size, task, classes (and a classify model's prompts), input size, normalization,
tokenizer and token buckets, so a runtime needs nothing else. The image graph's ``parts`` names the
text graph (``{"text": file}``), whose own metadata says ``part: text``; the text graph is written
first, so a reader that finds the image graph finds both. ``LibreYOLO("x.onnx")`` loads the pair
(:class:`libreyolo.export.embed_model.OnnxImageTextModel`). tests/unit/test_embed.py compares both
graphs with eager through onnxruntime, tests/unit/test_embed_onnx.py the loaded model.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class ImageTower(nn.Module):
    def __init__(self, net: nn.Module, mean, std):
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net.encode_image((images - self.mean) / self.std).float(), dim=-1)


class TextTower(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net.encode_text(input_ids).float(), dim=-1)


def text_path(image_path: Path) -> Path:
    """Where the text graph of an image graph written to ``image_path`` goes."""
    return image_path.with_name(image_path.stem + "-text.onnx")


def export_towers(model, file: str | os.PathLike | None = None, *, imgsz: int | None = None, batch: int = 1,
                  dynamic: bool = True, opset: int | None = None, **unsupported) -> Path:
    """Write both towers (module docstring); returns the image graph's path. ``dynamic``: the
    image batch symbolic (the text graph's prompt count and token length always are: prompts
    come in any number, at each bucketed length); ``imgsz`` must be the family's input size."""
    if unsupported:
        raise ValueError(f"{', '.join(sorted(unsupported))}: not options of the {model.FAMILY} tower export "
                         "(it takes file, imgsz, batch, dynamic, opset)")
    size = int(imgsz or model.imgsz)
    if size != model.imgsz:
        raise ValueError(f"{model.FAMILY}-{model.size} takes {model.imgsz}x{model.imgsz} images only (its position "
                         f"embedding is not interpolated), got imgsz={size}")
    from ... import __version__
    from ...export.onnx import FORMAT_VERSION, META_FORMAT, default_path
    path = Path(file) if file is not None else default_path(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = copy.deepcopy(model.model).float().cpu().eval()
    prep = model.preprocess
    prompts = None if model._prompts is None else [list(model._prompts[0]), model._prompts[1]]
    meta = {META_FORMAT: FORMAT_VERSION, "libreyolo_version": __version__, "family": model.FAMILY,
            "size": model.size, "task": model.TASK, "nc": str(model.nc),
            "names": json.dumps({str(k): v for k, v in model.names.items()}), "prompts": json.dumps(prompts),
            "imgsz": str(size), "batch": str(int(batch)), "dynamic": json.dumps(bool(dynamic)), "half": "false",
            "stride": "1", "trained": json.dumps(bool(model.trained)),
            "preprocess": json.dumps(prep.as_dict()), "probs": model.PROBS, "tokenizer": model.TOKENIZER,
            "context_length": str(int(net.context_length)),
            "text_buckets": json.dumps([int(b) for b in model.TEXT_BUCKETS]),
            "logit_scale": repr(float(net.logit_scale.detach().exp().reshape(-1)[0])),
            "logit_bias": repr(float(net.logit_bias.detach().reshape(-1)[0])) if hasattr(net, "logit_bias") else "0.0"}
    mean = prep.mean or (0.0, 0.0, 0.0)
    std = prep.std or (1.0, 1.0, 1.0)
    images = torch.rand((int(batch), 3, size, size), generator=torch.Generator().manual_seed(0))
    ids = model.tokenize(["a photo of a cat", "a diagram"])
    opset = int(opset or 17)
    tp = text_path(path)
    with torch.no_grad():   # the text graph first: a reader that finds the image graph finds both
        _export(TextTower(net).eval(), (ids,), tp, ["input_ids"], ["text_embedding"],
                {"input_ids": {0: "texts", 1: "length"}, "text_embedding": {0: "texts"}},
                opset, {**meta, "part": "text"})
        _export(ImageTower(net, mean, std).eval(), (images,), path, ["images"], ["embedding"],
                {"images": {0: "batch"}, "embedding": {0: "batch"}} if dynamic else None, opset,
                {**meta, "parts": json.dumps({"text": tp.name})})
    return path


def _export(module, args, path: Path, inputs, outputs, axes, opset, meta) -> None:
    import onnx

    from ...atomic import atomic_write
    tmp = path.with_name(f".{path.name}.tmp")
    torch.onnx.export(module, args, str(tmp), input_names=inputs, output_names=outputs, dynamic_axes=axes,
                      opset_version=opset, dynamo=False)
    proto = onnx.load(str(tmp))
    for k, v in meta.items():
        proto.metadata_props.add(key=k, value=v)
    with atomic_write(path, what="export") as f:
        f.write(proto.SerializeToString())
    tmp.unlink(missing_ok=True)
