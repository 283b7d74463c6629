"""The coverage table: every paper row on each GPU platform run, with its answer and what is
left to do (llmbench.report.coverage), built from fixture records."""

import pandas as pd
import pytest

from llmbench import grid, record
from llmbench.record import Metrics, Record
from llmbench.report import coverage, render, tables, tidy


def write(tmp_path, stage, plat, model, tech, bs, status, tps=None, runs=(), protocol=None, results="results",
          reason="CUDA out of memory. Tried to allocate 2.00 GiB", gpus=1, samples=None):
    proto = protocol or {"warmup_steps": 3, "measured_steps": 10, "repeats": max(1, len(runs))}
    g = grid.expand({"protocol": proto, stage: [
        {"platforms": [plat], "models": [model], "techniques": [tech], "batch_sizes": [bs], "gpus": gpus}]})
    cell = g.cells[0]
    if status == "ok":
        runs = runs or (tps,)
        m = Metrics(tokens_per_s_mean=sum(runs) / len(runs), tokens_per_s_std=pd.Series(runs).std() if len(runs) > 1 else 0.0,
                    tokens_per_s_runs=tuple(runs), peak_mem_allocated_gib=10.0, peak_mem_reserved_gib=11.0)
        r = Record(cell=cell.to_dict(), status="ok", metrics=m, samples=samples or {})
    else:
        r = Record(cell=cell.to_dict(), status=status, reason=reason)
    path = tmp_path / cell.record_path(results)
    record.write(r, path)
    return path


PAPER = {"warmup_steps": 30, "measured_steps": 100, "repeats": 3}


@pytest.fixture
def cov(tmp_path):
    paths = [
        write(tmp_path, "finetune", "h100", "llama2-7b", "L", 1, "ok", runs=(900.0, 910.0, 905.0), protocol=PAPER),
        write(tmp_path, "finetune", "h100", "llama2-7b", "QL", 1, "ok", 800.0),
        write(tmp_path, "finetune", "h100", "llama2-7b", "L+Z3", 1, "error", reason="repeat 0 exited with code 1"),
        write(tmp_path, "pretrain", "h100", "llama2-7b", "Q", 1, "ok", 1700.0),
        write(tmp_path, "pretrain", "h100", "llama2-7b", "Z3+O", 1, "oom", reason="host out of memory (oom_kill 0 -> 1)"),
        write(tmp_path, "pretrain", "cpu", "tiny", "Z3", 1, "ok", 100.0),  # no GPU platform: not covered
    ]
    return coverage.build(tidy.build(paths))


def at(df, stage, model, tech):
    return df[(df.stage == stage) & (df.model == model) & (df.technique == tech)].iloc[0]


def test_every_paper_row_is_there_once_per_gpu_platform(cov):
    rows = coverage.paper_rows()
    assert set(cov["platform"]) == {"h100"} and set(cov["gpus"]) == {1}
    assert len(cov) == len(rows) and not cov.duplicated(["stage", "model", "technique"]).any()
    # the paper's Tables III (pre-training) and IX (fine-tuning), every model
    assert {("pretrain", "llama2-13b"), ("finetune", "llama2-70b"), ("finetune", "llama2-13b")} <= set(
        zip(cov["stage"], cov["model"]))
    assert set(cov["answer"]) <= set(coverage.ANSWERS)


def test_answers_and_what_is_left_to_do(cov):
    lora = at(cov, "finetune", "llama2-7b", "L")
    assert (lora.answer, lora.paper_protocol, lora.to_do) == ("measured", True, "search the largest batch")
    assert lora.cv == pytest.approx(pd.Series([900.0, 910.0, 905.0]).std() / 905.0)
    ql = at(cov, "finetune", "llama2-7b", "QL")
    assert ql.paper_protocol is False or ql.paper_protocol == False  # noqa: E712 (numpy bool)
    assert ql.to_do == "rerun under the paper's protocol; search the largest batch" and pd.isna(ql.cv)
    failed = at(cov, "finetune", "llama2-7b", "L+Z3")
    assert (failed.answer, failed.to_do) == ("error", "run batch 1") and "exited with code 1" in failed.why
    oom = at(cov, "pretrain", "llama2-7b", "Z3+O")
    assert (oom.answer, oom.to_do) == ("out of memory", "") and "host out of memory" in oom.why
    # 7B full-parameter training needs its fp32 states: more than one 80 GiB GPU holds
    naive = at(cov, "pretrain", "llama2-7b", "Naive")
    assert naive.answer == "predicted not to fit" and naive.to_do == "" and "> 80 GiB" in naive.why
    assert naive.predicted_fits == False  # noqa: E712
    # a row nobody ran that the model says fits is a run to make, not a silent gap
    lz2 = at(cov, "finetune", "llama2-7b", "L+Z2")
    assert (lz2.answer, lz2.to_do, lz2.predicted_fits) == ("not run", "run batch 1", True)


def test_a_row_under_the_protocol_shows_the_spread_within_a_process_beside_the_spread_between(tmp_path):
    """The CV is between repeats (processes); the step samples give the spread within each
    (median over repeats of its step-time CV): here steady steps in each of three processes
    that ran at different speeds, so the CV is large and the spread within is nil."""
    times = [0.40] * 4 + [0.44] * 4 + [0.40] * 4
    samples = {"repeat": [0] * 4 + [1] * 4 + [2] * 4, "step": list(range(4)) * 3, "step_time_s": times}
    path = write(tmp_path, "finetune", "h100", "llama2-7b", "L", 1, "ok", runs=(875.0, 795.0, 875.0),
                 protocol=PAPER, samples=samples)
    row = at(coverage.build(tidy.build([path])), "finetune", "llama2-7b", "L")
    assert row.cv == pytest.approx(pd.Series([875.0, 795.0, 875.0]).std() / 848.33, rel=1e-3)
    assert row.cv_in_repeat == 0.0
    shown = coverage.table(coverage.build(tidy.build([path]))).parts[1].frame
    mine = (shown["Method"] == "L") & (shown["Model"] == "llama2-7b")
    assert shown.loc[mine, ["CV %", "Step CV in repeat %", "Step drift in repeat %"]].values.tolist() == \
        [["5.4", "0.0", "0.0"]]


def test_a_row_whose_steps_still_sped_up_shows_its_drift(tmp_path):
    """Each repeat's first third of measured steps ran 10% slower than its last third: the
    warm-up did not reach the steady state, and the row says so."""
    times = [0.44] * 3 + [0.42] * 3 + [0.40] * 3
    samples = {"repeat": [0] * 9, "step": list(range(9)), "step_time_s": times}
    path = write(tmp_path, "finetune", "h100", "llama2-7b", "L", 1, "ok", runs=(875.0,), samples=samples)
    cov = coverage.build(tidy.build([path]))
    assert at(cov, "finetune", "llama2-7b", "L").drift_in_repeat == pytest.approx(0.1)
    shown = coverage.table(cov).parts[1].frame
    mine = (shown["Method"] == "L") & (shown["Model"] == "llama2-7b")
    assert shown.loc[mine, "Step drift in repeat %"].tolist() == ["10.0"]


def test_a_searched_row_has_no_search_left(tmp_path):
    paths = [write(tmp_path, "pretrain", "h100", "llama2-7b", "Q", 1, "ok", runs=(1700.0, 1710.0, 1705.0),
                   protocol=PAPER)]
    search = tmp_path / "results/runs/search/pretrain/h100/llama2-7b/deepspeed/Q-g1/search.json"
    search.parent.mkdir(parents=True)
    search.write_text('{"largest_ok": 26}')
    paths.append(write(tmp_path, "pretrain", "h100", "llama2-7b", "Q", 26, "ok", 11000.0))
    q = at(coverage.build(tidy.build(paths)), "pretrain", "llama2-7b", "Q")
    assert (q.answer, q.searched_max_batch, q.best_batch_size, q.to_do) == ("measured", 26, 26, "")


def test_a_cell_measured_again_elsewhere_keeps_its_search(tmp_path):
    """The searched cell measured again in another run (here under the paper's protocol, so
    that record is the one the tables use): the search of the first run still counts."""
    paths = [write(tmp_path, "pretrain", "h100", "llama2-7b", "Q", 1, "ok", runs=(1700.0, 1710.0, 1705.0),
                   protocol=PAPER, results="first")]
    search = tmp_path / "first/runs/search/pretrain/h100/llama2-7b/deepspeed/Q-g1/search.json"
    search.parent.mkdir(parents=True)
    search.write_text('{"largest_ok": 26}')
    paths.append(write(tmp_path, "pretrain", "h100", "llama2-7b", "Q", 26, "ok", 11000.0, results="first"))
    paths.append(write(tmp_path, "pretrain", "h100", "llama2-7b", "Q", 26, "ok", runs=(11100.0, 11050.0, 11080.0),
                       protocol=PAPER, results="again"))
    df = tidy.build(paths)
    used = df[(df.technique == "Q") & (df.batch_size == 26)]
    assert len(used) == 1 and used.iloc[0].run == "again" and used.iloc[0].searched_max_batch == 26
    q = at(coverage.build(df), "pretrain", "llama2-7b", "Q")
    assert (q.searched_max_batch, q.best_batch_size, q.to_do) == (26, 26, "")


def test_a_searched_batch_whose_cell_ran_out_of_memory_steps_down_to_the_next_that_fit(tmp_path):
    """A measured cell can run out of memory where its probe fit (more steps, more
    fragmentation): Table IV's batch becomes the next probe down that fit, and the row
    asks for that cell (`measure the searched batch`) until it is measured."""
    paths = [write(tmp_path, "finetune", "h100", "llama2-7b", "L+R", 1, "ok", runs=(800.0, 805.0, 802.0),
                   protocol=PAPER)]
    folder = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1"
    folder.mkdir(parents=True)
    (folder / "search.json").write_text(
        '{"largest_ok": 207, "probes": [{"batch_size": 203, "status": "ok"}, {"batch_size": 208, "status": "tight"},'
        ' {"batch_size": 207, "status": "ok"}]}')
    paths.append(write(tmp_path, "finetune", "h100", "llama2-7b", "L+R", 207, "oom"))
    df = tidy.build(paths)
    assert set(df[df.technique == "L+R"].searched_max_batch) == {203}
    row = at(coverage.build(df), "finetune", "llama2-7b", "L+R")
    assert (row.searched_max_batch, row.to_do) == (203, coverage.MEASURE_TODO)
    g = grid.expand({"protocol": {"repeats": 1}, "finetune": [
        {"platforms": ["h100"], "models": ["llama2-7b"], "techniques": ["L+R"], "gpus": 1, "max_batch": {"max": 512}}]})
    cov = coverage.build(df)
    assert coverage.targets(cov, g, (coverage.MEASURE_TODO,)) == [
        "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1"]
    assert coverage.targets(cov, g, (coverage.SEARCH_TODO,)) == []
    # measured there: nothing left
    paths.append(write(tmp_path, "finetune", "h100", "llama2-7b", "L+R", 203, "ok", 9000.0))
    row = at(coverage.build(tidy.build(paths)), "finetune", "llama2-7b", "L+R")
    assert (row.searched_max_batch, row.best_batch_size, row.to_do) == (203, 203, "")


def test_a_search_that_stopped_at_its_max_batch_is_searched_again_past_it(tmp_path):
    """A search whose every batch fit up to its max_batch found a lower bound, not the
    largest batch (h100 llama2-7b R+Q: 128 of max 128, predicted to fit about 230): the row
    asks for a search past it, and its search folder is a target of that to-do. A later
    search that found where memory runs out answers it."""
    paths = [write(tmp_path, "pretrain", "h100", "llama2-7b", "R+Q", 1, "ok", runs=(1170.0, 1180.0, 1175.0),
                   protocol=PAPER)]

    def search(results, body):
        folder = tmp_path / results / "runs/search/pretrain/h100/llama2-7b/deepspeed/R+Q-g1"
        folder.mkdir(parents=True)
        (folder / "search.json").write_text(body)

    search("results", '{"largest_ok": 128, "smallest_oom": null, "max_batch": 128}')
    paths.append(write(tmp_path, "pretrain", "h100", "llama2-7b", "R+Q", 128, "ok", 8900.0))
    df = tidy.build(paths)
    assert df.loc[df.batch_size == 128, "searched_to_cap"].tolist() == [True]
    row = at(coverage.build(df), "pretrain", "llama2-7b", "R+Q")
    assert (row.searched_max_batch, row.best_batch_size) == (128, 128)
    assert row.to_do == f"{coverage.SEARCH_TODO} past max_batch 128"
    g = grid.expand({"protocol": {"repeats": 1}, "pretrain": [
        {"platforms": ["h100"], "models": ["llama2-7b"], "techniques": ["R+Q"], "gpus": 1,
         "max_batch": {"max": 1024}}]})
    assert coverage.targets(coverage.build(df), g, (coverage.SEARCH_TODO,)) == [
        "results/runs/search/pretrain/h100/llama2-7b/deepspeed/R+Q-g1"]
    # searched again with a larger max: the limit found, the row's batch is that search's
    search("again", '{"largest_ok": 230, "smallest_oom": 231, "max_batch": 1024}')
    paths.append(write(tmp_path, "pretrain", "h100", "llama2-7b", "R+Q", 230, "ok", 9100.0, results="again"))
    df = tidy.build(paths)
    assert not df.loc[df.batch_size == 230, "searched_to_cap"].iloc[0]
    row = at(coverage.build(df), "pretrain", "llama2-7b", "R+Q")
    assert (row.searched_max_batch, row.best_batch_size, row.to_do) == (230, 230, "")


def test_a_search_whose_run_holds_only_its_probes_still_counts(tmp_path):
    """A search stopped before its measured cell (its run holds the probes and search.json):
    the row's batch is the search's, and what is left is to measure it there."""
    paths = [write(tmp_path, "finetune", "h200", "llama2-13b", "L+R", 1, "ok", runs=(800.0, 805.0, 802.0),
                   protocol=PAPER, results="sweep")]
    probe = write(tmp_path, "finetune", "h200", "llama2-13b", "L+R", 261, "ok", 6000.0, results="search")
    folder = tmp_path / "search/runs/search/finetune/h200/llama2-13b/deepspeed/L+R-g1"
    (folder / "bs261").mkdir(parents=True)
    probe.rename(folder / "bs261/record.json")
    (folder / "search.json").write_text('{"largest_ok": 261, "probes": [{"batch_size": 261, "status": "ok"}]}')
    df = tidy.build([*paths, folder / "bs261/record.json"])
    assert df.loc[df.kind == "probe", "searched_max_batch"].isna().all()
    row = at(coverage.build(df), "finetune", "llama2-13b", "L+R")
    assert (row.searched_max_batch, row.to_do) == (261, coverage.MEASURE_TODO)


def test_the_gpu_count_is_the_one_most_batch_1_records_used(tmp_path):
    paths = [write(tmp_path, "finetune", "h200", "llama2-7b", t, 1, "ok", 800.0) for t in ("L", "QL")]
    paths.append(write(tmp_path, "pretrain", "h200", "llama2-7b", "Q", 1, "ok", 3000.0, gpus=2))
    cov = coverage.build(tidy.build(paths))
    assert set(cov["gpus"]) == {1}
    assert at(cov, "pretrain", "llama2-7b", "Q").answer == "not run"  # its 2-GPU record is not the 1-GPU row


def test_offload_is_held_to_the_smaller_host_of_the_platform_file_and_the_machine(tmp_path):
    # h200.yaml describes a two-GPU node (234 GiB of host memory); its one-GPU records ran on a
    # machine with 125.87 GiB: 7B R+Z2+O's fp32 states (about 134 GiB) fit the first, not the second
    def build(host):
        path = write(tmp_path / str(host), "finetune", "h200", "llama2-7b", "L", 1, "ok", 800.0)
        r = record.read(path)
        record.write(Record(cell=r.cell, status=r.status, metrics=r.metrics,
                            provenance={"host": {"mem_total_gib": host}} if host else {}), path)
        return at(coverage.build(tidy.build([path])), "pretrain", "llama2-7b", "R+Z2+O")

    assert (build(None).answer, build(500).answer) == ("not run", "not run")
    small = build(125.87)
    assert small.answer == "predicted not to fit" and "> 125.87 GiB" in small.why and "host" in small.why
    from llmbench.memory import machine_host_gib
    plat = {"slurm": {"mem_mb": 240000}}
    assert machine_host_gib(plat, float("nan")) == machine_host_gib(plat, None) == 240000 / 1024
    assert machine_host_gib(plat, 125.87) == 125.87 and machine_host_gib({}, 125.87) == 125.87


def test_the_page_summarises_and_lists_every_row(cov, tmp_path):
    t = coverage.table(cov)
    summary = t.parts[0].frame.set_index("Stage")
    assert summary.loc["finetune", "measured"] == "2" and summary.loc["finetune", "under the protocol"] == "1"
    assert summary.loc["finetune", "CV <= 2%"] == "1" and summary.loc["pretrain", "out of memory"] == "1"
    assert int(summary.loc["pretrain", "Rows"]) + int(summary.loc["finetune", "Rows"]) == len(cov)
    assert t.parts[1].heading == "h100 x 1 GPU" and len(t.parts[1].frame) == len(cov)
    render.write(t, tmp_path / "c.csv", tmp_path / "c.md", tmp_path / "c.html")
    assert len(pd.read_csv(tmp_path / "c.csv")) == len(cov)
    assert "predicted not to fit" in (tmp_path / "c.md").read_text()


def test_no_gpu_record_gives_an_empty_page_that_says_why(tmp_path):
    df = tidy.build([write(tmp_path, "pretrain", "cpu", "tiny", "Z3", 1, "ok", 100.0)])
    t = tables.coverage(tables.Inputs({"tidy_pretrain": df, "tidy_finetune": df.iloc[0:0]}))
    assert t.long.empty and "nothing to cover" in t.parts[0].note


def test_search_targets_are_the_folders_of_rows_whose_batch_1_ran_ok(cov):
    """`search the largest batch`: the config's max-batch searches whose row ran ok at batch 1
    and has no searched batch yet (h100's L and QL; not L+Z3, whose batch 1 failed, nor a
    platform no record ran on), in the config's order."""
    g = grid.expand({"protocol": {"repeats": 1}, "finetune": [
        {"platforms": ["h100", "h200"], "models": ["llama2-7b"], "techniques": ["L", "QL", "L+Z2", "L+Z3"],
         "gpus": 1, "max_batch": {"max": 64}}]})
    folders = ["results/runs/search/finetune/h100/llama2-7b/deepspeed/L-g1",
               "results/runs/search/finetune/h100/llama2-7b/deepspeed/QL-g1"]
    assert coverage.targets(cov, g, (coverage.SEARCH_TODO,)) == folders
    assert coverage.targets(cov, g, (coverage.SEARCH_TODO,), platforms=["h200"]) == []
    assert coverage.targets(cov, g) == []  # the default, run batch 1, names no search


def test_targets_are_the_cells_still_to_do(cov, tmp_path, capsys):
    """A config's batch-1 cells whose coverage row says `run batch 1` (or the protocol rerun,
    when asked), in the config's order; a platform no record ran on is all to do."""
    g = grid.expand({"protocol": {"repeats": 1}, "finetune": [
        {"platforms": ["h100", "h200"], "models": ["llama2-7b"], "techniques": ["L", "QL", "L+Z2", "L+Z3"],
         "batch_sizes": [1], "gpus": 1}]})
    got = coverage.targets(cov, g)
    assert got == ["results/runs/finetune/h100/llama2-7b/deepspeed/L+Z2/bs1-g1/record.json",
                   "results/runs/finetune/h100/llama2-7b/deepspeed/L+Z3/bs1-g1/record.json",
                   *[f"results/runs/finetune/h200/llama2-7b/deepspeed/{t}/bs1-g1/record.json"
                     for t in ("L", "QL", "L+Z2", "L+Z3")]]
    rerun = coverage.targets(cov, g, ("rerun under the paper's protocol",), platforms=["h100"])
    assert rerun == ["results/runs/finetune/h100/llama2-7b/deepspeed/QL/bs1-g1/record.json"]
    csv, cfg = tmp_path / "coverage.csv", tmp_path / "c.yaml"
    cov.to_csv(csv, index=False)
    cfg.write_text("protocol: {repeats: 1}\nfinetune:\n  - {platforms: [h100], models: [llama2-7b], "
                   "techniques: [L, L+Z2], batch_sizes: [1], gpus: 1}\n")
    assert coverage.main(["targets", str(csv), str(cfg)]) == 0
    assert capsys.readouterr().out.split() == ["results/runs/finetune/h100/llama2-7b/deepspeed/L+Z2/bs1-g1/record.json"]
    cfg.write_text("protocol: {repeats: 1}\nfinetune:\n  - {platforms: [h100], models: [llama2-7b], techniques: [L+Q+X]}\n")
    with pytest.raises(SystemExit) as exc:
        coverage.main(["targets", str(csv), str(cfg)])
    assert exc.value.code == 2 and "L+Q+X" in capsys.readouterr().err


def test_a_row_beyond_the_papers_that_ran_at_batch_1_is_covered_after_them(tmp_path):
    """llama2-70b QL (beyond the paper: Table IX has no 70B QL row) ran ok at batch 1:
    it gets a row, "beyond IX", after the paper's, with its search to do, and the search
    targets name its folder. The tiny model's cell on the same GPU is no paper model's."""
    paths = [write(tmp_path, "finetune", "h100", "llama2-70b", "QL", 1, "ok", 290.0),
             write(tmp_path, "pretrain", "h100", "tiny", "Z3", 1, "ok", 100.0)]
    cov = coverage.build(tidy.build(paths))
    assert len(cov) == len(coverage.paper_rows()) + 1
    extra = cov.iloc[-1]
    assert (extra.paper_tables, extra.model, extra.technique, extra.answer) == ("beyond IX", "llama2-70b", "QL",
                                                                                 "measured")
    assert extra.to_do == "rerun under the paper's protocol; search the largest batch"
    assert "tiny" not in set(cov["model"])
    g = grid.expand({"protocol": {"repeats": 1}, "finetune": [
        {"platforms": ["h100"], "models": ["llama2-70b"], "techniques": ["QL", "QL+F"], "gpus": 1,
         "max_batch": {"max": 64}}]})
    assert coverage.targets(cov, g, (coverage.SEARCH_TODO,)) == [
        "results/runs/search/finetune/h100/llama2-70b/deepspeed/QL-g1"]
