"""The platform's compute dtype through real DeepSpeed cells on the tiny model: bf16 (the
paper's, DeepSpeed's bf16 mode) or fp32 (the CPU platform, where bf16 matmuls are emulated).
ZeRO-3 builds its model under zero.Init, which on a CPU once turned fp32 into bf16. The
dtype's keys: tests/unit/test_dtype.py."""
import pytest

from llmbench import grid, launch

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 64, "timeout_s": 600}


@pytest.mark.parametrize("dtype, short", [("float32", "fp32"), ("bfloat16", "bf16")])
def test_cells_train_in_the_platforms_dtype(tmp_path, dtype, short):
    g = grid.expand({"protocol": PROTOCOL, "pretrain": [
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z2", "Z3", "Q"], "batch_sizes": [1]}]})
    for c in g.cells:
        spec = g.spec(c)
        spec["platform"]["compute_dtype"] = dtype
        rec = launch.run_cell(spec, tmp_path / f"{c.technique}.json", tmp_path / f"{c.technique}.log", threads=2)
        assert rec.status == "ok", rec.reason
        assert rec.metrics.compute_dtype == short
        # each measured step's time is kept (the spread within a repeat beside the repeats')
        assert rec.samples["step"] == [0, 1] and all(t > 0 for t in rec.samples["step_time_s"])
        assert rec.provenance["ds_config"]["bf16"]["enabled"] is (dtype == "bfloat16")
        # rank 0 said each phase in the cell's log as it passed it (what a killed repeat leaves)
        said = [line.split()[2] for line in (tmp_path / f"{c.technique}.log").read_text().splitlines()
                if line.startswith("llmbench: phase ")]
        assert said == ["imports", "init_distributed", "build", "window", "after_window"]
        if c.technique == "Q":
            assert f"{short} compute" in rec.metrics.trainable_desc
