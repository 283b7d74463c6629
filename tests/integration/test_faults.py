"""Faults injected for real, on the CPU: a launcher killed by SIGKILL (alone, and with its
whole process group, as killing Snakemake's group does), a cell that hangs past its
timeout. Each test checks what was left running (no process of the cell's sessions) and
what was written (no half record). The launcher is tests/fixtures/launcher.py, a real
process running llmbench's run_cell with stand-in workers and a test-double engine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from llmbench import launch, ledger, procs, record

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCRIPTS = Path(__file__).resolve().parents[2] / "workflow" / "scripts"
LAUNCHER = str(FIXTURES / "launcher.py")
#: generous: the leash reacts in well under a second; this only bounds a loaded machine
KILL_BOUND_S = 15


def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def in_sessions(sids: set[int]) -> list[psutil.Process]:
    """Live processes of these sessions."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(p.pid) in sids and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def start_launcher(out: Path, *args: str, via_shell: bool = False, **env: str) -> subprocess.Popen:
    """The launcher in a new session (so killing its group cannot hit pytest); via_shell puts
    a shell above it in that group, as Snakemake's job shell is above run_cell.py."""
    argv = [sys.executable, LAUNCHER, *args, str(out)]
    if via_shell:
        argv = ["sh", "-c", '"$@"; true', "sh", *argv]
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), str(SCRIPTS)]), **env}
    return subprocess.Popen(argv, env=full_env, start_new_session=True,
                            stdout=open(out / "launcher.out", "w"), stderr=subprocess.STDOUT)


def cell_processes(launcher_pid: int, rank_pids: list[int]) -> tuple[set[int], list[int]]:
    """The sessions the cell's processes sit in, and their pids: the launcher's descendants
    (the leash, torchrun, ranks, an engine; a fork server it happened to start is not the
    cell's and outlives it by design until idle) and the ranks (forked ranks hang below the
    fork server, not the launcher)."""
    pids = list(rank_pids)
    for p in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if "llmbench.forkserver" not in " ".join(p.cmdline()) or os.getsid(p.pid) != p.pid:
                pids.append(p.pid)
        except psutil.Error:
            continue
    server_sids = set()
    for p in psutil.Process(launcher_pid).children():
        with contextlib.suppress(psutil.Error):  # a child may exit meanwhile
            if "llmbench.forkserver" in " ".join(p.cmdline()):
                server_sids.add(p.pid)
    sids = set()
    for pid in pids:
        try:
            sids.add(os.getsid(pid))
        except OSError:
            pass
    return sids - server_sids - {os.getsid(0)}, pids


def kill_launcher(proc: subprocess.Popen, out: Path, group: bool) -> None:
    launcher_pid = int((out / "launcher.pid").read_text())
    if group:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, and the shell above it
    else:
        os.kill(launcher_pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.parametrize("group", [False, True], ids=["launcher", "group"])
@pytest.mark.parametrize("how,ranks", [("exec", 1), ("exec", 2), ("fork", 2)],
                         ids=["exec-1rank", "torchrun-2ranks", "forkserver-2ranks"])
def test_killing_the_launcher_kills_every_worker(tmp_path, how, ranks, group):
    pidfile = tmp_path / "pid"
    proc = start_launcher(tmp_path, "train", "--ranks", str(ranks), "--how", how, via_shell=group,
                          FAKE_MODE="sleep", FAKE_PIDFILE=str(pidfile))
    try:
        wait_until(lambda: all(Path(f"{pidfile}.rank{r}").exists() for r in range(ranks)), 120,
                   f"{ranks} sleeping ranks")
        launcher_pid = int((tmp_path / "launcher.pid").read_text())
        ranks_pids = [int(Path(f"{pidfile}.rank{r}").read_text()) for r in range(ranks)]
        sids, pids = cell_processes(launcher_pid, ranks_pids)
        assert all(live(p) for p in ranks_pids) and sids
        forked = ["llmbench.forkserver" in " ".join(psutil.Process(p).parent().cmdline()) for p in ranks_pids]
        assert forked == [how == "fork"] * ranks  # the path under test was taken
        kill_launcher(proc, tmp_path, group)
        wait_until(lambda: not in_sessions(sids) and not any(live(p) for p in pids), KILL_BOUND_S,
                   f"no process left of sessions {sids}: {in_sessions(sids)}")
    finally:
        for p in in_sessions(sids if "sids" in locals() else set()):
            p.kill()
    assert not (tmp_path / "record.json").exists()  # records are written whole at the end, or not at all
    assert not list(tmp_path.glob(".record.json.*"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
def test_a_cell_stopped_mid_repeat_resumes_with_the_repeats_it_finished(tmp_path, sig):
    """Snakemake's job group stopped during the second of three repeats (a call's deadline:
    `timeout` sends TERM, then KILL): no record, the first repeat kept; the rerun runs only
    the other two. Under TERM the launcher stops the ranks and also notes how long the
    stopped repeat ran (ledger.STOPPED), which the record, once written, replaces."""
    pidfile = tmp_path / "pid"
    proc = start_launcher(tmp_path, "train", "--repeats", "3", via_shell=True,
                          FAKE_MODE="okfirst", FAKE_PIDFILE=str(pidfile))
    try:
        wait_until(lambda: Path(f"{pidfile}.rank0").exists(), 120, "the second repeat running")
        launcher_pid = int((tmp_path / "launcher.pid").read_text())
        sids, pids = cell_processes(launcher_pid, [int(Path(f"{pidfile}.rank0").read_text())])
        time.sleep(1.0)
        os.killpg(proc.pid, sig)  # the launcher, and the shell above it
        proc.wait(timeout=KILL_BOUND_S)
        wait_until(lambda: not live(launcher_pid) and not in_sessions(sids), KILL_BOUND_S,
                   f"the launcher and every process of sessions {sids} gone")
    finally:
        for p in in_sessions(sids if "sids" in locals() else set()):
            p.kill()
    assert not (tmp_path / "record.json").exists()
    assert [p.name for p in tmp_path.glob(".repeat-*.json")] == [".repeat-0.json"]
    if sig == signal.SIGTERM:
        note = json.loads((tmp_path / ledger.STOPPED).read_text())
        assert note["index"] == 1 and note["ran_s"] >= 1.0
    else:  # no handler runs under KILL
        assert not (tmp_path / ledger.STOPPED).exists()
    again = start_launcher(tmp_path, "train", "--repeats", "3", FAKE_MODE="ok", FAKE_TPS="200")
    assert again.wait(timeout=120) == 0
    rec = record.read(tmp_path / "record.json")
    assert rec.status == "ok" and rec.metrics.tokens_per_s_runs == (100.0, 200.0, 200.0)
    assert [r["index"] for r in rec.provenance["resumed_repeats"]] == [0]
    assert not list(tmp_path.glob(".repeat-*.json")) and not (tmp_path / ledger.STOPPED).exists()


@pytest.mark.parametrize("group", [False, True], ids=["launcher", "group"])
def test_killing_the_launcher_kills_the_engine_mid_burst(tmp_path, group):
    proc = start_launcher(tmp_path, "serve", via_shell=group)
    sids: set[int] = set()
    try:
        # ready, and the burst under way (8 requests of 100 tokens, one token a second)
        wait_until(lambda: (tmp_path / "server.log").exists() and "fake openai server on"
                   in (tmp_path / "server.log").read_text(), 60, "the fake engine ready")
        launcher_pid = int((tmp_path / "launcher.pid").read_text())
        time.sleep(1.0)
        sids, pids = cell_processes(launcher_pid, [])
        engine = [p for p in pids if "fake_servers.py" in " ".join(psutil.Process(p).cmdline())]
        assert engine and all(live(p) for p in engine)
        kill_launcher(proc, tmp_path, group)
        wait_until(lambda: not in_sessions(sids) and not any(live(p) for p in pids), KILL_BOUND_S,
                   f"no engine process left: {in_sessions(sids)}")
    finally:
        for p in in_sessions(sids):
            p.kill()
    assert not (tmp_path / "record.json").exists()


# the cell's timeout must outlast its ranks' start: torchrun's own interpreter imports torch
# before it starts any rank, which on a loaded 2-core machine took over 10 s (a CI run's
# torchrun had started no rank when the cell's timeout stopped it)
@pytest.mark.parametrize("how,ranks,timeout_s", [("exec", 1, 10), ("exec", 2, 40), ("fork", 2, 10)],
                         ids=["exec-1rank", "torchrun-2ranks", "forkserver-2ranks"])
def test_a_hung_cell_is_stopped_by_its_timeout(tmp_path, how, ranks, timeout_s):
    """Ranks that never return (a sleep stands for a stuck collective): the cell is recorded
    as timeout and none of its processes is left."""
    pidfile = tmp_path / "pid"
    proc = start_launcher(tmp_path, "train", "--ranks", str(ranks), "--how", how, "--timeout-s", str(timeout_s),
                          FAKE_MODE="sleep", FAKE_PIDFILE=str(pidfile))
    wait_until(lambda: all(Path(f"{pidfile}.rank{r}").exists() for r in range(ranks)), 120, "sleeping ranks")
    ranks_pids = [int(Path(f"{pidfile}.rank{r}").read_text()) for r in range(ranks)]
    sids, pids = cell_processes(int((tmp_path / "launcher.pid").read_text()), ranks_pids)
    assert proc.wait(timeout=120) == 0
    from llmbench import record

    rec = record.read(tmp_path / "record.json")
    assert rec.status == "timeout" and f"timeout_s={timeout_s}" in rec.reason
    assert not in_sessions(sids) and not any(live(p) for p in pids)


def test_the_leash_passes_exit_status_through_and_forwards_sigterm(tmp_path):
    """What launch._classify reads from a return code must not change behind the leash:
    an exit code, a signal (-9 reads as the OOM killer), a graceful SIGTERM."""
    def run(code: str) -> int:
        return subprocess.run(procs.leash_argv([sys.executable, "-c", code]), timeout=60).returncode

    assert run("import sys; sys.exit(3)") == 3
    assert run("pass") == 0
    assert run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)") == -signal.SIGKILL
    marker = tmp_path / "term"
    code = (f"import signal, sys, time, pathlib\n"
            f"def bye(*_): pathlib.Path({str(marker)!r}).write_text('graceful'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(60)")
    leashed = subprocess.Popen(procs.leash_argv([sys.executable, "-c", code]), stdout=subprocess.PIPE,
                               start_new_session=True)
    assert leashed.stdout.readline().strip() == b"up"
    os.kill(leashed.pid, signal.SIGTERM)  # to the leash alone: it must reach the child
    # a lost signal never ends it; 120 s, not 30: a CI run at the start of `make test` (the
    # grids, Slurm and the other workers starting on 2 cores) once took longer than 30
    assert leashed.wait(timeout=120) == 0 and marker.read_text() == "graceful"


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_a_sigterm_that_comes_while_the_leash_is_still_starting_its_child_reaches_the_child(tmp_path, inherited):
    """The leash's handlers are in place before its child starts. Here the leash is slow to
    come back from starting it (a loaded node): a SIGTERM sent once the child is up must reach
    the child, not end the leash alone (default) nor be lost where whoever started the leash
    ignores SIGTERM (CI once hung 30 s on that). The leash runs in a fork of this process so
    that its Popen can be slowed."""
    marker = tmp_path / "term"
    code = (f"import signal, sys, time, pathlib\n"
            f"def bye(*_): pathlib.Path({str(marker)!r}).write_text('graceful'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(60)")
    read_end, write_end = os.pipe()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # the leash
        try:
            os.dup2(write_end, 1)
            signal.signal(signal.SIGTERM, inherited)
            real = procs.subprocess.Popen

            def slow_popen(*args, **kwargs):
                child = real(*args, **kwargs)
                time.sleep(3)  # the child prints 'up' and is sent SIGTERM meanwhile
                return child

            procs.subprocess.Popen = slow_popen
            procs.leash(me, [sys.executable, "-c", code])
        finally:
            os._exit(99)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as out:
        assert out.readline().strip() == b"up"
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert done[0] == pid, "the leash did not end within 30 s of its SIGTERM"
    assert os.waitstatus_to_exitcode(done[1]) == 0 and marker.read_text() == "graceful"


def test_what_the_leashed_child_leaves_running_is_killed_when_it_ends(tmp_path):
    """A rank orphaned by its torchrun (or a node launcher's torchrun, llmbench.nodes) is
    re-parented to the leash, which kills it once its child has ended."""
    pidfile = tmp_path / "orphan.pid"
    code = ("import subprocess, sys, pathlib\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            f"pathlib.Path({str(pidfile)!r}).write_text(str(p.pid))\n")
    assert subprocess.run(procs.leash_argv([sys.executable, "-c", code]), timeout=60).returncode == 0
    orphan = int(pidfile.read_text())
    wait_until(lambda: not live(orphan), 10, f"the orphan {orphan} killed")


def test_a_worker_killed_by_sigkill_is_still_oom_behind_the_leash(tmp_path, monkeypatch):
    counts = iter([0, 1])  # the kernel's OOM killer ran while the worker did
    monkeypatch.setattr(launch, "oom_kills", lambda: next(counts))
    out = tmp_path / "o.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), str(SCRIPTS)]), "FAKE_MODE": "sigkill"}
    outcome = launch.run_worker(1, "fake_worker", launch.worker_args(tmp_path / "s.json", out), env=env,
                                log=tmp_path / "run.log", workdir=tmp_path, out=out, timeout_s=60)
    assert outcome.status == "oom" and "SIGKILL" in outcome.reason and outcome.launcher == "exec"
    assert "oom_kill 0 -> 1" in outcome.reason
