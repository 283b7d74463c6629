"""Paired sets from a config (llmbench.grid.paired): which cells form a set, the order of
each round, every rejection before any job, the machine identity of a record
(llmbench.provenance.machine) and the message of a set with records missing. Their runs:
tests/integration/test_paired_set.py."""

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


def test_serving_blocks_have_no_paired_key():
    c = {"protocol": dict(PROTOCOL), "serve": [{"platforms": ["cpu"], "models": ["tiny"], "engines": ["transformers"],
                                                "loads": {"b": {"num_requests": 1, "input_len": 4, "output_len": 4}},
                                                "paired": "s"}]}
    with pytest.raises(ConfigError, match=r"serve\[0\]: unknown key\(s\) 'paired'"):
        grid.expand(c)


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
