"""Snakemake adapter: tidy table + per-row profile table -> one profiling table."""

import logging

import pandas as pd

from llmbench.report import profile


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    tidy, rows = pd.read_csv(smk.input.tidy), pd.read_parquet(smk.input.profile)
    name = smk.wildcards.profile_table
    table, md = profile.BUILDERS[name](tidy, rows)
    profile.write(table, md, smk.output.csv, smk.output.md)
    logging.info("%s: %d rows", name, len(table))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
