"""C (torch.compile of every decoder layer): real DeepSpeed cells on the tiny model."""
import pytest

from llmbench import grid, launch

PROTOCOL = {"warmup_steps": 2, "measured_steps": 3, "repeats": 1, "seq_len": 64, "timeout_s": 600}


def run(tmp_path, stage, techniques):
    g = grid.expand({"protocol": PROTOCOL, stage: [
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": techniques, "batch_sizes": [1]}]})
    return {c.technique: launch.run_cell(g.spec(c), tmp_path / f"{c.technique}.json", tmp_path / f"{c.technique}.log",
                                         threads=2) for c in g.cells}


def test_compiled_layers_are_one_graph_and_train_like_eager(tmp_path):
    recs = run(tmp_path, "pretrain", ["R+Z2", "R+Z2+C"])
    eager, compiled = recs["R+Z2"], recs["R+Z2+C"]
    assert eager.status == compiled.status == "ok", (eager.reason, compiled.reason)
    def without_phases(summary):
        # where each repeat's time went (scenario.Phases) and what the host's CPUs did over its
        # window (protocol.host_cpu): every cell has them
        return {k: v for k, v in summary.items() if not k.startswith(("phase_", "window_"))}

    assert without_phases(eager.summary) == {}
    assert {"phase_imports_s", "phase_build_s", "phase_window_s", "window_cpu_steal_pct",
            "window_process_cpu_s", "window_gc_s", "window_gc_full_collections"} <= set(eager.summary)
    # both layers of the tiny model compiled, sharing one graph, with no break inside it
    assert without_phases(compiled.summary) == {"compiled_layers": 2, "compile_unique_graphs": 1,
                                                "compile_graph_breaks": 0}
    # same seed, same data: the compiled step computes the eager one's loss (rounding apart)
    assert compiled.metrics.loss_last == pytest.approx(eager.metrics.loss_last, rel=1e-3)


def test_compiled_lora_keeps_the_base_frozen(tmp_path):
    rec = run(tmp_path, "finetune", ["L+C"])["L+C"]
    assert rec.status == "ok", rec.reason
    assert rec.metrics.frozen_params_unchanged is True
    assert rec.summary["compiled_layers"] == 2 and rec.summary["compile_graph_breaks"] == 0
