"""Snakemake adapter: run one paired set of serving cells (engines interleaved round by round)
and write its Records."""

import logging
import sys
from pathlib import Path

from llmbench.gpus import BusyPolicy
from llmbench.ledger import DEADLINE_EXIT, DeadlineStop
from llmbench.serve.paired import run_set


def main(smk) -> None:
    plan = smk.params.plan
    try:
        records = run_set(smk.params.specs, [Path(p) for p in smk.params.model_dirs], [Path(p) for p in smk.output],
                          Path(smk.log.set), [Path(p) for p in smk.log.servers], plan,
                          gpu_busy=BusyPolicy.from_config(smk.config))
    except DeadlineStop as exc:  # the job's deadline came before the set's last run: no record yet
        sys.exit(DEADLINE_EXIT.format(target=f"paired set {plan['id']}", why=exc))
    for path, record in zip(smk.output, records):
        logging.getLogger("llmbench").info("%s: %s %s", path, record.status, record.reason)


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
