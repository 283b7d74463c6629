"""A Poisson sweep on a real engine (vLLM's CPU build, the tiny model): each rate is a
serving cell of its own, each with a fresh engine; the serving table keeps them apart as
points, gives their goodput, and the sweep figure draws them (issue 17's curve, on CPU)."""

from __future__ import annotations

import pandas as pd
import psutil
import pytest
import yaml
from conftest import make_workspace, snakemake

pytestmark = pytest.mark.e2e

RATES = (4, 16)
CONFIG = {
    "results_dir": "results",
    "protocol": {"seed": 0},
    "engine_python": {"vllm": ".venv-vllm/bin/python"},
    "serve": [{
        "name": "a small Poisson sweep on vLLM (CPU build, dummy weights)",
        "platforms": ["cpu"], "models": ["tiny"], "engines": ["vllm"], "weights": "dummy",
        "loads": {f"poisson-{r}": {"mode": "poisson", "rate_per_s": r, "num_requests": 32, "input_len": 128,
                                   "output_len": 16, "ttft_target_s": 5.0, "tpot_target_s": 1.0} for r in RATES},
    }],
}


def test_a_poisson_sweep_runs_and_is_tabled_and_plotted(tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("sweep"))
    if not (ws / ".venv-vllm").exists():
        pytest.skip("vLLM's CPU build (.venv-vllm, made by envs/setup.sh) is not here")
    (ws / "sweep.yaml").write_text(yaml.safe_dump(CONFIG))
    res = snakemake(ws, "--configfile", "sweep.yaml", "--cores", "2", "results/tables/serving.csv",
                    "results/figures/serve-sweep.svg")
    assert res.returncode == 0, res.stderr[-4000:]
    t = pd.read_csv(ws / "results/tables/serving.csv")
    assert sorted(t["rate_per_s"]) == list(RATES) and (t["status"] == "ok").all()
    assert (t["failed"] == 0).all() and (t["completed"] == 32).all()
    assert ((t["goodput_share"] >= 0) & (t["goodput_share"] <= 1)).all()
    assert (t["goodput_ttft_target_s"] == 5.0).all() and (t["goodput_tpot_target_s"] == 1.0).all()  # the load's own targets
    assert (t["output_tokens_per_s"] > 0).all()
    assert "offered requests/s" in (ws / "results/figures/serve-sweep.svg").read_text()
    # every engine stopped with its cell
    left = [p for p in psutil.process_iter(["cmdline"]) if "vllm.entrypoints" in " ".join(p.info["cmdline"] or [])
            and str(ws) in " ".join(p.info["cmdline"] or [])]
    assert not left
