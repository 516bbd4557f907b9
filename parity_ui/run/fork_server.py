"""Fork servers: a new worker of a setup already seen forks from a process that imported its libraries.

A worker's cold start on the CPU is mostly imports: `from vllm import LLM` is ~9 s of CPU, torch and
transformers ~3 s, paid again by every new worker although only the model, dtype or an engine argument
changed. A fork server (parity_ui.run.fork_server_main) is started once per process setup (engine,
interpreter, environment: the key a worker started ahead matches on), imports, and forks each new
worker of that setup; the child is served by the same code as a worker started on its own. On a
2-core machine that is the difference between a model switch in the app taking ~10 s and ~1 s of
imports, and a third of the test suite's CPU.

Where: on by default where no GPU is visible; off on a GPU machine, where a worker's start is mostly
weights, compilation and CUDA graphs (the imports are a small share) and a process that forks must
never have touched CUDA. PARITY_FORK_SERVER=1 or 0 overrides. A server that cannot start (another
environment without the engine, a crash) is remembered, and that setup's workers start on their own.
Servers end with this process (they watch it, as workers do).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Variables that change from one command to the next without changing how a worker imports: they are
# left out of a server's key (a test process sets both per test), and every child still gets the
# environment of its own start (ForkServer.fork sends it).
NOT_IN_KEY = ("PYTEST_CURRENT_TEST", "PARITY_DB")
EXITED_UNKNOWN = 255  # poll()'s answer for a worker that exited after its server died: not running, code lost

# Each worker (and each fork server) leads its own process group, so a terminal's Ctrl-C (sent to
# the foreground group) is the parent's to handle and the worker's group can be killed whole (vLLM's
# TP workers too). It stays in the parent's *session*: with the kernel's autogroup scheduling (on in
# most desktop and many server kernels) a new session is a new scheduling group that gets one share
# of the CPU for all its threads. Under a busy machine the engine's OpenMP threads then took turns on
# that one share and spun at every barrier: HF generate went from 11 s to 115 s with one busy process
# on 2 cores (bench/overhead.py --contention 1 showed it as a 16x overhead).
OWN_PROCESS_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


class ForkServerError(RuntimeError):
    pass


def enabled() -> bool:
    # A forked worker's exit is watched through a pidfd (Linux 5.3, Python 3.9): elsewhere a server
    # could not serve, and each setup would pay a server's imports before falling back.
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds") or sys.platform != "linux":
        return False
    said = os.environ.get("PARITY_FORK_SERVER", "").strip().lower()
    if said in ("1", "true", "yes", "on"):
        return True
    if said in ("0", "false", "no", "off"):
        return False
    from .hardware import on_gpu

    return not on_gpu()


class ForkedProcess:
    """A worker forked by a server, with the part of subprocess.Popen's interface EngineWorker uses
    (pid, poll, wait, returncode). It is the server's child, not ours: its exit is seen through a pidfd
    and its exit code asked of the server, which reaped it."""

    def __init__(self, server: ForkServer, pid: int):
        self.pid = pid
        self.args = ["fork of", server.engine]
        self.returncode: int | None = None
        self._server = server
        self._exited = False
        self._pidfd: int | None = os.pidfd_open(pid)

    def _has_exited(self, timeout: float = 0.0) -> bool:
        if self._pidfd is None:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], timeout)
        return bool(ready)

    def poll(self) -> int | None:
        if self._exited:
            return self.returncode if self.returncode is not None else EXITED_UNKNOWN
        if not self._has_exited():
            return None
        self._exited = True
        self.returncode = self._server.exit_code(self.pid)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode if self.returncode is not None else EXITED_UNKNOWN

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.1 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._has_exited(min(0.1, left))
        return self.returncode


class ForkServer:
    """One running server (see the module's docstring). Thread-safe: requests take turns on its socket."""

    def __init__(self, python: str, engine: str, env: dict[str, str], log_path: Path, timeout: float):
        self.engine = engine
        self.log_path = log_path
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log_path, "ab", buffering=0) as log:
            # Fixed arguments only, as for a worker; the interpreter path was checked (run.environments).
            self.proc = subprocess.Popen(
                [
                    python,
                    "-m",
                    "parity_ui.run.fork_server_main",
                    "--engine",
                    engine,
                    "--fd",
                    str(theirs.fileno()),
                    "--parent",
                    str(os.getpid()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                **OWN_PROCESS_GROUP,
            )
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        ready = self._receive(timeout, "importing its libraries")
        if "ready" not in ready:
            self.close()
            raise ForkServerError(f"the fork server for {engine} answered {ready!r} (log: {log_path})")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _receive(self, timeout: float | None, what: str) -> dict[str, Any]:
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(4096)
        except (OSError, TimeoutError) as e:
            self.close()
            raise ForkServerError(
                f"the fork server for {self.engine} failed while {what}: {e} (log: {self.log_path})"
            ) from e
        finally:
            if self._sock.fileno() >= 0:
                self._sock.settimeout(None)
        if not data:
            self.close()
            raise ForkServerError(f"the fork server for {self.engine} ended while {what} (log: {self.log_path})")
        return json.loads(data)

    def fork(self, conn_fd: int, cancel_fd: int, log_fd: int, preload: bool, env: dict[str, str]) -> ForkedProcess:
        """A new worker on these descriptors (its socket, the cancel flag, its log), with `env` as its
        environment: the one a worker started on its own now would have."""
        request = json.dumps({"fork": {"preload": preload, "env": env}}).encode()
        with self._lock:
            try:
                socket.send_fds(self._sock, [request], [conn_fd, cancel_fd, log_fd])
            except OSError as e:
                self.close()
                raise ForkServerError(f"the fork server for {self.engine} is gone: {e}") from e
            reply = self._receive(30.0, "forking a worker")
        return ForkedProcess(self, int(reply["pid"]))

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a child that exited (None when the server is gone and took it along)."""
        with self._lock:
            if self._sock.fileno() < 0:
                return None
            try:
                self._sock.send(json.dumps({"poll": pid}).encode())
                return self._receive(30.0, "reporting an exit").get("code")
            except (OSError, ForkServerError):
                return None

    def close(self) -> None:
        try:
            self._sock.close()  # the server ends when its socket closes
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


# Servers kept per process, the most recently used: each holds its libraries' memory (~0.5 GB for vLLM's),
# and a process that starts workers in many environments (a test session) would keep one per environment.
MAX_SERVERS = 4
_servers: dict[str, ForkServer] = {}  # least recently used first
_failed: set[str] = set()  # setups whose server could not start: their workers start on their own
_setup_locks: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()


def server_key(python: str, engine: str, env: dict[str, str]) -> str:
    """A server per interpreter, engine and whole environment (a worker's, os.environ included: what
    a process sees when it starts and imports, PYTHONPATH or HF_HUB_OFFLINE say, is fixed in the server)."""
    return json.dumps([python, engine, {k: v for k, v in env.items() if k not in NOT_IN_KEY}], sort_keys=True)


def server_for(python: str, engine: str, env: dict[str, str], log_path: Path, timeout: float) -> ForkServer | None:
    """The running server for a worker of this interpreter, engine and environment, started (and its
    imports waited for) when there is none; None when this setup's could not start."""
    setup = server_key(python, engine, env)
    with _registry_lock:
        if setup in _failed:
            return None
        lock = _setup_locks.setdefault(setup, threading.Lock())
    with lock:
        server = _servers.get(setup)
        if server is not None and server.alive:
            with _registry_lock:
                _servers[setup] = _servers.pop(setup)  # the most recently used now
            return server
        try:
            server = ForkServer(python, engine, env, log_path, timeout)
        except (ForkServerError, OSError):
            with _registry_lock:
                _failed.add(setup)
            return None
        with _registry_lock:
            _servers.pop(setup, None)
            _servers[setup] = server
            evicted = [_servers.pop(k) for k in list(_servers)[: max(0, len(_servers) - MAX_SERVERS)]]
        for old in evicted:
            old.close()  # its workers serve on (they watch this process, not their server)
        return server


def close_all() -> None:
    with _registry_lock:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        s.close()


atexit.register(close_all)
