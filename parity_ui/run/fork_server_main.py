"""A fork server for one worker setup: `python -m parity_ui.run.fork_server_main --engine MODULE:CLASS --fd N --parent PID`.

Started by parity_ui.run.fork_server with a side's interpreter and environment, exactly as a worker
would be. It imports the engine's libraries once (Engine.preload: `from vllm import LLM` alone is ~9 s of
CPU) and then forks one worker per request, so a new worker of the same setup (another model, dtype or
engine argument) starts in a fraction of a second instead of importing again. Nothing runs in this
process but imports: no model, no thread pool, no CUDA, so each child starts as clean as a fresh
process (parity_ui.run.worker_main.run serves it, as it serves a worker started on its own).

Requests come over the inherited SOCK_SEQPACKET socket `--fd`, one JSON object per message:
  {"fork": {"preload": bool, "env": {...}}} with three descriptors attached (the worker's socket, the cancel flag,
  its log) -> {"pid": N}; {"poll": PID} -> {"code": exit code or null while it runs}.
The server reaps its children itself and keeps their exit codes until asked; it ends when the parent
does (killing its children's process groups first) or when the socket closes (its workers then serve
on: each watches the parent itself, through a pidfd).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import socket
import sys
import traceback

WATCH_S = 0.5
MAX_FDS = 3
MAX_MESSAGE = 1 << 20  # a fork request carries the worker's environment


def _reap(codes: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        codes[pid] = os.waitstatus_to_exitcode(status)


def _child(sock: socket.socket, engine_spec: str, fds: list[int], parent: int, parent_pidfd: int, req: dict) -> None:
    """In the forked child: become a worker. Never returns into the server's loop."""
    code = 1
    try:
        sock.close()
        os.environ.clear()  # the environment of this worker's own start (the parent's now)
        os.environ.update(req.get("env") or {})
        os.setpgid(0, 0)  # its own process group, in the parent's session (parity_ui.run.fork_server.OWN_PROCESS_GROUP)
        conn_fd, cancel_fd, log_fd = fds
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        # A fresh process seeds these from the OS; a forked one would repeat its siblings' draws. (torch's
        # default generator starts from the same fixed seed in every process, forked or not.)
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        from ..engines import load_engine
        from .worker_main import run

        run(
            load_engine(engine_spec), conn_fd, cancel_fd, parent, bool(req.get("preload")), parent_pidfd
        )  # ends the process
    except BaseException:  # noqa: BLE001 - printed to the worker's log; the parent sees the exit code
        traceback.print_exc()
    finally:
        os._exit(code)


def serve(sock: socket.socket, engine_spec: str, parent: int, parent_pidfd: int) -> None:
    codes: dict[int, int] = {}
    children: set[int] = set()
    while True:
        if os.getppid() != parent:  # the parent is gone: so are the workers it started through us
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        _reap(codes)
        ready, _, _ = select.select([sock], [], [], WATCH_S)
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
        except OSError:
            return
        if not data:  # the parent closed its end
            return
        req = json.loads(data)
        if "fork" in req:
            pid = os.fork()
            if pid == 0:
                # the child watches the parent it serves, not this server: a server that ends (the
                # parent keeps a few) leaves its workers running
                _child(sock, engine_spec, fds, parent, parent_pidfd, req["fork"])
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(json.dumps({"pid": pid}).encode())
        elif "poll" in req:
            _reap(codes)
            pid = int(req["poll"])
            code = codes.pop(pid, None)
            if code is not None:
                children.discard(pid)
            sock.send(json.dumps({"code": code}).encode())
        else:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": f"unknown request {sorted(req)}"}).encode())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    sock = socket.socket(fileno=args.fd)
    parent_pidfd = os.pidfd_open(args.parent)  # the parent waits for our "ready": it is alive now
    from ..engines import load_engine

    load_engine(args.engine).preload()  # the imports every child shares; an instance is each child's own
    sock.send(json.dumps({"ready": os.getpid(), "python": sys.executable}).encode())
    serve(sock, args.engine, args.parent, parent_pidfd)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
