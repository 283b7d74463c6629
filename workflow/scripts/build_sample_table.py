"""Snakemake adapter: one stage's Records -> its per-row table (serving requests,
microbenchmark points or profile rows; tables/<sample>.parquet)."""

import logging
import sys
from pathlib import Path

from llmbench.record import RecordError
from llmbench.report import catalog, tidy


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    try:
        df = tidy.build_samples(smk.input.records, catalog.SAMPLES[smk.wildcards.sample])
    except RecordError as exc:  # one line naming the record (this run's results dir: above tables/)
        sys.exit(tidy.record_error(exc, Path(smk.output[0]).parent.parent))
    df.to_parquet(smk.output[0], index=False)
    logging.info("%s: %d rows", smk.wildcards.sample, len(df))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
