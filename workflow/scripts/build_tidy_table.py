"""Snakemake adapter: Records -> the tidy table (CSV and Parquet) and the records another
run's record of the same cell superseded (CSV), or one stage's rows of the tidy table (CSV;
the rule's ``slice`` wildcard). A record that cannot be read stops the job with one line
naming it (llmbench.report.tidy.record_error)."""

import logging
import sys
from pathlib import Path

from llmbench.record import RecordError
from llmbench.report import tidy


def build(smk) -> None:
    # measured: the cells max-batch searches found; evidence: other results folders' records
    records = [*smk.input.records, *smk.input.measured, *smk.input.get("evidence", [])]
    stage = smk.wildcards.get("slice")
    if stage is None:
        every = tidy.build_all(records)
        df, superseded = tidy.used(every), tidy.superseded(every)
        tidy.write(superseded, smk.output.superseded)
        logging.info("superseded by another run's record of the same cell: %d", len(superseded))
    else:
        df = tidy.build_slice(records, stage)
    tidy.write(df, smk.output.csv, smk.output.get("parquet"))
    logging.info("%s: %d records: %s", stage or "all", len(df), df["status"].value_counts().to_dict())


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    try:
        build(smk)
    except RecordError as exc:  # this run's results dir is the folder above tables/
        line = tidy.record_error(exc, Path(smk.output.csv).parent.parent)
        logging.error("%s", line)
        sys.exit(line)


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
