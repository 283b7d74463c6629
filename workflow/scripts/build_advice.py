"""Snakemake adapter: the tidy table and the config's advice request -> tables/advice.{csv,md,html}."""

import logging

import pandas as pd

from llmbench.report import advice, render


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    df = advice.build(pd.read_csv(smk.input.tidy), smk.params.advice, smk.params.cells)
    render.write(advice.table(df), smk.output.csv, smk.output.md, smk.output.html)
    logging.info("advice: %d rows", len(df))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
