"""Snakemake adapter: run one paired set (its cells' repeats interleaved) and write its Records."""

import logging
import sys
from pathlib import Path

from llmbench.gpus import BusyPolicy
from llmbench.launch import run_set
from llmbench.ledger import DEADLINE_EXIT, DeadlineStop


def main(smk) -> None:
    plan = smk.params.plan
    try:
        records = run_set(smk.params.specs, [Path(p) for p in smk.output], Path(smk.log[0]),
                          threads=[min(n, smk.threads) for n in smk.params.threads],
                          gpu_busy=BusyPolicy.from_config(smk.config),
                          skip_predicted_oom=str(smk.config.get("skip_predicted_oom", False)).lower() == "true",
                          plan=plan)
    except DeadlineStop as exc:  # the job's deadline came before the set's last repeat: no record yet
        sys.exit(DEADLINE_EXIT.format(target=f"paired set {plan['id']}", why=exc))
    for path, record in zip(smk.output, records):
        logging.getLogger("llmbench").info("%s: %s %s", path, record.status, record.reason)


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
