"""Several runs (results folders) of one cell, as the combined view reads them: the report
uses one record per cell (llmbench.report.runs), the same one in every table, finding and the
advisor, and keeps the others visible as superseded."""

import pandas as pd
import yaml

from llmbench import grid, record
from llmbench.record import Metrics, Record
from llmbench.report import advice, findings, paper_frame, paper_tables, render, runs, tidy

from conftest import REPO

QUICK = {"warmup_steps": 3, "measured_steps": 10, "repeats": 1}
PAPER = {"warmup_steps": 30, "measured_steps": 100, "repeats": 3}


def write(tmp_path, run, technique, tps, protocol, started, status="ok", stage="finetune", batch_size=1):
    """One H100 7B DeepSpeed cell's record in results folder ``run``, measured under
    ``protocol`` and started at ``started`` (ISO 8601)."""
    g = grid.expand({"protocol": protocol, stage: [{"platforms": ["h100"], "models": ["llama2-7b"],
                                                   "techniques": [technique], "batch_sizes": [batch_size]}]})
    cell = g.cells[0]
    m = Metrics(tokens_per_s_mean=tps, tokens_per_s_std=1.0, tokens_per_s_runs=(tps,), peak_mem_reserved_gib=19.0,
                peak_mem_allocated_gib=18.0) if status == "ok" else Metrics()
    r = Record(cell=cell.to_dict(), status=status, reason="" if status == "ok" else "CUDA out of memory", metrics=m,
               provenance={"started": started})
    path = cell.record_path(str(tmp_path / run))
    record.write(r, path)
    return path


def two_runs_of_l(tmp_path):
    """The H100 7B LoRA cell twice: first under the quick protocol (faster), later under the
    paper's (slower), with L+Z2 only in the first run."""
    return [
        write(tmp_path, "2026-01-01-quick", "L", 1297.0, QUICK, "2026-01-01T10:00:00+00:00"),
        write(tmp_path, "2026-01-01-quick", "L+Z2", 928.0, QUICK, "2026-01-01T10:30:00+00:00"),
        write(tmp_path, "2026-01-04-paper", "L", 910.0, PAPER, "2026-01-04T07:20:00+00:00"),
    ]


def test_the_stronger_protocol_is_used_and_the_other_is_kept_as_superseded(tmp_path):
    every = tidy.build_all(two_runs_of_l(tmp_path))
    used, old = tidy.used(every), tidy.superseded(every)
    l_row = used[used.technique == "L"]
    assert len(l_row) == 1 and l_row.iloc[0].run == "2026-01-04-paper" and l_row.iloc[0].tokens_per_s_mean == 910.0
    assert l_row.iloc[0].runs == 2 and "over 2026-01-01-quick: stronger protocol" in l_row.iloc[0].choice
    assert list(old.run) == ["2026-01-01-quick"] and list(old.superseded_by) == ["2026-01-04-paper"]
    assert old.iloc[0].tokens_per_s_mean == 1297.0 and old.iloc[0].measured_steps == 10
    assert list(tidy.build(two_runs_of_l(tmp_path)).run) == list(used.run)  # build: the rows used
    z2 = used[used.technique == "L+Z2"].iloc[0]
    assert z2.runs == 1 and pd.isna(z2.superseded_by) and pd.isna(z2.choice)


def test_the_stronger_protocol_wins_even_when_it_is_the_older_run(tmp_path):
    paths = [write(tmp_path, "2026-01-01-paper", "L", 910.0, PAPER, "2026-01-01T07:00:00+00:00"),
             write(tmp_path, "2026-01-09-quick", "L", 1297.0, QUICK, "2026-01-09T07:00:00+00:00")]
    assert list(tidy.build(paths).run) == ["2026-01-01-paper"]


def test_with_one_protocol_the_later_run_wins_by_its_start_not_its_folder_name(tmp_path):
    paths = [write(tmp_path, "b-earlier", "L", 1000.0, PAPER, "2026-01-01T07:00:00+00:00"),
             write(tmp_path, "a-later", "L", 900.0, PAPER, "2026-01-02T07:00:00+02:00")]
    df = tidy.build(paths)
    assert list(df.run) == ["a-later"] and "later run" in df.iloc[0].choice


def test_a_result_beats_a_record_without_one_whatever_the_protocol(tmp_path):
    """A later run under a stronger protocol that did not measure (a timeout, say) does not
    hide the measurement; an out-of-memory is a result like ok."""
    paths = [write(tmp_path, "old", "L", 1000.0, QUICK, "2026-01-01T07:00:00+00:00"),
             write(tmp_path, "new", "L", None, PAPER, "2026-01-02T07:00:00+00:00", status="timeout")]
    df = tidy.build(paths)
    assert list(df.run) == ["old"] and df.iloc[0].choice == "over new: a result (ok) over timeout"
    paths.append(write(tmp_path, "newest", "L", None, PAPER, "2026-01-03T07:00:00+00:00", status="oom"))
    assert list(tidy.build(paths).status) == ["oom"]


def test_one_results_folder_is_what_it_was(tmp_path):
    """A single sweep holds one record per cell: nothing is superseded, every row says one run."""
    paths = [write(tmp_path, "results", t, 1000.0 + i, PAPER, f"2026-01-01T0{i}:00:00+00:00")
             for i, t in enumerate(["L", "L+Z2", "QL", "L+F"])]
    every = tidy.build_all(paths)
    assert len(every) == 4 and tidy.superseded(every).empty and (every["runs"] == 1).all()
    assert every["choice"].isna().all() and every["superseded_by"].isna().all()
    pd.testing.assert_frame_equal(tidy.build(paths), every)


def test_a_record_given_twice_is_one_record_not_two_runs(tmp_path):
    """The workflow may list a searched cell's record twice (the grid's cell and the batch
    its search measured): one row, which supersedes nothing, and its samples once."""
    path = write(tmp_path, "results", "L", 1000.0, PAPER, "2026-01-01T00:00:00+00:00")
    every = tidy.build_all([path, path, str(path)])
    assert len(every) == 1 and len(tidy.used(every)) == 1 and tidy.superseded(every).empty
    assert (every["runs"] == 1).all()


def test_the_advisor_shows_the_chosen_measurement_not_the_faster_one(tmp_path):
    df = advice.build(tidy.build(two_runs_of_l(tmp_path)), {"platforms": ["h100"], "models": ["llama2-7b"],
                                                             "stage": "finetune", "gpus": 1}, root=REPO)
    assert df.set_index("technique").loc["L", "measured_tokens_per_s"] == 910.0


def test_a_finding_compares_with_the_chosen_measurement_not_the_mean(tmp_path):
    path = tmp_path / "findings.yaml"
    path.write_text(yaml.safe_dump({"findings": [{
        "id": "lora-zero2", "section": "V", "claim": "c", "quote": "a quote of ten", "how": "h", "stage": "finetune",
        "where": {"batch_size": 1}, "checks": [{"metric": "tokens_per_s_per_gpu", "relation": "ratio",
                                                "a": {"technique": "L+Z2"}, "b": {"technique": "L"},
                                                "expect": {"min": 1.0, "max": 1.25}}]}]}))
    ours = findings.facts(tidy.build(two_runs_of_l(tmp_path)))
    r = findings.evaluate(findings.load(path), ours, findings.derive(paper_frame.frame())).iloc[0]
    assert r.ours_value.endswith(f": {928.0 / 910.0:.3g}")  # not 928 / mean(1297, 910) = 0.841
    assert r.runs == "2026-01-01-quick, 2026-01-04-paper"


def test_table9_shows_one_row_names_its_run_and_the_superseded_one(tmp_path):
    long = paper_tables.build(tidy.build(two_runs_of_l(tmp_path)), "table9")
    ours = long[(long.platform == "h100") & long.status.notna()]
    assert list(ours[ours.technique == "L"].tokens_per_s) == [910.0]
    assert ours.set_index("technique").loc["L+Z2", "relative_tokens_per_s"] == 928.0 / 910.0
    page = render.markdown(paper_tables.table(long, "table9"))
    assert "| 2026-01-04-paper" in page and "over 2026-01-01-quick: stronger protocol" in page


def test_the_per_row_tables_keep_the_chosen_records_samples(tmp_path):
    """Requests, microbenchmark points and profile rows follow the same choice."""
    g = grid.expand({"protocol": {}, "serve": [{"platforms": ["cpu"], "models": ["tiny"], "engines": ["vllm"],
                                                 "loads": {"burst": {"num_requests": 3, "input_len": 8,
                                                                     "output_len": 4}}}]})
    cell = g.cells[0]
    paths = []
    for run, started, e2e in (("new", "2026-01-02T00:00:00+00:00", 0.2), ("old", "2026-01-01T00:00:00+00:00", 0.9)):
        samples = {"index": [0, 1, 2], "ttft_s": [0.1] * 3, "e2e_s": [e2e] * 3, "tpot_s": [0.1] * 3,
                   "scheduled_s": [0.0] * 3, "sent_s": [0.0] * 3, "output_tokens": [4] * 3, "ok": [True] * 3,
                   "error": [""] * 3}
        path = cell.record_path(str(tmp_path / run))
        record.write(Record(cell=cell.to_dict(), status="ok", samples=samples, provenance={"started": started}), path)
        paths.append(path)
    req = tidy.build_samples(paths, "serve")
    assert len(req) == 3 and set(req.e2e_s) == {0.2}
    assert list(tidy.build(paths).run) == ["new"]


def test_the_rule_reads_each_stages_protocol():
    train = {"stage": "finetune", "protocol": {"warmup_steps": 30, "measured_steps": 100, "repeats": 3}}
    assert runs.protocol_of(train) == (300, "30 warm-up, 100 steps x 3")
    assert runs.protocol_of({"stage": "serve", "load_spec": {"num_requests": 1000}})[0] == 1000
    assert runs.protocol_of({"stage": "micro", "iters": 100, "warmup": 20})[0] == 100
    assert runs.identity("results/reference/x/runs/finetune/h100/m/deepspeed/L/bs1-g1/record.json") == \
        runs.identity("other/runs/finetune/h100/m/deepspeed/L/bs1-g1/record.json")
    assert runs.started({"started": "2026-01-02T07:00:00+02:00"}) == "2026-01-02T05:00:00+00:00"
    assert runs.started({}) == ""


def test_of_several_folders_of_one_search_the_fuller_one_is_read(tmp_path):
    """A search run again in a later results folder (resumed: it holds the earlier probes,
    answered from its frontier file) is read from there; a folder without the search's
    summary (stopped, or only its probes copied) is not read; a tie goes to the later folder.
    A search that found its answer is read before one a probe's error stopped, whatever their
    probes (h100 llama2-7b QL: 4 probes to an NCCL error, then afresh, 2 probes to batch 20),
    and one that found a batch too large before one that stopped at its cap."""
    import json

    def folder(run, technique, n_probes, status="ok", **summary):
        f = tmp_path / run / f"runs/search/finetune/h100/llama2-7b/deepspeed/{technique}-g1"
        f.mkdir(parents=True)
        if n_probes is not None:
            (f / "search.json").write_text(json.dumps({"n_probes": n_probes, "status": status, **summary}))
        return str(f)

    early_l, late_l = folder("2026-01-01-a", "L", 2), folder("2026-01-02-b", "L", 5)
    stopped, early_q, late_q = folder("2026-01-03-c", "L", None), folder("2026-01-01-a", "QL", 3), \
        folder("2026-01-02-b", "QL", 3)
    assert runs.choose_searches([early_l, early_q, late_l, late_q, stopped]) == [late_l, late_q]
    assert runs.choose_searches([late_l, early_l]) == [late_l]
    errored, answered = folder("2026-01-01-a", "QL+Z2", 4, "error"), folder("2026-01-02-b", "QL+Z2", 2)
    assert runs.choose_searches([answered, errored]) == [answered]
    timed_out, answered_earlier = folder("2026-01-02-b", "L+Z2", 6, "timeout"), folder("2026-01-01-a", "L+Z2", 5)
    assert runs.choose_searches([answered_earlier, timed_out]) == [answered_earlier]
    # one that stopped at its cap (every probe fit) is a lower bound: a later search past the
    # cap that found the edge is read, though it ran fewer probes
    capped = folder("2026-01-02-b", "R+Q", 10, smallest_oom=None, largest_ok=128, max_batch=128)
    bounded = folder("2026-01-01-a", "R+Q", 3, smallest_oom=232, largest_ok=231, max_batch=1024)
    assert runs.choose_searches([capped, bounded]) == [bounded]
