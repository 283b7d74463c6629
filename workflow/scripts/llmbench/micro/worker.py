"""Microbenchmark worker: one cell's measurement, run by torchrun (one process per rank).

    torchrun ... -m llmbench.micro.worker --spec spec.json --out result.json

GEMM and memcpy run on one process; collectives on every rank of the cell
(llmbench.micro.collectives). Rank 0 writes ``--out``: {"rows": [...], "versions", "devices"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ..spec import RunSpec


def run(spec: RunSpec | dict, out: Path) -> None:
    """Measure the cell's points and write the rows (rank 0)."""
    from .. import provenance

    spec = RunSpec.of(spec)  # the worker's spec.json, parsed once
    cell, accelerator = spec.cell, spec.platform.accelerator
    p = cell.params
    if cell.bench == "collectives":
        from . import collectives

        with tempfile.TemporaryDirectory() as tmp:
            inner = Path(tmp) / "spec.json"
            inner.write_text(json.dumps({"ops": p["ops"], "sizes_bytes": p["sizes_bytes"], "warmup": cell.warmup,
                                         "iters": cell.iters, "accelerator": accelerator}))
            rows_path = Path(tmp) / "rows.json"
            collectives.main(["--spec", str(inner), "--out", str(rows_path)])
            rows = json.loads(rows_path.read_text()) if rows_path.exists() else None
        if int(os.environ.get("RANK", 0)) != 0:
            return
    elif cell.bench == "gemm":
        from . import gemm

        # each GEMM against the peak of its own dtype: bf16's, or FP8's (float8 cells' specs carry it)
        peak = {"bfloat16": spec.platform.peak_bf16_tflops, gemm.FP8: spec.platform.peak_fp8_tflops}.get(p["dtype"])
        rows = gemm.run([tuple(s) for s in p["shapes"]], dtype=p["dtype"], accelerator=accelerator,
                        warmup=cell.warmup, iters=cell.iters, peak_tflops=peak, plain_check=p.get("plain_check", False))
    else:
        from . import memcpy

        rows = memcpy.run(p["sizes_bytes"], accelerator=accelerator, warmup=cell.warmup, iters=cell.iters)
    devices = provenance.devices()
    out.write_text(json.dumps({"rows": rows, "versions": provenance.versions(), "devices": devices}, indent=1))


def main(argv: list[str] | None = None) -> int:
    """Entry point for one rank."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", required=True, type=Path, help="resolved cell spec (JSON)")
    ap.add_argument("--out", required=True, type=Path, help="where rank 0 writes the rows")
    args = ap.parse_args(argv)
    run(json.loads(args.spec.read_text()), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
