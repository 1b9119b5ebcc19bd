"""Candidate selection and class-aware NMS for a batch.

Two halves: :func:`top_candidates` is fixed-shape (a per-image top-k by score), so it runs
inside the captured inference graph; :func:`nms_per_image` is data-dependent and runs
eager on the few hundred survivors. Capping the candidates per image (``max_nms``) bounds
the cost of torchvision's NMS, whose CUDA kernel builds an n x n overlap mask and walks it
on the host: on 8,400 candidates that alone costs milliseconds.

Where the survivors are few (the usual predict case) the sorted candidates are packed into
one tensor and copied to the host once, and torchvision's CPU ``nms`` runs there: one device
synchronization instead of one per image plus the kernel launches of the CUDA NMS and the
final copy. Many survivors (validation at ``conf=0.001``) take the CUDA path. Both paths
call the same torchvision operator on the same numbers.
"""
from __future__ import annotations

import torch

from ..device import require_torch_pair

#: above this many survivors (whole batch) NMS runs on the device instead of the host
HOST_NMS_LIMIT = 3000


def nan_last(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` with NaN as -inf (infinities kept): what a descending sort should put last."""
    return scores.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))


def top_candidates(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, k: int):
    """(B, N, 4), (B, N), (B, N) -> the same for the ``k`` best-scoring anchors, sorted descending.

    One full sort and its first ``k``: on the GPU that is one segmented sort where ``topk``
    runs a radix selection and then sorts its result, so the one sort is the cheaper of the
    two. Equal scores may come in either
    order; eager and graph run the same kernels, so they agree.

    A NaN score (a network whose numbers broke, e.g. a half copy out of float16's range) is
    ranked as -inf: torch's sort puts NaN above every number, and since no NaN passes a
    ``> conf`` test, NaN candidates at the head of a row would push real ones out of the
    conf-passing prefix that NMS reads (the device walk would stop at the first). ``-inf``
    sorts them last and no threshold admits them. One elementwise kernel, the same in eager
    and in the graph.
    """
    k = min(int(k), scores.shape[1])
    s, idx = nan_last(scores).sort(dim=1, descending=True)
    s, idx = s[:, :k], idx[:, :k]
    b = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, boxes.shape[-1]))
    return b, s, cls.gather(1, idx)


def nms_per_image(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, *, conf: float = 0.25,
                  iou: float = 0.45, max_det: int = 300, classes: list[int] | None = None,
                  agnostic: bool = False, nms_free: bool = False,
                  host_limit: int = HOST_NMS_LIMIT) -> torch.Tensor:
    """Sorted candidates (from :func:`top_candidates`) -> CPU float32 (K, 7) [image, x1, y1, x2, y2, conf, cls].

    Rows are grouped by image (ascending) and sorted by confidence within an image. The
    candidates passing ``conf`` are a prefix of each row (they are sorted). Each image costs
    one torchvision ``nms`` call, made class-aware by offsetting boxes per class.
    ``nms_free=True`` (set-prediction heads) keeps the prefix without suppression.
    """
    if boxes.device.type == "cpu":
        return _select(boxes.float(), scores.float(), cls, conf, iou, max_det, classes, agnostic, nms_free)
    # one packed copy to the host: boxes, score and class (exact as float for class ids < 2**24)
    packed = torch.cat((boxes.float(), scores.float()[..., None], cls.float()[..., None]), -1).cpu()
    counts = (packed[..., 4] > conf).sum(1)
    if nms_free or int(counts.sum()) <= host_limit:
        return _select(packed[..., :4], packed[..., 4], packed[..., 5].long(), conf, iou, max_det, classes,
                       agnostic, nms_free, counts)
    return _select(boxes.float(), scores.float(), cls, conf, iou, max_det, classes, agnostic, nms_free,
                   counts).cpu()


def _select(boxes, scores, cls, conf, iou, max_det, classes, agnostic, nms_free, counts=None) -> torch.Tensor:
    # imported at the first call: torchvision's import pulls in torch._dynamo (seconds of a
    # process's start), and a detection training run never calls this
    require_torch_pair()   # one message naming both versions, not torchvision's own
    from torchvision.ops import nms
    if counts is None:
        counts = (scores > conf).sum(1)
    out = []
    for i, n in enumerate(counts.tolist()):
        if n == 0:
            continue
        b, s, c = boxes[i, :n], scores[i, :n], cls[i, :n]
        if classes is not None:
            keep_cls = torch.isin(c, torch.as_tensor(classes, device=c.device, dtype=c.dtype))
            b, s, c = b[keep_cls], s[keep_cls], c[keep_cls]
            if s.numel() == 0:
                continue
        if nms_free:
            keep = torch.arange(min(s.numel(), max_det), device=b.device)
        elif agnostic:
            keep = nms(b, s, iou)[:max_det]
        else:
            keep = nms(b + (c.to(b.dtype) * (b.max() + 1))[:, None], s, iou)[:max_det]
        out.append(torch.cat((torch.full((keep.numel(), 1), float(i), device=b.device), b[keep],
                              s[keep, None], c[keep, None].to(b.dtype)), 1))
    if not out:
        return torch.zeros((0, 7))
    return torch.cat(out).cpu()
