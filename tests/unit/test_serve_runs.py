"""Runs of one serving point (identical loads <name>-1, -2, ...) pool into mean ± std;
points that differ in their load (Poisson rates) never pool, whatever their names."""

import math

import pytest

from llmbench.record import Record, write
from llmbench.serve.runs import markdown, over_runs, rows

BURST = {"mode": "burst", "num_requests": 1000, "input_len": 512, "output_len": 128, "rate_per_s": None}


def _record(tmp_path, engine, load, spec, out_tok_s, status="ok", position=None, engine_args=(), versions=None,
            gpu=None):
    cell = {"stage": "serve", "platform": "h100", "model": "llama2-7b", "engine": engine, "load": load, "gpus": 1,
            "load_spec": spec, "engine_args": list(engine_args)}
    summary = {"output_tokens_per_s": out_tok_s, "request_throughput_per_s": out_tok_s / 128, "p50_ttft_s": 1.0,
               "p99_ttft_s": 2.0, "goodput_share": 0.5} if status == "ok" else {}
    if gpu is not None:  # the NVML window's means: SM clock MHz, power W
        summary.update(gpu0_sm_clock_mhz_mean=gpu[0], gpu0_power_w_mean=gpu[1])
    prov = {} if position is None else {"engine_session": {"cells": [], "position": position}}
    if versions is not None:
        prov["engine_versions"] = versions
    write(Record(cell=cell, status=status, reason="" if status == "ok" else "server exited", summary=summary,
                 provenance=prov),
          tmp_path / "runs/serve/h100/llama2-7b" / engine / f"{load}-g1/record.json")


def test_identical_loads_pool_and_distinct_rates_do_not(tmp_path):
    for k, v in enumerate((4000.0, 4100.0, 4200.0), 1):
        _record(tmp_path, "vllm", f"burst-{k}", BURST, v)
    _record(tmp_path, "lightllm", "burst-1", BURST, 3000.0)
    _record(tmp_path, "lightllm", "burst-2", BURST, None, status="error")
    for rate in (5, 10):
        _record(tmp_path, "vllm", f"poisson-{rate}", {**BURST, "mode": "poisson", "rate_per_s": rate}, 100.0 * rate)
    pooled = over_runs(rows([tmp_path])).set_index(["engine", "point"])
    vllm = pooled.loc[("vllm", "burst")]
    assert (vllm["runs"], vllm["ok"]) == (3, 3)
    assert vllm["output_tokens_per_s_mean"] == pytest.approx(4100.0)
    assert vllm["output_tokens_per_s_std"] == pytest.approx(100.0)  # sample std (ddof 1)
    light = pooled.loc[("lightllm", "burst")]
    assert (light["runs"], light["ok"], light["output_tokens_per_s_mean"]) == (2, 1, 3000.0)
    assert math.isnan(light["output_tokens_per_s_std"])
    assert pooled.loc[("vllm", "poisson-5")]["runs"] == 1 and pooled.loc[("vllm", "poisson-10")]["runs"] == 1
    assert list(over_runs(rows([tmp_path]))["point"]) == ["burst", "burst", "poisson-5", "poisson-10"]
    md = markdown(over_runs(rows([tmp_path])))
    assert "4100.0 ± 100.0" in md and "2 (1)" in md


def test_a_load_on_a_warm_engine_is_a_point_of_its_own(tmp_path):
    """A burst served by an engine that had served other loads (a shared engine's, position > 0)
    never pools with the fresh engines' bursts; the first load of a session is a fresh engine's."""
    _record(tmp_path, "vllm", "burst-1", BURST, 4000.0)
    _record(tmp_path, "vllm", "burst-2", BURST, 4200.0, position=0)
    _record(tmp_path, "vllm", "burst", BURST, 3000.0, position=4)
    pooled = over_runs(rows([tmp_path])).set_index("point")
    assert pooled.loc["burst", "runs"] == 2 and pooled.loc["burst", "output_tokens_per_s_mean"] == 4100.0
    assert pooled.loc["burst (warm engine)", "runs"] == 1


def test_loads_on_engines_launched_otherwise_never_pool(tmp_path):
    """The same load on an engine with its prefix cache on and on one with it off (a block's
    engine arguments) are two points, whatever the loads' names."""
    _record(tmp_path, "vllm", "on-1", BURST, 5000.0, engine_args=["--enable-prefix-caching"])
    _record(tmp_path, "vllm", "on-2", BURST, 5200.0, engine_args=["--enable-prefix-caching"])
    _record(tmp_path, "vllm", "off-1", BURST, 4000.0, engine_args=["--no-enable-prefix-caching"])
    pooled = over_runs(rows([tmp_path])).set_index("point")
    assert pooled.loc["on", "runs"] == 2 and pooled.loc["on", "output_tokens_per_s_mean"] == 5100.0
    assert pooled.loc["off-1", "runs"] == 1


def test_runs_of_two_engine_versions_never_pool_and_each_point_names_its_version_and_gpu(tmp_path):
    _record(tmp_path, "sglang", "burst-1", BURST, 5000.0, versions={"sglang": "0.5.17"}, gpu=(1500.0, 680.0))
    _record(tmp_path, "sglang", "burst-2", BURST, 5200.0, versions={"sglang": "0.5.17"}, gpu=(1520.0, 690.0))
    _record(tmp_path, "sglang", "burst-3", BURST, 6000.0, versions={"sglang": "0.5.23"}, gpu=(1600.0, 650.0))
    pooled = over_runs(rows([tmp_path])).set_index("engine_version")
    assert pooled.loc["0.5.17", "runs"] == 2 and pooled.loc["0.5.17", "output_tokens_per_s_mean"] == 5100.0
    assert pooled.loc["0.5.23", "runs"] == 1
    assert pooled.loc["0.5.17", "gpu0_power_w_mean_mean"] == 685.0
    md = markdown(over_runs(rows([tmp_path])))
    assert "sglang (0.5.17)" in md and "sglang (0.5.23)" in md and " GPUs |" in md
    assert "1510 ± 14 / 685 ± 7" in md  # GPU MHz / W over the two runs
