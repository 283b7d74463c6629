"""llmbench.profile.engine_trace on a synthetic vLLM trace: kernel classes by name, kernels
assigned to the engine step whose GPU range holds their start, per-phase ms per step."""

import csv
import gzip
import json

from llmbench.profile import engine_trace as et


def k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def step(ctx, gen, ts, dur):
    return {"ph": "X", "cat": "gpu_user_annotation", "ts": ts, "dur": dur,
            "name": f"execute_context_{ctx}({ctx * 512})_generation_{gen}({gen})"}


EVENTS = [
    step(2, 0, 0, 1000),  # a prefill step of 2 requests
    k("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN", 0, 600),
    k("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>", 600, 200),
    k("triton_red_fused_fused_add_rms_norm_0", 800, 50),
    step(0, 2, 2000, 100), step(0, 2, 3000, 100),  # two decode steps
    k("sm90_xmma_gemm_bf16bf16_bf16f32", 2000, 20), k("flash_fwd_splitkv_kernel", 2020, 60),
    k("triton_poi_fused_add_cat_index_select_mul_split_split_with_sizes_sub_unsqueeze_view_3", 2080, 10),
    k("void vllm::reshape_and_cache_flash_kernel<bf16>", 3000, 10), k("triton_poi_fused_mul_silu_slice_1", 3010, 30),
    k("Memcpy HtoD (Pageable -> Device)", 3050, 5, cat="gpu_memcpy"),
    k("_gumbel_sample_kernel", 5000, 10),  # outside every step: totals only
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host ops are not device time
]


def test_kernel_classes_by_name():
    assert et.kernel_class("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT") == "gemm"
    assert et.kernel_class("void cublasLt::splitKreduce_kernel<32, 16>") == "gemm"
    assert et.kernel_class("void cutlass::device_kernel<flash::FlashAttnFwdCombine<>>") == "attention"
    assert et.kernel_class("triton_red_fused__to_copy_embedding_rms_norm_0") == "rmsnorm"
    assert et.kernel_class("triton_poi_fused_add_cat_index_select_mul_split_view_1") == "rope"
    assert et.kernel_class("void vllm::reshape_and_cache_flash_kernel<>") == "kv_cache"
    assert et.kernel_class("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "comm"
    assert et.kernel_class("triton_poi_fused_mul_silu_slice_1") == "element_wise"


def test_totals_and_phases():
    s = et.summarize(EVENTS)
    assert abs(s["busy_s"] - 995e-6) < 1e-12  # 850 + 90 + 45 + 10 microseconds
    assert s["classes"]["gemm"]["kernels"] == 2 and s["classes"]["sampling"]["kernels"] == 1
    pre, dec = s["phases"]["prefill"], s["phases"]["decode"]
    assert pre["steps"] == 1 and pre["requests_per_step"] == 2 and pre["prefill_tokens_per_step"] == 1024
    assert {c: round(v, 9) for c, v in pre["ms"].items()} == {"gemm": 0.6, "attention": 0.2, "rmsnorm": 0.05}
    assert abs(pre["other_ms"] - 0.15) < 1e-9  # a 1 ms step, 0.85 ms busy
    assert dec["steps"] == 2 and abs(dec["wall_ms"] - 0.1) < 1e-12
    # per step: (20 + 0) / 2 us of GEMM, (60 + 0) / 2 of attention, ...
    want = {"gemm": 0.01, "attention": 0.03, "kv_cache": 0.005, "rope": 0.005, "element_wise": 0.015,
            "memcpy": 0.0025}
    assert dec["ms"].keys() == want.keys()
    assert all(abs(dec["ms"][c] - v) < 1e-12 for c, v in want.items())
    assert "sampling" not in dec["ms"]


def test_cli_table_with_the_papers_rows(tmp_path):
    trace = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(trace, "wt") as fh:
        json.dump({"traceEvents": EVENTS}, fh)
    paper = tmp_path / "paper.csv"
    paper.write_text("table,view,group,parent,time_ms,pct,note\nX,kernels,gemm,comp,9.4,18.4,\n"
                     "XI,timeline,ffn,transformer,12.47,24.4,\nX,kernels,other,,3.81,7.55,\n")
    out = tmp_path / "t.csv"
    assert et.main([str(trace), "--paper", str(paper), "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    gemm = next(r for r in rows if r["phase"] == "decode" and r["part"] == "gemm")
    assert float(gemm["pct"]) == 10.0 and gemm["paper_ms"] == "9.4"
    other = next(r for r in rows if r["phase"] == "prefill" and r["part"] == "other")
    assert other["paper_pct"] == "7.55"
    assert next(r for r in rows if r["part"] == "kv_cache")["paper_ms"] == ""
