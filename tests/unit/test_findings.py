"""The findings engine (llmbench.report.findings) on fixture tidy rows, and the findings
file itself: every entry loads, quotes the paper verbatim, and a bad entry is rejected
before any job, naming it."""

import shutil
import subprocess

import pandas as pd
import pytest
import yaml
from conftest import BIN, REPO
from test_transcription import normalise, paper_text

from llmbench.config import ConfigError
from llmbench.memory import constants
from llmbench.report import findings, paper_frame, tidy

FINDINGS = REPO / "config" / "reference" / "findings.yaml"


def rows(*cells, stage="pretrain", run="r1"):
    """Tidy-like rows: (platform, model, technique, batch_size, gpus, status, tokens/s, allocated GiB)."""
    out = []
    for plat, model, tech, bs, gpus, status, tps, mem in cells:
        out.append({"stage": stage, "platform": plat, "model": model, "backend": "deepspeed", "technique": tech,
                    "batch_size": bs, "gpus": gpus, "status": status, "tokens_per_s_mean": tps,
                    "peak_mem_allocated_gib": mem, "peak_rss_gib": None, "run": run, "kind": "cell", "layout": None})
    return pd.DataFrame(out)


def finding(**over) -> findings.Finding:
    """One finding from a YAML-like entry, through the loader's checks."""
    entry = {"id": "t", "section": "IV", "claim": "c", "quote": "a quote of ten", "how": "h", "stage": "pretrain",
             "where": {"batch_size": 1, "backend": "deepspeed"}, "checks": [{"metric": "peak_mem_gb", "relation": "ratio", "a": {"technique": "Z2"},
                                                    "b": {"technique": "Naive"}, "expect": {"max": 0.7}}]}
    entry.update(over)
    return entry


def load_entries(tmp_path, *entries):
    path = tmp_path / "findings.yaml"
    path.write_text(yaml.safe_dump({"findings": list(entries)}))
    return findings.load(path)


def judge(tmp_path, frame, *entries):
    fs = load_entries(tmp_path, *entries)
    return findings.evaluate(fs, findings.facts(frame), findings.derive(paper_frame.frame()))


def test_the_committed_findings_load_and_cover_the_paper():
    fs = findings.load(FINDINGS)
    assert 35 <= len(fs) <= 60
    assert {f.section.split()[0] for f in fs} >= {"I", "IV-A.1", "IV-A.2", "IV-A.3", "V", "VI-A", "VII-A", "VII-C"}
    numbered = {f.section for f in fs if f.section.startswith("I (")}
    assert numbered == {f"I ({i})" for i in range(1, 9)}  # the eight findings of Section I


def test_every_quote_is_the_papers_own_words():
    text = normalise(paper_text())
    for f in findings.load(FINDINGS):
        assert normalise(f.quote) in text, f"{f.id}: quote not in paper.md: {f.quote!r}"


@pytest.mark.parametrize("bad, says", [
    ({"checks": [{"metric": "tokens_per_s", "relation": "ratio", "a": {"technique": "Z2"}, "b": {"technique": "Z3"},
                  "expect": {"min": 1}}]}, "unknown metric 'tokens_per_s'"),
    ({"checks": [{"metric": "mfu", "relation": "faster", "a": {"technique": "Z2"}, "expect": {"min": 1}}]},
     "unknown relation 'faster'"),
    ({"checks": [{"metric": "mfu", "relation": "value", "a": {"technique": "Z4"}, "expect": {"min": 1}}]},
     "unknown technique"),
    ({"where": {"model": "llama2-8b"}}, "unknown model 'llama2-8b'"),
    ({"checks": [{"metric": "mfu", "relation": "ratio", "a": {"technique": "Z2"}, "expect": {"min": 1}}]},
     "needs b"),
])
def test_a_bad_entry_is_rejected_naming_it(tmp_path, bad, says):
    with pytest.raises(ConfigError, match=says) as err:
        load_entries(tmp_path, finding(id="good"), finding(id="the-bad-one", **bad))
    assert "finding 'the-bad-one'" in str(err.value)


def test_a_bad_findings_file_stops_the_workflow_before_any_job(tmp_path):
    """The Snakefile loads the findings at parse time: a dry run fails, naming the entry."""
    work = tmp_path / "repo"
    work.mkdir()
    for part in ("Snakefile", "workflow", "config", "profiles"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, work / part)
    f = work / "config" / "reference" / "findings.yaml"
    f.write_text(yaml.safe_dump({"findings": [finding(id="broken", where={"technique": "Z9"})]}))
    out = subprocess.run([BIN / "snakemake", "-n", "--nolock", "--cores", "1"], cwd=work, capture_output=True,
                         text=True)
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert "invalid configuration (nothing was run)" in said and "finding 'broken'" in said
    assert not (work / "results").exists()


def test_our_own_findings_load_without_quotes_and_a_papers_finding_needs_its_quote(tmp_path):
    ours = findings.load(REPO / "config" / "findings" / "ours.yaml")
    assert ours and all(f.quote == "" for f in ours)
    path = tmp_path / "findings.yaml"
    entry = {k: v for k, v in finding(id="no-quote").items() if k != "quote"}
    path.write_text(yaml.safe_dump({"source": "ours", "findings": [entry]}))
    assert [f.id for f in findings.load(path)] == ["no-quote"]
    path.write_text(yaml.safe_dump({"findings": [entry]}))  # the paper's (the default source)
    with pytest.raises(ConfigError, match="quote"):
        findings.load(path)


def test_our_profile_finding_reads_the_module_rows_and_leaves_the_host_paced_remainder_out(tmp_path):
    """Our own findings get the per-row profile table as the paper's do: a module's share of
    the forward less 'other' (the wall no module range holds) is flat from batch 2 to 32 where
    its share of the whole wall halves, because at batch 2 the device waits on the host."""
    from llmbench.report import tables

    frame = rows(("h200", "llama2-7b", "Naive", 2, 1, "ok", 4000.0, None),
                 ("h200", "llama2-7b", "R", 32, 1, "ok", 7700.0, None), stage="profile").assign(backend="torch")
    keys = {"platform": "h200", "model": "llama2-7b", "backend": "torch", "gpus": 1}
    points = pd.DataFrame([{**keys, "technique": tech, "batch_size": bs, "phase": "forward", "module": m, "time_s": t}
                           for tech, bs, parts in (("Naive", 2, {"mlp": 0.009, "qkv": 0.003, "rope": 0.013,
                                                                 "other": 0.025}),
                                                   ("R", 32, {"mlp": 0.13, "qkv": 0.045, "rope": 0.2, "other": 0.01}))
                           for m, t in parts.items()])
    checks = [{"metric": f"mlp_forward{kind}_share", "relation": "ratio", "a": {"technique": "R", "batch_size": 32},
               "b": {"technique": "Naive", "batch_size": 2}, "expect": {"min": 0.75, "max": 1.33}}
              for kind in ("", "_busy")]
    path = tmp_path / "ours.yaml"
    entry = {k: v for k, v in finding(id="balance", stage="profile", where={"backend": "torch"},
                                      checks=checks).items() if k != "quote"}
    path.write_text(yaml.safe_dump({"source": "ours", "findings": [entry]}))
    table = tables.findings_ours(tables.Inputs({"tidy": frame, "profile": points, "findings-ours": str(path)}))
    shown = table.parts[0].frame.iloc[0]
    # of the wall: (0.13 / 0.385) / (0.009 / 0.05) = 1.88, outside; of the modules: 0.347 / 0.36 = 0.963
    assert shown["verdict"] == "partly"
    assert "mlp_forward_share bs32 R / bs2 Naive: 1.88" in shown["ours_value"]
    assert "mlp_forward_busy_share bs32 R / bs2 Naive: 0.963" in shown["ours_value"]


def test_our_findings_table_judges_fsdp2_against_deepspeed_without_a_paper_side(tmp_path):
    from llmbench.report import tables

    frame = pd.concat([rows(("h200", "llama2-7b", "Z3", 1, 1, "ok", 500.0, 107.0)),
                       rows(("h200", "llama2-7b", "Z3", 1, 1, "ok", 1000.0, 101.0)).assign(backend="fsdp2")],
                      ignore_index=True)
    path = tmp_path / "ours.yaml"
    entry = {k: v for k, v in finding(id="fsdp2-faster", where={"batch_size": 1}, checks=[
        {"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"backend": "fsdp2", "technique": "Z3"},
         "b": {"backend": "deepspeed", "technique": "Z3"}, "expect": {"min": 1.0}}]).items() if k != "quote"}
    path.write_text(yaml.safe_dump({"source": "ours", "findings": [entry]}))
    table = tables.findings_ours(tables.Inputs({"tidy": frame, "findings-ours": str(path)}))
    shown = table.parts[0].frame
    assert "paper_value" not in shown and list(shown["verdict"]) == ["holds"]
    assert shown["ours_value"].iloc[0].startswith("tokens_per_s_per_gpu backend=fsdp2 Z3 / backend=deepspeed Z3: 2")


def test_holds_and_the_papers_own_value_beside_it(tmp_path):
    frame = rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 100.0, 30.0), ("h100", "llama2-7b", "Naive", 1, 1, "ok", 110.0, 60.0))
    t = judge(tmp_path, frame, finding(where={"batch_size": 1, "backend": "deepspeed", "model": "llama2-7b"}))
    r = t.iloc[0]
    assert (r.platform, r.model, r.verdict) == ("h100", "llama2-7b", "holds")
    assert r.ours_value == "peak_mem_gb Z2 / Naive: 0.5" and r.pairing == "exact"  # memory is deterministic
    # the same comparison on the paper's numbers: A800 Z2 37.8 GB over Naive's 66.7 GB (Table III)
    # and 66.76 GB (Table II prints the same cell), 0.566
    assert "a800 0.566" in r.paper_value and "a800 holds" in r.paper_check
    assert r.missing == "" and r.runs == "r1"


def test_contradicts(tmp_path):
    frame = rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 100.0, 55.0), ("h100", "llama2-7b", "Naive", 1, 1, "ok", 110.0, 60.0))
    r = judge(tmp_path, frame, finding()).iloc[0]
    assert r.verdict == "contradicts" and r.ours_value == "peak_mem_gb Z2 / Naive: 0.917"


def test_a_claim_about_the_papers_methods_reads_deepspeed_not_another_frameworks_cell(tmp_path):
    """A finding that names no backend is about the paper's methods: an FSDP2 cell of the same
    technique name (Z2, 100 GB) beside DeepSpeed's (30 GB) does not enter its comparison."""
    frame = rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 100.0, 30.0), ("h100", "llama2-7b", "Naive", 1, 1, "ok", 110.0, 60.0))
    fsdp2 = rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 300.0, 100.0)).assign(backend="fsdp2")
    r = judge(tmp_path, pd.concat([frame, fsdp2], ignore_index=True), finding(where={"batch_size": 1})).iloc[0]
    assert r.verdict == "holds" and r.ours_value == "peak_mem_gb Z2 / Naive: 0.5"


def test_a_row_names_the_protocols_of_the_cells_it_compared(tmp_path):
    """A ratio of a 30/100/3 cell over a 3/10/1 one compares unlike runs: the row says so,
    strongest protocol first; a row that decided nothing names none."""
    frame = rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 100.0, 30.0), ("h100", "llama2-7b", "Naive", 1, 1, "ok", 110.0, 60.0))
    frame["warmup_steps"], frame["measured_steps"], frame["repeats"] = [30, 3], [100, 10], [3, 1]
    r = judge(tmp_path, frame, finding(where={"batch_size": 1, "backend": "deepspeed", "model": "llama2-7b"})).iloc[0]
    assert r.verdict == "holds" and r.protocols == "30/100/3, 3/10/1"
    one = rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 100.0, 30.0)).assign(warmup_steps=30, measured_steps=100, repeats=3)
    r = judge(tmp_path, one, finding(where={"batch_size": 1, "backend": "deepspeed", "model": "llama2-7b"})).iloc[0]
    assert r.verdict == "untestable" and r.protocols == ""


def test_inconclusive_when_some_checks_hold_and_others_cannot_be_decided(tmp_path):
    entry = finding(checks=[
        {"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"technique": "F+Z2"}, "b": {"technique": "Z2"},
         "expect": {"min": 1.0}},
        {"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"technique": "F"}, "b": {"technique": "Naive"},
         "expect": {"min": 1.0}}])
    frame = rows(("h200", "llama2-7b", "F+Z2", 1, 2, "ok", 3000.0, 75.0), ("h200", "llama2-7b", "Z2", 1, 2, "ok", 2400.0, 75.0),
                 ("h200", "llama2-7b", "Naive", 1, 2, "oom", None, None))
    r = judge(tmp_path, frame, entry).iloc[0]
    assert r.verdict == "inconclusive" and r.checks == "holds, missing"
    assert r.ours_value == "tokens_per_s_per_gpu F+Z2 / Z2: 1.25; tokens_per_s_per_gpu F / Naive: n/a"
    # F was not run and Naive ran out of memory: both named, with why
    assert "pretrain h200 llama2-7b deepspeed F bs1 g2: not run" in r.missing
    assert "pretrain h200 llama2-7b deepspeed Naive bs1 g2: out of memory" in r.missing


def test_untestable_names_the_cells_that_would_decide_it(tmp_path):
    frame = rows(("h100", "llama2-7b", "Q", 1, 1, "ok", 1700.0, 9.0), ("h100", "llama2-7b", "Naive", 1, 1, "oom", None, None))
    r = judge(tmp_path, frame, finding()).iloc[0]
    assert r.verdict == "untestable" and r.ours_value == "peak_mem_gb Z2 / Naive: n/a"
    # Z2 was not run, and its model states alone exceed one H100: the reader is told so
    assert r.missing == ("pretrain h100 llama2-7b deepspeed Z2 bs1 g1: not run "
                         "(cannot fit: model states on 1 GPU(s) 138 GiB > 80 GiB); "
                         "pretrain h100 llama2-7b deepspeed Naive bs1 g1: out of memory (host, or no bound on its "
                         "GPU peak)")


def test_a_cell_not_run_whose_states_fit_but_the_memory_model_does_not_says_so(tmp_path):
    # 70B LoRA on one H200: its bf16 base (128 GiB) is under the 141 GiB, but with the
    # adapters' states, the activations and the margin the memory model says it does not fit
    frame = rows(("h200", "llama2-70b", "QL", 1, 1, "ok", 360.0, 62.4), stage="finetune")
    entry = finding(stage="finetune", checks=[{"metric": "tokens_per_s_per_gpu", "relation": "ratio",
                                               "a": {"technique": "L"}, "b": {"technique": "QL"},
                                               "expect": {"min": 1.5}}])
    r = judge(tmp_path, frame, entry).iloc[0]
    assert r.verdict == "untestable"
    assert r.missing.startswith("finetune h200 llama2-70b deepspeed L bs1 g1: not run (predicted GPU peak ")
    # the margin is LoRA's own (the memory model's margin per technique family)
    assert r.missing.endswith(f"x (1 + margin {constants.margin_for('lora'):g}) > 141 GiB)")


def test_a_cell_not_run_that_may_fit_is_named_without_a_fit_note(tmp_path):
    frame = rows(("h100", "llama2-7b", "Q", 1, 1, "ok", 1700.0, 9.0))
    entry = finding(checks=[{"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"technique": "R+Q"},
                             "b": {"technique": "Q"}, "expect": {"max": 1.0}}])
    r = judge(tmp_path, frame, entry).iloc[0]
    assert r.verdict == "untestable" and r.missing == "pretrain h100 llama2-7b deepspeed R+Q bs1 g1: not run"


def test_a_finding_no_cell_speaks_to_is_one_untestable_row(tmp_path):
    r = judge(tmp_path, rows(("cpu", "tiny", "Q", 4, 1, "ok", 500.0, 1.0)), finding(stage="finetune")).iloc[0]
    assert (r.platform, r.verdict) == ("-", "untestable") and "finetune any platform" in r.missing


def test_a_platform_filter_and_a_cross_platform_check(tmp_path):
    entry = finding(group_by=["model"], where={"batch_size": 1, "technique": "Q"}, checks=[
        {"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"platform": "rtx4090"}, "b": {"platform": "a800"},
         "expect": {"about": 0.5}}])
    frame = rows(("h100", "llama2-7b", "Q", 1, 1, "ok", 1700.0, 9.0))
    r = judge(tmp_path, frame, entry).iloc[0]
    assert r.verdict == "untestable" and "rtx4090" in r.missing and r.tolerance == "in [0.375, 0.625]"
    assert "0.451" in r.paper_value  # the paper's own: 4879.2 / 10813.4


def test_a_finding_grouped_by_batch_shows_each_rows_batch_and_only_then(tmp_path):
    """group_by batch_size judges each batch on its own row; the report's table shows the
    batch column for such rows, and leaves it out where no row has one (it would be empty)."""
    bz = finding(group_by=["platform", "model", "gpus", "batch_size"], where={"backend": "deepspeed"})
    frame = rows(*[("h100", "llama2-7b", t, bs, 1, "ok", 1.0, mem * bs) for bs in (1, 4)
                   for t, mem in (("Z2", 30.0), ("Naive", 64.0))])
    by_batch = judge(tmp_path, frame, bz)
    assert sorted(by_batch["batch_size"]) == [1, 4] and set(by_batch["verdict"]) == {"holds"}
    shown = findings.report_table(by_batch, by_batch.iloc[0:0]).parts[0].frame
    assert list(shown["batch_size"]) == list(by_batch["batch_size"])
    plain = judge(tmp_path, frame, finding())
    assert "batch_size" not in findings.report_table(plain, plain.iloc[0:0]).parts[0].frame


def test_the_larger_of_two_rows_a_selection_picks_does_not_hide_the_other(tmp_path):
    """Two rows match one selection (the tidy table holds one record per cell, so rows of
    cells the selection does not tell apart): the verdict uses both (their geometric mean) and
    names both runs."""
    frame = pd.concat([rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 1.0, 30.0), run="a"),
                       rows(("h100", "llama2-7b", "Z2", 1, 1, "ok", 1.0, 34.0), run="b"),
                       rows(("h100", "llama2-7b", "Naive", 1, 1, "ok", 1.0, 64.0), run="a")])
    r = judge(tmp_path, frame, finding()).iloc[0]
    assert r.ours_value == "peak_mem_gb Z2 / Naive: 0.499" and r.runs == "a, b"


def test_to_run_plans_the_smallest_paired_set_per_undecided_finding_on_given_machines(tmp_path):
    fs = load_entries(tmp_path, finding(id="one"), finding(id="two", checks=[
        {"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"technique": "Z2"}, "b": {"technique": "Z3"},
         "expect": {"min": 1.0}}]), finding(id="sharding", needs={"min_gpus": 2, "why": "ranks"}))
    ours = findings.facts(rows(("h100", "llama2-7b", "Naive", 1, 1, "ok", 1.0, 60.0)))
    kinds = findings.MachineKind.parse([{"platform": "h200", "gpus": [1, 2]}], ours)
    plan = findings.to_run(fs, ours, kinds).set_index("finding")
    assert sorted(plan.index) == ["one", "sharding", "two"]  # one plan per undecided finding
    assert set(plan["platform"]) == {"h200"}  # only the kinds given
    # Z2 against Z3 fits the pair: its set is those two cells, planned first
    assert plan.loc["two", "cells"] == ("pretrain h200 llama2-7b deepspeed Z2 bs1 g2; "
                                        "pretrain h200 llama2-7b deepspeed Z3 bs1 g2")
    assert plan.index[0] == "two" and plan.loc["two", "note"] == ""
    # Naive never fits one H200 or the pair: the plan says so (an OOM then bounds its memory)
    assert "Naive bs1 g2: cannot fit" in plan.loc["one", "note"] and plan.loc["one", "gpus"] == 2
    # a claim about several ranks is never planned on one GPU
    assert plan.loc["sharding", "gpus"] == 2
    with pytest.raises(ConfigError, match="findings_machines\\[0\\].platform: unknown platform 'h900'"):
        findings.MachineKind.parse([{"platform": "h900", "gpus": 1}], ours)


def test_to_run_plans_each_undecided_row_of_a_finding_decided_elsewhere_where_its_cells_fit(tmp_path):
    """QLoRA under 0.7 of LoRA's memory holds for 7B on one H200 (memory is exact). The
    finding is decided, so no smallest set for it; but its 13B row there is untestable (QL
    not run) and a set of L and QL decides it; its 70B row (QL ran, L not) needs LoRA's 70B,
    which cannot fit one H200: no set; the pair holds no row of it: no set either. With the
    7B row gone the finding is undecided again: one smallest set for the whole finding."""
    fs = load_entries(tmp_path, finding(id="ql-memory", stage="finetune", checks=[
        {"metric": "peak_mem_gb", "relation": "ratio", "a": {"technique": "QL"}, "b": {"technique": "L"},
         "expect": {"max": 0.7}}]))
    measured = [("h200", "llama2-7b", "L", 1, 1, "ok", 900.0, 20.0), ("h200", "llama2-7b", "QL", 1, 1, "ok", 700.0, 8.0),
                ("h200", "llama2-13b", "L", 1, 1, "ok", 600.0, 30.0), ("h200", "llama2-70b", "QL", 1, 1, "ok", 90.0, 40.0)]
    ours = findings.facts(rows(*measured, stage="finetune"))
    verdicts = {r["group"]["model"]: r["verdict"] for r in findings.evaluate_finding(fs[0], ours, findings.context(ours))}
    assert verdicts == {"llama2-7b": "holds", "llama2-13b": "untestable", "llama2-70b": "untestable"}
    kinds = findings.MachineKind.parse([{"platform": "h200", "gpus": [1, 2]}], ours)
    plan = findings.to_run(fs, ours, kinds)
    assert len(plan) == 1
    row = plan.iloc[0]
    assert (row["decided_elsewhere"], row["verdict"], row["gpus"], row["model"]) == ("holds", "untestable", 1,
                                                                                     "llama2-13b")
    assert row["cells"] == (
        "finetune h200 llama2-13b deepspeed L bs1 g1; finetune h200 llama2-13b deepspeed QL bs1 g1")
    assert row["note"] == ""
    # without the row that decided it, one smallest set for the whole finding, as before
    undecided = findings.facts(rows(*measured[2:], stage="finetune"))
    whole = findings.to_run(fs, undecided, kinds)
    assert len(whole) == 1 and whole.iloc[0]["decided_elsewhere"] == ""


def test_a_finding_about_a_list_of_models_plans_cells_of_one_of_them(tmp_path):
    """A finding whose where names two models judges each in its own row: a plan's cells are
    of one model each (not the list's), and never of a model the list leaves out."""
    fs = load_entries(tmp_path, finding(id="two-models", stage="finetune",
                                        where={"batch_size": 1, "backend": "deepspeed",
                                               "model": ["llama2-7b", "llama2-13b"]},
                                        checks=[{"metric": "peak_mem_gb", "relation": "ratio", "a": {"technique": "QL"},
                                                 "b": {"technique": "L"}, "expect": {"max": 0.7}}]))
    kinds = findings.MachineKind.parse([{"platform": "h200", "gpus": [1]}], pd.DataFrame())
    plan = findings.to_run(fs, findings.facts(rows(("h100", "llama2-7b", "L", 1, 1, "ok", 900.0, 20.0),
                                                   stage="finetune")), kinds)
    assert plan["model"].tolist() == ["llama2-13b"] or plan["model"].tolist() == ["llama2-7b"]
    assert plan.iloc[0]["cells"] == (f"finetune h200 {plan.iloc[0]['model']} deepspeed L bs1 g1; "
                                     f"finetune h200 {plan.iloc[0]['model']} deepspeed QL bs1 g1")


def test_the_plan_gives_no_fit_note_to_a_cell_that_ran(tmp_path):
    """DeepSpeed's Z2 of llama2-7b on one H200 is predicted not to fit (its optimizer step over
    the 141 GiB with the margin), but a record of it ran ok: the plan to measure it again
    beside Z3 must not list it as a cell that cannot fit (such sets are listed last, as if
    they could not run); without that record the prediction names it."""
    fs = load_entries(tmp_path, finding(id="z2-vs-z3", checks=[
        {"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"technique": "Z2"}, "b": {"technique": "Z3"},
         "expect": {"min": 1.0}}]))
    kinds = findings.MachineKind.parse([{"platform": "h200", "gpus": 1}], pd.DataFrame())
    z3_failed = ("h200", "llama2-7b", "Z3", 1, 1, "error", None, None)
    ran = findings.to_run(fs, findings.facts(rows(("h200", "llama2-7b", "Z2", 1, 1, "ok", 100.0, 101.0), z3_failed)),
                          kinds).iloc[0]
    assert ran["cells"] == "pretrain h200 llama2-7b deepspeed Z2 bs1 g1; pretrain h200 llama2-7b deepspeed Z3 bs1 g1"
    assert "Z2 bs1 g1" not in ran["note"]
    failed = findings.to_run(fs, findings.facts(rows(("h200", "llama2-7b", "Z2", 1, 1, "error", None, None),
                                                     z3_failed)), kinds).iloc[0]
    assert "pretrain h200 llama2-7b deepspeed Z2 bs1 g1: predicted GPU peak" in failed["note"]


@pytest.mark.parametrize("backend, technique, fits", [
    ("deepspeed", "Z2", False),  # ZeRO-2 on one GPU: fp32 master weights, moments and gradients
    ("fsdp2", "Z2", True),  # FSDP2 without resharding on one GPU: what its records measured
    ("fsdp2", "Z3+O", None),  # FSDP2's offload is not modelled: no prediction, no note
])
def test_the_plans_memory_note_predicts_under_the_cells_backend(backend, technique, fits):
    spec = {"stage": "pretrain", "platform": "h200", "model": "llama2-7b", "technique": technique, "batch_size": 1,
            "gpus": 1, "backend": backend}
    note = findings._predicted_note(spec)
    assert note.startswith("predicted GPU peak") if fits is False else note == ""


@pytest.mark.parametrize("platform, model, gpus, note", [
    ("h200", "llama2-70b", 1, "cannot fit: bf16 weights 128 GiB a GPU over 1 > 127 GiB, an engine's 90 % of 141 GiB"),
    ("h200", "llama2-70b", 2, ""),  # tensor parallel 2: 64 GiB a GPU
    ("h100", "llama2-70b", 1, "cannot fit: bf16 weights 128 GiB a GPU over 1 > 72 GiB"),
    ("h100", "llama2-13b", 1, ""),
])
def test_a_serving_cell_fits_where_its_weights_a_gpu_leave_an_engine_room_for_its_kv_cache(platform, model, gpus,
                                                                                         note):
    """70B's bf16 weights (128 GiB) are under one H200's 141 GiB but over the 90 % an engine
    takes: no KV cache is left, so the plan must not offer it as a cell that may run."""
    got = findings._fit_note({"stage": "serve", "platform": platform, "model": model, "gpus": gpus})
    assert got.startswith(note) and bool(got) == bool(note)


@pytest.mark.parametrize("platform, engine, note", [
    # 70B's folder (131 GiB with its margin) on the pair's 128 GiB disk: LightLLM reads it
    ("h200", "lightllm", "cannot fit: its model folder (random bf16 weights) 131 GiB > the 128 GiB of disk"),
    ("h200", "vllm", ""),  # vLLM makes its own weights (serve weights: dummy): no folder
    ("h200x4", "lightllm", ""),  # 235 GiB of disk
    ("h100", "lightllm", ""),  # its platform file names no disk: not checked
])
def test_a_serving_cell_whose_engine_reads_a_folder_fits_its_platforms_disk(platform, engine, note):
    """The plan must not offer a LightLLM 70B burst on a node whose disk cannot hold the
    model folder it reads: building the folder would stop at its room check
    (serve.model_dir.check_room), and the set that needs it would never run."""
    got = findings._fit_note({"stage": "serve", "platform": platform, "model": "llama2-70b", "engine": engine,
                              "gpus": 2})
    assert got.startswith(note) and bool(got) == bool(note)


def test_the_platforms_disk_is_in_no_cell_spec():
    """disk_gib is where a job runs, not the experiment: a platform file that sets it must
    leave every cell's spec (Snakemake's params rerun trigger) as it was."""
    from llmbench.grid import load
    from llmbench.platforms import Platform

    assert Platform.load("h200").disk_gib == 128
    grid = load(REPO / "config/recipes/paired-h200-serve-13b-lightllm-b.yaml")
    specs = [grid.spec(c) for c in grid.cells]
    assert specs and all(s["platform"]["name"] == "h200" and "disk_gib" not in s["platform"] for s in specs)


def test_to_run_plans_no_cell_for_a_check_only_a_legacy_engine_could_decide(tmp_path):
    """LightLLM against vLLM measured together (slower: that check contradicts) and against
    TGI not run: the group stays undecided, but no set we would run decides it (TGI is a
    legacy engine), so no plan offers LightLLM's burst again; with vLLM's bursts alone, the
    plan is the pair that decides the vLLM check, measured together."""
    def burst(engine, i, tps):
        return {"stage": "serve", "platform": "h200", "model": "llama2-7b", "gpus": 1, "engine": engine,
                "backend": engine, "load": f"burst-{i + 1}", "mode": "burst", "status": "ok",
                "output_tokens_per_s": tps, "run": "r", "kind": "cell", "machine": "m1", "paired_set": "s",
                "paired_round": i, "superseded_by": None, "layout": None, "tokens_per_s_mean": None,
                "peak_mem_allocated_gib": None, "peak_rss_gib": None,
                "record_path": f"results/reference/r/runs/serve/h200/llama2-7b/{engine}/burst-{i + 1}-g1/record.json"}
    fs = load_entries(tmp_path, finding(
        id="lightllm-fastest", stage="serve", where={"mode": "burst", "model": "llama2-7b"}, checks=[
            {"metric": "output_tokens_per_s", "relation": "ratio", "a": {"engine": "lightllm"}, "b": {"engine": e},
             "expect": {"min": 1.0}} for e in ("vllm", "tgi")]))
    ran = pd.DataFrame([burst(e, i, v) for e, vs in {"vllm": [4000, 4050, 3990], "lightllm": [3300, 3280, 3310]}.items()
                        for i, v in enumerate(vs)])
    ran = ran.reindex(columns=list(dict.fromkeys([*tidy.ALL_COLUMNS, *ran.columns])))  # a tidy table's columns
    ours = findings.facts(ran)
    assert {r["verdict"] for r in findings.evaluate_finding(fs[0], ours, findings.context(ours))} == {"inconclusive"}
    kinds = findings.MachineKind.parse([{"platform": "h200", "gpus": 1}], ours)
    assert findings.to_run(fs, ours, kinds).empty
    vllm = findings.facts(ran[ran["engine"] == "vllm"])
    plan = findings.to_run(fs, vllm, kinds)
    assert list(plan["cells"]) == ["serve h200 llama2-7b lightllm burst g1; serve h200 llama2-7b vllm burst g1"]


def test_the_committed_findings_on_the_papers_own_numbers():
    """The engine applied to the paper's tables: the claims its own numbers bear out hold
    there, and those the tables contradict (found while transcribing) say so."""
    paper = findings.derive(paper_frame.frame())
    by = {f.id: f for f in findings.load(FINDINGS)}
    verdict = {fid: {r["group"].get("platform"): r["verdict"] for r in findings.evaluate_finding(by[fid], paper)
                     if r["group"].get("model") in (None, "llama2-7b")} for fid in by}
    assert verdict["zero2-57pct-of-naive-memory"]["a800"] == "holds"
    assert verdict["megatron-faster-at-batch-1"]["a800"] == "holds"
    assert verdict["deepspeed-beats-megatron"]["a800"] == "partly"  # its batch-1 row says otherwise
    assert verdict["quantization-fastest"] == {p: "holds" for p in ("a800", "rtx4090", "rtx3090", "rtx3090-nonvlink")}
    assert verdict["optimizer-37pct-of-step"]["a800"] == "holds"


def test_the_typo_of_table4_enters_no_comparison():
    p = paper_frame.frame()
    typo = p[(p["table"] == "table4") & (p["model"] == "llama2-13b") & (p["technique"] == "R+Z2+O")
             & (p["platform"] == "a800")].iloc[0]
    assert typo.tokens_per_s_mean == 640435 and typo.flag == "typo"
    assert pd.isna(typo.tokens_per_s_per_gpu) and pd.isna(typo.mfu)


def test_paper_mfu_uses_the_platforms_peak():
    p = paper_frame.frame()
    naive = p[(p["table"] == "table3") & (p["technique"] == "Naive") & (p["platform"] == "a800")].iloc[0]
    fpt = paper_frame.flops_per_token_of("llama2-7b", "Naive", 350)
    assert naive.mfu == pytest.approx(7488.3 * fpt / (8 * 312e12))
    q = p[(p["table"] == "table3") & (p["technique"] == "Q") & (p["platform"] == "a800")].iloc[0]
    assert pd.isna(q.mfu)  # not reported for 4-bit cells (DESIGN.md)


def test_a_platform_filter_by_interconnect(tmp_path):
    f = load_entries(tmp_path, finding(platforms={"gpu_memory_gib": {"min": 20}, "interconnect": "NVLink"}))[0]
    assert [p for p in ("a800", "h200", "rtx3090", "rtx3090-nonvlink", "rtx4090", "cpu") if findings.platform_ok(f, p)] \
        == ["a800", "h200", "rtx3090"]


def test_the_largest_batch_against_batch_1_needs_a_batch_beyond_1(tmp_path):
    """'batch_size: max' picks the largest batch measured; where that is batch 1 the check
    would compare a cell with itself (a ratio of 1): it is missing, and says why."""
    entry = finding(where={"backend": "deepspeed"}, checks=[
        {"metric": "tokens_per_s_per_gpu", "relation": "ratio", "a": {"technique": "Z2", "batch_size": "max"},
         "b": {"technique": "Z2", "batch_size": 1}, "expect": {"min": 1.2}}])
    only_1 = rows(("h200", "llama2-7b", "Z2", 1, 2, "ok", 2400.0, 75.0))
    r = judge(tmp_path, only_1, entry).iloc[0]
    assert r.verdict == "untestable" and "no larger batch measured" in r.missing
    both = pd.concat([only_1, rows(("h200", "llama2-7b", "Z2", 8, 2, "ok", 9600.0, 120.0))])
    assert judge(tmp_path, both, entry).iloc[0].verdict == "holds"


def test_a_scaling_efficiency_measured_in_one_set_pairs_its_rounds(tmp_path):
    """Fig. 4's efficiency is a ratio of two cells: where both ran in one paired set, each
    round's efficiency is its n-GPU tokens/s per GPU over the base's of the same round, and
    the interval is the set's paired one; measured apart, it is one value."""
    entry = finding(where={"backend": "deepspeed", "technique": "Q", "batch_size": 2},
                    needs={"min_gpus": 2, "why": "scaling"},
                    checks=[{"metric": "scaling_efficiency", "relation": "value", "a": {}, "expect": {"min": 0.95}}])
    frame = rows(("h200x4", "llama2-7b", "Q", 2, 1, "ok", 1000.0, 11.0), ("h200x4", "llama2-7b", "Q", 2, 4, "ok", 3200.0, 11.0))
    frame["paired_set"] = "fig4"
    frame["tokens_per_s_runs"] = ["1000;1100;900", "3160;3520;2880"]  # 0.79, 0.8, 0.8
    frame["mfu"] = None
    r = judge(tmp_path, frame, entry)
    r = r[r.gpus == 4].iloc[0]
    assert r.pairing == "set" and r.method == "paired rounds (3), t(2)" and r.verdict == "contradicts"
    assert r.ours_value == "scaling_efficiency : 0.797 [0.782, 0.811]"  # t(2) on the rounds' logs
    apart = frame.assign(paired_set=[None, None])
    r = judge(tmp_path, apart, entry)
    r = r[r.gpus == 4].iloc[0]
    assert r.pairing != "set" and "pooled" in r.method
    resumed = frame.assign(machine=["m1", "m0+m1"], repeat_machines=[None, "m0;m1;m1"])  # its round 0 on m0
    r = judge(tmp_path, resumed, entry)
    assert r[r.gpus == 4].iloc[0].method.startswith("paired rounds (2)")  # rounds 1 and 2 only
