"""The rules' resources, read from Snakemake's own dry-run plan of the tests' grid (.test/config.yaml;
the embedded default is the users' to edit)."""

import json
import os
import re
import subprocess

from conftest import BIN, REPO


def plan() -> dict[str, int]:
    """output record -> threads, as `snakemake -n` schedules them (1 when not printed)."""
    out = subprocess.run([BIN / "snakemake", "-n", "--nolock", "--cores", "2", "--forceall", "-d", str(REPO),
                          "--configfile", ".test/config.yaml"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    threads = {}
    for job in re.split(r"\n(?=rule |localrule )", out):
        m = re.search(r"output: (\S+record\.json)", job)
        if m:
            t = re.search(r"threads: (\d+)", job)
            threads[m.group(1)] = int(t.group(1)) if t else 1
    return threads


def test_a_cpu_cell_holds_a_core_per_rank():
    """A 2-process CPU cell beside a 1-core cell would share cores and measure contention,
    not scaling (it measured 61% instead of 99%); serving and micro cells take the machine."""
    threads = plan()
    assert threads[".test/results/runs/pretrain/cpu/tiny/deepspeed/Q/bs1-g2/record.json"] == 2
    assert threads[".test/results/runs/pretrain/cpu/tiny/deepspeed/Q/bs1-g1/record.json"] == 1
    assert all(t == min(2, os.cpu_count()) for p, t in threads.items() if "/serve/" in p or "/micro/" in p)


def test_every_search_is_planned_at_once():
    """An input function stops at the first unfinished checkpoint: with searched_records()
    alone Snakemake learnt of one search at a time (the H200 pair's two Megatron-LM searches
    ran one after the other). The searches' folders are plain inputs of the targets."""
    out = subprocess.run([BIN / "snakemake", "pretrain", "-n", "--nolock", "--cores", "2", "-d", str(REPO),
                          "--configfile", "config/gpu-h200x2-table2.yaml"],
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
