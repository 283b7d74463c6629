"""The JIT-op load guard: a dead loader's build lock is removed, a live one's never is."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llmbench.train import jit_ops

SCRIPTS = Path(__file__).resolve().parents[2] / "workflow" / "scripts"

# A loader as DeepSpeed's is under the guard: hold the flock, take torch's baton, work, and
# release the baton (os.remove, which fails if someone removed it meanwhile).
HOLDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from llmbench.train import jit_ops
    folder, ready, hold_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    with jit_ops.op_load_lock(folder):
        fd = os.open(folder / "lock", os.O_CREAT | os.O_EXCL)
        ready.touch()
        time.sleep(hold_s)
        os.close(fd)
        os.remove(folder / "lock")
""")


def start_holder(tmp_path: Path, hold_s: float) -> subprocess.Popen:
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "op"), str(ready), str(hold_s)], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "holder did not start"
        time.sleep(0.05)
    return proc


def test_a_baton_left_behind_is_removed_once(tmp_path):
    op = tmp_path / "op"
    op.mkdir()
    (op / "lock").touch()
    with jit_ops.op_load_lock(op) as stale:
        assert stale and not (op / "lock").exists()
    with jit_ops.op_load_lock(op) as stale:
        assert not stale


def test_a_live_holders_baton_is_never_removed(tmp_path):
    """CI failed on this: a cell's load was stripped of its lock by age, and its release
    raised, so DeepSpeed reported that cpu_adam failed to build/load."""
    holder = start_holder(tmp_path, hold_s=1.5)
    t0 = time.monotonic()
    with jit_ops.op_load_lock(tmp_path / "op") as stale:
        waited = time.monotonic() - t0
        assert not stale
    assert holder.wait(timeout=60) == 0  # its own release found its baton
    assert waited > 0.5  # it waited for the holder rather than going past it


def test_a_killed_holders_baton_is_removed(tmp_path):
    """CI hung on this: a worker killed by the memory cap while holding the op's lock."""
    holder = start_holder(tmp_path, hold_s=600)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert (tmp_path / "op" / "lock").exists()
    with jit_ops.op_load_lock(tmp_path / "op") as stale:
        assert stale and not (tmp_path / "op" / "lock").exists()


def test_deepspeed_loads_through_the_guard(tmp_path):
    """A real DeepSpeed op load with a dead process's baton in its build folder completes
    (set-up built the op in .venv's TORCH_EXTENSIONS_DIR, so the load does not compile)."""
    pytest.importorskip("deepspeed")
    code = textwrap.dedent("""
        import os
        from pathlib import Path
        from llmbench.train import jit_ops
        jit_ops.guard_jit_loads(); jit_ops.guard_jit_loads()  # idempotent
        from deepspeed.ops.op_builder.builder import OpBuilder
        assert OpBuilder.jit_load._llmbench_guarded
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
        folder = jit_ops.build_dir(ShareMemCommBuilder.NAME)
        with jit_ops.op_load_lock(folder):  # a holder that dies with its baton taken
            (folder / "lock").touch()
        print(ShareMemCommBuilder().load(verbose=False).__name__)
    """)
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS), "DS_ACCELERATOR": "cpu"}
    # the op folder and this interpreter's ninja first, as every worker has them
    # (launch.worker_env): another ninja would rebuild the op for this load, and then again
    # for the next worker that loads it
    jit_ops.op_env(env)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "removed the JIT build lock of op deepspeed_shm_comm" in out.stdout
    assert out.stdout.strip().endswith("deepspeed_shm_comm")


def test_without_flock_the_load_goes_on_and_leaves_the_baton(tmp_path, monkeypatch, capsys):
    """Lustre without -o flock answers flock with an error: no guard, and no baton removed
    (its holder may be alive)."""
    def no_flock(*_):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(jit_ops.fcntl, "flock", no_flock)
    (tmp_path / "op").mkdir()
    (tmp_path / "op" / "lock").touch()
    with jit_ops.op_load_lock(tmp_path / "op") as stale:
        assert not stale and (tmp_path / "op" / "lock").exists()
    assert "loading op op unguarded" in capsys.readouterr().out


def test_the_ops_a_cell_may_load_are_built_ahead_and_named(tmp_path):
    """`python -m llmbench.train.jit_ops build --platform cpu` (envs/setup.sh's step): each op
    of OPS loaded under the guard, in the folder the workers use, with its seconds;
    `--targets FILE` builds once for each platform its targets name; an unknown builder or
    platform is refused by name."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS), "TORCH_EXTENSIONS_DIR": str(jit_ops.extensions_dir())}

    def cli(*args, timeout=600):
        return subprocess.run([sys.executable, "-m", "llmbench.train.jit_ops", "build", *args],
                              capture_output=True, text=True, timeout=timeout, env=env)

    done = cli("--platform", "cpu")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = [line.split()[3] for line in done.stdout.splitlines() if line.startswith("llmbench: DeepSpeed op ")]
    assert names == ["cpu_adam", "deepspeed_shm_comm"]
    assert f"for platform cpu ({jit_ops.extensions_dir()})" in done.stdout
    listing = tmp_path / "todo.txt"
    listing.write_text("# two cells of one platform, and a line that names none\n"
                       "results/runs/finetune/cpu/tiny/deepspeed/L/bs1-g1/record.json\n"
                       "results/runs/search/finetune/cpu/tiny/deepspeed/QL-g1\nnot a target\n")
    done = cli("--targets", str(listing))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("for platform cpu") == 2, done.stdout
    bad = cli("--platform", "cpu", "--ops", "FastAdamBuilder", timeout=60)
    assert bad.returncode == 2 and "unknown builder(s) ['FastAdamBuilder']" in bad.stderr
    bad = cli("--platform", "a800x9", timeout=60)
    assert bad.returncode == 2 and "unknown platform(s) ['a800x9']" in bad.stderr


def test_the_build_has_the_environment_of_the_platforms_workers(monkeypatch, tmp_path):
    """build(platform) loads its accelerator's OPS in the environment the platform's workers
    have: its env over this process's, so the GPU image's TORCH_CUDA_ARCH_LIST=9.0a (which
    DeepSpeed's builder cannot read, and which would key another build than the cells')
    gives way to h100's 9.0; DS_ACCELERATOR its accelerator, whatever was set before."""
    pytest.importorskip("deepspeed")
    import deepspeed.accelerator

    from llmbench.platforms import Platform

    seen = []

    class Builder:
        def __init__(self, name):
            self.NAME = name

        def load(self, verbose):
            seen.append((self.NAME, os.environ["TORCH_CUDA_ARCH_LIST"], os.environ["DS_ACCELERATOR"]))

    class Accelerator:
        def create_op_builder(self, name):
            return Builder(name)

    # the build sets the platform's environment in its process: here a copy, put back after
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ.update({key: "as the image has it" for key in Platform.load("h100").env})
    os.environ.update({"TORCH_CUDA_ARCH_LIST": "9.0a", "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(tmp_path)})
    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", lambda: Accelerator())
    done = jit_ops.build("h100")
    assert seen == [("FusedAdamBuilder", "9.0", "cuda"), ("CPUAdamBuilder", "9.0", "cuda")]
    assert [name for name, _ in done] == ["FusedAdamBuilder", "CPUAdamBuilder"]
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)  # a folder set before is kept, as the workers do
    assert jit_ops.target_platforms(["results/runs/search/finetune/h200/llama2-13b/deepspeed/QL+R-g1",
                                     "results/runs/finetune/h100/llama2-7b/deepspeed/L/bs1-g1/record.json",
                                     "results/runs/finetune/h200/llama2-7b/deepspeed/L/bs2-g1/record.json",
                                     "# results/runs/finetune/a800/llama2-7b/deepspeed/L/bs2-g1/record.json",
                                     "results/runs/serve/rtx4090/llama2-7b/vllm/burst-g1/record.json",
                                     "results/runs/pretrain/a800/llama2-7b/megatron-tp1pp1/Naive/bs1-g1/record.json",
                                     ""]) == ["h200", "h100"]


def test_every_build_of_an_op_runs_the_interpreters_own_ninja(monkeypatch, tmp_path):
    """own_ninja_path puts a folder holding only a link to <sys.prefix>/bin/ninja first on
    PATH (once; again where the link points elsewhere), and leaves PATH as it is where the
    interpreter has no ninja or the link cannot be written; the workers' PATH has it."""
    import shutil

    from llmbench import launch

    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    own = prefix / "bin" / "ninja"
    monkeypatch.setattr(jit_ops.sys, "prefix", str(prefix))
    assert jit_ops.own_ninja_path("/usr/bin:/bin") == "/usr/bin:/bin"  # no ninja of its own
    own.write_text("#!/bin/sh\necho 1.13.2\n")
    own.chmod(0o755)
    path = jit_ops.own_ninja_path("/usr/bin:/bin")
    folder = prefix / "torch_extensions" / ".ninja"
    assert path == f"{folder}{os.pathsep}/usr/bin:/bin" and os.listdir(folder) == ["ninja"]
    assert Path(shutil.which("ninja", path=path)).resolve() == own
    assert jit_ops.own_ninja_path(path) == path  # a PATH that has it already: unchanged
    (folder / "ninja").unlink()
    (folder / "ninja").symlink_to("/usr/bin/true")  # another interpreter's, say: replaced
    assert jit_ops.own_ninja_path("") == str(folder) and os.readlink(folder / "ninja") == str(own)
    assert launch.worker_env({}, 1, 1)["PATH"].startswith(f"{folder}{os.pathsep}")
    shutil.rmtree(folder)
    folder.write_text("")  # a file where the folder goes: the link cannot be written
    assert jit_ops.own_ninja_path("/bin") == "/bin"


def test_an_activated_venv_does_not_build_the_ops_again(tmp_path):
    """Set-up builds the ops with `.venv/bin/python` and the system's PATH; a user who then
    activates the venv (README: `source .venv/bin/activate`) puts the venv's ninja first. Both
    run the interpreter's own ninja (own_ninja_path), so the op built by one is loaded, not
    built again, by the other: its library file is the same file afterwards."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    env.pop("TORCH_EXTENSIONS_DIR", None)
    plain = env.get("PATH", "")
    activated = f"{Path(sys.executable).parent}{os.pathsep}{plain}"

    def build(path):
        done = subprocess.run([sys.executable, "-m", "llmbench.train.jit_ops", "build", "--platform", "cpu",
                               "--ops", "CPUAdamBuilder"], capture_output=True, text=True, timeout=900,
                              env={**env, "PATH": path})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    build(plain)
    library = jit_ops.extensions_dir() / "cpu_adam" / "cpu_adam.so"
    before = library.stat()
    build(activated)
    build(plain)
    after = library.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
