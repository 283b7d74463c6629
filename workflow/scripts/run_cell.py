"""Snakemake adapter: run one cell (all its repeats) and write its Record."""

import logging
import sys
from pathlib import Path

from llmbench.gpus import BusyPolicy
from llmbench.launch import run_cell
from llmbench.ledger import DEADLINE_EXIT, DeadlineStop
from llmbench.nodes import NodesError


def main(smk) -> None:
    try:
        record = run_cell(smk.params.spec, Path(smk.output.record), Path(smk.log[0]), threads=smk.threads,
                          gpu_busy=BusyPolicy.from_config(smk.config),
                          skip_predicted_oom=str(smk.config.get("skip_predicted_oom", False)).lower() == "true")
    except NodesError as exc:  # a cell over several nodes outside a Slurm job of as many: no record
        sys.exit(f"{smk.output.record}: not run: {exc}")
    except DeadlineStop as exc:  # the job's deadline came before its last repeat: no record yet
        sys.exit(DEADLINE_EXIT.format(target=smk.output.record, why=exc))
    logging.getLogger("llmbench").info("%s: %s %s", smk.output.record, record.status, record.reason)


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
