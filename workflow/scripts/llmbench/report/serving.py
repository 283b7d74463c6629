"""The serving table (paper Figs. 6-10 as numbers): per engine, platform, model and load,
request and token throughput, TTFT/TPOT/ITL/end-to-end percentiles, failures, memory.

The paper prints figures only for serving (no numbers to transcribe), so there is no
published column here; the figures (llmbench.report.figures) show the same cells.
"""

from __future__ import annotations

import json

import pandas as pd

from ..serve import capacity, metrics, runs
from . import render
from .render import fmt

KEY = ["platform", "model", "engine", "load", "gpus"]
COLUMNS = KEY + [
    "engine_version", "status", "mode", "num_requests", "input_len", "output_len", "completed", "failed",
    "output_shortfall_requests", "request_throughput_per_s", "output_tokens_per_s", "total_tokens_per_s",
    *[f"{s}_{m}" for m in ("ttft_s", "tpot_s", "itl_s", "e2e_latency_s") for s in ("p50", "p90", "p99")],
    "server_peak_gpu_mem_gib", "server_peak_rss_gib", "server_ready_s", "rate_per_s", "max_concurrency",
    "goodput_share", "goodput_requests_per_s", "goodput_ttft_target_s", "goodput_tpot_target_s",
    "max_num_seqs", "max_batch_tokens", "kv_cache_tokens", "kv_cache_source", "gpu_memory_utilization",
    "cuda_graphs", "chunked_prefill", "prefix_caching", "tensor_parallel", "prefix_len", "ramp_up_s",
    "gpu0_sm_clock_mhz_mean", "gpu0_power_w_mean", "warm_engine", "engine_args", "run", "reason",
]
#: what makes two serving cells runs of one point (llmbench.serve.runs pools them)
LOAD_SPEC = ["mode", "num_requests", "input_len", "output_len", "rate_per_s", "max_concurrency", "prefix_len",
             "ramp_up_s", "warm_engine", "engine_args", "engine_version", "goodput_ttft_target_s",
             "goodput_tpot_target_s"]
#: engines no longer maintained upstream: kept, labelled
LEGACY = {"tgi": "TGI: archived upstream in March 2026 (maintenance mode from December 2025); its launch spec and "
                 "HTTP test doubles are kept, no GPU time goes to it."}
NOTES = (
    "TTFT: from the moment a request is sent to its first token, so in a burst it includes the "
    "time the request waits in the server's queue. TPOT: (end-to-end - TTFT) / (output tokens - 1) "
    "per request. ITL: gaps between streamed events that carry tokens (as `vllm bench serve`). "
    "Throughput: completed requests' tokens over the load's wall time (first send to last token). "
    "Memory: GPU memory in use on the engine's GPUs minus before start (NVML), or the "
    "engine's process-tree RSS on a CPU platform. Failed > 0 makes a cell status error; "
    "'N short': completed requests that streamed fewer tokens than the load's output length (with EOS ignored, "
    "the engine stopped them early, e.g. at its context length; its tok/s counts the tokens it made); "
    "a load cut at the cell's timeout_s is status timeout, its failed requests those unfinished then, its "
    "numbers from the requests that completed before the cut. Goodput: the share of requests whose TTFT and "
    "TPOT both meet the load's targets (MLPerf's Llama-2-70B server targets by default: 2 s and 0.2 s). "
    "Settings: the engine's batch cap (max_num_seqs), KV-cache tokens, GPU memory share, CUDA graphs (graphs), "
    "chunked prefill (chunked) and prefix caching (prefix cache), as its launch command and, where it reports "
    "them, its API say. Load: burst (all at t=0), poisson (its rate, and its ramp-up where it has one), "
    "concurrency (that many requests in flight until all are done); a shared prefix of P tokens is 'prefix P'; "
    "'warm engine': served by an engine that had served other loads before it (a paired set's share_engine), "
    "not started for it as the paper's runs are; such a point never pools with a fresh engine's. "
    "GPU: the first GPU's mean SM clock and power over the measured window (NVML), where there is one. "
    "Engine: its version as its record's provenance says (the engine's own package), where it does. "
    + " ".join(LEGACY.values())
)
#: serving cells whose numbers a table part or figure shows: complete loads, and loads cut at
#: timeout_s (what completed before the cut; llmbench.serve.bench)
MEASURED_LOADS = ("ok", "timeout")
#: the load kinds a sweep is made of: mode -> (the column its points vary, what it is, a log axis)
SWEEPS = {"poisson": ("rate_per_s", "offered requests/s", False),
          "concurrency": ("max_concurrency", "requests in flight", True)}
#: A serving point is within the latency targets where this share of its requests met both its
#: TTFT and TPOT targets (MLPerf's server scenario: the 99th percentile within them)
WITHIN_TARGETS = 0.99
#: engine_choice's columns
CHOICE = ["platform", "model", "gpus", "input_len", "output_len", "ttft_target_s", "tpot_target_s", "rank",
          "engine", "engine_version", "within_output_tokens_per_s", "within_point", "within_p99_ttft_s", "within_p99_tpot_s",
          "most_output_tokens_per_s", "most_point", "most_goodput_share", "points", "runs", "kv_cache_tokens"]
#: A sweep's knee: the lightest load whose output tokens/s reaches this share of the most the
#: series served, where a heavier load follows it (saturation reached, not the last point)
KNEE_SHARE = 0.9
KNEES_LEAD = (f"Sweeps: where each engine saturates. A series is one engine (its version), platform, model and "
              f"GPU count under one kind of load (a shared-prefix workload apart, its cache on and off apart); "
              f"the runs of one load pool by their mean. Knee: the lightest load whose output tokens/s reaches "
              f"{KNEE_SHARE:.0%} of the most the series served, where a heavier load follows it (none: still "
              f"growing at its heaviest load, or under three loads); its goodput and median TTFT and TPOT beside "
              f"it; most: the series' highest output tokens/s and the load that served it; requests the KV cache "
              f"holds: the engine's KV tokens (its report, or its launch) over a request's input and output "
              f"tokens, beyond which requests in flight wait for cache blocks. The sweep figure marks the same "
              f"knees.")
POINTS_LEAD = ("Points over runs: cells of one platform, model, engine, GPU count and load that differ only in "
               "their run (loads named <name>-1, <name>-2, ..., a fresh engine each, or the same load in several "
               "results folders) pool into mean ± sample std; points that differ in their load (Poisson rates), "
               "in the engine's launch arguments (its prefix cache on or off), in its version or in their goodput "
               "targets never pool. GPU: the first GPU's mean SM clock and power over each run's measured window, "
               "pooled alike.")


def build(tidy: pd.DataFrame) -> pd.DataFrame:
    """The serving rows of the tidy table, in the serving table's columns and order."""
    df = tidy[tidy["stage"] == "serve"].copy()
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    return df.reindex(columns=COLUMNS).sort_values(KEY, ignore_index=True)


def _plain(v):
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else (v.item() if hasattr(v, "item") else v)


def points(df: pd.DataFrame) -> pd.DataFrame:
    """The serving cells pooled into points (llmbench.serve.runs.over_runs on the tidy rows); runs
    pool only under the same goodput targets (LOAD_SPEC)."""
    if df.empty:
        return pd.DataFrame()
    # a record older than goodput states no targets: it was served to the same load as one that
    # states the defaults (its goodput is simply not there)
    df = df.assign(goodput_ttft_target_s=df["goodput_ttft_target_s"].fillna(metrics.TTFT_TARGET_S),
                   goodput_tpot_target_s=df["goodput_tpot_target_s"].fillna(metrics.TPOT_TARGET_S))
    frame = df.assign(load_spec=[json.dumps({k: _plain(r[k]) for k in LOAD_SPEC}, sort_keys=True)
                                 for _, r in df.iterrows()])
    return runs.over_runs(frame)


def _prefix_label(prefix_len, caching) -> str:
    """' · prefix P, cache on|off' for a shared-prefix load, '' for one without."""
    if prefix_len is None or pd.isna(prefix_len) or not prefix_len:
        return ""
    cache = "" if caching is None or pd.isna(caching) else (
        ", cache on" if str(caching).lower() in ("true", "1") else ", cache off")
    return f" · prefix {int(prefix_len)}{cache}"


def sweep_loads(df: pd.DataFrame) -> pd.DataFrame:
    """The measured loads of the sweeps (SWEEPS) among serving rows, each with its ``series``:
    engine (its version) · platform · model, the GPU count where over one, a shared-prefix
    workload a series of its own, cache on and off apart."""
    df = df[df["mode"].isin(list(SWEEPS)) & df["status"].isin(MEASURED_LOADS)].copy()
    gpus = ["" if pd.isna(g) or int(g) <= 1 else f" · {int(g)} GPUs" for g in df["gpus"]]
    df["series"] = [f"{runs.engine_label(e, v)} · {p} · {m}{g}{_prefix_label(pl, pc)}" for e, v, p, m, g, pl, pc in
                    zip(df["engine"], df["engine_version"], df["platform"], df["model"], gpus, df["prefix_len"],
                        df["prefix_caching"])]
    return df


def sweep_knees(df: pd.DataFrame, col: str) -> pd.DataFrame:
    """Each series' knee (KNEE_SHARE) over ``col`` (``df``: one sweep's rows of sweep_loads),
    the runs of one load pooled by their mean first: series, ``col``, output_tokens_per_s,
    goodput_share, p50_ttft_s, p50_tpot_s. None for a series of fewer than three loads or one
    still growing at its heaviest."""
    values = ["output_tokens_per_s", "goodput_share", "p50_ttft_s", "p50_tpot_s"]
    out = []
    for series, g in df.dropna(subset=[col, "output_tokens_per_s"]).groupby("series"):
        g = g.reindex(columns=[col, *values]).astype(float).groupby(col, as_index=False).mean().sort_values(col)
        if len(g) < 3:
            continue
        at = g[g["output_tokens_per_s"] >= KNEE_SHARE * g["output_tokens_per_s"].max()].iloc[0]
        if at[col] < g[col].max():
            out.append({"series": series, **at.to_dict()})
    return pd.DataFrame(out, columns=["series", col, *values])


def knees(df: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep series (sweep_loads) and kind of load: its loads, its knee (sweep_knees),
    the most it served and how many of its requests its engine's KV cache holds at once."""
    loads = sweep_loads(df)
    rows = []
    for mode, (col, what, _) in SWEEPS.items():
        one = loads[loads["mode"] == mode]
        knee = sweep_knees(one, col).set_index("series")
        for series, g in one.dropna(subset=[col, "output_tokens_per_s"]).groupby("series", sort=True):
            means = g.groupby(col)["output_tokens_per_s"].mean()
            first = g.iloc[0]
            # requests of the series' length its engine's KV cache holds at once (the smallest
            # cache where starts differed): beyond them, requests in flight wait for blocks
            resident = capacity.resident(g["kv_cache_tokens"], g["input_len"] + g["output_len"]).min()
            row = {"series": series, "platform": first["platform"], "model": first["model"],
                   "engine": runs.engine_label(first["engine"], first["engine_version"]), "gpus": first["gpus"],
                   "sweep": what + _prefix_label(first["prefix_len"], first["prefix_caching"]),
                   "loads": len(means), "runs": len(g), "knee": None, "knee_output_tokens_per_s": None,
                   "knee_goodput_share": None, "knee_p50_ttft_s": None, "knee_p50_tpot_s": None,
                   "most_output_tokens_per_s": means.max(), "most_at": means.idxmax(),
                   "resident_requests": resident}
            if series in knee.index:
                k = knee.loc[series]
                row.update(knee=k[col], knee_output_tokens_per_s=k["output_tokens_per_s"],
                           knee_goodput_share=k["goodput_share"], knee_p50_ttft_s=k["p50_ttft_s"],
                           knee_p50_tpot_s=k["p50_tpot_s"])
            rows.append(row)
    return pd.DataFrame(rows)


def _load_label(spec: dict, runs_: int) -> str:
    """A point's load in words: 'burst of 1000', '64 in flight', 'Poisson 16/s', a warm engine
    and the runs said."""
    mode = spec.get("mode")
    text = (f"{fmt(spec.get('max_concurrency'), '.0f')} in flight" if mode == "concurrency" else
            f"Poisson {fmt(spec.get('rate_per_s'), 'g')}/s" if mode == "poisson" else
            f"burst of {fmt(spec.get('num_requests'), '.0f')}" if mode == "burst" else str(mode))
    extra = [f"{runs_} runs"] if runs_ > 1 else []
    extra += ["warm engine"] if spec.get("warm_engine") else []
    return text + (f" ({', '.join(extra)})" if extra else "")


def engine_choice(df: pd.DataFrame) -> pd.DataFrame:
    """Which engine to pick (CHOICE; the advisor's serving parts, llmbench.report.advice): per
    platform, model, GPU count and workload (input and output lengths, latency targets;
    shared-prefix loads left out, their cache serves what others compute), each engine (its
    version) ranked by the most output tokens/s among its points within the targets (a point's
    mean goodput >= WITHIN_TARGETS), then by the most it served at all. Points pooled over
    their runs (points); only measured points answer: no model predicts serving throughput."""
    pooled = points(df)
    if pooled.empty:
        return pd.DataFrame(columns=CHOICE)
    # the KV cache an engine reserved there, as its records say (the smallest where starts
    # differed, as knees() counts resident requests: what every start of it held)
    kv = df.groupby(["platform", "model", "gpus", "engine", "engine_version"], dropna=False)["kv_cache_tokens"].min()
    spec = pooled["load_spec"].map(json.loads)
    for key, col in (("input_len", "input_len"), ("output_len", "output_len"), ("prefix_len", "prefix_len"),
                     ("goodput_ttft_target_s", "ttft_target_s"), ("goodput_tpot_target_s", "tpot_target_s")):
        pooled[col] = spec.map(lambda s, key=key: s.get(key))
    pooled["load"] = [_load_label(s, n) for s, n in zip(spec, pooled["runs"])]
    pooled = pooled[(pooled["ok"] > 0) & ~pooled["prefix_len"].map(_given)
                    & pooled["output_tokens_per_s_mean"].notna()]
    rows = []
    keys = ["platform", "model", "gpus", "input_len", "output_len", "ttft_target_s", "tpot_target_s"]
    for key, g in pooled.groupby(keys, dropna=False, sort=True):
        group = []
        for (engine, version), e in g.groupby(["engine", "engine_version"], dropna=False, sort=True):
            within = e[e["goodput_share_mean"] >= WITHIN_TARGETS]
            most = e.loc[e["output_tokens_per_s_mean"].idxmax()]
            row = {**dict(zip(keys, key)), "engine": engine, "engine_version": version,
                   "within_output_tokens_per_s": None, "within_point": None, "within_p99_ttft_s": None,
                   "within_p99_tpot_s": None, "most_output_tokens_per_s": most["output_tokens_per_s_mean"],
                   "most_point": most["load"], "most_goodput_share": most["goodput_share_mean"],
                   "points": len(e), "runs": int(e["runs"].sum()),
                   "kv_cache_tokens": kv.get((key[0], key[1], key[2], engine, version))}
            if len(within):
                best = within.loc[within["output_tokens_per_s_mean"].idxmax()]
                row.update(within_output_tokens_per_s=best["output_tokens_per_s_mean"], within_point=best["load"],
                           within_p99_ttft_s=best["p99_ttft_s_mean"], within_p99_tpot_s=best["p99_tpot_s_mean"])
            group.append(row)
        group.sort(key=lambda r: (r["within_output_tokens_per_s"] is None, -(r["within_output_tokens_per_s"] or 0),
                                  -r["most_output_tokens_per_s"], r["engine"], str(r["engine_version"])))
        rows += [{**r, "rank": i} for i, r in enumerate(group, 1)]
    return pd.DataFrame(rows, columns=CHOICE)


def _knees_display(k: pd.DataFrame) -> pd.DataFrame:
    rows = [[r.platform, r.model, r.engine, fmt(r.gpus, ".0f"), r.sweep, f"{r.loads} ({r.runs})",
             "none" if pd.isna(r.knee) else fmt(r.knee, "g"), fmt(r.knee_output_tokens_per_s, ",.1f"),
             fmt(r.knee_goodput_share, ".3f"),
             "" if pd.isna(r.knee) else f"{fmt(r.knee_p50_ttft_s, '.3f')} / {fmt(r.knee_p50_tpot_s, '.4f')}",
             f"{fmt(r.most_output_tokens_per_s, ',.1f')} at {fmt(r.most_at, 'g')}",
             fmt(r.resident_requests, ",.0f")] for r in k.itertuples()]
    return pd.DataFrame(rows, columns=["platform", "model", "engine", "GPUs", "sweep", "loads (runs)", "knee",
                                       "out tok/s at knee", "goodput at knee", "TTFT / TPOT p50 s at knee",
                                       "most out tok/s at", "requests the KV cache holds"])


def _settings(r) -> str:
    parts = []
    for col, label, spec in (("max_num_seqs", "seqs", ".0f"), ("kv_cache_tokens", "KV tok", ",.0f"),
                             ("gpu_memory_utilization", "mem", ".2f")):
        v = getattr(r, col)
        if v is not None and not pd.isna(v):
            parts.append(f"{label} {format(float(v), spec)}")
    for col, label in (("cuda_graphs", "graphs"), ("chunked_prefill", "chunked"), ("prefix_caching", "prefix cache")):
        v = getattr(r, col)
        if v is not None and not pd.isna(v):
            parts.append(label if str(v).lower() in ("true", "1") else f"no {label}")
    return ", ".join(parts)


def _given(v) -> bool:
    """A value that is there and not zero (a load key a record lacks reads as 0)."""
    return v is not None and not pd.isna(v) and v != 0


def _requests(r) -> str:
    """Requests (failed), and how many of the completed ones ended short of output_len."""
    text = f"{fmt(r.num_requests, '.0f')} ({fmt(r.failed, '.0f')})"
    return text + (f", {fmt(r.output_shortfall_requests, '.0f')} short" if _given(r.output_shortfall_requests) else "")


def table(df: pd.DataFrame) -> render.Table:
    """One row per serving cell (latencies in seconds, throughput per second), then the
    points pooled over their runs, then each sweep's knee (knees)."""
    head = ["Platform", "Model", "Engine", "Load", "GPUs", "Status", "Requests (failed)", "req/s", "out tok/s",
            "TTFT p50/p90/p99 s", "TPOT p50/p90/p99 s", "ITL p50/p90/p99 s", "E2E p50/p90/p99 s",
            "goodput", "server mem GiB", "settings", "GPU MHz / W"]
    rows = []
    for r in df.itertuples():
        def pct(m: str, spec: str = ".3f", r=r) -> str:
            vals = [getattr(r, f"{s}_{m}") for s in ("p50", "p90", "p99")]
            return "" if all(v is None or pd.isna(v) for v in vals) else " / ".join(fmt(v, spec) for v in vals)
        mem = r.server_peak_gpu_mem_gib if not pd.isna(r.server_peak_gpu_mem_gib) else r.server_peak_rss_gib
        status = r.status if r.status != "oom" else "- (oom)"
        engine = runs.engine_label(r.engine, r.engine_version) + (" (legacy)" if r.engine in LEGACY else "")
        rate = f", {fmt(r.rate_per_s, 'g')}/s" if r.mode == "poisson" else ""
        rate += f" ramp {fmt(r.ramp_up_s, 'g')} s" if r.mode == "poisson" and _given(r.ramp_up_s) else ""
        rate += f" {fmt(r.max_concurrency, '.0f')} in flight" if r.mode == "concurrency" else ""
        rate += f", prefix {fmt(r.prefix_len, '.0f')}" if _given(r.prefix_len) else ""
        rate += ", warm engine" if _given(r.warm_engine) else ""
        rows.append([
            r.platform, r.model, engine,
            f"{r.load} ({r.mode}{rate}, {fmt(r.input_len, '.0f')} in / {fmt(r.output_len, '.0f')} out)",
            fmt(r.gpus, ".0f"), status, _requests(r),
            fmt(r.request_throughput_per_s, ".2f"), fmt(r.output_tokens_per_s, ".1f"),
            pct("ttft_s"), pct("tpot_s", ".4f"), pct("itl_s", ".4f"), pct("e2e_latency_s"),
            fmt(r.goodput_share, ".3f"), fmt(mem, ".2f"), _settings(r),
            "" if not _given(r.gpu0_power_w_mean) and not _given(r.gpu0_sm_clock_mhz_mean)
            else f"{fmt(r.gpu0_sm_clock_mhz_mean, '.0f')} / {fmt(r.gpu0_power_w_mean, '.0f')}",
        ])
    t = render.simple("serving", df, head, rows, NOTES)
    parts = t.parts
    pooled = points(df)
    if len(pooled) and (pooled["runs"] > 1).any():
        parts += (render.Part(frame=runs.display(pooled), heading="Points over runs", lead=POINTS_LEAD),)
    if len(k := knees(df)):
        parts += (render.Part(frame=_knees_display(k), heading="Sweeps", lead=KNEES_LEAD),)
    return render.Table(title=t.title, long=t.long, parts=parts)
