"""Which module makes a CUDA-graph replay differ from eager: every leaf module's output is recorded
(eager twice, to tell a run-to-run nondeterministic op from a capture-only difference, then a
captured replay on the same input) and the first modules that differ are printed.

    PYTHONPATH=. python3 scripts/capture_probe.py ppocr t --stage det --amp fp16 --imgsz 320
    PYTHONPATH=. python3 scripts/capture_probe.py ppocr t --stage rec --amp fp16
    PYTHONPATH=. python3 scripts/capture_probe.py segformer b0 --stage train-loss

``--stage train-loss`` compares the training-mode loss of a semantic model (eager twice, replay) and
lists the ops torch reports as nondeterministic (``torch.use_deterministic_algorithms(warn_only)``)."""
from __future__ import annotations

import argparse
import warnings

import torch

from libreyolo import LibreYOLO

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def leaf_outputs(net: torch.nn.Module, store: list):
    """Forward hooks appending (name, type, clone of each tensor output) of every leaf module."""
    handles = []
    for name, mod in net.named_modules():
        if any(True for _ in mod.children()):
            continue

        def hook(mod, args, out, name=name):
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for k, o in enumerate(outs):
                if torch.is_tensor(o):
                    store.append((f"{name}[{k}]", type(mod).__name__, o.detach().clone()))
        handles.append(mod.register_forward_hook(hook))
    return handles


def run(fn, x, amp):
    with torch.no_grad(), torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None,
                                         cache_enabled=False):
        return fn(x)


def probe(net, fn, x, amp, label):
    rec = [[], [], []]
    for k in (0, 1):
        h = leaf_outputs(net, rec[k])
        run(fn, x, amp)
        for handle in h:
            handle.remove()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run(fn, x, amp)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    h = leaf_outputs(net, rec[2])
    with torch.cuda.graph(g):
        run(fn, x, amp)
    for handle in h:
        handle.remove()
    g.replay()
    torch.cuda.synchronize()
    print(f"== {label}: {len(rec[0])} leaf outputs", flush=True)
    for k, what in ((1, "eager run 2"), (2, "graph replay")):
        bad = [(a[0], a[1], (a[2].float() - b[2].float()).abs().max().item())
               for a, b in zip(rec[0], rec[k]) if not torch.equal(a[2], b[2])]
        print(f"  {what} vs eager run 1: {len(bad)} differing outputs", flush=True)
        for name, typ, d in bad[:8]:
            print(f"    {name} ({typ}) max|diff| {d:.3e}", flush=True)


def train_loss(model):
    data = model.task_def.resolve_data("shapes-seg")
    _, val, collate = model.task_def.datasets(data, 128, model, model.task_def.Options())
    imgs, masks = collate([val[j] for j in range(8)])
    x, masks = imgs.cuda().float().div_(255), masks.cuda()
    net = model.model.train()
    loss_fn = model.build_loss().cuda()
    prep = model.preprocess

    def step(x, m):
        loss, _ = loss_fn(model.train_forward(net, prep.normalize(x), m), m)
        return loss.detach()
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = [step(x, masks) for _ in range(2)]
    torch.use_deterministic_algorithms(False)
    ops = sorted({str(w.message).split(" does not have a deterministic")[0] for w in caught
                  if "deterministic" in str(w.message)})
    print("nondeterministic ops reported in the forward:", ops, flush=True)
    logits = model.train_forward(net, prep.normalize(x), masks).float().detach()
    for red in ("sum via nll_loss2d", "none then .sum()"):
        vals = []
        for _ in range(6):
            if red.startswith("sum"):
                vals.append(torch.nn.functional.cross_entropy(logits, masks, ignore_index=255, reduction="sum"))
            else:
                vals.append(torch.nn.functional.cross_entropy(logits, masks, ignore_index=255, reduction="none").sum())
        same = all(torch.equal(vals[0], v) for v in vals[1:])
        print(f"cross_entropy {red}: six runs equal {same} ({vals[0].item():.9f})", flush=True)
    print(f"loss eager twice equal {torch.equal(*losses)}", flush=True)


def verify_nonfinite(model, size, amp):
    """The failing cases of ``libreyolo verify`` at ``amp``, with the count of non-finite outputs
    (NaN never equals itself under torch.equal) and whether the bit patterns agree."""
    from libreyolo.engine.verify import _probes_float, input_sensitive, verify_model
    results = verify_model(model, imgsz=size, batches=(1,), amp_dtypes=(amp,))
    for r in results:
        print(f"{r.name}: passed {r.passed}", flush=True)
    twin = input_sensitive(model)
    net = twin.model.eval()
    for k, x in enumerate(_probes_float(1, size, model.device)):
        recs = []
        h = leaf_outputs(net, recs)
        with torch.no_grad(), torch.autocast("cuda", dtype=amp):
            out = twin.infer(x)
        for handle in h:
            handle.remove()
        first = next(((n, t) for n, t, o in recs if not torch.isfinite(o.float()).all()), None)
        print(f"probe {'ab'[k]}: output non-finite {int((~torch.isfinite(out.float())).sum())} of {out.numel()};"
              f" first leaf with non-finite values: {first}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("family")
    ap.add_argument("size")
    ap.add_argument("--stage", default="det", choices=("det", "rec", "net", "train-loss", "verify"))
    ap.add_argument("--amp", default="fp16", choices=tuple(DTYPES))
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--cudnn-deterministic", action="store_true")
    a = ap.parse_args()
    if a.cudnn_deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    model = LibreYOLO.new(a.family, a.size, device="cuda", seed=0)
    if a.stage == "train-loss":
        return train_loss(model)
    if a.stage == "verify":
        return verify_nonfinite(model, a.imgsz, DTYPES[a.amp])
    net = model.model.eval()
    amp = DTYPES[a.amp]
    g = torch.Generator().manual_seed(1)
    if a.stage == "rec":
        rec = net.rec
        x = torch.rand(1, 3, 48, 320, generator=g).cuda()
        probe(rec, rec, x, amp, f"{a.family}-{a.size} rec {a.amp} 48x320")
    else:
        sub = net.det if a.stage == "det" and hasattr(net, "det") else net
        x = torch.rand(1, 3, a.imgsz, a.imgsz, generator=g).cuda()
        probe(sub, sub, x, amp, f"{a.family}-{a.size} {a.stage} {a.amp} {a.imgsz}"
              + (" cudnn-deterministic" if a.cudnn_deterministic else ""))


if __name__ == "__main__":
    main()
