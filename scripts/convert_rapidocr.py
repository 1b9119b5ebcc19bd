"""PP-OCRv4 mobile weights from the ``rapidocr_onnxruntime`` wheel -> a LibreYOLO ``ppocr`` checkpoint.

Test-only: the wheel (``rapidocr_onnxruntime==1.4.4``, Apache-2.0, the ``test`` extra) ships
PaddleOCR's PP-OCRv4 mobile detector and recognizer as ONNX files, the recognizer's dictionary in
its metadata. Nothing is downloaded: the files are read from the installed wheel.

The ONNX graphs are PaddleOCR's inference export: each learnable re-parameterizable layer of
PP-LCNetV3 is already merged into one conv with bias (its learnable affine kept as a Mul and an
Add by scalars). The mapping walks both graphs in execution order - the ONNX nodes that carry
weights (Conv, ConvTranspose, BatchNormalization, MatMul [+ Add], scalar Mul + Add = the affine,
vector Mul + Add after a normalization = LayerNorm) against the modules our network calls - and
requires every kind and shape to agree. A merged conv goes into the layer's first kxk branch
with an identity BatchNorm carrying the bias; the other branches, the 1x1 branch and the
identity branch are zeroed, so the layer computes the merged conv (and ``fuse()`` gives it back).

The checkpoint records ``ppocr_version: "v4"`` and the alphabet (``charset``: blank, the
dictionary, space - 6,625 classes), so the classifier is built to that size.

    python scripts/convert_rapidocr.py out.pt      # writes LibrePPOCRt-ocr layout, v4 weights
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


def wheel_models() -> tuple[Path, Path]:
    """The detector and recognizer ONNX files of the installed ``rapidocr_onnxruntime`` wheel."""
    import rapidocr_onnxruntime
    root = Path(rapidocr_onnxruntime.__file__).parent / "models"
    det, rec = root / "ch_PP-OCRv4_det_infer.onnx", root / "ch_PP-OCRv4_rec_infer.onnx"
    for p in (det, rec):
        if not p.is_file():
            raise FileNotFoundError(f"{p} is not in the installed rapidocr_onnxruntime wheel (1.4.4 ships it)")
    return det, rec


# --------------------------------------------------------------------------------- ONNX side
def onnx_ops(path: Path) -> tuple[list[tuple[str, list[np.ndarray]]], Any]:
    """The weight-carrying operations of an ONNX graph in node order: (kind, arrays)."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    const = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in nodes if n.op_type == "Constant"}
    const.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    producer = {o: n for n in nodes for o in n.output}

    def const_in(n):
        cs = [const[i] for i in n.input if i in const]
        return cs[0] if len(cs) == 1 else None

    def add_after(n):
        """The constant of the single Add consuming ``n``'s output, if any."""
        nxt = consumers.get(n.output[0], [])
        if len(nxt) == 1 and nxt[0].op_type == "Add":
            return const_in(nxt[0])
        return None

    ops: list[tuple[str, list[np.ndarray]]] = []
    for n in nodes:
        t = n.op_type
        if t in ("Conv", "ConvTranspose"):
            arrays = [const[i] for i in n.input[1:] if i]
            b = add_after(n) if len(arrays) == 1 else None   # a bias exported as a separate Add
            if b is not None and b.size == arrays[0].shape[1 if t == "ConvTranspose" else 0]:
                arrays.append(b.reshape(-1))
            ops.append(("conv" if t == "Conv" else "convT", arrays))
        elif t == "BatchNormalization":
            ops.append(("bn", [const[i] for i in n.input[1:5]]))
        elif t == "MatMul":
            w = const_in(n)
            if w is not None and w.ndim == 2:
                b = add_after(n)
                ops.append(("linear", [w.T] + ([b] if b is not None else [])))
        elif t == "Mul":
            c, b = const_in(n), add_after(n)
            if c is None or b is None or c.shape != b.shape:
                continue
            src = [producer.get(i) for i in n.input if i not in const]
            if c.size == 1 and b.size == 1:
                ops.append(("affine", [c.reshape(1), b.reshape(1)]))
            elif c.ndim == 1 and src and src[0] is not None and src[0].op_type == "Div":
                ops.append(("ln", [c, b]))
    meta = {p.key: p.value for p in model.metadata_props}
    return ops, meta


# ---------------------------------------------------------------------------------- our side
def module_ops(net: nn.Module, run) -> list[tuple[str, nn.Module]]:
    """Our modules that carry weights, in the order ``run()`` calls them; a re-parameterizable
    layer counts as one conv (its merged form), followed by its affine(s)."""
    from libreyolo.models.ppocr.nn import Affine, RepLayer
    seen: list[tuple[str, nn.Module]] = []
    inside: list[RepLayer] = []
    kinds = {nn.Conv2d: "conv", nn.ConvTranspose2d: "convT", nn.BatchNorm2d: "bn", nn.Linear: "linear",
             nn.LayerNorm: "ln", Affine: "affine"}

    def pre(mod, _):
        if isinstance(mod, RepLayer):
            seen.append(("rep", mod))
            inside.append(mod)
            return
        if inside and not isinstance(mod, Affine):
            return
        kind = kinds.get(type(mod))
        if kind is not None:
            seen.append((kind, mod))

    def post(mod, _, __):
        if isinstance(mod, RepLayer):
            inside.pop()

    hooks = [m.register_forward_pre_hook(pre) for m in net.modules()]
    hooks += [m.register_forward_hook(post) for m in net.modules() if isinstance(m, RepLayer)]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def _set(p: torch.Tensor, a: np.ndarray, what: str) -> None:
    t = torch.from_numpy(np.array(a, copy=True)).to(p.dtype)
    if tuple(t.shape) != tuple(p.shape):
        raise ValueError(f"{what}: ONNX shape {tuple(t.shape)} vs ours {tuple(p.shape)}")
    p.data.copy_(t)


def _identity_bn(bn: nn.BatchNorm2d, bias: torch.Tensor | np.ndarray | float) -> None:
    """``bn`` as ``x + bias``: weight 1, mean 0, variance 1 - eps."""
    bn.weight.data.fill_(1.0)
    bn.running_mean.zero_()
    bn.running_var.fill_(1.0 - bn.eps)
    bn.bias.data.copy_(torch.as_tensor(bias, dtype=bn.bias.dtype).expand_as(bn.bias))


def load_rep(layer, weight: np.ndarray, bias: np.ndarray) -> None:
    """A merged conv into a re-parameterizable layer: first kxk branch = it, the rest zero."""
    first = layer.conv_kxk[0]
    _set(first.conv.weight, weight, "re-parameterizable layer")
    _identity_bn(first.bn, torch.from_numpy(np.array(bias, copy=True)))
    for branch in list(layer.conv_kxk)[1:] + ([layer.conv_1x1] if layer.conv_1x1 is not None else []):
        branch.conv.weight.data.zero_()
        _identity_bn(branch.bn, 0.0)
    if layer.identity is not None:
        layer.identity.weight.data.zero_()
        layer.identity.bias.data.zero_()
        layer.identity.running_mean.zero_()
        layer.identity.running_var.fill_(1.0)


def load_ops(ours: list[tuple[str, nn.Module]], theirs: list[tuple[str, list[np.ndarray]]], what: str) -> None:
    if len(ours) != len(theirs):
        raise ValueError(f"{what}: {len(theirs)} weight-carrying ONNX nodes vs {len(ours)} of our modules")
    for i, ((kind, mod), (okind, arrays)) in enumerate(zip(ours, theirs)):
        where = f"{what} op {i} ({kind} / ONNX {okind})"
        if kind == "rep":
            if okind != "conv" or len(arrays) != 2:
                raise ValueError(f"{where}: a merged conv with bias expected")
            load_rep(mod, arrays[0], arrays[1])
        elif kind != okind:
            raise ValueError(f"{where}: kinds differ")
        elif kind in ("conv", "convT", "linear"):
            _set(mod.weight, arrays[0], where)
            if (mod.bias is None) != (len(arrays) == 1):
                raise ValueError(f"{where}: bias presence differs")
            if mod.bias is not None:
                _set(mod.bias, arrays[1], where)
        elif kind == "bn":
            for p, a in zip((mod.weight, mod.bias, mod.running_mean, mod.running_var), arrays):
                _set(p, a, where)
        elif kind in ("affine", "ln"):
            a, b = (mod.scale, mod.bias) if kind == "affine" else (mod.weight, mod.bias)
            _set(a, arrays[0], where)
            _set(b, arrays[1], where)


def rapidocr_charset(meta: dict) -> list[str]:
    """RapidOCR's CTC alphabet: blank, the dictionary of the recognizer's metadata, space."""
    if "character" not in meta:
        raise ValueError("the recognizer ONNX file carries no 'character' metadata")
    return ["", *meta["character"].splitlines(), " "]


def convert(det_path: Path | None = None, rec_path: Path | None = None) -> dict:
    """The LibreYOLO checkpoint dict (size ``t``, ``ppocr_version`` v4, its ``charset``)."""
    from libreyolo.models.ppocr.model import PPOCR
    from libreyolo.models.ppocr.nn import PPOCRNet
    if det_path is None or rec_path is None:
        det_path, rec_path = wheel_models()
    det_ops, _ = onnx_ops(det_path)
    rec_ops, meta = onnx_ops(rec_path)
    charset = rapidocr_charset(meta)
    net = PPOCRNet("t", num_classes=len(charset)).eval()
    load_ops(module_ops(net, lambda: net.det(torch.zeros(1, 3, 64, 64))), det_ops, "detector")
    load_ops(module_ops(net, lambda: net.rec(torch.zeros(1, 3, 48, 64))), rec_ops, "recognizer")
    model = PPOCR(net, size="t", nc=1, device="cpu", trained=True, source=str(rec_path),
                  meta={"charset": charset, "ppocr_version": "v4"})
    ckpt = model.checkpoint()
    ckpt["source"] = "rapidocr_onnxruntime 1.4.4: ch_PP-OCRv4_det_infer.onnx, ch_PP-OCRv4_rec_infer.onnx (Apache-2.0)"
    return ckpt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the checkpoint to write (.pt)")
    args = ap.parse_args()
    from libreyolo.weights import save_checkpoint
    print(save_checkpoint(convert(), args.out))


if __name__ == "__main__":
    main()
