"""The max-batch search (Table IV): the largest per-GPU batch of a cell that fits in memory.

Three parts, each importable alone:

- ``algorithm``: which batch to probe next, from what the probes showed (pure: Probe,
  State, bound, predict, next_probe; a ``hint`` seam lets a memory model name the first
  probe);
- ``frontier``: the store of what earlier probes of the same cell showed, keyed by a
  fingerprint of what decides memory (fingerprint, Frontier, seed_frontier; ``python -m
  llmbench.search seed-frontier``), and the search's Snakemake rerun trigger derived from
  the same fingerprint (rerun_spec);
- ``runner``: probes run through llmbench.launch, each recorded, and ``search.json``
  (run, summary), and what a finished search says (read_summary, measured_batch,
  measured_out_of_memory, measured_record).

Planning a lent machine's calls around searches (estimates, plans, the next target after a
search folder) is llmbench.offline's.

The names callers use are re-exported here.
"""

from ..record import FRONTIER_COMMAND
from .algorithm import ALGORITHM, BOUNDING, MODEL_POINTS, TOO_LARGE, Probe, State, bound, next_probe, predict
from .frontier import (Answer, Frontier, capacity_and_metric, fingerprint, main, memory_spec, rerun_spec,
                       seed_frontier)
from .runner import measured_batch, measured_out_of_memory, measured_record, read_summary, run, summary
