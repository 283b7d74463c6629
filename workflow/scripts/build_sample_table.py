"""Snakemake adapter: one stage's Records -> its per-row table (serving requests,
microbenchmark points or profile rows; tables/<sample>.parquet)."""

import logging

from llmbench.report import catalog, tidy


def main(smk) -> None:
    logging.basicConfig(filename=smk.log[0], level=logging.INFO)
    df = tidy.build_samples(smk.input.records, catalog.SAMPLES[smk.wildcards.sample])
    df.to_parquet(smk.output[0], index=False)
    logging.info("%s: %d rows", smk.wildcards.sample, len(df))


if __name__ == "__main__":
    main(snakemake)  # noqa: F821 - injected by Snakemake
