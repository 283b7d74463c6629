"""The FSDP2 backend on the CPU, for real: cells of each technique mapping that runs there
(1 and 2 gloo ranks; pre-training and LoRA) through llmbench.launch on the tiny model, and
what each mapping does to a layer's parameters after forward. The flag mapping and the
grid's rejections: tests/unit/test_fsdp2.py."""

import json
import subprocess
import sys
import textwrap

import pytest

from llmbench import grid, launch, nf4, record

from conftest import REPO

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300}


def expand(stage: str, technique: str, gpus: int, model: str = "tiny"):
    block = {"backend": "fsdp2", "platforms": ["cpu"], "models": [model], "techniques": [technique],
             "batch_sizes": [1], "gpus": gpus}
    return grid.expand({"protocol": dict(PROTOCOL), stage: [block]})


def run(stage, technique, gpus, tmp_path, dtype=None, model="tiny"):
    g = expand(stage, technique, gpus, model)
    cell = g.cells[0]
    spec = g.spec(cell)
    if dtype is not None:
        spec["platform"]["compute_dtype"] = dtype
    rec = launch.run_cell(spec, tmp_path / "record.json", tmp_path / "run.log", threads=gpus)
    assert rec.status == "ok", (rec.reason, rec.log_tail[-3000:])
    assert record.read(tmp_path / "record.json").status == "ok"
    return g, cell, rec


@pytest.mark.parametrize("technique,gpus,sharding,attention", [
    ("Z3", 1, "full", "sdpa[math]"),
    ("F+R+Z3", 1, "full", "sdpa[default]"),
    ("Z2", 1, "no_reshard", "sdpa[math]"),
    ("Naive", 1, "replicate", "sdpa[math]"),
    ("Z3", 2, "full", "sdpa[math]"),
    ("Z2", 2, "no_reshard", "sdpa[math]"),
    ("Naive", 2, "replicate", "sdpa[math]"),
    ("R+Z3+O", 2, "full", "sdpa[math]"),
    ("F+Z2+O", 2, "no_reshard", "sdpa[default]"),
])
def test_real_fsdp2_pretraining_cell(tmp_path, technique, gpus, sharding, attention):
    g, cell, rec = run("pretrain", technique, gpus, tmp_path)
    m, total = rec.metrics, g.models["tiny"].param_counts()["total"]
    assert m.tokens_per_s_mean > 0 and m.step_time_s_mean > 0 and m.peak_rss_gib > 0
    assert m.global_batch_tokens == cell.batch_size * cell.protocol.seq_len * gpus
    assert m.total_params == m.trainable_params == total and m.frozen_params_unchanged is None
    # the ranks' AdamW updates each weight once where FSDP2 shards, once per rank where it replicates
    assert m.optimizer_param_numel == total * (gpus if sharding == "replicate" else 1)
    assert m.attention == attention and m.compute_dtype == "fp32" and 0 < m.loss_last < 20
    fc = rec.provenance["fsdp2_config"]
    tech = cell.tech
    assert (fc["sharding"], fc["cpu_offload"], fc["recompute"]) == (sharding, tech.offload, tech.recompute)
    assert fc["reshard_after_forward"] is (sharding == "full")
    assert fc["mesh_shape"] == ([gpus, 1] if sharding == "replicate" else [gpus])
    assert fc["process_group"] == "gloo" and fc["mixed_precision"] == "fp32 throughout"
    assert fc["trained_dtypes"] == ["float32"] and fc["frozen_dtypes"] == []
    assert fc["framework"] == f"torch {rec.provenance['versions']['torch']}"


def test_z3_and_z2_compute_the_same_step_and_compile_runs_with_z3(tmp_path):
    """Resharding changes when parameters are gathered, not what a step computes; C with Z3 (which
    DeepSpeed cannot run) compiles each layer into one graph, FSDP2's hooks left outside it."""
    _, _, z3 = run("pretrain", "Z3", 2, tmp_path / "z3")
    _, _, z2 = run("pretrain", "Z2", 2, tmp_path / "z2")
    assert z2.metrics.loss_last == pytest.approx(z3.metrics.loss_last, rel=1e-5)
    _, _, c = run("pretrain", "Z3+C", 2, tmp_path / "c")
    assert {k: c.summary[k] for k in ("compiled_layers", "compile_unique_graphs", "compile_graph_breaks")} == \
        {"compiled_layers": 2, "compile_unique_graphs": 1, "compile_graph_breaks": 0}
    assert c.metrics.loss_last == pytest.approx(z3.metrics.loss_last, rel=1e-3)


@pytest.mark.parametrize("technique,gpus", [("L+Z3", 1), ("L+Z3", 2), ("LFA+R+Z2", 2), ("L", 2)])
def test_real_fsdp2_lora_cell(tmp_path, technique, gpus):
    g, cell, rec = run("finetune", technique, gpus, tmp_path)
    m, total = rec.metrics, g.models["tiny"].param_counts()["total"]
    assert m.tokens_per_s_mean > 0 and m.total_params == total
    assert 0 < m.trainable_params < total / 10  # the adapters only
    assert m.frozen_params_unchanged is True  # on every rank, its shards of the base
    sharded = not cell.tech.zero_stage == 0
    assert m.optimizer_param_numel == m.trainable_params * (1 if sharded else gpus)
    assert m.trainable_desc.startswith("LoRA-FA: B matrices only" if "LFA" in technique else "LoRA: adapters A and B")


@pytest.mark.parametrize("technique,gpus,dtype", [("QL+Z3", 2, None), ("QL+R+Z2", 2, "bfloat16")])
def test_real_fsdp2_qlora_cell(tmp_path, technique, gpus, dtype):
    """QLoRA on torchao's NF4 base (tiny-wide: wide enough for NF4's blocks split over two
    ranks): the decoder's 14 linears held as NF4 and sharded (Z2, Z3), the adapters trained
    in fp32, the 4-bit base unchanged on every rank. One rank in the shard group is refused
    (tests/unit/test_fsdp2.py)."""
    g, cell, rec = run("finetune", technique, gpus, tmp_path, dtype=dtype, model="tiny-wide")
    m, counts = rec.metrics, g.models["tiny-wide"].param_counts()
    assert m.tokens_per_s_mean > 0 and m.total_params == counts["total"] and 0 < m.loss_last < 20
    spec = g.models["tiny-wide"]
    lora = cell.adapter["rank"] * sum(o + i for o, i in nf4.linear_shapes(spec).values()) * spec.num_hidden_layers
    assert m.trainable_params == lora and m.frozen_params_unchanged is True
    assert m.trainable_desc.startswith("QLoRA: adapters A and B") and m.trainable_desc.endswith("4-bit NF4 base (frozen)")
    fc = rec.provenance["fsdp2_config"]
    assert fc["nf4"]["linears"] == 14 and fc["nf4"]["block_size"] == 64 and fc["nf4"]["scaler_block_size"] == 256
    # each rank holds only its rows of the base: NF4's chunks are views of the whole weight, so
    # a shard kept as a view would reference twice the bytes it holds over two ranks
    linear = sum(o * i for o, i in nf4.linear_shapes(spec).values()) * spec.num_hidden_layers
    assert fc["nf4"]["storage_bytes"] == fc["nf4"]["local_bytes"]
    assert linear / gpus / 2 <= fc["nf4"]["local_bytes"] < linear / gpus * 0.6  # 4 bits + scalers a weight
    assert fc["trained_dtypes"] == ["float32"]
    assert fc["frozen_dtypes"] == sorted(["nf4", "bfloat16" if dtype else "float32"])
    assert "NF4" in fc["description"] and fc["recompute"] == cell.tech.recompute
    assert fc["sharding"] == ("full" if cell.tech.zero_stage == 3 else "no_reshard")
    assert m.optimizer_param_numel == m.trainable_params


@pytest.mark.parametrize("stage,technique", [("pretrain", "Z3"), ("finetune", "L+Z2")])
def test_bf16_compute_keeps_fp32_master_weights(tmp_path, stage, technique):
    """The paper's bf16 (a GPU platform's compute dtype) on 2 CPU ranks: AdamW updates fp32
    shards (pre-training: every weight; LoRA: the adapters, beside a frozen bf16 base)."""
    _, _, rec = run(stage, technique, 2, tmp_path, dtype="bfloat16")
    fc = rec.provenance["fsdp2_config"]
    assert rec.metrics.compute_dtype == "bf16" and fc["trained_dtypes"] == ["float32"]
    assert fc["frozen_dtypes"] == ([] if stage == "pretrain" else ["bfloat16"])
    assert fc["mixed_precision"].startswith("param_dtype bf16")
    assert 0 < rec.metrics.loss_last < 20
    if stage == "finetune":
        assert rec.metrics.frozen_params_unchanged is True


AFTER_FORWARD = """
    import json, os, torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    from llmbench import grid
    from llmbench.spec import RunSpec
    from llmbench.train.fsdp2_worker import FSDP2Backend
    out = {{}}
    for tech in ("Z3", "Z2", "Naive"):
        block = dict(backend="fsdp2", platforms=["cpu"], models=["tiny"], techniques=[tech], batch_sizes=[1])
        g = grid.expand(dict(protocol=dict(seq_len=16), pretrain=[block]))
        spec = RunSpec.of(g.spec(g.cells[0]))
        b = FSDP2Backend(spec.cell, spec.model, "cpu", torch.device("cpu"), torch.float32, 1)
        b.build()
        ids = torch.randint(0, spec.model.vocab_size, (1, 16))
        with b.attn_ctx():
            loss = b.model(input_ids=ids, labels=ids).loss
            layer = b.model.model.layers[0].mlp.up_proj.weight  # between forward and backward
            loss.backward()
        master = next(iter(b.optimizer.param_groups[0]["params"]))
        out[tech] = dict(after_forward=type(layer).__name__, master=type(master).__name__,
                         placements=[str(p) for p in master.placements])
    print("RESULT", json.dumps(out))
    dist.destroy_process_group()
"""


def test_what_each_mapping_leaves_registered_after_forward():
    """fully_shard registers a layer's sharded parameters (DTensors) after forward where it
    reshards (Z3), its gathered ones (plain Parameters) where not (Z2, Naive); AdamW updates
    DTensors, sharded (Z3, Z2) or replicated (Naive)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PYTHONPATH": str(REPO / "workflow" / "scripts"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(AFTER_FORWARD.format(port=port))],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.split("RESULT", 1)[1])
    assert {t: v["after_forward"] for t, v in got.items()} == {"Z3": "DTensor", "Z2": "Parameter", "Naive": "Parameter"}
    assert {t: v["master"] for t, v in got.items()} == {"Z3": "DTensor", "Z2": "DTensor", "Naive": "DTensor"}
    assert [got[t]["placements"] for t in ("Z3", "Z2", "Naive")] == [["S(0)"], ["S(0)"], ["R", "S(0)"]]
