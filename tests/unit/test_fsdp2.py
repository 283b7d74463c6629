"""The FSDP2 backend's flag mapping (llmbench.train.fsdp2_worker.plan), what the grid accepts
and rejects for it, its paths, and the models that do not predict it. Real cells on the CPU:
tests/integration/test_fsdp2_cpu.py."""

import pytest
import yaml

from llmbench import backends, cells, estimate, grid, memory, nf4, offline
from llmbench.config import ConfigError
from llmbench.models import ModelSpec
from llmbench.techniques import parse
from llmbench.train.fsdp2_worker import plan, process_group_backend

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300}


def cfg(stage="pretrain", **block):
    base = {"backend": "fsdp2", "platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [1]}
    return {"protocol": dict(PROTOCOL), stage: [{**base, **block}]}


@pytest.mark.parametrize("technique,ranks,sharding,mesh,reshard", [
    ("Z3", 4, "full", (4,), True),
    ("F+R+Z3+O", 2, "full", (2,), True),
    ("Z2", 4, "no_reshard", (4,), False),
    ("Z2+O", 1, "no_reshard", (1,), False),
    ("Naive", 4, "replicate", (4, 1), False),
    ("F+R", 1, "replicate", (1, 1), False),
])
def test_z3_reshards_z2_keeps_gathered_parameters_and_naive_replicates(technique, ranks, sharding, mesh, reshard):
    tech = parse(technique)
    p = plan(tech, ranks)
    assert (p.sharding, p.mesh_shape, p.reshard_after_forward) == (sharding, mesh, reshard)
    assert (p.cpu_offload, p.recompute, p.compiled) == (tech.offload, tech.recompute, tech.compiled)
    assert ("host" in p.description) == tech.offload


@pytest.mark.parametrize("accelerator,technique,backend", [
    ("cpu", "Z3+O", "gloo"),
    ("cuda", "F+Z3", "nccl"),
    # the host's gradient shards: clip_grad_norm_ all-reduces their norms on the CPU
    ("cuda", "F+Z3+O", "cuda:nccl,cpu:gloo"),
])
def test_offload_on_gpus_gives_the_host_tensors_a_process_group_backend(accelerator, technique, backend):
    assert process_group_backend(accelerator, parse(technique)) == backend


def test_the_z2_mapping_says_how_it_differs_from_zero_2():
    assert "ZeRO-2 keeps full bf16 parameters on every rank" in plan(parse("Z2"), 2).description
    assert "ZeRO-3's counterpart" in plan(parse("Z3"), 2).description
    with pytest.raises(ValueError, match="4-bit"):
        plan(parse("Q+Z3"), 2)
    ql = plan(parse("QL+Z3"), 2)
    assert ql.nf4 and "frozen 4-bit base (torchao NF4 tensors" in ql.description and not plan(parse("L+Z3"), 2).nf4


@pytest.mark.parametrize("stage,techniques", [
    ("pretrain", ["Naive", "F", "R+Z2", "F+R+Z3+O", "Z2+O", "Z3+C", "F+R+Z2+C"]),
    ("finetune", ["L", "L+F+R+Z3", "LFA+Z2+O", "L+Z3+C"]),
])
def test_the_grid_accepts_every_flag_fsdp2_runs(stage, techniques):
    g = grid.expand(cfg(stage, techniques=techniques, gpus=[1, 2]))
    assert {c.backend for c in g.cells} == {"fsdp2"}
    assert len(g.cells) == 2 * len(techniques)
    c = next(c for c in g.cells if c.technique == parse(techniques[-1]).name and c.gpus == 2)
    path = c.record_path()
    assert f"/fsdp2/{c.technique}/bs1-g2/record.json" in path
    parsed = cells.parse(path)
    assert parsed is not None and parsed.wildcards["backend"] == "fsdp2"


@pytest.mark.parametrize("stage,technique,needle", [
    ("pretrain", "Q+Z3", r"pretrain\[0\]\.techniques\[0\]: backend 'fsdp2' runs Q only under a fine-tuning method "
                         r"\('Q\+Z3' has none\): its 4-bit base is torchao's NF4 tensor, frozen"),
    ("finetune", "QL+Z3+O", r"backend 'fsdp2' does not run Q with O \('QL\+Z3\+O'\): torchao's NF4 tensor"),
    ("finetune", "DORA+Z3", r"finetune\[0\]\.techniques\[0\]: backend 'fsdp2' runs the fine-tuning methods L, LFA, QL; "
                            r"'DORA\+Z3' asks for DORA \(.*DoRA's magnitude"),
    ("finetune", "PT", r"runs the fine-tuning methods L, LFA, QL; 'PT' asks for PT"),
    ("pretrain", "O", r"O \(offload\) needs Z2 or Z3"),
])
def test_the_grid_rejects_what_fsdp2_cannot_honour_before_any_job(stage, technique, needle):
    with pytest.raises(ConfigError, match=needle):
        grid.expand(cfg(stage, techniques=[technique]))


@pytest.mark.parametrize("model,technique,gpus,needle", [
    ("tiny-wide", "QL+Z3", 1, r"tiny-wide/fsdp2/QL\+Z3 on 1 GPU\(s\): QLoRA under FSDP2 needs its NF4 base sharded over two or more ranks .*"
                              r"pytorch/pytorch#197999"),
    ("tiny-wide", "QL", 2, r"tiny-wide/fsdp2/QL on 2 GPU\(s\): QLoRA under FSDP2 needs its NF4 base sharded over two or more ranks"),
    ("tiny", "QL+Z3", 2, r"tiny/fsdp2/QL\+Z3 on 2 GPU\(s\): .*model 'tiny''s q_proj \(64 x 64\) needs its rows a multiple of 2 and its 4096 elements a "
                         r"multiple of 64 x 256 x 2 = 32768"),
])
def test_the_grid_refuses_an_nf4_base_fsdp2_cannot_shard_before_any_job(model, technique, gpus, needle):
    block = {"backend": "fsdp2", "platforms": ["cpu"], "models": [model], "techniques": [technique],
             "batch_sizes": [1], "gpus": gpus}
    with pytest.raises(ConfigError, match=r"finetune\[0\]: cell finetune/cpu/" + needle):
        grid.expand({"protocol": dict(PROTOCOL), "finetune": [block]})


def test_an_nf4_base_shards_where_its_blocks_split_evenly():
    for name in ("llama2-7b", "llama2-13b", "llama2-70b", "llama3.1-8b", "llama3.1-70b"):
        for shards in (2, 4, 8):
            assert nf4.unshardable(ModelSpec.load(name), shards) is None, (name, shards)
    g = grid.expand(cfg("finetune", models=["tiny-wide"], techniques=["QL+Z3", "QL+F+R+Z2"], gpus=[2]))
    assert {c.technique for c in g.cells} == {"QL+Z3", "QL+F+R+Z2"}


def test_compile_with_z3_is_deepspeeds_limit_not_the_grammars():
    assert parse("C+Z3").name == "Z3+C"
    assert backends.get("fsdp2").rejected_combination(("Z3", "C")) is None
    block = {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3+C"], "batch_sizes": [1]}
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.techniques\[0\]: backend 'deepspeed' does not run Z3 with C "
                                          r"\('Z3\+C'\): ZeRO-3's parameter hooks"):
        grid.expand({"protocol": dict(PROTOCOL), "pretrain": [block]})
    grid.expand({"protocol": dict(PROTOCOL), "pretrain": [{**block, "techniques": ["Z2+C"]}]})


def test_fsdp2_cells_are_not_the_papers_methods():
    # Tables III, IV and IX compare DeepSpeed's methods; an FSDP2 Z3 row is not one of them
    assert "fsdp2" not in backends.method_backends()
    assert backends.for_stage("pretrain")[0] == backends.for_stage("finetune")[0] == "deepspeed"


def test_the_memory_and_throughput_models_predict_fsdp2_but_its_offload(tmp_path):
    config = cfg(platforms=["h200"], models=["llama2-7b"], techniques=["Z3", "F+R+Z3+O"], gpus=1,
                 max_batch={"start": 1, "max": 8})
    config["pretrain"].append({**config["pretrain"][0], "backend": "deepspeed"})
    g = grid.expand(config)
    mine = [c for c in g.cells if c.backend == "fsdp2"]
    verdicts = {c.technique: memory.check(g.spec(c)) for c in mine}
    assert verdicts["Z3"].fits and verdicts["Z3"].prediction.family == "fsdp2"  # 16 bytes a parameter: 101 GiB
    assert verdicts["F+R+Z3+O"] is None  # CPU offload: no record to model it by
    assert all(memory.check(g.spec(c)) is not None for c in g.cells if c.backend == "deepspeed")
    ests = {c.technique: estimate.repeat(c, ModelSpec.load("llama2-7b")) for c in mine}
    assert ests["Z3"].predicted and ests["Z3"].bound_s(2.0) < ests["Z3"].timeout_s
    off = ests["F+R+Z3+O"]
    assert not off.predicted and off.note == "FSDP2 with CPU offload (AdamW on the host) is not modelled"
    assert off.bound_s(2.0) == off.timeout_s
    hints = {s.cell.technique: memory.start_hint(g.spec(s)) for s in g.searches if s.cell.backend == "fsdp2"}
    assert hints["Z3"] >= 1 and hints["F+R+Z3+O"] is None
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    planned, _ = memory.cells.plan(path)
    fsdp2 = planned[planned["backend"] == "fsdp2"].set_index("technique")
    assert fsdp2.loc["Z3", "predicted_fits"] is True
    unplanned = fsdp2.loc["F+R+Z3+O"]  # the offload cell: no verdict, and the plan says why
    assert unplanned["predicted_fits"] is None and "CPU offload (F+R+Z3+O) is not modelled" in unplanned["reason"]
    targets = [c.record_path() for c in mine]
    # the batch planner times the cell the throughput model predicts, and not the offload one
    timed = {t: (s, why) for t, s, why in offline.plan(targets, path)}
    by_tech = {c.technique: str(c.record_path()) for c in mine}
    assert timed[by_tech["Z3"]][0] > 0 and "from predicted" in timed[by_tech["Z3"]][1]
    assert timed[by_tech["F+R+Z3+O"]] == (None, "no probe at its batch nor an earlier record of the cell")


def _as_fsdp2(src, results, run):
    """A committed DeepSpeed record, its backend made fsdp2, under ``results/run`` at the
    path its cell names (what an FSDP2 run on a GPU leaves for the report)."""
    import json

    rec = json.loads(src.read_text())
    rec["cell"]["backend"] = "fsdp2"
    if "spec" in rec.get("provenance", {}):  # a probe answered from a frontier file ran nothing
        rec["provenance"]["spec"]["cell"]["backend"] = "fsdp2"
    dest = results / run / "/".join(src.parts[src.parts.index("runs"):]).replace("/deepspeed/", "/fsdp2/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(rec))
    return dest


def test_the_memory_report_scores_fsdp2_records_but_those_with_offload(tmp_path):
    from llmbench.config import REPO_ROOT
    from llmbench.memory import fit, replay, validate
    from llmbench.report import tidy

    run = REPO_ROOT / "results" / "reference" / "2026-11-25-h200-one-gpu-sweep"
    ds = run / "runs" / "pretrain" / "h200" / "llama2-7b" / "deepspeed" / "Z3" / "bs1-g1" / "record.json"
    mine = _as_fsdp2(ds, tmp_path, "fsdp2-run")
    assert "/fsdp2/Z3/bs1-g1/record.json" in mine.as_posix()
    offload = REPO_ROOT / "results/reference/2026-11-25-h200-offload/runs/pretrain/h200/llama2-7b/deepspeed/Z3+O/bs1-g1"
    theirs = _as_fsdp2(offload / "record.json", tmp_path, "fsdp2-offload")
    df = tidy.build_all([ds, mine, theirs])
    assert sorted(df["backend"]) == ["deepspeed", "fsdp2", "fsdp2"]
    assert [(r["backend"], r["technique"]) for r, _ in fit.rows(df)] == [("deepspeed", "Z3"), ("fsdp2", "Z3")]
    scored = validate.build(df, estimators=False)
    assert list(zip(scored["backend"], scored["family"])) == [("deepspeed", "zero3"), ("fsdp2", "fsdp2")]
    searches = [p for p in sorted((REPO_ROOT / "results" / "reference").glob("*/runs/search/pretrain/*/*/deepspeed/*/search.json"))
                if "Q" not in p.parent.name and '"status": "ok"' in p.read_text()]
    folder = searches[0].parent
    for f in folder.glob("bs*/record.json"):
        _as_fsdp2(f, tmp_path, "fsdp2-run")
    dest = tmp_path / "fsdp2-run" / "/".join(folder.parts[folder.parts.index("runs"):]).replace("/deepspeed/", "/fsdp2/")
    (dest / "search.json").write_text(searches[0].read_text().replace('"deepspeed"', '"fsdp2"'))
    import shutil

    shutil.copytree(folder, tmp_path / "ds-run" / "/".join(folder.parts[folder.parts.index("runs"):]))
    # both searches replayed: the memory model hints FSDP2's start too
    assert sorted(replay.replay_all(tmp_path)["run"]) == ["ds-run", "fsdp2-run"]


def test_both_models_predict_qlora_under_fsdp2():
    """The memory model takes FSDP2 on an NF4 base in with its own terms (one record checks
    them); the throughput model times it with the NF4 gathers and torchao's per-layer host
    cost, so the estimate predicts its repeats (FSDP2's offload stays bounded by its timeout)."""
    config = {"protocol": dict(PROTOCOL, seq_len=350),
              "finetune": [{"backend": "fsdp2", "platforms": ["h200"], "models": ["llama2-7b"],
                            "techniques": ["QL+Z3", "L+Z3"], "batch_sizes": [1], "gpus": 2}]}
    g = grid.expand(config)
    by = {c.technique: c for c in g.cells}
    ql = memory.check(g.spec(by["QL+Z3"]))
    assert ql is not None and ql.fits and ql.prediction.family == "fsdp2"
    assert ql.prediction.gpu_gib < memory.check(g.spec(by["L+Z3"])).prediction.gpu_gib  # a 4-bit base
    est = estimate.repeat(by["QL+Z3"], ModelSpec.load("llama2-7b"))
    assert est.predicted and est.predicted_s > 0
