"""Microbenchmarks (llmbench.micro): GEMM, memcpy and collectives on CPU, for real, in this
process (the collectives over 2 processes under torchrun:
tests/integration/test_collectives_torchrun.py).

Timings are only checked to be positive and finite: a timing is measured in a
benchmark, never asserted in a test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from llmbench.micro import collectives, gemm, memcpy, timing


def _finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


# --- timing -----------------------------------------------------------------------

def test_time_fn_counts_warmup_and_timed_calls():
    calls, resets = [], []
    times = timing.time_fn(lambda: calls.append(1), device="cpu", warmup=3, iters=4,
                           between=lambda: resets.append(1))
    assert len(times) == 4 and len(calls) == 7 and len(resets) == 7
    assert all(t >= 0 and math.isfinite(t) for t in times)


def test_time_fn_rejects_no_iters():
    with pytest.raises(ValueError, match="iters"):
        timing.time_fn(lambda: None, device="cpu", warmup=0, iters=0)


def test_summary():
    s = timing.summary([4.0, 1.0, 3.0, 2.0])
    assert s == pytest.approx({"median_s": 2.5, "mean_s": 2.5, "min_s": 1.0, "std_s": 1.2909944})
    assert timing.summary([2.0])["std_s"] == 0.0


def test_device_of():
    assert timing.device_of("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="accelerator"):
        timing.device_of("tpu")


# --- GEMM -------------------------------------------------------------------------

def test_sweep_paper_curves():
    aligned = gemm.sweep(**gemm.FIG11_CURVES["N11008_K4096"])
    unaligned = gemm.sweep(**gemm.FIG11_CURVES["unaligned_N11008_K4096"])
    assert aligned[0] == (4096, 11008, 4096) and aligned[-1] == (16384, 11008, 4096)
    assert len(aligned) == len(unaligned) == 25  # (16384 - 4096) / 512 + 1
    assert unaligned[0][0] == 4096 + 13 and unaligned[-1][0] == 16384 + 13
    assert [m for m, _, _ in aligned] == [m - 13 for m, _, _ in unaligned]


def test_sweep_boundaries():
    assert gemm.sweep(8, 8, 16, 16, 4) == [(16, 8, 8)]
    assert [m for m, _, _ in gemm.sweep(8, 8, 16, 30, 8)] == [16, 24]  # 32 > stop
    with pytest.raises(ValueError, match="m_stop"):
        gemm.sweep(8, 8, 32, 16, 8)
    with pytest.raises(ValueError, match="m_step"):
        gemm.sweep(8, 8, 16, 32, 0)


def test_gemm_rows_on_cpu():
    rows = gemm.run([(64, 48, 32), (65, 48, 32)], accelerator="cpu", warmup=1, iters=3, peak_tflops=2.0)
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(64, 48, 32), (65, 48, 32)]
    assert [r["aligned"] for r in rows] == [True, False]
    for r in rows:
        assert r["correct"] is True and r["dtype"] == "bfloat16"
        assert _finite_positive(r["time_s"]) and 0 < r["time_s_min"] <= r["time_s"]
        assert r["tflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / r["time_s"] / 1e12)
        assert r["pct_of_peak"] == pytest.approx(100 * r["tflops"] / 2.0)
    assert gemm.run([(8, 8, 8)], accelerator="cpu", warmup=0, iters=1, peak_tflops=None)[0]["pct_of_peak"] is None


def test_gemm_shape_sets_are_checked_against_plain_matmul(repo):
    # the harness's bar: its best point within 3% of plain back-to-back torch.matmul,
    # measured in the same process right after: shape sets carry it, curves do not (cost)
    rows = gemm.run([(64, 48, 32)], accelerator="cpu", warmup=1, iters=3, peak_tflops=None, plain_check=True)
    assert _finite_positive(rows[0]["plain_tflops"])
    assert rows[0]["vs_plain"] == pytest.approx(rows[0]["tflops"] / rows[0]["plain_tflops"])
    assert "plain_tflops" not in gemm.run([(8, 8, 8)], accelerator="cpu", warmup=0, iters=1, peak_tflops=None)[0]
    from llmbench import grid

    g = grid.load(repo / "results/reference/2026-11-22-h100-micro/config.yaml")
    checked = {c.case: c.params.get("plain_check", False) for c in g.cells if c.bench == "gemm"}
    assert checked["square-8192"] and checked["table12-mlp"] and not checked["n4096-k4096"]


def test_alignment_depends_on_element_size():
    assert gemm.alignment("bfloat16") == gemm.alignment("float16") == 8
    assert gemm.alignment("float32") == 4


def test_gemm_check_detects_a_wrong_product():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(40, 96, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(96, 24, dtype=torch.bfloat16, generator=gen)
    out = a @ b
    assert gemm.relative_error(a, b, out) <= gemm.tolerance("bfloat16")
    wrong = out.clone()
    wrong[:, -1] = 0  # one output column lost
    assert gemm.relative_error(a, b, wrong) > gemm.tolerance("bfloat16")
    assert gemm.relative_error(a, b, out * 1.05) > gemm.tolerance("bfloat16")


def test_best_matmul_tflops_on_cpu():
    assert _finite_positive(gemm.best_matmul_tflops(32, 32, 32, accelerator="cpu", warmup=1, iters=3))


def test_gemm_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype"):
        gemm.run([(8, 8, 8)], dtype="int4", accelerator="cpu", warmup=0, iters=1, peak_tflops=None)


# --- memcpy -----------------------------------------------------------------------

def test_memcpy_sizes():
    assert memcpy.sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert memcpy.sizes(1000, 5000) == [1024, 2048, 4096]
    assert memcpy.sizes(1, 1) == [1]
    with pytest.raises(ValueError, match="max_bytes"):
        memcpy.sizes(8, 4)


def test_memcpy_rows_on_cpu_are_host_copies():
    rows = memcpy.run([4096, 1 << 16], accelerator="cpu", warmup=1, iters=3)
    assert [r["bytes"] for r in rows] == [4096, 1 << 16]
    for r in rows:
        assert r["direction"] == "h2h" and r["pinned"] is False
        assert "NOT a host<->device transfer" in r["label"]
        assert _finite_positive(r["time_s"])
        assert r["gb_per_s"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)


# --- collectives ------------------------------------------------------------------

def test_bus_factors():
    assert collectives.bus_bandwidth("all_reduce", 10.0, 8) == pytest.approx(17.5)
    assert collectives.bus_bandwidth("all_gather", 10.0, 4) == pytest.approx(7.5)
    assert collectives.bus_bandwidth("reduce_scatter", 10.0, 2) == pytest.approx(5.0)
    assert collectives.bus_bandwidth("reduce", 10.0, 8) == collectives.bus_bandwidth("broadcast", 10.0, 8) == 10.0
    with pytest.raises(ValueError, match="op"):
        collectives.bus_bandwidth("all_to_all", 1.0, 2)


def test_spec_round_trip_and_errors():
    data = {"ops": ["all_reduce"], "sizes_bytes": [64], "warmup": 1, "iters": 2, "accelerator": "cpu"}
    spec = collectives.Spec.from_dict(data)
    assert collectives.Spec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="spec.ops"):
        collectives.Spec.from_dict({**data, "ops": ["gather"]})
    with pytest.raises(ValueError, match="unknown keys"):
        collectives.Spec.from_dict({**data, "size": 1})


@pytest.mark.parametrize("op", collectives.OPS)
def test_check_accepts_the_right_result_and_rejects_a_corrupted_one(op):
    n, count, kw = 2, 50, dict(seed=3, count=50, world_size=2)
    inputs = [collectives.rank_input(op, rank=q, dtype=torch.float32, **kw) for q in range(n)]
    # What each op must produce on rank 1, computed here from the inputs by hand.
    right = {"all_reduce": inputs[0] + inputs[1], "reduce": inputs[1],  # rank 1 is not the root
             "broadcast": inputs[0], "all_gather": torch.cat(inputs),
             "reduce_scatter": inputs[0][count:] + inputs[1][count:]}[op]
    assert collectives.check(op, right, rank=1, **kw)
    if op == "reduce":  # only the root's buffer is defined
        assert collectives.check(op, inputs[0] + inputs[1], rank=0, **kw)
        assert not collectives.check(op, inputs[0], rank=0, **kw)
        return
    wrong = right.clone()
    wrong[-1] += 1
    assert not collectives.check(op, wrong, rank=1, **kw)


def test_run_reports_a_corrupted_collective(monkeypatch):
    real = collectives._all_gather

    def corrupted(out, inp):
        real(out, inp)
        out[-1] += 1  # a single wrong element at the end of the buffer

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        good = collectives.run(["all_gather", "broadcast"], [64], warmup=1, iters=2)
        monkeypatch.setattr(collectives, "_all_gather", corrupted)
        bad = collectives.run(["all_gather"], [64], warmup=1, iters=2)
    finally:
        dist.destroy_process_group()
    assert [r["correct"] for r in good] == [True, True]
    assert bad[0]["correct"] is False


@pytest.mark.parametrize("only", ["gemm", "memcpy", "collectives"])
def test_micro_figures_build_when_a_benchmark_is_absent(only):
    # a GPU pair runs collectives alone, one GPU GEMM and memcpy alone: every micro figure
    # must still build (an empty panel), not fail on the absent benchmark's columns
    import pandas as pd
    from llmbench.report import figures

    rows = {
        "gemm": {"bench": "gemm", "platform": "h100", "case": "n4096-k4096", "m": 4096, "n": 4096, "k": 4096,
                 "tflops": 700.0, "pct_of_peak": 70.7},
        "memcpy": {"bench": "memcpy", "platform": "h100", "direction": "h2d", "pinned": True, "bytes": 1 << 20,
                   "gb_per_s": 50.0, "time_s": 2e-5},
        "collectives": {"bench": "collectives", "platform": "h200", "case": "p2p", "op": "all_reduce",
                        "bytes": 1 << 20, "busbw_gb_per_s": 100.0, "time_s": 1e-5},
    }
    from llmbench.report import micro

    # each figure reads its table's long form (micro.points: what the table's CSV holds)
    frame = pd.DataFrame([rows[only]])
    tables = {f"micro-{bench}": micro.points(frame, bench) for bench in ("gemm", "memcpy", "collectives")}
    for chart in (figures.micro_gemm_chart, figures.micro_memcpy_chart, figures.micro_collectives_chart):
        spec = chart(tables).to_dict()
        assert spec["facet"]
