"""Snakemake adapter: tidy table -> the serving table (CSV and Markdown)."""

import logging

import pandas as pd

from llmbench.report import serving


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    table = serving.build(pd.read_csv(smk.input.tidy))
    serving.write(table, smk.output.csv, smk.output.md)
    logging.info("serving table: %d cells", len(table))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
