#!/usr/bin/env bash
# A wheelhouse for an offline GPU node (Python 3.12, x86-64) that already has torch,
# transformers, peft and pandas: the workflow (snakemake and what it imports), DeepSpeed,
# bitsandbytes and megatron-core, at the versions of envs/requirements.txt. This is how the
# reference runs under results/reference/ ran on the lent GPU machines, which reach no
# package index:
#
#   bash envs/wheelhouse.sh .whl                 # here, with network
#   # there:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
#   python3 -m snakemake pretrain --configfile config/gpu-h100.yaml --cores 16 --resources gpu_slots=1
#
# SERVING=1 adds `transformers serve`'s and LightLLM's wheels (see below).
# FIGURES=1 adds altair and vl-convert (SVG/PNG export, 33 MB) so the figures build there
# too; without it, build the tables there and the figures where the records are copied to
# (`snakemake figures --config results_dir=<copied folder>`), as the reference runs did.
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
    snakemake==9.27.1 deepspeed==0.19.8 bitsandbytes==0.50.2 megatron-core==0.16.1 jsonschema==4.26.0
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
    #       > .venv-lightllm/bin/python && chmod +x .venv-lightllm/bin/python   # engine_python of gpu-h100-serve.yaml
    fetch "$out/lightllm" lightllm==0.0.1 rpyc plumbum pyzmq fastapi==0.115.12 starlette==0.46.2 uvicorn==0.27.1 \
        uvloop==0.19.0
fi
if [[ "${FIGURES:-0}" == 1 ]]; then
    # the figure rule's closure beyond a CUDA PyTorch image (jinja2, packaging and
    # typing-extensions come with torch; jsonschema is above)
    fetch "$out" altair==6.3.0 narwhals==2.29.0 vl-convert-python==1.9.0.post1
fi
if [[ "${SLIM_BNB:-0}" == 1 ]]; then
    whl=$(ls "$out"/bitsandbytes-*.whl)
    tmp=$(mktemp -d)
    (cd "$tmp" && unzip -q "$whl" \
        && find bitsandbytes -name 'libbitsandbytes_*.so' ! -name '*cuda130.so' ! -name '*cpu.so' -delete \
        && python3 - <<'EOF'
import csv, glob, os
rec = glob.glob("*.dist-info/RECORD")[0]
rows = [r for r in csv.reader(open(rec)) if os.path.exists(r[0]) or r[0] == rec]
csv.writer(open(rec, "w", newline="")).writerows(rows)
EOF
    ) && rm "$whl" && (cd "$tmp" && zip -q -r "$whl" .) && rm -rf "$tmp"
fi
du -sh "$out"
