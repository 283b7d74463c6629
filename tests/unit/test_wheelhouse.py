"""envs/wheelhouse.sh (offline GPU nodes) pins what envs/requirements.txt pins: the
reference runs ran from it, so a version bumped in one file only would make them run
another stack than the one CI tests. Its FIGURES=1 part carries the figure rule's closure.
Its VLLM_GPU=1 set (envs/requirements-vllm-gpu.txt) keeps the pins that made vLLM run on the
GPU machines, its SGLANG_GPU=1 set (envs/requirements-sglang-gpu.txt) SGLang's own, and
envs/pieces.sh moves each in checked pieces."""

import os
import random
import re
import subprocess
import sys

import pytest


def _pins(text: str) -> dict[str, str]:
    return {m[0].lower().replace("_", "-"): m[1] for m in re.findall(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#]+)", text)}


def test_wheelhouse_pins_agree_with_the_requirements(repo):
    script = (repo / "envs/wheelhouse.sh").read_text()
    wheel, req = _pins(script), _pins((repo / "envs/requirements.txt").read_text())
    shared = set(wheel) & set(req)
    assert {"snakemake", "deepspeed", "bitsandbytes", "megatron-core", "torchao", "altair", "vl-convert-python"} <= shared
    assert {k: wheel[k] for k in shared} == {k: req[k] for k in shared}
    figures = script.split('if [[ "${FIGURES:-0}" == 1 ]]; then', 1)[1].split("fi\n", 1)[0]
    assert {"altair", "vl-convert-python"} <= set(_pins(figures))


def _names(text: str) -> list[str]:
    return [m.lower().replace("_", "-") for m in re.findall(r"^([A-Za-z0-9_.-]+)==", text, re.M)]


#: vLLM's GPU-kernel extras and the image's torch stack: never in the carried vLLM set
NOT_CARRIED = {"torch", "torchaudio", "torchvision", "torchcodec", "triton", "flashinfer-python", "tilelang",
               "nvidia-cutlass-dsl", "quack-kernels", "humming-kernels", "pynvvideocodec", "tokenspeed-mla",
               "nvidia-cudnn-frontend"}


def test_the_vllm_gpu_set_pins_its_fixes_and_leaves_out_the_image_and_the_kernel_extras(repo):
    text = (repo / "envs/requirements-vllm-gpu.txt").read_text()
    pins, names = _pins(text), _names(text)
    assert pins["vllm"] == "0.26.0"              # pins torch==2.11.0, the GPU image's torch
    assert pins["apache-tvm-ffi"] == "0.1.15.post2"  # xgrammar 0.2.8 needs >= 0.1.11 (vLLM pins 0.1.10)
    assert pins["xgrammar"] == "0.2.8" and pins["fastapi"].startswith("0.136.")  # vLLM wants < 0.137
    assert len(names) == len(set(names)), "one version of each, or pip stops the whole install"
    assert not NOT_CARRIED & set(names)
    assert not [n for n in names if n.startswith(("nvidia-cutlass-dsl", "nvidia-cu", "cuda-"))]
    assert all(re.fullmatch(r"[^=\s]+==[^=\s]+", ln) for ln in text.splitlines() if ln and not ln.startswith("#"))


def _block(script: str, opening: str) -> str:
    return script.split(opening, 1)[1].split("\nfi\n", 1)[0]


def test_the_wheelhouse_fetches_that_set_and_the_offline_run_starts_vllm_without_flashinfer(repo):
    script = (repo / "envs/wheelhouse.sh").read_text()
    block = _block(script, 'if [[ "${VLLM_GPU:-0}" == 1 ]]; then')
    assert "requirements-vllm-gpu.txt" in block and 'fetch "$out/vllm"' in block and "_vllm_fa2_C" in block
    pieces = _block(script, 'if [[ -n "${PIECES_MIB:-}" ]]; then')
    assert "for gpu_set in vllm sglang;" in pieces and 'pieces.sh" pack "$out" "$gpu_set"' in pieces
    run = (repo / "envs/offline-run.sh").read_text()
    assert "\ngpu_set vllm VLLM_USE_FLASHINFER_SAMPLER=0\n" in run
    assert "export PYTHONPATH=/tmp/site-%s:" in run and 'bash envs/pieces.sh unpack "$whl" "$name"' in run
    serve = (repo / "results/reference/2026-11-24-h100-serve-vllm/config.yaml").read_text()
    assert "vllm: .venv-vllm-gpu/bin/python" in serve and ".venv-$name-gpu/bin/python" in run


#: SGLang's GPU-kernel packages that a dense bf16 Llama on Hopper does not run, and the
#: image's torch (its torchvision is carried: SGLang imports it at start-up)
NOT_CARRIED_SGLANG = {"torch", "torchaudio", "torchcodec", "triton", "flash-attn-4", "helion", "humming-kernels",
                      "nvidia-cutlass-dsl", "nvidia-mathdx", "quack-kernels", "sgl-deep-gemm", "tilelang",
                      "tokenspeed-mla", "nvidia-cudnn-frontend", "numba"}


def test_the_sglang_gpu_set_pins_sglang_and_its_kernels_and_leaves_out_the_image(repo):
    text = (repo / "envs/requirements-sglang-gpu.txt").read_text()
    pins, names = _pins(text), _names(text)
    assert pins["sglang"] == "0.5.17"            # pins torch==2.11.0, the GPU image's torch
    assert pins["sglang-kernel"] == "0.4.5" and pins["flashinfer-python"] == "0.6.15.post1"  # its own pins
    assert pins["transformers"] == "5.12.1" and pins["torchvision"] == "0.26.0"  # SGLang's pin; torch 2.11's
    assert {"ipython", "gguf", "soundfile", "dill"} <= set(names)  # imported at start-up, some undeclared
    assert len(names) == len(set(names)), "one version of each, or pip stops the whole install"
    assert not NOT_CARRIED_SGLANG & set(names)
    assert not [n for n in names if n.startswith(("nvidia-cu", "nvidia-nccl", "cuda-tile"))]
    assert all(re.fullmatch(r"[^=\s]+==[^=\s]+", ln) for ln in text.splitlines() if ln and not ln.startswith("#"))


def test_the_wheelhouse_fetches_the_sglang_set_and_the_offline_run_installs_it(repo):
    script = (repo / "envs/wheelhouse.sh").read_text()
    block = _block(script, 'if [[ "${SGLANG_GPU:-0}" == 1 ]]; then')
    assert "requirements-sglang-gpu.txt" in block and 'fetch "$out/sglang"' in block
    assert "manylinux_2_34_x86_64" in block     # sglang 0.5.17 ships no older tag
    assert "SGLANG_GPU=1" in script.split("set -euo pipefail", 1)[0]  # documented in the header
    run = (repo / "envs/offline-run.sh").read_text()
    assert "\ngpu_set sglang\n" in run and "/tmp/site-$name" in run


def _pieces(repo, *args):
    return subprocess.run(["bash", str(repo / "envs/pieces.sh"), *map(str, args)], capture_output=True, text=True)


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _pack(repo, box, name):
    """A folder of 2.5 MiB of random wheels-to-be, packed into 1 MiB pieces."""
    src = box / name
    src.mkdir(parents=True)
    rng = random.Random(0)
    for i, size in enumerate((1_500_000, 1_100_000, 10)):
        (src / f"w{i}.whl").write_bytes(rng.randbytes(size))
    want = _tree(src)
    res = _pieces(repo, "pack", box, name, 1)
    assert res.returncode == 0, res.stderr
    return want


@pytest.fixture
def packed(repo, tmp_path):
    return tmp_path / "box", _pack(repo, tmp_path / "box", "vllm")


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_pieces_reassemble_to_the_same_files(repo, tmp_path, name):
    box = tmp_path / "box"
    want = _pack(repo, box, name)
    if name == "sglang":  # both sets side by side in one wheelhouse, as SGLANG_GPU=1 VLLM_GPU=1 leave them
        other = _pack(repo, box, "vllm")
    parts = sorted(p.name for p in box.glob(f"{name}.txz.part-*"))
    assert parts == [f"{name}.txz.part-000", f"{name}.txz.part-001", f"{name}.txz.part-002"]
    assert all((box / p).stat().st_size <= 2**20 for p in parts) and not (box / name).exists()
    res = _pieces(repo, "unpack", box, name)
    assert res.returncode == 0, res.stderr
    assert _tree(box / name) == want
    if name == "sglang":
        assert _pieces(repo, "unpack", box, "vllm").returncode == 0 and _tree(box / "vllm") == other


def test_a_missing_piece_is_named_and_nothing_is_unpacked(repo, packed):
    box, _ = packed
    (box / "vllm.txz.part-001").unlink()
    res = _pieces(repo, "unpack", box, "vllm")
    assert res.returncode != 0 and "vllm.txz.part-001" in res.stderr
    assert not (box / "vllm").exists() and not (box / "vllm.txz").exists()


def test_a_damaged_piece_is_named_and_nothing_is_unpacked(repo, packed):
    box, _ = packed
    piece = box / "vllm.txz.part-002"
    data = bytearray(piece.read_bytes())
    data[7] ^= 0xFF
    piece.write_bytes(bytes(data))
    res = _pieces(repo, "unpack", box, "vllm")
    assert res.returncode != 0 and "vllm.txz.part-002" in res.stdout + res.stderr
    assert not (box / "vllm").exists()


def test_a_packed_wheel_comes_back_stored_with_the_same_members(repo, tmp_path):
    """Wheels travel uncompressed inside the xz stream: the same members, byte for byte."""
    import zipfile

    box = tmp_path / "box"
    (box / "sglang").mkdir(parents=True)
    whl = box / "sglang" / "k-1.0-py3-none-any.whl"
    members = {"k/__init__.py": b"x = 1\n" * 1000, "k/ops.so": random.Random(1).randbytes(300_000) * 4,
               "k-1.0.dist-info/RECORD": b"k/__init__.py,,\n"}
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    assert _pieces(repo, "pack", box, "sglang", 1).returncode == 0
    assert sum(p.stat().st_size for p in box.glob("sglang.txz.part-*")) < 400_000  # the repeats seen across 300 kB
    res = _pieces(repo, "unpack", box, "sglang")
    assert res.returncode == 0, res.stderr
    with zipfile.ZipFile(whl) as z:
        assert {i.filename: z.read(i) for i in z.infolist()} == members
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}


def test_the_offline_run_lets_python_keep_its_bytecode_caches_whatever_the_shell_says(repo, tmp_path):
    """envs/offline-run.sh installs the wheels with --no-compile; a shell that sets
    PYTHONDONTWRITEBYTECODE (some GPU images' do) would then have every worker, rank and
    engine compile them from source again. The script runs Snakemake without it (a stand-in
    python3 on PATH answers pip and reports what Snakemake would see)."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs/offline-run.sh").write_text((repo / "envs/offline-run.sh").read_text())
    (tmp_path / "whl").mkdir()
    (tmp_path / "whl/none-0-py3-none-any.whl").write_text("")
    (tmp_path / "site").mkdir()
    (tmp_path / "bin").mkdir()
    stub = tmp_path / "bin/python3"
    stub.write_text(f'#!/bin/sh\ncase "$*" in\n  *"-m pip"*) exit 0 ;;\nesac\n'
                    f"exec {sys.executable} -c 'import sys; print(sys.dont_write_bytecode)'\n")
    stub.chmod(0o755)
    done = subprocess.run(["bash", "envs/offline-run.sh", "whl", "all"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                               "LLMBENCH_SITE": str(tmp_path / "site"), "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert (tmp_path / "site/.llmbench-installed").exists()
