"""Llama 3.1 (config/models/llama3.1-*.yaml) and its shape family at toy size (tiny-gqa):
grouped-query attention, a vocabulary of 128256 and llama3 RoPE scaling, through the model
spec, its builds (training, the serving model directory, Megatron-LM's arguments), the grid,
the memory model and the throughput model's FLOPs and interval notes. A real DeepSpeed cell
of tiny-gqa: tests/integration/test_gqa_cell.py."""

import json
from dataclasses import replace

import pytest
import torch

from llmbench import grid, techniques
from llmbench.config import ConfigError
from llmbench.memory.constants import ZERO3_STEP_GRAD_COPY_BYTES, ZERO3_SUB_GROUP_SIZE
from llmbench.memory.model import Workload, adapter_params, model_states_gib, predict
from llmbench.models import ModelSpec, flops_per_token
from llmbench.throughput import TrainCell, interval

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 350, "timeout_s": 600}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("name,billions", [("llama3.1-8b", 8.03), ("llama3.1-70b", 70.6)])
def test_llama31_sizes_are_the_released_ones(name, billions):
    # Meta's model cards: 8.03B and 70.6B parameters
    assert ModelSpec.load(name).param_counts()["total"] / 1e9 == pytest.approx(billions, rel=0.005)


def test_the_parameter_count_has_kv_wide_key_value_projections_and_the_whole_vocabulary():
    m = ModelSpec.load("llama3.1-8b")
    d, f, L, V, kv = 4096, 14336, 32, 128256, 8 * 128
    layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    counts = m.param_counts()
    assert counts["total"] == L * layer + d + 2 * V * d
    assert counts["non_embedding"] == counts["total"] - V * d  # lm_head counts, the lookup does not
    # the PaLM FLOPs: 6N with that N (k, v projections kv wide), and attention by query heads
    assert flops_per_token(m, 350) == 6 * counts["non_embedding"] + 12 * L * d * 350


@pytest.mark.parametrize("name", ["llama3.1-8b", "llama3.1-70b", "tiny-gqa"])
def test_llama31_files_carry_the_llama3_rope_scaling_and_round_trip(name):
    m = ModelSpec.load(name)
    assert m.rope_scaling == LLAMA3_ROPE and m.rope_theta == 500000.0 and m.vocab_size == 128256
    assert m.num_key_value_heads < m.num_attention_heads and not m.tie_word_embeddings
    assert ModelSpec.from_dict(m.to_dict()) == m and m.to_dict()["rope_scaling"] == LLAMA3_ROPE
    assert hash(ModelSpec.from_dict(m.to_dict())) == hash(m) != hash(replace(m, rope_scaling=None))
    assert m.family == "llama+rope-llama3"


def test_a_model_without_rope_scaling_reads_as_before_the_key_existed():
    m = ModelSpec.load("llama2-70b")
    assert m.rope_scaling is None and "rope_scaling" not in m.to_dict() and m.family == "llama"
    assert m.hf_config().rope_parameters == {"rope_theta": 10000.0, "rope_type": "default"}


@pytest.mark.parametrize("change,key", [
    ({"rope_type": "yarn"}, "rope_scaling.rope_type"),
    ({"factor": 0.5}, "rope_scaling.factor"),
    ({"high_freq_factor": 1.0}, "rope_scaling.high_freq_factor"),
    ({"original_max_position_embeddings": 131072}, "rope_scaling.original_max_position_embeddings"),
    ({"extra": 1}, "extra"),
])
def test_bad_rope_scaling_is_refused_naming_the_key(change, key):
    data = ModelSpec.load("tiny-gqa").to_dict()
    data["rope_scaling"] = {**data["rope_scaling"], **change}
    with pytest.raises(ValueError, match=key):
        ModelSpec.from_dict(data)


def test_a_rope_scaling_without_its_factors_is_refused():
    data = ModelSpec.load("tiny-gqa").to_dict()
    data["rope_scaling"] = {"rope_type": "llama3"}
    with pytest.raises(ValueError, match="factor"):
        ModelSpec.from_dict(data)


def test_the_training_build_applies_the_llama3_frequencies_as_transformers_does():
    from transformers import LlamaForCausalLM

    from llmbench.train.build import build_llama

    spec = ModelSpec.load("tiny-gqa")
    model = build_llama(spec, "sdpa", torch.float32, "cpu")
    assert spec.param_counts()["total"] == sum(p.numel() for p in model.parameters())
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (2 * 16, 64)  # 2 KV heads of 16
    ref = LlamaForCausalLM._from_config(spec.hf_config(attn_implementation="sdpa"), dtype=torch.float32)
    assert torch.equal(model.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
    plain = build_llama(replace(spec, rope_scaling=None), "sdpa", torch.float32, "cpu")
    # llama3 scaling divides the low frequencies by the factor and keeps the high ones
    ratio = plain.model.rotary_emb.inv_freq / model.model.rotary_emb.inv_freq
    assert ratio[0].item() == pytest.approx(1.0) and ratio[-1].item() == pytest.approx(8.0)


def test_the_serving_model_directory_carries_the_rope_scaling_and_a_tokenizer_of_the_vocabulary(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from llmbench.serve import model_dir

    out = model_dir.build(ModelSpec.load("tiny-gqa"), tmp_path / "m", weights="dummy")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"] == LLAMA3_ROPE and cfg["rope_theta"] == 500000.0  # the keys older engines read
    assert cfg["num_key_value_heads"] == 2 and cfg["vocab_size"] == 128256
    assert AutoConfig.from_pretrained(out).rope_parameters == {**LLAMA3_ROPE, "rope_theta": 500000.0}
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 128256 and tok("t3 t128255").input_ids == [3, 128255]


def test_megatron_takes_the_llama3_factor_and_refuses_constants_it_fixes():
    from llmbench.train.megatron_worker import rope_scaling_kwargs

    spec = ModelSpec.load("tiny-gqa")
    assert rope_scaling_kwargs(spec) == {"rope_scaling": True, "rope_scaling_factor": 8.0}
    assert rope_scaling_kwargs(ModelSpec.load("tiny")) == {}
    odd = replace(spec, rope_scaling={**LLAMA3_ROPE, "high_freq_factor": 2.0})
    with pytest.raises(ValueError, match="rope_scaling.*high_freq_factor"):
        rope_scaling_kwargs(odd)


def test_llama31_cells_expand_for_every_stage():
    g = grid.expand({
        "protocol": PROTOCOL,
        "pretrain": [{"platforms": ["h200"], "models": ["llama3.1-8b", "llama3.1-70b"], "techniques": ["F+Z3"],
                      "batch_sizes": [1]}],
        "finetune": [{"platforms": ["h200"], "models": ["llama3.1-8b"], "techniques": ["L", "QL+F"],
                      "batch_sizes": [1]}],
        "profile": [{"platforms": ["h200"], "models": ["llama3.1-8b"], "techniques": ["Naive"], "batch_sizes": [1]}],
        "serve": [{"platforms": ["h200"], "models": ["llama3.1-8b"], "engines": ["vllm"],
                   "loads": {"burst": {"num_requests": 10, "input_len": 512, "output_len": 16}}}],
    })
    stages = {(c.stage, c.model) for c in g.cells}
    assert stages == {("pretrain", "llama3.1-8b"), ("pretrain", "llama3.1-70b"), ("finetune", "llama3.1-8b"),
                      ("profile", "llama3.1-8b"), ("serve", "llama3.1-8b")}
    for c in g.cells:
        assert g.spec(c)["model"]["rope_scaling"] == LLAMA3_ROPE
    # LoRA's default targets are the same linear names (k_proj, v_proj kv wide)
    lora = next(c for c in g.cells if c.stage == "finetune" and c.technique == "L")
    assert {"k_proj", "v_proj"} <= set(lora.adapter["target_modules"])


def test_an_unknown_model_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="llama3.1-9b"):
        grid.expand({"protocol": PROTOCOL, "pretrain": [{"platforms": ["h200"], "models": ["llama3.1-9b"], "techniques": ["Z3"],
                                   "batch_sizes": [1]}]})


def test_memory_model_states_and_logits_of_llama31_8b():
    m = ModelSpec.load("llama3.1-8b")
    n = m.param_counts()["total"]
    # ZeRO-3 on one GPU: 16 bytes a parameter through forward/backward
    w = Workload(model=m, technique="F+Z3", batch_size=4, seq_len=350)
    p = predict(w)
    assert p.terms["states_fb"] == pytest.approx(16 * n / 2**30)
    # the logits grow with the vocabulary: 128256 / 32000 times Llama 2 7B's at the same tokens
    p7 = predict(Workload(model=ModelSpec.load("llama2-7b"), technique="F+Z3", batch_size=4, seq_len=350))
    assert p.terms["logits"] / p7.terms["logits"] == pytest.approx(128256 / 32000)
    assert p.terms["activations"] == pytest.approx(p7.terms["activations"])  # same width and depth
    # 70B over eight ZeRO-3 ranks: 16 bytes a parameter's shard, and at the step one optimizer
    # sub-group's gradient copy
    n70 = ModelSpec.load("llama3.1-70b").param_counts()["total"]
    step = 16 * n70 / 8 + ZERO3_STEP_GRAD_COPY_BYTES * min(ZERO3_SUB_GROUP_SIZE, n70 / 8)
    assert model_states_gib(ModelSpec.load("llama3.1-70b"), "Z3", gpus=8) == pytest.approx(step / 2**30)


def test_lora_on_gqa_key_value_projections_is_kv_wide():
    m = ModelSpec.load("llama3.1-8b")
    r = 8
    trainable, _ = adapter_params(m, {"kind": "lora", "rank": r, "target_modules": ["q_proj", "k_proj", "v_proj"]})
    assert trainable == 32 * r * ((4096 + 4096) + 2 * (4096 + 1024))


def test_throughput_interval_flags_what_the_calibration_has_not_seen():
    def notes(model):
        c = TrainCell(stage="pretrain", platform="h200", model=model,
                      technique=techniques.parse("F+Z3"), batch_size=4, gpus=1, seq_len=350)
        return interval.predict(c)

    l8 = ModelSpec.load("llama3.1-8b")
    assert notes(l8).outside == ()  # a llama3.1-8b record calibrates: its vocabulary and family are in range
    wider = notes(replace(l8, vocab_size=256000))  # a vocabulary no record has
    assert wider.outside == ("vocab_size",) and any("vocabulary 256000" in n for n in wider.notes)
    # a family the records lack: Llama 3.1's RoPE scaling against records of Llama 2 alone
    cell = TrainCell(stage="pretrain", platform="h200", model=l8, technique=techniques.parse("F+Z3"),
                     batch_size=4, gpus=1, seq_len=350)
    covered = {**interval.load()["covered"], "architecture": ["llama"]}
    assert "llama+rope-llama3" in interval.outside(cell, covered)["architecture"]
    assert wider.width > notes(ModelSpec.load("llama2-7b")).width and notes(ModelSpec.load("llama2-7b")).outside == ()
    # a model larger than any record's (llama3.1-70b at 96 layers: about 84B)
    deeper = replace(ModelSpec.load("llama3.1-70b"), num_hidden_layers=96)
    assert "params" in notes(deeper).outside


def test_the_advisor_predicts_llama31_through_its_cached_throughput_call():
    # predicted_tokens is memoised on its arguments, the model spec among them: it must hash
    from llmbench.report import advice

    p = advice.predicted_tokens("h200", ModelSpec.load("llama3.1-70b"), "finetune", "L", 1, 4)
    assert p.value > 0
    deeper = replace(ModelSpec.load("llama3.1-70b"), num_hidden_layers=96)  # beyond the records' sizes
    p = advice.predicted_tokens("h200", deeper, "finetune", "L", 1, 4)
    assert p.value > 0 and any("param" in n for n in p.notes)
