"""Snakemake adapter: tidy table -> the GPU scaling table (Fig. 4's numbers)."""

import logging

import pandas as pd

from llmbench.report import scaling


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    df = scaling.build(pd.read_csv(smk.input.tidy))
    scaling.write(df, smk.output.csv, smk.output.md)
    logging.info("scaling: %d rows", len(df))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
