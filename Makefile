# The README's two commands: `make run` (set-up + the embedded default grid) and
# `make test` (set-up + every test tier, with a real single-node Slurm). `make run` ends
# with results/report.html, Snakemake's report of every table and figure (one offline page).
#
# Test tiers (README, Tests; each a folder of tests/):
#   make test-fast         tests/unit: pure, no worker processes, no root; the developer's loop
#   make test-calibration  tests/calibration: pure, pins the committed evidence (results/reference)
#   make test-integration  tests/integration: real workers on the CPU, the fork server, torch.compile, Megatron-LM
#   make test-e2e          tests/e2e: the workflow on .test/config.yaml (+ Slurm, where installed)
#   make test-smoke        tests/smoke: the embedded default (config/config.yaml), statuses only
#   make test              lint, then all of them over CORES + 1 pytest-xdist processes (CI: .ci/run),
#                          a file's tests on one process; the Slurm modules are one unit (one
#                          test cluster), which spends most of its time waiting on the cluster's
#                          daemons: the process more than CORES fills that time. The smoke
#                          module and tests/e2e/test_workflow.py are one unit there: they read one
#                          run of the two grids together (tests/conftest.py, grid_runs). These
#                          two units, the suite's longest, are collected first, so each starts
#                          on its own process at once
#   make lint              ruff (pyproject.toml's [tool.ruff]) and `snakemake --lint`
SHELL := /bin/bash
CORES ?= 2
# Python writes its bytecode caches (__pycache__, git-ignored) in every recipe, whatever the
# calling shell says: a run or a test session starts hundreds of Python processes (Snakemake
# and its script jobs, workers, pytest's workers), and without the caches each one compiles
# the llmbench modules it imports again, and pytest rewrites every test module again
unexport PYTHONDONTWRITEBYTECODE
PYTEST := .venv/bin/python -m pytest

.PHONY: setup run report report-combined lint test test-fast test-calibration test-integration test-e2e test-smoke dry-run-paper
setup:
	bash envs/setup.sh

run: setup
	.venv/bin/snakemake --cores $(CORES)
	.venv/bin/snakemake --report results/report.html

report: setup
	.venv/bin/snakemake --report results/report.html

# the combined view of every committed reference run (config/combined.yaml: nothing is
# measured): its tables, verdict and figures brought up to date, then its one offline page
report-combined: setup
	.venv/bin/snakemake --configfile config/combined.yaml --cores $(CORES) tables findings figures
	.venv/bin/snakemake --configfile config/combined.yaml --report results/reference/combined/report.html

# no set-up step: these need only .venv (made once by `make setup`), and never run pip.
# snakemake --lint rather than snakefmt: it checks what the house rules ask of rules (log:,
# no absolute paths, params over shell strings, ...) with the Snakemake already pinned, and
# exits non-zero on any finding; snakefmt only formats, and would be one more pinned tool.
lint:
	@[[ -x .venv/bin/ruff ]] || { echo "no ruff in .venv: run 'make setup'" >&2; exit 1; }
	.venv/bin/ruff check workflow tests
	.venv/bin/snakemake --lint

# the unit tests are independent of each other (each writes under its own tmp_path; the
# dry runs in the repository take no lock): pytest-xdist spreads them over CORES processes
test-fast:
	@.venv/bin/python -c "import xdist" 2>/dev/null || { echo "no .venv, or one without pytest-xdist: run 'make setup'" >&2; exit 1; }
	$(PYTEST) tests/unit -q -n $(CORES)

test-calibration:
	@[[ -x .venv/bin/python ]] || { echo "no .venv: run 'make setup' once" >&2; exit 1; }
	$(PYTEST) tests/calibration -q

test-integration: setup
	$(PYTEST) tests/integration --durations=10

test-e2e: setup
	$(PYTEST) tests/e2e --durations=10

test-smoke: setup
	$(PYTEST) tests/smoke --durations=5

test: setup
	$(MAKE) --no-print-directory lint
	bash envs/install-slurm.sh
	bash envs/install-chromium.sh
	$(PYTEST) -n $$(( $(CORES) + 1 )) --dist loadfile --no-loadscope-reorder --durations=15

dry-run-paper: setup
	.venv/bin/snakemake --configfile config/paper.yaml -n --quiet rules
