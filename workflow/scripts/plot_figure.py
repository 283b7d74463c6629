"""Snakemake adapter: tidy tables (records, requests) -> one figure (HTML with inline JS, SVG, PNG)."""

import logging
from pathlib import Path

import pandas as pd

from llmbench.report import figures


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    tables = {name: pd.read_parquet(smk.input[name]) for name in ("requests", "micro", "profile")}
    chart = figures.CHARTS[smk.wildcards.figure](pd.read_csv(smk.input.tidy), tables)
    figures.save(chart, Path(smk.output.html).with_suffix(""))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
