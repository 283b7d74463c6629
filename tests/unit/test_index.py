"""results/README.md is the index of the committed runs, generated from their READMEs
(llmbench.report.index): the committed file must equal the generator's output. The runs
it lists hold whole results: no state of a set stopped before it wrote its records."""

import re
from pathlib import Path

import pytest

from llmbench import ledger
from llmbench.report import index
from llmbench.serve import paired

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "PYTHONPATH=workflow/scripts .venv/bin/python -m llmbench.report.index results/reference > results/README.md"


def test_the_committed_index_is_the_generated_one():
    committed = (REPO / "results" / "README.md").read_text()
    assert committed == index.render(REPO / "results" / "reference"), f"results/README.md is stale: {REGENERATE}"


def test_no_committed_run_holds_a_stopped_sets_kept_runs():
    """A kept repeat or serving run (llmbench.ledger.PARTIAL, llmbench.serve.paired.KEPT) is the
    state of a set stopped before its records were written: it belongs to the results folder
    that resumes the set, never to a committed run, whose records are its whole result."""
    kept = re.compile(re.escape(ledger.PARTIAL).replace(r"\{index\}", r"\d+") + "$")
    names = {paired.KEPT, paired.KEPT_SERVER_LOG}
    found = [str(p.relative_to(REPO)) for p in (REPO / "results" / "reference").rglob(".*")
             if p.name in names or kept.match(p.name)]
    assert not found, f"kept runs of a stopped set in committed runs: {found}"


def _run(root: Path, name: str, text: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "README.md").write_text(text)


def test_a_row_per_run_with_its_title_and_machine_up_to_the_first_semicolon(tmp_path):
    _run(tmp_path, "2026-01-02-b", "# Second | run\n\n**What**: x\n\n**Machine**: two GPUs\nof one host; details.\n")
    _run(tmp_path, "2026-01-01-a", "# First run\n\n**Machine**: one GPU.\n\n**Command**: y\n")
    _run(tmp_path, "combined", "# The combined view\n\n**Machine**: none\n")
    assert [(r.name, r.title, r.machine) for r in index.runs(tmp_path)] == [
        ("2026-01-01-a", "First run", "one GPU"), ("2026-01-02-b", "Second | run", "two GPUs of one host")]
    text = index.render(tmp_path)
    assert text.startswith(index.HEADER)
    table = text[len(index.HEADER):].strip().splitlines()
    assert len(table) == 4  # header, rule, two runs: the combined view is named in the header, not a row
    assert "[2026-01-01-a](reference/2026-01-01-a/README.md)" in table[2] and "Second \\| run" in table[3]


@pytest.mark.parametrize("readme, says", [
    (None, "no README.md"),
    ("no title\n\n**Machine**: x\n", "first line must be the title"),
    ("# Title\n\n**What**: no machine\n", "no '**Machine**:' paragraph"),
])
def test_a_folder_whose_readme_the_index_cannot_read_is_named(tmp_path, readme, says, capsys):
    (tmp_path / "2026-01-01-a").mkdir()
    if readme is not None:
        (tmp_path / "2026-01-01-a" / "README.md").write_text(readme)
    with pytest.raises(index.ReadmeError, match=re.escape(says)) as err:
        index.render(tmp_path)
    assert "2026-01-01-a" in str(err.value)
    assert index.main([str(tmp_path)]) == 1
    assert "2026-01-01-a" in capsys.readouterr().err
