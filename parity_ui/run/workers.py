"""Worker processes, one per side setup, loaded once and kept warm.

A worker is `python -m parity_ui.run.worker_main` started with the side's interpreter (this one, or
another environment's `python=`), so each side runs the vLLM/transformers/torch of its own
environment. The parent never imports torch or vllm. Every failure in a worker (an exception,
CUDA OOM, a crash, a kill, a hang past the timeout) comes back as `EngineError` naming the side;
the worker is then stopped, and the next request starts a fresh one, so a broken CUDA context
never serves another run.
"""

from __future__ import annotations

import atexit
import json
import mmap
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..core.errors import CancelledError, EngineError
from ..core.paths import cache_dir
from . import fork_server

EventCallback = Callable[[Any], None]
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # holds parity_ui/: put on a worker's PYTHONPATH


def _log_dir() -> Path:
    d = cache_dir() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _tail(path: str, n: int = 8) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


# -- why a process died ----------------------------------------------------------------------------


def oom_kill_count() -> int | None:
    """The kernel's count of OOM kills: this cgroup's (memory.events) where there is one, else the
    machine's (/proc/vmstat). None when neither can be read."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"), ("/proc/vmstat", "oom_kill")):
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def _available_gib() -> float:
    """MemAvailable in GiB (0 when it cannot be read: then nothing idle is kept)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _memory_now() -> str:
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        avail = int(info["MemAvailable"].split()[0]) / 2**20
        total = int(info["MemTotal"].split()[0]) / 2**20
        return f"{avail:.1f} of {total:.1f} GiB available now"
    except (OSError, KeyError, ValueError):
        return "memory unknown"


def describe_exit(code: int | None, oom_before: int | None, oom_after: int | None) -> str:
    """Why a worker's process ended, honestly: an OOM kill only when the kernel's counter says so."""
    if code is None:
        return "ended without an exit code"
    if code >= 0:
        return f"exited with code {code}"
    sig = -code
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        return (
            f"was killed by the kernel's out-of-memory killer ({name}; OOM kills counted "
            f"{oom_before} -> {oom_after}; {_memory_now()})"
        )
    if sig == signal.SIGKILL:
        why = (
            "not an out-of-memory kill: the kernel's OOM counter did not change"
            if oom_before is not None
            else "the OOM counter is not readable here"
        )
        return f"was killed by {name} from another process ({why}; {_memory_now()})"
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE):
        return f"crashed with {name}"
    return f"was stopped by {name} from another process"


# -- the cancel flag ---------------------------------------------------------------------------


class CancelFlag:
    """One byte shared with every worker (parity_ui.run.worker_main.CancelFlag reads it). The file is
    unlinked as soon as it is mapped and reaches the workers as an inherited descriptor: a killed
    process leaves nothing behind."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="parity-cancel-")
        os.unlink(path)
        os.write(fd, b"\0")
        self.fd = fd
        self._map = mmap.mmap(fd, 1)

    def set(self) -> None:
        self._map[0] = 1

    def clear(self) -> None:
        self._map[0] = 0

    def is_set(self) -> bool:
        return self._map[0] == 1

    def close(self) -> None:
        try:
            self._map.close()
            os.close(self.fd)
        except (OSError, ValueError):
            pass


# -- one worker ----------------------------------------------------------------------------------


class EngineWorker:
    """A handle on one worker process. Not thread-safe: the service serialises calls to it."""

    def __init__(
        self,
        label: str,
        engine: str,
        python: str,
        env: dict[str, str],
        cancel: CancelFlag,
        *,
        start_timeout: float = 120.0,
        load_timeout: float = 1800.0,
        request_timeout: float = 3600.0,
    ):
        self.label = label  # the side's name, for messages
        self.engine, self.python, self.env, self.cancel_flag = engine, python, env, cancel
        self.start_timeout, self.load_timeout, self.request_timeout = start_timeout, load_timeout, request_timeout
        self._proc: subprocess.Popen | fork_server.ForkedProcess | None = None
        self._conn: Connection | None = None
        self._oom_before: int | None = None
        self.ready: dict[str, Any] = {}
        self.info: Any = None
        self.log_path = ""
        self.preloaded = False  # started ahead of its run, its engine's libraries imported (a head start)
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._spawn_lock = threading.Lock()
        self._abandoned = False

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start_ahead(self) -> None:
        """Start the process in a thread, importing the engine's libraries before it answers, so
        that the imports (the longest part of a cold start) overlap the caller's own work;
        ensure_started() waits for it."""

        def go() -> None:
            try:
                self.start(preload=True)  # abandon() may kill it meanwhile: then this raises
                self.preloaded = True
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits for this worker
                self._start_error = e

        self._starting = threading.Thread(target=go, name=f"parity-start-{self.label}", daemon=True)
        self._starting.start()

    def ensure_started(self) -> dict[str, Any]:
        """The running process's "ready" facts: waits for a start begun by start_ahead(), starts one
        when there is none (or it died)."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
            err, self._start_error = self._start_error, None
            if err is not None:
                raise err
        return self.ready if self.alive else self.start()

    @property
    def setup(self) -> str:
        """Its process setup (engine, interpreter, environment): what a worker started ahead matches on."""
        return load_key(self.engine, self.python, self.env)

    @property
    def starting(self) -> bool:
        return self._starting is not None and self._starting.is_alive()

    def abandon(self) -> None:
        """Kill a worker nobody will use (one started ahead), at once, also while it is still
        importing (it cannot answer a shutdown then) or about to be started."""
        with self._spawn_lock:
            self._abandoned = True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass

    def start(self, preload: bool = False) -> dict[str, Any]:
        """Start the process; returns its "ready" facts (python version, installed packages)."""
        self.log_path = str(_log_dir() / f"{self.label}-{int(time.time() * 1000)}.log")
        parent, child = socket.socketpair()
        env = {**os.environ, **self.env}
        # vLLM reports usage to stats.vllm.ai from a background thread (and finds its own address by
        # connecting to 8.8.8.8): a comparison tool does not phone home for its user, and on a machine
        # without a network those lookups showed in every vLLM worker. A user's own setting wins.
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env["PYTHONUNBUFFERED"] = "1"
        self._oom_before = oom_kill_count()
        # A fork server of this setup imported the engine's libraries once: its fork starts in a
        # fraction of a second (parity_ui.run.fork_server). Waiting for its imports is a load's wait.
        server = None
        if fork_server.enabled():
            server = fork_server.server_for(
                self.python,
                self.engine,
                env,
                _log_dir() / f"fork-server-{self.label}-{int(time.time() * 1000)}.log",
                self.load_timeout,
            )
        with open(self.log_path, "ab", buffering=0) as log, self._spawn_lock:
            if preload and self._abandoned:  # abandon() came first: this start ahead is not wanted
                raise EngineError(f"side {self.label}: the worker started ahead was not needed", "")
            self._abandoned = False  # a start asked for now (a later run) stands
            self._proc = None
            if server is not None:
                try:
                    self._proc = server.fork(child.fileno(), self.cancel_flag.fd, log.fileno(), preload, env)
                except fork_server.ForkServerError:
                    self._proc = None  # started on its own below
            if self._proc is None:
                # Fixed arguments only; the interpreter path was checked (parity_ui.run.environments).
                self._proc = subprocess.Popen(
                    [
                        self.python,
                        "-m",
                        "parity_ui.run.worker_main",
                        "--engine",
                        self.engine,
                        "--fd",
                        str(child.fileno()),
                        "--cancel-fd",
                        str(self.cancel_flag.fd),
                        "--parent",
                        str(os.getpid()),
                    ]
                    + (["--preload"] if preload else []),
                    pass_fds=[child.fileno(), self.cancel_flag.fd],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    **fork_server.OWN_PROCESS_GROUP,
                )
        child.close()
        self._conn = Connection(parent.detach())
        # Importing an engine's libraries takes minutes on a slow disk or a busy machine.
        _, self.ready = self._wait(
            self.load_timeout if preload else self.start_timeout,
            None,
            "starting" + (" (importing its libraries)" if preload else ""),
        )
        return self.ready

    def _fail(self, message: str, fix: str) -> EngineError:
        self.stop()
        return EngineError(message, fix)

    def _keep_or_stop(self, keep: bool) -> None:
        if not keep:
            self.stop()

    def _wait(
        self,
        timeout: float,
        on_event: EventCallback | None,
        what: str,
        on_progress: Callable[[str], None] | None = None,
        keep_worker: bool = False,
    ) -> tuple[str, Any]:
        assert self._conn is not None and self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            died = False
            if self._conn.poll(0.05):
                try:
                    kind, payload = self._conn.recv()
                except (EOFError, OSError):  # the pipe closed: the process is going away
                    died, kind, payload = True, "", None
                if kind == "tokens":  # a batch of (prompt index, step), in order
                    if on_event is not None:
                        for item in payload:
                            on_event(item)
                    continue
                if kind == "counts":  # {prompt index: tokens so far} (GenerateRequest.counts)
                    if on_event is not None:
                        on_event(payload)
                    continue
                if kind == "progress":
                    if on_progress is not None:
                        on_progress(payload)
                    continue
                if kind == "error":
                    if self.cancel_flag.is_set() and payload["type"] == "CancelledByUser":
                        self.stop()
                        raise CancelledError(f"side {self.label}: stopped while {what}", "")
                    if payload.get("fix"):  # the engine explained it (EngineFault): keep its words
                        self._keep_or_stop(keep_worker and not payload.get("fatal"))
                        raise EngineError(
                            f"side {self.label}: {payload['message']}",
                            f"{payload['fix']} (worker log: {self.log_path})",
                        )
                    hint = (
                        (" (out of memory: lower max_model_len or batch_size, or this side's gpu_memory_utilization)")
                        if payload["oom"]
                        else ""
                    )
                    raise self._fail(
                        f"side {self.label}: engine failed while {what}: {payload['type']}: {payload['message']}{hint}",
                        f"see the worker log {self.log_path}",
                    )
                if not died:
                    return kind, payload
            if died or self._proc.poll() is not None:
                try:
                    code = self._proc.wait(5)  # let it finish exiting so its exit code is known
                except subprocess.TimeoutExpired:
                    code = None
                why = describe_exit(code, self._oom_before, oom_kill_count())
                raise self._fail(
                    f"side {self.label}: the engine process {why} while {what}. "
                    f"Last log lines:\n{_tail(self.log_path)}",
                    f"see the worker log {self.log_path}; a new worker starts on the next run",
                )
            if time.monotonic() > deadline:
                raise self._fail(
                    f"side {self.label}: the engine did not answer within {timeout:.0f} s while {what}",
                    "the worker was stopped; retry, or raise the timeout for very long runs",
                )

    def request(
        self,
        kind: str,
        payload: Any,
        on_event: EventCallback | None = None,
        timeout: float | None = None,
        what: str | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> Any:
        if not self.alive or self._conn is None:
            raise EngineError(f"side {self.label}: the engine is not running", "start the run again")
        self._conn.send((kind, payload))
        # An explained fault after the engine loaded (a server's HTTP error, a tokenizer mismatch)
        # leaves the engine usable: keep the warm worker. Anything unexplained stops it.
        keep = (
            kind
            in (
                "generate",
                "score",
                "score_batch",
                "check_input",
                "capture",
                "op_trace",
                "weights",
                "weights_dump",
                "weights_diff",
            )
            and self.info is not None
        )
        _, result = self._wait(
            timeout or self.request_timeout, on_event, what or f"running {kind}", on_progress, keep_worker=keep
        )
        if kind == "generate" and self.cancel_flag.is_set():
            raise CancelledError(f"side {self.label}: the run was cancelled", "")
        return result

    def stop(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        self.info = None
        if proc is None:
            return
        try:
            if proc.poll() is None and conn is not None:
                conn.send(("shutdown", None))
                proc.wait(10)
        except (OSError, BrokenPipeError, ValueError, subprocess.TimeoutExpired):
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)  # the worker and whatever it started (vLLM's TP workers)
            except ProcessLookupError:
                break
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        try:  # what the worker started and left behind when it exited (it skips exit handlers)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass


def load_key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=repr)


def start_prewarm(module: str, python: str, env: dict[str, str], model_path: str) -> None:
    """`python -m MODULE MODEL_FOLDER` with a side's environment (Kind.prewarm), left to finish on its
    own: it fills a cache the side's engine reads when it loads, and nothing waits for it. Its output
    goes to a log beside the workers'."""
    full = {**os.environ, **env}
    full["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [full.get("PYTHONPATH")])])
    full.setdefault("VLLM_NO_USAGE_STATS", "1")
    full.setdefault("DO_NOT_TRACK", "1")
    log_path = _log_dir() / f"prewarm-{int(time.time() * 1000)}.log"
    with open(log_path, "ab", buffering=0) as log:
        # Fixed arguments: a module named by the kinds registry and the model folder prepare resolved.
        subprocess.Popen(
            [python, "-m", module, model_path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=full,
            **fork_server.OWN_PROCESS_GROUP,
        )


class EnginePool:
    """The warm workers, keyed by what they loaded (kind, interpreter, environment, arguments): a
    side whose setup did not change since the last run reuses its worker. Closed at exit."""

    def __init__(self, *, keep_idle: int = 0, keep_idle_free_gib: float = 6.0, **timeouts: float):
        self.timeouts = timeouts
        # Workers a run does not need are stopped before it loads (their memory, their GPUs), unless
        # keep_idle > 0: then up to that many, the most recently used, stay warm while more than
        # keep_idle_free_gib of memory is available. The test suite sets it: its tests take many
        # setups in turn, and each start of a vLLM engine costs ~20-30 s of a 2-core CI machine.
        self.keep_idle, self.keep_idle_free_gib = keep_idle, keep_idle_free_gib
        self.workers: dict[str, EngineWorker] = {}  # least recently used first
        self.spares: dict[str, EngineWorker] = {}  # started ahead (prestart), by process setup
        self.stopped_by_user = False  # the user pressed Stop in the command under way
        self.cancel_flag = CancelFlag()
        self._lock = threading.Lock()
        for stale in _log_dir().glob("parity-cancel-*"):  # left by releases that kept the flag as a file
            if time.time() - stale.stat().st_mtime > 86400:  # a day old: no live process of theirs uses it
                stale.unlink(missing_ok=True)
        atexit.register(self.close)

    def worker(self, key: str, label: str, engine: str, python: str, env: dict[str, str]) -> EngineWorker:
        """The worker for `key`: a warm one, else one started ahead for the same process setup
        (prestart), else a new one (not started)."""
        with self._lock:
            w = self.workers.pop(key, None)
            if w is None:
                w = self.spares.pop(load_key(engine, python, env), None) or EngineWorker(
                    label, engine, python, env, self.cancel_flag, **self.timeouts
                )
            self.workers[key] = w  # last: the most recently used (by_side() then gives the run's own)
            w.label = label
            return w

    def stand_in(self, key: str, alternates: list[tuple[str, str, str]]) -> str:
        """The key whose worker serves a side of setup `key`: its own where warm, else a warm one of
        another setup that serves it alike ((key, option, value) in `alternates`, checked against the
        loaded engine's EngineInfo.serves_also), else `key` (a worker to start)."""
        with self._lock:
            if key in self.workers:
                return key
            for alt, option, value in alternates:
                w = self.workers.get(alt)
                info = w.info if w is not None and w.alive else None
                if info is not None and value in (getattr(info, "serves_also", None) or {}).get(option, {}):
                    return alt
        return key

    def prestart(self, label: str, engine: str, python: str, env: dict[str, str]) -> bool:
        """Start a worker for a process setup a run is about to need, before the run knows its exact
        key (parity_ui.service starts them while it tokenizes); worker() hands it out. Nothing is
        started when a warm worker of that setup exists. Returns whether one was started."""
        setup = load_key(engine, python, env)
        with self._lock:
            if setup in self.spares or any(w.setup == setup for w in self.workers.values()):
                return False
            w = self.spares[setup] = EngineWorker(label, engine, python, env, self.cancel_flag, **self.timeouts)
        w.start_ahead()
        return True

    def drop_spares(self) -> None:
        """Stop the workers started ahead that no run took (a guess that missed, a run that failed
        before it started its sides), without waiting for them."""
        with self._lock:
            spares = list(self.spares.values())
            self.spares.clear()
        for w in spares:
            w.abandon()

    def retain(self, keys: set[str], keep_idle: int | None = None) -> None:
        """Stop the workers no run needs now: their memory is freed before other sides load. Up to
        `keep_idle` (default: the pool's) of them, the most recently used, stay warm while enough
        memory is available; retain(set(), keep_idle=0) stops every worker."""
        keep = self.keep_idle if keep_idle is None else keep_idle
        if keep > 0 and _available_gib() < self.keep_idle_free_gib:
            keep = 0
        with self._lock:
            idle = [k for k in self.workers if k not in keys]  # least recently used first
            alive = [k for k in idle if self.workers[k].alive]  # a dead or never started one is not worth keeping
            kept = set(alive[max(0, len(alive) - keep) :]) if keep > 0 else set()
            stopping = [self.workers.pop(k) for k in idle if k not in kept]
        for w in stopping:
            w.stop()

    def drop(self, keys: set[str]) -> None:
        """Stop the workers of these setups now: one no later run will ask for (an audit's second
        instance, started in a process of its own), which an idle pool would otherwise keep warm."""
        with self._lock:
            stopping = [self.workers.pop(k) for k in keys if k in self.workers]
        for w in stopping:
            w.stop()

    def by_pid(self, pid: int) -> EngineWorker | None:
        return next((w for w in self.workers.values() if w.pid == pid), None)

    def by_side(self) -> dict[str, EngineWorker]:
        """The warm workers by the side name each last served (for tests and diagnostics)."""
        with self._lock:
            return {w.label: w for w in self.workers.values()}

    def cancel(self, *, by_user: bool = True) -> None:
        """Raise the flag every worker reads. `by_user`: the user's Stop, which only the next command
        lowers; a failing side that stops its set's other sides passes False, and its set lowers the
        flag again once they stopped (run.pipeline)."""
        if by_user:
            self.stopped_by_user = True
        self.cancel_flag.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_flag.is_set()

    def reset_cancel(self) -> None:
        """Lower the flag: a new command begins (ParityService.command), or a set that raised it on a
        side's failure is done, unless the user's Stop came meanwhile."""
        self.stopped_by_user = False
        self.cancel_flag.clear()

    def close(self) -> None:
        self.drop_spares()
        with self._lock:
            workers = list(self.workers.values())
            self.workers.clear()

        def stop(w: EngineWorker) -> None:
            if w.starting:  # still importing its libraries: it cannot answer a shutdown
                w.abandon()
            w.stop()

        stoppers = [threading.Thread(target=stop, args=(w,), name="parity-stop") for w in workers]
        for t in stoppers:  # at once: a run's exit waits for the slowest worker, not for their sum
            t.start()
        for t in stoppers:
            t.join()
