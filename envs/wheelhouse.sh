#!/usr/bin/env bash
# A wheelhouse for an offline GPU node (Python 3.12, x86-64) that already has torch,
# transformers, peft and pandas: the workflow (snakemake and what it imports), DeepSpeed,
# bitsandbytes, megatron-core and torchao (FP8 training; 3.4 MB, abi3, its C++ ops built
# for torch >= 2.11, the GPU machines' torch), at the versions of envs/requirements.txt. This is how the
# reference runs under results/reference/ ran on the lent GPU machines, which reach no
# package index:
#
#   bash envs/wheelhouse.sh .whl                 # here, with network
#   # there:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
#   python3 -m snakemake pretrain --configfile config/recipes/one-gpu-sweep.yaml --cores 16 --resources gpu_slots=1
#
# SERVING=1 adds `transformers serve`'s and LightLLM's wheels (see below).
# FIGURES=1 adds altair and vl-convert (SVG/PNG export, 33 MB) so the figures build there
# too; without it, build the tables there and the figures where the records are copied to
# (`snakemake figures --config results_dir=<copied folder>`), as the reference runs did.
# VLLM_GPU=1 adds vLLM 0.26.0 for NVIDIA GPUs and what it needs beyond a CUDA PyTorch 2.11
# image (envs/requirements-vllm-gpu.txt), in a folder of its own, vllm/ (see below).
# SLIM_VLLM=1 drops vLLM's FlashAttention 2 library (129 of the wheel's 304 MB): on Hopper
# vLLM runs FlashAttention 3 and imports FA2 only where it is present. Only for a transfer
# limit, and never for pre-Hopper GPUs (A800, RTX 4090/3090 run FA2).
# SGLANG_GPU=1 adds SGLang 0.5.17 for NVIDIA GPUs, its kernels (sglang-kernel 0.4.5, CUDA 13,
# 383 MB) and what it needs beyond a CUDA PyTorch 2.11 image (envs/requirements-sglang-gpu.txt),
# in a folder of its own, sglang/ (see below). SGLang's wheel is manylinux_2_34: glibc 2.34
# or newer on the node.
# PIECES_MIB=N packs each of vllm/ and sglang/ that was fetched into one xz-compressed tar
# split into N-MiB pieces (vllm.txz.part-000, ..., sglang.txz.part-000, ...), with the
# checksums of the pieces (NAME.txz.parts) and of the whole (NAME.txz.sha256), for a node
# that can be sent only so much at a time; envs/offline-run.sh reassembles, checks and
# installs them. Packing takes minutes (xz over the kernel libraries, envs/pieces.sh).
# SLIM_BNB=1 keeps only bitsandbytes' CUDA 13.0 and CPU libraries (43 MB -> 3.6 MB; the
# GPU machines have torch cu130): only for a transfer limit, never for a shared cluster.
# pulp (16 MB, Snakemake's ILP scheduler) is left out: run with --scheduler greedy.
set -euo pipefail
out=${1:-.whl}
py=${PY:-3.12}
pip=${PIP:-$(dirname "$0")/../.venv/bin/pip}
mkdir -p "$out" && out=$(cd "$out" && pwd)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64 any; do
    platforms+=(--platform "$p")
done
# the workflow's own pins (envs/requirements.txt) and the closure of snakemake and
# deepspeed beyond what a CUDA PyTorch image holds, as verified on the GPU machines
pkgs=(
    snakemake==9.27.1 deepspeed==0.19.8 bitsandbytes==0.50.2 megatron-core==0.16.1 torchao==0.18.0 jsonschema==4.26.0
    nvidia-ml-py==13.615.71
    annotated-types==0.8.0 argparse-dataclass==2.0.0 attrs==26.1.0 conda-inject==1.3.2 configargparse==1.9.0
    connection-pool==0.0.3 docutils==0.22.4 dpath==2.2.0 einops==0.8.2 fastjsonschema==2.22.3 gitdb==4.0.12
    gitpython==3.2.1 greenlet==3.5.6 hjson==3.1.0 humanfriendly==10.0 immutables==0.21
    jsonschema-specifications==2025.9.1 jupyter-core==5.9.1 msgpack==1.2.4 nbformat==5.11.1
    platformdirs==4.14.7 py-cpuinfo==9.0.0 pydantic==2.14.3 pydantic-core==2.50.4 referencing==0.37.0
    rpds-py==2026.9.1 smart-open==7.7.1 smmap==5.0.3 snakemake-interface-common==1.23.0
    snakemake-interface-executor-plugins==9.4.0 snakemake-interface-logger-plugins==2.1.0
    snakemake-interface-report-plugins==1.3.0 snakemake-interface-scheduler-plugins==2.0.2
    snakemake-interface-storage-plugins==4.4.1 sqlalchemy==2.0.58 sqlmodel==0.0.37 tabulate==0.10.0
    tenacity==9.2.1 throttler==1.2.3 traitlets==5.16.1 typing-inspection==0.4.5 wrapt==2.5.2 yte==1.9.4
)
fetch() {  # fetch DIR SPEC...: binary wheels for the target Python, else pure-Python ones
    local dir=$1; shift; mkdir -p "$dir"
    for spec in "$@"; do
        "$pip" download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
            "${platforms[@]}" -d "$dir" "$spec" >/dev/null 2>&1 \
            || "$pip" wheel -q --no-deps -w "$dir" "$spec" >/dev/null \
            || { echo "wheelhouse: no wheel for $spec" >&2; exit 1; }
    done
}
slim_wheel() {  # slim_wheel WHEEL DROP [KEEP...]: rewrite WHEEL without its files whose path
    # matches DROP, except those whose name matches a KEEP, and its RECORD to match
    local whl=$1 drop=$2 tmp k
    shift 2
    local keep=()
    for k in "$@"; do keep+=(! -name "$k"); done
    tmp=$(mktemp -d)
    (cd "$tmp" && unzip -q "$whl" && find . -path "./$drop" "${keep[@]}" -delete \
        && python3 -c '
import csv, glob, os
rec = glob.glob("*.dist-info/RECORD")[0]
rows = [r for r in csv.reader(open(rec)) if os.path.exists(r[0]) or r[0] == rec]
csv.writer(open(rec, "w", newline="")).writerows(rows)
') && rm "$whl" && (cd "$tmp" && zip -q -r "$whl" .) && rm -rf "$tmp"
}
fetch "$out" "${pkgs[@]}"
if [[ "${SERVING:-0}" == 1 ]]; then
    # `transformers serve` and the load generator, beside the workflow's wheels
    fetch "$out" openai==3.54.0 jiter==0.19.0 distro httpx httpcore httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 anyio==4.16.0 sniffio==1.3.1 h11==0.16.0 \
        click==8.5.1 rich==15.0.0 markdown-it-py mdurl pygments fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
        annotated-doc==0.0.7 opentelemetry-api==1.45.2 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 frozenlist==1.8.0 aiosignal==1.4.0 \
        propcache==0.5.4 aiohappyeyeballs==2.7.1
    # LightLLM's own pins (envs/lightllm.yaml) in a folder of their own: its older fastapi,
    # starlette and uvicorn must not shadow the ones above. There:
    #   python3 -m pip install --no-index --no-deps --target /tmp/site-lightllm .whl/lightllm/*.whl
    #   mkdir -p .venv-lightllm/bin && printf '#!/bin/sh\nexport PYTHONPATH=/tmp/site-lightllm:$PYTHONPATH\nexec python3 "$@"\n' \
    #       > .venv-lightllm/bin/python && chmod +x .venv-lightllm/bin/python   # engine_python of results/reference/2026-11-24-h100-serve-vllm/config.yaml
    fetch "$out/lightllm" lightllm==0.0.1 rpyc plumbum pyzmq fastapi==0.115.12 starlette==0.46.2 uvicorn==0.27.1 \
        uvloop==0.19.0
fi
if [[ "${FIGURES:-0}" == 1 ]]; then
    # the figure rule's closure beyond a CUDA PyTorch image (jinja2, packaging and
    # typing-extensions come with torch; jsonschema is above)
    fetch "$out" altair==6.3.0 narwhals==2.29.0 vl-convert-python==1.9.0.post1
fi
if [[ "${SLIM_BNB:-0}" == 1 ]]; then
    slim_wheel "$(ls "$out"/bitsandbytes-*.whl)" 'bitsandbytes/libbitsandbytes_*.so' '*cuda130.so' '*cpu.so'
fi
if [[ "${VLLM_GPU:-0}" == 1 ]]; then
    # Into vllm/, which offline-run.sh installs to /tmp/site-vllm behind the interpreter
    # wrapper .venv-vllm-gpu/bin/python (config engine_python.vllm): its fastapi < 0.137,
    # starlette and pydantic must come before the workflow's. What differs from pip's own
    # resolution of vllm==0.26.0 is in the requirements file and said there: torch's stack
    # and the GPU-kernel extras are left out (the image has the first; flashinfer is not
    # carried, so the wrapper sets VLLM_USE_FLASHINFER_SAMPLER=0), and apache-tvm-ffi is
    # 0.1.15.post2 (xgrammar 0.2.8 needs >= 0.1.11; vLLM pins 0.1.10).
    mapfile -t vllm_pkgs < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$(dirname "$0")/requirements-vllm-gpu.txt")
    fetch "$out/vllm" "${vllm_pkgs[@]}"
    if [[ "${SLIM_VLLM:-0}" == 1 ]]; then
        slim_wheel "$(ls "$out"/vllm/vllm-0.26.0-*.whl)" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so'
    fi
fi
if [[ "${SGLANG_GPU:-0}" == 1 ]]; then
    # Into sglang/, which offline-run.sh installs to /tmp/site-sglang behind the interpreter
    # wrapper .venv-sglang-gpu/bin/python (config engine_python.sglang): its transformers
    # (5.12.1), openai and xgrammar pins must come before the workflow's. What differs from
    # pip's own resolution of sglang==0.5.17 is in the requirements file and said there.
    # sglang ships manylinux_2_34 wheels only, llguidance manylinux_2_31.
    platforms=(--platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 "${platforms[@]}")
    mapfile -t sglang_pkgs < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$(dirname "$0")/requirements-sglang-gpu.txt")
    fetch "$out/sglang" "${sglang_pkgs[@]}"
fi
if [[ -n "${PIECES_MIB:-}" ]]; then
    for gpu_set in vllm sglang; do  # the engines' GPU sets, each the size of several transfers
        if [[ -d $out/$gpu_set ]]; then
            bash "$(dirname "$0")/pieces.sh" pack "$out" "$gpu_set" "$PIECES_MIB"
        fi
    done
fi
du -sh "$out"
