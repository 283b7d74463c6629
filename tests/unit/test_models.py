import pytest
import torch

from llmbench.models import ModelSpec, flops_per_token
from llmbench.train.build import build_llama, enable_recompute


def test_param_counts_match_transformers():
    spec = ModelSpec.load("tiny")
    model = build_llama(spec, "sdpa", torch.float32, "cpu")
    assert spec.param_counts()["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,billions", [("llama2-7b", 6.738), ("llama2-13b", 13.016), ("llama2-70b", 68.977)])
def test_llama2_sizes(name, billions):
    # published sizes of the released checkpoints
    assert ModelSpec.load(name).param_counts()["total"] / 1e9 == pytest.approx(billions, abs=0.002)


def test_flops_per_token_palm_formula():
    spec = ModelSpec.load("llama2-7b")
    n = spec.param_counts()["non_embedding"]
    assert flops_per_token(spec, 350) == 6 * n + 12 * 32 * 4096 * 350


def test_frozen_base_counts_no_weight_gradients():
    spec = ModelSpec.load("llama2-7b")
    n = spec.param_counts()["non_embedding"]
    assert flops_per_token(spec, 350) - flops_per_token(spec, 350, frozen_base=True) == 2 * n


def test_enable_recompute_on_this_transformers():
    model = build_llama(ModelSpec.load("tiny"), "sdpa", torch.float32, "cpu")
    enable_recompute(model)
    # transformers 5.2x's name, else the old one (5.17 on the GPU machines)
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing


def test_enable_recompute_with_only_the_old_name():
    # transformers before 5.2x (the GPU machines have 5.17): only gradient_checkpointing_enable
    calls = []

    class Old:
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(gradient_checkpointing_kwargs)

    enable_recompute(Old())
    assert calls == [{"use_reentrant": False}]


def _reference(spec: ModelSpec, dtype=torch.float32):
    """The model as transformers' own constructor builds it (on the CPU)."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM._from_config(spec.hf_config(attn_implementation="sdpa"), dtype=dtype)


@pytest.mark.parametrize("tied", [False, True])
def test_the_meta_device_build_is_whole_and_initialised_as_transformers_does(tied):
    from dataclasses import replace

    spec = replace(ModelSpec.load("tiny"), tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = build_llama(spec, "sdpa", torch.float32, "cpu")
    ref = _reference(spec)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    # RoPE's buffers are computed, not drawn: they must equal the constructor's
    for name, buf in ref.named_buffers():
        assert torch.equal(dict(model.named_buffers())[name], buf), name
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.std().item() == pytest.approx(0.02, rel=0.1) and q.mean().abs().item() < 2e-3
    assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    ids = torch.randint(0, spec.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss == pytest.approx(ref(input_ids=ids, labels=ids).loss.item(), rel=0.05)  # ~ln(vocab) both


def test_a_4bit_build_quantises_every_decoder_linear_as_it_builds():
    import bitsandbytes as bnb

    from llmbench.train.build import DECODER_LINEARS

    spec = ModelSpec.load("tiny")
    model = build_llama(spec, "sdpa", torch.float32, "cpu", quant4=True)
    linears = [getattr(getattr(layer, part), name) for layer in model.model.layers
               for part in ("self_attn", "mlp") for name in DECODER_LINEARS if hasattr(getattr(layer, part), name)]
    assert len(linears) == len(DECODER_LINEARS) * spec.num_hidden_layers
    assert all(isinstance(m, bnb.nn.Linear4bit) for m in linears)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert isinstance(model.lm_head, torch.nn.Linear) and not isinstance(model.lm_head, bnb.nn.Linear4bit)
