"""Snakemake adapter: tidy tables + config/reference/findings.yaml -> the findings table."""

import logging

import pandas as pd

from llmbench.report import findings


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    table, missing = findings.build(pd.read_csv(smk.input.tidy), pd.read_parquet(smk.input.profile),
                                    pd.read_parquet(smk.input.micro), path=smk.input.findings,
                                    models=smk.params.models)
    findings.write(table, missing, smk.output.csv, smk.output.md, smk.output.missing)
    logging.info("%s", findings.summary_line(table))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
