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
