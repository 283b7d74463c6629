"""The memory model from the command line:

    python -m llmbench.memory fit [TIDY_CSV]        the constants refitted to committed records
    python -m llmbench.memory heldout [TIDY_CSV]    the model scored on records left out of its fit (by time,
                                                    by technique family) and the margin per family it gives
    python -m llmbench.memory plan CONFIG [--csv F] per platform, the cells skip_predicted_oom would skip
    python -m llmbench.memory replay [RESULTS]      the committed max-batch searches from the predicted start
    python -m llmbench.memory advise --platform a800 --model llama2-70b --stage finetune --gpus 8
                                                    the advisor without running anything (llmbench.report.advice;
                                                    measured rows from --tidy, default the combined view's)
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one subcommand."""
    parser = argparse.ArgumentParser(prog="python -m llmbench.memory", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fit", help="refit the per-backend constants to a tidy table's records")
    p.add_argument("tidy_csv", nargs="?", default="results/reference/combined/tables/records.csv")
    p = sub.add_parser("heldout", help="fit on one part of the records, score on the rest (llmbench.memory.heldout)")
    p.add_argument("tidy_csv", nargs="?", default="results/reference/combined/tables/records.csv")
    p.add_argument("--share", type=float, default=None, help="the time split's fitted share (default 0.7)")
    p.add_argument("--results", default="results/reference", help="where the max-batch searches' folders are")
    p.add_argument("--csv", help="also write the per-family summary here")
    p = sub.add_parser("plan", help="dry run of a config: cells predicted not to fit, per platform")
    p.add_argument("configfile")
    p.add_argument("--margin", type=float, default=None, help="safety margin (default: each family's)")
    p.add_argument("--csv", help="also write every training cell's verdict here")
    p = sub.add_parser("replay", help="replay the committed max-batch searches from the predicted largest batch")
    p.add_argument("results", nargs="?", default="results/reference")
    p = sub.add_parser("advise", help="the advisor's ranking for one request, printed (runs nothing)")
    p.add_argument("--platform", action="append", required=True, help="platform file name (repeatable)")
    p.add_argument("--model", action="append", required=True, help="model file name (repeatable)")
    p.add_argument("--stage", choices=["pretrain", "finetune", "serve"])
    p.add_argument("--goal", choices=["throughput", "memory", "fits"], default="throughput")
    p.add_argument("--gpus", type=int, action="append")
    p.add_argument("--tidy", default="results/reference/combined/tables/records.csv",
                   help="tidy table whose ok records count as measured ('' for none)")
    args = parser.parse_args(argv)
    if args.command == "advise":
        from pathlib import Path

        import pandas as pd

        from ..report import advice, render

        tidy = pd.read_csv(args.tidy) if args.tidy and Path(args.tidy).exists() else pd.DataFrame()
        request = {"platforms": args.platform, "models": args.model, "goal": args.goal, "stage": args.stage,
                   "gpus": args.gpus}
        print(render.markdown(advice.table(advice.build(tidy, {k: v for k, v in request.items() if v}))))
        return 0
    if args.command == "replay":
        from .replay import replay_all

        df = replay_all(args.results)
        print(df.drop(columns=["replayed", "hinted"]).to_markdown(index=False))
        print(f"\nprobes: {int(df['replayed_probes'].sum())} from the searches' own start, "
              f"{int(df['hinted_probes'].sum())} from the predicted largest batch "
              f"({int(df['probes_saved'].sum())} saved over {len(df)} searches)")
        return 0
    if args.command == "plan":
        from .cells import plan

        cells, per = plan(args.configfile, margin=args.margin)
        if args.csv:
            cells.to_csv(args.csv, index=False)
        print(per.to_markdown(index=False) if not per.empty else "no training cells")
        print(f"\n{int(per['skipped'].sum()) if not per.empty else 0} of {len(cells)} training cells predicted not "
              "to fit (skip_predicted_oom: true would skip them)")
        unchecked = cells[cells["predicted_fits"].isna()] if not cells.empty else cells
        for why, g in (unchecked.groupby("reason", sort=True) if len(unchecked) else ()):
            print(f"{len(g)} cell(s) not modelled (they run unchecked): {why}")
        return 0
    if args.command == "heldout":
        from .heldout import TIME_SHARE, main as heldout_main

        return heldout_main(args.tidy_csv, TIME_SHARE if args.share is None else args.share, args.csv, args.results)
    if args.command == "fit":
        from .fit import main as fit_main

        return fit_main(args.tidy_csv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
