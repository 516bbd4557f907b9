"""Opt-in pytest plugin for CI-time work: logs every engine worker start and model load with the test
that paid for it, so a slow test file shows which engine starts it could share.

    PARITY_WORKER_LOG=/tmp/w.tsv python -m pytest tests/engines/test_x.py -p tests.worker_timing --durations=0

Each line: test id, what (start|load), side label, engine, seconds, the test process (xdist's gw0,
gw1, ...; "main" without -n) and, for a load, the model's folder and dtype: a model loaded in both
processes shows which modules could share one (tests/scheduling.py's SHARED_SCOPES). Only workers of
this pytest process (the session service and services made in tests) are seen; a CLI subprocess's
own are not.

PARITY_CPU_LOG=/tmp/cpu.tsv logs each test's wall and CPU seconds (its process and every process under
it, engine workers, apps and CLIs included): test id, wall, CPU, the test process."""
from __future__ import annotations

import os
import time

import pytest

_current = {"test": "(collection)"}


def _log(what: str, worker, seconds: float, loaded: str = "") -> None:
    path = os.environ.get("PARITY_WORKER_LOG")
    if path:
        proc = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a") as f:
            f.write(f"{_current['test']}\t{what}\t{worker.label}\t{worker.engine}\t{seconds:.1f}\t{proc}\t{loaded}\n")


def _tree_cpu() -> float:
    """CPU seconds of this test process and every process under it: the live ones (engine workers,
    an app, a CLI still running) and the ones already reaped. A descendant that exited unreaped since
    the last sample is missed; that undercounts, never overcounts."""
    import psutil

    me = psutil.Process()
    total = sum(os.times()[:4])  # this process, and its reaped children
    for child in me.children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["test"] = item.nodeid
    path = os.environ.get("PARITY_CPU_LOG")
    if not path:
        yield
        return
    # A test's CPU, not its wall time, is what it costs a busy machine: waits overlap other work.
    cpu, wall = _tree_cpu(), time.perf_counter()
    yield
    cpu, wall = _tree_cpu() - cpu, time.perf_counter() - wall
    with open(path, "a") as f:
        f.write(f"{item.nodeid}\t{wall:.1f}\t{cpu:.1f}\t{os.environ.get('PYTEST_XDIST_WORKER', 'main')}\n")


def pytest_configure(config):
    from parity_ui.run.workers import EngineWorker

    start, request = EngineWorker.start, EngineWorker.request

    def timed_start(self, preload=False):
        t = time.perf_counter()
        try:
            return start(self, preload)
        finally:
            _log("start", self, time.perf_counter() - t)

    def timed_request(self, kind, payload, *args, **kwargs):
        t = time.perf_counter()
        try:
            return request(self, kind, payload, *args, **kwargs)
        finally:
            if kind == "load":
                dtype = (getattr(payload, "args", None) or {}).get("dtype", "")
                _log("load", self, time.perf_counter() - t, f"{getattr(payload, 'model_path', '')} {dtype}")

    EngineWorker.start, EngineWorker.request = timed_start, timed_request
