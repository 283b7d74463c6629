"""Snakemake adapter: tidy table + the paper's published values -> one paper table."""

import logging

import pandas as pd

from llmbench.report import paper_tables

TITLES = {
    "table3": "Table III: pre-training at batch size 1 (ours beside the paper's)",
    "table4": "Table IV: pre-training at the best batch size run (ours beside the paper's)",
    "table9": "Table IX: fine-tuning at batch size 1 (ours beside the paper's)",
}


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    table = smk.wildcards.table
    long = paper_tables.build(pd.read_csv(smk.input.tidy), table)
    paper_tables.write(long, smk.output.csv, smk.output.md, TITLES[table], with_bs=table == "table4")
    logging.info("%s: %d rows", table, len(long))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
