"""Snakemake adapter: one max-batch search (its probes, the frontier file, search.json)."""

import logging
import sys
from pathlib import Path

from llmbench.gpus import BusyPolicy
from llmbench import memory, search
from llmbench.ledger import DEADLINE_EXIT, DeadlineStop


def main(smk) -> None:
    # the memory model's largest batch predicted to fit, probed first (None: no hint), and
    # the GiB each further batch element adds there
    hint = memory.start_hint(smk.params.spec)
    try:
        result = search.run(smk.params.spec, Path(smk.output.dir), smk.params.frontier, Path(smk.log[0]),
                            threads=smk.threads, reprobe=bool(smk.config.get("reprobe", False)),
                            gpu_busy=BusyPolicy.from_config(smk.config),
                            hint=hint, hint_slope_gib=memory.start_slope(smk.params.spec, hint))
    except DeadlineStop as exc:  # the job's deadline came before its next probe: no search.json yet
        sys.exit(DEADLINE_EXIT.format(target=smk.output.dir, why=exc))
    logging.getLogger("llmbench").info("%s: largest batch %s in %d probes", smk.output.dir, result["largest_ok"],
                                       result["n_probes"])


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
