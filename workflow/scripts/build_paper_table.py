"""Snakemake adapter: tidy table + the paper's published values -> one paper table."""

import logging

import pandas as pd

from llmbench.report import paper_tables

TITLES = {
    "table2": "Table II: Megatron-LM vs DeepSpeed pre-training at batch size 1 and the largest batch (ours beside the paper's)",
    "table3": "Table III: pre-training at batch size 1 (ours beside the paper's)",
    "table4": "Table IV: pre-training at the best batch size run, maximised where a max-batch search ran (ours beside the paper's)",
    "table9": "Table IX: fine-tuning at batch size 1 (ours beside the paper's)",
}


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    table = smk.wildcards.table
    tidy = pd.read_csv(smk.input.tidy)
    if table == "table2":
        long = paper_tables.build_table2(tidy)
        paper_tables.write_table2(long, smk.output.csv, smk.output.md, TITLES[table])
    else:
        long = paper_tables.build(tidy, table)
        paper_tables.write(long, smk.output.csv, smk.output.md, TITLES[table], table)
    logging.info("%s: %d rows", table, len(long))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
