"""``python -m llmbench.offline``: the command line of the planner (llmbench.offline.planner),
what envs/offline-batch.sh and a person planning a lent machine's calls run."""

from __future__ import annotations

import argparse
from pathlib import Path

from .planner import NEVER_STARTS, Call, estimate_s, measured_target, plan, recorded_in, schedule, whole_s


def _cell(target: str) -> str:
    """A target in short: its path under runs/, less the record's file name."""
    return target.split("/runs/", 1)[-1].removesuffix("/record.json")


def print_schedule(calls: list[Call], left_out: list[tuple[str, str]], call_s: int) -> None:
    """The schedule's lines: each call's cells (repeats run there, and those left after it)."""
    print(f"calls of {call_s} s, the list given to each (offline-batch's rules on these estimates; a call's "
          "set-up, Snakemake's starts and deadline slack not counted):")
    for i, call in enumerate(calls, 1):
        cells = ", ".join(f"{_cell(t)} x{n}" + (f" ({rest} left)" if rest else "") for t, n, rest in call.ran)
        print(f"  call {i}: {int(call.used_s)} s: {cells}")
    print(f"{len(calls)} call(s)" + "".join(f"; not in them: {_cell(t)} ({why})" for t, why in left_out))


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbench.offline measured-target FOLDER`` (measured_target: prints the
    record path, or nothing where no batch fit); ``python -m llmbench.offline estimate
    TARGET CONFIG [--earlier DIR ...]`` (estimate_s: prints a repeat's whole seconds, the
    repeats still to run (Estimate.left), the seconds left offline-batch wants to start it
    (Estimate.start_s) and the source, or nothing where there is no estimate); ``python -m
    llmbench.offline plan LIST CONFIG [--earlier DIR ...] [--skip-recorded DIR ...] [--call-s
    S]`` (plan: the seconds of each target of a target list, then their sum and what it
    leaves out; with ``--call-s``, schedule: the calls of that length the list should take); ``python -m llmbench.offline recorded-in TARGET [DIR ...]`` (recorded_in:
    prints ``skip DIR``, ``cell PATH``, or ``none`` where no folder holds the target)."""
    parser = argparse.ArgumentParser(prog="python -m llmbench.offline", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    measured = sub.add_parser("measured-target", help=measured_target.__doc__.split("\n")[0])
    measured.add_argument("folder", type=Path, help="a finished search's folder (holding search.json)")
    timing = argparse.ArgumentParser(add_help=False)  # what estimate and plan time a cell by
    timing.add_argument("--earlier", nargs="*", type=Path, default=[],
                        help="results folders whose records of a cell time it where no probe did")
    estimate = sub.add_parser("estimate", parents=[timing], help=estimate_s.__doc__.split("\n")[0])
    estimate.add_argument("target", type=Path, help="a training cell's record path")
    estimate.add_argument("config", type=Path, help="the config whose cell it is")
    planned = sub.add_parser("plan", parents=[timing], help=plan.__doc__.split("\n")[0])
    planned.add_argument("targets", type=Path, help="a file of targets, one a line (coverage targets writes one)")
    planned.add_argument("config", type=Path, help="the config whose cells they are")
    planned.add_argument("--skip-recorded", nargs="*", type=Path, default=[],
                         help="results folders whose records count as done (offline-batch's SKIP_RECORDED)")
    planned.add_argument("--call-s", type=int, default=None,
                         help="seconds of one call (offline-batch's DEADLINE_S): name the cells it never starts, "
                              "and the calls the list should take")
    recorded = sub.add_parser("recorded-in", help=recorded_in.__doc__.split("\n")[0])
    recorded.add_argument("target", help="a target (results/runs/...: a record or a search folder)")
    recorded.add_argument("folders", nargs="*", help="results folders holding runs/...")
    args = parser.parse_args(argv)
    if args.command == "recorded-in":
        print(*(recorded_in(args.target, args.folders) or ("none",)))
        return 0
    if args.command == "plan":
        try:
            lines = (t.strip() for t in args.targets.read_text().splitlines())
            listed = [t for t in lines if t and not t.startswith("#")]  # as offline-batch reads it
        except OSError as exc:
            parser.exit(2, f"{exc}\n")
        rows = plan(listed, args.config, args.earlier, args.skip_recorded, args.call_s)
        for target, secs, why in rows:
            print(f"{'?' if secs is None else int(secs):>6}  {target}  ({why})")
        timed = [secs for _, secs, _ in rows if secs is not None]
        never = sum(NEVER_STARTS in why for _, _, why in rows)
        print(f"total: {int(sum(timed))} s for {len(timed)} of {len(rows)} targets"
              + (f"; {len(rows) - len(timed)} not timed (above)" if len(timed) < len(rows) else "")
              + (f"; {never} {NEVER_STARTS} of {args.call_s} s (above)" if never else ""))
        if args.call_s:
            print_schedule(*schedule(listed, args.config, args.call_s, args.earlier, args.skip_recorded), args.call_s)
        return 0
    if args.command == "estimate":
        est = estimate_s(args.target, args.config, args.earlier)
        if est is not None:
            print(whole_s(est.repeat_s), est.left, est.start_s, est.source)
        return 0
    if args.command == "measured-target":
        try:
            target = measured_target(args.folder)
        except (ValueError, OSError) as exc:
            parser.exit(2, f"{exc}\n")
        if target:
            print(target)
    return 0
