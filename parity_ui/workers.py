"""One spawned process per engine, loaded once and kept warm.

The parent never imports torch or vllm. Every failure in a worker (an exception, CUDA OOM, a
crash, a hang past the timeout) comes back as `EngineError`; the worker is then stopped, and the
next request starts a fresh one, so a broken CUDA context never serves another run.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import CancelledError, EngineError
from .paths import cache_dir

EventCallback = Callable[[Any], None]


def _log_dir() -> Path:
    d = cache_dir() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _is_oom(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "OutOfMemoryError" in text or "out of memory" in text.lower()


def _worker_main(name: str, conn: Any, cancel: Any, log_path: str) -> None:
    # Ctrl-C in the terminal reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    from .engines import load_engine

    engine = load_engine(name)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:  # the parent went away
            return
        if kind == "shutdown":
            return
        try:
            if kind == "load":
                result: Any = engine.load(payload)
            elif kind == "generate":
                result = engine.generate(payload, lambda i, s: conn.send(("token", (i, s))), cancel.is_set)
            elif kind == "score":
                result = engine.score(payload)
            else:
                raise ValueError(f"unknown request {kind!r}")
            conn.send(("result", result))
        except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
            traceback.print_exc()
            conn.send(("error", {"type": type(e).__name__, "message": str(e)[:2000], "oom": _is_oom(e),
                                 "traceback": traceback.format_exc()[-4000:]}))


def _tail(path: str, n: int = 8) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


@dataclass
class LoadedEngine:
    info: Any  # EngineInfo
    load_s: float  # 0.0 when the worker was already warm


class EngineWorker:
    """A handle on one engine process. Not thread-safe: the service serialises calls."""

    def __init__(self, name: str, *, start_timeout: float = 120.0, load_timeout: float = 1800.0,
                 request_timeout: float = 3600.0):
        self.name = name
        self.start_timeout, self.load_timeout, self.request_timeout = start_timeout, load_timeout, request_timeout
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._cancel = self._ctx.Event()
        self._load_key: str | None = None
        self._info: Any = None
        self.log_path = ""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def _start(self) -> None:
        self.log_path = str(_log_dir() / f"{self.name}-{int(time.time() * 1000)}.log")
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(self.name, child, self._cancel, self.log_path),
                                       name=f"parity-{self.name}", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        kind, _ = self._wait(self.start_timeout, None, "starting")
        assert kind == "ready"

    def _wait(self, timeout: float, on_event: EventCallback | None, what: str) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            died = False
            if self._conn.poll(0.05):
                try:
                    kind, payload = self._conn.recv()
                except (EOFError, OSError):  # the pipe closed: the process is going away
                    died, kind, payload = True, "", None
                if kind == "token":
                    if on_event is not None:
                        on_event(payload)
                    continue
                if kind == "error":
                    self.stop()
                    hint = " (out of memory: lower max_model_len, batch_size or vllm.gpu_memory_utilization)" \
                        if payload["oom"] else ""
                    raise EngineError(f"{self.name} engine failed while {what}: {payload['type']}: "
                                      f"{payload['message']}{hint}",
                                      f"see the worker log {self.log_path}")
                if not died:
                    return kind, payload
            if died or not self._proc.is_alive():
                self._proc.join(5)  # let it finish exiting so its exit code is known
                code = self._proc.exitcode
                self.stop()
                killed = " (killed by the system: probably out of memory)" if code in (-9, 137) else ""
                raise EngineError(f"{self.name} engine process exited with code {code} while {what}{killed}. "
                                  f"Last log lines:\n{_tail(self.log_path)}",
                                  f"see the worker log {self.log_path}; a new worker starts on the next run")
            if time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"{self.name} engine did not answer within {timeout:.0f} s while {what}",
                                  "the worker was stopped; retry, or raise the timeout for very long runs")

    def ensure_loaded(self, load_key: str, load_request: Any) -> LoadedEngine:
        """Load the model unless this worker already holds it with the same load-time settings."""
        if self.alive and self._load_key == load_key:
            return LoadedEngine(self._info, 0.0)
        self.stop()  # a different model or load setting: free its memory first
        t0 = time.perf_counter()
        self._start()
        self._conn.send(("load", load_request))
        _, info = self._wait(self.load_timeout, None, "loading the model")
        self._load_key, self._info = load_key, info
        return LoadedEngine(info, time.perf_counter() - t0)

    def request(self, kind: str, payload: Any, on_event: EventCallback | None = None) -> Any:
        if not self.alive:
            raise EngineError(f"{self.name} engine is not loaded", "load a model first")
        # The cancel flag is NOT cleared here: a Stop pressed while the models were loading must
        # still stop this request. EnginePool.reset_cancel() clears it when a run starts.
        self._conn.send((kind, payload))
        _, result = self._wait(self.request_timeout, on_event, f"running {kind}")
        if self._cancel.is_set():
            raise CancelledError(f"{self.name} run was cancelled", "")
        return result

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def reset_cancel(self) -> None:
        self._cancel.clear()

    def stop(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        self._load_key = self._info = None
        if proc is None:
            return
        try:
            if proc.is_alive():
                conn.send(("shutdown", None))
                proc.join(10)
        except (OSError, BrokenPipeError, ValueError):
            pass
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        try:
            conn.close()
        except OSError:
            pass


def load_key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=repr)


class EnginePool:
    """The two warm workers the service runs on; closed at interpreter exit."""

    def __init__(self, **timeouts: float):
        self.workers = {name: EngineWorker(name, **timeouts) for name in ("vllm", "hf")}
        self._lock = threading.Lock()
        atexit.register(self.close)

    def cancel(self) -> None:
        for w in self.workers.values():
            w.cancel()

    @property
    def cancelled(self) -> bool:
        return any(w.cancelled for w in self.workers.values())

    def reset_cancel(self) -> None:
        for w in self.workers.values():
            w.reset_cancel()

    def close(self) -> None:
        for w in self.workers.values():
            w.stop()
