"""Replay the committed max-batch searches with and without the memory model's start.

    python -m llmbench.memory replay [results/reference]

Each search folder's search.json holds the probes it ran. The replay runs today's
``llmbench.search.next_probe`` (unchanged) against an oracle built from those probes: a
probed batch shows what it showed; an unprobed one fits when it is at most the search's
``largest_ok`` (the search is exact) with its peak interpolated linearly between the peaks
of the probes that ran, tight ones included (extrapolated along the nearest two), and is
too large otherwise. It replays from the search's own ``start``, without and with the
memory model's hint (the largest batch it predicts to fit, ``predicted_max_batch`` at the
search's capacity, and the GiB a further batch element adds there, ``batch_slope_gib``),
which the runner probes first (llmbench.search.algorithm.State.hint and hint_slope_gib). Right, the search ends in
two probes; a little over, it bisects a narrow interval; instead of climbing from the
smallest batches and drawing its memory line through them (where allocator growth bends
it: on the H200 pair Megatron-LM TP2's batches 4 and 8 pointed at 50 where 37 was the
limit).

The workflow's searches take the hint (workflow/scripts/run_search.py passes
``memory.start_hint(spec)`` to llmbench.search.run; it is None where the model does not
apply, e.g. CPU platforms, and the search starts as before).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..config import REPO_ROOT
from ..search import ALGORITHM, Probe, State, next_probe
from .fit import record_spec
from .model import Workload, batch_slope_gib, modelled, predicted_max_batch


def oracle(summary: dict[str, Any]):
    """batch -> (status, peak) from a search's committed probes (see the module docstring)."""
    seen = {p["batch_size"]: (p["status"], p.get("peak_gib")) for p in summary["probes"]}
    # every probe that ran has a peak, a tight one too
    ran = sorted((b, peak) for b, (st, peak) in seen.items() if st in ("ok", "tight") and peak is not None)
    xs, ys = [b for b, _ in ran], [p for _, p in ran]
    largest = summary["largest_ok"] or 0

    def answer(batch: int) -> tuple[str, float | None]:
        if batch in seen:
            return seen[batch]
        if batch > largest:
            return "oom", None
        if len(xs) >= 2 and not xs[0] <= batch <= xs[-1]:  # along the nearest two
            i = 0 if batch < xs[0] else -2
            slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
            return "ok", ys[i] + slope * (batch - xs[i])
        return "ok", float(np.interp(batch, xs, ys)) if xs else None

    return answer


def replay(summary: dict[str, Any], hint: int | None, slope_gib: float | None = None,
           recorded_why: bool = False) -> list[Probe]:
    """The probes next_probe makes from the search's own start, ``hint`` probed first with
    its slope (llmbench.search.algorithm.State.hint and hint_slope_gib, as the runner
    does), against the search's oracle. ``recorded_why``: as the search ran: a batch the
    search probed keeps the ``chosen_by`` it recorded, which is what next_probe read when
    it ran (whether the first probe was the hint decides the next one; a runner once
    recorded none for the probes it ran, and its searches went on as if there had been no
    hint), and next_probe follows the rules' version the search recorded (``algorithm``,
    1 where it recorded none); otherwise today's (llmbench.search.algorithm.ALGORITHM)."""
    answer = oracle(summary)
    recorded = {p["batch_size"]: p.get("chosen_by") for p in summary["probes"]} if recorded_why else {}
    cap = summary.get("fit_limit_gib") or summary.get("capacity_gib")
    state = State(start=summary["start"], max_batch=summary["max_batch"], capacity_gib=cap,
                  hint=None if hint is None else max(1, min(hint, summary["max_batch"])), hint_slope_gib=slope_gib,
                  algorithm=summary.get("algorithm", 1) if recorded_why else ALGORITHM, step=summary.get("step", 1))
    while (nxt := next_probe(state)) is not None:
        batch, why = nxt
        status, peak = answer(batch)
        state.probes.append(Probe(batch_size=batch, status=status, peak_gib=peak, chosen_by=recorded.get(batch, why)))
    return state.probes


def hinted_start(workload: Workload, capacity_gib: float, max_batch: int) -> int:
    """The start the memory model hints: the largest batch predicted to fit (at least 1)."""
    return max(1, predicted_max_batch(workload, capacity_gib, max_batch=max_batch))  # as cells.start_hint


def replay_all(results: Path | str = "results/reference", root: Path = REPO_ROOT) -> pd.DataFrame:
    """One row per committed search that found its answer (a search a probe stopped, status
    error or timeout, has none to replay towards): probes from its own start, from the
    start and slope it was given when it ran, each probe with the reason it recorded
    (``as_run_probes``: the oracle's check, equal to ``committed_probes``), and from
    today's hinted start."""
    rows = []
    for path in sorted(Path(results).glob("*/runs/search/**/search.json")):
        s = json.loads(path.read_text())
        first = next(path.parent.glob("bs*/record.json"), None)
        if first is None or not s.get("probes") or s.get("status") != "ok":
            continue
        spec = record_spec(first)
        if not modelled(spec.cell.backend, spec.cell.technique):  # the model gives it no hint
            continue
        w = Workload.from_spec(spec)
        start = hinted_start(w, s["capacity_gib"], s["max_batch"])
        base, hinted = replay(s, None), replay(s, start, batch_slope_gib(w.with_batch(start)) or None)
        found = lambda probes: max((p.batch_size for p in probes if p.status == "ok"), default=0)  # noqa: E731
        rows.append({
            "run": path.relative_to(Path(results)).parts[0], "platform": s["platform"], "model": s["model"],
            "backend": s["backend"], "technique": s["technique"], "gpus": s["gpus"], "largest_ok": s["largest_ok"],
            "committed_probes": s["n_probes"],
            "as_run_probes": len(replay(s, s.get("hint"), s.get("hint_slope_gib"), recorded_why=True)),
            "start": s["start"], "replayed_probes": len(base),
            "replayed_found": found(base), "hinted_start": start,
            "hinted_probes": len(hinted), "hinted_found": found(hinted), "probes_saved": len(base) - len(hinted),
            "replayed": " ".join(f"{p.batch_size}:{p.status}" for p in base),
            "hinted": " ".join(f"{p.batch_size}:{p.status}" for p in hinted),
        })
    return pd.DataFrame(rows)
