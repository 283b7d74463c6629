"""Serving cells in the grid: expansion, paths, and bad input named before any job."""

import copy
import dataclasses
import sys

import pytest

from llmbench import grid
from llmbench.config import ConfigError
from llmbench.cells import ServeCell, cell_from_dict
from llmbench.serve.engines import ENGINES, SETTINGS, Launch, with_extra

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
    c["engine_python"] = {"vllm": sys.executable}
    g = grid.expand(c)
    vllm = g.find(platform="cpu", model="tiny", engine="vllm", load="burst", gpus=1)
    tf = g.find(platform="cpu", model="tiny", engine="transformers", load="burst", gpus=1)
    assert g.spec(vllm)["engine_python"] == sys.executable and g.spec(tf)["engine_python"] is None


def test_an_engine_interpreter_that_does_not_exist_is_rejected_naming_the_key(tmp_path):
    c = cfg()
    c["engine_python"] = {"vllm": str(tmp_path / "no-venv/bin/python")}
    with pytest.raises(ConfigError, match=r"^engine_python\.vllm: '.*no-venv/bin/python' is not an executable"):
        grid.check_engine_python(grid.expand(c))
    c["engine_python"] = {"vllm": "no-such-python-on-path"}
    with pytest.raises(ConfigError, match="engine_python.vllm: 'no-such-python-on-path' is not an executable"):
        grid.check_engine_python(grid.expand(c))
    c["engine_python"] = {"tgi": str(tmp_path / "nothing"), "vllm": "python3"}  # no tgi cell: not checked
    grid.check_engine_python(grid.expand(c))


def test_a_load_past_the_models_positions_is_rejected_naming_the_load():
    c = cfg()
    c["serve"][0]["loads"] = {"long": {"mode": "burst", "num_requests": 1, "input_len": 4000, "output_len": 128}}
    with pytest.raises(ConfigError, match=r"serve\[0\]\.loads\.long: input_len \+ output_len = 4128 is past"):
        grid.expand(c)


def test_gpu_engines_default_to_the_node_and_single_gpu_engines_to_one():
    g = grid.expand(cfg(platforms=["a800"], engines=["vllm", "lightllm", "tgi", "sglang", "transformers"]))
    gpus = {c.engine: c.gpus for c in g.cells}
    assert gpus == {"vllm": 8, "lightllm": 8, "tgi": 8, "sglang": 8, "transformers": 1}


@pytest.mark.parametrize("edit,needle", [
    (dict(engines=["trtllm"]), "serve[0].engines[0]: 'trtllm' is not allowed; allowed values: 'vllm', 'lightllm', 'tgi', 'sglang', 'transformers'"),
    (dict(engines=["sglang"]), "serve[0].engines[0]: engine 'sglang' runs on cuda, platform 'cpu' is cpu"),
    (dict(engines=["lightllm"]), "serve[0].engines[0]: engine 'lightllm' runs on cuda, platform 'cpu' is cpu"),
    (dict(engines=["tgi"]), "serve[0].engines[0]: engine 'tgi' runs on cuda, platform 'cpu' is cpu"),
    (dict(engines=["transformers"], weights="dummy"), "serve[0].weights: 'dummy' needs an engine that makes its own weights"),
    (dict(loads={"Burst!": BURST}), "serve[0].loads: 'Burst!' does not match"),
    (dict(loads={"p": {**BURST, "mode": "poisson"}}), "serve[0].loads.p.rate_per_s: required when mode is 'poisson'"),
    (dict(loads={"b": {**BURST, "num_requests": 0}}), "serve[0].loads.b.num_requests: 0 is less than the minimum of 1"),
    (dict(loads={"b": {**BURST, "output_tokens": 3}}), "serve[0].loads.b: unknown key(s) 'output_tokens'"),
    (dict(models=["gpt2"]), "serve[0].models[0]: unknown model 'gpt2'"),
    (dict(engines=["transformers"], gpus=2), "serve[0].gpus: engine 'transformers' has no tensor parallelism"),
    (dict(loads={"c": {**BURST, "mode": "concurrency"}}),
     "serve[0].loads.c.max_concurrency: required when mode is 'concurrency'"),
    (dict(loads={"c": {**BURST, "mode": "closed-loop"}}), "serve[0].loads.c.mode: 'closed-loop' is not allowed"),
    (dict(loads={"c": {**BURST, "mode": "concurrency", "max_concurrency": 0}}),
     "serve[0].loads.c.max_concurrency: 0 is less than the minimum of 1"),
    (dict(loads={"b": {**BURST, "rate_per_s": 4}}), "serve[0].loads.b.rate_per_s: applies to mode 'poisson' only"),
    (dict(loads={"b": {**BURST, "ramp_up_s": 5}}), "serve[0].loads.b.ramp_up_s: applies to mode 'poisson' only"),
    (dict(loads={"s": {**BURST, "prefix_len": 512}}), "serve[0].loads.s.prefix_len: 512 must be below input_len 512"),
    (dict(loads={"s": {**BURST, "prefix_length": 8}}), "serve[0].loads.s: unknown key(s) 'prefix_length'"),
    (dict(prefix_caching=False), "serve[0].prefix_caching: engine 'transformers' has no prefix-cache switch"),
    (dict(prefix_caching="off"), "serve[0].prefix_caching: 'off' is not of type"),
    (dict(platforms=["h200"], models=["llama2-7b", "llama3.1-8b"], engines=["vllm", "lightllm"]),
     "serve[0].engines[1]: engine 'lightllm' does not implement the RoPE scaling 'llama3' of model 'llama3.1-8b'"),
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
    sg = ENGINES["sglang"].command(x)
    assert sg[:3] == ["/py", "-m", "sglang.launch_server"] and sg[-2:] == ["--foo", "a b"]
    flag = {k: v for k, v in zip(sg, sg[1:]) if k.startswith("--")}
    assert (flag["--model-path"], flag["--tp-size"], flag["--context-length"], flag["--max-running-requests"],
            flag["--load-format"], flag["--served-model-name"]) == (str(tmp_path), "2", "578", "1000", "dummy", "tiny")
    # SGLang clips a request's new tokens to context - input - 2: two positions more than input + output
    assert "--incremental-streaming-output" in sg  # the dialect counts each chunk's own ids
    random = ENGINES["sglang"].command(dataclasses.replace(x, dummy_weights=False))
    assert "--load-format" not in random  # the model directory's safetensors
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


def test_random_weights_the_node_cannot_hold_stop_before_anything_is_written(tmp_path, monkeypatch):
    """llama2-70b's random bf16 weights (128 GiB) on a disk with 120 GiB free, or with 100
    GiB of host memory available to fill them in: a clear error naming the sizes before any
    file is written (a full disk or a killed job would come minutes later); dummy weights
    need neither, and the room that is there lets the folder be written."""
    import shutil

    from llmbench.models import ModelSpec
    from llmbench.serve import model_dir

    big, tiny = ModelSpec.load("llama2-70b"), ModelSpec.load("tiny")
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(model_dir.shutil, "disk_usage", lambda p: usage._replace(free=120 * 2**30))
    out = tmp_path / "models" / "llama2-70b" / "random"
    with pytest.raises(model_dir.NoRoom, match=r"llama2-70b: its random bf16 weights take 128\.\d GiB, but the disk "
                                               r"of \S+ has 120\.0 GiB free; .*weights: dummy"):
        model_dir.build(big, out)
    assert not out.exists()
    assert (model_dir.build(big, tmp_path / "dummy", weights="dummy") / "config.json").exists()
    monkeypatch.setattr(model_dir.shutil, "disk_usage", lambda p: usage._replace(free=400 * 2**30))
    monkeypatch.setattr(model_dir, "mem_available_bytes", lambda: 100 * 2**30)
    with pytest.raises(model_dir.NoRoom, match=r"128\.\d GiB of host memory .* but 100\.0 GiB is available"):
        model_dir.build(big, out)
    assert (model_dir.build(tiny, tmp_path / "tiny") / "model.safetensors").exists()


def test_the_available_host_memory_is_read_from_meminfo(tmp_path):
    from llmbench.serve import model_dir

    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   104857600 kB\n")
    assert model_dir.mem_available_bytes(info) == 100 * 2**30
    info.write_text("MemTotal:       131072000 kB\n")
    assert model_dir.mem_available_bytes(info) is None
    assert model_dir.mem_available_bytes(tmp_path / "absent") is None


def _launch(tmp_path, accelerator="cuda", extra=()):
    return Launch(model_dir=tmp_path, served_name="m", host="127.0.0.1", port=1, gpus=1, accelerator=accelerator,
                  python="/py", dummy_weights=True, max_model_len=640, max_num_seqs=1000, extra_args=tuple(extra))


def test_each_engine_settings_come_from_its_launch_command_as_its_parser_reads_it(tmp_path):
    """The record's serving settings: the launch spec's values, the config's engine_args
    after them (the last occurrence wins, as in the engines' argparse), their defaults."""
    vllm = ENGINES["vllm"]
    x = _launch(tmp_path, extra=("--gpu-memory-utilization", "0.85", "--max-num-batched-tokens", "8192"))
    s = vllm.settings(vllm.command(x), {}, "cuda")
    assert s == {"max_num_seqs": 1000, "max_batch_tokens": 8192, "kv_cache_tokens": None,
                 "gpu_memory_utilization": 0.85, "cuda_graphs": True, "chunked_prefill": True,
                 "prefix_caching": True, "tensor_parallel": 1}
    eager = vllm.settings(vllm.command(_launch(tmp_path, extra=("--enforce-eager", "--no-enable-chunked-prefill"))),
                          {}, "cuda")
    assert eager["cuda_graphs"] is False and eager["chunked_prefill"] is False
    cold = vllm.settings(vllm.command(_launch(tmp_path, extra=("--no-enable-prefix-caching",))), {}, "cuda")
    assert cold["prefix_caching"] is False
    assert eager["gpu_memory_utilization"] == 0.9 and eager["max_batch_tokens"] is None  # left to vLLM
    cpu = vllm.settings(vllm.command(_launch(tmp_path, "cpu")), {}, "cpu")
    assert cpu["cuda_graphs"] is False and cpu["gpu_memory_utilization"] is None
    light = ENGINES["lightllm"]
    s = light.settings(light.command(_launch(tmp_path, extra=("--max_total_token_num", "90000"))), {}, "cuda")
    assert s == {"max_num_seqs": 1000, "max_batch_tokens": 15000, "kv_cache_tokens": 90000,
                 "gpu_memory_utilization": None, "cuda_graphs": False, "chunked_prefill": False,
                 "prefix_caching": None, "tensor_parallel": 1}
    # a config's engine_args take the place of the command's own flag: the recorded command says it once
    argv = light.command(_launch(tmp_path, extra=("--max_total_token_num", "90000")))
    assert argv.count("--max_total_token_num") == 1 and argv[argv.index("--max_total_token_num") + 1] == "90000"
    assert with_extra(["e", "--a", "1", "--b", "--c=2", "--d", "3"], ("--b", "--c", "4", "--a=5")) == [
        "e", "--d", "3", "--b", "--c", "4", "--a=5"]
    s = light.settings(light.command(_launch(tmp_path, extra=("--max_total_token_num", "1200"))), {}, "cuda")
    assert s["max_batch_tokens"] == 640  # a sixth of 1200 is below --max_req_total_len
    sg = ENGINES["sglang"]
    s = sg.settings(sg.command(_launch(tmp_path)), {}, "cuda")
    assert s == {"max_num_seqs": 1000, "max_batch_tokens": 16384, "kv_cache_tokens": None,
                 "gpu_memory_utilization": 0.85, "cuda_graphs": True, "chunked_prefill": True,
                 "prefix_caching": True, "tensor_parallel": 1}
    off = ("--disable-cuda-graph", "--disable-radix-cache", "--chunked-prefill-size", "-1", "--max-total-tokens",
           "90000", "--mem-fraction-static", "0.7", "--max-running-requests", "64", "--tp", "2")
    s = sg.settings(sg.command(_launch(tmp_path, extra=off)), {}, "cuda")
    assert s == {"max_num_seqs": 64, "max_batch_tokens": 16384, "kv_cache_tokens": 90000,
                 "gpu_memory_utilization": 0.7, "cuda_graphs": False, "chunked_prefill": False,
                 "prefix_caching": False, "tensor_parallel": 2}  # the config's engine_args come last and win
    s = sg.settings(sg.command(_launch(tmp_path, extra=("--chunked-prefill-size", "4096", "--max-prefill-tokens",
                                                        "8192"))), {}, "cuda")
    assert s["chunked_prefill"] is True and s["max_batch_tokens"] == 8192
    for engine in ENGINES.values():
        assert set(engine.settings(engine.command(_launch(tmp_path)), {}, "cuda")) == set(SETTINGS)


VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="7521"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_vllm_reports_its_kv_cache_and_the_record_takes_it(tmp_path):
    pytest.importorskip("prometheus_client", reason="vLLM's metrics are read with prometheus_client")
    from llmbench.serve.bench import engine_settings
    from llmbench.serve.engines import sglang_server_info, vllm_cache_info

    info = vllm_cache_info(VLLM_METRICS)
    assert info == {"kv_cache_tokens": 7521 * 16, "kv_cache_blocks": 7521, "kv_cache_block_size": 16,
                    "gpu_memory_utilization": 0.9}
    assert vllm_cache_info("# nothing here\n") == {}
    argv = ENGINES["vllm"].command(_launch(tmp_path))
    s = engine_settings("vllm", argv, {}, "cuda", info)
    assert s["kv_cache_tokens"] == 120336 and s["kv_cache_source"] == "engine report"
    s = engine_settings("lightllm", ENGINES["lightllm"].command(_launch(tmp_path)), {}, "cuda", {})
    assert s["kv_cache_tokens"] == 400_000 and s["kv_cache_source"] == "launch command"
    sg = sglang_server_info({"mem_fraction_static": 0.83, "internal_states": [{"max_total_num_tokens": 500000}]})
    assert sg == {"kv_cache_tokens": 500000, "gpu_memory_utilization": 0.83}
    assert sglang_server_info({"max_total_num_tokens": 7, "internal_states": []})["kv_cache_tokens"] == 7
    s = engine_settings("sglang", ENGINES["sglang"].command(_launch(tmp_path)), {}, "cuda", sg)
    assert s["kv_cache_tokens"] == 500000 and s["kv_cache_source"] == "engine report"
    assert s["gpu_memory_utilization"] == 0.83  # what SGLang resolved, in place of the flag
    s = engine_settings("vllm", argv, {}, "cuda", {"observe_error": "URLError: refused"})
    assert s["kv_cache_tokens"] is None and s["kv_cache_source"] is None and "refused" in s["engine_observe_error"]


def test_vllm_on_the_cpu_runs_its_model_in_the_engine_cores_process(tmp_path):
    """On a CPU host each engine process imports vLLM and torch anew: the launch environment
    keeps the model in the engine core's process there, and leaves the GPU layout alone."""
    vllm = ENGINES["vllm"]
    assert vllm.env(_launch(tmp_path, accelerator="cpu"))["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm.env(_launch(tmp_path, accelerator="cuda"))


@pytest.mark.parametrize("on, flag", [(True, "--enable-prefix-caching"), (False, "--no-enable-prefix-caching")])
def test_a_block_sets_prefix_caching_and_the_settings_read_it_back(on, flag, tmp_path):
    """The block's prefix_caching goes into the cell's engine arguments (ahead of its own,
    which still win), so the launch command sets it and the record's settings say it."""
    cells = grid.expand(cfg(engines=["vllm"], prefix_caching=on, engine_args={"vllm": ["--seed", "1"]})).cells
    assert {c.engine_args for c in cells} == {(flag, "--seed", "1")}
    x = Launch(model_dir=tmp_path, served_name="tiny", host="127.0.0.1", port=1, gpus=1, accelerator="cpu",
               python="/py", dummy_weights=False, max_model_len=8, max_num_seqs=1, extra_args=cells[0].engine_args)
    argv = ENGINES["vllm"].command(x)
    assert ENGINES["vllm"].settings(argv, {}, "cpu")["prefix_caching"] is on
    assert ENGINES["sglang"].settings(["--tp", "1", *ENGINES["sglang"].prefix_caching_args(on)], {}, "cuda")[
        "prefix_caching"] is on
    # null: the engine's own default, no argument added (the cells of before are unchanged)
    assert {c.engine_args for c in grid.expand(cfg(engines=["vllm"])).cells} == {()}


def test_concurrency_shared_prefix_and_ramped_loads_expand_with_their_keys():
    loads = {"c4": {**BURST, "mode": "concurrency", "max_concurrency": 4, "prefix_len": 256},
             "c16": {**BURST, "mode": "concurrency", "max_concurrency": 16, "prefix_len": 256},
             "ramp": {**BURST, "mode": "poisson", "rate_per_s": 4, "ramp_up_s": 30}}
    cells = {c.load: c for c in grid.expand(cfg(engines=["vllm"], loads=loads)).cells}
    assert set(cells) == {"c4", "c16", "ramp"}
    assert (cells["c4"].load_spec["max_concurrency"], cells["c16"].load_spec["max_concurrency"]) == (4, 16)
    assert cells["c4"].load_spec["prefix_len"] == 256 and cells["ramp"].load_spec["ramp_up_s"] == 30
    assert "prefix_len" not in cells["ramp"].load_spec  # absent keys stay absent: other cells' specs unchanged


def test_engines_serve_the_models_whose_rope_scaling_they_implement():
    # vLLM and SGLang implement Llama 3.1's scaling; LightLLM 0.0.1 serves Llama 2 (none)
    g = grid.expand(cfg(platforms=["h200"], models=["llama3.1-8b"], engines=["vllm", "sglang"]))
    assert {c.engine for c in g.cells} == {"vllm", "sglang"}
    g = grid.expand(cfg(platforms=["h200"], models=["llama2-7b"], engines=["lightllm"]))
    assert {c.engine for c in g.cells} == {"lightllm"}
