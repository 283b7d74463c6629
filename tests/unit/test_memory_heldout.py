"""The memory model's held-out validation on fixture records: the splits, the fit from
scratch (reproducible, and recovering constants the fixtures were made with), the scores, the
margin per technique family, and the margin and the optimizer step's cached blocks in
``fits``. Fixture records are built here from the model itself, never from committed evidence."""

import random

import pandas as pd
import pytest

from llmbench import memory
from llmbench.memory import constants as C, heldout
from llmbench.memory.fit import UNFITTED, Row, applied, fit_from_scratch, merged, stated
from llmbench.memory.model import GIB, Prediction, Workload, family, predict
from llmbench.models import ModelSpec

L7 = ModelSpec.load("llama2-7b")
LORA = {"kind": "lora", "rank": 64, "target_modules": ["q_proj", "v_proj"]}


def w(technique, batch_size=1, gpus=1, **kw):
    adapter = LORA if technique.startswith(("L", "QL")) else None
    return Workload(model=L7, technique=technique, batch_size=batch_size, seq_len=350, gpus=gpus, adapter=adapter,
                    **kw)


def made(workload, truth, started=None, status="ok"):
    """A fixture record whose measured peak is the model's under the ``truth`` constants."""
    with applied(truth):
        p = predict(workload)
    return Row(workload=workload, status=status, measured_gib=p.gpu_gib, reserved_gib=None, rss_gib=None,
               platform="h100", started=started)


#: the fixtures' "true" constants: the unfitted ones but for two scales
TRUTH = merged(UNFITTED, {"deepspeed": {"act_scale": 1.1}, "zero3_act_scale": 1.4})


@pytest.fixture(scope="module")
def records():
    """Full-parameter F+Z2 and Z3 rows on 8 GPUs (batch 2-6: the forward/backward
    pass sets their peak) and LoRA rows, batch by batch: each batch's three started together,
    the smaller batches first."""
    rows = []
    for b in range(2, 7):
        for cell in (w("F+Z2", b, gpus=8), w("Z3", b, gpus=8), w("L", b)):
            rows.append(made(cell, TRUTH, started=f"2026-01-{b:02d}"))
    return rows


@pytest.mark.parametrize("technique, gpus, backend, expected", [
    ("Naive", 1, "deepspeed", "naive"), ("F+C", 1, "deepspeed", "naive"), ("Z2", 2, "deepspeed", "zero2"),
    ("F+R+Z2", 2, "deepspeed", "recompute"), ("R+Z3", 2, "deepspeed", "zero3"), ("Z3+O", 2, "deepspeed", "offload"),
    ("Q", 1, "deepspeed", "4-bit"), ("L+Z3+O", 2, "deepspeed", "lora"), ("QL+R", 1, "deepspeed", "qlora"),
    ("Naive", 2, "megatron", "megatron"),
])
def test_each_cell_takes_the_first_family_that_applies(technique, gpus, backend, expected):
    cell = Workload(model=L7, technique=technique, batch_size=1, seq_len=350, gpus=gpus, backend=backend,
                    adapter=LORA if "L" in technique.split("+")[0] else None)
    assert family(cell) == expected and predict(cell).family == expected
    assert expected in memory.FAMILIES


def test_the_time_split_fits_the_earlier_records_and_never_cuts_through_one_start_time():
    rows = [Row(workload=w("L", b), status="ok", measured_gib=1.0, reserved_gib=None, rss_gib=None, platform="h100",
                started=t) for b, t in enumerate(["2026-01-03", "2026-01-01", "2026-01-02", "2026-01-02", None,
                                                   "2026-01-04"], start=1)]
    (fold,) = heldout.time_folds(rows, share=0.5)
    # the earliest half is 01-01 and 01-02; the other 01-02 goes with it; the undated one is in neither
    assert fold.train == (1, 2, 3) and fold.test == (0, 5) and fold.cutoff == "2026-01-03"
    assert heldout.time_folds(rows[:1], share=0.5) == []  # nothing to hold out
    with pytest.raises(ValueError, match="share"):
        heldout.time_folds(rows, share=1.0)


def test_the_family_split_leaves_out_each_family_once(records):
    folds = heldout.family_folds(records)
    assert [f.label for f in folds] == ["lora", "zero3", "zero2"]
    for f in folds:
        assert {family(records[i].workload) for i in f.test} == {f.label}
        assert f.label not in {family(records[i].workload) for i in f.train}
        assert sorted(f.train + f.test) == list(range(len(records)))


def test_the_fit_recovers_the_constants_the_records_were_made_with(records):
    got = fit_from_scratch(records)
    assert got["deepspeed"]["act_scale"] == pytest.approx(1.1, rel=1e-6)
    assert got["zero3_act_scale"] == pytest.approx(1.4, rel=1e-6)
    # what no record fits stays unfitted
    assert got["quant4_act_scale"] == UNFITTED["quant4_act_scale"]
    assert got["cached_logits_bytes"] == UNFITTED["cached_logits_bytes"]
    # ZeRO-3's rows fit its own scale, never the backend's (where its scale starts at 1 too)
    only_z3 = fit_from_scratch([r for r in records if r.workload.technique == "Z3"])
    assert only_z3["deepspeed"]["act_scale"] == UNFITTED["deepspeed"]["act_scale"]
    assert only_z3["zero3_act_scale"] == pytest.approx(1.1 * 1.4, rel=1e-6)


def test_the_fit_is_reproducible_in_any_order_and_under_any_constants_in_force(records):
    first, again = fit_from_scratch(records), fit_from_scratch(records)
    assert first == again
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    other = merged(stated(), {"deepspeed": {"act_scale": 2.0}, "zero3_act_scale": 0.5})
    with applied(other):
        assert C.ZERO3_ACT_SCALE == 0.5
        moved = fit_from_scratch(shuffled)
    assert C.ZERO3_ACT_SCALE == stated()["zero3_act_scale"]  # restored after the block
    assert moved["deepspeed"]["act_scale"] == pytest.approx(first["deepspeed"]["act_scale"], rel=1e-9)
    assert moved["zero3_act_scale"] == pytest.approx(first["zero3_act_scale"], rel=1e-9)


def test_a_family_left_out_is_predicted_without_its_own_constant(records):
    recs, _ = heldout.score(records, heldout.family_folds(records))
    by = recs.set_index("fold")
    # LoRA, held out, takes act_scale from the F+Z2 rows: exact here
    assert by.loc["lora", "error_pct"].abs().max() < 1e-6
    # ZeRO-3, held out, keeps its activations unscaled (1 for the true 1.4): under-predicted,
    # the more the larger the batch
    z3 = by.loc["zero3"].set_index("batch_size")["error_pct"]
    assert (z3 < 0).all() and z3.is_monotonic_decreasing


def test_the_time_split_scores_the_later_records_with_constants_from_the_earlier(records):
    (fold,) = heldout.time_folds(records, share=0.6)
    recs, _ = heldout.score(records, [fold])
    assert set(recs["batch_size"]) == {5, 6} and len(recs) == len(fold.test) == 6
    # the earlier batches fit every constant the later ones need: exact
    assert recs["error_pct"].abs().max() < 1e-6 and (recs["training_rows"] == len(fold.train)).all()


def _scored(split, fam, shortfalls, share=0.9):
    return [{"split": split, "family": fam, "reserved_shortfall_pct": s, "reserved_share": share,
             "error_pct": -s, "reserved_error_pct": -s, "training_rows": 100} for s in shortfalls]


def test_the_margin_per_family_is_the_held_out_shortfalls_95th_percentile_with_a_floor_and_a_default():
    df = pd.DataFrame(
        _scored("time", "lora", [float(i) for i in range(21)])  # 0..20 %: the 95th percentile is 19 %
        + _scored("family", "lora", [50.0] * 20)  # the time split answers first
        + _scored("time", "zero3", [-3.0] * 20)  # over-predicted: the floor
        + _scored("family", "qlora", [8.0] * 12)  # no later records: the family split answers
        + _scored("time", "4-bit", [30.0] * 9)  # too few
        + _scored("time", "megatron", [40.0] * 20, share=0.5))  # far from the limit: not counted
    m = heldout.margins(df, min_rows=10, floor=0.05, default=0.05).set_index("family")
    assert m.loc["lora", "margin"] == pytest.approx(0.19) and m.loc["lora", "source"] == "time"
    assert m.loc["zero3", "margin"] == 0.05 and m.loc["zero3", "source"] == "time"
    assert m.loc["qlora", "margin"] == pytest.approx(0.08) and m.loc["qlora", "source"] == "family"
    assert m.loc["4-bit", "source"] == "default" and m.loc["megatron", "source"] == "default"
    assert set(m.index) == set(memory.FAMILIES)


def test_the_summary_has_a_row_per_split_and_family_and_one_for_all():
    df = pd.DataFrame(_scored("time", "lora", [1.0, 2.0, 3.0]) + _scored("family", "zero3", [4.0]))
    s = heldout.summary(df).set_index(["split", "family"])
    assert list(s.index) == [("time", "lora"), ("time", "all"), ("family", "zero3"), ("family", "all")]
    assert s.loc[("time", "lora"), "rows"] == 3 and s.loc[("time", "lora"), "alloc_median_signed_pct"] == -2.0
    assert s.loc[("time", "lora"), "reserved_median_abs_pct"] == 2.0


def test_fits_takes_the_familys_margin_unless_one_is_given(monkeypatch):
    monkeypatch.setattr(C, "FAMILY_MARGINS", {"qlora": 0.1})
    p = Prediction(gpu_gib=75.0, host_gib=1.0, phase="forward-backward", family="qlora")
    assert not memory.fits(p, 80)[0]  # 75 x 1.1 > 80
    assert "margin 0.1" in memory.fits(p, 80)[1]
    assert memory.fits(p, 80, margin=0.05)[0]
    other = Prediction(gpu_gib=75.0, host_gib=1.0, phase="forward-backward", family="zero3")
    assert memory.fits(other, 80)[0] and memory.margin_for("zero3") == C.MARGIN  # 75 x 1.05 <= 80


def test_zero2s_step_keeps_the_whole_bf16_gradients_reserved():
    n = L7.param_counts()["total"]
    p = predict(w("Z2", gpus=2))
    assert p.terms["cached_step"] == pytest.approx(2 * n / GIB)
    assert p.reserved_gib >= p.terms["states_step"] + 2 * n / GIB
    for tech, gpus in (("Z2+O", 2), ("Z3", 2), ("Naive", 1)):
        assert predict(w(tech, gpus=gpus)).terms["cached_step"] == 0
    lora = predict(w("L+Z2", gpus=2))
    assert 0 < lora.terms["cached_step"] < 0.1  # the adapters' gradients only
