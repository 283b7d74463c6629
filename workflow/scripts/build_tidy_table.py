"""Snakemake adapter: every Record -> the tidy table (CSV and Parquet) and the
per-sample tables (serving requests, microbenchmark points, profile rows)."""

import logging

from llmbench.report import tidy


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    # measured: the cells max-batch searches found; evidence: other results folders' records
    records = [*smk.input.records, *smk.input.measured, *smk.input.evidence]
    df = tidy.build(records)
    tidy.write(df, smk.output.csv, smk.output.parquet)
    tidy.build_samples(records, "serve").to_parquet(smk.output.requests, index=False)
    tidy.build_samples(records, "micro").to_parquet(smk.output.micro, index=False)
    tidy.build_samples(records, "profile").to_parquet(smk.output.profile, index=False)
    logging.info("%d records: %s", len(df), df["status"].value_counts().to_dict())


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
