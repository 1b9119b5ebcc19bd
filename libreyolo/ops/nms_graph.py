"""Fixed-shape, sync-free NMS on the GPU, so post-processing can live inside the captured graph.

torchvision's CUDA ``nms`` builds its overlap bitmask on the device, then copies it to the
host and walks it there: a device synchronization per call, which a CUDA graph cannot
contain. That walk is the only sequential part of greedy NMS, and it is short (at most
``max_nms`` steps over candidates already sorted by score), so here it runs on the device:
one Triton kernel computes every pair's suppression bit in parallel (a later candidate of the
same class whose IoU with an earlier one exceeds the threshold), and a second, one program
per image, walks the candidates in score order, 32 at a time, and ORs the bit rows of the
kept ones into its ``removed`` words. That is exactly greedy NMS (the suppression rule and
the IoU formula ``inter / (area_i + area_j - inter)`` are torchvision's). Class awareness
compares class ids instead of offsetting boxes, which also avoids the rounding of large
offsets.

The result is fixed-shape: (B, max_det, 6) rows ``[x1, y1, x2, y2, score, cls]`` in score
order plus a (B,) count, written by the walk itself (each kept candidate's rank is its row;
the walk stops once max_det are kept). With ``with_index`` each row has a seventh value, the
kept candidate's position among the sorted candidates, for the tasks whose candidates carry
more than a box (instance segmentation's mask coefficients, pose's keypoints). ``conf`` and ``iou`` are read from a small device
tensor, so one captured graph serves every threshold.
Without Triton or off the GPU, :func:`available` is False and the caller uses
:func:`libreyolo.ops.nms.nms_per_image` (torchvision) instead.
"""
from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of torch; a CPU-only install may lack it
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None

#: the largest candidate count per image: the walk's program holds its 512 words of removed
#: bits and a 32-row tile of suppression bits (32 x 512 words over 8 warps) in registers. It
#: covers every anchor of a 640 px YOLO head (8,400), so validation's NMS fits at that size.
MAX_CANDIDATES = 16384


def available(device: torch.device) -> bool:
    """True when the fixed-shape NMS can run on ``device``."""
    return triton is not None and torch.device(device).type == "cuda"


if triton is not None:
    @triton.jit
    def _overlap_bits_kernel(boxes_ptr, cls_ptr, thr_ptr, bits_ptr, K, W,
                             AGNOSTIC: tl.constexpr, BLOCK_R: tl.constexpr):
        """bits[b, r, w] bit j = candidate r suppresses candidate 32*w + j (later, same class, IoU > thr).

        Every pair of the K candidates: the walk reads only the rows and columns of the ones
        above ``conf`` (a prefix: they are sorted), so nothing here needs their count.
        """
        b = tl.program_id(0)
        rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        w = tl.program_id(2)
        lane = tl.arange(0, 32)
        cols = w * 32 + lane
        rlive = rows < K
        clive = cols < K
        base = boxes_ptr + b * K * 4
        rx1 = tl.load(base + rows * 4 + 0, mask=rlive, other=0.0)
        ry1 = tl.load(base + rows * 4 + 1, mask=rlive, other=0.0)
        rx2 = tl.load(base + rows * 4 + 2, mask=rlive, other=0.0)
        ry2 = tl.load(base + rows * 4 + 3, mask=rlive, other=0.0)
        cx1 = tl.load(base + cols * 4 + 0, mask=clive, other=0.0)
        cy1 = tl.load(base + cols * 4 + 1, mask=clive, other=0.0)
        cx2 = tl.load(base + cols * 4 + 2, mask=clive, other=0.0)
        cy2 = tl.load(base + cols * 4 + 3, mask=clive, other=0.0)
        iw = tl.maximum(tl.minimum(rx2[:, None], cx2[None, :]) - tl.maximum(rx1[:, None], cx1[None, :]), 0.0)
        ih = tl.maximum(tl.minimum(ry2[:, None], cy2[None, :]) - tl.maximum(ry1[:, None], cy1[None, :]), 0.0)
        inter = iw * ih
        area_r = (rx2 - rx1) * (ry2 - ry1)
        area_c = (cx2 - cx1) * (cy2 - cy1)
        iou = inter / (area_r[:, None] + area_c[None, :] - inter)
        hit = (iou > tl.load(thr_ptr + 1)) & (cols[None, :] > rows[:, None]) & rlive[:, None] & clive[None, :]
        if not AGNOSTIC:
            rc = tl.load(cls_ptr + b * K + rows, mask=rlive, other=-1)
            cc = tl.load(cls_ptr + b * K + cols, mask=clive, other=-2)
            hit = hit & (rc[:, None] == cc[None, :])
        word = tl.sum(hit.to(tl.int64) << lane[None, :].to(tl.int64), axis=1).to(tl.int32)
        tl.store(bits_ptr + (b * K + rows) * W + w, word, mask=rows < K)

    @triton.jit
    def _bit_or(a, b):
        return a | b

    @triton.jit
    def _walk_select_kernel(bits_ptr, thr_ptr, boxes_ptr, scores_ptr, cls_ptr, out_ptr, K, W, MAX_DET, ROW,
                            NMS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
                            COLS: tl.constexpr = 6):
        """The sequential part of greedy NMS and the selection, one program per image.

        Walks the sorted candidates 32 at a time. With ``NMS``, one load brings the block's 32
        rows of suppression bits; the block is resolved in registers (candidate j, unless
        already removed, removes the later block-mates its diagonal word names: 32 dependent
        bit operations, no memory wait); then the rows of the block's kept candidates are
        OR-ed into ``removed`` in one reduction. Exactly the candidate-by-candidate walk, with
        two memory round trips per 32 candidates instead of one per kept candidate. Without
        ``NMS`` (set-prediction heads) every candidate above ``conf`` is kept.
        Each kept candidate's rank (kept ones before it) is its output row while below
        ``MAX_DET``: its box, score and class are written there directly; the image's row of
        ``out`` (``ROW`` floats) ends with the count, and the rows past it are zeroed. The walk
        stops once ``MAX_DET`` are kept: later candidates could not be written.
        ``COLS`` 7 (:func:`select_packed`'s ``with_index``) adds each kept row's candidate
        position as a seventh value; 6, the default, compiles exactly the six-value walk.
        The count above ``conf`` (the walk's length) is taken here first, one pass over K scores.
        """
        b = tl.program_id(0)
        words = tl.arange(0, BLOCK_W)
        lane = tl.arange(0, 32)
        conf = tl.load(thr_ptr)
        ks = tl.arange(0, BLOCK_K)
        n = tl.sum((tl.load(scores_ptr + b * K + ks, mask=ks < K, other=0.0) > conf).to(tl.int32), axis=0)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            n += tl.sum((tl.load(scores_ptr + b * K + k0 + ks, mask=k0 + ks < K, other=0.0) > conf).to(tl.int32),
                        axis=0)
        removed = tl.zeros((BLOCK_W,), dtype=tl.int32)
        total = n * 0
        c = n * 0
        out = out_ptr + b * ROW
        while (c * 32 < n) & (total < MAX_DET):
            rows = c * 32 + lane
            live = rows < n
            if NMS:
                tile = tl.load(bits_ptr + (b * K + rows[:, None]) * W + words[None, :],
                               mask=live[:, None] & (words[None, :] < W), other=0)
                cur = tl.sum(tl.where(words == c, removed, 0), axis=0)
                for j in tl.static_range(32):
                    dj = tl.load(bits_ptr + (b * K + c * 32 + j) * W + c, mask=c * 32 + j < n, other=0)
                    cur = tl.where(((cur >> j) & 1) == 0, cur | dj, cur)
                kept = (((cur >> lane) & 1) == 0) & live
                removed = removed | tl.reduce(tl.where(kept[:, None], tile, 0), 0, _bit_or)
            else:
                kept = live
            k32 = kept.to(tl.int32)
            rank = total + tl.cumsum(k32, 0) - 1
            put = kept & (rank < MAX_DET)
            src = b * K + rows
            for f in tl.static_range(4):
                tl.store(out + rank * COLS + f, tl.load(boxes_ptr + src * 4 + f, mask=put, other=0.0), mask=put)
            tl.store(out + rank * COLS + 4, tl.load(scores_ptr + src, mask=put, other=0.0), mask=put)
            tl.store(out + rank * COLS + 5, tl.load(cls_ptr + src, mask=put, other=0).to(tl.float32), mask=put)
            if COLS == 7:
                tl.store(out + rank * COLS + 6, rows.to(tl.float32), mask=put)
            total += tl.sum(k32, axis=0)
            c += 1
        num = tl.minimum(total, MAX_DET)
        for r in range(num * COLS, MAX_DET * COLS, 32):
            tl.store(out + r + lane, tl.zeros((32,), dtype=tl.float32), mask=r + lane < MAX_DET * COLS)
        tl.store(out + MAX_DET * COLS, num.to(tl.float32))


def select_packed(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, thresholds: torch.Tensor,
                  max_det: int, *, nms: bool = True, agnostic: bool = False, with_index: bool = False) -> torch.Tensor:
    """Sorted candidates -> one (B, max_det * 6 + 1) float32 tensor per batch: each image's kept
    detections ``[x1, y1, x2, y2, score, cls]`` in score order (zero rows after them), then
    their count. Fixed shape, no host synchronization: it runs inside the captured stage and
    reaches the host in one copy.

    ``with_index=True``: rows of seven values ``[x1, y1, x2, y2, score, cls, index]``, a
    (B, max_det * 7 + 1) tensor, ``index`` being the kept candidate's position in the sorted
    candidates (exact as float32: at most :data:`MAX_CANDIDATES`), so that a task gathers what
    else its candidates carry (mask coefficients, keypoints) for the kept rows. The rows past
    the count are zero (index 0). Without it (the default) the kernels and the output are
    exactly the six-value ones.

    ``thresholds`` is a float32 device tensor ``[conf, iou]``. ``nms=False`` (set-prediction
    heads) keeps every candidate above ``conf``. Two kernels (one without NMS): the pairwise
    suppression bits in parallel (as torchvision's CUDA kernel builds them), and the walk
    that counts the candidates above ``conf``, keeps and writes (one program per image).
    """
    bsz, k = scores.shape
    if nms and k > MAX_CANDIDATES:
        raise ValueError(f"at most {MAX_CANDIDATES} candidates per image, got {k}")
    boxes = boxes.float().contiguous()
    scores = scores.float().contiguous()
    cls = cls.contiguous()
    if with_index and k > 2 ** 24:   # pragma: no cover - far above any head's candidates
        raise ValueError(f"candidate positions above 2**24 are not exact in float32, got {k} candidates")
    w = triton.cdiv(k, 32)
    cols = 7 if with_index else 6
    row = int(max_det) * cols + 1
    out = torch.empty((bsz, row), dtype=torch.float32, device=scores.device)
    if nms:
        bits = torch.empty((bsz, k, w), dtype=torch.int32, device=scores.device)
        block_r = 32
        _overlap_bits_kernel[(bsz, triton.cdiv(k, block_r), w)](boxes, cls, thresholds, bits, k, w,
                                                                AGNOSTIC=bool(agnostic), BLOCK_R=block_r)
        block_w = max(32, triton.next_power_of_2(w))
    else:
        bits, block_w = out, 32  # not read
    _walk_select_kernel[(bsz,)](bits, thresholds, boxes, scores, cls, out, k, w, int(max_det), row,
                                NMS=bool(nms), BLOCK_W=block_w, BLOCK_K=1024, COLS=cols,
                                num_warps=1 if block_w <= 32 else 4 if block_w <= 128 else 8)
    return out


def select_detections(boxes: torch.Tensor, scores: torch.Tensor, cls: torch.Tensor, thresholds: torch.Tensor,
                      max_det: int, *, nms: bool = True, agnostic: bool = False,
                      with_index: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`select_packed` unpacked: (B, max_det, 6) detections in score order (7 values a row
    ``with_index``) and (B,) int64 counts."""
    packed = select_packed(boxes, scores, cls, thresholds, max_det, nms=nms, agnostic=agnostic, with_index=with_index)
    return packed[:, :-1].unflatten(1, (int(max_det), 7 if with_index else 6)), packed[:, -1].long()
