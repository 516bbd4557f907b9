"""One replica of one side on a Ray cluster: a Ray actor that hosts the project's own worker process
(parity_ui.run.workers.EngineWorker running parity_ui.run.worker_main), so a replica loads the same
engine class with the same mapped arguments, the same interpreter and the same environment as an
in-process side, and answers the same typed verbs (parity_ui.run.worker_client.EngineClient): the
side-set contract's (parity_ui.run.sideset), so every measure runs on a cluster as in process.

This module imports no Ray: parity_ui.run.cluster wraps `Replica` with `ray.remote` when it starts
replicas. The actor is threaded (a few calls at once) so that `cancel` and `counts` are answered
while `generate` or `score_batch` runs; only those two touch state another call uses (a flag and a
dict), and the worker itself is spoken to by one call at a time (the driver hands a replica one
request at a time). The worker watches the actor's process: when Ray kills the actor (a lost node,
`ray.kill`), the engine process and whatever it started die with it.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from ..core.requests import (
    CaptureRequest,
    GenerateRequest,
    LoadRequest,
    Problem,
    RouteReplayRequest,
    RoutesRequest,
    ScoreBatch,
    ScoreRequest,
)
from ..core.routes import Routes
from ..core.types import SideResult, TokenStep
from .worker_client import Capture, EngineClient
from .workers import CancelFlag, EngineWorker


def niceness_problem(niceness: int) -> Problem | None:
    """A warning where this replica runs below normal priority: Ray starts its workers at nice 15 unless
    the cluster says otherwise (parity_ui.run.cluster.connect does for a local instance)."""
    if niceness <= 0:
        return None
    return Problem(
        code="replica_niceness",
        severity="warning",
        message=f"this replica and its engine run at nice {niceness} (Ray's worker_niceness): beside other "
        "work on its node they get a small share of the CPU",
        fix="start the cluster's nodes with RAY_worker_niceness=0 in their environment (ray start)",
    )


class Replica:
    """A side's engine in its own worker process, hosted by this (Ray actor) process."""

    def __init__(
        self,
        label: str,
        engine: str,
        python: str,
        env: dict[str, str],
        load: LoadRequest,
        omp_threads: str | None = None,
        devices: str | None = None,
    ):
        self.label, self.load_req = label, load
        # Ray sets OMP_NUM_THREADS=1 in an actor that reserves no CPU: the engine would run on one
        # thread (and round differently from an in-process run). The driver's own setting stands;
        # without one, the engine picks its threads as it does in process.
        if omp_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp_threads
        if devices is not None:  # its replica group's GPUs, named by the driver (cluster.group_layout)
            env = {**env, "CUDA_VISIBLE_DEVICES": devices}
        elif os.environ.get("CUDA_VISIBLE_DEVICES"):  # the GPUs Ray gave this replica win over a side's pinned device
            env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        self.flag = CancelFlag()
        self.worker = EngineWorker(label, engine, python, env, self.flag)
        self.client = EngineClient(self.worker)
        self._counts: dict[int, int] = {}

    def start(self) -> dict[str, Any]:
        """Start the worker and check what its engine cannot run (before any weights load): the
        worker's "ready" facts, the problems, and where this replica runs."""
        ready = self.worker.ensure_started()
        problems: list[Problem] = self.client.check(self.load_req)
        low = niceness_problem(os.nice(0))
        if low is not None:
            problems.append(low)
        return {
            "ready": ready,
            "problems": problems,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "worker_pid": self.worker.pid,
            "devices": self.worker.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")),
        }

    def load(self) -> tuple[Any, float]:
        """Load the weights: the engine's own account of what it resolved, and the seconds it took."""
        t = time.perf_counter()
        self.worker.info = self.client.load(self.load_req)
        return self.worker.info, time.perf_counter() - t

    def generate(self, req: GenerateRequest) -> list[Any]:
        self.flag.clear()
        self._counts = {}
        return self.client.generate(req, on_counts=self._counts.update)

    def score_batch(self, items: list[ScoreRequest]) -> list[list[TokenStep]]:
        self.flag.clear()
        return self.client.score_batch(ScoreBatch(items))

    def routes(self, req: RoutesRequest) -> Routes:
        self.flag.clear()
        return self.client.routes(req)

    def replay_routes(self, req: RouteReplayRequest) -> list[SideResult]:
        self.flag.clear()
        return self.client.replay_routes(req)

    def capture(self, req: CaptureRequest) -> Capture:
        self.flag.clear()
        return self.client.capture(req)

    def counts(self) -> dict[int, int]:
        """Each prompt's tokens so far in the generate under way (for the driver's progress)."""
        return dict(self._counts)

    def cancel(self) -> None:
        """Stop the request under way at its next token (the worker reads the flag)."""
        self.flag.set()

    def pids(self) -> tuple[int, int | None]:
        return os.getpid(), self.worker.pid

    def stop(self) -> None:
        self.worker.stop()
