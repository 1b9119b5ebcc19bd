"""Each family reproduces its LibreYOLO architecture fixtures (relative L2 <= 1e-4, fp32)."""
import json

import pytest
import torch
from conftest import FIXTURES_DIR
from fill import fill_state_dict
from rows import FIXTURE_BOUNDARY_TIES, FIXTURE_FORWARD, FIXTURE_TASK, FIXTURES, SLOW_FIXTURES, SNIFFED_AS

from libreyolo import LibreYOLO
from libreyolo.models.registry import get_family
from libreyolo.weights import save_checkpoint

#: rows.FIXTURES, the large networks' rows (rows.SLOW_FIXTURES) marked slow
ROWS = [pytest.param(*row, marks=pytest.mark.slow) if row[2] in SLOW_FIXTURES else row for row in FIXTURES]


def flatten(out, prefix=""):
    """Dotted path -> leaf; a non-tensor leaf (ppyoloe's, yolonas' per-level anchor counts) is kept as it is."""
    if not isinstance(out, (dict, list, tuple)):
        return {prefix or "output": out}
    items = out.items() if isinstance(out, dict) else enumerate(out)
    flat = {}
    for k, v in items:
        flat.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return flat


def run_fixture(net, pt):
    """``net(input)`` flattened, plus the output of each ``hook:<module>`` the fixture pins."""
    caught, hooks = {}, []
    for path in pt["outputs"]:
        if path.startswith("hook:"):
            mod = net.get_submodule(path[len("hook:"):])
            hooks.append(mod.register_forward_hook(lambda m, i, o, p=path: caught.__setitem__(p, o)))
    try:
        with torch.no_grad():
            out = flatten(net(pt["input"], **pt.get("extra_inputs", {})))   # mobilesam: its point prompt
    finally:
        for h in hooks:
            h.remove()
    return {**out, **caught}


def forward_of(net, name):
    """The module whose output the fixture stores (a sub-network for two-network families)."""
    sub = FIXTURE_FORWARD.get(name)
    return getattr(net, sub) if sub else net


def load_fixture(name):
    fx = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    pt = torch.load(FIXTURES_DIR / f"{name}.pt", weights_only=True)
    sd = fill_state_dict(fx["layout"], constants=pt["constants"], tied=fx["tied"])
    return fx, pt, sd


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def sampled_values(value, ref, rows=None):
    """Our values at a sampled output's flat indices (README: ``outputs_sampled``); with ``rows``
    (reference query -> our query, batch 1) each index's query is read from its matched row."""
    idx = ref["idx"].long()
    if rows is None:
        return value.reshape(-1)[idx]
    per_row = value[0][0].numel()
    return value[0].reshape(value.shape[1], per_row)[rows[idx // per_row], idx % per_row]


def assert_reproduces(out, ref_outputs, fx, sampled=None):
    """Each output within relative L2 1e-4; for DETR fixtures whose tolerance_note allows it, the
    documented order-free comparison when the element-wise one fails (top-k over tied scores):
    rows = cat(pred_logits[0], pred_boxes[0] or pred_keypoints[0]), each reference row matched to its
    nearest row of ours. ``sampled``: outputs stored as a fixed sample (the .pt's ``outputs_sampled``)."""
    sampled = sampled or {}
    errs = {path: rel_err(out[path], ref) for path, ref in ref_outputs.items()}
    errs.update({path: rel_err(sampled_values(out[path], ref), ref["values"]) for path, ref in sampled.items()})
    if all(e <= 1e-4 for e in errs.values()):
        return
    per_query = [k for k in ("pred_boxes", "pred_keypoints") if k in ref_outputs]
    # per-query outputs outside the matched rows (DETR masks): compared under the same matching
    riders = [k for k in ("pred_masks",) if k in ref_outputs]
    if "order-free" not in fx.get("tolerance_note", "") or not set(sampled) <= {"pred_masks"} \
            or set(ref_outputs) != {"pred_logits", *per_query, *riders} or len(per_query) != 1:
        raise AssertionError(f"element-wise errors {errs}")
    nc = ref_outputs["pred_logits"].shape[-1]
    second = per_query[0]
    width = ref_outputs[second].shape[-1]
    ours = torch.cat((out["pred_logits"][0], out[second][0]), -1).double()
    ref = torch.cat((ref_outputs["pred_logits"][0], ref_outputs[second][0]), -1).double()
    dist = torch.cdist(ref, ours)
    match = dist.argmin(1)
    # rows matched both ways; a fixture with an exact tie at its selection boundary may differ in
    # that many queries (FIXTURE_BOUNDARY_TIES), which are left out
    mutual = dist.argmin(0)[match] == torch.arange(len(ref))
    ties = FIXTURE_BOUNDARY_TIES.get(fx.get("name"), 0)
    assert int((~mutual).sum()) <= ties, (int((~mutual).sum()), "rows without a mutual match", ties)
    keep = mutual if ties else torch.ones_like(mutual)
    matched = ours[match][keep]
    ref = ref[keep]
    for name, cols in (("pred_logits", slice(0, nc)), (second, slice(nc, nc + width))):
        err = ((matched[:, cols] - ref[:, cols]).norm() / ref[:, cols].norm()).item()
        assert err <= 1e-4, (name, err, "order-free")
    for name in riders:
        r = ref_outputs[name][0][keep].double()
        err = ((out[name][0][match][keep].double() - r).norm() / r.norm()).item()
        assert err <= 1e-4, (name, err, "order-free")
    for name, r in sampled.items():
        at = keep[r["idx"].long() // out[name][0][0].numel()]
        v = r["values"][at].double()
        err = ((sampled_values(out[name], r, match)[at].double() - v).norm() / v.norm()).item()
        assert err <= 1e-4, (name, err, "order-free, sampled")


@pytest.mark.parametrize("family,size,name", ROWS)
def test_network_reproduces_fixture(family, size, name):
    fx, pt, sd = load_fixture(name)
    net = get_family(family).for_task(FIXTURE_TASK.get(name)).build_network(size, fx["checkpoint_metadata"]["nc"])
    assert [list(v.shape) for v in net.state_dict().values()] == [s for _, s, _ in fx["layout"]]
    assert list(net.state_dict()) == [n for n, _, _ in fx["layout"]], "checkpoint key order differs"
    assert sum(p.numel() for p in net.parameters()) == fx["num_parameters"]
    net.load_state_dict(sd, strict=True)
    net.eval()
    out = run_fixture(forward_of(net, name), pt)
    assert set(pt["outputs"]) | set(pt.get("outputs_sampled", {})) <= set(out)
    assert_reproduces(out, pt["outputs"], fx, pt.get("outputs_sampled"))
    for path, value in fx.get("non_tensor_outputs", {}).items():   # e.g. YOLO-NAS's anchors per level
        assert out[path] == value, (path, out.get(path), value)


@pytest.mark.parametrize("family,size,name", ROWS)
def test_checkpoint_in_fixture_layout_loads_through_factory(tmp_path, family, size, name):
    """A LibreYOLO-layout file (metadata as in the fixture) loads unchanged and reproduces."""
    fx, pt, sd = load_fixture(name)
    meta = {k: v for k, v in fx["checkpoint_metadata"].items() if k != "names_count"}
    path = save_checkpoint({"model": sd, **meta}, tmp_path / "weights.pt")
    model = LibreYOLO(str(path), device="cpu")
    assert (model.FAMILY, model.size, model.nc) == (family, size, meta["nc"])
    out = run_fixture(forward_of(model.model, name), pt)
    assert_reproduces(out, pt["outputs"], fx, pt.get("outputs_sampled"))


@pytest.mark.parametrize("family,size,name", ROWS)
def test_family_and_size_sniffed_from_bare_state_dict(tmp_path, family, size, name):
    """No metadata and an anonymous file name: the state-dict keys and shapes decide."""
    _, pt, sd = load_fixture(name)
    path = tmp_path / "anonymous.pt"
    torch.save({"model": sd}, path)
    model = LibreYOLO(str(path), device="cpu")
    # layouts shared by several families (D-FINE / DEIM / RT-DETRv4) read as one documented family
    assert (model.FAMILY, model.size) == (SNIFFED_AS.get(family, family), size)
