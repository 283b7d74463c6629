"""The Megatron-LM backend: grid keys and paths, the worker's registration, and Table II. The
CPU compatibility stubs and real cells: tests/integration/test_megatron_cpu.py."""

import copy
import json
import re

import pandas as pd
import pytest

from llmbench import backends, cells, grid, record
from llmbench.config import ConfigError
from llmbench.record import Metrics, Record
from llmbench.report import paper_tables, render, tidy

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300}
MEGATRON = {"backend": "megatron", "platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"], "batch_sizes": [1]}


def cfg(**block):
    return {"protocol": dict(PROTOCOL), "pretrain": [{**MEGATRON, **block}]}


# --- grid: keys, validation, paths ------------------------------------------------------

@pytest.mark.parametrize("block,needle", [
    (dict(techniques=["Naive", "R+Z2"]), r"pretrain\[0\]\.techniques\[1\]: backend 'megatron' supports the flags F, R; 'R\+Z2' asks for Z2"),
    (dict(techniques=["Q"]), r"pretrain\[0\]\.techniques\[0\]: .* asks for Q"),
    (dict(techniques=["R+C"]), r"pretrain\[0\]\.techniques\[0\]: backend 'megatron' supports the flags F, R; 'R\+C' asks for C"),
    (dict(gpus=2, tensor_parallel=2, pipeline_parallel=2), r"pretrain\[0\]\.tensor_parallel: .*= 4 must divide pretrain\[0\]\.gpus \(2 GPUs\)"),
    (dict(gpus=[1, 3], tensor_parallel=2), r"pretrain\[0\]\.tensor_parallel: .* must divide pretrain\[0\]\.gpus\[0\] \(1 GPUs\)"),
    (dict(gpus=3, pipeline_parallel=2), r"pretrain\[0\]\.pipeline_parallel: tensor_parallel 1 x pipeline_parallel 2 = 2 must divide pretrain\[0\]\.gpus \(3 GPUs\)"),
    (dict(gpus=4, tensor_parallel=4), r"pretrain\[0\]\.tensor_parallel: 4 must divide model 'tiny''s num_attention_heads \(2\)"),
    (dict(gpus=3, pipeline_parallel=3), r"pretrain\[0\]\.pipeline_parallel: 3 must divide model 'tiny''s num_hidden_layers \(2\)"),
    (dict(tensor_parallel=0), r"pretrain\[0\]\.tensor_parallel: 0 is less than the minimum of 1"),
    (dict(distributed_optimizer="yes"), r"pretrain\[0\]\.distributed_optimizer: 'yes' is not of type 'boolean', 'null'"),
    (dict(backend="deepspeed", tensor_parallel=2), r"pretrain\[0\]\.tensor_parallel: only for backend 'megatron' \(this block's backend is 'deepspeed'\)"),
    (dict(backend="deepspeed", distributed_optimizer=False), r"pretrain\[0\]\.distributed_optimizer: only for backend 'megatron'"),
    (dict(backend="megatrom"), r"pretrain\[0\]\.backend: 'megatrom' is not allowed; allowed values: 'deepspeed', 'megatron', 'fsdp2', 'torch', 'inference', 'vllm', None"),
])
def test_bad_megatron_block_names_the_key(block, needle):
    with pytest.raises(ConfigError, match=needle):
        grid.expand(cfg(**block))


def test_megatron_is_a_pretrain_backend_only():
    c = {"protocol": dict(PROTOCOL), "finetune": [{"backend": "megatron", "platforms": ["cpu"], "models": ["tiny"],
                                                   "techniques": ["L"], "batch_sizes": [1]}]}
    with pytest.raises(ConfigError, match=r"finetune\[0\]\.backend: 'megatron' does not run finetune cells; allowed: deepspeed"):
        grid.expand(c)


def test_layout_is_in_the_path_and_paths_stay_unique():
    c = {"protocol": dict(PROTOCOL), "pretrain": [
        {**MEGATRON, "gpus": 2},
        {**MEGATRON, "gpus": 2, "distributed_optimizer": True},
        {**MEGATRON, "gpus": 2, "tensor_parallel": 2},
        {**MEGATRON, "gpus": 2, "pipeline_parallel": 2},
        {**MEGATRON, "backend": "deepspeed", "gpus": 2},
    ]}
    g = grid.expand(c)
    paths = [x.record_path("results") for x in g.cells]
    assert paths == [
        "results/runs/pretrain/cpu/tiny/megatron-tp1pp1/Naive/bs1-g2/record.json",
        "results/runs/pretrain/cpu/tiny/megatron-tp1pp1-distopt/Naive/bs1-g2/record.json",
        "results/runs/pretrain/cpu/tiny/megatron-tp2pp1/Naive/bs1-g2/record.json",
        "results/runs/pretrain/cpu/tiny/megatron-tp1pp2/Naive/bs1-g2/record.json",
        "results/runs/pretrain/cpu/tiny/deepspeed/Naive/bs1-g2/record.json",
    ]
    assert g.cells[2].parallel == {"tensor_parallel": 2, "pipeline_parallel": 1, "data_parallel": 1,
                                   "distributed_optimizer": False}
    assert g.cells[1].parallel["data_parallel"] == 2
    backend_re = re.compile(f"^(?:{cells.WILDCARD_CONSTRAINTS['backend']})$")
    for cell in g.cells:
        assert cell.backend in ("megatron", "deepspeed")
        assert backend_re.match(cell.backend_dir)  # Snakemake's wildcard accepts the path component
        assert g.find(**{k: str(v) for k, v in cell.key.items()}) is cell
        assert cells.cell_from_dict(json.loads(json.dumps(cell.to_dict()))) == cell
    assert not backend_re.match("megatron-tp2")


# The HARD requirement: existing cells' paths and specs are byte-identical to what they
# were before the megatron backend (their records must not rerun). The expected cell dicts
# are literal, written from the code before this change.
BEFORE = {
    "pretrain": ("results/runs/pretrain/cpu/tiny/deepspeed/Z3/bs2-g1/record.json", {
        "stage": "pretrain", "platform": "cpu", "model": "tiny", "backend": "deepspeed", "technique": "Z3",
        "batch_size": 2, "gpus": 1,
        "protocol": {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300, "seed": 0},
        "mem_cap_gib": None, "adapter": None}),
    "finetune": ("results/runs/finetune/cpu/tiny/deepspeed/L/bs1-g1/record.json", {
        "stage": "finetune", "platform": "cpu", "model": "tiny", "backend": "deepspeed", "technique": "L",
        "batch_size": 1, "gpus": 1,
        "protocol": {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300, "seed": 0},
        "mem_cap_gib": None,
        "adapter": {"kind": "lora", "rank": 64, "alpha": 16, "dropout": 0.05,
                    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}}),
    "profile": ("results/runs/profile/cpu/tiny/torch/R/bs2-g1/record.json", {
        "stage": "profile", "platform": "cpu", "model": "tiny", "backend": "torch", "technique": "R",
        "batch_size": 2, "gpus": 1,
        "protocol": {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300, "seed": 0},
        "mem_cap_gib": None, "adapter": None}),
}
OTHER_BLOCKS = {
    "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [2]}],
    "finetune": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["L"], "batch_sizes": [1]}],
    "profile": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["R"], "batch_sizes": [2]}],
}


@pytest.mark.parametrize("with_megatron", [False, True])
def test_existing_cells_keep_their_paths_and_specs(with_megatron):
    c = {"protocol": dict(PROTOCOL), **copy.deepcopy(OTHER_BLOCKS)}
    if with_megatron:
        c["pretrain"].append({**MEGATRON, "gpus": 2, "distributed_optimizer": True})
    g = grid.expand(c)
    for stage, (path, cell_dict) in BEFORE.items():
        cell = next(x for x in g.cells if x.stage == stage and x.backend != "megatron")
        assert cell.record_path("results") == path
        spec = g.spec(cell)
        assert list(spec) == ["cell", "platform", "model"]
        # same keys, same order, same values: the JSON (the params rerun trigger) is unchanged
        assert json.dumps(spec["cell"]) == json.dumps(cell_dict)
        assert "parallel" not in spec["cell"]


def test_shipped_configs_have_megatron_cells(repo):
    tests = grid.load(repo / ".test" / "config.yaml")  # the tests' own grid (the default is the users')
    meg = [c for c in tests.cells if getattr(c, "backend", None) == "megatron"]
    assert {(c.technique, c.batch_size, c.gpus, c.parallel["distributed_optimizer"]) for c in meg} == {
        ("Naive", 1, 1, False), ("Naive", 2, 1, False)}
    paper = grid.load(repo / "config" / "paper.yaml")
    ref = pd.read_csv(repo / "config" / "reference" / "table2.csv")
    have = {(c.platform, c.model, c.batch_size, c.gpus, c.parallel["tensor_parallel"])
            for c in paper.cells if getattr(c, "backend", None) == "megatron"}
    for r in ref[ref.framework == "megatron"].itertuples():
        assert (r.platform, r.model, r.batch_size, 8, 1) in have  # 8 GPUs, tensor parallel 1
    for r in ref[ref.framework == "deepspeed"].itertuples():
        assert any(getattr(c, "backend", None) == "deepspeed" and c.technique == "Naive" and (c.platform, c.model, c.batch_size)
                   == (r.platform, r.model, r.batch_size) for c in paper.cells), r
    h200 = grid.load(repo / "results/reference/2026-11-22-h200x2-table2/config.yaml")
    megatron = [c for c in h200.cells if c.backend == "megatron"]
    assert sorted(c.backend_dir for c in megatron) == ["megatron-tp1pp1-distopt", "megatron-tp2pp1"]
    assert {c.gpus for c in megatron} == {2}
    assert sorted(s.cell.backend_dir for s in h200.searches) == ["megatron-tp1pp1-distopt", "megatron-tp2pp1"]


# --- the worker ------------------------------------------------------------------------


def test_megatron_worker_is_registered():
    import importlib.util

    assert backends.get("megatron").worker == "llmbench.train.megatron_worker"
    assert importlib.util.find_spec(backends.get("megatron").worker) is not None


# --- Table II --------------------------------------------------------------------------

def _records(tmp_path, rows):
    """rows: (backend, layout block keys, platform, batch_size, gpus, status, tokens_per_s)."""
    paths = []
    for backend, keys, plat, bs, gpus, status, tps in rows:
        g = grid.expand({"protocol": {"repeats": 2}, "pretrain": [
            {"backend": backend, "platforms": [plat], "models": ["llama2-7b"], "techniques": ["Naive"],
             "batch_sizes": [bs], "gpus": gpus, **keys}]})
        cell = g.cells[0]
        m = Metrics(tokens_per_s_mean=tps, tokens_per_s_std=1.0, tokens_per_s_runs=(tps - 1, tps + 1),
                    peak_mem_reserved_gib=40.0, peak_mem_allocated_gib=39.0, peak_rss_gib=3.0) if status == "ok" else Metrics()
        path = tmp_path / cell.record_path("results")
        record.write(Record(cell=cell.to_dict(), status=status, metrics=m,
                            reason="" if status == "ok" else "CUDA out of memory"), path)
        paths.append(path)
    return tidy.build(paths)


def test_table2_beside_the_paper(tmp_path):
    t = _records(tmp_path, [
        ("megatron", {"distributed_optimizer": True}, "a800", 1, 8, "ok", 10000.0),
        ("megatron", {"distributed_optimizer": True}, "a800", 16, 8, "ok", 12000.0),
        ("megatron", {"distributed_optimizer": True}, "a800", 32, 8, "oom", None),
        ("megatron", {"tensor_parallel": 2}, "h200", 1, 2, "ok", 3000.0),
        ("deepspeed", {}, "a800", 1, 8, "ok", 7000.0),
        ("deepspeed", {}, "a800", 4, 8, "ok", 20000.0),
    ])
    assert set(t["layout"].dropna()) == {"tp1pp1-distopt", "tp2pp1"}
    long = paper_tables.build_table2(t)
    row = {(r.framework, r.layout, r.platform, r.batch): r for r in long.itertuples()}
    m1 = row[("megatron", "tp1pp1-distopt", "a800", "1")]
    assert m1.tokens_per_s == 10000.0 and m1.paper_tokens_per_s == 10936
    assert m1.ratio_tokens_per_s == pytest.approx(10000.0 / 10936)
    mmax = row[("megatron", "tp1pp1-distopt", "a800", "max")]
    assert mmax.batch_size == 16 and mmax.paper_batch_size == 32  # the largest that ran ok
    dmax = row[("deepspeed", "", "a800", "max")]
    assert dmax.batch_size == 4 and dmax.ratio_tokens_per_s == pytest.approx(20000.0 / 19348)
    h = row[("megatron", "tp2pp1", "h200", "1")]
    assert pd.isna(h.paper_tokens_per_s) and pd.isna(h.ratio_tokens_per_s)  # no paper value on h200
    assert len(long) == 5
    md = render.markdown(paper_tables.table2(long))
    assert md.startswith("### Table II")
    rows = [[c.strip() for c in line.strip()[1:-1].split("|")] for line in md.splitlines() if line.startswith("|")]
    head, body = rows[0], [dict(zip(rows[0], r)) for r in rows[2:]]
    m1_row = next(r for r in body if (r["Framework"], r["Layout"], r["Platform"], r["Batch"])
                  == ("Megatron-LM", "tp1pp1-distopt", "a800", "1"))
    assert m1_row["paper tok/s"] == "10936.0" and m1_row["ratio"] == "0.91"
    # across hardware: Megatron-LM's tokens/s per GPU over DeepSpeed's at the same batch
    assert m1_row["x DeepSpeed"] == f"{10000.0 / 7000.0:.2f}" and m1_row["paper x DeepSpeed"] == f"{10936 / 7488:.2f}"
    assert "MFU %" in head


def test_table2_builds_without_megatron_cells(tmp_path):
    empty = tidy.build([])
    long = paper_tables.build_table2(empty)
    assert len(long) == 4 and long["status"].isna().all()  # the paper's four rows, ours empty
    render.write(paper_tables.table2(long), tmp_path / "t2.csv", tmp_path / "t2.md")
    assert (tmp_path / "t2.md").read_text().count("| Megatron-LM ") == 2
    assert len(pd.read_csv(tmp_path / "t2.csv")) == 4


def test_scaling_series_never_mix_layouts_and_the_figure_tells_backends_apart(tmp_path):
    from llmbench.report import figures, scaling

    t = _records(tmp_path, [
        ("megatron", {}, "a800", 1, 1, "ok", 1000.0),
        ("megatron", {}, "a800", 1, 2, "ok", 1900.0),
        ("megatron", {"distributed_optimizer": True}, "a800", 1, 4, "ok", 3000.0),
        ("deepspeed", {}, "a800", 1, 1, "ok", 900.0),
        ("deepspeed", {}, "a800", 1, 2, "ok", 1700.0),
    ])
    s = scaling.build(t)
    assert list(zip(s.backend, s.layout.fillna(""), s.gpus)) == [
        ("deepspeed", "", 1), ("deepspeed", "", 2), ("megatron", "tp1pp1", 1), ("megatron", "tp1pp1", 2)]
    assert s.efficiency_pct.iloc[3] == pytest.approx(95.0)
    # the figure reads the scaling table's CSV, as the workflow does: one line per backend and layout
    render.write(scaling.table(s), tmp_path / "scaling.csv", tmp_path / "scaling.md")
    chart = figures.scaling_chart({"scaling": render.read_csv(tmp_path / "scaling.csv")}).to_dict()
    cells = {r["cell"] for r in next(iter(chart["datasets"].values()))}
    assert cells == {"llama2-7b Naive bs1 pretrain", "llama2-7b Naive bs1 pretrain megatron-tp1pp1"}
