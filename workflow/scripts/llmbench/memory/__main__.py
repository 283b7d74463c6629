"""``python -m llmbench.memory fit [TIDY_CSV]``: the memory model's constants refitted to
committed records (llmbench.memory.fit)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one subcommand."""
    parser = argparse.ArgumentParser(prog="python -m llmbench.memory", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fit", help="refit the per-backend constants to a tidy table's records")
    p.add_argument("tidy_csv", nargs="?", default="results/reference/combined/tables/records.csv")
    args = parser.parse_args(argv)
    if args.command == "fit":
        from .fit import main as fit_main

        return fit_main(args.tidy_csv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
