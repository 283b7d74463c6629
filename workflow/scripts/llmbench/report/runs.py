"""Which record of a cell the report uses when several runs (results folders) hold one: the
combined view reads every reference run, and a cell measured again under a stronger
protocol must not be averaged with, or hidden behind, its earlier measurement.

The one rule, applied where the tidy table and the per-row tables are built (llmbench.report.tidy),
so every table, finding, figure and the advisor use the same record of a cell. Of the
records of one cell (one path below the results folder: the path is a pure function of the
cell's fields, llmbench.cells), the report uses the first by:

1. a result before none: ok or oom (the paper's "-") before error, timeout or skipped (a
   probe a search's frontier answered without running, a cell the memory model skipped);
2. the stronger protocol: more measured steps x repeats (serving: requests of the load;
   microbenchmarks: timed iterations);
3. the later run: the record's provenance start time (ISO 8601, UTC);
4. the results folder's name, last in sort order (only where all of the above tie).

The others are superseded, not dropped: the tidy table's row of the cell says how many runs
held it (``runs``) and which it was chosen over and why (``choice``); their own rows are kept
apart (tables/records-superseded.csv) with the run that superseded them (``superseded_by``).
One results folder holds one record per cell, so with one folder nothing is superseded.

A max-batch search several folders hold (its folder's path below each results folder is the
same) is read from one of them (choose_searches): one with its summary before one without,
then a search that ended with an answer (status ok) before one a probe's error or timeout
stopped (a search run again after such a stop may start afresh, with fewer probes), then
one that found a batch too large for the GPU (``smallest_oom``) before one that stopped at
its cap with every probe fitting (its answer only a lower bound; a search rerun with a
higher cap finds the edge), then the one with more probes (a search resumed in a later run
holds the earlier run's probes, answered from its frontier file), then the folder name last
in sort order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path, PurePosixPath
from collections.abc import Iterable

from .. import cells
from ..record import Record

#: statuses that are a measurement's result (DESIGN: an OOM is a result, not a failed job)
RESULTS = ("ok", "oom")
#: columns the choice adds to the tidy table
COLUMNS = ["runs", "superseded_by", "choice"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One record of a cell, with what the rule compares."""

    path: str
    """The record file."""
    run: str
    """The results folder that holds it (the tidy table's ``run``)."""
    cell: str
    """The cell's identity: the record's path below its results folder."""
    status: str
    """The record's status."""
    strength: int
    """Measured steps x repeats (serving: requests; microbenchmarks: iterations); 0 unknown."""
    protocol: str
    """The protocol in words, for the choice's explanation."""
    started: str
    """The provenance's start time (ISO 8601), '' where the record has none."""

    def key(self) -> tuple:
        """The rule's order: larger is preferred."""
        return (self.status in RESULTS, self.strength, self.started, self.run)


def identity(path: str, patterns: tuple[str, ...] = tuple(cells.RECORD_PATTERNS)) -> str:
    """The cell a record path holds (or the search a search folder does, with
    ``patterns``): its path below the results folder (the path itself where it follows no
    pattern of the grammar, so it is never taken for another cell's)."""
    parsed = cells.parse(path, patterns)
    text = PurePosixPath(path).as_posix()
    return text[len(parsed.root):].lstrip("/") if parsed is not None else text


def protocol_of(cell: dict) -> tuple[int, str]:
    """How much a record's cell measured (measured steps x repeats for a training cell,
    requests for a serving cell, iterations for a microbenchmark) and that in words."""
    if cell.get("stage") == "serve":
        n = (cell.get("load_spec") or {}).get("num_requests") or 0
        return int(n), f"{n} requests"
    if cell.get("stage") == "micro":
        n = cell.get("iters") or 0
        return int(n), f"{cell.get('warmup', 0)} warm-up, {n} iterations"
    p = cell.get("protocol") or {}
    steps, repeats = p.get("measured_steps") or 0, p.get("repeats") or 0
    return int(steps) * int(repeats), f"{p.get('warmup_steps', 0)} warm-up, {steps} steps x {repeats}"


def steps_label(warmup: int, measured: int, repeats: int) -> str:
    """A training protocol in short: 'warm-up/measured steps/repeats' (the paper's: 30/100/3)."""
    return f"{int(warmup)}/{int(measured)}/{int(repeats)}"


def label_strength(label: str) -> int:
    """The rule's protocol strength (measured steps x repeats) of a ``steps_label``."""
    _, measured, repeats = (int(x) for x in label.split("/"))
    return measured * repeats


def started(provenance: dict) -> str:
    """The provenance's start time in UTC (ISO 8601, so it sorts as it happened; a time
    without a zone is taken as UTC), '' where there is none or it does not parse."""
    try:
        t = datetime.fromisoformat(str(provenance["started"]))
    except (KeyError, TypeError, ValueError):
        return ""
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def candidate(record: Record, path: str, run: str) -> Candidate:
    """The rule's view of one record."""
    strength, words = protocol_of(record.cell)
    return Candidate(path=str(path), run=run, cell=identity(str(path)), status=record.status, strength=strength,
                     protocol=words, started=started(record.provenance))


def _minute(iso: str) -> str:
    return iso[:16].replace("T", " ") + " UTC" if iso else ""


def why(chosen: Candidate, other: Candidate) -> str:
    """Why ``chosen`` is used rather than ``other``: the first key of the rule that differs."""
    if (chosen.status in RESULTS) != (other.status in RESULTS):
        return f"a result ({chosen.status}) over {other.status}"
    if chosen.strength != other.strength:
        return f"stronger protocol ({chosen.protocol} over {other.protocol})"
    if chosen.started != other.started:
        return f"later run (started {_minute(chosen.started)} over {_minute(other.started) or 'unknown'})"
    return "same protocol and start: the later folder name"


def choose(candidates: Iterable[Candidate]) -> dict[str, dict]:
    """Per record path, the choice's columns (COLUMNS): ``runs`` (records of its cell),
    ``superseded_by`` (the run whose record the report uses instead; None for the one it
    uses) and ``choice`` (None where the cell has one record; else, on the record used, the
    runs it was chosen over and why, and on a superseded one, why it was not)."""
    by_cell: dict[str, dict[str, Candidate]] = {}
    for c in candidates:
        # a path given twice (a searched cell the grid also lists) is one record, not two runs
        by_cell.setdefault(c.cell, {}).setdefault(c.path, c)
    out = {}
    for records in by_cell.values():
        group = sorted(records.values(), key=Candidate.key, reverse=True)
        best, rest = group[0], group[1:]
        out[best.path] = {"runs": len(group), "superseded_by": None,
                          "choice": "; ".join(f"over {o.run}: {why(best, o)}" for o in rest) or None}
        for o in rest:
            out[o.path] = {"runs": len(group), "superseded_by": best.run, "choice": why(best, o)}
    return out


def choose_searches(folders: Iterable[str | Path]) -> list[str]:
    """Of max-batch search folders (runs/search/...) from one or several results folders,
    the one per search the report reads (module docstring), in the order given; a folder
    without its summary (search.json: a search stopped, or only its probes copied) is not
    returned."""
    folders, best = [str(f) for f in folders], {}
    for folder in folders:
        try:
            summary = json.loads((Path(folder) / cells.SEARCH_SUMMARY).read_text())
        except (OSError, ValueError):
            continue
        parsed = cells.parse(folder, (cells.SEARCH_PATTERN,))
        search = identity(folder, (cells.SEARCH_PATTERN,))
        key = (summary.get("status") == "ok", summary.get("smallest_oom") is not None,
               int(summary.get("n_probes") or 0),
               "" if parsed is None else Path(parsed.root).name)
        if search not in best or key > best[search][0]:
            best[search] = (key, folder)
    chosen = {folder for _, folder in best.values()}
    return [f for f in folders if f in chosen]
