"""Snakemake adapter: Records -> the tidy table (CSV and Parquet) and the records another
run's record of the same cell superseded (CSV), or one stage's rows of the tidy table (CSV;
the rule's ``slice`` wildcard)."""

import logging

from llmbench.report import tidy


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
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


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
