"""llmbench: runtime benchmarks of LLM pre-training, fine-tuning and serving.

The library behind the Snakemake workflow; importable and testable without Snakemake.
Data flows one way: config -> grid of Cells -> one Record per Cell -> tables -> figures.
"""

__version__ = "0.1.0"
