"""llmbench.forkserver: ranks forked from a warm server see their own environment, working
directory and arguments, lead their own session, fail together, stop together, and the
launcher falls back to exec when no server can start. A light preload (json; torch where
threads are checked) keeps these fast; the real preload runs in tests/e2e."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from llmbench import forkserver, launch, procs

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")
SCRIPTS = str(Path(__file__).resolve().parents[2] / "workflow" / "scripts")


def env(**extra):
    return {**os.environ, "PYTHONPATH": os.pathsep.join([FIXTURES, SCRIPTS]), **extra}


def start(tmp_path, ranks=2, preload=("json",), idle_s=30.0, **extra):
    base = env(**extra)
    envs = [{**base, **launch.rank_env(r, ranks, 29999)} for r in range(ranks)]
    log = tmp_path / "run.log"
    proc = forkserver.launch("fork_probe", ["--out", str(tmp_path)], envs, cwd=tmp_path, log=log,
                             server_env=base, preload=preload, idle_s=idle_s)
    return proc, log


def ranks_seen(tmp_path, n):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all((tmp_path / f"rank{r}.json").exists() for r in range(n)):
        time.sleep(0.05)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


def test_each_rank_gets_its_environment_cwd_arguments_and_the_log(tmp_path):
    proc, log = start(tmp_path, PROBE_VAR="seen")
    assert proc.wait(timeout=60) == 0
    seen = ranks_seen(tmp_path, 2)
    assert [s["rank"] for s in seen] == [0, 1] and {s["world"] for s in seen} == {"2"}
    assert {s["probe_var"] for s in seen} == {"seen"} and {s["port"] for s in seen} == {"29999"}
    assert {s["cwd"] for s in seen} == {str(tmp_path)}
    assert all(s["argv"] == ["--out", str(tmp_path)] for s in seen)
    # one new session per repeat, led by the pid the launcher holds; ranks are its members
    assert all(s["sid"] == s["pgid"] == proc.pid for s in seen) and len({s["pid"] for s in seen}) == 2
    text = log.read_text()
    assert "rank 0 says hello" in text and "rank 1 says hello" in text


def test_the_pid_a_launcher_gets_already_leads_its_session(tmp_path):
    """The launcher may stop a repeat the moment it has its pid (a memory cap already
    passed, a signal): killpg reaches the repeat only once its leader has called setsid, so
    the server replies only after that. A stop before it would find no group, do nothing,
    and leave the repeat running unwatched."""
    for i in range(10):
        d = tmp_path / str(i)
        d.mkdir()
        proc, _ = start(d, ranks=1, PROBE_MODE="sleep")
        try:
            assert os.getsid(proc.pid) == proc.pid, f"launch {i}: its leader has no session of its own yet"
        finally:
            procs.kill_group(proc)


def test_every_repeat_is_a_new_process(tmp_path):
    pids = set()
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        proc, _ = start(d, ranks=1)
        assert proc.wait(timeout=60) == 0
        pids.add(ranks_seen(d, 1)[0]["pid"])
        assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    assert len(pids) == 2


def test_a_failing_rank_stops_the_others_and_sets_the_exit_code(tmp_path):
    proc, log = start(tmp_path, PROBE_MODE="fail-rank1")
    assert proc.wait(timeout=60) == 3  # rank 0 sleeps 600 s unless stopped
    assert "rank 1" in log.read_text() and "stopping the other ranks" in log.read_text()


def test_kill_group_stops_every_rank(tmp_path):
    proc, _ = start(tmp_path, PROBE_MODE="sleep")
    pids = [s["pid"] for s in ranks_seen(tmp_path, 2)]
    procs.kill_group(proc)
    assert proc.returncode is not None and proc.returncode < 0
    time.sleep(0.2)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_an_exit_code_sent_right_behind_the_reply_is_read(tmp_path, monkeypatch):
    """A repeat that ends at once has its exit code's line sent right behind the server's
    reply; the launcher reads both in one go, and the second line must reach the repeat."""
    ours, server = socket.socketpair()
    server.sendall(b'{"pid": 4242}\n{"rc": 3}\n')
    monkeypatch.setattr(forkserver, "_ensure_server", lambda *_, **__: ours)
    repeat = forkserver.launch("fork_probe", [], [env()], cwd=tmp_path, log=tmp_path / "run.log", server_env=env())
    assert repeat.pid == 4242 and repeat.wait(timeout=5) == 3
    server.close()


def test_poll_never_waits_for_another_threads_read():
    """The memory watchdog polls while the launcher's thread waits on the same repeat; its
    poll answers at once instead of queueing for the reading thread's lock."""
    ours, server = socket.socketpair()
    repeat = forkserver.Forked(ours, 4242, ["repeat"])
    held, done = threading.Event(), threading.Event()

    def reader():  # holds the lock as a wait's read does, until told to stop
        with repeat._lock:
            held.set()
            done.wait(10)

    threading.Thread(target=reader, daemon=True).start()
    held.wait(5)
    answers = []
    poller = threading.Thread(target=lambda: answers.append(repeat.poll()), daemon=True)
    poller.start()
    poller.join(5)
    done.set()
    assert answers == [None]  # answered while the other thread held the lock
    server.sendall(b'{"rc": 0}\n')
    assert repeat.wait(timeout=5) == 0
    server.close()


def test_wait_times_out_like_popen(tmp_path):
    import subprocess

    proc, _ = start(tmp_path, ranks=1, PROBE_MODE="sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.3)
    procs.kill_group(proc)


def test_a_signal_that_stops_the_launcher_mid_wait_can_still_read_the_repeat():
    """The launcher waits on a forked repeat under its lock; a SIGTERM then runs
    procs._on_signal in the same thread, whose kill_group waits on the same repeat. A plain
    lock deadlocked there (Snakemake's TERM left the job hanging until it was killed); the
    handler here reads the repeat's exit code from inside the wait and exits."""
    code = """
import signal, socket, sys
from llmbench.forkserver import Forked
ours, server = socket.socketpair()
repeat = Forked(ours, 0, ["repeat"])
def on_alarm(signum, frame):
    server.sendall(b'{"rc": 3}\\n')
    print("read in the handler:", repeat.poll(), flush=True)
    sys.exit(7)
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.3)
repeat.wait(timeout=10)
"""
    out = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=20)
    assert out.returncode == 7 and "read in the handler: 3" in out.stdout, out.stderr[-2000:]


def test_thread_count_comes_from_the_request_not_the_server(tmp_path):
    proc, _ = start(tmp_path, ranks=1, preload=("torch",), OMP_NUM_THREADS="2")
    assert proc.wait(timeout=120) == 0
    assert ranks_seen(tmp_path, 1)[0]["threads"] == 2  # the server imported torch with 1


def test_an_idle_server_exits_and_removes_its_socket(tmp_path):
    proc, _ = start(tmp_path, ranks=1, preload=("json", "os"), idle_s=0.5)
    assert proc.wait(timeout=60) == 0
    path = forkserver.socket_path(forkserver._key(os.sys.executable, "cpu", ("json", "os"), env()))
    deadline = time.monotonic() + 20
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not path.exists()


def test_a_server_that_cannot_start_is_unavailable_and_the_launcher_execs(tmp_path, monkeypatch):
    with pytest.raises(forkserver.Unavailable, match="no_such_module"):
        start(tmp_path, ranks=1, preload=("no_such_module",))
    # start_ranks falls back to exec and says so in the log
    monkeypatch.setattr(forkserver, "PRELOAD", ("no_such_module",))
    out = tmp_path / "x"
    out.mkdir()
    proc, how = launch.start_ranks(1, "fork_probe", ["--out", str(out)], env=env(), log=tmp_path / "fb.log",
                                   workdir=out, fork_server="cpu")
    assert how == "exec" and proc.wait(timeout=60) == 0
    assert "fork server unavailable, exec instead" in (tmp_path / "fb.log").read_text()
    assert ranks_seen(out, 1)[0]["rank"] == 0


def test_platforms_with_the_key_fork_from_their_accelerators_server_and_slurm_jobs_exec(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert forkserver.server_for({"accelerator": "cpu", "fork_server": True}) == "cpu"
    assert forkserver.server_for({"accelerator": "cuda", "fork_server": True}) == "cuda"
    assert forkserver.server_for({"accelerator": "cpu", "fork_server": False}) is None
    assert forkserver.server_for({"accelerator": "cuda"}) is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert forkserver.server_for({"accelerator": "cpu", "fork_server": True}) is None


def test_a_gpu_server_preloads_nothing_that_initialises_cuda():
    # PEFT imports bitsandbytes, which initialises CUDA on a GPU node: each rank imports it
    assert "peft" in forkserver.preload_for("cpu") and "peft" not in forkserver.preload_for("cuda")
    assert {"torch", "deepspeed", "transformers.models.llama.modeling_llama"} <= set(forkserver.preload_for("cuda"))
    gpu, cpu = forkserver.server_env_for("cuda"), forkserver.server_env_for("cpu")
    assert gpu["DS_ACCELERATOR"] == "cuda" and gpu["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert cpu["DS_ACCELERATOR"] == "cpu" and "PYTORCH_NVML_BASED_CUDA_CHECK" not in cpu


def test_a_gpu_server_whose_import_initialised_cuda_leaves_it_to_the_ranks(tmp_path, monkeypatch):
    base = env()
    envs = [{**base, **launch.rank_env(0, 1, 29999)}]
    monkeypatch.setattr(forkserver, "_FOUND_INITIALISING", {})
    kept = forkserver.initialising_path(sys.executable, "cuda", base)
    kept.unlink(missing_ok=True)  # an earlier session's
    with pytest.raises(forkserver.Unavailable, match="importing cuda_initialising initialised CUDA"):
        forkserver._ensure_server(forkserver.socket_path("refused"), sys.executable, "cuda",
                                  ("torch", "cuda_initialising"), base, 60, 5)
    # the launcher starts a server without it, and says so in the cell's log
    proc = forkserver.launch("fork_probe", ["--out", str(tmp_path)], envs, cwd=tmp_path, log=tmp_path / "run.log",
                             server_env=base, accelerator="cuda", preload=("torch", "cuda_initialising"), idle_s=5)
    assert proc.wait(timeout=60) == 0 and ranks_seen(tmp_path, 1)[0]["rank"] == 0
    assert "importing cuda_initialising initialised CUDA; each rank imports it" in (tmp_path / "run.log").read_text()
    assert forkserver._FOUND_INITIALISING[(sys.executable, "cuda")] == {"cuda_initialising"}
    assert json.loads(kept.read_text()) == ["cuda_initialising"]
    # the next launcher (another process: the next cell's job) reads what this one learnt and
    # goes to the server without it at once, starting none that would refuse
    monkeypatch.setattr(forkserver, "_FOUND_INITIALISING", {})
    tried, ensure = [], forkserver._ensure_server

    def counted(path, python, accelerator, preload, *args):
        tried.append(preload)
        return ensure(path, python, accelerator, preload, *args)

    monkeypatch.setattr(forkserver, "_ensure_server", counted)
    proc = forkserver.launch("fork_probe", ["--out", str(tmp_path)], envs, cwd=tmp_path, log=tmp_path / "next.log",
                             server_env=base, accelerator="cuda", preload=("torch", "cuda_initialising"), idle_s=5)
    assert proc.wait(timeout=60) == 0 and tried == [("torch",)]
    assert "initialised CUDA" not in (tmp_path / "next.log").read_text()
    kept.unlink()
    # the same import in a CPU server is no reason to refuse
    proc = forkserver.launch("fork_probe", ["--out", str(tmp_path)], envs, cwd=tmp_path, log=tmp_path / "run.log",
                             server_env=base, accelerator="cpu", preload=("torch", "cuda_initialising"), idle_s=5)
    assert proc.wait(timeout=60) == 0 and ranks_seen(tmp_path, 1)[0]["rank"] == 0


def test_the_key_ignores_per_rank_and_thread_variables_but_not_import_time_ones():
    base = {"PYTHONPATH": "x", "HOME": "/root"}
    k = forkserver._key("py", "cpu", ("json",), base)
    assert k == forkserver._key("py", "cpu", ("json",), {**base, "RANK": "1", "OMP_NUM_THREADS": "2", "FAKE": "y"})
    assert k != forkserver._key("py", "cpu", ("json",), {**base, "TORCH_LOGS": "+dynamo"})
    assert k != forkserver._key("py", "cpu", ("json",), {**base, "PYTHONPATH": "z"})
    assert k != forkserver._key("py", "cuda", ("json",), base)  # a server is one accelerator's


def test_a_server_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(forkserver.tempfile, "gettempdir", lambda: str(tmp_path))
    shared = tmp_path / f"llmbench-fork-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(forkserver.Unavailable, match="not this user's alone"):
        start(tmp_path, ranks=1)
    assert forkserver.stop_all() == 0


def test_relative_paths_are_the_launchers_not_the_servers(tmp_path, monkeypatch):
    """Snakemake hands the launcher paths relative to the workflow's folder; the server runs
    in /. (The first fresh-clone run of the default grid failed every cell this way.)"""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w").mkdir()
    base = env()
    proc = forkserver.launch("fork_probe", ["--out", "."], [{**base, **launch.rank_env(0, 1, 29999)}],
                             cwd=Path("w"), log=Path("run.log"), server_env=base, preload=("json",), idle_s=30)
    assert proc.wait(timeout=60) == 0
    assert "rank 0 says hello" in (tmp_path / "run.log").read_text()
    assert ranks_seen(tmp_path / "w", 1)[0]["cwd"] == str(tmp_path / "w")


def test_a_request_the_server_cannot_start_is_refused_with_the_reason(tmp_path):
    base = env()
    with pytest.raises(forkserver.Unavailable, match="a folder"):
        forkserver.launch("fork_probe", ["--out", "."], [{**base, **launch.rank_env(0, 1, 29999)}],
                          cwd=tmp_path / "missing", log=tmp_path / "run.log", server_env=base, preload=("json",))


@pytest.fixture
def own_servers(monkeypatch):
    """A server folder of the test's own: stop_all asks every server of the user, and the
    other pytest processes' cells use theirs meanwhile (short: a Unix socket's path has 107
    bytes)."""
    own = Path(tempfile.mkdtemp(prefix="lbfs-", dir="/tmp"))
    monkeypatch.setattr(forkserver.tempfile, "gettempdir", lambda: str(own))
    yield own
    shutil.rmtree(own, ignore_errors=True)


def test_a_repeat_whose_server_dies_under_it_is_an_error_that_says_so(tmp_path, own_servers):
    """The server killed while its repeat runs (the repeat, in its own session, lives on and
    then ends): its exit code is lost, and the launcher's outcome says the server went away
    rather than reporting an exit code of -1."""
    proc, log = start(tmp_path, ranks=1, preload=("json", "csv"), idle_s=600, PROBE_MODE="sleep")
    rank = ranks_seen(tmp_path, 1)[0]
    path = forkserver.socket_path(forkserver._key(os.sys.executable, "cpu", ("json", "csv"), env(PROBE_MODE="sleep")))
    server = next(p for p in psutil.process_iter(["cmdline"]) if str(path) in " ".join(p.info["cmdline"] or []))
    server.kill()
    server.wait(timeout=30)
    assert proc.poll() is None  # the repeat still runs: its server's death is not its end
    os.killpg(rank["pgid"], 9)
    out = launch._classify(proc, log=log, workdir=tmp_path, out=tmp_path / "out.json", timeout_s=60,
                           mem_cap_gib=None, label="repeat 0", oom_kills_before=launch.oom_kills())
    assert proc.returncode == forkserver.LOST and out.status == "error"
    assert out.reason.startswith("repeat 0: its fork server went away while it ran, so its exit code is unknown")


def test_stop_asks_an_idle_server_to_exit_now(tmp_path, own_servers):
    proc, _ = start(tmp_path, ranks=1, preload=("json", "sys"), idle_s=600)
    assert proc.wait(timeout=60) == 0
    path = forkserver.socket_path(forkserver._key(os.sys.executable, "cpu", ("json", "sys"), env()))
    assert path.exists() and forkserver.stop_all() >= 1
    deadline = time.monotonic() + 20
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not path.exists()  # well before its 600 s of idleness


def test_an_idle_server_sleeps_until_a_launcher_or_a_leaders_exit_wakes_it(tmp_path, own_servers):
    """No polling: between repeats the server blocks in select (a launcher's connection, or
    SIGCHLD through its wake-up pipe), so idle it is not woken at all (a server polling 20
    times a second holds about 1 % of a core with torch imported)."""
    proc, _ = start(tmp_path, ranks=1, preload=("json", "io"), idle_s=600)
    assert proc.wait(timeout=60) == 0
    path = forkserver.socket_path(forkserver._key(os.sys.executable, "cpu", ("json", "io"), env()))
    server = next(p for p in psutil.process_iter(["cmdline"]) if str(path) in " ".join(p.info["cmdline"] or []))
    try:
        before = server.num_ctx_switches().voluntary
        time.sleep(2)
        assert server.num_ctx_switches().voluntary - before <= 2  # 40 in 2 s when it polled
        # and a repeat still gets its exit code at once, woken by its leader's SIGCHLD
        again, _ = start(tmp_path, ranks=2, preload=("json", "io"), idle_s=600)
        assert again.wait(timeout=60) == 0
    finally:
        forkserver.stop_all()
