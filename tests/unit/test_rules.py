"""The rules' resources, read from Snakemake's own dry-run plan of the tests' grid (.test/config.yaml;
the embedded default is the users' to edit)."""

import json
import os
import re
import shutil
import subprocess

import yaml

from conftest import BIN, REPO


def plan(config: str = ".test/config.yaml", output: str = r"\S+record\.json", cores: int = 2) -> dict[str, int]:
    """output (a record, or what ``output`` matches) -> threads, as `snakemake -n` schedules
    them on ``cores`` (1 when not printed)."""
    out = subprocess.run([BIN / "snakemake", "-n", "--nolock", "--cores", str(cores), "--forceall", "-d", str(REPO),
                          "--configfile", config], cwd=REPO, capture_output=True, text=True, check=True).stdout
    threads = {}
    for job in re.split(r"\n(?=rule |localrule )", out):
        m = re.search(rf"output: ({output})", job)
        if m:
            t = re.search(r"threads: (\d+)", job)
            threads[m.group(1)] = int(t.group(1)) if t else 1
    return threads


def test_a_cpu_cell_holds_a_core_per_rank():
    """A 2-process CPU cell beside a 1-core cell would share cores and measure contention,
    not scaling (it measured 61% instead of 99%); serving and micro cells take the machine."""
    threads = plan()
    assert threads[".test/results/runs/pretrain/cpu/tiny/deepspeed/Q/bs2-g2/record.json"] == 2
    assert threads[".test/results/runs/pretrain/cpu/tiny/deepspeed/Q/bs2-g1/record.json"] == 1
    assert all(t == min(2, os.cpu_count()) for p, t in threads.items() if "/serve/" in p or "/micro/" in p)


def test_a_model_directory_holds_eight_threads_only_for_a_large_model(tmp_path):
    """The tiny model's directory builds on one thread beside the cells; a 7B one fills its
    random weights one tensor a thread, on 8."""
    model_dir = r"\S+/models/[^/\s]+/(?:random|dummy)"
    assert plan(output=model_dir, cores=16) == {".test/results/models/tiny/dummy": 1}
    tests = yaml.safe_load((REPO / ".test/config.yaml").read_text())
    big = {"results_dir": str(tmp_path / "results"), "protocol": tests["protocol"], "engine_python": tests["engine_python"],
           "serve": [{**tests["serve"][0], "platforms": ["h100"], "models": ["llama2-7b"]}]}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(big))
    assert plan(str(tmp_path / "big.yaml"), model_dir, cores=16) == {f"{tmp_path}/results/models/llama2-7b/dummy": 8}


def test_every_search_is_planned_at_once():
    """An input function stops at the first unfinished checkpoint: with searched_records()
    alone Snakemake learnt of one search at a time (the H200 pair's two Megatron-LM searches
    ran one after the other). The searches' folders are plain inputs of the targets."""
    out = subprocess.run([BIN / "snakemake", "pretrain", "-n", "--nolock", "--cores", "2", "-d", str(REPO),
                          "--configfile", "results/reference/2026-11-22-h200x2-table2/config.yaml"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    planned = set(re.findall(r"output: (\S+/runs/search/\S+)", out))
    assert planned == {"results/runs/search/pretrain/h200/llama2-7b/megatron-tp1pp1-distopt/Naive-g2",
                       "results/runs/search/pretrain/h200/llama2-7b/megatron-tp2pp1/Naive-g2"}


def test_a_searched_cell_that_ran_out_of_memory_plans_the_batch_below(tmp_path):
    """Snakemake's plan after a measured cell ran out of memory where its search's probe fit:
    the cell at the next batch whose probe fit (the search is not run again)."""
    results = tmp_path / ".test/results/runs"
    folder = results / "search/pretrain/cpu/tiny/deepspeed/Naive-g1"
    folder.mkdir(parents=True)
    probes = [{"batch_size": b, "status": st} for b, st in ((4, "ok"), (8, "ok"), (10, "oom"), (9, "ok"))]
    (folder / "search.json").write_text(json.dumps({"status": "ok", "largest_ok": 9, "probes": probes}))
    measured = results / "pretrain/cpu/tiny/deepspeed/Naive/bs9-g1/record.json"
    measured.parent.mkdir(parents=True)
    measured.write_text(json.dumps({"status": "oom"}))
    (tmp_path / ".venv-vllm").symlink_to(REPO / ".venv-vllm")  # the config's engine interpreter, checked on load
    out = subprocess.run([BIN / "snakemake", "pretrain", "-n", "--nolock", "--cores", "2", "-s", REPO / "Snakefile",
                          "-d", tmp_path, "--configfile", REPO / ".test/config.yaml"],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    planned = set(re.findall(r"output: (\S+/deepspeed/Naive\S*)", out))
    assert ".test/results/runs/pretrain/cpu/tiny/deepspeed/Naive/bs8-g1/record.json" in planned, planned
    assert not any("/runs/search/" in p or "/bs9-g1/" in p for p in planned), planned


def test_the_combined_view_lists_the_searches_of_the_folders_it_reads(tmp_path):
    """A config of other results folders' records (evidence_dirs: the combined view) has no
    searches of its own: its search table lists theirs, one row per search (the folder
    llmbench.report.runs.choose_searches picks), joined with the record of the cell the
    search measured that every table uses (here the one under the stronger protocol)."""
    import pandas as pd

    from llmbench import grid, record
    from llmbench.record import Metrics, Record

    def run(name, n_probes, protocol, tps):
        g = grid.expand({"protocol": protocol, "finetune": [{"platforms": ["h100"], "models": ["llama2-7b"],
                                                              "techniques": ["L"], "max_batch": {"max": 64}}]})
        s, root = g.searches[0], tmp_path / "reference" / name
        folder = tmp_path / s.record_path(str(root))
        folder.mkdir(parents=True)
        probes = [{"batch_size": b, "status": "ok", "source": "run"} for b in range(1, n_probes)] + \
                 [{"batch_size": 40, "status": "oom", "source": "run"}]
        (folder / "search.json").write_text(json.dumps({
            **{k: v for k, v in s.key.items() if k != "batch_size"}, "status": "ok", "reason": "",
            "largest_ok": n_probes - 1, "smallest_oom": 40, "max_batch": 64, "capacity_gib": 80.0,
            "probes": probes, "n_probes": n_probes, "n_run": n_probes, "bound": 9, "search_wall_s": 1.0,
            "search_gpu_s": 1.0}))
        cell = s.measured(n_probes - 1)
        record.write(Record(cell=cell.to_dict(), status="ok", metrics=Metrics(tokens_per_s_mean=tps)),
                     cell.record_path(str(root)))

    run("2026-01-01-a", 3, {"warmup_steps": 1, "measured_steps": 5, "repeats": 1}, 200.0)
    run("2026-01-02-b", 3, {"warmup_steps": 1, "measured_steps": 2, "repeats": 1}, 100.0)  # same search, same cell
    (tmp_path / "combined.yaml").write_text("results_dir: out\nprotocol: {}\nevidence_dirs: [reference/2026-*]\n")
    subprocess.run([BIN / "snakemake", "out/tables/search.csv", "--cores", "1", "-s", REPO / "Snakefile",
                    "-d", tmp_path, "--configfile", tmp_path / "combined.yaml"],
                   cwd=tmp_path, capture_output=True, text=True, check=True)
    table = pd.read_csv(tmp_path / "out/tables/search.csv")
    assert len(table) == 1 and table.iloc[0].largest_ok == 2 and table.iloc[0].measured_tokens_per_s == 200.0


def test_a_refit_of_the_throughput_model_rebuilds_the_advice_and_nothing_else(tmp_path):
    """The advice predicts tokens/s with the throughput model's fitted constants and interval
    widths: after `throughput calibrate --write` (or `interval --write`) rewrites one of them,
    Snakemake's plan rebuilds the advice for that file (before, the advice said nothing was to
    do, and only --forceall brought it up to date). A grid of no cell keeps the plan to the
    report's tables."""
    for part in ("Snakefile", "workflow", "config", "profiles"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, tmp_path / part)
    protocol = yaml.safe_load((REPO / ".test/config.yaml").read_text())["protocol"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"results_dir": "res", "protocol": protocol}))
    tables = tmp_path / "res/tables"
    tables.mkdir(parents=True)
    for name in ("records.csv", "records-superseded.csv", "advice.csv", "advice.md", "advice.html"):
        (tables / name).write_text("x\n")
    model = [tmp_path / "config/throughput/constants.yaml", tmp_path / "config/throughput/interval.yaml"]
    for path in [*(tmp_path / "config").rglob("*"), *tables.iterdir()]:
        os.utime(path, (1.6e9, 1.6e9) if path.parent == tables else (1.5e9, 1.5e9))

    def plan() -> str:
        return subprocess.run([BIN / "snakemake", "res/tables/advice.csv", "-n", "--nolock", "--cores", "1",
                               "--configfile", "c.yaml"], cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout

    assert "Nothing to be done" in plan()
    for path in model:
        os.utime(path, (1.7e9, 1.7e9))  # refitted after the advice was built
        out = plan()
        assert re.findall(r"^rule (\w+):", out, re.M) == ["build_advice"], out
        assert re.search(rf"reason: Updated input files: .*{path.relative_to(tmp_path)}", out), out
        os.utime(path, (1.5e9, 1.5e9))
