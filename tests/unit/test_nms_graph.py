"""The in-graph greedy NMS kernel, run on the CPU through Triton's interpreter.

On CUDA the same kernel is compiled; tests/gpu checks it there against torchvision again.
The interpreter needs TRITON_INTERPRET=1 before triton is imported, hence a subprocess.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import torch
    from torchvision.ops import nms
    from libreyolo.ops import nms_graph
    from libreyolo.ops.nms import top_candidates

    def reference(b, s, c, conf, iou, max_det, agnostic):
        n = int((s > conf).sum())
        b, s, c = b[:n], s[:n], c[:n]
        if agnostic:
            keep = nms(b, s, iou)
        else:  # per class, no coordinate offsets, merged by score
            keep = torch.cat([i[nms(b[i], s[i], iou)] for i in (torch.nonzero(c == k).flatten() for k in c.unique())])
            keep = keep[s[keep].argsort(descending=True, stable=True)]
        keep = keep[:max_det]
        return torch.cat((b[keep], s[keep, None], c[keep, None].float()), 1)

    g = torch.Generator().manual_seed(1)
    xy = torch.rand((2, 400, 2), generator=g) * 600
    wh = torch.rand((2, 400, 2), generator=g) * 120 + 4
    cand = top_candidates(torch.cat((xy, xy + wh), -1), torch.rand((2, 400), generator=g),
                          torch.randint(0, 4, (2, 400), generator=g), 150)
    for agnostic in (False, True):
        for conf, iou, max_det in ((0.3, 0.45, 100), (0.6, 0.6, 7), (0.99, 0.5, 10)):
            dets, count = nms_graph.select_detections(*cand, torch.tensor([conf, iou]), max_det, agnostic=agnostic)
            assert dets.shape == (2, max_det, 6) and count.shape == (2,)
            for i in range(2):
                ref = reference(cand[0][i], cand[1][i], cand[2][i], conf, iou, max_det, agnostic)
                n = int(count[i])
                assert n == ref.shape[0], (agnostic, conf, i, n, ref.shape)
                assert torch.equal(dets[i, :n], ref), (agnostic, conf, i)
                assert not dets[i, n:].any()
    # dense clusters across many 32-candidate blocks (1100 candidates: 35 words, the wide-walk path)
    centers = torch.rand((1, 20, 2), generator=g) * 500
    xy = centers[:, torch.randint(0, 20, (1100,), generator=g)] + torch.randn((1, 1100, 2), generator=g) * 6
    wh = torch.rand((1, 1100, 2), generator=g) * 30 + 40
    many = top_candidates(torch.cat((xy, xy + wh), -1), torch.rand((1, 1100), generator=g),
                          torch.randint(0, 2, (1, 1100), generator=g), 1100)
    for agnostic in (False, True):
        for conf, iou in ((0.0, 0.5), (0.3, 0.8)):
            dets, count = nms_graph.select_detections(*many, torch.tensor([conf, iou]), 1100, agnostic=agnostic)
            ref = reference(many[0][0], many[1][0], many[2][0], conf, iou, 1100, agnostic)
            assert 1 < ref.shape[0] < 1000 and int(count[0]) == ref.shape[0], (ref.shape, count)
            assert torch.equal(dets[0, :ref.shape[0]], ref)
    # the walk stops once max_det are kept: max_det at and just past a 32-candidate block's tally
    first_block = int((reference(many[0][0], many[1][0], many[2][0], 0.0, 0.5, 1100, False)[:, 4]
                       >= many[1][0, 31]).sum())
    for max_det in (first_block, first_block + 1, first_block + 2):
        dets, count = nms_graph.select_detections(*many, torch.tensor([0.0, 0.5]), max_det)
        ref = reference(many[0][0], many[1][0], many[2][0], 0.0, 0.5, max_det, False)
        assert int(count[0]) == ref.shape[0] == max_det and torch.equal(dets[0], ref), max_det
    # NaN scores (a broken half network) rank last: the walk reads the conf-passing prefix, which
    # NaN at the head of a row would have emptied; the result is that of the real candidates alone
    xy = torch.rand((2, 400, 2), generator=g) * 600
    wh = torch.rand((2, 400, 2), generator=g) * 120 + 4
    raw_b, raw_s, raw_c = torch.cat((xy, xy + wh), -1), torch.rand((2, 400), generator=g), \
        torch.randint(0, 4, (2, 400), generator=g)
    broken = raw_s.clone()
    broken[:, ::7] = float("nan")
    keep = ~torch.isnan(broken[0])
    cand_nan = top_candidates(raw_b, broken, raw_c, 400)
    cand_ref = top_candidates(raw_b[:1, keep], raw_s[:1, keep], raw_c[:1, keep], 400)
    dets, count = nms_graph.select_detections(*cand_nan, torch.tensor([0.3, 0.5]), 100)
    ref = reference(cand_ref[0][0], cand_ref[1][0], cand_ref[2][0], 0.3, 0.5, 100, False)
    assert int(count[0]) == ref.shape[0] > 0 and torch.equal(dets[0, :ref.shape[0]], ref)
    # set-prediction heads: no suppression, only conf and max_det
    dets, count = nms_graph.select_detections(*cand, torch.tensor([0.5, 0.5]), 20, nms=False)
    assert torch.equal(count, torch.minimum((cand[1] > 0.5).sum(1), torch.tensor(20)))
    assert torch.equal(dets[0, :20, 4], cand[1][0, :20])
    print("OK")
''')


def test_greedy_nms_kernel_equals_torchvision_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]


INDEX_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from torchvision.ops import nms
    from libreyolo.ops import nms_graph
    from libreyolo.ops.nms import top_candidates

    def ref_index(b, s, c, conf, iou, max_det, agnostic, nms_free=False):
        """torchvision's kept candidates (per class, no coordinate offsets, merged by score)."""
        n = int((s > conf).sum())
        if nms_free or n == 0:
            return torch.arange(min(n, max_det))
        b, s, c = b[:n], s[:n], c[:n]
        if agnostic:
            keep = nms(b, s, iou)
        else:
            keep = torch.cat([i[nms(b[i], s[i], iou)] for i in (torch.nonzero(c == k).flatten() for k in c.unique())])
            keep = keep[s[keep].argsort(descending=True, stable=True)]
        return keep[:max_det]

    g = torch.Generator().manual_seed(3)
    def boxes(n, k):
        xy = torch.rand((n, k, 2), generator=g) * 300
        return torch.cat((xy, xy + torch.rand((n, k, 2), generator=g) * 100 + 4), -1)
    raw_b, raw_s, raw_c = boxes(2, 300), torch.rand((2, 300), generator=g), torch.randint(0, 3, (2, 300), generator=g)
    cand = top_candidates(raw_b, raw_s, raw_c, 150)
    broken = raw_s.clone()
    broken[:, ::5] = float("nan")          # NaN scores rank last: never kept, never named
    cand_nan = top_candidates(raw_b, broken, raw_c, 150)
    cases = [(cand, 0.3, 0.45, 100, False, False), (cand, 0.5, 0.6, 7, True, False),
             (cand, 0.999, 0.5, 10, False, False), (cand_nan, 0.3, 0.5, 100, False, False),
             (cand, 0.5, 0.5, 20, False, True), (cand_nan, 0.2, 0.5, 200, False, True)]
    if "wide" in sys.argv:   # 1100 candidates in clusters: 35 words of bits, the wide walk
        centers = torch.rand((1, 20, 2), generator=g) * 500
        xy = centers[:, torch.randint(0, 20, (1100,), generator=g)] + torch.randn((1, 1100, 2), generator=g) * 6
        many = top_candidates(torch.cat((xy, xy + torch.rand((1, 1100, 2), generator=g) * 30 + 40), -1),
                              torch.rand((1, 1100), generator=g), torch.randint(0, 2, (1, 1100), generator=g), 1100)
        cases = [(many, 0.0, 0.5, 1100, False, False), (many, 0.3, 0.8, 50, True, False)]
    for src, conf, iou, max_det, agnostic, free in cases:
        thr = torch.tensor([conf, iou])
        six, count6 = nms_graph.select_detections(*src, thr, max_det, agnostic=agnostic, nms=not free)
        packed = nms_graph.select_packed(*src, thr, max_det, agnostic=agnostic, nms=not free, with_index=True)
        assert packed.shape == (src[1].shape[0], max_det * 7 + 1)
        seven, count = packed[:, :-1].unflatten(1, (max_det, 7)), packed[:, -1].long()
        assert torch.equal(count, count6) and torch.equal(seven[..., :6], six), (conf, free)
        for i in range(src[1].shape[0]):
            n = int(count[i])
            ref = ref_index(src[0][i], src[1][i], src[2][i], conf, iou, max_det, agnostic, free)
            assert n == ref.numel() and (n > 0 or conf > 0.9), (conf, i, n)
            idx = seven[i, :n, 6]
            assert torch.equal(idx, idx.round()) and torch.equal(idx.long(), ref), (conf, i)
            k = idx.long()   # each row is its candidate's box, score and class
            assert torch.equal(seven[i, :n, :4], src[0][i][k]) and torch.equal(seven[i, :n, 4], src[1][i][k])
            assert torch.equal(seven[i, :n, 5], src[2][i][k].float())
            assert not seven[i, n:].any()
    print("OK")
''')


def run_index_script(*args):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", INDEX_SCRIPT, *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]


def test_select_with_index_names_torchvisions_kept_candidates():
    """``with_index=True``: the same six values and count as the default call, and a seventh
    value, the kept candidate's position, equal to torchvision's keep (NMS, NaN scores, and the
    nms=False walk of set-prediction heads)."""
    run_index_script()


@pytest.mark.slow
def test_select_with_index_on_the_wide_walk():
    run_index_script("wide")
