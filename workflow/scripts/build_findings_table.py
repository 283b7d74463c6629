"""Snakemake adapter: tidy tables + config/reference/findings.yaml -> the findings table
(tables/findings.{csv,md,html}), what to run next (findings-missing.csv) and every check's value
and interval as numbers (findings-checks.csv)."""

import logging

from llmbench.report import findings, render, tables


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    inputs = tables.Inputs(dict(smk.input.items()), findings_models=smk.params.models,
                           findings_machines=smk.params.machines)
    table, missing, checks = tables.findings_and_missing(inputs)
    render.write(table, smk.output.csv, smk.output.md, smk.output.html)
    missing.to_csv(smk.output.missing, index=False)
    checks.to_csv(smk.output.checks, index=False)
    logging.info("%s", findings.summary_line(table.long))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
