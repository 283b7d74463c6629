"""FP8 training (techniques FP8, FP8R; torchao.float8 on FSDP2) and the FP8 GEMM: the grammar,
the grid's refusals before any job (platforms without FP8 tensor cores, DeepSpeed, offload,
micro-batches whose tokens are no multiple of 16),
the FSDP2 worker's conversion of a tiny model on the meta device, the FP8 MFU of a record, and
the GEMM's FP8 mode refused on the CPU. A step of emulated FP8 training under FSDP2:
tests/integration/test_fp8_cpu.py. Nothing here runs FP8 arithmetic on FP8 tensor cores."""

import pytest
import torch

from llmbench import grid
from llmbench.aggregate import Outcome, build_record
from llmbench.config import ConfigError
from llmbench.platforms import Platform
from llmbench.report import tidy
from llmbench.techniques import TechniqueError, parse
from llmbench.train import fsdp2_worker

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 32, "timeout_s": 300}


def pretrain(platform="h200", techniques=("FP8+Z3+C",), backend="fsdp2", model="llama2-7b"):
    block = {"backend": backend, "platforms": [platform], "models": [model], "techniques": list(techniques),
             "batch_sizes": [1], "gpus": [1]}
    return {"protocol": dict(PROTOCOL), "pretrain": [block]}


@pytest.mark.parametrize("text,name,recipe", [
    ("FP8+Z3+C", "Z3+C+FP8", "tensorwise"),
    ("C+FP8R+F+Z2", "F+Z2+C+FP8R", "rowwise"),
    ("FP8", "FP8", "tensorwise"),
    ("Z3", "Z3", None),
])
def test_the_fp8_flags_name_their_recipe_and_sort_last(text, name, recipe):
    tech = parse(text)
    assert (tech.name, tech.fp8) == (name, recipe)
    assert parse(tech.name) == tech


@pytest.mark.parametrize("text,needle", [
    ("FP8+FP8R+Z3", "both FP8 \\(tensorwise\\) and FP8R \\(rowwise\\)"),
    ("FP8+Q", "two formats of one weight"),
    ("QL+FP8", "two formats of one weight"),
    ("L+FP8+Z3", "pretrain blocks only"),
    ("fp8+Z3", "unknown flag 'fp8'"),
])
def test_contradictory_fp8_techniques_do_not_parse(text, needle):
    with pytest.raises(TechniqueError, match=needle):
        parse(text)


@pytest.mark.parametrize("platform", ["a800", "rtx3090", "rtx3090-nonvlink", "cpu"])
def test_fp8_is_refused_before_any_job_where_there_are_no_fp8_tensor_cores(platform):
    model = "tiny" if platform == "cpu" else "llama2-7b"
    with pytest.raises(ConfigError, match=(
            rf"pretrain\[0\]: cell pretrain/{platform}/{model}/fsdp2/Z3\+C\+FP8 asks for FP8 training, .*SM 8\.9\+.*"
            rf"platform '{platform}' has none \(no peak_fp8_tflops in config/platforms/{platform}\.yaml\)")):
        grid.expand(pretrain(platform, model=model))


@pytest.mark.parametrize("platform", ["h100", "h200", "h200x4", "rtx4090"])
def test_fp8_cells_expand_on_hopper_and_ada(platform):
    g = grid.expand(pretrain(platform, techniques=["FP8+Z3+C", "FP8R+Z3+C", "Z3+C"]))
    assert sorted(c.technique for c in g.cells) == ["Z3+C", "Z3+C+FP8", "Z3+C+FP8R"]
    assert all(c.record_path().endswith(f"/fsdp2/{c.technique}/bs1-g1/record.json") for c in g.cells)


def test_an_fp8_cell_whose_micro_batch_tokens_are_no_multiple_of_16_is_refused_before_any_job():
    """torch._scaled_mm takes a rank's micro-batch tokens as one dimension of the backward's
    weight-gradient GEMM, and wants it a multiple of 16: batch 1 at sequence 350 stopped a GPU
    cell there. The grid says so, naming the key, the batch and the batches that would run;
    a search probes only the batches that run (its step), and a step given that does not
    is refused the same way."""
    cfg = pretrain()
    cfg["protocol"]["seq_len"] = 350
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.batch_sizes: technique 'Z3\+C\+FP8' trains in FP8, .*"
                                          r"batch 1 x seq_len 350 = 350 tokens; .*multiples of 8"):
        grid.expand(cfg)
    cfg["pretrain"][0]["batch_sizes"] = [8]
    assert [c.batch_size for c in grid.expand(cfg).cells] == [8]
    cfg["pretrain"][0].update(batch_sizes=None, max_batch={"max": 70})
    (s,) = grid.expand(cfg).searches
    assert (s.step, s.start, s.max, s.to_dict()["step"]) == (8, 8, 64, 8)
    cfg["pretrain"][0]["max_batch"]["step"] = 4
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.max_batch\.step: .*a search probes multiples of its "
                                          r"step, and batch 4 x seq_len 350 = 1400 tokens; .*multiples of 8"):
        grid.expand(cfg)
    cfg["protocol"]["seq_len"] = 512
    (s,) = grid.expand(cfg).searches
    assert (s.step, s.start, s.max) == (4, 4, 68)
    del cfg["pretrain"][0]["max_batch"]["step"]
    (s,) = grid.expand(cfg).searches
    assert (s.step, s.max, "step" in s.to_dict()) == (1, 70, False)


def test_only_fp8_cells_specs_carry_the_fp8_peak():
    """Adding the FP8 peak to a platform file changes no bf16 cell's spec (the params rerun
    trigger): a measured bf16 cell does not run again."""
    g = grid.expand(pretrain("h200", techniques=["FP8+Z3+C", "Z3+C"]))
    specs = {c.technique: g.spec(c)["platform"] for c in g.cells}
    assert specs["Z3+C+FP8"]["peak_fp8_tflops"] == Platform.load("h200").peak_fp8_tflops > 0
    assert "peak_fp8_tflops" not in specs["Z3+C"] and "peak_fp8_source" not in specs["Z3+C"]


def test_deepspeed_refuses_fp8_and_says_which_backend_runs_it():
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.techniques\[0\]: backend 'deepspeed' supports the flags "
                                          r"F, R, Z2, Z3, O, Q, C; 'FP8\+Z3' asks for FP8 \(FP8 training "
                                          r"\(torchao\.float8\) runs with backend fsdp2"):
        grid.expand(pretrain("h200", techniques=["FP8+Z3"], backend="deepspeed"))


@pytest.mark.parametrize("technique", ["FP8+Z3+O", "FP8R+Z2+O"])
def test_fsdp2_refuses_fp8_with_offload(technique):
    with pytest.raises(ConfigError, match=r"backend 'fsdp2' does not run FP8R? with O"):
        grid.expand(pretrain("h200", techniques=[technique]))
    with pytest.raises(ValueError, match="CPU offload"):
        fsdp2_worker.plan(parse(technique), 1)


def test_tensorwise_gathers_in_fp8_and_precomputes_scales_rowwise_does_neither():
    tw, rw, bf = (fsdp2_worker.plan(parse(t), 2) for t in ("FP8+Z3+C", "FP8R+Z3+C", "Z3+C"))
    assert (tw.fp8, tw.fp8_all_gather, tw.fp8_precompute_scales) == ("tensorwise", True, True)
    assert (rw.fp8, rw.fp8_all_gather, rw.fp8_precompute_scales) == ("rowwise", False, False)
    assert (bf.fp8, bf.fp8_all_gather, bf.fp8_precompute_scales) == (None, False, False)
    assert "float8" in tw.description and "bf16" in rw.description and "FP8" not in bf.description


@pytest.mark.parametrize("module,fqn,converted", [
    (torch.nn.Linear(64, 64, device="meta"), "model.layers.0.self_attn.q_proj", True),
    (torch.nn.Linear(64, 172, device="meta"), "model.layers.0.mlp.gate_proj", False),  # 172 = 16 * 10 + 12
    (torch.nn.Linear(172, 64, device="meta"), "model.layers.0.mlp.down_proj", False),
    (torch.nn.Linear(64, 32000, device="meta"), "lm_head", False),
    (torch.nn.Embedding(32000, 64, device="meta"), "model.embed_tokens", False),
    (torch.nn.Linear(4096, 11008, device="meta"), "model.layers.31.mlp.up_proj", True),
])
def test_the_filter_keeps_decoder_linears_whose_dims_are_multiples_of_16(module, fqn, converted):
    assert fsdp2_worker.fp8_filter(module, fqn) is converted


@pytest.mark.parametrize("technique,granularity", [("FP8+Z3", "tensorwise"), ("FP8R+Z3", "axiswise")])
def test_the_tiny_models_attention_linears_are_converted_its_mlp_and_lm_head_stay_bf16(technique, granularity):
    """The tiny model's intermediate size (172) is no multiple of 16: its MLP stays bf16, as
    torchtitan's filter leaves it; q, k, v and o (64 x 64) convert."""
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear
    from transformers import LlamaForCausalLM

    from llmbench.models import ModelSpec

    spec = ModelSpec.load("tiny")
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(spec.hf_config(attn_implementation="sdpa"), dtype=torch.float32)
    plan = fsdp2_worker.plan(parse(technique), 1)
    converted = fsdp2_worker.convert_fp8(model, plan)
    fp8 = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert sorted(converted) == fp8
    assert fp8 == sorted(f"model.layers.{i}.self_attn.{p}_proj" for i in range(spec.num_hidden_layers)
                         for p in ("q", "k", "v", "o"))
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    q = model.model.layers[0].self_attn.q_proj
    assert q.config.cast_config_input.scaling_granularity.value == granularity
    assert q.config.enable_fsdp_float8_all_gather is plan.fp8_all_gather


def test_the_worker_refuses_fp8_on_a_cpu_before_building():
    with pytest.raises(ValueError, match=r"FP8 training needs a CUDA GPU with FP8 tensor cores \(SM 8\.9\+\); "
                                         r"this cell runs on 'cpu'"):
        fsdp2_worker.check_fp8_device("cpu", torch.device("cpu"))


def result(tokens_per_s):
    return {"tokens_per_s": tokens_per_s, "step_time_s": 1.0, "peak_mem_allocated_gib": 1.0,
            "peak_mem_reserved_gib": 1.0, "peak_rss_gib": 1.0, "total_params": 10, "trainable_params": 10,
            "trainable_desc": "all parameters", "attention": "sdpa[flash]", "global_batch_tokens": 32,
            "loss_last": 10.0, "versions": {}, "devices": {}}


def test_an_fp8_record_has_mfu_against_the_bf16_peak_and_beside_it_against_the_fp8_peak():
    g = grid.expand(pretrain("h200", techniques=["FP8+Z3+C", "Z3+C"]))
    recs = {c.technique: build_record(g.spec(c), [Outcome(status="ok", result=result(5000.0))], "t0", ["x"])
            for c in g.cells}
    fp8, bf16 = recs["Z3+C+FP8"].metrics, recs["Z3+C"].metrics
    h200 = Platform.load("h200")
    assert fp8.mfu == pytest.approx(bf16.mfu) and fp8.mfu > 0
    assert fp8.mfu_fp8_peak == pytest.approx(fp8.mfu * h200.peak_bf16_tflops / h200.peak_fp8_tflops)
    assert bf16.mfu_fp8_peak is None and "mfu_fp8_peak" not in bf16.mfu_formula
    assert f"{h200.peak_fp8_tflops} TFLOP/s" in fp8.mfu_formula
    # the tidy table carries both, recomputed by today's formula as its mfu is
    rows = {t: tidy.row(r, f"runs/{t}/record.json") for t, r in recs.items()}
    assert rows["Z3+C+FP8"]["mfu_fp8_peak"] == pytest.approx(
        rows["Z3+C+FP8"]["mfu"] * h200.peak_bf16_tflops / h200.peak_fp8_tflops)
    assert rows["Z3+C"]["mfu_fp8_peak"] is None


def micro(platform, dtype="float8_e4m3fn", shapes=((4096, 4096, 4096),)):
    return {"protocol": {}, "micro": [{"platforms": [platform], "gemm": {"dtype": dtype, "shapes": {"fp8-mlp": [list(s) for s in shapes]}}}]}


def test_the_fp8_gemm_is_refused_on_the_cpu_and_on_ampere_with_its_reason():
    for platform in ("cpu", "a800"):
        with pytest.raises(ConfigError, match=rf"micro\[0\]\.gemm\.dtype: float8_e4m3fn runs on FP8 tensor cores "
                                              rf"\(torch\._scaled_mm, CUDA SM 8\.9\+.*platform '{platform}' has none"):
            grid.expand(micro(platform))
    from llmbench.micro import gemm

    with pytest.raises(ValueError, match=r"torch\._scaled_mm needs a CUDA GPU with FP8 tensor cores \(SM 8\.9\+"):
        gemm.run([(64, 64, 64)], dtype="float8_e4m3fn", accelerator="cpu", warmup=0, iters=1, peak_tflops=None)
    with pytest.raises(ValueError, match="torch._scaled_mm needs a CUDA GPU"):
        gemm.best_matmul_tflops(64, 64, 64, dtype="float8_e4m3fn", accelerator="cpu", warmup=0, iters=1)


def test_the_fp8_gemm_expands_on_an_h200_with_its_peak_and_needs_n_and_k_multiples_of_16():
    g = grid.expand(micro("h200", shapes=((4109, 11008, 4096),)))  # M may be unaligned
    (cell,) = g.cells
    assert cell.params["dtype"] == "float8_e4m3fn"
    assert g.spec(cell)["platform"]["peak_fp8_tflops"] == Platform.load("h200").peak_fp8_tflops
    assert "peak_fp8_tflops" not in g.spec(grid.expand(micro("h200", dtype="bfloat16")).cells[0])["platform"]
    with pytest.raises(ConfigError, match=r"micro\[0\]\.gemm\.shapes\.fp8-mlp: dtype float8_e4m3fn needs N and K "
                                          r"multiples of 16 \(torch\._scaled_mm\); \[M, N, K\] = \[4096, 11000, 4100\]"):
        grid.expand(micro("h200", shapes=((4096, 11000, 4100),)))


def test_a_platform_with_an_fp8_peak_names_its_source_and_is_a_gpu():
    with pytest.raises(ValueError, match="peak_fp8_tflops needs peak_fp8_source"):
        Platform(**{**Platform.load("h200").to_dict(), "peak_fp8_source": None})
    with pytest.raises(ValueError, match="not accelerator 'cpu'"):
        Platform(**{**Platform.load("cpu").to_dict(), "peak_fp8_tflops": 100.0, "peak_fp8_source": "x"})
    assert not Platform.load("a800").supports_fp8 and Platform.load("rtx4090").supports_fp8


def test_an_fp8_gemm_is_never_the_ceiling_of_mfu_vs_gemm(tmp_path):
    """mfu_vs_gemm divides by the best bf16 GEMM measured on the platform: an FP8 GEMM twice as
    fast on the same machine must not halve every bf16 cell's share."""
    from llmbench import record
    from llmbench.record import Metrics, Record
    from llmbench.report import tidy

    g = grid.expand({"protocol": {"repeats": 1, "seq_len": 350},
                     "pretrain": [{"platforms": ["h200"], "models": ["llama2-7b"], "techniques": ["Z3"],
                                   "batch_sizes": [1], "gpus": [1]}],
                     "micro": [{"platforms": ["h200"], "gemm": {"shapes": {"bf16-mlp": [[2800, 11008, 4096]]}}},
                               {"platforms": ["h200"], "gemm": {"dtype": "float8_e4m3fn",
                                                                "shapes": {"fp8-mlp": [[2800, 11008, 4096]]}}}]})
    paths = []
    for cell in g.cells:
        spec = g.spec(cell)
        if cell.stage == "micro":
            best = 1400.0 if cell.params["dtype"] == "float8_e4m3fn" else 700.0
            r = Record(cell=cell.to_dict(), status="ok", summary={"best_tflops": best}, provenance={"spec": spec})
        else:
            r = Record(cell=cell.to_dict(), status="ok", metrics=Metrics(tokens_per_s_mean=1000.0),
                       provenance={"spec": spec})
        paths.append(tmp_path / cell.record_path("results"))
        record.write(r, paths[-1])
    df = tidy.build(paths)
    micro = df[df["stage"] == "micro"].set_index("case")
    assert micro.loc["fp8-mlp", "compute_dtype"] == "fp8" and micro.loc["bf16-mlp", "compute_dtype"] == "bf16"
    cell = df[df["stage"] == "pretrain"].iloc[0]
    assert cell["mfu_vs_gemm"] == pytest.approx(cell["model_tflops_per_gpu"] / 700.0)
