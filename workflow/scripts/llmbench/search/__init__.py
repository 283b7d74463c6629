"""The max-batch search (Table IV): the largest per-GPU batch of a cell that fits in memory.

Three parts, each importable alone:

- ``algorithm``: which batch to probe next, from what the probes showed (pure: Probe,
  State, bound, predict, next_probe; a ``hint`` seam lets a memory model name the first
  probe);
- ``frontier``: the store of what earlier probes of the same cell showed, keyed by a
  fingerprint of what decides memory (fingerprint, Frontier, seed_frontier), and the
  search's Snakemake rerun trigger derived from the same fingerprint (rerun_spec);
- ``runner``: probes run through llmbench.launch, each recorded, and ``search.json``
  (run, summary, read_summary, measured_batch, measured_out_of_memory, measured_target,
  estimate_s, search_estimate_s, plan, recorded_in; ``python -m llmbench.search
  seed-frontier``, ``measured-target``, ``estimate``, ``plan`` and ``recorded-in``).

The names callers use are re-exported here.
"""

from ..record import FRONTIER_COMMAND
from .algorithm import ALGORITHM, BOUNDING, MODEL_POINTS, TOO_LARGE, Probe, State, bound, next_probe, predict
from .frontier import Answer, Frontier, capacity_and_metric, fingerprint, memory_spec, rerun_spec, seed_frontier
from .runner import (Estimate, estimate_s, main, measured_batch, measured_out_of_memory, measured_record,
                     measured_target, plan, read_summary, recorded_in, run, search_estimate_s, summary)
