"""Fork servers (parity_ui.run.fork_server): a new worker of a setup already seen is forked from a
process that imported the engine's libraries once. Real processes, with the standard-library engine
(openai): what is checked is the process tree, the exit codes and the fall-backs, not an engine."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from parity_ui.run import fork_server
from parity_ui.run.workers import EnginePool, describe_exit

ENGINE = "parity_ui.engines.openai_engine:OpenAIEngine"
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def forking(monkeypatch):
    monkeypatch.setenv("PARITY_FORK_SERVER", "1")
    pool = EnginePool()
    yield pool
    pool.close()


def _server_of(pid: int) -> psutil.Process:
    server = psutil.Process(pid).parent()
    assert server is not None and "parity_ui.run.fork_server_main" in server.cmdline()
    return server


def test_workers_of_one_setup_are_forked_by_one_server_and_are_workers_like_any_other(forking):
    env = {"PARITY_T": "fork-1"}
    a = forking.worker("k1", "a", ENGINE, sys.executable, env)
    b = forking.worker("k2", "b", ENGINE, sys.executable, env)  # another model, say: the same process setup
    assert a.ensure_started()["pid"] == a.pid and b.ensure_started()["pid"] == b.pid and a.pid != b.pid
    server = _server_of(a.pid)
    assert _server_of(b.pid).pid == server.pid and server.ppid() == os.getpid()
    for w in (a, b):  # as parity_ui.run.fork_server.OWN_PROCESS_GROUP makes a worker started on its own
        assert os.getpgid(w.pid) == w.pid and os.getsid(w.pid) == os.getsid(0)
    other = forking.worker("k3", "c", ENGINE, sys.executable, {"PARITY_T": "fork-2"})  # another environment
    other.ensure_started()
    assert _server_of(other.pid).pid != server.pid
    a.stop()
    assert not a.alive and b.alive  # one worker stopped, its sibling and their server serve on
    assert server.is_running()


def test_a_forked_worker_killed_by_another_process_is_named_so_and_the_next_start_forks_anew(forking):
    w = forking.worker("k1", "a", ENGINE, sys.executable, {"PARITY_T": "fork-3"})
    w.ensure_started()
    first, server = w.pid, _server_of(w.pid)
    os.kill(first, signal.SIGKILL)
    proc = w._proc
    assert proc.wait(10) == -signal.SIGKILL and not w.alive  # the server reaped it and kept its code
    assert describe_exit(proc.returncode, None, None).startswith("was killed by SIGKILL from another process")
    assert w.ensure_started()["pid"] == w.pid != first
    assert _server_of(w.pid).pid == server.pid  # forked again, by the same server


def test_a_setup_whose_server_cannot_start_starts_its_workers_on_their_own(forking, tmp_path, monkeypatch):
    # Logs in a folder of this test's: the shared one also holds the other test process's servers of a
    # side "a", one of which may be the newest (seen in a fresh-clone run: an empty log read instead).
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path))
    env = {"PYTHONPATH": str(TESTS), "PARITY_T": "fork-4"}
    w = forking.worker("k1", "a", "fake_engine:PreloadFailsEngine", sys.executable, env)
    assert w.ensure_started()["pid"] == w.pid
    assert psutil.Process(w.pid).ppid() == os.getpid()  # started on its own, not forked
    again = forking.worker("k2", "b", "fake_engine:PreloadFailsEngine", sys.executable, env)
    again.ensure_started()
    assert psutil.Process(again.pid).ppid() == os.getpid()  # the failed setup is not retried
    log = "".join(p.read_text() for p in sorted(Path(w.log_path).parent.glob("fork-server-a-*.log"))[-1:])
    assert "cannot be imported ahead" in log


def test_off_means_every_worker_starts_on_its_own(monkeypatch):
    monkeypatch.setenv("PARITY_FORK_SERVER", "1")
    assert fork_server.enabled()
    monkeypatch.delattr(os, "pidfd_open")  # a system without pidfds (not Linux): never, even when asked
    assert not fork_server.enabled()
    monkeypatch.undo()
    monkeypatch.setenv("PARITY_FORK_SERVER", "0")
    assert not fork_server.enabled()
    pool = EnginePool()
    try:
        w = pool.worker("k1", "a", ENGINE, sys.executable, {"PARITY_T": "fork-5"})
        w.ensure_started()
        assert psutil.Process(w.pid).ppid() == os.getpid()
    finally:
        pool.close()


def test_when_the_parent_is_killed_its_server_and_the_forked_workers_go_too(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from parity_ui.run.workers import EnginePool
        pool = EnginePool()
        w = pool.worker("k", "a", {ENGINE!r}, sys.executable, {{"PARITY_T": "fork-6"}})
        w.ensure_started()
        print(w.pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PARITY_FORK_SERVER": "1", "PYTHONPATH": str(TESTS.parent)}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        worker = psutil.Process(int(parent.stdout.readline()))
        server = _server_of(worker.pid)
        parent.kill()
        parent.wait(10)
        gone, alive = psutil.wait_procs([worker, server], timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_server_serves_one_whole_environment_and_each_worker_gets_the_environment_of_its_start(forking, monkeypatch):
    # What a process reads when it starts and imports (PYTHONPATH, HF_HUB_OFFLINE, ...) is fixed in the
    # server: another os.environ is another server. Only variables that change per command without
    # touching imports (the database's path, pytest's current test) share one.
    a = fork_server.server_key(sys.executable, ENGINE, {"PYTHONPATH": "/x", "PARITY_DB": "/a.db"})
    assert a == fork_server.server_key(sys.executable, ENGINE, {"PYTHONPATH": "/x", "PARITY_DB": "/b.db"})
    assert a != fork_server.server_key(sys.executable, ENGINE, {"PYTHONPATH": "/y", "PARITY_DB": "/a.db"})
    side_env = {"PARITY_T": "fork-7"}
    first = forking.worker("k1", "a", ENGINE, sys.executable, side_env)
    first.ensure_started()
    monkeypatch.setenv("PARITY_T_OUTER", "changed")  # the parent's own environment moved on
    second = forking.worker("k2", "a", ENGINE, sys.executable, side_env)
    second.ensure_started()
    assert _server_of(second.pid).pid != _server_of(first.pid).pid
    assert psutil.Process(_server_of(second.pid).pid).environ().get("PARITY_T_OUTER") == "changed"


def test_a_server_let_go_for_a_newer_one_leaves_its_workers_serving(forking, monkeypatch):
    monkeypatch.setattr(fork_server, "MAX_SERVERS", 1)
    a = forking.worker("k1", "a", ENGINE, sys.executable, {"PARITY_T": "fork-8"})
    a.ensure_started()
    old_server = _server_of(a.pid)
    b = forking.worker("k2", "b", ENGINE, sys.executable, {"PARITY_T": "fork-9"})  # another setup: a new server
    b.ensure_started()
    old_server.wait(10)  # the older server ended ...
    assert a.alive and b.alive  # ... and its worker did not: it watches this process, not its server
    assert psutil.Process(a.pid).status() != psutil.STATUS_ZOMBIE
    a.stop()
    assert not a.alive
