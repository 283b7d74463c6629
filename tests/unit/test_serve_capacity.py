"""The serving KV-cache model (llmbench.serve.capacity) by hand: the formula on a model whose
numbers are easy, tensor parallelism past the key/value heads, the no-fit case, bad input."""

import pytest

from llmbench.models import ModelSpec
from llmbench.serve import capacity

from conftest import REPO


def test_kv_tokens_are_the_share_left_after_weights_and_overhead_over_a_tokens_kv_bytes():
    m = ModelSpec.load("llama2-7b", REPO)  # 32 layers, 32 KV heads of 128: 512 KiB of K and V a token
    assert capacity.kv_bytes_per_token(m, 1) == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    c = capacity.predict("vllm", m, gpu_gib=100.0, gpus=1, share=0.5, overhead_gib=1.0)
    weights = m.param_counts()["total"] * 2 / 2**30
    assert c.weights_gib == pytest.approx(weights) and c.budget_gib == pytest.approx(50.0 - weights - 1.0)
    assert c.kv_tokens == int(c.budget_gib * 2**30 // (512 * 1024)) and c.resident(640) == c.kv_tokens // 640
    two = capacity.predict("vllm", m, gpu_gib=100.0, gpus=2, share=0.5, overhead_gib=1.0)
    assert two.weights_gib == pytest.approx(weights / 2) and two.kv_bytes_per_token == 256 * 1024


def test_a_gpu_holds_at_least_one_key_value_head_and_a_70b_model_does_not_fit_one_h200():
    m = ModelSpec.load("llama2-70b", REPO)  # 8 KV heads: at 16 GPUs each still holds a whole one
    assert capacity.kv_bytes_per_token(m, 8) == capacity.kv_bytes_per_token(m, 16) == 2 * 80 * 1 * 128 * 2
    one = capacity.predict("vllm", m, gpu_gib=141.0)
    assert not one.fits and one.kv_tokens == 0 and "exceed its share" in one.why_not()
    assert capacity.predict("vllm", m, gpu_gib=141.0, gpus=2).fits


def test_bad_input_names_the_value():
    m = ModelSpec.load("llama2-7b", REPO)
    with pytest.raises(ValueError, match="lightllm"):
        capacity.predict("lightllm", m, 141.0)
    with pytest.raises(ValueError, match="gpus: 0"):
        capacity.predict("vllm", m, 141.0, gpus=0)
