"""Repeated runs of one serving point: mean and standard deviation over them.

A serving cell has no repeat axis: a config asks for independent runs of a point (a fresh
engine each, as the paper's 3 runs) by naming identical loads ``<name>-1``, ``<name>-2``,
... Cells of one platform, model, engine and GPU count whose load specs, engine version and engine
arguments are identical are runs of one point; each other cell is a point of its own (a
Poisson rate, say: its loads differ in rate_per_s, so ``poisson-5`` and ``poisson-10`` never
pool). In a paired set
(llmbench.grid.paired) the same runs are a point's repeats, run round by round.

    python -m llmbench.serve.runs RESULTS_DIR [RESULTS_DIR ...]   # Markdown on stdout
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from ..cells import SERVE_RECORD_PATTERN, glob
from ..grid.paired import RUN_NAME
from ..record import read
from .engines import engine_version

KEY = ["platform", "model", "engine", "gpus"]
#: summary values pooled over runs: mean and sample standard deviation (ddof 1) of each
METRICS = ["output_tokens_per_s", "request_throughput_per_s", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s",
           "p99_tpot_s", "p50_e2e_latency_s", "p99_e2e_latency_s", "goodput_share",
           "gpu0_sm_clock_mhz_mean", "gpu0_power_w_mean"]


def warm_engine(provenance: dict) -> bool:
    """Whether a serving record's engine had served other loads before its own (a shared
    engine's later load, provenance.engine_session; llmbench.serve.bench.EngineSession)."""
    return bool((provenance.get("engine_session") or {}).get("position"))


def engine_args(cell: dict) -> str:
    """A serving cell's launch arguments for its engine (its block's prefix cache switch and
    engine_args), space-separated; '' for none."""
    return " ".join(cell.get("engine_args") or ())


def rows(results_dirs: list[Path | str]) -> pd.DataFrame:
    """One row per serving record under the folders: its cell, status and summary values."""
    out = []
    for d in results_dirs:
        for path in sorted(Path(d).glob(glob(SERVE_RECORD_PATTERN))):
            rec = read(path)
            c = rec.cell
            # a load on an engine that had served others before (a shared engine's) is a point of its
            # own, and so is one whose engine was launched with other arguments (its prefix cache off)
            # or was another version
            version = engine_version(c["engine"], rec.provenance.get("engine_versions") or {})
            spec = {**c["load_spec"], **({"warm_engine": True} if warm_engine(rec.provenance) else {}),
                    **({"engine_args": engine_args(c)} if engine_args(c) else {}),
                    **({"engine_version": version} if version else {})}
            out.append({**{k: c[k] for k in KEY}, "load": c["load"], "load_spec": json.dumps(spec, sort_keys=True),
                        "status": rec.status, **{m: rec.summary.get(m) for m in METRICS},
                        "goodput_ttft_target_s": rec.summary.get("goodput_ttft_target_s"),
                        "goodput_tpot_target_s": rec.summary.get("goodput_tpot_target_s")})
    return pd.DataFrame(out)


def _point(loads: pd.Series) -> str:
    names = [RUN_NAME.match(x) for x in loads]
    if len(loads) > 1 and all(names) and len({m["point"] for m in names}) == 1:
        return names[0]["point"]
    return loads.iloc[0] if len(loads) == 1 else "/".join(loads)


def over_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Pool the runs of each point: n, how many were ok, mean and std of METRICS over the ok
    runs (std NaN for one run), its load spec (JSON). A run that is not ok counts in n and is
    left out of the means."""
    pooled = []
    for _, g in df.groupby(KEY + ["load_spec"], sort=True):
        ok = g[g["status"] == "ok"]
        spec = json.loads(g.iloc[0]["load_spec"])
        warm = " (warm engine)" if spec.get("warm_engine") else ""
        row = {**g.iloc[0][KEY].to_dict(), "engine_version": spec.get("engine_version"),
               "point": _point(g["load"].sort_values()) + warm, "load_spec": g.iloc[0]["load_spec"],
               "mode": spec["mode"], "runs": len(g), "ok": len(ok),
               "rate_per_s": spec.get("rate_per_s"), "max_concurrency": spec.get("max_concurrency")}
        for m in METRICS:
            vals = pd.to_numeric(ok[m], errors="coerce")
            row[f"{m}_mean"], row[f"{m}_std"] = vals.mean(), vals.std(ddof=1)
        pooled.append(row)
    out = pd.DataFrame(pooled)
    # a sweep's levels in order (a rate, or requests in flight), not by their names
    return out.sort_values(KEY + ["mode", "rate_per_s", "max_concurrency", "point"], ignore_index=True) if len(out) \
        else out


def engine_label(engine: str, version) -> str:
    """An engine with the version it ran, where the record says it: ``sglang (0.5.17)``."""
    return engine if version is None or pd.isna(version) or not version else f"{engine} ({version})"


def display(pooled: pd.DataFrame) -> pd.DataFrame:
    """The pooled points as text cells: mean ± std where there are several runs."""
    def pm(r, m, spec):
        mean, std = r[f"{m}_mean"], r[f"{m}_std"]
        if pd.isna(mean):
            return ""
        return format(mean, spec) + ("" if pd.isna(std) else " ± " + format(std, spec))

    def gpu(r):
        clock, power = pm(r, "gpu0_sm_clock_mhz_mean", ".0f"), pm(r, "gpu0_power_w_mean", ".0f")
        return f"{clock} / {power}" if clock or power else ""

    return pd.DataFrame([{
        "platform": r["platform"], "model": r["model"], "engine": engine_label(r["engine"], r.get("engine_version")),
        "GPUs": f"{int(r['gpus'])}", "load": r["point"], "runs (ok)": f"{r['runs']} ({r['ok']})",
        "out tok/s": pm(r, "output_tokens_per_s", ".1f"), "req/s": pm(r, "request_throughput_per_s", ".2f"),
        "TTFT p50 / p99 s": f"{pm(r, 'p50_ttft_s', '.3f')} / {pm(r, 'p99_ttft_s', '.3f')}",
        "TPOT p50 / p99 s": f"{pm(r, 'p50_tpot_s', '.4f')} / {pm(r, 'p99_tpot_s', '.4f')}",
        "E2E p50 / p99 s": f"{pm(r, 'p50_e2e_latency_s', '.3f')} / {pm(r, 'p99_e2e_latency_s', '.3f')}",
        "goodput": pm(r, "goodput_share", ".3f"), "GPU MHz / W": gpu(r),
    } for _, r in pooled.iterrows()], columns=["platform", "model", "engine", "GPUs", "load", "runs (ok)", "out tok/s",
                                                 "req/s", "TTFT p50 / p99 s", "TPOT p50 / p99 s", "E2E p50 / p99 s",
                                                 "goodput", "GPU MHz / W"])


def markdown(pooled: pd.DataFrame) -> str:
    """The pooled points as a Markdown table."""
    return display(pooled).to_markdown(index=False)


def main(argv: list[str]) -> None:
    """Print the pooled table of the serving records under the given results folders."""
    if not argv:
        raise SystemExit(__doc__)
    print(markdown(over_runs(rows(argv))))


if __name__ == "__main__":
    main(sys.argv[1:])
