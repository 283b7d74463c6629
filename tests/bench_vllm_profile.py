"""vLLM's own torch profiler on a served burst: the engine's GPU kernels by class (paper
Table X's view of serving), from the trace vLLM writes. A device-machine script, not
collected by pytest; it prints numbers and asserts nothing.

    python3 tests/bench_vllm_profile.py --python .venv-vllm-gpu/bin/python --model llama2-7b \
        --requests 256 --input-len 512 --output-len 64 --out DIR

The server is started as the serving cells start it (llmbench.serve.engines' vLLM launch
spec, dummy weights, the GPU configs' engine arguments) plus ``--profiler-config`` (torch
profiler, traces under DIR/traces, no Python stacks). After a warm-up it sends
POST /start_profile, the burst (all requests at once, token-id prompts, ignore_eos), then
POST /stop_profile, which returns once the traces are written. CUDA graphs stay on: the
engine is profiled as it serves. DIR gets the traces and profile.json: the kernel classes
of llmbench.profile.engine_trace (time per class, union of intervals, and its share of the
device-busy time), engine steps and the burst's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
from llmbench.config import load_named  # noqa: E402
from llmbench.models import ModelSpec  # noqa: E402
from llmbench.procs import free_port  # noqa: E402
from llmbench.serve import engines, model_dir  # noqa: E402

ENGINE_ARGS = ["--gpu-memory-utilization", "0.9", "--max-num-batched-tokens", "8192", "--enable-chunked-prefill"]


def post(url: str, body: dict | None = None, timeout: float = 600) -> bytes:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def wait_ready(base: str, proc: subprocess.Popen, timeout_s: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"vLLM not ready after {timeout_s} s")


def burst(base: str, name: str, n: int, input_len: int, output_len: int, vocab: int, seed: int) -> float:
    """``n`` completions at once; returns the wall seconds until the last one ended."""
    errors: list[str] = []

    def one(i: int) -> None:
        prompt = [(seed * 7919 + i * 104729 + j * 31) % (vocab - 3) + 3 for j in range(input_len)]
        try:
            post(base + "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": output_len,
                                            "min_tokens": output_len, "ignore_eos": True, "temperature": 0.0})
        except OSError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} of {n} requests failed: {errors[0]}")
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", required=True, help="interpreter of vLLM's environment")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ready-timeout", type=float, default=400)
    args = ap.parse_args()

    spec = ModelSpec(**load_named("model", args.model))
    out = args.out.resolve()
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    mdir = model_dir.build(spec, out / "model", weights="dummy")
    port = free_port()
    vllm = engines.ENGINES["vllm"]
    launch = engines.Launch(model_dir=mdir, served_name=args.model, host="127.0.0.1", port=port, gpus=1,
                            accelerator="cuda", python=args.python, dummy_weights=True,
                            max_model_len=args.input_len + args.output_len, max_num_seqs=args.requests,
                            extra_args=tuple(ENGINE_ARGS))
    profiler = {"profiler": "torch", "torch_profiler_dir": str(traces), "torch_profiler_with_stack": False}
    argv = vllm.command(launch) + ["--profiler-config", json.dumps(profiler)]
    env = {**os.environ, **vllm.env(launch), "VLLM_RPC_TIMEOUT": "1800000"}
    base = f"http://127.0.0.1:{port}"
    log = open(out / "server.log", "w")
    print("$", " ".join(argv), flush=True)
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    result: dict = {"argv": argv, "model": args.model, "requests": args.requests, "input_len": args.input_len,
                    "output_len": args.output_len}
    try:
        result["ready_s"] = wait_ready(base, proc, args.ready_timeout)
        burst(base, args.model, 16, args.input_len, args.output_len, spec.vocab_size, seed=1)  # warm-up
        post(base + "/start_profile")
        result["burst_s"] = burst(base, args.model, args.requests, args.input_len, args.output_len,
                                  spec.vocab_size, seed=2)
        t = time.perf_counter()
        post(base + "/stop_profile", timeout=1800)
        result["stop_profile_s"] = time.perf_counter() - t
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    files = sorted(p for p in traces.rglob("*") if p.is_file())
    result["traces"] = [str(p.relative_to(out)) for p in files]
    print(json.dumps({k: v for k, v in result.items() if k != "argv"}, indent=1))
    for p in files:
        print(f"{p.stat().st_size / 2**20:8.1f} MiB  {p.relative_to(out)}")
    try:
        from llmbench.profile import engine_trace
    except ImportError:
        engine_trace = None
    if engine_trace is not None:
        for p in files:
            if ".trace.json" in p.name:
                summary = engine_trace.summarize_file(p)
                result.setdefault("summaries", {})[p.name] = summary
                print(engine_trace.format_summary(summary))
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
