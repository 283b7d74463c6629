#!/usr/bin/env bash
# Run the workflow on an offline GPU node (Python 3.12 with a CUDA torch, transformers,
# peft and pandas, no package index) from a wheelhouse that envs/wheelhouse.sh built.
# This is how the reference runs under results/reference/ ran on the lent GPU machines.
#
#   bash envs/offline-run.sh .whl pretrain --configfile config/recipes/one-gpu-sweep.yaml --cores 16 --resources gpu_slots=1
#   bash envs/offline-run.sh .whl --install-only    # the wheels into /tmp/site, nothing run
#
# The wheels go to /tmp/site (LLMBENCH_SITE sets another; added to PYTHONPATH) and are
# compiled as they are first imported: the script unsets PYTHONDONTWRITEBYTECODE, which some
# images' shells set, so that no worker, rank or engine compiles them from source again and
# again (pip installs them with --no-compile: what is never imported is never compiled).
# LightLLM's pinned set, where the wheelhouse has it (SERVING=1), goes to /tmp/site-lightllm,
# and .venv-lightllm/bin/python starts the engine with it in front (config
# engine_python.lightllm). vLLM's GPU set, where
# the wheelhouse has it (VLLM_GPU=1: a vllm/ folder, or its pieces vllm.txz.part-* with
# their checksums, gathered in the wheelhouse from as many transfers as it took), is
# checked, reassembled (envs/pieces.sh) and installed to /tmp/site-vllm, and
# .venv-vllm-gpu/bin/python starts vLLM with it in front (config engine_python.vllm).
# SGLang's GPU set (SGLANG_GPU=1: sglang/ or sglang.txz.part-*) goes the same way to
# /tmp/site-sglang and .venv-sglang-gpu/bin/python (config engine_python.sglang).
# Snakemake runs with the greedy scheduler (pulp, its ILP solver, is not in the wheelhouse).
set -euo pipefail
cd "$(dirname "$0")/.."
whl=${1:?usage: offline-run.sh WHEELHOUSE [snakemake arguments]}
shift
site=${LLMBENCH_SITE:-/tmp/site}
unset PYTHONDONTWRITEBYTECODE   # the bytecode caches above
want=$(ls "$whl"/*.whl | sha256sum | cut -d' ' -f1)   # a wheelhouse whose wheels changed installs again
if [[ $(cat "$site/.llmbench-installed" 2>/dev/null) != "$want" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$whl"/*.whl
    echo "$want" > "$site/.llmbench-installed"
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
[[ ${1:-} == --install-only ]] && exit 0   # the wheels only (offline-batch.sh's SEED_FRONTIER)
if [[ -d $whl/lightllm && ! -x .venv-lightllm/bin/python ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-lightllm \
        "$whl"/lightllm/*.whl
    mkdir -p .venv-lightllm/bin
    # its older fastapi/starlette/uvicorn must come before the workflow's newer ones
    printf '#!/bin/sh\nexport PYTHONPATH=/tmp/site-lightllm:%s\nexec python3 "$@"\n' "$PYTHONPATH" \
        > .venv-lightllm/bin/python
    chmod +x .venv-lightllm/bin/python
fi
gpu_set() {  # gpu_set NAME [VAR=VALUE...]: the wheelhouse's NAME/ (or its pieces) into /tmp/site-NAME,
    # and .venv-NAME-gpu/bin/python, which runs python3 with those wheels in front of the
    # workflow's and with the variables given
    local name=$1 kv
    shift
    [[ ( -d $whl/$name || -f $whl/$name.txz.parts ) && ! -x .venv-$name-gpu/bin/python ]] || return 0
    [[ -d $whl/$name ]] || bash envs/pieces.sh unpack "$whl" "$name"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "/tmp/site-$name" \
        "$whl/$name"/*.whl
    mkdir -p ".venv-$name-gpu/bin"
    {
        printf '#!/bin/sh\nexport PYTHONPATH=/tmp/site-%s:%s\n' "$name" "$PYTHONPATH"
        for kv in "$@"; do printf 'export %s\n' "$kv"; done
        printf 'exec python3 "$@"\n'
    } > ".venv-$name-gpu/bin/python"
    chmod +x ".venv-$name-gpu/bin/python"
}
# vLLM's fastapi (< 0.137), starlette and pydantic come before the workflow's; flashinfer
# is not in its set, so vLLM must not pick its top-k/top-p sampler
gpu_set vllm VLLM_USE_FLASHINFER_SAMPLER=0
# SGLang's transformers (5.12.1), tokenizers, openai and xgrammar pins come before the
# workflow's and the image's
gpu_set sglang
exec python3 -m snakemake --scheduler greedy "$@"
