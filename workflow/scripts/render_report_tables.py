"""Snakemake adapter: the report tables' Markdown -> HTML pages for `snakemake --report`."""

import logging
from pathlib import Path

from llmbench.report import markdown


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    for md, html in zip(smk.input.md, smk.output, strict=True):
        Path(html).write_text(markdown.to_html(Path(md).read_text()))
        logging.info("%s -> %s", md, html)


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
