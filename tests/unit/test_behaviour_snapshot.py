"""Predictions and a short training run stay bitwise what they were.

``scripts/behaviour_snapshot.py`` computes SHA-256 fingerprints of the predict outputs of a fixed set
of models and images (Python API and ``libreyolo predict``), of the seeded initialisation, and of
two 2-epoch training runs (``results.csv`` without its wall times, ``last.pt``'s weights); the
reference is ``tests/fixtures/behaviour_snapshot.json``. A refactor must leave every entry equal.

The reference may only be regenerated for an INTENDED behaviour change, named in the commit that
regenerates it:

    python scripts/behaviour_snapshot.py write

``python scripts/behaviour_snapshot.py compare`` lists the entries that differ. The bits depend on the
torch version and the CPU's vector instructions; where they differ from the reference's, the tests
skip (regenerate on the reference's environment, or compare before/after on one machine with
``write`` on the old code and ``compare`` on the new).

The training part takes about a minute on two cores, so it is marked ``slow`` (LIBREYOLO_SLOW=1).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _snapshot_module():
    spec = importlib.util.spec_from_file_location("behaviour_snapshot", ROOT / "scripts" / "behaviour_snapshot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


snap = _snapshot_module()


def _check(part: str) -> None:
    ref = snap.load_reference()
    here = snap.environment()
    if ref["environment"] != here:
        pytest.skip(f"the reference was written under {ref['environment']}; this is {here}")
    expected = {k: v for k, v in ref["entries"].items() if k.split("/", 1)[0] == part}
    assert expected, f"the reference has no {part!r} entries"
    bad = snap.differences(expected, snap.snapshot((part,)))
    assert not bad, (f"{len(bad)} of {len(expected)} {part} entries changed:\n" + "\n".join(bad[:40])
                     + "\n(regenerate the reference only for an intended change: "
                       "python scripts/behaviour_snapshot.py write)")


def test_predict_outputs_bitwise_unchanged():
    _check("predict")


def test_cli_predict_files_bitwise_unchanged():
    _check("cli")


@pytest.mark.slow
def test_training_run_bitwise_unchanged():
    _check("train")


def test_differences_names_every_changed_missing_and_new_entry():
    ref = {"a": "1", "b": "2", "c": "3"}
    lines = snap.differences(ref, {"a": "1", "b": "9", "d": "4"})
    assert lines == ["differs: b  (reference 2, now 9)", "missing: c", "new:     d"]


def test_results_csv_drops_only_wall_time_columns(tmp_path):
    p = tmp_path / "results.csv"
    p.write_text("epoch,train/box_loss,lr/pg0,time/epoch_s,time/val_s\n1,0.5,0.01,3.2,0.4\n")
    assert snap.results_csv_without_times(p) == "epoch,train/box_loss,lr/pg0\n1,0.5,0.01\n"
