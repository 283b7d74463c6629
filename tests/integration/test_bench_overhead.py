"""tests/bench_overhead.py runs on the CPU: the pipeline's L cell through the
launcher and the plain loop's variants in a child of their own, on the tiny model. Its
numbers are a benchmark's and are not asserted; what is checked is that every side ran
the same model and that each ratio is computed from windows that were timed."""

import dataclasses
import json
import subprocess
import sys

import pytest

from conftest import REPO


def test_the_overhead_benchmark_runs_the_cell_and_every_plain_variant_on_the_cpu(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "bench_overhead.py"), "--model", "tiny", "--device", "cpu",
         "--techniques", "L", "--batch", "1", "--warmup", "1", "--steps", "2", "--threads", "1",
         "--timeout-s", "300", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["technique"], r["batch"], r["status"]) for r in rows] == [("L", 1, "ok")]
    row = rows[0]
    # tiny: 2 decoder layers x 7 adapted linears x (A, B)
    assert row["trainable_tensors"] == 28
    plain, cell = row["plain_rounds"][0], row["cell_rounds"][0]
    assert plain["trainable_params"] == cell["trainable_params"] > 0
    tps = plain["variants_tokens_per_s"]
    assert set(tps) == {"plain", "plain_first", "plain_last", "overflow", "master"}
    assert all(v > 0 for v in tps.values())
    assert plain["tokens_per_s"] == (tps["plain_first"] + tps["plain_last"]) / 2
    assert row["cell_over_plain"] == cell["tokens_per_s"] / plain["tokens_per_s"]
    assert row["overflow_over_plain"] == tps["overflow"] / tps["plain"]
    assert "master_over_plain" in proc.stdout  # the printed table has every ratio
    assert "plain_cv" in proc.stdout and row["plain_cv"] is None is row["cell_cv"]  # one round: no spread


def test_the_spread_over_rounds_is_the_ok_rounds_coefficient_of_variation():
    """plain_cv and cell_cv: sample standard deviation over the mean of the ok rounds' tokens/s
    (each round a process, as the protocol's repeats), None under two ok rounds."""
    sys.path.insert(0, str(REPO / "tests"))
    import bench_overhead

    ok = [{"status": "ok", "tokens_per_s": v} for v in (90.0, 100.0, 110.0)]
    assert bench_overhead.cv(ok + [{"status": "error", "reason": ["x"]}]) == pytest.approx(10.0 / 100.0)
    assert bench_overhead.cv(ok[:1]) is None


def test_an_unknown_variant_is_refused_by_name():
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "bench_overhead.py"), "--variants", "plain,fast"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--variants" in proc.stderr and "'plain,fast'" in proc.stderr


def test_the_searched_batch_is_the_committed_searchs_answer_at_the_benchmarks_sequence_length(tmp_path):
    """--batch searched reads each technique's largest batch from the reference runs'
    max-batch searches (the one the report reads), only from a search that probed the
    benchmark's sequence length, and names the technique where there is none."""
    sys.path.insert(0, str(REPO / "tests"))
    import bench_overhead

    def search(run, technique, seq_len, largest, status="ok"):
        f = tmp_path / run / f"runs/search/finetune/cpu/tiny/deepspeed/{technique}-g1"
        (f / "bs2").mkdir(parents=True)
        (f / "search.json").write_text(json.dumps({"status": status, "largest_ok": largest, "n_probes": 1,
                                                   "probes": [{"batch_size": largest, "status": "ok"}]}))
        (f / "bs2" / "record.json").write_text(json.dumps({"cell": {"protocol": {"seq_len": seq_len}}}))

    search("2026-01-01-a", "L", 350, 6)
    search("2026-01-02-b", "L", 512, 3)  # another sequence length: not this benchmark's cell
    search("2026-01-01-a", "QL", 350, 9, status="error")
    spec = lambda t: bench_overhead.cell_spec(t, "tiny", "cpu", 1, 1, 2, 350, 300)  # noqa: E731
    assert bench_overhead.searched_batch(spec("L"), tmp_path) == 6
    with pytest.raises(ValueError, match=r"no max-batch search of QL \(tiny on cpu, seq 350\)"):
        bench_overhead.searched_batch(spec("QL"), tmp_path)  # its search stopped at an error: no answer
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "bench_overhead.py"), "--batch", "searched",
                           "--techniques", "L,Q", "--reference", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    # refused before anything runs: Q has no search there
    assert proc.returncode == 2 and "no max-batch search of Q (tiny on cpu, seq 350)" in proc.stderr, proc.stderr


def test_on_a_gpu_the_platform_is_the_one_whose_gpu_name_the_gpu_has(monkeypatch):
    """Without --platform a CUDA run takes the platform its GPU is (an H200's run was once
    labelled h100, the old fixed default); a --platform the GPU is not is refused by name,
    as a pipeline cell on the wrong GPU is (llmbench.gpus.wrong_gpu_reason)."""
    sys.path.insert(0, str(REPO / "tests"))
    import bench_overhead
    from llmbench import gpus

    assert bench_overhead.gpu_platform(["NVIDIA H200"]) == "h200"  # not h200x4 or h200x8
    assert bench_overhead.gpu_platform(["NVIDIA H100 80GB HBM3"]) == "h100"
    with pytest.raises(ValueError, match="Tesla T4"):
        bench_overhead.gpu_platform(["Tesla T4"])
    h200 = gpus.GpuInfo(id="0", name="NVIDIA H200", total_gib=140.4, used_gib=0.6, free_gib=139.8)
    monkeypatch.setattr(gpus, "read_nvml", lambda ids: [h200])
    assert bench_overhead.platform_for("cuda", None) == ("h200", [h200.to_dict()])
    with pytest.raises(ValueError, match="--platform h100: wrong GPU: GPU 0 is 'NVIDIA H200'"):
        bench_overhead.platform_for("cuda", "h100")
    assert bench_overhead.platform_for("cpu", None) == ("cpu", [])
    # a run over several ranks reads every GPU its ranks take (bench_fsdp2 --gpus 2 read one)
    asked = []
    monkeypatch.setattr(gpus, "read_nvml", lambda ids: asked.append(ids) or [h200, dataclasses.replace(h200, id="1")])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_STEP_GPUS", raising=False)
    monkeypatch.delenv("SLURM_JOB_GPUS", raising=False)
    platform, state = bench_overhead.platform_for("cuda", None, 2)
    assert (platform, [g["id"] for g in state], asked) == ("h200", ["0", "1"], [["0", "1"]])
