"""The max-batch search's frontier store: what earlier searches of a cell learnt about its memory.

The frontier file (``frontier/<stage>/<platform>/<model>/<backend>/<technique>-g<gpus>.json``
under the results folder; not a Snakemake output, so rerunning a search never deletes it)
holds every probe that ran together with a fingerprint of what decides memory (the cell's
spec without its batch size, step counts and timeout). A later search of the same
fingerprint answers a batch at or above a known OOM, and a batch that ran before (with its
peak), without running it: a search that Snakemake or a time limit stopped resumes where
it was. Beside the file, ``<technique>-g<gpus>.probes/`` keeps a copy of each probe that
ran; a resumed search puts it back where it was written (Snakemake deletes a stopped
search's folder before rerunning it), so its records survive. A changed fingerprint
(other sequence length, memory cap, model, platform) starts a fresh frontier. The same
fingerprint decides when Snakemake reruns a search (``rerun_spec``): a search reruns when
what its frontier keys on, or its own settings, change, not when only the measured cell's
step counts or repeats do.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..protocol import Protocol
from ..spec import RunSpec, raw_of
from .algorithm import BOUNDING, Probe

#: protocol fields that do not decide a cell's memory
_NOT_MEMORY = ("warmup_steps", "measured_steps", "repeats", "timeout_s")


def memory_spec(spec: RunSpec | dict[str, Any]) -> dict[str, Any]:
    """What decides a cell's memory: its spec's JSON form without batch size, step counts,
    timeout and search settings (what ``fingerprint`` hashes)."""
    spec = raw_of(spec)
    cell = dict(spec["cell"])
    cell.pop("batch_size", None)
    proto = {k: v for k, v in cell.pop("protocol", {}).items() if k not in _NOT_MEMORY}
    data = {**spec, "cell": {**cell, "protocol": proto}}
    data.pop("search", None)
    return data


def fingerprint(spec: RunSpec | dict[str, Any]) -> str:
    """A hash of what decides a cell's memory (``memory_spec``): the key of its frontier."""
    return hashlib.sha256(json.dumps(memory_spec(spec), sort_keys=True).encode()).hexdigest()[:16]


def rerun_spec(spec: RunSpec | dict[str, Any]) -> dict[str, Any]:
    """A search's spec as its runner needs it and as Snakemake's params rerun trigger
    compares it: the measured cell's batch size and protocol replaced by the search's start
    and probe protocol (the runner uses nothing else of them). What is left is what
    ``fingerprint`` hashes plus the search's own settings (start, max, headroom, the
    probes' steps and timeout), so a search reruns exactly when its answer can change, and
    a change of the measured cell's repeats or steps alone does not replace the search's
    probe records with answers from its frontier."""
    spec = RunSpec.of(spec)
    return _probing(spec, spec.search["start"]).raw


def probe_spec(spec: RunSpec, batch_size: int) -> RunSpec:
    """The spec of a search's probe at ``batch_size``: the measured cell at that batch with
    the search's probe protocol, less the search's settings (a probe is a cell of its own)."""
    return _probing(spec, batch_size).without_search()


def _probing(spec: RunSpec, batch_size: int) -> RunSpec:
    """A search's spec with its cell at ``batch_size`` and the search's probe protocol."""
    return spec.with_cell(batch_size=batch_size, protocol=Protocol(**spec.search["probe_protocol"]))


def capacity_and_metric(spec: RunSpec | dict[str, Any]) -> tuple[float | None, str]:
    """What a probe's peak memory is compared with: the cell's host-RSS cap (peak RSS) if it
    has one, else the GPU's memory (peak reserved); None on a CPU without a cap."""
    spec = RunSpec.of(spec)
    cap = spec.cell.mem_cap_gib
    if cap is not None:
        return float(cap), "peak_rss_gib"
    if spec.platform.accelerator == "cuda":
        return spec.platform.gpu_memory_gib, "peak_mem_reserved_gib"
    return None, "peak_rss_gib"


@dataclass(kw_only=True, slots=True, frozen=True)
class Answer:
    """A batch answered from the frontier: what a run of it (or of a smaller batch) showed."""

    batch_size: int
    """The batch asked about."""
    status: str
    """ok: this batch ran with ``peak_gib``; oom: ``known_batch`` (at or below it) ran out of memory."""
    known_batch: int
    """The frontier's batch that answers: the batch itself (ok), the smallest known OOM at or below it (oom)."""
    peak_gib: float | None
    """The peak memory of the run (ok), else None."""
    at: str
    """When the answering batch ran."""
    reason: str
    """What the answer is and where it came from (a skipped record's reason)."""
    fingerprint: str
    """The fingerprint of the frontier that answered."""
    path: str
    """The frontier file that answered."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (a skipped probe record's provenance["frontier"])."""
        return {k: getattr(self, k) for k in ("status", "known_batch", "peak_gib", "at", "fingerprint", "path")}


@dataclass(kw_only=True, slots=True)
class Frontier:
    """Known outcomes of one search group's batch sizes (the file later runs read)."""

    path: Path
    """The frontier file."""
    fingerprint: str
    """The fingerprint of the cells whose outcomes it holds."""
    probes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Batch -> {status: ok | oom, peak_gib, at, reason, and for a probe that ran here, record:
    the path its record was written to (a copy is kept: ``keep_run``)}."""

    @classmethod
    def load(cls, path: Path | str, fp: str) -> Frontier:
        """The file's outcomes if its fingerprint matches, else an empty frontier."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls(path=path, fingerprint=fp)
        if data.get("fingerprint") != fp:
            return cls(path=path, fingerprint=fp)
        return cls(path=path, fingerprint=fp, probes={int(b): v for b, v in data.get("probes", {}).items()})

    @staticmethod
    def file_fingerprint(path: Path | str) -> str | None:
        """The fingerprint of the frontier file at ``path`` (None: no readable file)."""
        try:
            return json.loads(Path(path).read_text()).get("fingerprint")
        except (OSError, ValueError):
            return None

    def known_oom(self, batch_size: int) -> tuple[int, dict[str, Any]] | None:
        """The smallest batch at or below ``batch_size`` known to run out of memory."""
        ooms = sorted(b for b, v in self.probes.items() if v["status"] == "oom" and b <= batch_size)
        return (ooms[0], self.probes[ooms[0]]) if ooms else None

    def known_fit(self, batch_size: int) -> dict[str, Any] | None:
        """What a run of exactly ``batch_size`` showed, if it ran without running out of
        memory (its peak decides whether it fits under this search's headroom)."""
        v = self.probes.get(batch_size)
        return v if v is not None and v["status"] == "ok" and v.get("peak_gib") is not None else None

    def answer(self, batch_size: int) -> Answer | None:
        """What the frontier knows of ``batch_size`` (a known OOM at or below it wins over a
        fit of it), or None: it must run."""
        tail = (f"(frontier {self.path}, fingerprint {self.fingerprint}); nothing ran "
                "(reprobe: snakemake --configfile <grid> --config reprobe=true -R search_max_batch)")
        where = {"fingerprint": self.fingerprint, "path": str(self.path)}
        known = self.known_oom(batch_size)
        if known is not None:
            b, v = known
            return Answer(batch_size=batch_size, status="oom", known_batch=b, peak_gib=None, at=v["at"], **where,
                          reason=f"known out of memory: batch {b} ran out of memory at {v['at']} {tail}")
        fit = self.known_fit(batch_size)
        if fit is not None:
            return Answer(batch_size=batch_size, status="ok", known_batch=batch_size, peak_gib=fit["peak_gib"],
                          at=fit["at"], **where, reason=(f"known to run: batch {batch_size} ran at {fit['at']} "
                                                         f"with a peak of {fit['peak_gib']:.3f} GiB {tail}"))
        return None

    def add(self, probe: Probe) -> None:
        """Keep what a probe that ran showed (a tight probe ran ok: its peak decides later)."""
        if probe.status in BOUNDING and probe.source == "run":
            self.keep(probe.batch_size, "ok" if probe.status == "tight" else probe.status, probe.peak_gib,
                      datetime.now(UTC).isoformat(), probe.reason)

    def keep(self, batch_size: int, status: str, peak_gib: float | None, at: str, reason: str) -> None:
        """Keep one batch's outcome (ok with its peak, or oom)."""
        self.probes[batch_size] = {"status": status, "peak_gib": peak_gib, "at": at, "reason": reason}

    def kept_dir(self, batch_size: int) -> Path:
        """Where a copy of the probe of ``batch_size`` that ran is kept, beside the file
        (``<technique>-g<gpus>.probes/bs<N>/``): like the file, not a Snakemake output."""
        return self.path.with_name(f"{self.path.stem}.probes") / f"bs{batch_size}"

    def keep_run(self, batch_size: int, probe_dir: Path | str) -> None:
        """Keep a copy of the folder of a probe that ran (its record and log) and where it
        was written (call after ``add``)."""
        probe_dir = Path(probe_dir)
        if not (probe_dir / "record.json").is_file():
            return
        shutil.copytree(probe_dir, self.kept_dir(batch_size), dirs_exist_ok=True)
        self.probes[batch_size]["record"] = str(probe_dir / "record.json")

    def restore(self, batch_size: int, probe_dir: Path | str) -> bool:
        """Put back the probe of ``batch_size`` that ran into ``probe_dir``, if it was written
        there and a copy is kept: a search that Snakemake stopped and then deleted (its
        folder is its output, removed before the job reruns, as with --rerun-incomplete)
        keeps the records of the probes it ran. A search in another folder gets skipped
        records, so no run is counted twice. True if it put one back."""
        probe_dir = Path(probe_dir)
        known = self.probes.get(batch_size) or {}
        kept = self.kept_dir(batch_size)
        if known.get("record") != str(probe_dir / "record.json") or not (kept / "record.json").is_file():
            return False
        shutil.copytree(kept, probe_dir, dirs_exist_ok=True)
        return True

    def save(self) -> None:
        """Write the file atomically, with the largest fit and smallest OOM for a reader."""
        from ..record import write_json_atomic

        ok = [b for b, v in self.probes.items() if v["status"] == "ok"]
        oom = [b for b, v in self.probes.items() if v["status"] == "oom"]
        write_json_atomic(self.path, {
            "fingerprint": self.fingerprint, "largest_ok": max(ok, default=None), "smallest_oom": min(oom, default=None),
            "probes": {str(b): v for b, v in sorted(self.probes.items())},
        })


def seed_frontier(records_root: Path | str, results_dir: Path | str) -> dict[str, int]:
    """Rebuild frontier files from probe records that ran (``bs<N>/record.json`` anywhere
    under ``records_root``): a search cut before its frontier file was kept (a machine given
    back, a results folder lost) or a reference run's probes, so the next search of the
    same cells starts where they ended. Each probe's own resolved spec gives its
    fingerprint, and outcomes land only in a frontier of the same fingerprint: a search of
    a changed cell ignores them, and a frontier file already there is never replaced by
    one of another fingerprint, nor are its own outcomes overwritten. Answers that came
    from a frontier (skipped records) are not re-added. A record that is a frontier's kept
    copy (``<technique>-g<gpus>.probes/bs<N>/``, a stopped search's own probe, in no
    committed search folder) is kept beside the seeded file too, as the search's folder
    under ``results_dir``: the resumed search puts the probe's own record and log back
    (Frontier.restore) rather than a skipped one. Returns the outcomes added per frontier
    file."""
    from ..cells import FRONTIER_PATTERN, PROBE_DIR, SEARCH_PATTERN
    from ..record import read

    added: dict[str, int] = {}
    frontiers: dict[Path, Frontier] = {}
    for path in sorted(Path(records_root).rglob("bs*/record.json")):
        rec = read(path)
        spec = rec.provenance.get("spec")
        if rec.status not in ("ok", "oom") or not spec:
            continue
        spec = RunSpec.parse(spec)
        cell = spec.cell
        target = Path(results_dir) / FRONTIER_PATTERN.format(**cell.key)
        fp = fingerprint(spec)
        if Frontier.file_fingerprint(target) not in (None, fp):
            continue  # a frontier of another fingerprint is left as it is
        frontier = frontiers.setdefault(target, Frontier.load(target, fp))
        _, metric = capacity_and_metric(spec)
        peak = getattr(rec.metrics, metric) if rec.status == "ok" else None
        if frontier.fingerprint != fp or cell.batch_size in frontier.probes or (rec.status == "ok" and peak is None):
            continue
        frontier.keep(cell.batch_size, rec.status, peak, rec.provenance.get("finished", ""), rec.reason)
        if path.parent.parent.name.endswith(".probes"):
            probe_dir = Path(results_dir) / SEARCH_PATTERN.format(**cell.key) / PROBE_DIR.format(**cell.key)
            if path.parent.resolve() != frontier.kept_dir(cell.batch_size).resolve():
                shutil.copytree(path.parent, frontier.kept_dir(cell.batch_size), dirs_exist_ok=True)
            frontier.probes[cell.batch_size]["record"] = str(probe_dir / "record.json")
        added[str(target)] = added.get(str(target), 0) + 1
    for target, frontier in frontiers.items():
        if str(target) in added:
            frontier.save()
    return added


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbench.search seed-frontier RECORDS [--results DIR]`` (seed_frontier:
    prints the probe outcomes added per frontier file)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m llmbench.search", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed-frontier", help=seed_frontier.__doc__.split("\n")[0])
    seed.add_argument("records", type=Path, help="folder holding probe records (bs<N>/record.json) at any depth")
    seed.add_argument("--results", type=Path, default=Path("results"), help="results folder of the frontier files")
    args = parser.parse_args(argv)
    added = seed_frontier(args.records, args.results)
    for target, n in sorted(added.items()):
        print(f"{target}: {n} probe outcomes")
    if not added:
        print(f"no probe records under {args.records} to add")
    return 0
