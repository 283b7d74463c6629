"""python -m llmbench.throughput {calibrate [--write] | score --out DIR | interval [--write] | predict ...}.

Run with PYTHONPATH=workflow/scripts from the repository root.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from .. import techniques
from ..config import REPO_ROOT
from ..estimate import DEADLINE_MARGIN, SLURM_MARGIN
from ..models import ModelSpec
from . import calibrate, interval, score, widths
from .model import (BACKENDS, CALIBRATED_MARKER, CONSTANTS_FILE, OVERLAP, TERMS, TrainCell, calibrated_constants,
                    sides, step_time_s, terms)


def _calibrate(args) -> int:
    df = calibrate.load_records(REPO_ROOT)
    block = calibrate.calibrated_block(calibrate.fit(df, REPO_ROOT), df)
    text = yaml.safe_dump(block, sort_keys=False, width=120)
    if not args.write:
        print(text, end="")
        return 0
    path = REPO_ROOT / CONSTANTS_FILE
    head, sep, _ = path.read_text(encoding="utf-8").partition(CALIBRATED_MARKER)
    if not sep:
        print(f"{path}: no line starting with {CALIBRATED_MARKER!r}", file=sys.stderr)
        return 1
    marker_line = sep + _.split("\n", 1)[0]
    path.write_text(head + marker_line + "\n" + text, encoding="utf-8")
    print(f"wrote {len(block['calibrated']['constants'])} constants fitted on {len(df)} records to {path}")
    return 0


def _score(args) -> int:
    res = score.run(Path(args.out), REPO_ROOT)
    fmt = {"median_abs_error_pct": "{:.1f}".format, "median_error_pct": "{:+.1f}".format,
           "rank_corr": "{:.2f}".format}
    cols = ["n", "median_abs_error_pct", "median_error_pct", "rank_corr", "n_ranked"]
    print("paper's tables (8 GPUs, seq 350), constants fitted on our records only:")
    print(res["paper"][["table", "platform"] + cols].to_string(index=False, formatters=fmt))
    print("\nheld out (our records):")
    print(res["heldout"][["split", "n_fit"] + cols].to_string(index=False, formatters=fmt))
    print(f"\nrepeat time, measured / predicted (llmbench.estimate; deadline margin x {DEADLINE_MARGIN:g}, "
          f"Slurm margin x {SLURM_MARGIN:g}):")
    print(res["repeats"].to_string(index=False, formatters={k: "{:.2f}".format for k in ("median", "p95", "max")}))
    print(f"\nCSVs in {args.out}")
    return 0


def _interval(args) -> int:
    data = widths.compute(REPO_ROOT)
    if args.write:
        print(f"wrote {widths.write(data, REPO_ROOT)}")
    else:
        print(yaml.safe_dump(data, sort_keys=False, width=120), end="")
    return 0


def _predict(args) -> int:
    cell = TrainCell(stage=args.stage, platform=args.platform, model=ModelSpec.load(args.model),
                     technique=techniques.parse(args.technique), batch_size=args.batch_size,
                     gpus=args.gpus, seq_len=args.seq_len, backend=args.backend)
    constants = calibrated_constants()
    parts, by_side = terms(cell, constants), sides(cell, constants)
    step = step_time_s(cell, constants)
    for k in TERMS:
        print(f"{k:>14} {parts[k]:9.4f} s")
    print("   sides: " + ", ".join(f"{k} {v:.4f} s" for k, v in by_side.items())
          + f"; a step is the longer of host and device + {constants[OVERLAP]:g} x the shorter + serial")
    pred = interval.predict(cell)
    print(f"{'step':>14} {step:9.4f} s   {pred.value:,.0f} tokens/s "
          f"({pred.low:,.0f}-{pred.high:,.0f}, {pred.quantile:.0%} interval)")
    for note in pred.notes:
        print(f"  outside calibration: {note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(prog="python -m llmbench.throughput", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate", help="fit the constants on our records; print (or --write) the block")
    c.add_argument("--write", action="store_true", help=f"rewrite the calibrated block of {CONSTANTS_FILE}")
    s = sub.add_parser("score", help="predict the paper's tables and held-out cells; write CSVs")
    s.add_argument("--out", required=True, help="folder for the CSVs")
    i = sub.add_parser("interval", help="the interval widths from held-out errors; print (or --write) the file")
    i.add_argument("--write", action="store_true", help=f"rewrite {interval.INTERVAL_FILE}")
    p = sub.add_parser("predict", help="the terms of one cell, its interval and notes")
    p.add_argument("--stage", default="pretrain", choices=["pretrain", "finetune"])
    p.add_argument("--platform", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--technique", default=techniques.NAIVE)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=350)
    p.add_argument("--backend", default="deepspeed", choices=list(BACKENDS))
    args = ap.parse_args(argv)
    return {"calibrate": _calibrate, "score": _score, "interval": _interval,
            "predict": _predict}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
