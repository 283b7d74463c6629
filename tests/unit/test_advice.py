"""The advisor on fixture records: measured rows where a record exists, predicted elsewhere,
platforms never run predicted from the model, the goals' orders."""

import pandas as pd
import pytest

from llmbench.config import ConfigError
from llmbench.report import advice

from conftest import REPO


def tidy_rows(*rows):
    cols = ["stage", "platform", "model", "backend", "technique", "batch_size", "gpus", "status",
            "tokens_per_s_mean", "peak_mem_allocated_gib", "kind"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)


FIXTURE = tidy_rows(
    ("finetune", "h100", "llama2-7b", "deepspeed", "L", 1, 1, "ok", 1300.0, 18.0, "cell"),
    ("finetune", "h100", "llama2-7b", "deepspeed", "QL", 1, 1, "ok", 700.0, 9.1, "cell"),
    ("finetune", "h100", "llama2-7b", "deepspeed", "QL", 8, 1, "ok", 2500.0, 20.0, "probe"),  # probes never count
    ("finetune", "h100", "llama2-7b", "deepspeed", "L+F", 1, 1, "oom", None, None, "cell"),
)


def test_measured_where_measured_predicted_elsewhere_ranked_by_throughput():
    df = advice.build(FIXTURE, {"platforms": ["h100"], "models": ["llama2-7b"], "stage": "finetune", "gpus": "1"},
                      root=REPO)
    assert set(df["platform"]) == {"h100"} and set(df["gpus"]) == {1} and set(df["stage"]) == {"finetune"}
    head = df.head(2)
    assert list(head["technique"]) == ["L", "QL"] and list(head["basis"]) == ["measured", "measured"]
    assert list(head["rank"]) == [1, 2] and head["tokens_per_s"].tolist() == [1300.0, 700.0]
    rest = df.iloc[2:]
    assert rest["tokens_per_s"].isna().all()
    # an oom record at batch 1 wins over the prediction (which says L+F fits): measured not to fit
    lf = df[df["technique"] == "L+F"].iloc[0]
    assert (lf["basis"], lf["fits"], lf["why_not"]) == ("measured", False, "out of memory at batch 1 (measured)")
    assert pd.isna(lf["rank"]) and (rest[rest["technique"] != "L+F"]["basis"] == "predicted").all()
    assert set(df["technique"]) == set(advice.paper_methods("finetune", REPO))


def test_offload_is_held_to_the_machine_the_platforms_records_ran_on():
    # h200.yaml is the two-GPU node (234 GiB of host memory); its one-GPU records ran on 125.87 GiB
    ask = {"platforms": ["h200"], "models": ["llama2-7b"], "stage": "pretrain", "gpus": 1}
    ran = tidy_rows(("pretrain", "h200", "llama2-7b", "deepspeed", "Q", 1, 1, "ok", 2000.0, 9.0, "cell"))
    on_file = advice.build(ran, ask, root=REPO).set_index("technique")
    ran["host_mem_gib"] = 125.87
    on_machine = advice.build(ran, ask, root=REPO).set_index("technique")
    assert on_file.loc["R+Z2+O", "fits"] == True  # noqa: E712 (about 134 GiB of host memory)
    assert on_machine.loc["R+Z2+O", "fits"] == False and "> 125.87 GiB" in on_machine.loc["R+Z2+O", "why_not"]  # noqa: E712


def test_a_platform_never_run_is_predicted_and_what_cannot_fit_is_last_with_why():
    df = advice.build(FIXTURE, {"platforms": ["a800"], "models": ["llama2-70b"], "stage": "pretrain",
                                "gpus": {"a800": 8}}, root=REPO)
    assert (df["basis"] == "predicted").all() and set(df["gpus"]) == {8}
    no = df[df["fits"] == False]  # noqa: E712
    assert len(no) and no["rank"].isna().all() and no["why_not"].str.contains("GiB").all()
    assert df.index[df["fits"] == False].min() > df.index[df["fits"] == True].max()  # noqa: E712
    assert "Naive" in set(no["technique"])  # 70B without ZeRO: 24 bytes a parameter on one GPU


@pytest.mark.parametrize("goal", ["memory", "fits"])
def test_the_goals_order(goal):
    df = advice.build(FIXTURE, {"platforms": ["h100"], "models": ["llama2-7b"], "stage": "finetune", "gpus": 1,
                                "goal": goal}, root=REPO)
    ranked = df[df["rank"].notna()]
    if goal == "memory":
        assert ranked["memory_gib"].is_monotonic_increasing
    else:
        assert (-ranked["predicted_max_batch"]).is_monotonic_increasing


def test_defaults_and_bad_requests():
    df = advice.build(FIXTURE, None, root=REPO)  # every platform and model of the records, 1 GPU (h100 has 1)
    assert set(df["platform"]) == {"h100"} and set(df["stage"]) == {"pretrain", "finetune"}
    with pytest.raises(ConfigError, match="goal"):
        advice.build(FIXTURE, {"goal": "speed"}, root=REPO)
    with pytest.raises(ConfigError, match="nowhere"):
        advice.build(FIXTURE, {"platforms": ["nowhere"]}, root=REPO)


def test_the_page_has_one_part_per_platform_model_and_stage():
    df = advice.build(FIXTURE, {"platforms": ["h100"], "models": ["llama2-7b", "llama2-13b"], "stage": "finetune",
                                "gpus": 1}, root=REPO)
    page = advice.table(df)
    assert [p.heading.split(",")[0] for p in page.parts] == ["llama2-13b", "llama2-7b"]
    assert "measured" in page.parts[1].frame["Basis"].tolist()


def test_the_advise_command_runs_nothing_and_prints_the_ranking(capsys, tmp_path):
    from llmbench.memory.__main__ import main

    tidy = tmp_path / "records.csv"
    FIXTURE.to_csv(tidy, index=False)
    assert main(["advise", "--platform", "h100", "--model", "llama2-7b", "--stage", "finetune", "--gpus", "1",
                 "--tidy", str(tidy)]) == 0
    out = capsys.readouterr().out
    assert "llama2-7b, finetune, h100 x 1 GPU" in out and "| 1      | L          | measured" in out
