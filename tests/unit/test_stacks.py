"""The stacks table (llmbench.report.stacks): FSDP2's cells beside DeepSpeed's of the same
method, the ratio paired as the verdicts pair, DeepSpeed's out-of-memory cell shown as '-'."""

import pandas as pd
import pytest

from llmbench.report import catalog, stacks


def row(backend, tech, runs, *, pset=None, machine="m1", run="r1", status="ok", mem=10.0, gpus=1, mfu_fp8=None):
    vals = [float(x) for x in runs]
    return {"stage": "pretrain", "platform": "h200", "gpus": gpus, "model": "llama2-7b", "technique": tech,
            "batch_size": 1, "backend": backend, "status": status, "kind": "cell",
            "tokens_per_s_mean": sum(vals) / len(vals) if vals else None,
            "tokens_per_s_runs": ";".join(str(v) for v in vals), "mfu": 0.02, "peak_mem_allocated_gib": mem,
            "peak_mem_reserved_gib": mem + 1, "run": run, "machine": machine, "paired_set": pset,
            "record_path": f"{run}/{backend}/{tech}", "mfu_fp8_peak": mfu_fp8}


def test_fsdp2_beside_deepspeed_pairs_rounds_of_one_set_and_says_which():
    tidy = pd.DataFrame([
        row("deepspeed", "Z3", [500, 480, 490], pset="s", machine="m1", run="a", mem=107.0),
        row("fsdp2", "Z3", [1000, 1000, 1000], pset="s", machine="m1", run="a", mem=101.0),
    ])
    # a second DeepSpeed Z3 record on another machine, superseded: the set's own one is chosen
    superseded = pd.DataFrame([row("deepspeed", "Z3", [250, 250], machine="m2", run="b")])
    df = stacks.build(tidy, superseded)
    r = df.iloc[0]
    assert r.pairing == "set" and r.deepspeed_run == "a"
    per_round = [1000 / 500, 1000 / 480, 1000 / 490]
    assert r.ratio == pytest.approx((per_round[0] * per_round[1] * per_round[2]) ** (1 / 3))
    assert r.ratio_lo < r.ratio < r.ratio_hi
    assert r.memory_ratio == pytest.approx(101.0 / 107.0)


def test_a_set_resumed_on_another_machine_pairs_only_the_rounds_of_one_machine():
    ds = row("deepspeed", "Z3", [500, 480, 490], pset="s", machine="m1+m2", run="a")
    fs = row("fsdp2", "Z3", [1000, 900, 1000], pset="s", machine="m1+m2", run="a")
    ds["repeat_machines"], fs["repeat_machines"] = "m2;m1;m1", "m1;m1;m1"  # DeepSpeed's round 0 ran elsewhere
    r = stacks.build(pd.DataFrame([ds, fs])).iloc[0]
    assert r.pairing == "set"
    assert r.ratio == pytest.approx((900 / 480 * 1000 / 490) ** 0.5)


def test_another_machines_deepspeed_cell_is_paired_across_machines_and_an_oom_shows_as_dash():
    tidy = pd.DataFrame([
        row("deepspeed", "R+Z3", [420, 430], machine="m2", run="b"),
        row("fsdp2", "R+Z3", [800, 760], machine="m1", run="a"),
        row("deepspeed", "Z2", [], status="oom", machine="m1", run="a"),
        row("fsdp2", "Z2", [1180, 1190], machine="m1", run="a"),
    ])
    df = stacks.build(tidy).set_index("technique")
    assert df.loc["R+Z3", "pairing"] == "machines"
    assert df.loc["Z2", "deepspeed_status"] == "oom" and pd.isna(df.loc["Z2", "ratio"])
    shown = stacks.table(df.reset_index()).parts[0].frame.set_index("Method")
    assert shown.loc["Z2", "DeepSpeed tok/s/GPU"] == "- (out of memory)"
    assert shown.loc["R+Z3", "FSDP2 tok/s/GPU"].startswith("780.0")


def test_the_table_is_in_the_catalog_and_empty_without_fsdp2_cells():
    assert catalog.get("table", "stacks").reads == ("tidy", "superseded")
    df = stacks.build(pd.DataFrame([row("deepspeed", "Z3", [500, 480])]))
    assert df.empty and list(df.columns) == stacks.COLUMNS


def test_an_fp8_cell_is_set_over_its_bf16_cell_of_the_same_stack_and_shows_both_peaks():
    tidy = pd.DataFrame([
        row("fsdp2", "F+Z3+C", [8100, 8550], pset="f", run="a"),
        row("fsdp2", "F+Z3+C+FP8", [7300, 5620], pset="f", run="a", mfu_fp8=0.131),
        row("fsdp2", "F+Z3+C+FP8R", [7290, 7540], run="a", mfu_fp8=0.151),
    ])
    df = stacks.build(tidy).set_index("technique")
    fp8 = df.loc["F+Z3+C+FP8"]
    assert fp8.fp8_pairing == "set"
    assert fp8.fp8_ratio == pytest.approx((7300 / 8100 * 5620 / 8550) ** 0.5)
    assert fp8.fp8_ratio_lo < fp8.fp8_ratio < fp8.fp8_ratio_hi
    assert df.loc["F+Z3+C+FP8R", "fp8_pairing"] == "machine"  # not in the set: one machine
    assert pd.isna(df.loc["F+Z3+C", "fp8_ratio"])  # a bf16 cell has no FP8 ratio
    shown = stacks.table(df.reset_index()).parts[0].frame.set_index("Method")
    assert shown.loc["F+Z3+C+FP8", "FSDP2 MFU %"] == "2.0 (FP8 peak 13.1)"
    assert shown.loc["F+Z3+C+FP8", "FP8 / bf16 tok/s [95 %]"].endswith("(set)")
    assert shown.loc["F+Z3+C", "FP8 / bf16 tok/s [95 %]"] == ""


def test_the_baseline_of_a_method_at_its_largest_batch_drops_only_what_deepspeed_cannot_run_with_it():
    assert stacks.baseline_technique("F+Z3+C") == "F+Z3"  # DeepSpeed's ZeRO-3 does not run C
    assert stacks.baseline_technique("F+Z2+C") == "F+Z2+C"  # with ZeRO-2 it does
    assert stacks.baseline_technique("F+Z3+C+FP8") == "F+Z3"  # nor FP8
    assert stacks.baseline_technique("Z2+FP8R") == "Z2"
    assert stacks.baseline_technique("R+Z3+O") == "R+Z3+O" and stacks.baseline_technique("L+F") == "L+F"


def test_each_side_at_its_largest_batch_pairs_in_the_set_and_fp8_meets_bf16_at_its_own_largest():
    def at(backend, tech, bs, runs, searched, pset="big"):
        r = row(backend, tech, runs, pset=pset, run="a")
        r.update(batch_size=bs, searched_max_batch=searched, record_path=f"a/{backend}/{tech}/bs{bs}")
        return r

    tidy = pd.DataFrame([
        at("deepspeed", "F+Z3", 1, [900, 910], 33, pset="small"),
        at("deepspeed", "F+Z3", 33, [9800, 9820], 33),
        at("fsdp2", "F+Z3+C", 1, [2000, 2010], 48, pset="small"),
        at("fsdp2", "F+Z3+C", 48, [13400, 13500], 48),
        at("fsdp2", "F+Z3+C+FP8", 48, [17900, 18000], 64),
        at("fsdp2", "F+Z3+C+FP8", 64, [18600, 18700], 64),
        at("fsdp2", "Z3", 1, [1500, 1510], None, pset="small"),  # no search: no largest row
        at("deepspeed", "Z2", 8, [6400, 6410], None),  # not searched: shown, but no ratio
        at("fsdp2", "Z2", 12, [7100, 7120], 12),
    ])
    df = stacks.build(tidy)
    assert df["view"].value_counts().to_dict() == {"batch": 6, "largest": 3}
    big = df[df["view"] == "largest"].set_index("technique")
    c = big.loc["F+Z3+C"]
    assert (c.batch_size, c.fsdp2_batch_size, c.deepspeed_technique, c.deepspeed_batch_size) == (48, 48, "F+Z3", 33)
    assert c.pairing == "set" and c.ratio == pytest.approx((13400 / 9800 * 13500 / 9820) ** 0.5)
    fp8 = big.loc["F+Z3+C+FP8"]
    assert fp8.fsdp2_batch_size == 64 and fp8.deepspeed_batch_size == 33 and fp8.fp8_bf16_batch_size == 48
    assert fp8.fp8_ratio == pytest.approx((18600 / 13400 * 18700 / 13500) ** 0.5) and fp8.fp8_pairing == "set"
    # at each batch, the compiled cell has no DeepSpeed counterpart (ZeRO-3 does not run C)
    assert df[(df["view"] == "batch") & (df["technique"] == "F+Z3+C")]["ratio"].isna().all()
    z2 = big.loc["Z2"]
    assert z2.deepspeed_batch_size == 8 and pd.isna(z2.ratio) and pd.isna(z2.memory_ratio)
    parts = stacks.table(df).parts
    assert [p.heading for p in parts] == ["", "At each side's largest batch"]
    shown = parts[1].frame.set_index("Method")
    assert shown.loc["F+Z3+C", "DeepSpeed BS"] == "F+Z3 33 (searched)"
    assert shown.loc["F+Z3+C", "FSDP2 BS"] == "48 (searched)"
    assert shown.loc["F+Z3+C+FP8", "FP8 / bf16 tok/s [95 %]"].endswith("(set, bf16 at bs 48)")
    assert shown.loc["Z2", "DeepSpeed BS"] == "8 (not searched)" and shown.loc["Z2", "FSDP2 / DeepSpeed tok/s [95 %]"] == ""
