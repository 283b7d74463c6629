"""The memory model: each term against a hand calculation, the validation table's parts and
the search replay on fixtures. The fit, the validation table and the replay against the
committed records: tests/calibration/test_reference_memory.py."""

import json
from pathlib import Path

import pandas as pd
import pytest

from llmbench import memory
from llmbench.memory import constants as C
from llmbench.memory.model import (GIB, Workload, activation_bytes, adapter_params, buffer_bytes,
                                   layer_activation_bytes, predict, state_bytes)
from llmbench.models import ModelSpec

from conftest import REPO

L7, L70 = ModelSpec.load("llama2-7b"), ModelSpec.load("llama2-70b")
N7 = L7.param_counts()["total"]  # 6,738,415,616
LORA_ALL = {"kind": "lora", "rank": 64, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"]}


def w(technique="Naive", batch_size=1, seq_len=350, gpus=1, model=L7, **kw):
    return Workload(model=model, technique=technique, batch_size=batch_size, seq_len=seq_len, gpus=gpus, **kw)


def test_lora_parameters_by_hand_and_as_the_70b_record_counted():
    # 7B: q, o 4096+4096 each; k, v the same (no GQA); gate, up 4096+11008; down 11008+4096
    per_layer = 64 * (4 * 8192 + 3 * 15104)
    assert adapter_params(L7, LORA_ALL) == (32 * per_layer, 0)
    # 70B (GQA, 8 kv heads of 128): the committed QL record trained 828,375,040 parameters
    assert adapter_params(L70, LORA_ALL)[0] == 828_375_040
    fa = adapter_params(L7, {**LORA_ALL, "kind": "lora_fa", "target_modules": ["q_proj"]})
    assert fa == (32 * 64 * 4096, 32 * 64 * 4096)  # B trains, A is frozen
    dora = adapter_params(L7, {**LORA_ALL, "kind": "dora", "target_modules": ["down_proj"]})
    assert dora == (32 * (64 * (11008 + 4096) + 4096), 0)  # + one magnitude per output
    assert adapter_params(L7, {"kind": "prompt_tuning", "num_virtual_tokens": 20}) == (20 * 4096, 0)


@pytest.mark.parametrize("tech, gpus, fb, step", [
    ("Naive", 1, 14, 24), ("F+R", 2, 14, 24),          # ZeRO-0: nothing sharded
    ("Z2", 2, 4 + 12 / 2, 2 + 20 / 2), ("Z2", 8, 4 + 12 / 8, 2 + 20 / 8),
    ("Z2", 1, 4 + 12, 2 + 20),  # one H200's Z2 OOM: 18 bytes allocated + the 4-byte fp32 copy
    ("Z3", 4, 16 / 4, 16 / 4 + 6e9 / N7),  # + one optimizer sub-group's (1e9) gradient copy
    ("Z2+O", 2, 2 + 0.80 / 2, 2 + 0.80 / 2), ("Z3+O", 2, 0.83 / 2, 0.83 / 2),
])
def test_full_parameter_states_by_hand(tech, gpus, fb, step):
    got = state_bytes(w(tech, gpus=gpus))
    assert got[0] == pytest.approx(fb * N7) and got[1] == pytest.approx(step * N7)


def test_zero3s_step_copies_one_optimizer_sub_group_of_gradients():
    # one H200's llama2-7b Z3 at g = 1 measured 107.06 GiB, the H200 pair's at g = 2 56.81
    for gpus, measured in ((1, 107.06), (2, 56.81)):
        assert predict(w("Z3", gpus=gpus)).phase == "optimizer step"
        assert predict(w("Z3", gpus=gpus)).gpu_gib == pytest.approx(measured, rel=0.002)
    # a partition under the sub-group size is copied whole: LoRA's adapters
    trainable, _ = adapter_params(L7, LORA_ALL)
    fb, step, _ = state_bytes(w("L+Z3", adapter=LORA_ALL, gpus=2))
    assert step - fb == pytest.approx(6 * trainable / 2)
    # with offload the step runs on the host: no copy on the GPU
    fb, step, _ = state_bytes(w("Z3+O", gpus=1))
    assert step == fb


def test_offload_puts_the_optimizer_on_the_host():
    assert state_bytes(w("Z2+O", gpus=2))[2] == pytest.approx(21 * N7 / 2)
    assert state_bytes(w("Z3+O", gpus=1))[2] == pytest.approx(24 * N7)
    assert state_bytes(w("Z2", gpus=2))[2] == 0


def test_frozen_bases_by_hand():
    counts = L7.param_counts()
    lora, _ = adapter_params(L7, LORA_ALL)
    # LoRA: bf16 base + the adapters' ZeRO-0 bytes (at the forward pass's end)
    assert state_bytes(w("L", adapter=LORA_ALL))[0] == pytest.approx(2 * N7 + 14 * lora)
    # QLoRA: 4-bit decoder linears, the rest bf16
    ql = state_bytes(w("QL", adapter=LORA_ALL))[0]
    base = counts["decoder_linear"] * 0.53 + (N7 - counts["decoder_linear"]) * 2
    assert ql == pytest.approx(base + 14 * lora)
    # Q pre-training: embeddings, norms and lm_head train
    q = state_bytes(w("Q"))[0]
    assert q == pytest.approx(counts["decoder_linear"] * 0.53 + 14 * (N7 - counts["decoder_linear"]))
    # ZeRO-3 shards the frozen base too
    z3 = state_bytes(w("L+Z3", gpus=2, adapter=LORA_ALL))[0]
    assert z3 == pytest.approx(2 * N7 / 2 + 16 * lora / 2)
    # ZeRO-3 + offload moves the bf16 base to the host with the rest (a 4-bit base stays)
    fb, step, host = state_bytes(w("L+Z3+O", gpus=2, adapter=LORA_ALL))
    assert fb == pytest.approx(2 * 1e9 + 0.83 * lora / 2) and host == pytest.approx((24 * lora + 3.17 * N7) / 2)
    assert state_bytes(w("QL+Z3+O", adapter=LORA_ALL))[0] > counts["decoder_linear"] * 0.53


def test_megatron_states_by_hand():
    dist = w(backend="megatron", gpus=2, parallel={"tensor_parallel": 1, "pipeline_parallel": 1,
                                                   "distributed_optimizer": True})
    assert state_bytes(dist)[:2] == pytest.approx((N7 * (6 + 12 / 2), N7 * (6 + 16 / 2)))
    tp2 = w(backend="megatron", gpus=2, parallel={"tensor_parallel": 2, "pipeline_parallel": 1,
                                                  "distributed_optimizer": False})
    assert state_bytes(tp2)[:2] == pytest.approx((18 * N7 / 2, 22 * N7 / 2))


def test_korthikanti_activations_by_hand():
    # eq. 1: 34h + 5as per token and layer; F drops 5as; eq. 2 with t = 2: h(10 + 12) + 5as/2
    assert layer_activation_bytes(L7, 350, flash=True) == 34 * 4096
    assert layer_activation_bytes(L7, 350, flash=False) == 34 * 4096 + 5 * 32 * 350
    assert layer_activation_bytes(L7, 350, flash=False, tp=2) == 22 * 4096 + 2.5 * 32 * 350
    k = C.BACKENDS["deepspeed"]
    acts, layer, logits = activation_bytes(w("F", batch_size=2))
    assert acts == pytest.approx(700 * 32 * k.act_scale * 34 * 4096) and layer == 0
    assert logits == pytest.approx(700 * k.logits_bytes * 32000)
    # R keeps each layer's 2-byte input; one layer is recomputed at a time
    acts, layer, _ = activation_bytes(w("R", batch_size=2))
    assert acts == 700 * 32 * 2 * 4096
    # the backward of a recomputed layer holds RECOMPUTED_LAYER_PEAK times what it saves
    assert layer == pytest.approx(700 * k.act_scale * (34 * 4096 + 5 * 32 * 350) * C.RECOMPUTED_LAYER_PEAK)


def test_zero3_scales_the_activations_of_adapters_and_full_parameter_cells_and_an_adapters_recomputed_layer():
    plain, z3 = (activation_bytes(w(t, adapter=LORA_ALL, batch_size=8)) for t in ("L", "L+Z3"))
    assert z3[0] == pytest.approx(plain[0] * C.ZERO3_ACT_SCALE)
    plain, z3 = (activation_bytes(w(t, batch_size=8)) for t in ("F", "F+Z3"))
    assert z3[0] == pytest.approx(plain[0] * C.ZERO3_ACT_SCALE) and C.ZERO3_ACT_SCALE > 1
    plain, z3 = (activation_bytes(w(t, adapter=LORA_ALL, batch_size=200)) for t in ("L+F+R", "L+F+R+Z3"))
    assert z3[0] == plain[0]  # the layer inputs are what they are
    assert z3[1] == pytest.approx(plain[1] * C.ZERO3_RECOMPUTED_ADAPTER_SCALE)
    assert activation_bytes(w("R+Z3", batch_size=8)) == activation_bytes(w("R", batch_size=8))


def test_a_4bit_full_parameter_cell_scales_its_activations_but_not_with_recomputation_or_an_adapter():
    naive, q = (activation_bytes(w(t, batch_size=8)) for t in ("Naive", "Q"))
    assert q[0] == pytest.approx(naive[0] * C.QUANT4_ACT_SCALE) and C.QUANT4_ACT_SCALE > 1
    assert activation_bytes(w("R+Q", batch_size=8)) == activation_bytes(w("R", batch_size=8))
    assert activation_bytes(w("QL", adapter=LORA_ALL, batch_size=8)) == activation_bytes(w("L", adapter=LORA_ALL,
                                                                                              batch_size=8))


def test_buckets_and_the_peak_is_the_larger_phase():
    assert buffer_bytes(w("Z2", gpus=2)) == 2 * 5e8 * 2 and buffer_bytes(w("Z3", gpus=2)) == 5e8 * 2
    assert buffer_bytes(w("Naive")) == 0
    k = C.BACKENDS["deepspeed"]
    # ZeRO-2 on two GPUs at batch 1: the step (2N + 20N/2) beats forward/backward (4N + 12N/2 + a
    # little); ZeRO-2 frees its buckets at the backward's end, so the step holds none (the H200
    # pair's Z2 at batch 1: 75.40 GiB, 12 bytes x 6.74e9 without them)
    p = predict(w("F+Z2", gpus=2))
    assert p.phase == "optimizer step"
    assert p.gpu_gib == pytest.approx(12 * N7 / GIB + k.overhead_gib)
    # ZeRO-3 allocates its bucket at start-up: the step holds it
    z3 = predict(w("F+Z3", gpus=2))
    assert z3.phase == "optimizer step" and z3.gpu_gib == pytest.approx((8 * N7 + 6e9 + 1e9) / GIB + k.overhead_gib)
    # at batch 64 the activations win; a full-parameter cell's first gradient (the output
    # layer's) comes while the logits' gradient is alive: its buckets sit beside the logits
    big = predict(w("F+Z2", gpus=2, batch_size=64))
    assert big.phase == "forward-backward"
    t = big.terms
    assert big.gpu_gib == pytest.approx(t["states_fb"] + t["activations"] + t["logits"] + t["buffers"] + t["overhead"])
    # an adapter's first gradient comes after the loss's backward: the buckets count beside a
    # recomputed layer, not beside the logits (one H100's 7B L+Z2 peaked where L did at batch
    # 17 and 18, and 1.75 GiB above it at batch 1)
    for batch, beside in ((1, "buffers"), (17, "logits")):
        lz2 = predict(w("L+Z2", adapter=LORA_ALL, batch_size=batch)).terms
        assert lz2["beside"] == pytest.approx(lz2[beside]) and lz2["buffers"] > 0
    r = predict(w("L+F+R+Z2", adapter=LORA_ALL, batch_size=205)).terms
    assert r["beside"] == pytest.approx(max(r["logits"], r["recomputed_layer"] + r["buffers"]))


def test_fits_with_margin_and_host():
    p = memory.Prediction(gpu_gib=76.0, host_gib=10.0, phase="forward-backward", terms={"host_offload": 8.0})
    assert memory.fits(p, 80, margin=0.05)[0] is True  # 79.8 <= 80
    ok, why = memory.fits(p, 80, margin=0.06)
    assert not ok and "80 GiB" in why
    assert memory.fits(p, 80, host_memory_gib=30, ranks_per_node=3, margin=0.0)[0] is True
    ok, why = memory.fits(p, 80, host_memory_gib=29, ranks_per_node=3, margin=0.0)
    assert not ok and "host" in why
    assert memory.fits(p, None)[0] is True  # no capacity known: nothing to say


def test_reserved_is_allocated_plus_the_cached_blocks_and_is_what_must_fit():
    p = predict(w("L+F+R", adapter=LORA_ALL, batch_size=200))
    assert p.phase == "forward-backward"
    assert p.terms["cached"] == pytest.approx(200 * 350 * C.CACHED_LOGITS_BYTES * 32000 / GIB
                                              + C.CACHED_ACTIVATION_FRACTION * p.terms["activations"])
    assert p.reserved_gib == pytest.approx(p.gpu_gib + p.terms["cached"])
    # one H100's 7B L+F+R: batch 200 ran (58.96 GiB allocated, 75.73 reserved), 226 ran out of
    # memory with 64 GiB predicted allocated: what fits is decided on reserved
    assert memory.fits(p, 80)[0]
    oom = predict(w("L+F+R", adapter=LORA_ALL, batch_size=226))
    assert oom.gpu_gib * 1.05 < 80 and not memory.fits(oom, 80)[0]
    # at the optimizer step nothing is added: batch 1's step peak is its reserved peak
    one = predict(w("L+F+R", adapter=LORA_ALL))
    assert one.phase == "optimizer step" and one.reserved_gib == pytest.approx(one.gpu_gib)


def test_zero2_offload_keeps_the_whole_bf16_gradients_cached_through_the_backward_pass():
    n = L7.param_counts()["total"]
    base = C.CACHED_LOGITS_BYTES * 350 * 32000 / GIB  # batch 1's cached logits, no offload term
    for gpus in (1, 2, 4):  # whole gradients: the same on every rank, whatever the ranks
        p = predict(w("Z2+O", gpus=gpus))
        extra = p.terms["cached"] - base - C.CACHED_ACTIVATION_FRACTION * p.terms["activations"]
        assert extra == pytest.approx(C.OFFLOAD_CACHED_GRAD_BYTES * n / GIB)
        assert p.reserved_gib == pytest.approx(p.gpu_gib + p.terms["cached"])
    # not without offload (the step's cache holds them there), nor under ZeRO-3's offload
    for tech in ("Z2", "Z3+O"):
        p = predict(w(tech, gpus=2))
        assert p.terms["cached"] == pytest.approx(base + C.CACHED_ACTIVATION_FRACTION * p.terms["activations"])
    # an adapter trains few parameters: the term is its adapter's gradients only
    lora = predict(w("L+Z2+O", adapter=LORA_ALL))
    extra = lora.terms["cached"] - base - C.CACHED_ACTIVATION_FRACTION * lora.terms["activations"]
    assert extra == pytest.approx(C.OFFLOAD_CACHED_GRAD_BYTES * adapter_params(L7, LORA_ALL)[0] / GIB)


def test_predicted_max_batch_is_the_boundary():
    cell = w("F+R+Z3", gpus=2)
    b = memory.predicted_max_batch(cell, 141)
    assert b > 1
    assert memory.fits(predict(cell.with_batch(b)), 141)[0]
    assert not memory.fits(predict(cell.with_batch(b + 1)), 141)[0]
    assert memory.predicted_max_batch(w("Naive", gpus=2), 141) == 0  # ZeRO-0 7B: 24 bytes a parameter
    assert memory.predicted_max_batch(w("QL+F+R", adapter=LORA_ALL), 80, max_batch=16) == 16


def test_states_lower_bound_kept_for_the_findings():
    assert memory.model_states_gib(L7, "Naive") == pytest.approx(24 * N7 / GIB)  # the step's
    assert memory.cannot_fit(L7, "Naive", 1, 80) and not memory.cannot_fit(L7, "Z3", 8, 80)


# Skipping cells predicted not to fit (skip_predicted_oom) and the dry run of a config --------

MINI = """
results_dir: {results}
protocol: {{warmup_steps: 1, measured_steps: 2, repeats: 1, seq_len: 350, timeout_s: 600, seed: 0}}
pretrain:
  - name: ZeRO-0 7B needs 24 bytes a parameter (cannot fit 80 GiB); 4-bit fits
    platforms: [h100]
    models: [llama2-7b]
    techniques: [Naive, Q]
    batch_sizes: [1]
"""


@pytest.fixture
def mini(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(MINI.format(results=tmp_path / "results"))
    return path


def test_plan_counts_the_cells_that_would_be_skipped_per_platform(mini):
    from llmbench.memory.cells import plan

    cells, per = plan(mini, REPO)
    assert per.to_dict("records") == [{"platform": "h100", "cells": 2, "skipped": 1, "runs": 1, "not_modelled": 0}]
    naive = cells.set_index("technique").loc["Naive"]
    assert not naive["predicted_fits"] and "80 GiB" in naive["reason"]


def test_the_plan_command_prints_the_per_platform_counts(mini, capsys):
    from llmbench.memory.__main__ import main

    assert main(["plan", str(mini)]) == 0
    assert "1 of 2 training cells predicted not to fit" in capsys.readouterr().out


def test_the_plan_names_the_cells_it_does_not_predict(mini, capsys):
    """A profile cell of plain PyTorch has no fitted constants: the plan counts it as run
    unchecked and says why, where it used to leave it out without a word."""
    from llmbench.memory.__main__ import main
    from llmbench.memory.cells import plan

    mini.write_text(mini.read_text() + """profile:
  - platforms: [h100]
    models: [llama2-7b]
    techniques: [Naive, F]
    batch_sizes: [2]
""")
    cells, per = plan(mini, REPO)
    assert per.to_dict("records") == [{"platform": "h100", "cells": 4, "skipped": 1, "runs": 3, "not_modelled": 2}]
    torch_rows = cells[cells["stage"] == "profile"]
    assert torch_rows["predicted_fits"].isna().all()
    assert torch_rows["reason"].str.startswith("backend 'torch' is not modelled").all()
    assert main(["plan", str(mini)]) == 0
    out = capsys.readouterr().out
    assert "1 of 4 training cells predicted not to fit" in out
    assert "2 cell(s) not modelled (they run unchecked): backend 'torch' is not modelled" in out


def _spec(mini, technique):
    from llmbench.grid import load

    grid = load(mini, REPO)
    return grid.spec(next(c for c in grid.cells if c.technique == technique))


def test_a_cell_predicted_not_to_fit_is_skipped_and_runs_nothing(mini, tmp_path, monkeypatch):
    from llmbench import launch, record

    def never(*a, **k):
        raise AssertionError("a skipped cell started a worker")

    monkeypatch.setattr(launch, "run_repeat", never)
    out = tmp_path / "naive" / "record.json"
    rec = launch.run_cell(_spec(mini, "Naive"), out, tmp_path / "naive.log", skip_predicted_oom=True)
    assert rec.status == "skipped" and "predicted not to fit" in rec.reason and "skip_predicted_oom=false" in rec.reason
    back = record.read(out)
    assert back.status == "skipped" and back.summary["margin"] == memory.MARGIN
    assert back.summary["predicted_gpu_gib"] > back.summary["capacity_gib"] == 80
    assert back.provenance["spec"]["cell"]["technique"] == "Naive"
    assert "skipped:" in (tmp_path / "naive.log").read_text()


def test_forcing_runs_the_cell_and_a_fitting_cell_is_never_skipped(mini, tmp_path, monkeypatch):
    from llmbench import gpus, launch
    from llmbench.aggregate import Outcome

    ran = []

    def injected(spec, *a, **k):
        ran.append(spec["cell"]["technique"])
        return Outcome(status="oom", reason="injected out-of-memory")

    monkeypatch.setattr(launch, "run_repeat", injected)
    monkeypatch.setattr(gpus, "check_cell", lambda *a, **k: gpus.Check())  # no NVML here: GPUs free
    forced = launch.run_cell(_spec(mini, "Naive"), tmp_path / "n.json", tmp_path / "n.log", skip_predicted_oom=False)
    fitting = launch.run_cell(_spec(mini, "Q"), tmp_path / "q.json", tmp_path / "q.log", skip_predicted_oom=True)
    assert ran == ["Naive", "Q"] and forced.status == fitting.status == "oom"


def test_a_batch_a_search_ran_is_not_skipped_on_the_prediction(mini, tmp_path, monkeypatch):
    """A search's largest batch sits at the margin's edge: where its probe ran the batch
    without running out of memory (the frontier file says so), the cell runs whatever the
    model predicts; a frontier of another memory fingerprint does not count."""
    from llmbench import gpus, launch
    from llmbench.aggregate import Outcome
    from llmbench.cells import FRONTIER_PATTERN, Cell
    from llmbench.search.frontier import fingerprint

    ran = []
    monkeypatch.setattr(launch, "run_repeat", lambda spec, *a, **k: ran.append(1) or Outcome(status="oom", reason="x"))
    monkeypatch.setattr(gpus, "check_cell", lambda *a, **k: gpus.Check())
    spec = _spec(mini, "Naive")
    cell = Cell.from_dict(spec["cell"])
    results = tmp_path / "results"
    out = Path(cell.record_path(str(results)))
    front = results / FRONTIER_PATTERN.format(**cell.key)
    front.parent.mkdir(parents=True)
    probe = {"status": "ok", "peak_gib": 75.1, "at": "2026-11-26T06:25:52+00:00"}
    front.write_text(json.dumps({"fingerprint": "another", "probes": {"1": probe}}))
    assert launch.run_cell(spec, out, tmp_path / "a.log", skip_predicted_oom=True).status == "skipped" and not ran
    out.unlink()
    front.write_text(json.dumps({"fingerprint": fingerprint(spec), "probes": {"1": probe}}))
    assert launch.run_cell(spec, out, tmp_path / "b.log", skip_predicted_oom=True).status == "oom" and ran == [1]
    assert "search's probe ran this batch" in (tmp_path / "b.log").read_text()


# The validation table --------------------------------------------------------------------

def test_near_the_limit_the_reserved_peaks_error_and_the_far_side_are_reported():
    """The figures for where a fit is decided come from the pipeline's table: the
    reserved peak's error over the ok GPU records at >= 85% of their GPU (a CPU record, an
    oom and a record with less held are left out), and the ok records predicted not to fit."""
    from llmbench.memory import validate
    from llmbench.report import memory_model

    def row(measured, predicted, fits=True, status="ok", accelerator="cuda", kind="probe"):
        return {"accelerator": accelerator, "capacity_gib": 100.0, "status": status, "kind": kind,
                "measured_reserved_gib": measured, "predicted_reserved_gib": predicted, "predicted_fits": fits}

    df = pd.DataFrame([row(90, 99, fits=False), row(96, 96 * 0.9, kind="cell"), row(86, 86 * 1.02),
                       row(50, 80), row(95, 50, accelerator="cpu"), row(97, 10, status="oom")])
    near, far = validate.near_limit(df).itertuples()
    assert near.rows == 3 and near.probes == 2 and near.above_tight == 1
    assert near.median_abs_error_pct == pytest.approx(10) and near.median_signed_error_pct == pytest.approx(2)
    assert (near.min_reserved_share, near.max_reserved_share) == (0.86, 0.96)
    assert far.rows == 1 and far.min_reserved_share == far.max_reserved_share == 0.9 and far.above_tight == 0
    part = memory_model._near_limit_part(df)
    assert part.frame.iloc[0].tolist() == ["ok, >= 85% reserved", "3", "10.0%", "10.0%", "2.0%", "86%-96%", "1", "2"]
    assert part.frame.iloc[1].tolist() == ["ok, predicted not to fit", "1", "", "", "", "90%-90%", "0", "1"]


def test_deepspeeds_and_accelerates_estimators_are_called_where_they_apply():
    from llmbench.memory import validate

    gpu, host = validate.deepspeed_estimate_gib(w("Z2", gpus=2))
    assert gpu == pytest.approx((2 * N7 + 18 * N7 // 2) / GIB, rel=1e-6)  # DeepSpeed 0.19's 2N + 18N/g
    assert validate.deepspeed_estimate_gib(w("Naive")) is None
    assert validate.deepspeed_estimate_gib(w("L+Z2", adapter=LORA_ALL)) is None
    acc = validate.accelerate_estimate_gib(w("Naive"))
    assert acc == pytest.approx(8 * N7 / GIB, rel=0.01)  # fp32 size x 2: its Adam states, the largest part
    assert validate.accelerate_estimate_gib(w("Z3", gpus=2)) is None


# Replaying the max-batch searches from the predicted largest batch -------------------------

def test_the_search_slope_is_what_a_batch_element_adds():
    from llmbench.memory import batch_slope_gib, start_slope

    naive, flash, rec = (batch_slope_gib(w(t, batch_size=8)) for t in ("Naive", "F", "R"))
    assert 0 < rec < flash < naive  # FlashAttention drops the 5as scores; recomputation keeps 2h a layer
    # 7B at sequence 350: 34h + 5as bytes a token and layer (x the fitted scale), then the
    # logits and the blocks the allocator keeps cached beside them (a search measures reserved)
    per_sample = 32 * 350 * (34 * 4096 + 5 * 32 * 350) * C.BACKENDS["deepspeed"].act_scale
    vocab = (C.BACKENDS["deepspeed"].logits_bytes + C.CACHED_LOGITS_BYTES) * 32000 * 350
    assert naive == pytest.approx((per_sample * (1 + C.CACHED_ACTIVATION_FRACTION) + vocab) / GIB, rel=0.02)
    assert start_slope({}, None) is None


def test_the_replay_oracle_draws_its_line_through_every_probe_that_ran():
    """An unprobed batch below the only fitting probe: its peak comes from the line through
    that probe and the tight one above it (a tight probe ran), not a copy of the fit's."""
    from llmbench.memory.replay import oracle

    answer = oracle({"largest_ok": 25, "probes": [{"batch_size": 25, "status": "ok", "peak_gib": 128.5},
                                                   {"batch_size": 26, "status": "tight", "peak_gib": 132.4}]})
    assert answer(24) == ("ok", pytest.approx(124.6)) and answer(26) == ("tight", 132.4)
    assert answer(27) == ("oom", None)


def test_replay_from_the_exact_frontier_needs_few_probes():
    from llmbench.memory.replay import replay

    probes = [{"batch_size": b, "status": "ok", "peak_gib": 10 + b} for b in (1, 2)]
    summary = {"probes": probes + [{"batch_size": 40, "status": "oom", "peak_gib": None}], "largest_ok": 30,
               "max_batch": 64, "capacity_gib": 80, "fit_limit_gib": 76, "start": 1}
    from_one = replay(summary, None)
    exact = replay(summary, 30)
    assert max(p.batch_size for p in exact if p.status == "ok") == 30 == max(
        p.batch_size for p in from_one if p.status == "ok")
    assert len(exact) < len(from_one)


def test_the_start_hint_of_a_search_spec(mini):
    from llmbench.grid import load

    grid = load(mini, REPO)
    spec = grid.spec(next(c for c in grid.cells if c.technique == "Q"))
    hint = memory.start_hint({**spec, "search": {"max": 64}})
    assert hint == memory.predicted_max_batch(Workload.from_spec(spec), 80, max_batch=64) and 1 < hint <= 64
    cpu = {**spec, "platform": {**spec["platform"], "accelerator": "cpu", "gpu_memory_gib": None}}
    assert memory.start_hint({**cpu, "search": {"max": 64}}) is None
    slope = memory.start_slope(spec, hint)
    assert slope == pytest.approx(memory.batch_slope_gib(Workload.from_spec(spec).with_batch(hint))) and slope > 0


def test_the_paper_check_has_a_row_per_ok_or_oom_cell_of_tables_3_4_9():
    from llmbench.memory import validate

    paths = [REPO / f"config/reference/{t}.csv" for t in validate.PAPER_TABLES]
    df = validate.paper_check(paths, REPO)
    cells = pd.concat([pd.read_csv(p) for p in paths])
    assert len(df) == cells["status"].isin(["ok", "oom"]).sum()
    naive_24gb = df[(df["technique"] == "Naive") & df["platform"].str.startswith("rtx")]
    assert len(naive_24gb) and not naive_24gb["predicted_fits"].any()  # 24 bytes x 6.7e9 > 24 GiB
    assert set(df.loc[df["platform"] == "a800", "gpus"]) == {8}


def test_lora_dropout_copies_by_hand():
    """PEFT's dropout on each target's input keeps its output (2 bytes) and mask (1 byte) a
    token and layer; q, k and v each keep one: 3 * (6h + f) for all seven llama2-7b linears."""
    from llmbench.memory.model import adapter_dropout_bytes

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert adapter_dropout_bytes(L7, {"kind": "lora", "rank": 64, "dropout": 0.05, "target_modules": targets}) \
        == 3 * (6 * 4096 + 11008)
    assert adapter_dropout_bytes(L7, {"kind": "lora", "rank": 64, "dropout": 0.0, "target_modules": targets}) == 0
    assert adapter_dropout_bytes(L7, {"kind": "prompt_tuning", "num_virtual_tokens": 20, "dropout": 0.05}) == 0
    assert adapter_dropout_bytes(L7, None) == 0


def test_fsdp2_states_by_hand():
    """FSDP2 (constants.FSDP2_*): fp32 shards and AdamW's moments through forward/backward (12
    bytes a trained parameter), the fp32 gradients at the step (16 and its 0.17), and over
    several ranks the root's unsharded fp32 gradients (4 a root parameter); the gathered bf16
    copies of every layer without resharding (Z2), of the root and two layers with it (Z3); a
    LoRA cell (no Z: replicated) holds its frozen bf16 base twice."""
    root = 2 * 32000 * 4096 + 4096
    layer = (N7 - root) / 32
    z3 = state_bytes(w("Z3", backend="fsdp2"))
    assert z3[0] == pytest.approx(12 * N7 + 2 * (root + 2 * layer)) and z3[1] == pytest.approx(16.17 * N7)
    z2 = state_bytes(w("Z2", backend="fsdp2"))
    assert z2[0] == pytest.approx(12 * N7 + 2 * N7) and z2[1] == z3[1]
    # sharded over two ranks: and the root's fp32 gradients to reduce (FSDP2_ROOT_REDUCE_BYTES)
    assert state_bytes(w("Z3", gpus=2, backend="fsdp2"))[1] == pytest.approx(16.17 * N7 / 2 + 4 * root)
    assert state_bytes(w("Z2", gpus=2, backend="fsdp2"))[1] == pytest.approx(16.17 * N7 / 2 + 4 * root)
    assert state_bytes(w("Naive", gpus=2, backend="fsdp2"))[1] == pytest.approx(16.17 * N7)  # replicated
    n_lora = adapter_params(L7, LORA_ALL)[0]
    lora = state_bytes(w("L", backend="fsdp2", adapter=LORA_ALL))
    assert lora[0] == pytest.approx(2 * N7 + 2 * (N7 + n_lora) + 12 * n_lora)
    p = predict(w("Z3", backend="fsdp2"))
    assert (p.family, p.phase) == ("fsdp2", "optimizer step")
    # the activations are DeepSpeed's without its ZeRO-3 copies (constants.ZERO3_ACT_SCALE), times
    # FSDP2's own full-parameter scale (FSDP2_FULL_ACT_SCALE), which a LoRA cell does not take;
    # compiled, FSDP2's compiled scale in place of it and of DeepSpeed's (COMPILED_ACT_SCALE),
    # and in FP8 times FP8_ACT_SCALE
    plain = activation_bytes(w("Naive"))[0]
    assert activation_bytes(w("Z3", backend="fsdp2"))[0] == pytest.approx(plain * C.FSDP2_FULL_ACT_SCALE)
    assert activation_bytes(w("Z2", backend="fsdp2"))[0] == pytest.approx(plain * C.FSDP2_FULL_ACT_SCALE)
    flash = activation_bytes(w("F"))[0]
    assert activation_bytes(w("F+C"))[0] == pytest.approx(flash * C.COMPILED_ACT_SCALE)
    assert activation_bytes(w("F+Z3+C", backend="fsdp2"))[0] == pytest.approx(flash * C.FSDP2_COMPILED_ACT_SCALE)
    assert activation_bytes(w("F+Z3+C+FP8", backend="fsdp2"))[0] == pytest.approx(
        flash * C.FSDP2_COMPILED_ACT_SCALE * C.FP8_ACT_SCALE)
    assert activation_bytes(w("L", backend="fsdp2", adapter=LORA_ALL))[0] == pytest.approx(
        activation_bytes(w("L", adapter=LORA_ALL))[0])


def test_fsdp2_qlora_shards_its_nf4_base_and_gathers_it_in_nf4(tmp_path):
    """FSDP2's QLoRA (QL): the NF4 decoder linears and the bf16 rest sharded over the ranks,
    every layer gathered whole through forward/backward without resharding (Z2) in NF4 for the
    linears and bf16 for the rest, two layers and the root with it (Z3); the adapters' 12 bytes
    sharded. A record of the worker that held the whole base on every rank is left out of the
    fit and its scores (fit.holds_whole_nf4_base)."""
    from llmbench.memory.fit import holds_whole_nf4_base
    from llmbench.memory.model import NF4, fsdp2_gathered_bytes

    counts, n_lora = L7.param_counts(), adapter_params(L7, LORA_ALL)[0]
    lin, rest = counts["decoder_linear"], counts["total"] - counts["decoder_linear"]
    z2 = w("QL+F+Z2", gpus=2, backend="fsdp2", adapter=LORA_ALL)
    assert fsdp2_gathered_bytes(z2) == pytest.approx(NF4 * lin + 2 * (rest + n_lora))
    assert state_bytes(z2)[0] == pytest.approx((NF4 * lin + 2 * rest) / 2 + fsdp2_gathered_bytes(z2) + 12 * n_lora / 2)
    z3 = w("QL+F+Z3", gpus=2, backend="fsdp2", adapter=LORA_ALL)
    root = 2 * 32000 * 4096 + 4096
    layer = (counts["total"] + n_lora - root) / 32
    assert fsdp2_gathered_bytes(z3) == pytest.approx(2 * (root + 2 * (layer - lin / 32)) + NF4 * 2 * lin / 32)
    assert predict(z2).family == "fsdp2"
    rec = {"cell": {"backend": "fsdp2"}, "provenance": {"fsdp2_config": {"nf4": {"linears": 224}}}}
    paths = []
    for i, nf4 in enumerate([{"linears": 224}, {"storage_bytes": 4, "local_bytes": 2},
                             {"storage_bytes": 2, "local_bytes": 2}]):
        paths.append(tmp_path / f"{i}.json")
        rec["provenance"]["fsdp2_config"]["nf4"] = nf4
        paths[-1].write_text(json.dumps(rec))
    assert [holds_whole_nf4_base(p) for p in paths] == [True, True, False]
    (tmp_path / "ds.json").write_text(json.dumps({"cell": {"backend": "deepspeed"}, "provenance": {}}))
    assert not holds_whole_nf4_base(tmp_path / "ds.json")


def test_fsdp2_with_cpu_offload_is_not_modelled():
    from llmbench.memory.model import modelled

    assert modelled("fsdp2", "Z3") and not modelled("fsdp2", "Z3+O") and modelled("deepspeed", "Z3+O")
    with pytest.raises(ValueError, match="not modelled"):
        w("Z3+O", backend="fsdp2")


def test_zero3_over_several_ranks_reserves_its_communication_streams_pools():
    """ZeRO-3 over several ranks keeps its all-gather stream's gathered parameters (at most
    stage3_max_live_parameters in bf16) and, with full gradients, its reduce stream's buckets
    reserved in both phases (constants.ZERO3_REDUCE_BUCKETS_IN_FLIGHT); allocated is unchanged.
    Nothing on one rank, under ZeRO-2, or with another backend."""
    from llmbench.memory.model import stream_pool_bytes

    gathered, reduced = 2 * 1e9, 3 * 5e8 * 2
    assert stream_pool_bytes(w("Z3", gpus=2)) == pytest.approx(gathered + reduced)
    assert stream_pool_bytes(w("Z3+O", gpus=4)) == pytest.approx(gathered + reduced)
    assert stream_pool_bytes(w("L+Z3", gpus=2, adapter=LORA_ALL)) == pytest.approx(gathered)
    assert stream_pool_bytes(w("Z3")) == 0 and stream_pool_bytes(w("Z2", gpus=2)) == 0
    assert stream_pool_bytes(w("Z3", gpus=2, backend="fsdp2")) == 0
    p = predict(w("Z3", gpus=2))  # peaks at the step, where ZeRO-3 caches nothing else
    assert p.phase == "optimizer step" and p.terms["cached_step"] == 0
    assert p.reserved_gib - p.gpu_gib == pytest.approx((gathered + reduced) / GIB)
    assert p.gpu_gib == pytest.approx(predict(w("Z3", gpus=2)).terms["states_step"] + p.terms["buffers"]
                                      + p.terms["overhead"])
