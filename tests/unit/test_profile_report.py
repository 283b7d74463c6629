"""Profile cells in the grid, their records and tables (fixture records; the worker itself
is tested in test_profile.py)."""

import pytest

from llmbench import grid, record
from llmbench.config import ConfigError
from llmbench.aggregate import Outcome
from llmbench.profile.results import build_record
from llmbench.report import figures, profile, render, tidy
from test_tables import chart_of, md_rows

MODULES = {"forward": {"qkv": 0.02, "attn_scores": 0.01, "softmax": 0.004, "attn_values": 0.006, "mlp": 0.05, "other": 0.01},
           "backward": {"qkv": 0.04, "attn_scores": 0.02, "softmax": 0.008, "attn_values": 0.012, "mlp": 0.1, "other": 0.02},
           "optimizer": {"other": 0.05}}


def worker_result(flash: bool, scale: float = 1.0) -> dict:
    rows = []
    for phase, mods in MODULES.items():
        mods = dict(mods)
        if flash and phase != "optimizer":
            fused = sum(mods.pop(k) for k in ("attn_scores", "softmax", "attn_values")) / 2
            mods["attention_fused"] = fused
        total = sum(mods.values())
        rows += [{"phase": phase, "module": m, "time_s": t * scale, "share": t / total, "gemm_time_s": 0.0} for m, t in mods.items()]
    walls = {p: sum(r["time_s"] for r in rows if r["phase"] == p) for p in MODULES}
    return {"rows": rows, "phases": {p: {"wall_s": w, "kernel_s": 0.9 * w, "gemm_s": 0.5 * w} for p, w in walls.items()},
            "step_time_s": sum(walls.values()), "unprofiled_step_time_s": 0.9 * sum(walls.values()),
            "tokens_per_s": 700.0, "attention": "sdpa[default]" if flash else "sdpa[math]", "trace": "/x/trace.json",
            "unaccounted_s": 0.0, "method": "hooks", "versions": {}, "devices": {}}


def write(tmp_path, technique, bs, result):
    g = grid.expand({"protocol": {"repeats": 2}, "profile": [
        {"platforms": ["cpu"], "models": ["llama2-7b"], "techniques": [technique], "batch_sizes": [bs]}]})
    cell = g.cells[0]
    rec = build_record(g.spec(cell), [Outcome(status="ok", result=result)] * 2, "t0", ["x"])
    path = tmp_path / cell.record_path("results")
    record.write(rec, path)
    return path, rec


def test_profile_cells_use_the_torch_backend_and_only_f_and_r():
    g = grid.expand({"protocol": {}, "profile": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["F+R"],
                                                  "batch_sizes": [2]}]})
    assert g.cells[0].backend == "torch" and g.cells[0].record_path() == "results/runs/profile/cpu/tiny/torch/F+R/bs2-g1/record.json"
    with pytest.raises(ConfigError, match=r"profile\[0\]\.techniques\[0\]: profile 'training' supports the flags F, R; "
                                          r"'Z3' asks for Z3 \(profile: communication"):
        grid.expand({"protocol": {}, "profile": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [2]}]})
    # a DeepSpeed profile cell (communication and copies, Tables XIV-XVI) takes any pre-training technique but C
    g = grid.expand({"protocol": {}, "profile": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["R+Z3+O"],
                                                  "batch_sizes": [32], "backend": "deepspeed", "gpus": 2}]})
    assert g.cells[0].record_path() == "results/runs/profile/cpu/tiny/deepspeed/R+Z3+O/bs32-g2/record.json"
    with pytest.raises(ConfigError, match=r"profile\[0\]\.techniques\[0\]: 'Z2\+C': C \(torch.compile\) is for pretrain and finetune"):
        grid.expand({"protocol": {}, "profile": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z2+C"],
                                                  "batch_sizes": [2], "backend": "deepspeed", "gpus": 2}]})
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.backend: 'torch' does not run pretrain cells; allowed: deepspeed"):
        grid.expand({"protocol": {}, "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"],
                                                   "batch_sizes": [1], "backend": "torch"}]})


def test_a_profile_block_names_its_kind_with_profile_and_backend_still_works():
    """profile: training | inference | communication names what is profiled; the cells, their
    specs and paths are those the older spelling (backend: torch | inference | deepspeed) gives."""
    block = {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["F"], "batch_sizes": [2], "gpus": 2}
    for kind, backend in [("training", "torch"), ("inference", "inference"), ("communication", "deepspeed")]:
        new = grid.expand({"protocol": {}, "profile": [{**block, "profile": kind}]})
        old = grid.expand({"protocol": {}, "profile": [{**block, "backend": backend}]})
        both = grid.expand({"protocol": {}, "profile": [{**block, "backend": backend, "profile": kind}]})
        assert new.cells == old.cells == both.cells and new.cells[0].backend == backend
        assert new.spec(new.cells[0]) == old.spec(old.cells[0])
        assert new.cells[0].record_path() == f"results/runs/profile/cpu/tiny/{backend}/F/bs2-g2/record.json"
    assert grid.expand({"protocol": {}, "profile": [block]}).cells[0].backend == "torch"  # null: training
    with pytest.raises(ConfigError, match=r"^profile\[0\]\.backend: 'deepspeed' disagrees with profile 'inference' "
                                          r"\(which runs on 'inference'\); in a profile block give profile alone"):
        grid.expand({"protocol": {}, "profile": [{**block, "profile": "inference", "backend": "deepspeed"}]})
    with pytest.raises(ConfigError, match=r"^pretrain\[0\]\.profile: only in profile blocks"):
        grid.expand({"protocol": {}, "pretrain": [{**block, "techniques": ["Naive"], "profile": "training"}]})
    with pytest.raises(ConfigError, match=r"profile\[0\]\.profile: 'kernels' is not allowed; allowed values: 'training', 'inference', 'communication'"):
        grid.expand({"protocol": {}, "profile": [{**block, "profile": "kernels"}]})
    with pytest.raises(ConfigError, match=r"profile\[0\]\.techniques\[0\]: profile 'inference' supports the flags F; "
                                          r"'R' asks for R"):
        grid.expand({"protocol": {}, "profile": [{**block, "techniques": ["R"], "profile": "inference"}]})


def test_a_profile_record_of_several_repeats_keeps_each_repeats_phases_and_rows():
    """The samples are the mean rows; summary.repeats holds each repeat's own phase times and
    rows (the spread a finding's interval needs); one repeat keeps none."""
    g = grid.expand({"protocol": {"repeats": 2}, "profile": [
        {"platforms": ["cpu"], "models": ["llama2-7b"], "techniques": ["Naive"], "batch_sizes": [2]}]})
    spec = g.spec(g.cells[0])
    slow, fast = worker_result(False, scale=1.2), worker_result(False, scale=0.8)
    rec = build_record(spec, [Outcome(status="ok", result=slow), Outcome(status="ok", result=fast)], "t0", ["x"])
    reps = rec.summary["repeats"]
    assert [r["phases"]["optimizer_wall_s"] for r in reps] == pytest.approx([0.06, 0.04])
    assert rec.summary["optimizer_wall_s"] == pytest.approx(0.05)
    mlp = [dict(zip(zip(r["rows"]["phase"], r["rows"]["module"]), r["rows"]["time_s"]))[("forward", "mlp")]
           for r in reps]
    assert mlp == pytest.approx([0.06, 0.04])
    assert dict(zip(zip(rec.samples["phase"], rec.samples["module"]), rec.samples["time_s"]))[("forward", "mlp")] \
        == pytest.approx(0.05)
    one = build_record(spec, [Outcome(status="ok", result=slow)], "t0", ["x"])
    assert "repeats" not in one.summary
    assert rec.metrics.peak_mem_allocated_gib is None  # results from before peaks were kept
    peaks = [{**slow, "peak_mem_allocated_gib": 80.5, "peak_mem_reserved_gib": 90.0, "peak_rss_gib": 3.0},
             {**fast, "peak_mem_allocated_gib": 81.0, "peak_mem_reserved_gib": 88.0, "peak_rss_gib": 3.5}]
    m = build_record(spec, [Outcome(status="ok", result=r) for r in peaks], "t0", ["x"]).metrics
    assert (m.peak_mem_allocated_gib, m.peak_mem_reserved_gib, m.peak_rss_gib) == (81.0, 90.0, 3.5)


def test_profile_tables_beside_the_paper(tmp_path):
    paths = [write(tmp_path, "Naive", 2, worker_result(False))[0], write(tmp_path, "F", 2, worker_result(True))[0]]
    _, rec = write(tmp_path, "R", 32, worker_result(False, scale=10))
    df = tidy.build(paths)
    rows = tidy.build_samples(paths, "profile")
    assert set(rows["technique"]) == {"Naive", "F"} and len(rows) == 2 * 13 - 2 * 3 + 2 * 1
    assert rec.summary["forward_wall_s"] == pytest.approx(0.1 * 10) and rec.metrics.tokens_per_s_runs == (700.0, 700.0)

    built = profile.phases(df)
    phases, md = built.long, render.markdown(built)
    naive_fwd = phases[(phases.technique == "Naive") & (phases.phase == "forward")].iloc[0]
    assert naive_fwd.wall_ms == pytest.approx(100.0) and naive_fwd.paper_wall_ms == pytest.approx(75.0)
    assert naive_fwd.gemm_share_pct == pytest.approx(50.0) and naive_fwd.paper_gemm_share_pct == pytest.approx(66.4)
    assert phases[phases.technique == "Naive"]["share_pct"].sum() == pytest.approx(100.0)
    row = next(r for r in md_rows(md) if (r["Method"], r["Phase"]) == ("Naive", "forward"))
    assert (row["Platform"], row["Model"], row["BS"], row["ms"]) == ("cpu", "llama2-7b", "2", "100.00")
    assert not any(r["kernel ms"].endswith(" !") for r in md_rows(md))  # no phase holds more kernel time than wall time
    # a phase whose kernels add up past its wall time (one stream cannot) is flagged
    over = df.copy()
    over.loc[over.technique == "Naive", "optimizer_kernel_s"] = over.loc[over.technique == "Naive", "optimizer_wall_s"] * 1.5
    flagged = [r for r in md_rows(render.markdown(profile.phases(over))) if r["kernel ms"].endswith(" !")]
    assert [(r["Method"], r["BS"], r["Phase"]) for r in flagged] == [("Naive", "2", "optimizer")]
    # where the device activities are known (GPU runs) they are the ceiling: kernel time
    # under the wall time but over the phase's device time is counted twice
    dev = df.copy()
    naive = dev.technique == "Naive"
    dev.loc[naive, "forward_device_s"] = dev.loc[naive, "forward_kernel_s"] * 0.5
    dev.loc[naive, "backward_device_s"] = dev.loc[naive, "backward_kernel_s"]
    dev_built = profile.phases(dev)
    dev_table = dev_built.long
    flagged = [r for r in md_rows(render.markdown(dev_built)) if r["kernel ms"].endswith(" !")]
    assert [(r["Method"], r["BS"], r["Phase"]) for r in flagged] == [("Naive", "2", "forward")]
    assert dev_table[(dev_table.technique == "Naive") & (dev_table.phase == "optimizer")].device_ms.isna().all()

    mods = profile.modules(df, rows).long
    mlp = mods[(mods.technique == "Naive") & (mods.phase == "backward") & (mods.module == "mlp")].iloc[0]
    assert mlp.time_ms == pytest.approx(100.0) and mlp.paper_time_ms == pytest.approx(88.70)

    att_built = profile.attention(df, rows)
    att, md = att_built.long, render.markdown(att_built)
    fwd = att[att.phase == "forward"].iloc[0]
    assert (fwd.base, fwd.naive_ms, fwd.flash_ms) == ("Naive", pytest.approx(20.0), pytest.approx(10.0))
    assert fwd.improvement_pct == pytest.approx(50.0)
    assert ["paper: a800", "llama2-7b", "Naive", "2", "forward", "1.06", "0.69", "34.9"] in [list(r.values()) for r in md_rows(md)]

    chart = chart_of(tmp_path, df, "profile-modules", profile=rows)
    # Fig. 5: the paper's Table VI bar (llama2-7b, Naive, batch 2) beneath ours, never for a cell it lacks
    bars = {v["cell"] for v in next(iter(chart.to_dict()["datasets"].values()))}
    assert bars == {"cpu llama2-7b Naive bs2", "cpu llama2-7b F bs2", "paper a800 llama2-7b Naive bs2"}
    out = figures.save(chart, tmp_path / "fig5")
    assert out[1].read_text().lstrip().startswith("<svg")


def test_serving_forward_table_groups_modules_as_tables_x_and_xi(tmp_path):
    """Rows of an inference cell's prefill and decode -> Table XI's parts and Table X's
    kernel classes; each view adds up to the phase, decode per step."""
    import pandas as pd

    from llmbench.report import profile

    def rows(phase, scale):
        mods = {"embedding": (1, 0), "qkv": (4, 3), "rope": (1, 0), "attention_fused": (6, 0), "output": (2, 2),
                "mlp": (8, 7), "rmsnorm": (1, 0), "lm_head": (3, 3), "other": (4, 0)}
        return [{"platform": "cpu", "model": "tiny", "backend": "inference", "technique": "F", "batch_size": 8,
                 "gpus": 1, "phase": phase, "module": m, "time_s": t * scale / 1e3, "gemm_time_s": g * scale / 1e3}
                for m, (t, g) in mods.items()]

    points = pd.DataFrame(rows("prefill", 1) + rows("decode", 4))
    t = {k: None for k in tidy.ALL_COLUMNS}
    t.update(stage="profile", backend="inference", status="ok", platform="cpu", model="tiny", technique="F",
             batch_size=8, gpus=1, decode_steps=4)
    built = profile.serve(pd.DataFrame([t]), points)
    table, md = built.long, render.markdown(built)
    for phase in ("prefill", "decode"):  # decode: 4 steps of 4x the time -> the prefill's ms per pass
        view = table[(table.phase == phase)].set_index(["view", "group"])
        assert view.loc[("timeline", "attention"), "ms"] == pytest.approx(4 + 1 + 6 + 2)
        assert view.loc[("kernels", "gemm"), "ms"] == pytest.approx(15)
        assert view.loc[("kernels", "element_wise"), "ms"] == pytest.approx(1 + 1 + 1)  # embedding, qkv, mlp
        for v in ("timeline", "kernels"):
            assert view.loc[v, "pct"].sum() == pytest.approx(100.0)
    assert table[(table.group == "attention") & (table.view == "kernels")].paper_ms.iloc[0] == 23.05
    assert md.startswith("### Tables X, XI")
    from llmbench.report import figures

    out = figures.save(chart_of(tmp_path, pd.DataFrame([t]).reindex(columns=tidy.ALL_COLUMNS), "profile-serve",
                                profile=points), tmp_path / "serve")
    assert out[1].read_text().lstrip().startswith("<svg") and "attention" in out[0].read_text()
