"""FP8 training under FSDP2 on the CPU, with torchao's FP8 arithmetic emulated (torch._scaled_mm
needs FP8 tensor cores): the worker's own build (meta model, conversion, fully_shard, sharded
init) and step (AdamW, then the precomputed FP8 scales) on 2 gloo ranks. What it checks is the
wiring: which linears convert, that tensorwise gathers float8 weights and precomputes their
scales, that losses fall. It says nothing of FP8's speed or of FP8 tensor cores. The grammar and
the grid's refusals: tests/unit/test_fp8.py."""

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

pytest.importorskip("torchao")

STEPS = """
    import json, os, torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}", RANK="{rank}", WORLD_SIZE="2")
    dist.init_process_group("gloo")
    from llmbench import grid
    from llmbench.spec import RunSpec
    from llmbench.train import fsdp2_worker as w
    # what a CPU lacks: FP8 tensor cores; emulated here, never in a cell
    w.check_fp8_device = lambda accelerator, device: None
    convert = w.convert_fp8
    w.convert_fp8 = lambda model, plan_: convert(model, plan_, emulate=True)
    block = dict(backend="fsdp2", platforms=["h200"], models=["tiny"], techniques=["{tech}"], batch_sizes=[1],
                 gpus=[2])
    g = grid.expand(dict(protocol=dict(seq_len=32), pretrain=[block]))
    spec = RunSpec.of(g.spec(g.cells[0]))
    b = w.FSDP2Backend(spec.cell, spec.model, "cpu", torch.device("cpu"), torch.bfloat16, 2)
    b.build()
    torch.manual_seed(0)
    ids = torch.randint(0, spec.model.vocab_size, (2, 32))
    losses = [float(b.step(ids)) for _ in range(4)]
    q = b.model.model.layers[0].self_attn.q_proj
    local = q.weight._local_tensor  # the shard itself (to_local() returns a new view)
    out = dict(losses=losses, weight=type(local).__name__, scale=getattr(local, "_precomputed_scale", None) is not None,
               config=b.config()["fp8"], placements=[str(p) for p in q.weight.placements])
    if dist.get_rank() == 0:
        print("RESULT", json.dumps(out))
    dist.destroy_process_group()
    # as a cell's worker ends (contract.leave): past this point only interpreter teardown is
    # left, where a gloo rank has aborted ("terminate called without an active exception")
    from llmbench.train.contract import leave
    leave(0)
"""


def run_two_ranks(tech: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PYTHONPATH": str(REPO / "workflow" / "scripts"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(STEPS.format(port=port, rank=r, tech=tech))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][0][-1000:] + outs[0][1][-3000:] + outs[1][1][-3000:]
    return json.loads(outs[0][0].split("RESULT", 1)[1])


@pytest.mark.parametrize("tech,weight,scale,recipe", [
    ("FP8+Z3", "WeightWithDynamicFloat8CastTensor", True, "tensorwise"),
    ("FP8R+Z2", "Tensor", False, "rowwise"),
])
def test_emulated_fp8_steps_under_fsdp2_on_two_ranks(tech, weight, scale, recipe):
    """Tensorwise: each shard a float8-casting weight (FSDP2 gathers it in float8) whose scale
    the step precomputes after AdamW; rowwise: plain shards gathered in bf16. Both sharded,
    attention linears converted, the tiny MLP (172 wide) and the LM head left bf16."""
    got = run_two_ranks(tech)
    assert got["weight"] == weight and got["scale"] is scale
    assert got["placements"] == ["S(0)"]
    assert got["config"]["recipe"] == recipe and got["config"]["linears_converted"] == 8
    assert "lm_head" in got["config"]["linears_bf16"] and "model.layers.0.mlp.up_proj" in got["config"]["linears_bf16"]
    losses = got["losses"]
    assert all(0 < v < 20 for v in losses) and losses[-1] < losses[0]
