"""llmbench.profile: attribution on synthetic ops and events, the worker's checks and the
serving forward passes in this process. The worker under torchrun:
tests/integration/test_profile_worker.py."""

import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from llmbench.cells import Cell
from llmbench.models import ModelSpec
from llmbench.platforms import Platform
from llmbench.profile import attribution as attr
from llmbench.profile import worker
from llmbench.protocol import Protocol

CORE, BLOCK = attr.ATTENTION_CORE, attr.ATTENTION_BLOCK


def op(name, start, phase="forward", time=1.0, ranges=(), **kw):
    return attr.OpRecord(name=name, start_us=start, phase=phase, time_us=time, ranges=tuple(ranges), **kw)


def kinds(attributed):
    return [(a.op.name, a.kind) for a in attributed]


# --- classification -------------------------------------------------------------------

@pytest.mark.parametrize("name, gemm", [
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", True),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", True),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", True),
    ("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8>", True),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", True),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", False),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", False),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", False),
    ("void (anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float>", False),
])
def test_gemm_kernels_by_name(name, gemm):
    assert attr.is_gemm_kernel(name) is gemm


def test_op_classes():
    assert all(attr.is_matmul_op(n) for n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"))
    assert not any(attr.is_matmul_op(n) for n in ("aten::add", "aten::mul", "aten::_softmax"))
    assert attr.is_softmax_op("aten::_safe_softmax") and attr.is_softmax_op("aten::_softmax")
    assert not attr.is_softmax_op("aten::_log_softmax")
    fused = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
             "aten::_scaled_dot_product_cudnn_attention", "flash_attn::_flash_attn_forward")
    assert all(attr.is_fused_attention_op(n) for n in fused)
    # SDPA's entry point and its math kernel run the unfused parts as separate ops
    assert not attr.is_fused_attention_op("aten::scaled_dot_product_attention")
    assert not attr.is_fused_attention_op("aten::_scaled_dot_product_attention_math")


def test_modules_take_their_innermost_range_and_attention_splits_at_the_softmax():
    blk, core = (BLOCK, 1), (CORE, 2)
    ops = [
        op("aten::linear", 1, ranges=[blk, (attr.module_range("qkv"), 3)]),
        op("aten::view", 2, ranges=[blk]),                         # head reshape before the core
        op("aten::mul", 3, ranges=[blk, (attr.module_range("rope"), 4)]),
        op("aten::mul", 4, ranges=[blk, core]),                    # q * scale
        op("aten::matmul", 5, ranges=[blk, core]),                 # QK^T
        op("aten::bmm", 6, ranges=[blk, core]),
        op("aten::add_", 7, ranges=[blk, core]),                   # mask
        op("aten::_safe_softmax", 8, ranges=[blk, core]),
        op("aten::_softmax", 9, ranges=[blk, core]),
        op("aten::to", 10, ranges=[blk, core]),
        op("aten::matmul", 11, ranges=[blk, core]),                # PV
        op("aten::bmm", 12, ranges=[blk, core]),
        op("aten::transpose", 13, ranges=[blk, core]),
        op("aten::reshape", 14, ranges=[blk]),                     # after the core
        op("aten::linear", 15, ranges=[blk, (attr.module_range("output"), 5)]),
        op("aten::add", 16),                                       # residual: no module
        op("aten::_foreach_add_", 17, phase="optimizer"),
    ]
    got = [k for _, k in kinds(attr.assign(reversed(ops)))]       # order comes from start_us
    assert got == ["qkv", "qkv", "rope", "attn_scores", "attn_scores", "attn_scores", "attn_scores",
                   "softmax", "softmax", "softmax", "attn_values", "attn_values", "attn_values",
                   "output", "output", None, "optimizer"]


def test_a_fused_kernel_makes_its_whole_attention_call_fused_and_only_that_call():
    ops = [op("aten::transpose", 1, ranges=[(CORE, 1)]),
           op("aten::scaled_dot_product_attention", 2, ranges=[(CORE, 1)]),
           op("aten::_scaled_dot_product_flash_attention_for_cpu", 3, ranges=[(CORE, 1)]),
           op("aten::matmul", 4, ranges=[(CORE, 2)]),
           op("aten::softmax", 5, ranges=[(CORE, 2)]),
           op("aten::matmul", 6, ranges=[(CORE, 2)]),
           # a GPU library op that launched a flash kernel, whatever its name
           op("mylib::attn", 7, ranges=[(CORE, 3)], attention_kernel=True)]
    assert [k for _, k in kinds(attr.assign(ops))] == ["attention_fused"] * 3 + [
        "attn_scores", "softmax", "attn_values", "attention_fused"]


def test_backward_ops_map_to_the_forward_op_through_the_sequence_number():
    mlp, rope, core = (attr.module_range("mlp"), 1), (attr.module_range("rope"), 2), (CORE, 3)
    fwd = [op("aten::linear", 1, ranges=[mlp], seq=10, thread=1),
           op("aten::mm", 2, ranges=[mlp], seq=11, thread=1),
           # seq 12 is shared: an op that makes no node, then the one that does (starts last)
           op("aten::slice", 3, ranges=[rope], seq=12, thread=1),
           op("aten::matmul", 4, ranges=[core], seq=12, thread=1),
           op("aten::add", 5, seq=13, thread=1)]                   # residual, no module
    bwd = [op("aten::mm", 10, phase="backward", node=(1, 11)),
           op("aten::t", 11, phase="backward", node=(1, 10)),
           op("aten::bmm", 12, phase="backward", node=(1, 12)),
           op("aten::add_", 13, phase="backward", node=(1, 13)),
           op("aten::mul", 14, phase="backward", node=(2, 11)),    # another thread's numbering
           op("aten::detach", 15, phase="backward", node=None)]    # AccumulateGrad: no sequence number
    got = {(a.op.name, a.op.start_us): a.kind for a in attr.assign(fwd + bwd) if a.op.phase == "backward"}
    assert got == {("aten::mm", 10): "mlp", ("aten::t", 11): "mlp", ("aten::bmm", 12): "attn_scores",
                   ("aten::add_", 13): None, ("aten::mul", 14): None, ("aten::detach", 15): None}


def test_recomputed_forward_ops_in_backward_keep_their_module_and_are_flagged():
    mlp = (attr.module_range("mlp"), 1)
    ops = [op("aten::mm", 1, ranges=[mlp], seq=5, thread=1),
           op("aten::mm", 10, phase="backward", ranges=[(attr.module_range("mlp"), 9)], node=(1, 5), seq=40),
           op("aten::add", 11, phase="backward", node=(1, 5), seq=41),   # rerun residual add
           op("aten::mm", 12, phase="backward", node=(1, 5))]             # the gradient itself
    got = [(a.kind, a.recomputed) for a in attr.assign(ops)]
    assert got == [("mlp", False), ("mlp", True), (None, True), ("mlp", False)]


def test_aggregate_rows_sum_to_the_phase_wall_time_with_other_as_the_remainder():
    a = attr.assign([
        op("aten::mm", 1, time=300.0, gemm_us=300.0, ranges=[(attr.module_range("mlp"), 1)], seq=0),
        op("aten::silu", 2, time=100.0, ranges=[(attr.module_range("mlp"), 1)]),
        op("aten::add", 3, time=50.0),
        op("aten::mm", 10, phase="backward", time=800.0, gemm_us=800.0, node=(0, 0)),
        op("aten::mm", 11, phase="backward", time=200.0, gemm_us=200.0, ranges=[(attr.module_range("mlp"), 2)],
           seq=9),
        op("aten::_foreach_add_", 20, phase="optimizer", time=400.0),
        op("aten::mm", 30, phase=None, time=1e6),                # outside every phase: ignored
    ])
    walls = {"forward": 0.001, "backward": 0.0015, "optimizer": 0.0005}   # seconds per step
    rows, phases = attr.aggregate(a, walls, steps=2)
    by = {(r["phase"], r["module"]): r for r in rows}
    assert by[("forward", "mlp")]["time_s"] == pytest.approx(200e-6)        # 400 us over 2 steps
    assert by[("forward", "mlp")]["gemm_time_s"] == pytest.approx(150e-6)
    assert by[("forward", "other")]["time_s"] == pytest.approx(0.001 - 200e-6)
    assert by[("backward", "mlp")]["time_s"] == pytest.approx(500e-6)      # (800 + 200) / 2
    assert by[("backward", "mlp")]["recompute_s"] == pytest.approx(100e-6)
    assert by[("optimizer", "optimizer")]["share"] == pytest.approx(0.4)
    for phase, wall in walls.items():
        mine = [r for r in rows if r["phase"] == phase]
        assert mine[-1]["module"] == "other"
        assert sum(r["time_s"] for r in mine) == pytest.approx(wall, abs=1e-15)
        assert sum(r["share"] for r in mine) == pytest.approx(1.0, abs=1e-12)
    assert phases["forward"] == pytest.approx({"wall_s": 0.001, "kernel_s": 225e-6, "gemm_s": 150e-6,
                                               "attributed_s": 200e-6, "unattributed_kernel_s": 25e-6,
                                               "recompute_s": 0.0})
    assert phases["backward"]["gemm_s"] / phases["backward"]["wall_s"] == pytest.approx(500e-6 / 0.0015)
    assert phases["backward"]["recompute_s"] == pytest.approx(100e-6)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        attr.aggregate(a, walls, steps=0)


def test_gpu_rows_add_up_to_the_unprofiled_steps_and_cpu_rows_to_the_profiled_ones():
    """step_walls: on a GPU the settled warm-up steps (later half) set the phase walls, so the
    profiler's host cost stays out of 'other'; on a CPU, or with one warm-up step (the cold
    one), the profiled steps do. Marks: a step's start, then each phase's end."""
    def marks(f, b, o, t0=0.0):
        return [t0, t0 + f, t0 + f + b, t0 + f + b + o]

    warm = [marks(9.0, 9.0, 9.0), marks(5.0, 5.0, 5.0), marks(1.0, 2.0, 3.0), marks(3.0, 4.0, 5.0)]
    measured = [marks(4.0, 6.0, 4.0, t0=100.0), marks(6.0, 8.0, 4.0, t0=200.0)]
    walls, profiled, basis = attr.step_walls(warm, measured, attr.PHASES, use_device=True)
    assert basis == "unprofiled"
    assert walls == pytest.approx({"forward": 2.0, "backward": 3.0, "optimizer": 4.0})  # warm[2:] only
    assert profiled == pytest.approx({"forward": 5.0, "backward": 7.0, "optimizer": 4.0})
    assert attr.step_walls(warm, measured, attr.PHASES, use_device=False) == (profiled, profiled, "profiled")
    assert attr.step_walls(warm[:1], measured, attr.PHASES, use_device=True) == (profiled, profiled, "profiled")
    a = attr.assign([op("aten::mm", 1, time=1.5e6, gemm_us=1.5e6, ranges=[(attr.module_range("mlp"), 1)])])
    rows, _ = attr.aggregate(a, walls, steps=1)
    fwd = {r["module"]: r["time_s"] for r in rows if r["phase"] == "forward"}
    assert fwd == pytest.approx({"mlp": 1.5, "other": 0.5})  # adds up to the unprofiled forward


_ids = iter(range(1, 1 << 30))


def _event(name, start, end, parent=None, *, activity="cpu_op", scope=0, seq=-1, thread=1, fwd_thread=0,
           kernels=(), self_us=None, annotation=False, device="CPU", eid=None):
    e = NS(id=next(_ids) if eid is None else eid, name=name, time_range=NS(start=start, end=end), cpu_parent=parent, activity_type=activity, scope=scope,
           sequence_nr=seq, thread=thread, fwd_thread=fwd_thread, kernels=list(kernels), is_async=False,
           is_user_annotation=annotation, device_type=NS(name=device),
           self_cpu_time_total=(end - start) if self_us is None else self_us)
    return e


def test_op_records_from_profiler_events():
    """The shape of torch 2.13's FunctionEvents: ranges are user annotations, the engine's
    nodes carry sequence_nr and fwd_thread, ops carry their own kernels (GPU)."""
    ann = dict(activity="user_annotation", scope=7, annotation=True)
    # a range's kernels entry is kineto's gpu_user_annotation mirror of the range (named like
    # it, spanning the kernels launched in it), not a kernel: it must not count again
    fwd = _event("llmbench/phase/forward", 0, 100, **ann, kernels=[NS(name="llmbench/phase/forward", duration=40.0)])
    mlp = _event("llmbench/module/mlp", 10, 50, fwd, **ann, kernels=[NS(name="llmbench/module/mlp", duration=30.0)])
    mm = _event("aten::mm", 20, 30, mlp, seq=7, self_us=9.0,
                kernels=[NS(name="nvjet_tst_128x64", duration=5.0), NS(name="elementwise", duration=1.0)])
    # a kernel a range launched outside every op (a library calling CUDA directly) does count
    norm = _event("llmbench/module/rmsnorm", 60, 70, fwd, **ann,
                  kernels=[NS(name="llmbench/module/rmsnorm", duration=9.0), NS(name="triton_rms", duration=2.0)])
    bwd = _event("llmbench/phase/backward", 100, 200, **ann)
    node = _event("autograd::engine::evaluate_function: MmBackward0", 110, 150, bwd, seq=7, fwd_thread=1, thread=2)
    fn = _event("MmBackward0", 111, 149, node, scope=1, seq=7, fwd_thread=1, thread=2)
    gmm = _event("aten::mm", 115, 140, fn, thread=2, self_us=20.0, kernels=[NS(name="ampere_gemm", duration=8.0)])
    runtime = _event("cudaLaunchKernel", 117, 118, gmm, activity="cuda_runtime")
    device = dict(device="CUDA")
    on_device = [_event("nvjet_tst_128x64", 21, 26, activity="kernel", **device),
                 _event("elementwise", 26, 27, activity="kernel", **device),
                 _event("triton_rms", 62, 64, activity="kernel", **device),
                 _event("Memcpy HtoD", 80, 83, activity="gpu_memcpy", **device),  # no op launched it
                 _event("llmbench/module/mlp", 21, 51, activity="gpu_user_annotation", **device),
                 _event("ampere_gemm", 116, 124, activity="kernel", **device)]
    events = [fwd, mlp, mm, norm, bwd, node, fn, gmm, runtime] + on_device

    cpu = {r.start_us: r for r in attr.op_records(events, use_device=False)}
    assert set(cpu) == {20, 115}                       # ops only: no ranges, nodes, kernels, runtime calls
    assert (cpu[20].phase, cpu[20].ranges, cpu[20].seq, cpu[20].time_us, cpu[20].gemm_us) == (
        "forward", (("llmbench/module/mlp", id(mlp)),), 7, 9.0, 9.0)
    assert (cpu[115].phase, cpu[115].ranges, cpu[115].node, cpu[115].thread) == ("backward", (), (1, 7), 2)
    gpu = {r.start_us: r for r in attr.op_records(events, use_device=True)}
    assert set(gpu) == {20, 60, 115}                   # the rmsnorm range's own kernel; no mirrors
    assert (gpu[20].time_us, gpu[20].gemm_us, gpu[60].time_us, gpu[115].time_us) == (6.0, 5.0, 2.0, 8.0)
    assert [a.kind for a in sorted(attr.assign(gpu.values()), key=lambda a: a.op.start_us)] == ["mlp", "rmsnorm", "mlp"]
    # the independent total: device activities by phase, mirrors excluded, unlinked copies included
    assert attr.device_time(events) == {"forward": 5.0 + 1.0 + 2.0 + 3.0, "backward": 8.0}
    _, phases = attr.aggregate(attr.assign(gpu.values()), {"forward": 1e-4, "backward": 1e-4, "optimizer": 1e-4},
                               steps=1, device_us=attr.device_time(events))
    assert phases["forward"]["kernel_s"] == pytest.approx(8e-6) and phases["forward"]["device_s"] == pytest.approx(11e-6)
    assert phases["optimizer"]["device_s"] == 0.0


def test_op_records_without_activity_type():
    """torch 2.11's FunctionEvents have no activity_type: the parser hands an op's kernels
    to every CPU event with the op's id, kineto's own events (Buffer Flush) and runtime calls
    included (their ids come from another counter). Only the op may count them (the H100
    F cell's optimizer phase held 83.5 ms of kernels in 62.9 ms that way)."""
    ann = dict(activity="user_annotation", scope=7, annotation=True)
    opt = _event("llmbench/phase/optimizer", 0, 100, **ann)
    adam = _event("aten::_fused_adamw_", 10, 40, opt, kernels=[NS(name="multi_tensor_apply_kernel", duration=30.0)])
    copies = dict(kernels=list(adam.kernels), eid=adam.id)                  # the op's id, another counter's event
    flush = _event("Buffer Flush", 50, 60, **copies)
    request = _event("Activity Buffer Request", 61, 62, **copies)
    launch = _event("cudaLaunchKernel", 12, 13, adam, **copies)
    unknown = _event("Some New Kineto Event", 63, 64, **copies)              # no name rule knows it: the id does
    launch_ex = _event("cuLaunchKernelEx", 14, 15, adam)
    device = [_event("multi_tensor_apply_kernel", 20, 50, activity=None, device="CUDA"),
              _event("llmbench/phase/optimizer", 20, 50, activity=None, device="CUDA", annotation=True)]
    events = [opt, unknown, adam, flush, request, launch, launch_ex] + device
    for e in events:
        del e.activity_type
    gpu = attr.op_records(events, use_device=True)
    assert [(r.name, r.time_us) for r in gpu] == [("aten::_fused_adamw_", 30.0)]
    assert attr.device_time(events) == {"optimizer": 30.0}   # the annotation span is no device time


# --- the worker -----------------------------------------------------------------------

def test_only_f_and_r_are_profiled():
    assert worker.check_technique("F+R").recompute and worker.check_technique("Naive").flags == ()
    for name in ("Z3", "F+Z2", "R+Z3+O", "Q"):
        with pytest.raises(worker.UnsupportedTechnique, match=r"profile cells support the flags F and R \(plain PyTorch\); "
                           r"ZeRO, offload and 4-bit steps are profiled by kernel class with backend: deepspeed"):
            worker.check_technique(name)
    with pytest.raises(worker.UnsupportedTechnique, match="fine-tuning method L"):
        worker.check_technique("L")


def spec_for(technique: str) -> dict:
    cell = Cell(stage="profile", platform="cpu", model="tiny", backend="torch", technique=technique, batch_size=1,
                gpus=1, protocol=Protocol(warmup_steps=1, measured_steps=2, repeats=1, seq_len=64, timeout_s=300))
    platform = Platform.load("cpu").to_dict()
    platform.pop("slurm")
    return {"cell": cell.to_dict(), "platform": platform, "model": ModelSpec.load("tiny").to_dict()}


def test_a_zero_technique_is_rejected_before_anything_runs(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_for("Z3")))
    with pytest.raises(worker.UnsupportedTechnique, match="technique 'Z3' asks for Z3: profile cells support the flags F and R"):
        worker.main(["--spec", str(spec), "--out", str(tmp_path / "out.json")])
    assert list(tmp_path.iterdir()) == [spec]


def rows_of(result, phase):
    return {r["module"]: r for r in result["rows"] if r["phase"] == phase}


def test_kernel_classes_of_a_gpu_trace():
    """NCCL kernels by collective, memcpy by direction, the rest compute; unions, so kernels
    on two streams are not counted twice; exposed comm is what no compute kernel overlaps."""
    from llmbench.profile import kernels

    ev = [
        {"ph": "X", "cat": "kernel", "name": "ampere_bf16_gemm", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ts": 50, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_ReduceScatter_RING_LL_Sum_bf16", "ts": 120, "dur": 60},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 200, "dur": 40},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 300, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # host side: no class
        {"ph": "i", "cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 0},  # not a duration event
    ]
    b = kernels.breakdown(ev, steps=2, step_time_s=0.001, accelerator="cuda")
    assert b["comm_s_per_iter"] == pytest.approx(130e-6 / 2)  # [50, 180) as one union
    assert b["comm_AllReduce_s_per_iter"] == pytest.approx(50e-6) and b["comm_ReduceScatter_s_per_iter"] == pytest.approx(30e-6)
    assert b["comm_exposed_s_per_iter"] == pytest.approx(80e-6 / 2)  # [100, 180): no compute over it
    assert b["memcpy_s_per_iter"] == pytest.approx(30e-6) and b["memcpy_DtoH_s_per_iter"] == pytest.approx(20e-6)
    assert b["compute_share"] == pytest.approx(50e-6 / 0.001)
    assert set(b) - {"kernel_steps", "kernel_source"} <= set(kernels.COLUMNS)


def test_kernel_classes_of_a_cpu_gloo_trace():
    from llmbench.profile import kernels

    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 5, "dur": 300},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_gather", "ts": 400, "dur": 100},
    ]
    b = kernels.breakdown(ev, steps=1, step_time_s=0.002, accelerator="cpu")
    assert b["comm_s_per_iter"] == pytest.approx(400e-6) and b["comm_share"] == pytest.approx(0.2)
    assert b["memcpy_s_per_iter"] is None and "compute_s_per_iter" not in b  # no device on a CPU


def test_comm_table_puts_the_papers_tables_xiv_xv_xvi_beside_ours(tmp_path):
    import pandas as pd

    from llmbench.report import profile, tidy

    def row(tech, **kv):
        r = {k: None for k in tidy.ALL_COLUMNS}
        r.update(stage="profile", backend="deepspeed", status="ok", platform="a800", model="llama2-7b",
                 technique=tech, batch_size=32, gpus=8, kernel_step_time_s=10.0, comm_s_per_iter=4.0, comm_share=0.4,
                 memcpy_s_per_iter=0.5, memcpy_share=0.05, **kv)
        return r

    df = pd.DataFrame([row("F+R+Z2+O"), row("R+Z3"), row("F", comm_AllReduce_s_per_iter=0.2, comm_AllReduce_share=0.4),
                       {**row("Naive"), "backend": "torch"}])
    built = profile.comm(df)
    table = built.long
    assert len(table) == 3  # the torch profile cell is the module-wise tables'
    z2 = table[table.technique == "F+R+Z2+O"].iloc[0]
    assert (z2.paper_memcpy_s, z2.paper_comm_pct, z2.comm_pct) == (0.596, 41.8, 40.0)
    assert table[table.technique == "R+Z3"].iloc[0].paper_comm_s == 4.576
    f = table[table.technique == "F"].iloc[0]
    assert f.paper_allreduce_pct == 44.97 and f.allreduce_pct == 40.0 and pd.isna(f.paper_comm_s)
    from llmbench.report import figures, render

    assert render.markdown(built).startswith("### Tables XIV, XV, XVI")
    # the figure reads the table's CSV, as the workflow does
    render.write(built, tmp_path / "profile-comm.csv", tmp_path / "profile-comm.md")
    out = figures.save(figures.CHARTS["profile-comm"]({"profile-comm": render.read_csv(tmp_path / "profile-comm.csv")}),
                       tmp_path / "comm")
    assert out[1].read_text().lstrip().startswith("<svg") and "F+R+Z2+O" in out[0].read_text()


def test_inference_passes_break_down_into_prefill_and_decode(tmp_path):
    """Serving forward passes of the tiny model (backend inference): a prefill and decode
    steps with the KV cache, each phase's rows adding up to its wall time; R is refused."""
    spec = spec_for("Naive")
    spec["cell"].update(backend="inference", batch_size=4,
                        protocol={**spec["cell"]["protocol"], "measured_steps": 3, "seq_len": 16})
    res = worker.run_inference(spec, tmp_path / "repeat-0.json", tmp_path)
    assert set(res["phases"]) == {"prefill", "decode"} and res["decode_steps"] == 3
    for phase in ("prefill", "decode"):
        rows = rows_of(res, phase)
        assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0, abs=1e-6)
        assert {"embedding", "qkv", "attn_scores", "softmax", "mlp", "lm_head"} <= set(rows), phase
        assert "loss" not in rows and "optimizer" not in rows
    assert res["tokens_per_s"] > 0 and Path(res["trace"]).exists()
    spec["cell"]["technique"] = "R"
    with pytest.raises(worker.UnsupportedTechnique, match="no backward pass"):
        worker.run_inference(spec, tmp_path / "r.json", tmp_path)
