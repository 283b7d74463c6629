"""Snakemake adapter: a catalog table's inputs -> tables/<name>.{csv,md,html}."""

import logging

from llmbench.report import render, tables


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    table = tables.build(smk.wildcards.table, tables.Inputs(dict(smk.input.items()), findings_models=smk.params.models,
                                                            findings_machines=smk.params.machines))
    render.write(table, smk.output.csv, smk.output.md, smk.output.html)
    logging.info("%s: %d rows", smk.wildcards.table, len(table.long))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
