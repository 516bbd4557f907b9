"""Each side's way from its plan to a loaded engine, and the loaded sides as one set of engines.

Every side setup goes the same way: its worker starts (or a warm one is reused), its engine is
checked for what it cannot run (before any weights load), it loads, and then, for a run, it
generates. `Sides` runs that pipeline for every setup at once, one thread each, and the schedule
decides only where a pipeline waits for the others:

- gated (a CPU run, or `generate_while_loading=never`): every side is checked before any loads,
  so one refusal names every side that cannot run and nothing loads; every side is loaded
  before any generates, and they generate in side order, so no side's per-token timings include
  another's load.
- ungated (a GPU run by default): each side loads as soon as it is checked and generates as soon
  as it has loaded (the HF reference often answers before vLLM has compiled); a failing side
  stops the others.

Sides still generate one at a time in both. Sides that share a setup share one worker. Once
started, the set answers the typed verbs of the side-set contract (parity_ui.run.sideset.SideSet:
`generate`, `score`, `routes`, `capture`...) on any of its sides;
it knows nothing of runs or the store (parity_ui.service and parity_ui.run.recorder do).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import CancelledError, EngineError, ParityError
from ..core.requests import (
    CaptureRequest,
    GenerateRequest,
    InputCheck,
    LoadRequest,
    OpTraceRequest,
    Problem,
    RouteReplayRequest,
    RoutesRequest,
    ScoreBatch,
    ScoreRequest,
)
from ..core.routes import Routes
from ..core.runlog import EventCallback, RunEvent
from ..core.types import EngineInfo, Finding, SideResult, TokenStep
from ..inputs.prompts import settle_tokenizers
from .plan import SidePlan
from .sideset import Loaded, SideSet
from .worker_client import Capture, CountsCallback, EngineClient, TokenCallback
from .workers import EnginePool

STOPPED_LOADING = "the run was stopped while the sides were loading"


class CapabilityError(ParityError):
    """A side's engine cannot run this setup; found before the weights load."""

    code = "capability"


@dataclass
class Milestones:
    """When the last side finished each step (perf_counter seconds): a run's phases are the gaps
    between them. A step no side reached is absent."""

    t0: float
    reached: dict[str, list[float]] = field(default_factory=dict)

    def mark(self, step: str) -> None:
        self.reached.setdefault(step, []).append(time.perf_counter())

    def phases(self, until: float, generated: bool) -> dict[str, float]:
        out: dict[str, float] = {}
        last = self.t0
        for step in ("start", "check", "load"):
            if step in self.reached:
                out[step] = round(max(self.reached[step]) - last, 4)
                last = max(self.reached[step])
        if generated:
            out["generate"] = round(until - last, 4)
        return out


class _Stopped(Exception):
    """A pipeline left because another one failed (that failure is the one reported)."""


class _Gate:
    """Where every pipeline waits for the others (gated), or a no-op (ungated). Broken by stop()."""

    def __init__(self, parties: int, gated: bool):
        self._barrier = threading.Barrier(parties) if gated else None

    def wait(self) -> None:
        if self._barrier is not None:
            try:
                self._barrier.wait()
            except threading.BrokenBarrierError:
                raise _Stopped() from None

    def stop(self) -> None:
        if self._barrier is not None:
            self._barrier.abort()


class _Turns:
    """One side generates at a time: in side order (gated), or first come first served."""

    def __init__(self, order: list[str] | None):
        self._order, self._next, self._busy, self._stopped = order, 0, False, False
        self._cv = threading.Condition()
        self.holder: str | None = None  # the side generating now

    def ahead(self, side: str) -> str | None:
        """The side `side` would wait for now (generating, or next in order), or None."""
        with self._cv:
            if self._busy:
                return self.holder
            if self._order is not None and self._next < len(self._order) and self._order[self._next] != side:
                return self._order[self._next]
            return None

    @contextmanager
    def turn(self, side: str) -> Iterator[None]:
        with self._cv:
            while not self._stopped and (self._busy or (self._order is not None and self._order[self._next] != side)):
                self._cv.wait()
            if self._stopped:
                raise _Stopped()
            self._busy, self.holder = True, side
        try:
            yield
        finally:
            with self._cv:
                self._busy, self.holder = False, None
                self._next += 1
                self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()


def load_request(p: SidePlan) -> LoadRequest:
    return LoadRequest(kind=p.kind.name, model_path=p.model.path, args=p.load_args())


class Sides:
    """The engines of a set of side plans. `start()` brings every one to loaded (running `then`
    for each side as soon as the schedule lets it generate); afterwards the verbs ask any side.

    Made and closed by ParityService.sides(). `findings` receives the engines' warnings from their
    checks and `timings` the phases (start, check, load, generate: when the last side finished
    each), both also when starting fails; `loaded` holds each side's engine and `generated_early`
    the sides that generated while another still loaded."""

    def __init__(
        self,
        pool: EnginePool,
        plans: list[SidePlan],
        *,
        gpu: bool,
        gated: bool,
        emit: EventCallback | None = None,
        inputs: Callable[[], InputCheck] | None = None,
        then: Callable[[Sides, SidePlan], None] | None = None,
        on_loaded: Callable[[SidePlan, Loaded], None] | None = None,
        findings: list[Finding] | None = None,
        timings: dict[str, float] | None = None,
    ):
        self.pool, self.plans, self.gpu, self.gated = pool, plans, gpu, gated
        self.emit = emit or (lambda e: None)
        self._inputs, self._then, self._on_loaded = inputs, then, on_loaded
        self.clients: dict[str, EngineClient] = {}
        self.loaded: dict[str, Loaded] = {}
        self.findings: list[Finding] = findings if findings is not None else []
        self.timings = timings
        self.generated_early: list[str] = []
        self._generated = False
        self.milestones = Milestones(time.perf_counter())
        self._gpu_lock = threading.Lock()
        self._errors: list[tuple[SidePlan, Problem]] = []
        self._lock = threading.Lock()
        self._called: set[str] = set()  # sides asked to generate or score at least once
        self._loading: str | None = None  # the vLLM side loading under the GPU lock
        self._keys: dict[str, str] = {}  # side -> the load key of the worker serving it (_assign_workers)

    # -- the verbs ----------------------------------------------------------------------------------

    def client(self, side: str) -> EngineClient:
        if side not in self.clients:
            raise EngineError(
                f"side {side} is not among the started sides ({', '.join(self.clients)})", "name a side of this run"
            )
        return self.clients[side]

    def info(self, side: str) -> EngineInfo:
        return self.loaded[side].info

    def generate(
        self,
        side: str,
        req: GenerateRequest,
        on_token: TokenCallback | None = None,
        on_counts: CountsCallback | None = None,
    ) -> list[SideResult]:
        self._first_call(side)
        results = self.client(side).generate(req, on_token, on_counts)
        for r in results:
            r.side = side
        return results

    def score(self, side: str, req: ScoreRequest) -> list[TokenStep]:
        self._first_call(side)
        return self.client(side).score(req)

    def score_batch(self, side: str, items: list[ScoreRequest]) -> list[list[TokenStep]]:
        self._first_call(side)
        return self.client(side).score_batch(ScoreBatch(items))

    def _first_call(self, side: str) -> None:
        """Say that a side's first call after it loaded in this set warms up (kernels compile or are
        picked on first use, caches are allocated): its first tokens take longer than the rest. Before
        any engine is handed a token, the run's tokenizer verdict is in (settle_tokenizers)."""
        settle_tokenizers()
        with self._lock:
            if side in self._called:
                return
            self._called.add(side)
        got = self.loaded.get(side)
        if got is not None and got.load_s > 0:
            self.emit(
                RunEvent(
                    "status",
                    f"{side}: first call since it loaded: warming up (kernels compile or are "
                    "picked on first use); its first tokens take longer",
                    side=side,
                )
            )

    def capture(self, side: str, req: CaptureRequest) -> Capture:
        settle_tokenizers()
        return self.client(side).capture(req)

    def op_trace(self, side: str, req: OpTraceRequest) -> dict[str, Any]:
        return self.client(side).op_trace(req)

    def routes(self, side: str, req: RoutesRequest) -> Routes:
        settle_tokenizers()
        return self.client(side).routes(req)

    def replay_routes(self, side: str, req: RouteReplayRequest) -> list[SideResult]:
        settle_tokenizers()
        results = self.client(side).replay_routes(req)
        for r in results:
            r.side = side
        return results

    # -- bringing them up -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start, check and load every side (and run `then`). Raises CapabilityError naming the
        sides that cannot run, CancelledError on Stop, EngineError when an engine fails."""
        unique = self._assign_workers()
        cold = [p.name for p in unique if self.clients[p.name].worker.info is None]
        if cold:
            how = "; each generates once it has loaded" if self._then and not self.gated else ""
            self.emit(RunEvent("status", "starting " + ", ".join(cold) + how))
        self._checked, self._all_loaded = _Gate(len(unique), self.gated), _Gate(len(unique), self.gated)
        self._turns = _Turns([p.name for p in self.plans] if self.gated else None)
        self._n_loaded, self._n_unique = 0, len(unique)
        ours: list[bool] = []  # whether this set raised the cancel flag (a failure), not the user's Stop

        def stop_the_others() -> None:
            if not self.pool.cancelled:
                ours.append(True)
                self.pool.cancel(
                    by_user=False
                )  # generating sides stop at their next token, loading ones before loading
            for gate in (self._checked, self._all_loaded, self._turns):
                gate.stop()
            for p in unique:  # a worker still importing its libraries would make the run wait for that
                if self.clients[p.name].worker.starting:
                    self.clients[p.name].worker.abandon()

        errors: list[BaseException] = []
        try:
            with ThreadPoolExecutor(len(unique)) as ex:
                futures = [ex.submit(self._pipeline, p) for p in unique]
                try:
                    for f in as_completed(futures):
                        failed = f.exception()
                        if failed is not None:
                            if not errors:
                                stop_the_others()
                            errors.append(failed)
                except BaseException:
                    stop_the_others()  # Ctrl-C: before the executor waits for the sides
                    raise
        finally:
            if ours and not self.pool.stopped_by_user:
                self.pool.reset_cancel()  # it stopped this set's other sides; the next request is not stopped
            if self.timings is not None:
                self.timings.update(self.milestones.phases(time.perf_counter(), self._generated))
        if self._errors:  # gated: every side that cannot run, in one refusal
            raise self._capability(self._errors)
        real = [e for e in errors if not isinstance(e, _Stopped)]
        if real:
            raise real[0]  # the first failure; the others followed from stopping the set
        if self.pool.cancelled:
            raise CancelledError(STOPPED_LOADING, "")

    def _assign_workers(self) -> list[SidePlan]:
        """Give every side its worker: a warm one, one started ahead, or a new one (not started).
        Returns one plan per distinct setup (sides with the same setup share one worker)."""
        # A warm worker of another setup may serve a side alike (SidePlan.stand_ins): then it is reused.
        self._keys = keys = {p.name: self.pool.stand_in(p.load_key, p.stand_ins()) for p in self.plans}
        self.pool.retain(set(keys.values()))  # free what this set does not need before loading
        for p in self.plans:
            self.clients[p.name] = EngineClient(
                self.pool.worker(keys[p.name], p.name, p.kind.engine, p.python, p.worker_env)
            )
        self.pool.drop_spares()  # started ahead for a setup the run did not end up with
        return list({keys[p.name]: p for p in self.plans}.values())

    def _say(self, side: str, what: str) -> None:
        self.emit(RunEvent("status", f"{side}: {what}", side=side))

    def _pipeline(self, p: SidePlan) -> None:
        client = self.clients[p.name]
        if client.worker.info is None:
            if client.worker.starting or not client.worker.alive:
                self._say(p.name, "starting its engine process (importing the engine's libraries)")
            client.worker.ensure_started()
            self.milestones.mark("start")
            problems = client.check(load_request(p))
            self.milestones.mark("check")
            self._judge(p, problems)
        self._checked.wait()
        if self._errors:
            raise _Stopped()
        if self.pool.cancelled:  # another side failed, or Stop: load nothing more
            raise CancelledError(STOPPED_LOADING, "")
        got = self._load(p, client)
        key = self._keys[p.name]
        mine = [s for s in self.plans if self._keys[s.name] == key]  # the sides this worker serves
        theirs = {s.name: Loaded(s.served_info(got.info, key), got.load_s) for s in mine}
        with self._lock:
            self._n_loaded += 1
            self.loaded.update(theirs)
        if self._on_loaded is not None:
            for s in mine:
                self._on_loaded(s, theirs[s.name])
        self._check_inputs(mine)
        if self.gated and self._then is not None:
            with self._lock:
                pending = [q.name for q in self.plans if q.name not in self.loaded]
            if pending:
                self._say(
                    p.name,
                    f"loaded; waiting for {', '.join(pending)} to load before generating (sides "
                    "generate after every side has loaded, so no side's timings include a load)",
                )
        self._all_loaded.wait()
        if self._then is None:
            return
        for s in mine:
            other = self._turns.ahead(s.name)
            if other is not None:
                self._say(s.name, f"waiting for {other} to finish generating (one side generates at a time)")
            with self._turns.turn(s.name):
                if self.pool.cancelled:
                    raise CancelledError(STOPPED_LOADING, "")
                if self._n_loaded < self._n_unique:
                    self.generated_early.append(s.name)
                self._generated = True
                self._then(self, s)

    def _judge(self, p: SidePlan, problems: list[Problem]) -> None:
        """Warnings are kept as findings; refusals stop this side now (ungated) or, once every side
        is checked, the whole set with every refusal named (gated)."""
        errors = []
        for pb in problems:
            if pb.severity == "error":
                errors.append((p, pb))
            else:
                self.findings.append(
                    Finding(
                        code=pb.code,
                        severity="warning",
                        side=p.name,
                        message=f"side {p.name}: {pb.message}",
                        fix=pb.fix,
                    )
                )
        if errors and not self.gated:
            raise self._capability(errors)
        with self._lock:
            self._errors += errors

    @staticmethod
    def _capability(
        errors: list[tuple[SidePlan, Problem]], when: str = "found before loading the model"
    ) -> CapabilityError:
        msg = "; ".join(f"side {p.name} ({p.kind.label}): {pb.message}" for p, pb in errors)
        fixes = "; ".join(dict.fromkeys(pb.fix for _, pb in errors))
        return CapabilityError(f"{msg} ({when})", fixes)

    def _load(self, p: SidePlan, client: EngineClient) -> Loaded:
        """Load one setup's engine in its worker (a warm worker answers at once)."""
        if client.worker.info is not None:
            return Loaded(client.worker.info, 0.0)
        # vLLM measures free GPU memory while it starts: two of them on one machine start one at a time.
        shared = self.gpu and p.kind.gpu_memory == "share"
        serial = self._gpu_lock if shared else nullcontext()
        if shared and self._loading is not None and self._loading != p.name:
            self._say(
                p.name,
                f"waiting for {self._loading} to finish loading (vLLM sides on one GPU load one at "
                "a time: each measures the free memory)",
            )
        with serial:
            if shared:
                self._loading = p.name
            self._say(p.name, "loading the weights")
            t = time.perf_counter()
            name = p.name
            client.worker.info = client.load(
                load_request(p), on_progress=lambda m: self.emit(RunEvent("status", f"{name}: {m}", side=name))
            )
            took = time.perf_counter() - t
            if shared:
                self._loading = None
        self.milestones.mark("load")
        self.emit(RunEvent("status", f"{p.name}: loaded in {took:.1f} s", side=p.name))
        return Loaded(client.worker.info, took)

    def _check_inputs(self, sides: list[SidePlan]) -> None:
        """Sides that tokenize on their own (servers) must see the run's ids and fit its length."""
        servers = [p for p in sides if p.kind.tokenizes_itself]
        if not servers or self._inputs is None:
            return
        req = self._inputs()
        errors = []
        for p in servers:
            for pb in self.clients[p.name].check_input(req):
                if pb.severity == "error":
                    errors.append((p, pb))
                else:
                    self.findings.append(
                        Finding(
                            code=pb.code,
                            severity="warning",
                            side=p.name,
                            message=f"side {p.name}: {pb.message}",
                            fix=pb.fix,
                        )
                    )
        if errors:
            raise self._capability(errors, "found before generating")


def _is_a_side_set(sides: Sides) -> SideSet:
    return sides  # mypy: Sides implements the side-set contract (parity_ui.run.sideset)
