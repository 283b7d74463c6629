"""envs/wheelhouse.sh (offline GPU nodes) pins what envs/requirements.txt pins: the
reference runs ran from it, so a version bumped in one file only would make them run
another stack than the one CI tests. Its FIGURES=1 part carries the figure rule's closure.
Its VLLM_GPU=1 set (envs/requirements-vllm-gpu.txt) keeps the pins that made vLLM run on the
GPU machines, and envs/pieces.sh moves it in checked pieces."""

import random
import re
import subprocess

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


def test_the_wheelhouse_fetches_that_set_and_the_offline_run_starts_vllm_without_flashinfer(repo):
    script = (repo / "envs/wheelhouse.sh").read_text()
    block = script.split('if [[ "${VLLM_GPU:-0}" == 1 ]]; then', 1)[1].split("\nfi\n", 1)[0]
    assert "requirements-vllm-gpu.txt" in block and 'fetch "$out/vllm"' in block
    assert "pieces.sh\" pack" in block and "_vllm_fa2_C" in block
    run = (repo / "envs/offline-run.sh").read_text()
    wrapper = next(ln for ln in run.splitlines() if "site-vllm" in ln and "printf" in ln)
    assert "export PYTHONPATH=/tmp/site-vllm:" in wrapper and "VLLM_USE_FLASHINFER_SAMPLER=0" in wrapper
    assert "pieces.sh unpack" in run
    serve = (repo / "results/reference/2026-11-24-h100-serve-vllm/config.yaml").read_text()
    assert "vllm: .venv-vllm-gpu/bin/python" in serve and ".venv-vllm-gpu/bin/python" in run


def _pieces(repo, *args):
    return subprocess.run(["bash", str(repo / "envs/pieces.sh"), *map(str, args)], capture_output=True, text=True)


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def packed(repo, tmp_path):
    """A folder of 2.5 MiB of random wheels-to-be, packed into 1 MiB pieces."""
    src = tmp_path / "box" / "vllm"
    src.mkdir(parents=True)
    rng = random.Random(0)
    for i, size in enumerate((1_500_000, 1_100_000, 10)):
        (src / f"w{i}.whl").write_bytes(rng.randbytes(size))
    want = _tree(src)
    res = _pieces(repo, "pack", tmp_path / "box", "vllm", 1)
    assert res.returncode == 0, res.stderr
    return tmp_path / "box", want


def test_pieces_reassemble_to_the_same_files(repo, packed):
    box, want = packed
    parts = sorted(p.name for p in box.glob("vllm.tar.part-*"))
    assert parts == ["vllm.tar.part-000", "vllm.tar.part-001", "vllm.tar.part-002"]
    assert all((box / p).stat().st_size <= 2**20 for p in parts) and not (box / "vllm").exists()
    res = _pieces(repo, "unpack", box, "vllm")
    assert res.returncode == 0, res.stderr
    assert _tree(box / "vllm") == want


def test_a_missing_piece_is_named_and_nothing_is_unpacked(repo, packed):
    box, _ = packed
    (box / "vllm.tar.part-001").unlink()
    res = _pieces(repo, "unpack", box, "vllm")
    assert res.returncode != 0 and "vllm.tar.part-001" in res.stderr
    assert not (box / "vllm").exists() and not (box / "vllm.tar").exists()


def test_a_damaged_piece_is_named_and_nothing_is_unpacked(repo, packed):
    box, _ = packed
    piece = box / "vllm.tar.part-002"
    data = bytearray(piece.read_bytes())
    data[7] ^= 0xFF
    piece.write_bytes(bytes(data))
    res = _pieces(repo, "unpack", box, "vllm")
    assert res.returncode != 0 and "vllm.tar.part-002" in res.stdout + res.stderr
    assert not (box / "vllm").exists()
