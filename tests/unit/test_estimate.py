"""A training cell's predicted repeat (llmbench.estimate), the Slurm time limit it gives, and the
deadline check that uses it where no repeat is timed (llmbench.ledger.deadline_stop). The step
time is a fixture where the arithmetic is checked; one test reads the throughput model itself."""

import math
from dataclasses import replace

import pytest

from llmbench import estimate, ledger
from llmbench.cells import Cell, MicroCell, ServeCell
from llmbench.models import ModelSpec
from llmbench.protocol import Protocol

PAPER = Protocol()  # 30 + 100 steps, 3 repeats, timeout 3600 s
SHORT = Protocol(warmup_steps=3, measured_steps=10, repeats=1, timeout_s=600)


def cell(platform="h200", technique="F+Z3", model="llama2-7b", gpus=1, batch_size=4, protocol=PAPER, **kw):
    stage = "finetune" if technique.startswith(("L", "QL")) else "pretrain"
    adapter = {"lora": {"rank": 64}} if stage == "finetune" else None
    return Cell(stage=stage, platform=platform, model=model, backend=kw.pop("backend", "deepspeed"),
                technique=technique, batch_size=batch_size, gpus=gpus, protocol=protocol, adapter=adapter, **kw)


@pytest.fixture
def step_2s(monkeypatch):
    """Every predicted step takes 2 s (the throughput model stands aside)."""
    monkeypatch.setattr(estimate, "step_s", lambda cell, model, root=None: 2.0)


def test_a_cells_slurm_runtime_is_twice_its_predicted_repeats_plus_slack(step_2s):
    c = cell(technique="F+Z3")  # ZeRO-3 on one GPU: its start-up builds the whole 7B shard
    m = ModelSpec.load("llama2-7b")
    start = estimate.STARTUP_FIXED_S + estimate.BUILD_SHARDED_S_PER_GPARAM * m.param_counts()["total"] / 1e9
    est = estimate.repeat(c, m)
    assert est.predicted and est.step_s == 2.0 and est.steps == 130
    assert est.startup_s == pytest.approx(start) and est.predicted_s == pytest.approx(start + 130 * 2.0)
    want = math.ceil(3 * 2.0 * (start + 260.0) / 60) + 10  # 3 repeats, x 2, + 10 min
    assert estimate.runtime_min(c, m) == want
    assert want < estimate.timeout_runtime_min(c) == 3 * 61 + 10  # shorter than every timeout used up


def test_a_short_cell_gets_the_floor_and_a_long_one_the_timeout_bound(step_2s, monkeypatch):
    m = ModelSpec.load("llama2-7b")
    assert estimate.runtime_min(cell(protocol=SHORT), m) == estimate.SLURM_FLOOR_MIN
    monkeypatch.setattr(estimate, "step_s", lambda cell, model, root=None: 60.0)  # 130 steps: past 3600 s
    c = cell()
    assert estimate.runtime_min(c, m) == estimate.timeout_runtime_min(c)
    assert estimate.repeat(c, m).bound_s(estimate.DEADLINE_MARGIN) == 3600.0  # a repeat stops at its timeout


def test_a_sharded_build_is_per_rank_and_a_whole_copy_is_not():
    m = ModelSpec.load("llama2-70b")
    one, four = estimate.startup_s(cell(technique="L+F+R+Z3+O", gpus=1), m), \
        estimate.startup_s(cell(technique="L+F+R+Z3+O", gpus=4), m)
    assert four < one  # each of four ranks builds a quarter
    whole = estimate.startup_s(cell(technique="QL+F", gpus=4), m)  # 4-bit: a whole copy on every rank
    assert whole == estimate.startup_s(cell(technique="QL+F", gpus=1), m)


def test_fsdp2s_full_sharding_builds_the_whole_model_not_deepspeeds_shards():
    """FSDP2 shards a model built on the meta device (about a second for llama2-7b's Z3 in its
    records): it pays the whole-model build, not DeepSpeed ZeRO-3's partitioning; its offload
    still pays the host buffers."""
    m = ModelSpec.load("llama2-7b")
    whole = estimate.STARTUP_FIXED_S + estimate.BUILD_S_PER_GPARAM * m.param_counts()["total"] / 1e9
    assert estimate.startup_s(cell(technique="Z3", backend="fsdp2"), m) == pytest.approx(whole)
    assert estimate.startup_s(cell(technique="Z3"), m) > whole  # DeepSpeed's sharded build
    assert estimate.startup_s(cell(technique="Z3+O", backend="fsdp2"), m) > whole


@pytest.mark.parametrize("c, why", [
    (cell(platform="cpu", model="tiny", technique="Naive"), "platform 'cpu'"),
    (cell(platform="a800", gpus=8), "platform 'a800'"),
    (cell(backend="fsdp2", technique="Z3+O"), "FSDP2 with CPU offload"),
    (cell(backend="fsdp2", technique="F+Z3+FP8"), "FP8 training"),
    (cell(technique="F+C"), "torch.compile"),
    (cell(technique="DORA"), "adapter 'dora'"),
    (cell(gpus=2, nodes=2), "several nodes"),
    (replace(cell(), stage="profile"), "a profile cell"),
])
def test_where_the_model_cannot_predict_the_bound_is_the_timeout(c, why, step_2s):
    m = ModelSpec.load(c.model)
    est = estimate.repeat(c, m)
    assert not est.predicted and why in est.note
    assert est.bound_s(estimate.DEADLINE_MARGIN) == c.protocol.timeout_s
    assert estimate.runtime_min(c, m) == estimate.timeout_runtime_min(c)


def test_serving_and_microbenchmark_cells_are_not_predicted():
    serve = ServeCell(platform="h200", model="llama2-7b", engine="vllm", load="burst", gpus=1, load_spec={},
                      ready_timeout_s=600, timeout_s=1200)
    micro = MicroCell(platform="h200", bench="gemm", case="sweep", gpus=1, params={}, timeout_s=900)
    assert [estimate.repeat(c, None).bound_s(2.0) for c in (serve, micro)] == [1800.0, 900.0]
    assert not estimate.repeat(serve, None).predicted and "serve cell" in estimate.repeat(serve, None).note


def test_the_prediction_is_the_throughput_models_step_time():
    """The wiring to llmbench.throughput: a TrainCell built from the cell, the calibrated constants."""
    from llmbench import techniques
    from llmbench.throughput.model import TrainCell, calibrated_constants, step_time_s

    c, m = cell(platform="h200x4", technique="L+F+R+Z3+O", model="llama2-70b", gpus=4, batch_size=1, protocol=SHORT), \
        ModelSpec.load("llama2-70b")
    want = step_time_s(TrainCell(stage="finetune", platform="h200x4", model=m, technique=techniques.parse(c.technique),
                                 batch_size=1, gpus=4, seq_len=SHORT.seq_len), calibrated_constants())
    est = estimate.repeat(c, m)
    assert est.step_s == pytest.approx(want) and est.predicted_s == pytest.approx(est.startup_s + 13 * want)


def test_a_repeat_not_timed_yet_is_judged_by_its_prediction(monkeypatch):
    """deadline_stop: a timed repeat wins (x REPEAT_MARGIN); else the prediction (its margin
    included by the caller); with neither, the repeat starts while time is left."""
    monkeypatch.setattr(ledger, "time", type("T", (), {"time": staticmethod(lambda: 1000.0)}))
    deadline = 1200.0  # 200 s left
    why = ledger.deadline_stop(deadline, [], "repeat 0", predicted_s=399.0)
    assert why == "stopped before repeat 0 at the deadline: 200 s left, none timed yet, it is predicted to need 399 s"
    assert ledger.deadline_stop(deadline, [], "repeat 0", predicted_s=150.0) is None
    assert ledger.deadline_stop(deadline, [100.0], "repeat 1", predicted_s=399.0) is None  # timed: 120 s < 200 s
    assert "the longest so far took 180 s" in ledger.deadline_stop(deadline, [180.0], "repeat 1", predicted_s=50.0)
    assert ledger.deadline_stop(deadline, [], "repeat 0") is None  # neither: the first starts
    assert "no time is left" in ledger.deadline_stop(999.0, [], "repeat 0")
    assert ledger.deadline_stop(None, [], "repeat 0", predicted_s=1e9) is None  # no deadline at all


DRY_RUN_CONFIG = """
results_dir: {results}
protocol: {{warmup_steps: 30, measured_steps: 100, repeats: 3, seq_len: 350, timeout_s: 3600, seed: 0}}
pretrain:
  - platforms: [h200, a800]
    models: [llama2-7b]
    techniques: [F+Z3]
    batch_sizes: [8]
    gpus: 1
finetune:
  - platforms: [h200x4]
    models: [llama2-70b]
    techniques: [L+F+R+Z3, L+F+R+Z3+O]
    batch_sizes: [1]
    gpus: 4
    lora: {{rank: 64}}
    paired: lora-z3
"""


def test_a_jobs_slurm_runtime_comes_from_its_prediction_in_the_dry_run(tmp_path):
    """Snakemake's own plan with the CI Slurm profile (`snakemake -n`, the resources it would
    submit): an H200 cell's runtime is twice its predicted repeats plus slack, far under the
    timeout bound; the A800 cell, which the model does not predict, keeps the bound; a paired
    set's job adds its cells' (each predicted)."""
    import re
    import subprocess

    import yaml
    from conftest import BIN, REPO

    from llmbench import grid

    config = tmp_path / "config.yaml"
    config.write_text(DRY_RUN_CONFIG.format(results=tmp_path / "results"))
    out = subprocess.run([BIN / "snakemake", "pretrain", "finetune", "-n", "--nolock", "--cores", "2", "-d", str(REPO),
                          "--profile", "profiles/slurm_ci", "--configfile", str(config)],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    runtime = {}
    for job in re.split(r"\n(?=rule |localrule )", out):
        if (outputs := re.search(r"output: (.*)", job)) and (res := re.search(r"runtime=(\d+)", job)):
            for path in outputs.group(1).split(", "):
                runtime[path] = int(res.group(1))
    g = grid.expand(yaml.safe_load(config.read_text()))
    results = str(tmp_path / "results")

    def predicted_min(c):
        est = estimate.repeat(c, g.models[c.model])
        assert est.predicted, est.note
        return math.ceil(3 * estimate.SLURM_MARGIN * est.predicted_s / 60) + estimate.SLURM_SLACK_MIN

    h200, a800 = (g.find(stage="pretrain", platform=p, model="llama2-7b", backend="deepspeed", technique="F+Z3",
                         batch_size=8, gpus=1) for p in ("h200", "a800"))
    assert runtime[h200.record_path(results)] == predicted_min(h200) < estimate.timeout_runtime_min(h200) == 193
    assert runtime[a800.record_path(results)] == estimate.timeout_runtime_min(a800) == 193
    (pset,) = g.sets
    both = sum(predicted_min(c) for c in pset.cells)  # one job: its cells one after the other
    assert [runtime[c.record_path(results)] for c in pset.cells] == [both, both] and both < 2 * 193
