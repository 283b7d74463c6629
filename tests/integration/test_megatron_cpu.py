"""The Megatron-LM backend on the CPU, for real: megatron-core through the CPU compatibility
stubs in a fresh interpreter, and real cells (1 and 2 gloo ranks, TP2, PP2, the distributed
optimizer) through llmbench.launch on the tiny model. Grid keys and Table II:
tests/unit/test_megatron.py."""

import subprocess
import sys
import textwrap

import pytest

from llmbench import grid, launch, record

from conftest import REPO

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300}
MEGATRON = {"backend": "megatron", "platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"], "batch_sizes": [1]}


def cfg(**block):
    return {"protocol": dict(PROTOCOL), "pretrain": [{**MEGATRON, **block}]}


# --- the CPU compatibility module --------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (megatron's global state and the stubs stay there)."""
    env_path = str(REPO / "workflow" / "scripts")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": env_path, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_compat_patches_nothing_unless_the_accelerator_is_cpu():
    out = _python("""
        import torch
        from megatron.core.tensor_parallel import random as r
        from llmbench.train import megatron_cpu_compat as cc
        before = (torch.cuda.current_device, r._get_cuda_rng_state, r._set_cuda_rng_state,
                  r.CudaRNGStatesTracker.add, r.CheckpointFunction.backward)
        assert cc.apply("cuda") is None and not cc.applied()
        assert before == (torch.cuda.current_device, r._get_cuda_rng_state, r._set_cuda_rng_state,
                          r.CudaRNGStatesTracker.add, r.CheckpointFunction.backward)
        mode = cc.apply("cpu")
        assert isinstance(mode, cc.CudaToCpuMode) and cc.applied()
        after = (torch.cuda.current_device, r._get_cuda_rng_state, r._set_cuda_rng_state,
                 r.CudaRNGStatesTracker.add, r.CheckpointFunction.backward)
        assert all(a is not b for a, b in zip(before, after)), "every stub is installed"
        with mode:
            t = torch.zeros(2, device="cuda")
            assert t.device.type == "cpu" and t.cuda() is t
            assert torch.ones(1, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
            assert torch.ones(1).to(torch.cuda.current_device()).device.type == "cpu"
        assert torch.ones(1).type() == "torch.FloatTensor"  # outside the mode: untouched
        print("OK")
    """)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


TINY_STEP = """
    import os, sys
    import torch, torch.nn.functional as F, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str({port}), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    from llmbench.train import megatron_cpu_compat as cc
    import contextlib
    mode = cc.apply("cpu") if {use_compat} else contextlib.nullcontext()
    with mode:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
        from megatron.core.transformer.transformer_config import TransformerConfig
        ps.initialize_model_parallel(1, 1)
        torch.manual_seed(0)
        model_parallel_cuda_manual_seed(0)
        cfg = TransformerConfig(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
            num_query_groups=2, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
            add_bias_linear=False, bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
            use_cpu_initialization=True, bias_activation_fusion=False, masked_softmax_fusion=False,
            bias_dropout_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=128, max_sequence_length=64, position_embedding_type="rope",
            share_embeddings_and_output_weights=False)
        model = DistributedDataParallel(cfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True,
            use_distributed_optimizer=True), model)
        cfg.finalize_model_grads_func = finalize_model_grads
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True,
            params_dtype=torch.bfloat16, use_distributed_optimizer=True), [model])
        ids = torch.randint(0, 128, (2, 16))
        pos = torch.arange(16).unsqueeze(0).expand(2, -1)
        before = [p.detach().clone() for p in model.parameters()]
        def step(_it, m):
            return m(ids, pos, None, labels=ids), lambda t: (t.float().mean(), dict(loss=t.float().mean().detach()))
        losses = []
        for _ in range(3):
            model.zero_grad_buffer(); opt.zero_grad()
            out = get_forward_backward_func()(forward_step_func=step, data_iterator=None, model=[model],
                num_microbatches=1, seq_length=16, micro_batch_size=2, forward_only=False)
            ok, grad_norm, _ = opt.step()
            assert ok and grad_norm > 0
            losses.append(out[0]["loss"].item())
        assert model.module.decoder.layers[0].mlp.linear_fc1.weight.dtype == torch.bfloat16  # bf16 params
        assert opt.chained_optimizers[0].optimizer.param_groups[0]["params"][0].dtype == torch.float32  # fp32 main
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters())), "the step moved the weights"
        assert losses[-1] < losses[0], losses
    dist.destroy_process_group()
    print("OK", losses)
"""


def test_tiny_gptmodel_trains_on_cpu_through_the_stubs(tmp_path):
    """Forward (full recomputation), backward and a step of Megatron's bf16 distributed
    optimizer on a CPU, with the stubs; the same script without them fails on CUDA."""
    port = launch_free_port()
    out = _python(TINY_STEP.format(port=port, use_compat=True))
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
    assert "CPU RNG state changed" not in out.stderr  # stub 6
    without = _python(TINY_STEP.format(port=launch_free_port(), use_compat=False))
    assert without.returncode != 0
    assert "Torch not compiled with CUDA enabled" in without.stderr


def launch_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- real cells through the launcher ---------------------------------------------------

@pytest.mark.parametrize("technique,gpus,layout,attention", [
    ("F+R", 1, {}, "sdpa[default]"),
    ("Naive", 2, {"distributed_optimizer": True}, "megatron[unfused]"),
    ("Naive", 2, {"tensor_parallel": 2}, "megatron[unfused]"),
    ("Naive", 2, {"pipeline_parallel": 2}, "megatron[unfused]"),
])
def test_real_megatron_cell(tmp_path, technique, gpus, layout, attention):
    g = grid.expand(cfg(techniques=[technique], gpus=gpus, **layout))
    cell = g.cells[0]
    spec = g.spec(cell)
    rec = launch.run_cell(spec, tmp_path / "record.json", tmp_path / "run.log", threads=gpus)
    assert rec.status == "ok", (rec.reason, rec.log_tail[-3000:])
    m = rec.metrics
    total = g.models["tiny"].param_counts()["total"]
    assert m.tokens_per_s_mean > 0 and m.peak_rss_gib > 0 and m.step_time_s_mean > 0
    assert m.total_params == total and m.trainable_params == total  # TP-replicated norms counted once
    assert m.attention == attention
    dp = cell.parallel["data_parallel"]
    assert m.global_batch_tokens == cell.batch_size * cell.protocol.seq_len * dp
    # each data-parallel rank updates a full copy, unless the distributed optimizer shards it;
    # every tensor-parallel rank updates its own copy of the (replicated) RMSNorm weights
    spec_ = g.models["tiny"]
    norms = (2 * spec_.num_hidden_layers + 1) * spec_.hidden_size
    copies = 1 if cell.parallel["distributed_optimizer"] else dp
    assert m.optimizer_param_numel == total * copies + (cell.parallel["tensor_parallel"] - 1) * norms
    assert 0 < m.loss_last < 20
    mc = rec.provenance["megatron_config"]
    assert mc["cpu_compat"] is True and mc["process_group"] == "gloo"
    assert mc["recompute"] == ({"recompute_granularity": "full", "recompute_method": "uniform",
                                "recompute_num_layers": 1} if "R" in technique else None)
    assert (mc["tensor_parallel"], mc["distributed_optimizer"]) == (cell.parallel["tensor_parallel"],
                                                                   cell.parallel["distributed_optimizer"])
    assert "AdamW" in mc["optimizer"]
    assert record.read(tmp_path / "record.json").status == "ok"
