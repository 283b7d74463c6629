import copy
from dataclasses import asdict
import shutil

import pytest
import yaml

from llmbench import grid
from llmbench.cells import ServeCell
from llmbench.config import ConfigError
from llmbench.protocol import Protocol

BASE = {
    "protocol": {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 16, "timeout_s": 60},
    "pretrain": [
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive", "R+Z3+F", "Q"], "batch_sizes": [1, 2]},
    ],
}


def cfg(**block):
    c = copy.deepcopy(BASE)
    c["pretrain"][0].update(block)
    return c


def test_expansion_is_the_cartesian_product():
    g = grid.expand(cfg())
    assert len(g.cells) == 3 * 2
    names = {(c.technique, c.batch_size) for c in g.cells}
    assert ("F+R+Z3", 2) in names  # canonicalised
    assert all(c.gpus == 1 for c in g.cells)  # cpu platform: gpus_per_node 1


def test_paths_are_a_function_of_the_key():
    g = grid.expand(cfg())
    paths = [c.record_path("results") for c in g.cells]
    assert len(set(paths)) == len(paths)
    c = g.find(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed",
               technique="F+R+Z3", batch_size="2", gpus="1")
    assert c.record_path("results") == "results/runs/pretrain/cpu/tiny/deepspeed/F+R+Z3/bs2-g1/record.json"
    assert g.by_path()[c.record_path("results")] is c


def test_defaults_filled_and_protocol_override():
    c = cfg(protocol={"repeats": 3})
    g = grid.expand(c)
    assert g.cells[0].protocol == Protocol(warmup_steps=1, measured_steps=2, repeats=3, seq_len=16, timeout_s=60, seed=0)
    assert g.results_dir == "results"
    assert g.cells[0].backend == "deepspeed"


def test_batch_sizes_per_technique():
    g = grid.expand(cfg(techniques=["Z3", "R"], batch_sizes={"Z3": [4], "R": [8, 16]}))
    assert sorted((c.technique, c.batch_size) for c in g.cells) == [("R", 8), ("R", 16), ("Z3", 4)]


def test_batch_sizes_map_must_cover_every_technique():
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.batch_sizes: no batch sizes for technique\(s\) R"):
        grid.expand(cfg(techniques=["Z3", "R"], batch_sizes={"Z3": [4]}))


def test_gpus_default_from_platform_and_override():
    g = grid.expand(cfg(platforms=["a800"]))
    assert {c.gpus for c in g.cells} == {8}
    g = grid.expand(cfg(platforms=["a800"], gpus=2))
    assert {c.gpus for c in g.cells} == {2}


def test_only_platforms_filters():
    c = cfg(platforms=["cpu", "a800"])
    c["only_platforms"] = ["a800"]
    assert {x.platform for x in grid.expand(c).cells} == {"a800"}


@pytest.mark.parametrize(
    "block,needle",
    [
        (dict(techniques=["Naive", "Z4"]), r"pretrain\[0\]\.techniques\[1\]: unknown flag 'Z4'.*flags are F, R, Z2, Z3, O, Q"),
        (dict(techniques=["Z2+Z3"]), r"pretrain\[0\]\.techniques\[0\]: .*both Z2 and Z3"),
        (dict(techniques=["O"]), r"techniques\[0\]: .*O \(offload\) needs Z2 or Z3"),
        (dict(models=["llama9"]), r"pretrain\[0\]\.models\[0\]: unknown model 'llama9'; allowed: llama2-13b, llama2-70b, llama2-7b, llama3.1-70b, llama3.1-8b, tiny, tiny-gqa, tiny-wide"),
        (dict(platforms=["tpu"]), r"pretrain\[0\]\.platforms\[0\]: unknown platform 'tpu'; allowed: a800, cpu, h100"),
        (dict(batch_sizes=[1, 0]), r"pretrain\[0\]\.batch_sizes\[1\]: 0 is less than the minimum of 1"),
        (dict(batch_sizes=["two"]), r"pretrain\[0\]\.batch_sizes\[0\]: 'two' is not of type 'integer'"),
        (dict(batch_size=[1]), r"pretrain\[0\]: unknown key\(s\) 'batch_size'; allowed keys: .*batch_sizes"),
        (dict(backend="colossal"), r"pretrain\[0\]\.backend: 'colossal' is not allowed; allowed values: 'deepspeed'"),
    ],
)
def test_bad_input_names_the_key(block, needle):
    with pytest.raises(ConfigError, match=needle):
        grid.expand(cfg(**block))


def test_bad_protocol_value():
    c = cfg()
    c["protocol"]["repeats"] = 0
    with pytest.raises(ConfigError, match=r"protocol\.repeats: 0 is less than the minimum of 1"):
        grid.expand(c)


def test_conflicting_duplicate_cells_rejected():
    c = cfg(techniques=["Naive"], batch_sizes=[1])
    c["pretrain"].append({**c["pretrain"][0], "mem_cap_gib": 1.0})
    with pytest.raises(ConfigError, match="defined twice with different settings"):
        grid.expand(c)


def test_identical_duplicate_cells_merge():
    c = cfg(techniques=["Naive"], batch_sizes=[1])
    c["pretrain"].append(copy.deepcopy(c["pretrain"][0]))
    assert len(grid.expand(c).cells) == 1


def test_malformed_platform_file_names_file(tmp_path, repo):
    shutil.copytree(repo / "config", tmp_path / "config")
    (tmp_path / "config" / "platforms" / "cpu.yaml").write_text("name: cpu\n  bad: [indent\n")
    with pytest.raises(ConfigError, match=r"platforms/cpu\.yaml: malformed YAML"):
        grid.expand(cfg(), root=tmp_path)


def test_platform_file_schema_error_names_key(tmp_path, repo):
    shutil.copytree(repo / "config", tmp_path / "config")
    path = tmp_path / "config" / "platforms" / "cpu.yaml"
    data = yaml.safe_load(path.read_text())
    data["accelerator"] = "tpu"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"cpu\.yaml: invalid platform config:\n  accelerator: 'tpu' is not allowed; allowed values: 'cuda', 'cpu'"):
        grid.expand(cfg(), root=tmp_path)


def test_a_fork_server_that_is_not_a_boolean_is_rejected_by_name(tmp_path, repo):
    shutil.copytree(repo / "config", tmp_path / "config")
    path = tmp_path / "config" / "platforms" / "h100.yaml"
    data = yaml.safe_load(path.read_text())
    data["fork_server"] = "yes"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"h100\.yaml: invalid platform config:\n  fork_server: 'yes' is not of type 'boolean'"):
        grid.expand(cfg(platforms=["h100"]), root=tmp_path)


def test_shipped_configs_expand(repo):
    # the embedded default is the users' to edit: it expands (its cells: tests/smoke's run)
    assert grid.load(repo / "config" / "config.yaml").cells
    tests = grid.load(repo / ".test" / "config.yaml")  # the tests' own grid
    train = [c for c in tests.cells if c.stage in ("pretrain", "finetune")]
    assert {c.technique for c in train} == {"Naive", "Z3+O", "Q", "F+R", "L", "QL"}
    assert any(c.mem_cap_gib for c in train) and tests.searches  # the forced-OOM cell, a search
    assert {c.engine for c in tests.cells if c.stage == "serve"} == {"vllm"}
    assert {c.bench for c in tests.cells if c.stage == "micro"} == {"gemm"}
    assert tests.results_dir == ".test/results"  # apart from the default's results/
    paper = grid.load(repo / "config" / "paper.yaml")
    assert {c.platform for c in paper.cells} == {"a800", "rtx4090", "rtx3090", "rtx3090-nonvlink"}
    assert {c.model for c in paper.cells if c.stage != "micro"} == {"llama2-7b", "llama2-13b", "llama2-70b"}
    bs1 = {(c.platform, c.model, c.technique) for c in paper.cells if c.stage == "pretrain" and c.batch_size == 1}
    assert len(bs1) == 4 * 3 * 22  # every method row of Table III, on every platform and model
    assert {c.gpus for c in paper.cells if c.stage not in ("micro", "profile") and getattr(c, "nodes", 1) == 1} == {1, 2, 4, 8}  # Fig. 4
    # beyond one node: Table III's llama2-70b rows and Fig. 4's 16-GPU point, 2 nodes of 8 A800s
    over = {(c.model, c.technique, c.gpus) for c in paper.cells if getattr(c, "nodes", 1) > 1}
    assert {(c.platform, c.nodes) for c in paper.cells if getattr(c, "nodes", 1) > 1} == {("a800", 2)}
    assert len(over) == 22 + 1 and ("llama2-7b", "Q", 16) in over
    serve = {(c.platform, c.model, c.engine) for c in paper.cells if c.stage == "serve"}
    assert len(serve) == 3 * 3 * 3  # Figs. 6-10: three engines on three platforms, three models


def test_paper_grid_covers_the_reference_tables(repo):
    import pandas as pd

    from llmbench.techniques import canonical

    paper = grid.load(repo / "config" / "paper.yaml")
    cells = {(c.platform, c.model, c.technique, c.batch_size) for c in paper.cells if c.stage == "pretrain"}
    for table in ("table3", "table4"):
        ref = pd.read_csv(repo / "config" / "reference" / f"{table}.csv")
        for r in ref[ref.status == "ok"].itertuples():
            assert (r.platform, r.model, canonical(r.method), int(r.batch_size)) in cells, r


def test_every_shipped_platform_and_model_validates(repo):
    from llmbench.config import available
    from llmbench.models import ModelSpec
    from llmbench.platforms import Platform

    for name in available("platform"):
        p = Platform.load(name)
        assert p.accelerator == "cpu" or (p.peak_bf16_tflops and p.peak_source)
    for name in available("model"):
        ModelSpec.load(name)
    # the configs a user picks: the default, the paper's grid, the combined view, the recipes
    # (the committed runs' own configs: tests/calibration/test_reference_folders.py)
    configs = sorted((repo / "config").glob("*.yaml")) + sorted((repo / "config" / "recipes").glob("*.yaml"))
    assert len(configs) > 3
    for cfg in configs:
        g = grid.load(cfg)
        # a config of other folders' records (the combined view) has no cells of its own
        assert g.cells or g.searches or yaml.safe_load(cfg.read_text()).get("evidence_dirs"), cfg


FT = {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["L", "QL+R", "PT"], "batch_sizes": [1]}


def ft(**block):
    return {"protocol": {"repeats": 1}, "finetune": [{**copy.deepcopy(FT), **block}]}


def test_finetune_cells_carry_adapter_settings():
    g = grid.expand(ft(lora={"rank": 8}))
    by = {c.technique: c for c in g.cells}
    assert by["L"].stage == "finetune"
    assert by["L"].record_path() == "results/runs/finetune/cpu/tiny/deepspeed/L/bs1-g1/record.json"
    assert by["QL+R"].adapter == {"kind": "lora", "rank": 8, "alpha": 16, "dropout": 0.05,
                                  "target_modules": list(grid.LLAMA_LINEARS)}
    assert by["PT"].adapter == {"kind": "prompt_tuning", "num_virtual_tokens": 20}


def test_lora_rank_change_changes_the_spec_not_the_path():
    a, b = grid.expand(ft(lora={"rank": 8})), grid.expand(ft(lora={"rank": 16}))
    assert [c.record_path() for c in a.cells] == [c.record_path() for c in b.cells]
    assert a.cells[0] != b.cells[0]


@pytest.mark.parametrize(
    "block,needle",
    [
        (dict(lora={"target_modules": ["q_proj", "c_attn"]}),
         r"finetune\[0\]\.lora\.target_modules\[1\]: 'c_attn' is not a linear layer of a Llama decoder; allowed: q_proj"),
        (dict(lora={"rank": 0}), r"finetune\[0\]\.lora\.rank: 0 is less than the minimum of 1"),
        (dict(lora={"rank": -4}), r"finetune\[0\]\.lora\.rank: -4 is less than the minimum of 1"),
        (dict(lora={"ranks": 8}), r"finetune\[0\]\.lora: unknown key\(s\) 'ranks'"),
        (dict(techniques=["Z3"]), r"finetune\[0\]\.techniques\[0\]: 'Z3' names no fine-tuning method; start it with one of L, QL"),
    ],
)
def test_bad_finetune_input(block, needle):
    with pytest.raises(ConfigError, match=needle):
        grid.expand(ft(**block))


def test_fine_tuning_method_in_a_pretrain_block_rejected():
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.techniques\[0\]: 'QL' is a fine-tuning method"):
        grid.expand(cfg(techniques=["QL"]))


def test_4bit_on_a_platform_without_bitsandbytes(tmp_path, repo):
    shutil.copytree(repo / "config", tmp_path / "config")
    path = tmp_path / "config" / "platforms" / "cpu.yaml"
    path.write_text(path.read_text() + "supports_4bit: false\n")
    with pytest.raises(ConfigError, match=r"finetune\[0\]: technique 'QL\+R' needs bitsandbytes 4-bit, which platform 'cpu' does not support"):
        grid.expand(ft(), root=tmp_path)
    assert grid.expand(ft(techniques=["L"]), root=tmp_path).cells  # LoRA alone is fine


def test_paper_grid_has_every_table9_row(repo):
    import pandas as pd

    from llmbench.techniques import canonical

    paper = grid.load(repo / "config" / "paper.yaml")
    cells = {(c.platform, c.model, c.technique) for c in paper.cells if c.stage == "finetune"}
    ref = pd.read_csv(repo / "config" / "reference" / "table9.csv")
    assert {(r.platform, r.model, canonical(r.method)) for r in ref.itertuples()} <= cells
    assert all(c.adapter["rank"] == 64 for c in paper.cells if c.stage == "finetune")


def test_spec_leaves_out_where_jobs_are_queued():
    g = grid.expand(cfg(platforms=["a800"]))
    spec = g.spec(g.cells[0])
    assert "slurm" not in spec["platform"] and spec["platform"]["peak_bf16_tflops"] == 312


def test_gpu_count_axis():
    g = grid.expand(cfg(techniques=["Q"], batch_sizes=[2], gpus=[1, 2]))
    assert [(c.technique, c.gpus) for c in g.cells] == [("Q", 1), ("Q", 2)]
    assert g.cells[1].record_path() == "results/runs/pretrain/cpu/tiny/deepspeed/Q/bs2-g2/record.json"
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.gpus\[1\]: 16 GPUs, but platform 'a800' has 8 per node"):
        grid.expand(cfg(platforms=["a800"], gpus=[8, 16]))
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.gpus"):
        grid.expand(cfg(gpus=[0]))


def test_max_batch_search_expands_per_technique_and_finds_its_measured_cell():
    g = grid.expand(cfg(max_batch={"max": 64}, mem_cap_gib=2.0))
    assert len(g.cells) == 6 and len(g.searches) == 3  # the listed sizes still run
    s = g.find_search(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed", technique="Q", gpus="1")
    assert s.record_path() == "results/runs/search/pretrain/cpu/tiny/deepspeed/Q-g1"
    assert s.frontier_path() == "results/frontier/pretrain/cpu/tiny/deepspeed/Q-g1.json"
    assert s.probe_protocol.repeats == 1 and s.probe_protocol.seq_len == 16 and s.probe_protocol.measured_steps == 2
    # a batch the search found is an ordinary cell with the block's full protocol and cap
    cell = g.find(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed", technique="Q",
                  batch_size="37", gpus="1")
    assert cell.batch_size == 37 and cell.protocol == g.cells[0].protocol and cell.mem_cap_gib == 2.0
    assert g.spec(s)["search"] == {"start": 1, "max": 64, "headroom": 0.05, "probe_protocol": asdict(s.probe_protocol)}
    with pytest.raises(KeyError):
        g.find(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed", technique="R", batch_size="37",
               gpus="1")


def test_search_only_block_and_its_errors():
    c = cfg(max_batch={"start": 2})
    del c["pretrain"][0]["batch_sizes"]
    g = grid.expand(c)
    assert g.cells == () and [s.start for s in g.searches] == [2, 2, 2]
    del c["pretrain"][0]["max_batch"]
    with pytest.raises(ConfigError, match=r"pretrain\[0\]: give batch_sizes, max_batch"):
        grid.expand(c)
    with pytest.raises(ConfigError, match=r"pretrain\[0\].max_batch.start: 9 is above max_batch.max 4"):
        grid.expand(cfg(max_batch={"start": 9, "max": 4}))
    with pytest.raises(ConfigError, match=r"pretrain\[0\].max_batch.max: 0 is less than the minimum of 1"):
        grid.expand(cfg(max_batch={"max": 0}))
    with pytest.raises(ConfigError, match=r"pretrain\[0\].batch_sizes\[0\]: -1 is less than the minimum of 1"):
        grid.expand(cfg(batch_sizes=[-1]))
    bad = copy.deepcopy(BASE)
    bad["profile"] = [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["R"], "max_batch": {}}]
    with pytest.raises(ConfigError, match=r"profile\[0\].max_batch: the search runs pretrain and finetune cells"):
        grid.expand(bad)


def test_a_megatron_search_is_addressed_by_its_layout():
    c = cfg(backend="megatron", techniques=["Naive"], max_batch={"max": 8}, gpus=2, distributed_optimizer=True)
    g = grid.expand(c)
    s = g.searches[0]
    assert s.record_path() == "results/runs/search/pretrain/cpu/tiny/megatron-tp1pp1-distopt/Naive-g2"
    found = g.find(stage="pretrain", platform="cpu", model="tiny", backend="megatron-tp1pp1-distopt", technique="Naive",
                   batch_size="5", gpus="2")
    assert found.parallel == s.cell.parallel and found.batch_size == 5
    assert g.find_search(**s.key) is s


def test_the_8_gpu_config_covers_the_papers_8_gpu_layout_in_paired_sets(repo):
    """The multi-GPU runs, declared for an 8 x H200 node: Tables III and IV (every method of
    llama2-7b and -13b at batch 1 and searched), Fig. 4 on 1-8 GPUs, Table II's Megatron-LM
    layouts, the 70B rows of Table IX, collectives over 8 ranks with and without P2P, 7B and
    70B served with tensor parallel 8; every measured cell that a table compares in a paired
    set (the searches' cells are found, not planned)."""
    g = grid.load(repo / "config" / "recipes" / "h200x8-node.yaml")
    paper = grid.load(repo / "config" / "paper.yaml")
    methods = {c.technique for c in paper.cells if c.stage == "pretrain" and c.backend == "deepspeed" and c.batch_size == 1}
    table3 = {(c.model, c.technique) for c in g.cells if c.stage == "pretrain" and c.gpus == 8 and c.batch_size == 1}
    assert table3 == {(m, t) for m in ("llama2-7b", "llama2-13b") for t in methods}
    assert {(s.cell.model, s.cell.technique) for s in g.searches} == table3
    assert {c.gpus for c in g.cells if c.stage == "pretrain" and c.technique == "Q" and c.batch_size == 2} == {1, 2, 4, 8}
    assert sorted(c.technique for c in g.cells if c.stage == "finetune") == sorted(
        ["L+F+R+Z3", "L+F+R+Z3+O", "QL+F+R", "QL+R", "QL+F", "L+Z3", "L+F+Z3", "L+R+Z3"])
    assert sorted((c.case, c.gpus) for c in g.cells if c.stage == "micro") == [("nop2p", 8), ("p2p", 8)]
    assert sorted(c.parallel["tensor_parallel"] for c in g.cells if getattr(c, "backend", "") == "megatron") == [1, 2, 4, 8]
    served = {(c.model, c.engine, c.gpus) for c in g.cells if c.stage == "serve"}
    assert served == {(m, e, 8) for m in ("llama2-7b", "llama2-70b") for e in ("vllm", "sglang")}
    in_sets = {p for s in g.sets for p in s.record_paths(g.results_dir)}
    compared = [c for c in g.cells if c.stage in ("pretrain", "finetune", "serve")]
    assert compared and all(c.record_path(g.results_dir) in in_sets for c in compared)


def test_each_platform_and_model_file_is_read_once_per_grid(repo, monkeypatch):
    """The paper grid read ~600 platform and model files (setdefault evaluated its default
    every time), each validated against a schema parsed anew: `snakemake -n` took 17 s."""
    from llmbench.models import ModelSpec
    from llmbench.platforms import Platform

    calls: list[str] = []
    for cls in (Platform, ModelSpec):
        real = cls.load.__func__
        monkeypatch.setattr(cls, "load", classmethod(lambda c, name, root=repo, _r=real: (calls.append(name), _r(c, name, root))[1]))
    g = grid.load(repo / "config" / "paper.yaml")
    assert sorted(calls) == sorted(set(calls)) == sorted({*g.platforms, *g.models})


def test_find_by_fields_agrees_with_every_cells_own_key(repo):
    g = grid.load(repo / "config" / "paper.yaml")
    for c in g.cells:
        assert g.find(**c.key) is c
    serve = next(c for c in g.cells if isinstance(c, ServeCell))
    assert g.find(**{k: v for k, v in serve.key.items() if k != "stage"}) is serve
    with pytest.raises(KeyError):
        g.find(platform="h100", model="llama2-70b", backend="deepspeed", technique="Naive", batch_size=1, gpus=1,
               stage="pretrain")


def test_a_sequence_past_the_models_positions_is_rejected_naming_the_key():
    c = cfg()
    c["protocol"]["seq_len"] = 10**9
    with pytest.raises(ConfigError, match=r"^protocol\.seq_len: 1000000000 is past the positions of model 'tiny'"):
        grid.expand(c)
    c = cfg(protocol={"seq_len": 5000})  # a block's own protocol is named as the block's key
    with pytest.raises(ConfigError, match=r"^pretrain\[0\]\.protocol\.seq_len: 5000 is past"):
        grid.expand(c)


def test_a_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path):
    from llmbench.config import load_yaml

    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"results_dir: r\x89\xff\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not UTF-8 text \(byte 0x89 at offset 14\)"):
        load_yaml(bad)


def test_a_grid_is_immutable_once_built():
    import dataclasses

    c = cfg(max_batch={"start": 2})
    g = grid.expand(c)
    assert isinstance(g.cells, tuple) and isinstance(g.searches, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.cells = ()
    with pytest.raises(TypeError):
        g.platforms["other"] = g.platforms["cpu"]
    with pytest.raises(TypeError):
        g.models["other"] = g.models["tiny"]
    with pytest.raises(TypeError):
        g.engine_python["vllm"] = "python"
    with pytest.raises(AttributeError):
        g.cells.append(g.cells[0])
    # what the rules ask of it still works
    assert g.find(**g.cells[0].key) == g.cells[0]
    assert g.find_search(**g.searches[0].key) == g.searches[0]


def test_one_deduplication_for_every_stage():
    """A path two blocks define alike is one cell; defined differently, an error naming the
    second block: training, serving and micro cells alike (llmbench.grid.base.Builder)."""
    train = {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [1]}
    serve = {"platforms": ["cpu"], "models": ["tiny"], "engines": ["transformers"],
             "loads": {"burst": {"mode": "burst", "num_requests": 2, "input_len": 8, "output_len": 4}}}
    micro = {"platforms": ["cpu"], "memcpy": {"min_bytes": 1024, "max_bytes": 4096}}
    g = grid.expand({"protocol": {}, "pretrain": [train, train], "serve": [serve, serve], "micro": [micro, micro]})
    assert sorted(c.stage for c in g.cells) == ["micro", "pretrain", "serve"]
    for stage, block, edit in [("pretrain", train, {"mem_cap_gib": 1.0}), ("serve", serve, {"timeout_s": 70}),
                               ("micro", micro, {"iters": 3})]:
        with pytest.raises(ConfigError, match=rf"^{stage}\[1\]: cell .* is defined twice with different settings"):
            grid.expand({"protocol": {}, stage: [block, {**block, **edit}]})


def test_every_recipe_has_its_row_in_the_config_readme(repo):
    """config/README.md's recipe table is where a user picks a recipe: each file has a row."""
    text = (repo / "config" / "README.md").read_text()
    missing = [p.name for p in sorted((repo / "config" / "recipes").glob("*.yaml")) if f"| `{p.name}` |" not in text]
    assert missing == []
