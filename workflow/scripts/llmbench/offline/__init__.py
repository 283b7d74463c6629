"""Tooling for lent and offline GPU machines: planning their calls, apart from what measures.

A lent machine (a call of a few minutes, given back after) or an offline node (no index to
install from, an allocation with a time limit) is run through envs/: wheelhouse.sh and
pieces.sh build the wheels and pieces it installs from, offline-run.sh runs one target
there, offline-batch.sh runs a target list within a deadline (docs/offline-gpu-nodes.md).
This package is their Python side:

- ``planner``: estimate_s and Estimate (how long a cell's repeat should take, and how much
  time left offline-batch wants to start it), search_estimate_s, plan (the seconds of a target
  list, and the cells no call of a given length starts), schedule (the calls of a length a
  list should take, offline-batch's rules played on the estimates), recorded_in (SKIP_RECORDED) and
  measured_target (the cell a finished search measures: offline-batch's next target);
- ``cli``: ``python -m llmbench.offline measured-target``, ``estimate``, ``plan`` and
  ``recorded-in``.

It imports the measuring layers (llmbench.search, llmbench.ledger, llmbench.grid) to read
what they wrote; none of them imports it (tests/unit/test_imports.py holds that). What a
job of any kind needs to resume and to stop at its deadline (kept repeats, the
stopped-repeat marker, LLMBENCH_DEADLINE or a Slurm job's time limit) is llmbench.ledger's,
not this package's.
"""

from .planner import (KEPT_SOURCE, NEVER_STARTS, PLAN_PROBES, STOPPED_SOURCE, Call, Estimate, estimate_s,
                      measured_target, plan, recorded_in, schedule, search_estimate_s)
