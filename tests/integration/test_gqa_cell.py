"""Real training cells of the Llama 3.1 shape family on the CPU: tiny-gqa, with
grouped-query attention (4 query heads on 2 key/value heads), a vocabulary of 128256 and
llama3 RoPE scaling, through llmbench.launch under DeepSpeed and Megatron-LM. Its model spec and
builds: tests/unit/test_llama31.py."""

import math

import pytest

from llmbench import grid, launch, record

pytestmark = pytest.mark.integration

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300}


def test_a_gqa_cell_with_the_llama3_vocabulary_trains_under_deepspeed(tmp_path):
    g = grid.expand({"protocol": PROTOCOL, "pretrain": [
        {"platforms": ["cpu"], "models": ["tiny-gqa"], "techniques": ["F"], "batch_sizes": [2]}]})
    (cell,) = g.cells
    spec = g.spec(cell)
    assert spec["model"]["rope_scaling"]["rope_type"] == "llama3"
    rec = launch.run_cell(spec, tmp_path / "record.json", tmp_path / "run.log", threads=2)
    assert rec.status == "ok", (rec.reason, rec.log_tail[-3000:])
    assert record.read(tmp_path / "record.json").status == "ok"
    m, total = rec.metrics, g.models["tiny-gqa"].param_counts()["total"]
    # the model the worker built is the spec's: k and v projections kv wide, both vocabulary matrices
    assert m.total_params == m.trainable_params == total
    assert m.tokens_per_s_mean > 0 and m.step_time_s_mean > 0
    assert m.global_batch_tokens == 2 * 32
    # random weights over 128256 ids: the loss starts near ln(128256), not ln(32000)
    assert math.log(32000) < m.loss_last < math.log(128256) + 1.0
    assert rec.provenance["ds_config"]["zero_optimization"]["stage"] == 0 and m.attention == "sdpa[default]"


def test_a_gqa_cell_with_llama3_rope_scaling_trains_under_megatron(tmp_path):
    # megatron-core takes the scaling as rope_scaling=True and its factor (train/megatron_worker.py)
    g = grid.expand({"protocol": PROTOCOL, "pretrain": [
        {"backend": "megatron", "platforms": ["cpu"], "models": ["tiny-gqa"], "techniques": ["Naive"],
         "batch_sizes": [1]}]})
    (cell,) = g.cells
    rec = launch.run_cell(g.spec(cell), tmp_path / "record.json", tmp_path / "run.log", threads=1)
    assert rec.status == "ok", (rec.reason, rec.log_tail[-3000:])
    assert rec.metrics.total_params == g.models["tiny-gqa"].param_counts()["total"]
    assert math.log(32000) < rec.metrics.loss_last < math.log(128256) + 1.0
