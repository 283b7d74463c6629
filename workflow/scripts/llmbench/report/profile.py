"""Module-wise profiling tables (paper Section IV-B/C) from the tidy table (phase times of
each profile cell) and the per-row table tables/profile.parquet (module times):

  profile-phases     Tables V, VII and XIII: forward / backward / optimizer wall time, share
                     of the step, compute-kernel time, GEMM share; the paper's beside
  profile-modules    Table VI and Fig. 5: time per module kind and phase; the paper's beside
  profile-attention  Table VIII: attention time without and with F (same platform, model,
                     batch size, R), and the improvement; the paper's beside
  profile-serve      Tables X and XI: serving forward passes (backend inference cells),
                     prefill and one decode step, by timeline part (XI) and by kernel
                     class (X); the paper's LightLLM values beside
  profile-comm       Tables XIV, XV, XVI: memcpy, communication and AllReduce time per
                     iteration and share of a DeepSpeed step (backend deepspeed profile
                     cells, llmbench.profile.kernels); the paper's beside

The paper's values are matched by model, method and batch size (they are A800 numbers;
the platform column says which platform ours ran on).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import backends
from . import reference
from . import render
from .render import fmt

CELL = ["platform", "model", "backend", "technique", "batch_size", "gpus"]
PHASES = ("forward", "backward", "optimizer")
#: Module kinds of eager attention, and the fused kernel that replaces them with F.
ATTENTION_PARTS = ("attn_scores", "softmax", "attn_values")
ATTENTION_FUSED = "attention_fused"


def _ok(tidy: pd.DataFrame, profile: str) -> pd.DataFrame:
    """The ok profile cells of one kind of profile (training: module-wise; communication:
    kernel classes), by the backend that runs it (llmbench.backends.for_profile)."""
    return tidy[(tidy["stage"] == "profile") & (tidy["backend"] == backends.for_profile(profile))
                & (tidy["status"] == "ok")]


def _paper(table: str, root: Path | None) -> pd.DataFrame:
    return reference.load(table, **({"root": root} if root else {}))


#: attributed kernel time over what the phase holds by more than this share is flagged
OVERCOUNT_TOLERANCE = 0.01
OVERCOUNT_NOTE = ("'!': the operators' kernel time exceeds the device time the phase holds (its device "
                  "activities, or its wall time where those are not known): kernel time counted twice, as "
                  "profiler events sharing an operator's id did on torch 2.11 before the attribution dropped "
                  "them (llmbench/profile/attribution.py).")


def overcounted(kernel_ms: float | None, wall_ms: float | None, device_ms: float | None = None) -> bool:
    """Kernel time a phase cannot hold: more than its device activities (GPU runs that
    recorded them), else more than its wall time (one stream). Flagged in tables."""
    ceiling = device_ms if device_ms is not None and not pd.isna(device_ms) else wall_ms
    return kernel_ms is not None and ceiling is not None and kernel_ms > ceiling * (1 + OVERCOUNT_TOLERANCE)


def phases(tidy: pd.DataFrame, points: pd.DataFrame | None = None, root: Path | None = None) -> render.Table:
    """One row per (profile cell, phase), the paper's Table V/VII/XIII values beside."""
    cells = _ok(tidy, "training")
    out = []
    for c in cells.itertuples():
        step = sum(getattr(c, f"{p}_wall_s") or 0.0 for p in PHASES)
        for p in PHASES:
            wall, profiled, kernel, gemm, device = (getattr(c, f"{p}_{k}_s")
                                                    for k in ("wall", "profiled_wall", "kernel", "gemm", "device"))
            if profiled is None or pd.isna(profiled):  # older records kept only the profiled walls
                profiled = wall
            out.append({**{k: getattr(c, k) for k in CELL}, "attention": c.attention, "phase": p,
                        "wall_ms": wall * 1e3, "share_pct": 100 * wall / step if step else None,
                        "profiled_wall_ms": profiled * 1e3,
                        "kernel_ms": None if kernel is None else kernel * 1e3,
                        "device_ms": None if device is None or pd.isna(device) else device * 1e3,
                        "gemm_share_pct": None if gemm is None or not wall else 100 * gemm / wall})
    ours = pd.DataFrame(out, columns=CELL + ["attention", "phase", "wall_ms", "share_pct", "profiled_wall_ms",
                                             "kernel_ms", "device_ms", "gemm_share_pct"])
    paper = _paper("profile_phases", root).rename(columns={
        "wall_ms": "paper_wall_ms", "share_pct": "paper_share_pct", "kernel_ms": "paper_kernel_ms",
        "gemm_share_pct": "paper_gemm_share_pct", "platform": "paper_platform", "table": "paper_table"})
    table = ours.merge(paper.drop(columns=["method", "note"]), on=["model", "technique", "batch_size", "phase"], how="left")
    rows = [[r.platform, r.model, r.technique, fmt(r.batch_size, ".0f"), r.phase, fmt(r.wall_ms, ".2f"), fmt(r.share_pct, ".1f"),
             fmt(r.profiled_wall_ms, ".2f"), fmt(r.kernel_ms, ".2f") + (" !" if overcounted(r.kernel_ms, r.wall_ms, r.device_ms) else ""),
             fmt(r.device_ms, ".2f"), fmt(r.gemm_share_pct, ".1f"), fmt(r.paper_wall_ms, ".1f"),
             fmt(r.paper_share_pct, ".1f"), fmt(r.paper_kernel_ms, ".1f"), fmt(r.paper_gemm_share_pct, ".1f")]
            for r in table.itertuples()]
    return render.simple("profile-phases", table, ["Platform", "Model", "Method", "BS", "Phase", "ms", "% of step", "profiled ms", "kernel ms",
                                        "device ms", "GEMM %", "paper ms", "paper %", "paper kernel ms", "paper GEMM %"],
             rows,
             "Phase wall time (ms): host clock with a device synchronize at each phase boundary; on a GPU, mean "
             "over the unprofiled steps (the later half of the warm-up), as the profiler's host cost slows a "
             "host-bound step without changing its kernels' times; 'profiled ms' is the same phase under the "
             "profiler and module hooks (on a CPU the two are the same steps). Kernel: GPU kernel time attributed to the operators that launched it (CPU: self time "
             "of the operators). Device: all device activity (kernels, memcpy, memset) that started in the phase, "
             "read from the device events (GPU runs; kernel ms <= device ms, the difference is activity no "
             "operator launched). GEMM %: matmul time "
             "as a share of the phase (the paper's Table XIII). Paper: A800, 8 GPUs (its backward includes "
             "non-overlapped communication); ours: one process, plain PyTorch AdamW. " + OVERCOUNT_NOTE)


def modules(tidy: pd.DataFrame, points: pd.DataFrame, root: Path | None = None) -> render.Table:
    """One row per (profile cell, phase, module), the paper's Table VI beside."""
    ok = _ok(tidy, "training")[CELL]
    df = points.merge(ok, on=CELL) if len(points) else pd.DataFrame(columns=CELL + ["phase", "module", "time_s", "share"])
    df = df.assign(time_ms=df["time_s"] * 1e3, share_pct=df["share"] * 100)
    paper = _paper("profile_modules", root).rename(columns={
        "time_ms": "paper_time_ms", "share_pct": "paper_share_pct", "platform": "paper_platform"})
    table = df.merge(paper[["model", "technique", "batch_size", "phase", "module", "paper_time_ms", "paper_share_pct"]],
                     on=["model", "technique", "batch_size", "phase", "module"], how="left")
    table = table[CELL + ["phase", "module", "time_ms", "share_pct", "paper_time_ms", "paper_share_pct"]]
    rows = [[r.platform, r.model, r.technique, fmt(r.batch_size, ".0f"), r.phase, r.module, fmt(r.time_ms, ".3f"),
             fmt(r.share_pct, ".1f"), fmt(r.paper_time_ms, ".3f"), fmt(r.paper_share_pct, ".1f")]
            for r in table.sort_values(CELL + ["phase", "time_ms"], ascending=[True] * (len(CELL) + 1) + [False]).itertuples()]
    return render.simple("profile-modules", table, ["Platform", "Model", "Method", "BS", "Phase", "Module", "ms", "% of phase",
                                         "paper ms", "paper %"], rows,
             "Per step, decoder modules summed over all layers. 'other' is the phase's wall time not inside "
             "any module range (Python, launch gaps, residual adds), so each phase's shares add up to 100%; "
             "on a GPU the wall time is the unprofiled step's (profile-phases), so there 'other' is mostly the "
             "device waiting for the host. "
             "attn_scores/attn_values are the paper's Bmm0/Bmm1; lm_head its 'Linear'. Attribution: "
             "llmbench/profile/attribution.py. A negative 'other' would mean kernel time counted twice ('!' in profile-phases).")


def attention(tidy: pd.DataFrame, points: pd.DataFrame, root: Path | None = None) -> render.Table:
    """Attention time of cells without F beside their F twins (same platform, model, BS, R)."""
    ok = _ok(tidy, "training")[CELL]
    df = points.merge(ok, on=CELL) if len(points) else pd.DataFrame(columns=CELL + ["phase", "module", "time_s"])
    key = ["platform", "model", "backend", "base", "batch_size", "gpus", "phase"]
    att = df[df["module"].isin(ATTENTION_PARTS + (ATTENTION_FUSED,))]
    if att.empty:
        att = pd.DataFrame(columns=CELL + ["phase", "time_s"])
    att = att.groupby(CELL + ["phase"], as_index=False)["time_s"].sum()
    flags = att["technique"].astype(str).str.split("+")
    att["flash"] = flags.apply(lambda fl: "F" in fl).astype(bool)
    att["base"] = flags.apply(lambda fl: "+".join(f for f in fl if f != "F") or "Naive").astype(str)
    pairs = att[~att["flash"]].merge(att[att["flash"]], on=key, suffixes=("_naive", "_flash"))
    pairs = pairs.assign(naive_ms=pairs["time_s_naive"] * 1e3, flash_ms=pairs["time_s_flash"] * 1e3)
    pairs["improvement_pct"] = 100 * (pairs["naive_ms"] - pairs["flash_ms"]) / pairs["naive_ms"]
    table = pairs[key + ["naive_ms", "flash_ms", "improvement_pct"]]
    paper = _paper("profile_attention", root)
    rows = [[r.platform, r.model, r.base, fmt(r.batch_size, ".0f"), r.phase, fmt(r.naive_ms, ".3f"), fmt(r.flash_ms, ".3f"),
             fmt(r.improvement_pct, ".1f")] for r in table.itertuples()]
    rows += [[f"paper: {r.platform}", r.model, "Naive", fmt(r.batch_size, ".0f"), r.phase, fmt(r.naive_ms, ".2f"),
              fmt(r.flash_ms, ".2f"), fmt(r.improvement_pct, ".1f")] for r in paper.itertuples()]
    return render.simple("profile-attention", table, ["Platform", "Model", "Method without F", "BS", "Phase", "naive ms",
                                           "with F ms", "improvement %"], rows,
             "Ours: the attention core (QK^T, softmax, PV; with F the fused kernel) summed over all layers, per "
             "step. The paper's rows (last) are one decoder layer's attention module on A800.")


#: Table XI's timeline parts -> our module kinds (RMSNorm is kept apart: one kind holds the
#: norms of attention, FFN and the final norm)
TIMELINE = {"before": ("embedding",), "attention": ("qkv", "rope", "attn_scores", "softmax", "attn_values",
                                                   "attention_fused", "output"),
            "ffn": ("mlp",), "rmsnorm": ("rmsnorm",), "after": ("lm_head",), "other": ("other",)}
#: Table X's compute classes: GEMM time of every row; the rest of a row's time by its kind
KERNEL_CLASS = {"attn_scores": "attention", "softmax": "attention", "attn_values": "attention",
                "attention_fused": "attention", "rope": "rope", "rmsnorm": "rmsnorm", "other": "other"}


def serve(tidy: pd.DataFrame, points: pd.DataFrame, root: Path | None = None) -> render.Table:
    """One row per (inference cell, phase, view, group): ms per forward pass (the decode
    phase divided by its steps) and % of the phase; the paper's LightLLM rows beside."""
    ok = _ok(tidy, "inference")[CELL + ["decode_steps"]]
    cols = CELL + ["phase", "module", "time_s", "gemm_time_s"]
    df = points.merge(ok, on=CELL) if len(points) else pd.DataFrame(columns=cols + ["decode_steps"])
    out = []
    for key, grp in df.groupby(CELL + ["phase"], sort=False):
        per = float(grp["decode_steps"].iloc[0]) if key[-1] == "decode" else 1.0
        wall = grp["time_s"].sum()
        groups: dict[tuple[str, str], float] = {}
        for view, group, t in ([("timeline", g, grp[grp["module"].isin(kinds)]["time_s"].sum())
                                for g, kinds in TIMELINE.items()]
                               + [("kernels", "gemm", grp["gemm_time_s"].sum())]
                               + [("kernels", KERNEL_CLASS.get(r.module, "element_wise"), r.time_s - r.gemm_time_s)
                                  for r in grp.itertuples()]):
            groups[(view, group)] = groups.get((view, group), 0.0) + t
        for (view, group), t in groups.items():
            out.append({**dict(zip(CELL + ["phase"], key)), "view": view, "group": group,
                        "ms": t / per * 1e3, "pct": 100 * t / wall if wall else None})
    table = pd.DataFrame(out, columns=CELL + ["phase", "view", "group", "ms", "pct"])
    paper = _paper("profile_serve", root)
    table = table.merge(paper[["view", "group", "time_ms", "pct"]].rename(
        columns={"time_ms": "paper_ms", "pct": "paper_pct"}), on=["view", "group"], how="left")
    rows = [[r.platform, r.model, r.technique, fmt(r.batch_size, ".0f"), r.phase, r.view, r.group, fmt(r.ms, ".3f"),
             fmt(r.pct, ".1f"), fmt(r.paper_ms, ".2f"), fmt(r.paper_pct, ".2f")] for r in table.itertuples()]
    return render.simple("profile-serve", table, ["Platform", "Model", "Method", "BS", "Phase", "View", "Part", "ms per pass",
                                       "% of phase", "paper ms", "paper %"], rows,
                  "Ours: transformers' model serving a batch (prefill of the prompts, then decode steps with the KV "
                  "cache), one process; ms per forward pass (decode: per step). timeline (Table XI): before = "
                  "embedding, attention = QKV, RoPE, attention core, output projection, ffn = MLP, after = lm_head; "
                  "RMSNorm apart. kernels (Table X): GEMM time of all modules, the rest by module (attention core, "
                  "RoPE, RMSNorm, element-wise for the rest); other = outside every module. Paper: LightLLM, "
                  "llama2-7b, A800, batch 1024, prompt 512, 64 output tokens, one forward pass (it does not say "
                  "prefill or decode), its communication rows (tensor parallel) have no counterpart on one process. "
                  "'other' is the phase's wall time less the parts: launch gaps and work outside every module.")


#: Engine profile parts -> the paper's Table X rows (profile_serve.csv, view kernels); kv_cache,
#: sampling and memcpy have no row there
ENGINE_PAPER_PART = {"gemm": "gemm", "attention": "attention", "rope": "rope", "rmsnorm": "rmsnorm",
                     "element_wise": "element_wise", "comm": "comm", "other": "other"}


def serve_engine(tidy: pd.DataFrame, points: pd.DataFrame, root: Path | None = None) -> render.Table:
    """One row per (engine profile cell, engine step phase, kernel class): ms per step and %
    of the step's wall (llmbench.profile.engine), the paper's LightLLM Table X beside."""
    cols = CELL + ["phase", "steps", "requests_per_step", "wall_ms", "part", "ms", "pct"]
    ok = tidy[(tidy["stage"] == "profile") & (tidy["status"] == "ok")][CELL]
    df = points.merge(ok, on=CELL) if len(points) and "part" in points else pd.DataFrame(columns=cols)
    df = df[df["part"].notna()][cols] if len(df) else df
    paper = _paper("profile_serve", root)
    paper = paper[paper["view"] == "kernels"].set_index("group")
    df = df.assign(paper_ms=[paper["time_ms"].get(ENGINE_PAPER_PART.get(x)) if x in ENGINE_PAPER_PART else None
                             for x in df["part"]],
                   paper_pct=[paper["pct"].get(ENGINE_PAPER_PART.get(x)) if x in ENGINE_PAPER_PART else None
                              for x in df["part"]])
    rows = [[r.platform, r.model, r.backend, fmt(r.batch_size, ".0f"), r.phase, fmt(r.steps, ".0f"),
             fmt(r.requests_per_step, ".0f"), fmt(r.wall_ms, ".2f"), r.part, fmt(r.ms, ".3f"), fmt(r.pct, ".1f"),
             fmt(r.paper_ms, ".2f"), fmt(r.paper_pct, ".2f")] for r in df.itertuples()]
    return render.simple("profile-serve-engine", df, ["Platform", "Model", "Engine", "Requests", "Phase", "Steps",
                                                      "Requests a step", "Step ms", "Part", "ms per step",
                                                      "% of step", "paper ms", "paper %"], rows,
                         "Ours: the serving engine's own profiler over one burst (batch = requests, prompt = the "
                         "cell's seq_len, output = its measured_steps), its GPU kernels by class, per engine step "
                         "(prefill: steps carrying prompt chunks, with the decodes batched beside them; decode: "
                         "decode-only steps); a class's time is the union of its kernels' intervals in the step, "
                         "other = the step's wall less device-busy time. CUDA graphs and torch.compile as the "
                         "engine runs them. On a CPU there are no kernels: the step walls only. Paper: LightLLM, "
                         "llama2-7b, A800, batch 1024, prompt 512, output 64, one forward pass, Table X's rows "
                         "(its attention row is LightLLM's Triton kernels; it has no KV-cache, sampling or copy "
                         "row). Details: llmbench/profile/engine_trace.py.")


def _pct(share) -> float | None:
    return None if share is None or pd.isna(share) else 100 * share


def comm(tidy: pd.DataFrame, points: pd.DataFrame | None = None, root: Path | None = None) -> render.Table:
    """One row per DeepSpeed profile cell: memcpy, communication and AllReduce seconds per
    iteration and their share of the step; the paper's Tables XIV (memcpy, by ZeRO stage),
    XVI (communication, by ZeRO stage) and XV (AllReduce, data parallel by method) beside."""
    from .. import techniques

    cells = _ok(tidy, "communication")
    paper = _paper("profile_comm", root)
    by = {(r.kind, r.model, r.method if r.kind != "allreduce" else r.technique): r for r in paper.itertuples()}
    out = []
    for c in cells.itertuples():
        zero = techniques.parse(c.technique).zero_stage
        label = f"ZeRO-{zero}" if zero else None
        mc, cm, ar = (by.get((kind, c.model, key)) for kind, key in
                      (("memcpy", label), ("comm", label), ("allreduce", None if zero else c.technique)))
        out.append({**{k: getattr(c, k) for k in CELL}, "step_s": c.kernel_step_time_s,
                    "memcpy_s": c.memcpy_s_per_iter, "memcpy_pct": _pct(c.memcpy_share),
                    "comm_s": c.comm_s_per_iter, "comm_pct": _pct(c.comm_share),
                    "comm_exposed_s": c.comm_exposed_s_per_iter,
                    "allreduce_s": c.comm_AllReduce_s_per_iter, "allreduce_pct": _pct(c.comm_AllReduce_share),
                    "paper_memcpy_s": mc.time_s if mc else None, "paper_memcpy_pct": mc.pct if mc else None,
                    "paper_comm_s": cm.time_s if cm else None, "paper_comm_pct": cm.pct if cm else None,
                    "paper_allreduce_s": ar.time_s if ar else None, "paper_allreduce_pct": ar.pct if ar else None})
    cols = CELL + ["step_s", "memcpy_s", "memcpy_pct", "comm_s", "comm_pct", "comm_exposed_s", "allreduce_s",
                   "allreduce_pct", "paper_memcpy_s", "paper_memcpy_pct", "paper_comm_s", "paper_comm_pct",
                   "paper_allreduce_s", "paper_allreduce_pct"]
    table = pd.DataFrame(out, columns=cols)
    rows = [[r.platform, r.model, r.technique, fmt(r.batch_size, ".0f"), fmt(r.gpus, ".0f"), fmt(r.step_s, ".3f"),
             fmt(r.memcpy_s, ".3f"), fmt(r.memcpy_pct, ".1f"), fmt(r.comm_s, ".3f"), fmt(r.comm_pct, ".1f"),
             fmt(r.comm_exposed_s, ".3f"), fmt(r.allreduce_s, ".3f"), fmt(r.allreduce_pct, ".1f"),
             fmt(r.paper_memcpy_s, ".3f"), fmt(r.paper_memcpy_pct, ".1f"), fmt(r.paper_comm_s, ".3f"),
             fmt(r.paper_comm_pct, ".1f"), fmt(r.paper_allreduce_s, ".2f"), fmt(r.paper_allreduce_pct, ".1f")]
            for r in table.itertuples()]
    return render.simple("profile-comm", table, ["Platform", "Model", "Method", "BS", "GPUs", "step s", "memcpy s", "memcpy %",
                                      "comm s", "comm %", "exposed comm s", "AllReduce s", "AllReduce %",
                                      "paper memcpy s", "paper memcpy %", "paper comm s", "paper comm %",
                                      "paper AllReduce s", "paper AllReduce %"], rows,
                  "Seconds per iteration of a profiled window after the timed one; % of its step time. GPU: NCCL "
                  "kernels (comm), memcpy events (memcpy), union of intervals; exposed: comm no compute kernel "
                  "overlaps. CPU: gloo collective ranges; there is no memcpy on a CPU (empty). Paper: A800, 8 GPUs, "
                  "batch 32; Tables XIV/XVI by ZeRO stage (matched on our cells' stage), Table XV by method.")
