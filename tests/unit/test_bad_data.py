"""Bad data gets a clear error, as bad config does: a record cut short or edited by hand
stops the tables with one line naming the file, what is wrong and how to redo it; a model
file whose sizes contradict each other stops the workflow at parse time, naming the file
and the key, before any job."""

import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import BIN, REPO
from llmbench import grid, record
from llmbench.config import ConfigError
from llmbench.models import ModelSpec
from llmbench.record import Metrics, Record, RecordError
from llmbench.report import tidy

sys.path.insert(0, str(REPO / "tests"))
from workspaces import make_workspace, snakemake  # noqa: E402


def cell(technique="Naive", batch_size=1):
    g = grid.expand({"protocol": {"repeats": 1}, "pretrain": [{"platforms": ["cpu"], "models": ["tiny"],
                                                                "techniques": [technique], "batch_sizes": [batch_size]}]})
    return g.cells[0]


def write(path, c=None, tps=100.0):
    c = c or cell()
    record.write(Record(cell=c.to_dict(), status="ok", metrics=Metrics(tokens_per_s_mean=tps)), path)
    return path


def cut_short(path):
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # as an interrupted copy leaves it


def test_a_record_cut_short_names_its_file_what_is_wrong_and_how_to_rerun_its_cell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # paths as Snakemake gives them: relative to the working directory
    path = cell().record_path("results")
    write(tmp_path / path)
    cut_short(tmp_path / path)
    with pytest.raises(RecordError) as exc:
        tidy.build_all([path])
    line = str(exc.value)
    assert "\n" not in line
    assert line.startswith(f"{path}: cut short (not valid JSON) at line ")
    assert line.endswith(f"to rerun its cell, delete it and run snakemake {path} (with the run's config)")
    # this run's record: the same line from the adapter's wording
    assert tidy.record_error(exc.value, "results") == line


@pytest.mark.parametrize("text, what", [
    ("", "empty file"),
    ("[1, 2]", "not a record: a JSON list, not an object"),
    ('{"status": "ok"} }', "not valid JSON at line 1, column 18"),
    ('{"schema_version": 3, "status": "ok"}', "not a record this llmbench reads: "),
    ('{"schema_version": 3, "status": "done", "cell": {}}', "not a record this llmbench reads: status must be one of"),
])
def test_every_unreadable_record_says_what_is_wrong(tmp_path, text, what):
    path = tmp_path / cell().record_path("results")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(RecordError, match=re.escape(f"{path}: {what}")):
        record.read(path)


def test_a_record_that_lacks_a_field_the_table_reads_names_the_field(tmp_path):
    path = write(tmp_path / cell().record_path("results"))
    data = json.loads(path.read_text())
    del data["cell"]["protocol"]  # a hand edit
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=re.escape(f"{path}: no field 'protocol' where this llmbench reads one")):
        tidy.build_all([path])


def test_a_probe_is_redone_by_rerunning_its_search(tmp_path):
    g = grid.expand({"protocol": {}, "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"],
                                                   "max_batch": {"max": 8}}]})
    folder = g.searches[0].record_path("results")
    assert record.rerun_hint(f"{folder}/bs4/record.json") == (
        f"to rerun its max-batch search, delete {folder} and run snakemake {folder} (with the run's config)")


def test_another_results_folders_record_is_restored_not_deleted(tmp_path, monkeypatch):
    """An evidence_dirs record is not a target of this run: deleting it would only drop its
    row, so the line says to restore it (or rerun it with its own folder's config)."""
    monkeypatch.chdir(tmp_path)
    path = cell().record_path("reference/2026-01-01-a")
    write(tmp_path / path)
    cut_short(tmp_path / path)
    with pytest.raises(RecordError) as exc:
        tidy.build_all([path])
    line = tidy.record_error(exc.value, "out")
    assert line.startswith(f"{path}: cut short") and "delete it and run" not in line
    assert line.endswith(f"it is a record of evidence_dirs' reference/2026-01-01-a, which this run does not rerun: "
                         f"restore it (git checkout -- {path}) or rerun its cell with the config that made "
                         "reference/2026-01-01-a")


def test_snakemake_tables_stops_on_a_bad_record_with_one_line_and_no_traceback(tmp_path, monkeypatch):
    """A bad record stops the tidy table (it is not skipped: a reviewer must not get a
    silently smaller table), this run's and an evidence folder's alike."""
    monkeypatch.chdir(tmp_path)
    own, evidence = cell("Naive").record_path("out"), cell("Z3").record_path("reference/2026-01-01-a")
    write(tmp_path / evidence, cell("Z3"))
    write(tmp_path / own)
    cut_short(tmp_path / own)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "results_dir": "out", "protocol": {"repeats": 1}, "evidence_dirs": ["reference/2026-*"],
        "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"], "batch_sizes": [1]}]}))

    def expected(path):
        with pytest.raises(RecordError) as exc:
            record.read(path)
        return tidy.record_error(exc.value, "out")

    def tidy_table():
        # mtime only: the hand-made record has no Snakemake metadata, and the cell must not run
        return subprocess.run([BIN / "snakemake", "out/tables/records.csv", "--cores", "1", "--rerun-triggers", "mtime",
                               "-s", REPO / "Snakefile", "-d", tmp_path, "--configfile", tmp_path / "run.yaml"],
                              cwd=tmp_path, capture_output=True, text=True)

    res = tidy_table()
    assert res.returncode != 0 and not (tmp_path / "out/tables/records.csv").exists()
    line = expected(own)
    assert line.startswith(f"{own}: cut short") and line.endswith(f"delete it and run snakemake {own} (with the run's config)")
    assert line in res.stderr.splitlines(), res.stderr
    assert "Traceback" not in res.stderr and "JSONDecodeError" not in res.stderr
    assert "rule run_training_cell" not in res.stdout + res.stderr  # the cell did not run again

    write(tmp_path / own)  # its cell rerun; now the evidence record is cut short
    cut_short(tmp_path / evidence)
    res = tidy_table()
    assert res.returncode != 0 and not (tmp_path / "out/tables/records.csv").exists()
    line = expected(evidence)
    assert line.startswith(f"{evidence}: cut short") and f"restore it (git checkout -- {evidence})" in line
    assert line in res.stderr.splitlines(), res.stderr
    assert "Traceback" not in res.stderr and "JSONDecodeError" not in res.stderr


TINY = yaml.safe_load((REPO / "config/models/tiny.yaml").read_text())


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": 3}, "num_attention_heads: 3 does not divide hidden_size 64"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads: 3 does not divide num_attention_heads 4"),
    ({"hidden_size": 66, "num_attention_heads": 2, "num_key_value_heads": 2},
     "num_attention_heads: 2 gives heads 33 wide (hidden_size 66); RoPE rotates pairs"),
    ({"intermediate_size": 0}, "intermediate_size: 0 is less than the minimum of 8"),
])
def test_a_model_whose_sizes_contradict_each_other_is_a_config_error_naming_file_and_key(tmp_path, change, message):
    folder = tmp_path / "config" / "models"
    folder.mkdir(parents=True)
    (folder / "bad.yaml").write_text(yaml.safe_dump({**TINY, "name": "bad", **change}))
    with pytest.raises(ConfigError, match="(?s)" + re.escape(f"{folder / 'bad.yaml'}: ") + ".*" + re.escape(message)):
        ModelSpec.load("bad", tmp_path)
    # a spec made without a file (from a record's provenance) is held to the same rules
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelSpec(**{**TINY, **change})


def test_the_shipped_models_pass():
    for name in ("tiny", "llama2-7b", "llama2-13b", "llama2-70b"):
        assert ModelSpec.load(name).name == name


def test_a_dry_run_with_a_bad_model_stops_before_any_job(tmp_path):
    """Before, `num_attention_heads: 3` on `hidden_size: 64` passed `snakemake -n` and would
    have failed inside a worker; now the workflow stops at parse time."""
    ws = make_workspace(tmp_path / "ws")  # models are read beside the Snakefile
    (ws / "config/models/bad.yaml").write_text(yaml.safe_dump({**TINY, "name": "bad", "num_attention_heads": 3}))
    (ws / "bad.yaml").write_text(yaml.safe_dump({"results_dir": "out", "protocol": {}, "pretrain": [
        {"platforms": ["cpu"], "models": ["bad"], "techniques": ["Naive"], "batch_sizes": [1]}]}))
    res = snakemake(ws, "-n", "--cores", "1", "--configfile", "bad.yaml", timeout=300)
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "invalid configuration (nothing was run)" in out
    assert f"{ws / 'config/models/bad.yaml'}: num_attention_heads: 3 does not divide hidden_size 64" in out
    assert "Job stats" not in out and "rule run_training_cell" not in out
