"""Serving cells in the grid: expansion, paths, and bad input named before any job."""

import copy

import pytest

from llmbench import grid
from llmbench.config import ConfigError
from llmbench.grid import ServeCell, cell_from_dict
from llmbench.serve.engines import ENGINES, Launch

BURST = {"mode": "burst", "num_requests": 1000, "input_len": 512, "output_len": 64}
BASE = {
    "protocol": {"seed": 3},
    "serve": [{"platforms": ["cpu"], "models": ["tiny"], "engines": ["vllm", "transformers"],
               "loads": {"burst": BURST, "small": {**BURST, "num_requests": 8}}}],
}


def cfg(**block):
    c = copy.deepcopy(BASE)
    c["serve"][0].update(block)
    return c


def test_serve_cells_are_the_cartesian_product_with_their_own_paths():
    g = grid.expand(cfg())
    assert len(g.cells) == 4 and all(isinstance(c, ServeCell) for c in g.cells)
    c = g.find(platform="cpu", model="tiny", engine="vllm", load="burst", gpus="1")
    assert c.record_path("results") == "results/runs/serve/cpu/tiny/vllm/burst-g1/record.json"
    assert c.load_spec["warmup_requests"] == 4 and c.load_spec["mode"] == "burst"  # schema defaults
    assert c.seed == 3 and c.max_model_len == 576
    assert cell_from_dict(c.to_dict()) == c


def test_serve_and_training_cells_live_in_one_grid():
    c = cfg()
    c["pretrain"] = [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"], "batch_sizes": [1]}]
    g = grid.expand(c)
    assert {x.stage for x in g.cells} == {"pretrain", "serve"}
    assert g.find(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed", technique="Naive",
                  batch_size=1, gpus=1).stage == "pretrain"
    with pytest.raises(KeyError):
        g.find(platform="cpu", model="tiny", engine="tgi", load="burst", gpus="1")


def test_spec_carries_the_engine_interpreter():
    c = cfg()
    c["engine_python"] = {"vllm": "/opt/vllm/bin/python"}
    g = grid.expand(c)
    vllm = g.find(platform="cpu", model="tiny", engine="vllm", load="burst", gpus=1)
    tf = g.find(platform="cpu", model="tiny", engine="transformers", load="burst", gpus=1)
    assert g.spec(vllm)["engine_python"] == "/opt/vllm/bin/python" and g.spec(tf)["engine_python"] is None


def test_gpu_engines_default_to_the_node_and_single_gpu_engines_to_one():
    g = grid.expand(cfg(platforms=["a800"], engines=["vllm", "lightllm", "tgi", "transformers"]))
    gpus = {c.engine: c.gpus for c in g.cells}
    assert gpus == {"vllm": 8, "lightllm": 8, "tgi": 8, "transformers": 1}


@pytest.mark.parametrize("edit,needle", [
    (dict(engines=["sglang"]), "serve[0].engines[0]: 'sglang' is not allowed; allowed values: 'vllm', 'lightllm', 'tgi', 'transformers'"),
    (dict(engines=["lightllm"]), "serve[0].engines[0]: engine 'lightllm' runs on cuda, platform 'cpu' is cpu"),
    (dict(engines=["tgi"]), "serve[0].engines[0]: engine 'tgi' runs on cuda, platform 'cpu' is cpu"),
    (dict(engines=["transformers"], weights="dummy"), "serve[0].weights: 'dummy' needs an engine that makes its own weights"),
    (dict(loads={"Burst!": BURST}), "serve[0].loads: 'Burst!' does not match"),
    (dict(loads={"p": {**BURST, "mode": "poisson"}}), "serve[0].loads.p.rate_per_s: required when mode is 'poisson'"),
    (dict(loads={"b": {**BURST, "num_requests": 0}}), "serve[0].loads.b.num_requests: 0 is less than the minimum of 1"),
    (dict(loads={"b": {**BURST, "output_tokens": 3}}), "serve[0].loads.b: unknown key(s) 'output_tokens'"),
    (dict(models=["gpt2"]), "serve[0].models[0]: unknown model 'gpt2'"),
    (dict(engines=["transformers"], gpus=2), "serve[0].gpus: engine 'transformers' has no tensor parallelism"),
])
def test_bad_serving_config_names_the_key(edit, needle):
    with pytest.raises(ConfigError) as exc:
        grid.expand(cfg(**edit))
    assert needle in str(exc.value)


def test_launch_commands_are_argument_lists_with_the_cell_settings(tmp_path):
    x = Launch(model_dir=tmp_path, served_name="tiny", host="127.0.0.1", port=4321, gpus=2, accelerator="cuda",
               python="/py", dummy_weights=True, max_model_len=576, max_num_seqs=1000, extra_args=("--foo", "a b"))
    vllm = ENGINES["vllm"].command(x)
    assert vllm[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"] and vllm[-2:] == ["--foo", "a b"]
    assert {"--load-format", "dummy", "--tensor-parallel-size", "2", "--max-model-len", "576"} <= set(vllm)
    assert ENGINES["tgi"].command(x)[0] == "text-generation-launcher" and "--num-shard" in ENGINES["tgi"].command(x)
    light = ENGINES["lightllm"].command(x)
    assert light[light.index("--tp") + 1] == "2" and light[light.index("--model_dir") + 1] == str(tmp_path)
    for engine in ENGINES.values():
        argv = engine.command(x)
        assert all(isinstance(a, str) for a in argv)
        assert "127.0.0.1" in argv and "4321" in argv


def test_random_weights_are_transformers_init_and_independent_of_threads(tmp_path):
    """The model directory's weights: RMSNorm weights 1, the rest N(0, initializer_range);
    filled one tensor per thread, the same values whatever the thread count."""
    from safetensors.torch import load_file

    from llmbench.models import ModelSpec
    from llmbench.serve import model_dir

    spec = ModelSpec.load("tiny")
    weights = []
    for threads in (1, 3):
        out = model_dir.build(spec, tmp_path / f"t{threads}", threads=threads)
        weights.append({k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()})
    one, three = weights
    assert one.keys() == three.keys() and all((one[k] == three[k]).all() for k in one)
    norms = [k for k in one if k.endswith("norm.weight")]
    assert norms and all((one[k] == 1).all() for k in norms)
    q = one["model.layers.0.self_attn.q_proj.weight"].float()
    std = spec.hf_config().initializer_range
    assert abs(float(q.std()) - std) < 0.1 * std and abs(float(q.mean())) < 0.1 * std
    assert not (one["model.layers.0.self_attn.q_proj.weight"] == one["model.layers.1.self_attn.q_proj.weight"]).all()
