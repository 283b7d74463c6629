"""The throughput model (llmbench.throughput): its terms on fixture cells, its constants file,
a calibration that recovers known constants, and scoring on a tiny table."""

import ast
import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from llmbench import techniques
from llmbench.config import ConfigError
from llmbench.models import ModelSpec
from llmbench.throughput import calibrate, model, score
from llmbench.throughput.model import CALIBRATED, Hardware, TrainCell

REPO = Path(__file__).resolve().parents[2]

#: Round numbers of the order the fit gives: the tests check structure, not today's fit.
CONSTS = {
    "host_step_s": 0.05, "host_layer_s": 0.001, "host_layer_megatron_s": 0.002, "host_layer_fsdp2_s": 0.003, "host_layer_adapter_s": 0.005,
    "host_layer_recompute_s": 0.004, "host_layer_quant_s": 0.001, "host_layer_nf4_fsdp2_s": 0.004,
    "zero3_s_per_gparam": 0.03,
    "zero3_s_per_tensor": 1e-4,
    "act_bytes_per_token_layer_unit": 500.0, "attn_eager_bytes_per_score": 20.0,
    "cpu_adam_s_per_gparam": 0.6,
}
#: An H100-like GPU, written out so that no record or file changes it.
HW = Hardware(platform="fixture", peak_flops=989e12, hbm_bytes_per_s=3.35e12, pcie_bytes_per_s=55e9,
              bus_bytes_per_s=270e9, default_gemm_efficiency=0.7)


def cell(technique="Naive", batch_size=1, gpus=1, model_name="llama2-7b", stage="pretrain", **kw):
    return TrainCell(stage=stage, platform="h100", model=ModelSpec.load(model_name),
                     technique=techniques.parse(technique), batch_size=batch_size, gpus=gpus, seq_len=350, **kw)


def terms(c, hw=HW):
    return model.terms(c, CONSTS, hw=hw)


def test_large_batch_cell_is_gemm_bound():
    t = terms(cell("F", batch_size=64))
    assert max(t, key=t.get) == "gemm"
    assert t["gemm"] > 0.5 * sum(t.values())


def test_batch_one_adapter_cell_is_host_bound():
    t = terms(cell("L", stage="finetune"))
    assert max(t, key=t.get) == "host"
    # and its host share shrinks as the batch grows, while the GEMM share grows
    big = terms(cell("L", stage="finetune", batch_size=32))
    assert big["host"] / sum(big.values()) < t["host"] / sum(t.values())
    assert big["gemm"] > t["gemm"] * 31


def test_offload_cell_is_optimizer_and_pcie_bound():
    t = terms(cell("Z2+O", gpus=2))
    assert max(t, key=t.get) == "optimizer"
    assert t["offload"] > 0
    # the host's CPU Adam steps every rank's shard: more GPUs on one host do not shorten it,
    # while each rank's PCIe traffic shrinks with its shard; on the GPU there is no offload term
    four = terms(cell("Z2+O", gpus=4))
    assert four["optimizer"] == pytest.approx(t["optimizer"]) and four["offload"] < t["offload"]
    assert terms(cell("Z2", gpus=2))["offload"] == 0


def test_a_step_overlaps_host_and_gpu_work_by_the_share():
    """A batch-1 adapter cell is host-bound: its step is its host time plus the share of its
    GPU time; added (share 1) it is the sum of its terms; the offloaded CPU Adam is serial."""
    c = cell("L", stage="finetune")
    by_side = model.sides(c, CONSTS, hw=HW)
    assert by_side["host"] > by_side["device"] > 0 and by_side["serial"] == 0
    assert model.step_time_s(c, CONSTS, hw=HW) == pytest.approx(sum(terms(c).values()))  # no share: they add
    half = model.step_time_s(c, {**CONSTS, model.OVERLAP: 0.5}, hw=HW)
    assert half == pytest.approx(by_side["host"] + 0.5 * by_side["device"])
    off = model.sides(cell("Z2+O", gpus=2), CONSTS, hw=HW)
    assert off["serial"] == pytest.approx(terms(cell("Z2+O", gpus=2))["optimizer"])


def test_tokens_per_s_grows_with_batch_and_gpus():
    for tech in ("Naive", "Z3", "F+R+Z2", "QL"):
        stage = "finetune" if tech == "QL" else "pretrain"
        tps = [model.tokens_per_s(cell(tech, batch_size=b, stage=stage), CONSTS, hw=HW) for b in (1, 2, 8, 32)]
        assert tps == sorted(tps) and tps[0] < tps[-1], tech
    tps = [model.tokens_per_s(cell("Z3", batch_size=16, gpus=g), CONSTS, hw=HW) for g in (1, 2, 4, 8)]
    assert tps == sorted(tps)


def test_communication_only_across_gpus_and_more_for_zero3():
    assert terms(cell("Z3", gpus=1))["communication"] == 0
    comm = [terms(cell("Z2", gpus=g))["communication"] for g in (2, 4, 8)]
    assert 0 < comm[0] < comm[1] < comm[2]  # a ring moves (G-1)/G of the buffer
    assert terms(cell("Z3", gpus=8))["communication"] > comm[2]
    slow = Hardware(**{**{f: getattr(HW, f) for f in HW.__slots__}, "bus_bytes_per_s": 10e9})
    assert terms(cell("Z2", gpus=8), slow)["communication"] > 20 * comm[2]


def test_zero3_hooks_count_lora_adapters_as_tensors_of_their_own():
    """ZeRO-3 gathers each parameter tensor however small: LoRA's A and B on seven linears a
    layer (llama2-7b: 291 tensors of the base, 448 of the adapters) cost hooks at about the
    same bytes, so L+Z3 pays more ZeRO-3 time than Z3."""
    m = ModelSpec.load("llama2-7b")
    assert model.param_tensors(m, techniques.parse("Z3")) == 32 * 9 + 3
    assert model.param_tensors(m, techniques.parse("L+Z3")) == 32 * 9 + 3 + 32 * 14
    z3, lz3 = terms(cell("Z3"))["zero3"], terms(cell("L+Z3", stage="finetune"))["zero3"]
    assert lz3 - z3 == pytest.approx(2 * 32 * 14 * CONSTS["zero3_s_per_tensor"])
    assert terms(cell("L"))["zero3"] == 0


def test_fsdp2_gathers_per_layer_without_zero3_hooks_and_pays_its_own_host_time():
    """FSDP2 (backend fsdp2): Z3 gathers the bf16 weights in forward and again in backward
    (recomputation replays inside that backward gather), Z2 in forward only, both reduce-scatter
    fp32 gradients; no ZeRO-3 per-tensor hook term; host time per layer its own constant."""
    def fsdp2(tech, gpus=2, **kw):
        return terms(cell(tech, gpus=gpus, backend="fsdp2", **kw))

    work = {k: float(v["value"]) for k, v in model.load_constants(REPO)["work"].items()}
    n = ModelSpec.load("llama2-7b").param_counts()["total"]
    ring = 1 / 2
    scatter = ring * n * work["fsdp2_reduce_bytes"] / HW.bus_bytes_per_s
    gather = ring * n * work["param_bytes"] / HW.bus_bytes_per_s
    assert fsdp2("Z3")["communication"] == pytest.approx(scatter + 2 * gather)
    assert fsdp2("R+Z3")["communication"] == pytest.approx(scatter + 2 * gather)
    assert fsdp2("Z2")["communication"] == pytest.approx(scatter + gather)
    assert fsdp2("Naive")["communication"] == pytest.approx(2 * ring * n * work["fsdp2_reduce_bytes"]
                                                            / HW.bus_bytes_per_s)  # replicated: all-reduce
    assert fsdp2("Z3", gpus=1)["communication"] == 0
    assert fsdp2("Z3")["zero3"] == 0 < terms(cell("Z3", gpus=2))["zero3"]
    L = ModelSpec.load("llama2-7b").num_hidden_layers
    assert fsdp2("Z3")["host"] == pytest.approx(CONSTS["host_step_s"] + L * CONSTS["host_layer_fsdp2_s"])
    # the optimizer steps the rank's shard with Z2 and Z3, everything when replicated
    assert fsdp2("Z3")["optimizer"] == pytest.approx(fsdp2("Naive")["optimizer"] / 2)
    # QLoRA (QL): the NF4 base gathered as stored (its decoder linears in NF4, the rest bf16),
    # only the adapters' gradients reduced, and torchao's dequantisation host time per layer
    counts = ModelSpec.load("llama2-7b").param_counts()
    lora = model.trainable_params(ModelSpec.load("llama2-7b"), techniques.parse("QL"), int(work["lora_rank"]))
    nf4_gather = ring * (counts["decoder_linear"] * work["nf4_bytes_per_param"]
                         + (n - counts["decoder_linear"]) * work["param_bytes"]) / HW.bus_bytes_per_s
    ql = fsdp2("QL+Z2", stage="finetune")
    assert ql["communication"] == pytest.approx(ring * lora * work["fsdp2_reduce_bytes"] / HW.bus_bytes_per_s
                                                + nf4_gather)
    assert ql["dequant"] == pytest.approx(2 * counts["decoder_linear"] * work["nf4_dequant_bytes_per_param"]
                                          / HW.hbm_bytes_per_s + L * CONSTS["host_layer_nf4_fsdp2_s"])
    for tech, why in (("Z3+O", "FSDP2 with CPU offload"), ("F+Z3+FP8", "FP8 training")):  # refused by name
        with pytest.raises(ValueError, match=f"{why} .*is not modelled"):
            cell(tech, backend="fsdp2")


def test_recompute_quant_and_eager_attention_add_their_terms():
    base, r = terms(cell("F", batch_size=8)), terms(cell("F+R", batch_size=8))
    assert base["recompute"] == 0 < r["recompute"]
    assert terms(cell("Naive", batch_size=8))["memory"] > base["memory"]  # eager attention scores
    q = terms(cell("QL", stage="finetune"))
    assert q["dequant"] > 0 and terms(cell("L", stage="finetune"))["dequant"] == 0


def test_lora_trainable_params_match_a_record():
    # llama2-7b L records carry trainable_params 159,907,840 (rank 64 on all seven linears)
    assert model.trainable_params(ModelSpec.load("llama2-7b"), techniques.parse("L"), 64) == 159_907_840


def test_gemm_efficiency_from_nearest_samples_else_default():
    hw = Hardware(**{**{f: getattr(HW, f) for f in HW.__slots__},
                     "gemm_samples": ((4096, 4096, 4096, 0.8), (8192, 8192, 8192, 0.6), (4096, 4096, 4000, 0.8),
                                      (8192, 8192, 8000, 0.6), (8192, 8000, 8192, 0.6))})
    assert hw.gemm_efficiency(4096, 4096, 4096) == 0.8
    assert hw.gemm_efficiency(8192, 8192, 8192) == 0.6
    assert HW.gemm_efficiency(350, 11008, 4096) == 0.7


def test_constants_file_loads_and_every_constant_has_a_source():
    data = model.load_constants(REPO)
    for plat in data["hardware"]:
        facts = model._facts(plat, data["hardware"])
        for key in ("hbm_gb_per_s", "link_gb_per_s", "pcie_gb_per_s"):
            assert facts[key]["value"] > 0 and facts[key]["source"].strip(), (plat, key)
        assert facts["link"] in ("nvlink", "pcie")
    for block in ("assumptions", "work"):
        for key, val in data[block].items():
            vals = val.values() if "value" not in val else [val]
            assert all(v["source"].strip() for v in vals), (block, key)
    consts = data["calibrated"]["constants"]
    assert set(consts) == {*CALIBRATED, model.OVERLAP}
    assert all(v["source"].strip() and v["value"] >= 0 for v in consts.values())
    assert consts[model.OVERLAP]["value"] <= 1


@pytest.mark.parametrize("platform", ["a800", "rtx4090", "rtx3090", "rtx3090-nonvlink", "h100", "h200", "h200x4"])
def test_every_scored_platform_has_hardware(platform):
    hw = model.hardware(platform, REPO)
    assert hw.peak_flops > 0 and hw.bus_bytes_per_s > 0 and hw.pcie_bytes_per_s > 0
    assert set(hw.sources) >= {"peak", "bus", "pcie", "gemm", "hbm"}


def test_a_platform_without_collectives_or_memcpy_records_predicts_what_needs_neither(tmp_path):
    """No micro record at all (a checkout without results/reference): one GPU without offload
    is predicted; a cell of two GPUs, or one that offloads, says which record it lacks."""
    (tmp_path / "results" / "reference").mkdir(parents=True)
    (tmp_path / "config").symlink_to(REPO / "config")
    hw = model.hardware("h200", tmp_path)
    assert hw.bus_bytes_per_s is None and hw.pcie_bytes_per_s is None
    assert "no collectives record of 'h200'" in hw.sources["bus"]
    one = model.terms(cell("F+Z3", gpus=1), CONSTS, hw=hw)
    assert one == model.terms(cell("F+Z3", gpus=1), CONSTS, hw=dataclasses.replace(hw, bus_bytes_per_s=1e9,
                                                                                    pcie_bytes_per_s=1e9))
    with pytest.raises(ConfigError, match=r"platform 'h200': a cell of several GPUs needs its bus bandwidth, "
                                          r"and there is no collectives record of 'h200'"):
        model.terms(cell("F+Z3", gpus=2), CONSTS, hw=hw)
    with pytest.raises(ConfigError, match="an offloading cell needs its pcie bandwidth"):
        model.terms(cell("Z3+O", gpus=1), CONSTS, hw=hw)


def _fixture_records(consts) -> pd.DataFrame:
    """Records whose tokens/s the model itself gives under ``consts`` (h100, fixed host CPUs)."""
    rows = []
    specs = [("pretrain", "Naive", b, 1, "deepspeed") for b in (1, 4)] + [
        ("pretrain", "F", 16, 1, "deepspeed"), ("pretrain", "F+R+Z3", 1, 1, "deepspeed"),
        ("pretrain", "Z3", 8, 2, "deepspeed"), ("pretrain", "Z2+O", 1, 2, "deepspeed"),
        ("pretrain", "Z3+O", 2, 1, "deepspeed"), ("pretrain", "Naive", 4, 2, "megatron"),
        ("pretrain", "Naive", 1, 2, "megatron"), ("pretrain", "Q", 2, 1, "deepspeed"),
        ("pretrain", "R+Q", 8, 1, "deepspeed"), ("finetune", "L", 1, 1, "deepspeed"),
        ("finetune", "L+F", 12, 1, "deepspeed"), ("finetune", "QL+R", 4, 1, "deepspeed"),
        ("finetune", "L+R", 1, 1, "deepspeed"), ("finetune", "L+Z3", 1, 1, "deepspeed"),
        ("pretrain", "Z3", 1, 1, "fsdp2"), ("pretrain", "F+Z2", 8, 2, "fsdp2"),
        ("finetune", "QL+F+Z2", 8, 2, "fsdp2"),
    ]
    for name in ("llama2-7b", "llama2-13b"):
        for stage, tech, b, g, backend in specs:
            c = TrainCell(stage=stage, platform="h100", model=ModelSpec.load(name), technique=techniques.parse(tech),
                          batch_size=b, gpus=g, seq_len=350, backend=backend)
            rows.append({"stage": stage, "platform": "h100", "model": name, "backend": backend, "technique": tech,
                         "batch_size": b, "gpus": g, "seq_len": 350, "status": "ok", "kind": "cell",
                         "run": "fixture",
                         "tokens_per_s_mean": model.tokens_per_s(c, consts, REPO)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("overlap", [1.0, 0.35])
def test_calibration_recovers_known_constants_and_is_reproducible(overlap):
    """Records made by the model itself, its sides added (1.0) or overlapping: the fit finds
    the constants and the share again, and twice the same."""
    consts = {**CONSTS, model.OVERLAP: overlap}
    df = calibrate.select(_fixture_records(consts))
    assert len(df) == 38
    first, second = calibrate.fit(df, REPO), calibrate.fit(df, REPO)
    assert first == second
    for name, want in consts.items():
        assert first[name] == pytest.approx(want, rel=1e-6), name


def test_calibration_uses_our_platforms_only():
    df = _fixture_records(CONSTS)
    paper = df.assign(platform="a800", tokens_per_s_mean=df["tokens_per_s_mean"] * 3)
    chosen = calibrate.select(pd.concat([df, paper, df.assign(kind="probe")], ignore_index=True))
    assert set(chosen["platform"]) == {"h100"} and len(chosen) == len(df)
    # and the calibration module does not read the paper's tables at all
    tree = ast.parse(Path(calibrate.__file__).read_text())
    imported = {(n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if "paper_frame" in m or "reference" in m or m.endswith("report")}


def test_scoring_on_a_tiny_table():
    pred = pd.DataFrame({
        "table": ["t"] * 6, "platform": ["p"] * 3 + ["q"] * 3, "model": ["m"] * 6,
        "tokens_per_s_measured": [100.0, 200.0, 300.0, 100.0, 200.0, 300.0],
        "tokens_per_s_predicted": [110.0, 180.0, 330.0, 300.0, 200.0, 100.0],
    })
    pred["error"] = pred["tokens_per_s_predicted"] / pred["tokens_per_s_measured"] - 1
    out = score.summarise(pred, ["table", "platform"]).set_index("platform")
    assert out.loc["p", "n"] == 3 and out.loc["p", "median_abs_error_pct"] == pytest.approx(10.0)
    assert out.loc["p", "rank_corr"] == pytest.approx(1.0)
    assert out.loc["q", "rank_corr"] == pytest.approx(-1.0)
    assert out.loc["q", "median_abs_error_pct"] == pytest.approx(100 * 2 / 3)  # of +200 %, 0, -67 %


def test_predict_rows_gives_the_models_tokens_per_s():
    df = _fixture_records(CONSTS).head(3)
    pred = score.predict_rows(df, CONSTS, REPO)
    assert pred["error"].abs().max() < 1e-9
    assert set(pred["dominant_term"]) <= set(model.TERMS)


def test_spearman_with_ties_and_constants():
    assert score.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
    assert pd.isna(score.spearman([1, 1, 1], [1, 2, 3]))
