"""Paired sets from a config (llmbench.grid.paired): which cells form a set (training cells,
or serving cells whose points' runs are their repeats), the order of each round, every
rejection before any job, the machine identity of a record
(llmbench.provenance.machine) and the message of a set with records missing. Their runs:
tests/integration/test_paired_set.py and test_paired_serve_set.py."""

import copy

import pytest

from llmbench import grid, provenance
from llmbench.config import ConfigError
from llmbench.grid import paired

PROTOCOL = {"warmup_steps": 0, "measured_steps": 1, "repeats": 2, "seq_len": 8, "timeout_s": 60}


def block(**keys):
    return {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive", "Z2"], "batch_sizes": [1], **keys}


def config(*blocks, stage="pretrain", **top):
    return {"protocol": dict(PROTOCOL), stage: list(copy.deepcopy(blocks)), **top}


def test_blocks_naming_one_set_make_one_set_per_platform_in_the_blocks_order():
    g = grid.expand(config(block(paired="t3"), block(techniques=["Z3"], gpus=[1, 2], paired="t3"),
                           block(techniques=["R"])))
    assert [s.id for s in g.sets] == ["t3-cpu"]
    s = g.sets[0]
    assert [(c.technique, c.gpus) for c in s.cells] == [("Naive", 1), ("Z2", 1), ("Z3", 1), ("Z3", 2)]
    assert s.gpus == 2 and s.rounds == 2 and s.order == "shuffle" and s.seed == 0
    assert s.record_paths("res")[0] == "res/runs/pretrain/cpu/tiny/deepspeed/Naive/bs1-g1/record.json"
    plan = s.plan()
    assert plan["cells"][3] == "runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-g2/record.json"
    assert plan["id"] == "t3-cpu" and len(plan["rounds"]) == 2
    assert all(sorted(r) == [0, 1, 2, 3] for r in plan["rounds"])
    assert len(g.cells) == 5  # the unpaired R cell is no set's
    assert s.rule_name == "run_paired_set_t3_cpu"


def test_a_cell_two_blocks_of_one_set_define_is_in_it_once():
    g = grid.expand(config(block(paired="a"), block(techniques=["Z2"], paired="a")))
    assert [c.technique for c in g.sets[0].cells] == ["Naive", "Z2"]


def test_a_block_over_two_platforms_makes_two_sets(tmp_path, repo):
    import shutil

    shutil.copytree(repo / "config", tmp_path / "config")
    (tmp_path / "config/platforms/cpu2.yaml").write_text(
        (repo / "config/platforms/cpu.yaml").read_text().replace("name: cpu", "name: cpu2"))
    g = grid.expand(config(block(platforms=["cpu", "cpu2"], paired="x")), tmp_path)
    assert [(s.id, s.platform, {c.platform for c in s.cells}) for s in g.sets] == [
        ("x-cpu", "cpu", {"cpu"}), ("x-cpu2", "cpu2", {"cpu2"})]


def test_finetune_and_profile_blocks_may_name_sets_too():
    g = grid.expand(config(block(techniques=["L", "QL"], paired="t9"), stage="finetune"))
    assert [c.technique for c in g.sets[0].cells] == ["L", "QL"]
    g = grid.expand(config(block(profile="training", techniques=["Naive", "F"], paired="p"), stage="profile"))
    assert [c.stage for c in g.sets[0].cells] == ["profile", "profile"]


def test_shuffle_is_seeded_by_the_protocol_seed_and_the_round():
    orders = [paired.round_order(5, r, "shuffle", 7) for r in range(4)]
    assert orders == [paired.round_order(5, r, "shuffle", 7) for r in range(4)]  # deterministic
    assert all(sorted(o) == list(range(5)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # rounds differ
    assert orders[1] == paired.round_order(5, 0, "shuffle", 8)  # seed + round
    g = grid.expand(config(block(techniques=["Naive", "Z2", "Z3", "R", "F"], paired="s"),
                           protocol={**PROTOCOL, "seed": 7, "repeats": 4}))
    assert g.sets[0].plan()["rounds"] == orders and g.sets[0].plan()["seed"] == 7


def test_rotate_starts_each_round_one_cell_later():
    assert [paired.round_order(3, r, "rotate", 0) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    g = grid.expand(config(block(techniques=["Naive", "Z2", "Z3"], paired="r"), paired_order="rotate"))
    assert g.sets[0].plan()["rounds"] == [[0, 1, 2], [1, 2, 0]] and g.sets[0].plan()["seed"] is None
    g = grid.expand(config(block(paired="r", paired_order="rotate")))  # the block's own
    assert g.sets[0].order == "rotate"


def test_a_set_has_as_many_rounds_as_its_most_repeated_cell():
    g = grid.expand(config(block(paired="m"), block(techniques=["Z3"], paired="m", protocol={"repeats": 3})))
    assert g.sets[0].rounds == 3 and len(g.sets[0].plan()["rounds"]) == 3


@pytest.mark.parametrize("blocks, match", [
    ([block(paired="s", max_batch={"max": 4})], r"pretrain\[0\]\.paired: a paired set measures fixed cells"),
    ([block(paired="s", nodes=2, gpus=2)], r"pretrain\[0\]\.paired: a paired set runs on one machine"),
    ([block(paired="")], r"pretrain\[0\]\.paired: '' does not match"),
    ([block(paired="Table 9")], r"pretrain\[0\]\.paired: 'Table 9' does not match"),
    ([block(paired="t9-")], r"pretrain\[0\]\.paired: 't9-' does not match"),
    ([block(paired=3)], r"pretrain\[0\]\.paired: 3 is not of type"),
    ([block(paired_order="rotate")], r"pretrain\[0\]\.paired_order: only with paired"),
    ([block(paired="s"), block(paired="s", paired_order="rotate")],
     r"pretrain\[1\]\.paired_order: 'rotate', but pretrain\[0\] orders paired set 's' 'shuffle'"),
    ([block(paired="s"), block(paired="u")],
     r"pretrain\[1\]\.paired: cell \S+/Naive/bs1-g1/record.json is already in paired set 's' \(pretrain\[0\]\)"),
    ([block(paired="s-cpu"), block(techniques=["R"], paired="s", platforms=["cpu-cpu"])], None),
])
def test_a_bad_set_is_rejected_before_any_job_naming_the_block_and_key(blocks, match, tmp_path, repo):
    if match is None:  # two sets whose ids collide: name s-cpu on cpu, and s on a platform cpu-cpu
        import shutil

        shutil.copytree(repo / "config", tmp_path / "config")
        (tmp_path / "config/platforms/cpu-cpu.yaml").write_text(
            (repo / "config/platforms/cpu.yaml").read_text().replace("name: cpu", "name: cpu-cpu"))
        with pytest.raises(ConfigError, match=r"pretrain\[1\]\.paired: paired set id 's-cpu-cpu' is also set "
                                              r"'s-cpu' on platform 'cpu'"):
            grid.expand(config(*blocks), tmp_path)
        return
    with pytest.raises(ConfigError, match=match):
        grid.expand(config(*blocks))


def test_a_set_whose_cells_differ_in_platform_cannot_be_made():
    g = grid.expand(config(block(paired="s")))
    with pytest.raises(ConfigError, match="its cells must run on platform 'h200'"):
        paired.PairedSet(name="s", platform="h200", cells=g.sets[0].cells)


BURST = {"num_requests": 4, "input_len": 4, "output_len": 4}


def serve_block(engines=("transformers",), loads=("burst-1", "burst-2", "burst-3"), **keys):
    return {"platforms": ["cpu"], "models": ["tiny"], "engines": list(engines),
            "loads": {name: dict(BURST) for name in loads}, **keys}


def test_serve_blocks_naming_one_set_alternate_their_points_run_by_run():
    """vLLM and transformers under burst-1..3: the runs of each engine are its repeats, and
    round r runs burst-(r+1) of each engine, the engines in the round's order."""
    g = grid.expand(config(serve_block(paired="eng"), serve_block(engines=["vllm"], paired="eng"),
                           serve_block(loads=["solo"]), stage="serve", paired_order="rotate"))
    (s,) = g.sets
    assert s.id == "eng-cpu" and s.serving and s.rule_name == "run_paired_set_eng_cpu"
    assert [(c.engine, c.load) for c in s.cells] == [(e, f"burst-{k}") for e in ("transformers", "vllm")
                                                     for k in (1, 2, 3)]
    assert s.rounds == 3 and s.gpus == 1
    plan = s.plan()
    assert plan["cells"][4] == "runs/serve/cpu/tiny/vllm/burst-2-g1/record.json"
    assert plan["rounds"] == [[0, 3], [4, 1], [2, 5]] and plan["ordering"] == "rotate" and plan["seed"] is None
    assert len(g.cells) == 7  # the solo cell is no set's


def test_a_shuffled_serving_set_is_seeded_by_the_protocol_seed_and_the_round():
    g = grid.expand(config(serve_block(engines=["transformers", "vllm"], paired="eng"), stage="serve",
                           protocol={**PROTOCOL, "seed": 7}))
    (s,) = g.sets
    assert s.seed == 7 and s.order == "shuffle"
    by_point = [[0, 1, 2], [3, 4, 5]]  # each engine's burst-1..3
    assert s.plan()["rounds"] == [[by_point[p][r] for p in paired.round_order(2, r, "shuffle", 7)] for r in range(3)]
    assert s.plan()["seed"] == 7


def test_the_runs_of_a_point_are_loads_of_one_spec_numbered_1_2_3():
    cells = grid.expand(config(serve_block(loads=["burst-2", "burst-1", "burst-10", "solo", "poisson-5"]),
                               stage="serve")).cells
    by_load = {c.load: i for i, c in enumerate(cells)}
    # burst-1, -2, -10 are one point's runs in the order of their numbers; solo and
    # poisson-5 are points of one run each (poisson-5 is the only run named poisson-)
    assert paired.serving_points(cells) == [[by_load["burst-1"], by_load["burst-2"], by_load["burst-10"]],
                                           [by_load["solo"]], [by_load["poisson-5"]]]
    b = serve_block(loads=["run-1", "run-2"])
    b["loads"]["run-2"]["num_requests"] = 8  # another spec: another point, not a second run
    cells = grid.expand(config(b, stage="serve")).cells
    assert paired.serving_points(cells) == [[0], [1]]


def test_a_serving_set_with_uneven_runs_runs_the_longer_points_alone_at_the_end():
    g = grid.expand(config(serve_block(paired="u"), serve_block(engines=["vllm"], loads=["burst-1"], paired="u"),
                           stage="serve", paired_order="rotate"))
    assert g.sets[0].rounds == 3 and g.sets[0].plan()["rounds"] == [[0, 3], [1], [2]]


def test_a_set_that_shares_engines_orders_launches_and_runs_a_launchs_points_in_a_row():
    """Two engines, three sweep points each, two runs of each point: each round orders the two
    launches (seeded), and each launch's points run one after the other in the block's order,
    on one engine (llmbench.serve.paired); without share_engine the points interleave."""
    loads = [f"c{c}-{k}" for c in (1, 2, 4) for k in (1, 2)]
    blocks = [serve_block(engines=[e], loads=loads, paired="sw", share_engine=True) for e in ("transformers", "vllm")]
    for b in blocks:
        for c in (1, 2, 4):
            for k in (1, 2):
                b["loads"][f"c{c}-{k}"] = {**BURST, "mode": "concurrency", "max_concurrency": c}
    g = grid.expand(config(*blocks, stage="serve", protocol={**PROTOCOL, "seed": 3}))
    (s,) = g.sets
    plan = s.plan()
    assert s.share_engine and plan["share_engine"] is True
    launch = {0: [0, 2, 4], 1: [6, 8, 10]}  # run 1 of each engine's c1, c2, c4
    assert plan["rounds"] == [[i + r for u in paired.round_order(2, r, "shuffle", 3) for i in launch[u]]
                              for r in range(2)]
    assert s.cells[0].launch_key == s.cells[5].launch_key != s.cells[6].launch_key
    unshared = grid.expand(config(*[{**b, "share_engine": False} for b in blocks], stage="serve",
                                  protocol={**PROTOCOL, "seed": 3})).sets[0]
    assert "share_engine" not in unshared.plan() and unshared.plan()["rounds"] != plan["rounds"]


def test_a_set_that_shares_engines_asks_slurm_for_one_engine_start_per_launch_and_round():
    """The serving set's job time limit (llmbench.estimate.serve_set_runtime_min): each run's
    load timeout, and an engine's ready timeout and slack where the set starts one: every run
    without share_engine, once per launch and round with it (as llmbench.serve.paired starts
    them: engine_sessions)."""
    from llmbench import estimate

    loads = [f"c{c}-{k}" for c in (1, 2, 4) for k in (1, 2)]
    blocks = [serve_block(engines=[e], loads=loads, paired="sw", share_engine=True) for e in ("transformers", "vllm")]
    shared = grid.expand(config(*blocks, stage="serve")).sets[0]
    unshared = grid.expand(config(*[{**b, "share_engine": False} for b in blocks], stage="serve")).sets[0]
    for r in shared.plan()["rounds"]:  # two launches a round, three runs each
        assert [len(g) for g in paired.engine_sessions(r, shared.cells, True)] == [3, 3]
        assert len(paired.engine_sessions(r, shared.cells, False)) == 6
    c = shared.cells[0]
    start = (c.ready_timeout_s + c.timeout_s) // 60 + estimate.SERVE_SLACK_MIN
    assert estimate.serve_set_runtime_min(shared.cells, shared.plan()["rounds"], True) == 4 * start + 8 * (
        c.timeout_s // 60 + 1)
    assert estimate.serve_set_runtime_min(unshared.cells, unshared.plan()["rounds"], False) == 12 * start


@pytest.mark.parametrize("blocks, match", [
    ([serve_block(paired="Eng")], r"serve\[0\]\.paired: 'Eng' does not match"),
    ([serve_block(paired_order="rotate")], r"serve\[0\]\.paired_order: only with paired"),
    ([serve_block(paired="s"), serve_block(engines=["vllm"], paired="s", paired_order="rotate")],
     r"serve\[1\]\.paired_order: 'rotate', but serve\[0\] orders paired set 's' 'shuffle'"),
    ([serve_block(share_engine=True)], r"serve\[0\]\.share_engine: only with paired"),
    ([serve_block(paired="s", share_engine=True), serve_block(engines=["vllm"], paired="s")],
     r"serve\[1\]\.share_engine: False, but serve\[0\] says True for paired set 's'"),
    ([serve_block(paired="s"), serve_block(loads=["burst-1"], paired="u")],
     r"serve\[1\]\.paired: cell \S+/transformers/burst-1-g1/record.json is already in paired set 's' "
     r"\(serve\[0\]\)"),
])
def test_a_bad_serving_set_is_rejected_before_any_job_naming_the_block_and_key(blocks, match):
    with pytest.raises(ConfigError, match=match):
        grid.expand(config(*blocks, stage="serve"))


def test_a_set_holds_serving_cells_or_training_cells_not_both():
    c = {**config(block(paired="s")), "serve": [serve_block(paired="s")]}
    with pytest.raises(ConfigError, match=r"serve\[0\]\.paired: paired set 's' is named by pretrain\[0\] too; a set "
                                          "holds serving cells or training cells, not both"):
        grid.expand(c)
    g = grid.expand({**config(block(paired="t")), "serve": [serve_block(paired="s")]})
    assert [(s.id, s.serving) for s in g.sets] == [("t-cpu", False), ("s-cpu", True)]
    with pytest.raises(ConfigError, match="all be serving cells or all training cells"):
        paired.PairedSet(name="x", platform="cpu", cells=(g.sets[0].cells[0], g.sets[1].cells[0]))


def test_a_serving_set_with_a_record_missing_is_reported_as_a_training_one_is():
    g = grid.expand(config(serve_block(engines=["transformers", "vllm"], paired="eng"), stage="serve",
                           results_dir="res"))
    paths = g.sets[0].record_paths("res")
    (found,) = paired.incomplete(g.sets, "res", exists=lambda p: p == paths[0])
    assert found.message("res").startswith("paired set eng-cpu: 1 of its 6 records are present, 5 missing.")
    assert "mv res/runs/serve/cpu/tiny/transformers/burst-1-g1/record.json res/superseded/runs/serve/" in (
        found.message("res"))


def test_a_set_with_some_records_missing_is_reported_with_how_to_measure_it_again():
    g = grid.expand(config(block(techniques=["Naive", "Z2", "Z3"], paired="t3"), results_dir="res"))
    paths = g.sets[0].record_paths("res")
    assert paired.incomplete(g.sets, g.results_dir, exists=lambda p: False) == []  # none there: the set runs
    assert paired.incomplete(g.sets, g.results_dir, exists=lambda p: True) == []  # all there: nothing runs
    (found,) = paired.incomplete(g.sets, g.results_dir, exists=lambda p: p != paths[1])
    assert found.present == (paths[0], paths[2]) and found.missing == (paths[1],)
    text = found.message("res")
    assert text.startswith("paired set t3-cpu: 2 of its 3 records are present, 1 missing.")
    assert f"missing: {paths[1]}" in text and f"present: {paths[0]}" in text
    assert ("mkdir -p res/superseded/runs/pretrain/cpu/tiny/deepspeed/Naive/bs1-g1 && mv "
            f"{paths[0]} res/superseded/runs/pretrain/cpu/tiny/deepspeed/Naive/bs1-g1/record.json") in text


def test_a_records_machine_is_read_from_its_provenance():
    gpu = {"host": {"hostname": "vm", "cpu": "Xeon", "boot_id": "b1", "cpus": 16},
           "devices": {"driver": "570.1", "gpus": ["NVIDIA H200"]},
           "gpu_state": {"gpus": [{"id": "0", "board": {"uuid": "GPU-a"}}, {"id": "1", "board": {"uuid": "GPU-b"}}],
                         "waited_s": 0.0}}
    assert provenance.machine(gpu) == {"boot_id": "b1", "gpu_uuids": ["GPU-a", "GPU-b"], "cpu": "Xeon",
                                       "driver": "570.1", "hostname": "vm"}
    cpu = {"host": {"hostname": "vm", "cpu": "Xeon", "boot_id": "b1"}, "devices": None}
    assert provenance.machine(cpu) == {"boot_id": "b1", "gpu_uuids": [], "cpu": "Xeon", "driver": None,
                                       "hostname": "vm"}
    unread = {**gpu, "gpu_state": {"error": "NVMLError", "gpus": ["0"]}}  # NVML could not be read
    assert provenance.machine(unread)["gpu_uuids"] == []
    assert provenance.machine({}) == {"boot_id": None, "gpu_uuids": [], "cpu": None, "driver": None, "hostname": None}
