"""The max-batch search (Table IV): the largest per-GPU batch of a cell that fits in memory.

Per (stage, platform, model, backend, technique, gpus) the search probes batch sizes, each
probe a real cell run with a short protocol and recorded like any other (its record under
``runs/search/.../bs<N>/record.json``), and keeps the OOM frontier in a file that later runs
read. The workflow then measures the largest batch that fits with the full protocol.

How the next batch is chosen (``next_probe``), with ``lo`` the largest batch known to fit
(0 before any) and ``hi`` the smallest known to run out of memory (``max + 1`` before any):

1. doubling from ``start`` while nothing has run out of memory, then bisection of
   (lo, hi): the classic search, exact, no model needed;
2. steered by a memory model where the capacity is known (the cell's host-RSS cap on
   CPU, the GPU's memory on a GPU): once two batches fit, the line through the peak
   memory of the two largest fitting batches predicts the largest batch ``p`` under the
   capacity. While nothing has been too large the search probes ``p + 1`` (expecting an
   OOM, which bounds the search: ``max`` where ``p`` is past it), then ``p`` clamped into
   (lo, hi). Each new fit moves the line to the newest pair, so the model follows memory
   that grows faster than linearly, as the allocator's reserved memory does (on an H200
   pair Megatron-LM TP2's batches 4 and 8 pointed at 50 where 38 was the limit: the old
   least-squares line through all fits spent the whole bound there). A prediction at or
   past a known failure is dropped for bisection. A right model ends the search in four
   probes (start, 2x, p + 1, p);
3. never more than ``floor(log2(max)) + 3`` probes (``bound``): a probe is accepted only
   if plain bisection could still finish within the probes left whatever its outcome;
   otherwise the midpoint of (lo, hi) is probed, which always keeps that promise.

A batch fits when its probe ran and, where the capacity is known, its peak memory left
``headroom`` (default 5%) of it free: a probe whose peak came closer is ``tight`` and
counts as too large. Without headroom the cell measured at the boundary can run out of
memory where its probe did not (seen on the CPU: a probe peaked at 1.99 GiB under a
2 GiB cap, the measured run at 2.03 GiB). Probes run the cell's own warm-up and measured
steps (one repeat) unless the block's ``probe`` says fewer.

Memory is assumed monotone in the batch size: if b fits, every smaller batch fits; if b
runs out of memory, every larger one does. A probe that ends neither ok nor oom (timeout,
error) stops the search; the summary says so.

The frontier file (``frontier/<stage>/<platform>/<model>/<backend>/<technique>-g<gpus>.json``
under the results folder; not a Snakemake output, so rerunning a search never deletes it)
holds every probe's outcome together with a fingerprint of what decides memory (the cell's
spec without its batch size and step counts). A later search of the same fingerprint
records a batch at or above a known OOM as ``oom``, and a batch that ran before with its
peak memory, without running them: a search that Snakemake or a time limit stopped
resumes where it was (on the H100 a cut search had rerun its five 7B probes); ``reprobe``
(``snakemake --config reprobe=true``) ignores the file and runs every probe again.
A changed fingerprint (other sequence length, memory cap, library-independent settings of
the cell) starts a fresh frontier.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: a probe's outcomes that bound the search (anything else stops it); tight: it ran, but
#: its peak memory left less than the search's headroom free (it counts as too large)
BOUNDING = ("ok", "oom", "tight")
TOO_LARGE = ("oom", "tight")
#: fitting batch sizes (with a peak) the memory model needs
MODEL_POINTS = 2
#: the command of a probe record answered from the frontier file (it ran nothing)
FRONTIER_COMMAND = ["llmbench.search (frontier)"]


def bound(max_batch: int) -> int:
    """Most probes the search makes for a search space of 1..max_batch."""
    return int(math.floor(math.log2(max_batch))) + 3


@dataclass(kw_only=True, slots=True)
class Probe:
    """One probed batch size and what it showed."""

    batch_size: int
    status: str
    """ok | oom | timeout | error (a probe's record status)."""
    peak_gib: float | None = None
    """Peak memory per rank of the probe (the metric the capacity is compared with)."""
    wall_s: float = 0.0
    """Wall-clock seconds the probe took (0 for one answered from the frontier)."""
    source: str = "run"
    """run: the probe ran; frontier: answered by a known OOM without running."""
    chosen_by: str = "doubling"
    """doubling | bisection | model | safeguard: why this batch was probed."""
    reason: str = ""


@dataclass(kw_only=True, slots=True)
class State:
    """What the search knows: its probes, in order."""

    start: int
    max_batch: int
    capacity_gib: float | None = None
    """The peak memory a fitting batch may reach (capacity less headroom); None: unknown."""
    probes: list[Probe] = field(default_factory=list)

    @property
    def lo(self) -> int:
        return max((p.batch_size for p in self.probes if p.status == "ok"), default=0)

    @property
    def hi(self) -> int:
        return min((p.batch_size for p in self.probes if p.status in TOO_LARGE), default=self.max_batch + 1)

    @property
    def done(self) -> bool:
        stopped = any(p.status not in BOUNDING for p in self.probes)
        return stopped or self.hi - self.lo <= 1


def predict(probes: list[Probe], capacity_gib: float | None) -> int | None:
    """The largest batch the line through the peak memory of the two largest fitting
    batches keeps under the capacity (None without a capacity, MODEL_POINTS fitting
    batches, or a rising line)."""
    pts = sorted({p.batch_size: p.peak_gib for p in probes if p.status == "ok" and p.peak_gib is not None}.items())
    if capacity_gib is None or len(pts) < MODEL_POINTS:
        return None
    (b0, m0), (b1, m1) = pts[-2], pts[-1]
    slope = (m1 - m0) / (b1 - b0)
    if slope <= 0:
        return None
    return int(math.floor(b1 + (capacity_gib - m1) / slope))


def _keeps_bound(c: int, lo: int, hi: int, left: int) -> bool:
    """After probing c (whatever it shows), can bisection finish in ``left - 1`` probes?"""
    if not lo < c < hi:
        return False
    worst = max(c - lo, hi - c)
    return math.ceil(math.log2(worst)) <= left - 1 if worst > 1 else left >= 1


def next_probe(state: State) -> tuple[int, str] | None:
    """The next batch to probe and why, or None when the search is over."""
    if state.done:
        return None
    lo, hi = state.lo, state.hi
    left = bound(state.max_batch) - len(state.probes)
    if not state.probes:
        return state.start, "doubling"
    candidates: list[tuple[int, str]] = []
    pred = predict(state.probes, state.capacity_gib)
    if pred is not None:
        if hi > state.max_batch:  # nothing too large yet: the model's OOM side sets hi
            candidates.append((min(max(pred + 1, lo + 1), state.max_batch), "model"))
        elif pred < hi:  # then its fitting side
            candidates.append((min(max(pred, lo + 1), hi - 1), "model"))
        # else: the model points at or past a known failure; bisection below
    if hi > state.max_batch and not any(p.status in TOO_LARGE for p in state.probes):
        candidates.append((min(2 * lo, state.max_batch), "doubling"))
    candidates.append(((lo + hi) // 2, "bisection"))
    for c, why in candidates:
        if c in {p.batch_size for p in state.probes}:
            continue
        if _keeps_bound(c, lo, hi, left):
            return c, why
    return (lo + hi) // 2, "safeguard"


def fingerprint(spec: dict[str, Any]) -> str:
    """A hash of what decides a cell's memory: its spec without batch size and step counts."""
    cell = dict(spec["cell"])
    cell.pop("batch_size", None)
    proto = dict(cell.pop("protocol", {}))
    for k in ("warmup_steps", "measured_steps", "repeats", "timeout_s"):
        proto.pop(k, None)
    data = {**spec, "cell": {**cell, "protocol": proto}}
    data.pop("search", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(kw_only=True, slots=True)
class Frontier:
    """Known outcomes of one search group's batch sizes (the file later runs read)."""

    path: Path
    fingerprint: str
    probes: dict[int, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str, fp: str) -> "Frontier":
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

    def add(self, probe: Probe) -> None:
        """Keep what a probe that ran showed (a tight probe ran ok: its peak decides later)."""
        if probe.status in BOUNDING and probe.source == "run":
            self.keep(probe.batch_size, "ok" if probe.status == "tight" else probe.status, probe.peak_gib,
                      datetime.now(timezone.utc).isoformat(), probe.reason)

    def keep(self, batch_size: int, status: str, peak_gib: float | None, at: str, reason: str) -> None:
        """Keep one batch's outcome (ok with its peak, or oom)."""
        self.probes[batch_size] = {"status": status, "peak_gib": peak_gib, "at": at, "reason": reason}

    def save(self) -> None:
        from .record import write_json_atomic

        ok = [b for b, v in self.probes.items() if v["status"] == "ok"]
        oom = [b for b, v in self.probes.items() if v["status"] == "oom"]
        write_json_atomic(self.path, {
            "fingerprint": self.fingerprint, "largest_ok": max(ok, default=None), "smallest_oom": min(oom, default=None),
            "probes": {str(b): v for b, v in sorted(self.probes.items())},
        })


def summary(state: State, group: dict[str, Any], frontier_path: Path | str, reprobe: bool) -> dict[str, Any]:
    """The search's result: the largest batch that fits and how it was found."""
    stopped = next((p for p in state.probes if p.status not in BOUNDING), None)
    ran = [p for p in state.probes if p.source == "run"]
    wall = sum(p.wall_s for p in ran)
    return {
        **group,
        "status": "ok" if stopped is None else stopped.status,
        "reason": "" if stopped is None else f"probe at batch {stopped.batch_size}: {stopped.reason}",
        "largest_ok": state.lo or None,
        "smallest_oom": state.hi if state.hi <= state.max_batch else None,
        "start": state.start, "max_batch": state.max_batch, "fit_limit_gib": state.capacity_gib,
        "probes": [asdict(p) for p in state.probes],
        "n_probes": len(state.probes), "n_run": len(ran), "bound": bound(state.max_batch),
        "search_wall_s": wall, "search_gpu_s": wall * group["gpus"],
        "frontier": str(frontier_path), "reprobe": reprobe,
    }


def capacity_and_metric(spec: dict[str, Any]) -> tuple[float | None, str]:
    """What a probe's peak memory is compared with: the cell's host-RSS cap (peak RSS) if it
    has one, else the GPU's memory (peak reserved); None on a CPU without a cap."""
    cap = spec["cell"].get("mem_cap_gib")
    if cap is not None:
        return float(cap), "peak_rss_gib"
    if spec["platform"]["accelerator"] == "cuda":
        return spec["platform"].get("gpu_memory_gib"), "peak_mem_reserved_gib"
    return None, "peak_rss_gib"


def run(spec: dict[str, Any], out_dir: Path | str, frontier_path: Path | str, log: Path | str,
        threads: int = 1, reprobe: bool = False, gpu_busy: Any = None) -> dict[str, Any]:
    """Run a search (every probe a recorded cell under ``out_dir``) and write its summary
    (``out_dir/search.json``); returns it. ``gpu_busy``: a probe's policy for busy GPUs
    (llmbench.gpus.BusyPolicy)."""
    from .cells import Cell
    from .aggregate import Outcome, build_record
    from .launch import run_cell
    from .record import Metrics, Record, write, write_json_atomic

    out_dir, log = Path(out_dir), Path(log)
    search = spec["search"]
    template = Cell.from_dict(spec["cell"])
    capacity, metric = capacity_and_metric(spec)
    frontier = Frontier(path=Path(frontier_path), fingerprint=fingerprint(spec)) if reprobe else \
        Frontier.load(frontier_path, fingerprint(spec))
    # a batch fits when its peak leaves the headroom free (run-to-run noise and the longer
    # measured run must not push the measured cell over); the model aims at that limit
    limit = None if capacity is None else capacity * (1 - search["headroom"])
    state = State(start=search["start"], max_batch=search["max"], capacity_gib=limit)
    group = {k: v for k, v in template.key.items() if k != "batch_size"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(f"search {group}: start {state.start}, max {state.max_batch}, bound {bound(state.max_batch)} probes, "
                 f"capacity {capacity} GiB ({metric})\n")
    while (nxt := next_probe(state)) is not None:
        bs, why = nxt
        probe_spec = {**spec, "cell": {**spec["cell"], "batch_size": bs, "protocol": search["probe_protocol"]}}
        probe_spec.pop("search")
        record_path = out_dir / f"bs{bs}" / "record.json"
        known, fit = frontier.known_oom(bs), frontier.known_fit(bs)
        t0 = time.monotonic()
        if known is None and fit is not None:
            reason = (f"known to run: batch {bs} ran at {fit['at']} with a peak of {fit['peak_gib']:.3f} GiB "
                      f"(frontier {frontier_path}); not run again (reprobe: snakemake --configfile <grid> "
                      "--config reprobe=true -R search_max_batch)")
            record = Record(cell=Cell.from_dict(probe_spec["cell"]).to_dict(), status="ok", reason=reason,
                            metrics=Metrics(**{metric: fit["peak_gib"]}),
                            provenance={"started": datetime.now(timezone.utc).isoformat(),
                                        "command": FRONTIER_COMMAND})
            write(record, record_path)
            source = "frontier"
        elif known is not None:
            b, v = known
            reason = (f"known out of memory: batch {b} ran out of memory at {v['at']} (frontier {frontier_path}); "
                      "not run again (reprobe: snakemake --configfile <grid> --config reprobe=true -R search_max_batch)")
            record = build_record(probe_spec, [Outcome(status="oom", reason=reason)], datetime.now(timezone.utc).isoformat(),
                                  FRONTIER_COMMAND)
            write(record, record_path)
            source = "frontier"
        else:
            record = run_cell(probe_spec, record_path, out_dir / f"bs{bs}" / "probe.log", threads=threads,
                              gpu_busy=gpu_busy)
            source = "run"
        peak = getattr(record.metrics, metric) if record.status == "ok" else None
        status, reason = record.status, record.reason
        if status == "ok" and limit is not None and peak is not None and peak > limit:
            status, reason = "tight", (f"ran, but its peak {peak:.3f} GiB leaves less than headroom "
                                       f"{search['headroom']:.0%} of {capacity:g} GiB free")
        probe = Probe(batch_size=bs, status=status, peak_gib=peak, wall_s=time.monotonic() - t0,
                      source=source, chosen_by=why, reason=reason)
        state.probes.append(probe)
        frontier.add(probe)
        frontier.save()
        with open(log, "a") as fh:
            fh.write(f"probe {len(state.probes)}: batch {bs} ({why}) -> {probe.status} "
                     f"{'' if peak is None else f'{peak:.3f} GiB '}({source}, {probe.wall_s:.1f} s) {probe.reason}\n")
    result = {**summary(state, group, frontier_path, reprobe), "capacity_gib": capacity,
              "headroom": search["headroom"]}
    write_json_atomic(out_dir / "search.json", result)
    return result


def seed_frontier(records_root: Path | str, results_dir: Path | str) -> dict[str, int]:
    """Rebuild frontier files from probe records that ran (``bs<N>/record.json`` anywhere
    under ``records_root``): a search cut before its frontier file was kept (a machine given
    back, a results folder lost) or a reference run's probes, so the next search of the
    same cells starts where they ended. Each probe's own resolved spec gives its
    fingerprint, and outcomes land only in a frontier of the same fingerprint: a search of
    a changed cell ignores them, and a frontier file already there is never replaced by
    one of another fingerprint, nor are its own outcomes overwritten. Answers that came
    from a frontier are not re-added. Returns the outcomes added per frontier file."""
    from .cells import FRONTIER_PATTERN, Cell
    from .record import read

    added: dict[str, int] = {}
    frontiers: dict[Path, Frontier] = {}
    for path in sorted(Path(records_root).rglob("bs*/record.json")):
        rec = read(path)
        spec = rec.provenance.get("spec")
        if rec.status not in ("ok", "oom") or not spec or rec.provenance.get("command") == FRONTIER_COMMAND:
            continue
        cell = Cell.from_dict(spec["cell"])
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
        added[str(target)] = added.get(str(target), 0) + 1
    for target, frontier in frontiers.items():
        if str(target) in added:
            frontier.save()
    return added


def read_summary(out_dir: Path | str) -> dict[str, Any]:
    """A finished search's summary."""
    return json.loads((Path(out_dir) / "search.json").read_text())


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbench.search seed-frontier RECORDS [--results DIR]`` (seed_frontier)."""
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


if __name__ == "__main__":
    raise SystemExit(main())
