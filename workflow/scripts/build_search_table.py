"""Snakemake adapter: the searches' summaries and measured records -> the search table."""

import logging

from llmbench.report import search


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    df = search.build(smk.input.searches, smk.input.measured)
    search.write(df, smk.output.csv, smk.output.md)
    logging.info("search: %d rows", len(df))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
