"""Snakemake adapter: the per-point microbenchmark table -> one microbenchmark table."""

import logging

import pandas as pd

from llmbench.report import micro


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    table, md = micro.BUILDERS[smk.wildcards.micro_table](pd.read_parquet(smk.input.micro))
    micro.write(table, md, smk.output.csv, smk.output.md)
    logging.info("%s: %d rows", smk.wildcards.micro_table, len(table))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
