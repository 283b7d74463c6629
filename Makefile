# The README's two commands: `make run` (set-up + the embedded default grid) and
# `make test` (set-up + the test suite, which starts a real single-node Slurm). `make run` ends
# with results/report.html, Snakemake's report of every table and figure (one offline page).
SHELL := /bin/bash
CORES ?= 2

.PHONY: setup run report test dry-run-paper
setup:
	bash envs/setup.sh

run: setup
	.venv/bin/snakemake --cores $(CORES)
	.venv/bin/snakemake --report results/report.html

report: setup
	.venv/bin/snakemake --report results/report.html

test: setup
	bash envs/install-slurm.sh
	.venv/bin/python -m pytest

dry-run-paper: setup
	.venv/bin/snakemake --configfile config/paper.yaml -n --quiet rules
