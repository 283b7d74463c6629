"""tests/bench_serving.py runs each engine's own client on our burst: SGLang's bench_serving
must send the same requests as our load generator (token ids of exactly input_len, output_len
new tokens, EOS ignored, all at once), or the ratio ours / theirs compares two workloads."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_serving", REPO / "tests" / "bench_serving.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sglang_bench_serving_sends_the_paper_burst_as_token_ids(tmp_path):
    bench = _bench()
    argv = bench.sglang_bench_argv("/py", "http://127.0.0.1:1234", "llama2-7b", tmp_path, 1000, 512, 128,
                                   tmp_path / "out.jsonl")
    assert argv[:3] == ["/py", "-m", "sglang.benchmark.serving"]
    flag = {k: v for k, v in zip(argv, argv[1:]) if k.startswith("--")}
    assert (flag["--backend"], flag["--dataset-name"], flag["--random-input-len"], flag["--random-output-len"],
            flag["--random-range-ratio"], flag["--num-prompts"], flag["--request-rate"]) == \
        ("sglang", "random-ids", "512", "128", "1", "1000", "inf")
    assert "--tokenize-prompt" in argv           # ids, not text: no retokenising, exact input lengths
    assert "--disable-ignore-eos" not in argv    # ignore_eos is its default
    assert flag["--base-url"] == "http://127.0.0.1:1234" and flag["--output-file"] == str(tmp_path / "out.jsonl")
    assert set(bench.CLIENTS) == {"vllm", "sglang"}
