"""Snakemake adapter: the vega-embed JavaScript bundle that the figures' HTML pages inline."""

import logging
from pathlib import Path

from llmbench.report import figures


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    bundle = figures.vega_bundle()
    Path(smk.output[0]).write_text(bundle)
    logging.info("%d characters", len(bundle))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
