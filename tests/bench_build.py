"""Benchmark (reported, not asserted): how long building a random-initialised model takes,
and the GPU memory it peaks at, through llmbench.train.build.build_llama (meta device, then
layer by layer; with --quant4 each decoder layer quantised to NF4 as it is built).

    PYTHONPATH=workflow/scripts python tests/bench_build.py --model llama2-7b
    PYTHONPATH=workflow/scripts python tests/bench_build.py --model llama2-70b --quant4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))


def main() -> None:
    import torch

    from llmbench.models import ModelSpec
    from llmbench.train import build

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--quant4", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    spec = ModelSpec.load(args.model)
    for i in range(args.repeats):
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model = build.build_llama(spec, "sdpa", dtype, device, quant4=args.quant4)
        if device == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        row = {"model": args.model, "quant4": args.quant4, "repeat": i, "build_s": round(took, 2), "device": device}
        if device == "cuda":
            row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            row["allocated_after_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
        print(json.dumps(row), flush=True)
        del model


if __name__ == "__main__":
    main()
