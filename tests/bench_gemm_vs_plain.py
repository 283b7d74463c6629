"""Benchmark of the GEMM harness against plain torch.matmul (numbers, not assertions).

The harness's bar: its best bf16 point is within 3% of what torch.matmul reaches for
that shape when timed separately. For each shape this runs llmbench.micro.gemm.run with
plain_check (the same function the workflow's GEMM cells call): the harness's median over
CUDA-event-timed calls with out=, then plain back-to-back torch.matmul timed as one window
right after, and prints both and their ratio.

    python tests/bench_gemm_vs_plain.py [--accelerator cuda] [--warmup 20] [--iters 100]

Needs only torch (runs on the GPU machines' system Python, no venv).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from llmbench.micro import gemm  # noqa: E402

#: 8192^3 (plain torch.matmul reaches about 757 TFLOP/s on an H100), Table XII's MLP shapes, a square 4096.
SHAPES = [(8192, 8192, 8192), (666, 11008, 4096), (10624, 11008, 4096), (4096, 4096, 4096)]
CPU_SHAPES = [(256, 256, 256), (512, 256, 256)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args(argv)
    shapes = SHAPES if args.accelerator == "cuda" else CPU_SHAPES
    rows = gemm.run(shapes, dtype=args.dtype, accelerator=args.accelerator, warmup=args.warmup,
                    iters=args.iters, peak_tflops=None, plain_check=True)
    print(f"{'M x N x K':>20} {'harness TFLOP/s':>16} {'plain TFLOP/s':>14} {'% of plain':>10} {'correct':>7}")
    for r in rows:
        print(f"{str(r['m']) + 'x' + str(r['n']) + 'x' + str(r['k']):>20}",
              f"{r['tflops']:16.2f} {r['plain_tflops']:14.2f} {100 * r['vs_plain']:10.1f} {str(r['correct']):>7}")
    best = max(rows, key=lambda r: r["tflops"])
    print(f"best harness point {best['m']}x{best['n']}x{best['k']}: {best['tflops']:.2f} TFLOP/s, "
          f"{100 * best['vs_plain']:.1f}% of plain torch.matmul for that shape")
    return 0


if __name__ == "__main__":
    sys.exit(main())
