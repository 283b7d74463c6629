"""Snakemake adapter: the tables a figure plots (catalog) -> the figure (HTML with inline JS, SVG, PNG)."""

import logging
from pathlib import Path

from llmbench.report import figures


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    name = smk.wildcards.figure
    chart = figures.CHARTS[name](figures.load(name, dict(smk.input.items())))
    figures.save(chart, Path(smk.output.html).with_suffix(""), bundle=Path(smk.input.bundle).read_text())
    logging.info("%s from %s", name, ", ".join(map(str, smk.input)))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
