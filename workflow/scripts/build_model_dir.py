"""Snakemake adapter: a model config -> the directory a serving engine loads."""

import logging

from llmbench.models import ModelSpec
from llmbench.serve import model_dir


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    out = model_dir.build(ModelSpec(**smk.params.model), smk.output[0], weights=smk.wildcards.weights,
                          threads=smk.threads)
    logging.info("model directory %s: %s", out, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
