"""ParityService: the one door. The CLI and the app reach every command through a method here, and
the runs through it; nothing above it imports a command module.

It owns the warm side workers (parity_ui.run.workers.EnginePool) and the database, and hands the
commands (parity_ui.commands, which take it through the Protocol in commands/service_api.py) two
contexts every command is built from:

- `recording(...)`: a new run, stored when it starts, flushed as it is made and stored when it
  ends, whatever ends it (parity_ui.run.recorder). A bad config, a missing model or a crashed engine
  inside it becomes a run with status "error", its message, and whatever was produced before.
- `sides(plans)`: the side setups started, checked and loaded, answering typed verbs
  (parity_ui.run.pipeline.Sides). Nothing outlives the block but warm workers.

The commands, one method each, each a short delegation: `compare`, `workload`, `resume`, `replay`,
`replay_recorded`, `trend`, `probe`, `sweep`, `localise`, `bisect`, `check`, `audit`, `weights`; `run` takes
whichever request `plan_request` made (the one
rule for "a comparison or a workload?", for the CLI and the app alike). One command at a time: the
service's lock.

May import: core, inputs, analysis, run, store, measures, commands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .commands.audit.run import AuditOutcome, AuditRequest
from .commands.replay import ReplayRequest
from .commands.replay_steps import TrendRequest
from .commands.weights import WeightsCheckRequest
from .commands.workload.run import WorkloadRequest
from .core.config import routes_for
from .core.mapping import mapping_table, resolve
from .core.requests import InputCheck
from .core.runlog import EventCallback, RunEvent, new_run
from .core.types import Finding, Localisation, ModelInfo, Run
from .core.workload_record import WorkloadOptions
from .inputs.models import describe_model
from .inputs.prompts import PromptSpec, tokenizer_for
from .run.hardware import on_gpu
from .run.pipeline import CapabilityError, Loaded, Sides
from .run.plan import Prepared, RunRequest, SidePlan
from .run.prepare import likely_prewarms, likely_workers, prepare
from .run.recorder import RunRecorder
from .run.workers import EnginePool, start_prewarm
from .store import Store
from .store.runs import new_run_id

__all__ = [
    "AuditOutcome",
    "AuditRequest",
    "ParityService",
    "Request",
    "RunRequest",
    "WorkloadRequest",
    "ReplayRequest",
    "WeightsCheckRequest",
    "TrendRequest",
    "WorkloadOptions",
    "RunEvent",
    "CapabilityError",
    "attach_images",
    "plan_request",
]

# What the CLI and the app ask the service to run: one comparison, or a workload of many prompts.
Request = RunRequest | WorkloadRequest | ReplayRequest


def plan_request(
    model: str,
    config: Any,
    prompts: list[PromptSpec],
    *,
    source: Any = None,
    options: WorkloadOptions | None = None,
    trust_remote_code: bool = False,
    source_name: str | None = None,
) -> Request:
    """A comparison, or a workload: the one rule, for the CLI and the app alike. Prompts read from a
    workload file (`source`, a parity_ui.inputs.workload_source.Workload: a .jsonl or .parquet file)
    make a workload when there are several of them or the file is parquet; anything else is one
    comparison of `prompts`. `options` (a workload's; default WorkloadOptions()) get the source's
    record, under `source_name` for an upload (its temporary path means nothing later)."""
    if source is not None and (len(source.prompts) > 1 or source.format == "parquet"):
        options = options or WorkloadOptions()
        options.source = source.record(source_name)
        return WorkloadRequest(
            model=model, prompts=source.prompts, config=config, options=options, trust_remote_code=trust_remote_code
        )
    return RunRequest(
        model=model,
        prompts=source.prompts if source is not None else prompts,
        config=config,
        trust_remote_code=trust_remote_code,
    )


def is_refusal(e: BaseException, run: Run) -> bool:
    """The user's input refused before any side of `run` started (a model not found, no chat template,
    a bad config, side or prompt, a context too long): a ConfigError, ModelError or PromptError raised
    while preparing. Not a run that failed: an engine that crashed or refused its setup
    (EngineError, CapabilityError), a Stop."""
    from .core.errors import ConfigError, ModelError, PromptError

    return isinstance(e, (ConfigError, ModelError, PromptError)) and "start" not in (run.timings or {})


def open_store(db_path: str | None = None) -> Store:
    """The run database for reading what is stored (`parity runs`, `parity report`), without the
    engines' workers a ParityService owns."""
    return Store.open(db_path)


class ParityService:
    """Owns the warm side workers and the run database. One command at a time (a lock)."""

    def __init__(self, db_path: str | None = None, pool: EnginePool | None = None):
        self.db_path = db_path
        self.store = Store.open(db_path)  # what the commands read and write through
        self.db = self.store.db  # the recorder writes through the store's functions on it, in its own transactions
        self.pool = pool or EnginePool()
        self._lock = threading.RLock()  # a command's sides() runs inside its own recording()
        self._depth = 0  # commands open (command()): Stop is lowered only when the outermost begins
        self._gpu: bool | None = None
        self._cluster: Any = None  # a parity_ui.run.cluster.Cluster once a run asked for one

    @property
    def on_gpu(self) -> bool:
        if self._gpu is None:
            self._gpu = on_gpu()
        return self._gpu

    @property
    def reader(self) -> Store:
        """The store to read through from the calling thread: here the service's own; the app's
        AppService (parity_ui.ui.runner) gives each handler thread a connection of its own."""
        return self.store

    @property
    def stopped(self) -> bool:
        """The user pressed Stop in the command under way (a failing side's stop of its set is not one)."""
        return self.pool.stopped_by_user

    # -- preparation (no engine involved) ---------------------------------------------------

    def describe(self, model: str, trust_remote_code: bool = False) -> ModelInfo:
        return describe_model(model, trust_remote_code=trust_remote_code)

    def prepare(self, req: RunRequest) -> Prepared:
        return prepare(req, self.on_gpu)

    def mapping(self, model: str, cfg: Any, trust_remote_code: bool = False) -> list[Any]:
        info = describe_model(model, trust_remote_code=trust_remote_code)
        tok = tokenizer_for(info.path, trust_remote_code)
        return mapping_table(routes_for(cfg, info.num_experts), resolve(info, tok.eos_token_ids, self.on_gpu))

    def head_start(self, req: RunRequest) -> None:
        """Start the workers a run will most likely need before preparing it: their engines'
        imports (torch, vLLM: the longest part of a cold start) then run while this process loads
        the tokenizer. `sides()` takes them; a wrong guess is dropped."""
        for side, engine, python, env in likely_workers(req, self.on_gpu):
            self.pool.prestart(side, engine, python, env)
        # A GPU host with a cold cache: vLLM's model-class inspection (a vLLM import of its own) runs
        # beside the workers' imports instead of inside the load (parity_ui.engines.vllm_prewarm).
        for module, python, env, folder in likely_prewarms(req, self.on_gpu):
            start_prewarm(module, python, env, folder)

    # -- the contexts every command is built from -------------------------------------------------

    @contextmanager
    def command(self) -> Iterator[None]:
        """One command's scope for Stop. The outermost call begins a command (a Stop pressed before
        it is not for it: the flag is lowered); nested work — a bisect's trials, a gate's cases, a
        sweep's points, each its own recording — runs inside the same scope, so one Stop ends the
        whole command and nothing has to re-arm it. `cancel()` stops whatever command is under way."""
        with self._lock:
            outer = self._depth == 0
            if outer:
                self.pool.reset_cancel()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1

    @contextmanager
    def recording(
        self,
        model: str,
        config: dict[str, Any],
        prompts: list[PromptSpec],
        *,
        kind: str = "compare",
        group_id: str | None = None,
        resume: Run | None = None,
        refuse: bool = False,
    ) -> Iterator[RunRecorder]:
        """A new run, stored as it starts (or `resume`, a stored run taken up again by this process).
        An Exception raised in the block becomes the run's status ("error", or "cancelled" on Stop)
        with its message, is stored, and does NOT propagate: read `rec.run.status`. Ctrl-C is stored
        as "interrupted", then raised. A Stop pressed before the command began is not for it; one
        pressed during it stops every recording nested in it (`command`). With `refuse` (a run the
        user asked for: the app's Run, `parity compare`), a ParityError raised before any side
        started (a model not found, no chat template, a prompt over the context...) is a refusal:
        the run's rows go and the error propagates (issue 46 item 5: nothing stored, as the app's
        other refusals)."""
        with self.command():
            if resume is not None:
                rec = RunRecorder(self.db, resume)
                rec.resume()
            else:
                rec = RunRecorder(self.db, new_run(new_run_id(), model, config, prompts, kind=kind, group_id=group_id))
                attach_images(rec.run, prompts)
                rec.begin(prompts)
            try:
                yield rec
            except BaseException as e:  # noqa: BLE001 - stored, then re-raised only for Ctrl-C
                self.pool.drop_spares()  # workers started ahead for a run that failed before taking them
                if refuse and resume is None and is_refusal(e, rec.run):
                    rec.forget()
                    raise
                rec.fail(e)
                if not isinstance(e, Exception):
                    rec.finish()
                    raise
            rec.finish()

    @contextmanager
    def sides(
        self,
        plans: list[SidePlan],
        *,
        gpu: bool | None = None,
        gated: bool = True,
        emit: EventCallback | None = None,
        inputs: Callable[[], InputCheck] | None = None,
        then: Callable[[Sides, SidePlan], None] | None = None,
        on_loaded: Callable[[SidePlan, Loaded], None] | None = None,
        findings: list[Finding] | None = None,
        timings: dict[str, float] | None = None,
    ) -> Iterator[Sides]:
        """Start, check and load every side of `plans` (parity_ui.run.pipeline: `gated` or not, `then`
        run for each side once it may generate), then yield them for typed verbs. `findings` and
        `timings` (a run's) receive the engines' warnings and the phases, also when starting fails.
        Raises CapabilityError, CancelledError, EngineError."""
        with self._lock:
            if self._cluster is not None and self._cluster.local and self.on_gpu:
                self._cluster.release()  # a local cluster's replicas hold this machine's GPUs
            sides = Sides(
                self.pool,
                plans,
                gpu=self.on_gpu if gpu is None else gpu,
                gated=gated,
                emit=emit,
                inputs=inputs,
                then=then,
                on_loaded=on_loaded,
                findings=findings,
                timings=timings,
            )
            try:
                sides.start()
                yield sides
            except BaseException:
                self.pool.drop_spares()
                raise

    @contextmanager
    def cluster_sides(
        self,
        plans: list[SidePlan],
        spec: Any,
        *,
        gpu: bool | None = None,
        emit: EventCallback | None = None,
        on_loaded: Callable[[SidePlan, Loaded], None] | None = None,
        findings: list[Finding] | None = None,
        timings: dict[str, float] | None = None,
    ) -> Iterator[Any]:
        """`sides()` on a Ray cluster (`spec`, a parity_ui.core.cluster.ClusterSpec): each side's
        replicas started (or kept warm from the last run) as actors hosting the same workers, checked
        and loaded, then yielded as parity_ui.run.cluster.ClusterSides. The cluster (a local Ray
        instance, or the connection to one) lives until close(). Raises ConfigError (no Ray, no such
        cluster), CapabilityError, CancelledError, EngineError."""
        from .run.cluster import Cluster, ClusterSides

        with self._lock:
            if self._cluster is None or self._cluster.address != spec.address:
                if self._cluster is not None:
                    self._cluster.close()
                    self._cluster = None
                self._cluster = Cluster(spec.address)
            if self._cluster.local and self.on_gpu:
                self.pool.retain(set(), keep_idle=0)  # the warm in-process workers hold the GPUs the replicas need
            sides = ClusterSides(
                self._cluster,
                self.pool,
                plans,
                spec,
                gpu=self.on_gpu if gpu is None else gpu,
                emit=emit,
                on_loaded=on_loaded,
                findings=findings,
                timings=timings,
            )
            sides.start()
            try:
                yield sides
            finally:
                sides.close()  # a replacement replica still starting is not waited for

    # -- commands: one method each -----------------------------------------------------------------

    def run(self, req: Request, on_event: EventCallback | None = None) -> Run:
        """The request `plan_request` made: a comparison (`compare`) or a workload (`workload`); or
        a replay (the app's uploaded rollout dump: `replay`). What the user asked for (the app's Run,
        `parity compare`): a refusal before any side starts raises ParityError, nothing stored."""
        if isinstance(req, WorkloadRequest):
            return self.workload(req, on_event, refuse=True)
        if isinstance(req, ReplayRequest):
            return self.replay(req, on_event)
        return self.compare(req, on_event, refuse=True)

    def compare(self, req: RunRequest, on_event: EventCallback | None = None, *, refuse: bool = False) -> Run:
        """Run every side, compare, store (parity_ui.commands.compare). Always returns the stored Run;
        never raises for a user or engine error (the run's status is then "error" with the message),
        except, with `refuse`, for a refusal before any side started (recording() says which): then
        it raises that ParityError and stores nothing."""
        from .commands.compare import compare_sides

        emit = on_event or (lambda e: None)
        with self.recording(
            req.model, req.config.to_dict(), req.prompts, kind=req.kind, group_id=req.group_id, refuse=refuse
        ) as rec:
            compare_sides(self, rec, req, emit)
        emit(RunEvent("status", f"stored run {rec.run.id}: {rec.run.status}"))
        return rec.run

    def workload(self, req: WorkloadRequest, on_event: EventCallback | None = None, *, refuse: bool = False) -> Run:
        """Many prompts as one run, judged against the reference's noise floor
        (parity_ui.commands.workload.run). Stored as it goes; never raises for a user or engine error,
        except a refusal with `refuse` (as compare)."""
        from .commands.workload.run import run_workload

        return run_workload(self, req, on_event, refuse=refuse)

    def resume(
        self,
        run_id: str,
        on_event: EventCallback | None = None,
        *,
        cluster: str | None = None,
        replicas: dict[str, int] | None = None,
    ) -> Run:
        """Go on with a stopped, failed or interrupted workload or replay (on the cluster it ran on, or
        `cluster`: another address, "none" for in process; `replicas` other counts). Raises
        ParityError when there is nothing to resume."""
        from .commands.replay import is_replay, resume_replay
        from .commands.workload.run import resume_workload

        if is_replay(self, run_id):
            from .commands.replay_recorded import refuse_resume

            refuse_resume(self, run_id)  # a recorded-only replay is read again, not resumed
            return resume_replay(self, run_id, on_event, cluster=cluster, replicas=replicas)
        return resume_workload(self, run_id, on_event, cluster=cluster, replicas=replicas)

    def replay(self, req: Any, on_event: EventCallback | None = None) -> Run:
        """An RL run's own rollouts (a dump) teacher-forced through the trainer and the rollout engine
        again, judged against the trainer's floor (parity_ui.commands.replay; `req` a ReplayRequest).
        Stored as a run of kind "replay". Raises ParityError, with nothing stored, for a dump that
        cannot be read or fails the preflight (before any engine loads)."""
        from .commands.replay import run_replay

        return run_replay(self, req, on_event)

    def replay_recorded(self, req: Any, on_event: EventCallback | None = None) -> Run:
        """A dump's own pair, the recorded rollout against the recorded trainer logprobs, pooled without
        loading any engine (parity_ui.commands.replay_recorded; `req` a ReplayRequest, its sides unused).
        Stored as a run of kind "replay". Raises ParityError, with nothing stored, for a dump that cannot
        be read, fails the preflight, or holds no trainer logprobs."""
        from .commands.replay_recorded import replay_recorded

        return replay_recorded(self, req, on_event).run

    def trend(self, req: Any, on_event: EventCallback | None = None, on_step: Any = None) -> Run:
        """Every step of a run's directory replayed (recorded-only, or with the sides), the mismatch's
        trend over the steps and where it jumps; `req.follow`: each step as it lands, a gate judged as
        it goes (parity_ui.commands.replay_steps; `req` a TrendRequest, `on_step(step, report)` called
        as each step lands). Stored as a run of kind "trend" (its record: `store.trend(run.id)`).
        Raises ParityError, nothing stored, for a directory that is not a run's."""
        from .commands.replay_steps import run_trend

        return run_trend(self, req, on_event, on_step)

    def probe(
        self,
        model: str,
        prompt: PromptSpec,
        config: Any,
        *,
        n: int = 4,
        batch: int = 4,
        trust_remote_code: bool = False,
        emit: EventCallback | None = None,
    ) -> Run:
        """Determinism of every side on one prompt, alone and in batches (parity_ui.commands.probes)."""
        from .commands.probes import run_probe

        return run_probe(self, model, prompt, config, n=n, batch=batch, trust_remote_code=trust_remote_code, emit=emit)

    def sweep(
        self,
        model: str,
        prompt: PromptSpec,
        grid: dict[str, list[Any]],
        *,
        config_path: str | None = None,
        overrides: list[str] | None = None,
        base: dict[str, Any] | None = None,
        sides: list[str] | None = None,
        trust_remote_code: bool = False,
        emit: EventCallback | None = None,
    ) -> dict[str, Any]:
        """One prompt across a grid of settings, each point a stored run (parity_ui.commands.sweep);
        returns the sweep's summary (points, their status and divergence, what moved it)."""
        from .commands.sweep import run_sweep, summarize_sweep

        with self.command():  # one Stop ends every point
            return summarize_sweep(
                run_sweep(
                    self,
                    model,
                    prompt,
                    grid,
                    config_path=config_path,
                    overrides=overrides,
                    base=base,
                    sides=sides,
                    trust_remote_code=trust_remote_code,
                    emit=emit,
                )
            )

    def parse_grid(self, items: list[str]) -> dict[str, list[Any]]:
        """A sweep's --grid KEY=V1,V2 items, checked before anything runs. Raises ConfigError."""
        from .commands.sweep import parse_grid

        return parse_grid(items)

    def record_failure(
        self,
        model: str,
        prompts: list[PromptSpec],
        config: dict[str, Any],
        error: Exception,
        kind: str = "compare",
        group_id: str | None = None,
    ) -> Run:
        """Store a run that failed before it could be prepared (a bad config or prompt file)."""
        with self.recording(model, config, prompts, kind=kind, group_id=group_id) as rec:
            raise error
        return rec.run

    def localise(
        self,
        run: Run | str,
        prompt_index: int = 0,
        position: int | None = None,
        pair: tuple[str, str] | str | None = None,
        emit: EventCallback | None = None,
        *,
        ops: bool = False,
        window: str | None = None,
        swap: str | None = None,
    ) -> Localisation:
        """Where inside the model two sides of a stored run (a Run or its id) part
        (parity_ui.commands.layers), stored with the run, also when it cannot run (the stored
        localisation then says why and how to fix it). `ops` (or a `window`, or a `swap` "LAYER.OP"):
        the op map of every layer, op and token with its causal swap (parity_ui.commands.op_map).
        Raises ParityError for an unknown run id."""
        from .commands.layers import failed, localise
        from .commands.op_map import op_localise
        from .core.errors import ParityError

        run = self._stored(run) if isinstance(run, str) else run
        with self.command():
            try:
                if ops or window or swap:
                    loc = op_localise(self, run, prompt_index, position, pair, window, swap, emit)
                else:
                    loc = localise(self, run, prompt_index, position, pair, emit)
            except ParityError as e:
                loc = failed(run, prompt_index, position, pair, e)
                if ops or window or swap:
                    asked = " ".join(f"--{k} {v}" for k, v in (("window", window), ("swap", swap)) if v)
                    loc.notes.append(f"asked for the op map {asked}".strip())
            return self.store.save_localisation(loc)

    def bisect(
        self,
        run_id: str,
        sides: tuple[str, str] | None = None,
        *,
        prompts: int = 8,
        max_trials: int | None = None,
        emit: EventCallback | None = None,
    ) -> Run:
        """Which setting is it (parity_ui.commands.setting_bisect): the smallest set of the two sides' differing settings
        whose flipping restores parity. Returns the stored bisect (kind "bisect", `run.bisect` its
        record; status ok / diverged / error / cancelled). Raises ParityError only for an unknown run id."""
        from .commands.setting_bisect import BisectRequest, bisect_run

        with self.command():  # one Stop ends every trial
            return bisect_run(self, BisectRequest(run_id, sides, prompts, max_trials), emit)

    def which_setting(
        self, run_id: str, sides: Any = None, prompts: Any = None, on_event: EventCallback | None = None
    ) -> Run:
        """The app's Which setting?: the request checked before anything runs
        (parity_ui.commands.which_setting: `sides` one of the run's pairs that differ, as a pair or
        "a,b", None for the reference and the first side that differs; `prompts` None for 8), then
        `bisect`. Raises ParityError naming the problem and the fix, with nothing stored, for an
        unknown run, a run with no pair that differs, or a pair or number of prompts it cannot take."""
        from .commands.which_setting import checked_request

        with self.command():
            pair, n = checked_request(self.store, run_id, sides, prompts)
            return self.bisect(run_id.strip(), pair, prompts=n, emit=on_event)

    def bisect_choice(self, run_id: str, store: Store | None = None) -> Any:
        """The pairs of a stored run that Which setting? can search, or why none (read only;
        parity_ui.commands.which_setting). `store`: the caller's read connection (the app's per thread)."""
        from .commands.which_setting import bisect_choice

        return bisect_choice(store or self.store, run_id)

    def check(
        self,
        spec_path: str | None = None,
        *,
        self_test_model: str | None = None,
        only: list[str] | None = None,
        overrides: list[str] | None = None,
        limit: int | None = None,
        junit: str | None = None,
        markdown: str | None = None,
        say: Callable[[str], None] | None = None,
        emit: EventCallback | None = None,
    ) -> Any:
        """The CI gate (parity_ui.commands.gate): a spec's cases (or the built-in self-test's) run in
        this service, judged, stored, and written where CI reads them. Returns the CheckResult.
        Raises ParityError (a SpecError names case and line) before anything runs."""
        from .commands.gate.command import run_gate

        with self.command():  # one Stop ends every case
            return run_gate(
                self,
                spec_path,
                self_test_model=self_test_model,
                only=only,
                overrides=overrides,
                limit=limit,
                junit=junit,
                markdown=markdown,
                say=say,
                emit=emit,
            )

    def audit(self, req: Any, on_event: EventCallback | None = None, *, refuse: bool = False) -> Any:
        """Certify zero (parity_ui.commands.audit): every invariance axis of every side, bit for bit, with
        a control that must fail; `req` an AuditRequest. Returns an AuditOutcome (the stored run of kind
        "audit" and its record). Never raises for a user or engine error: the run is stored with status
        "error" and the axes finished before it; except, with `refuse` (the app's Run audit, `parity
        audit`), a refusal before any side started (a model not found, a prompt over the context, a bad
        side or setting): it raises and nothing is stored (issue 46 item 5, as compare)."""
        from .commands.audit import run_audit

        with self.command():  # one Stop ends every axis, and keeps those finished
            return run_audit(self, req, on_event, refuse=refuse)

    def audit_report(self, run_id: str, store: Store | None = None) -> Any:
        """A stored audit's record (parity_ui.core.audit_record.AuditReport), or None. `store`: the
        caller's read connection (the app's per thread)."""
        return (store or self.store).audit_of(run_id)

    def weights(self, req: WeightsCheckRequest, on_event: EventCallback | None = None, *, refuse: bool = False) -> Any:
        """Did the weights land? A vLLM that started from one checkpoint and received `req.model` in flight
        (or a server at req.url updated elsewhere) checked tensor by tensor against the same checkpoint
        loaded fresh by the same engine, and by a teacher-forced probe against the noise floor
        (parity_ui.commands.weights). Returns the WeightReport, stored with its run (kind "weights");
        never raises for a user or engine error (the report then has its error, exit code 2); except,
        with `refuse` (the app's Check weights, `parity weights`), bad input named before any engine
        starts (another architecture, a regex matching no tensor, a model not found): it raises and
        nothing is stored (issue 46 item 5, as compare)."""
        from .commands.weights import run_weights

        with self.command():
            return run_weights(self, req, on_event, refuse=refuse)

    def weight_report(self, run_id: str, store: Store | None = None) -> Any:
        """A stored weight check's report (core.weights.WeightReport), or None. `store`: the caller's
        read connection (the app's per thread)."""
        from .core.weights import WeightReport

        data = (store or self.store).weight_check(run_id)
        return WeightReport.from_dict(data) if data is not None else None

    def weight_checks(self, store: Store | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """The stored weight checks, newest first (run_id, datetime_utc, model, exit_code, headline...)."""
        return (store or self.store).weight_checks(limit)

    # -- reading what is stored ---------------------------------------------------------------------

    def get_run(self, run_id: str, prompts: list[int] | None = None) -> Run | None:
        """A stored run (only the prompts listed, when given), or None."""
        return self.store.get_run(run_id, prompts=prompts)

    def _stored(self, run_id: str) -> Run:
        from .core.errors import ParityError

        run = self.store.get_run(run_id)
        if run is None:
            raise ParityError(
                f"no run with id {run_id!r} in {self.db_path or 'runs.db'}", "list the ids with 'parity runs list'"
            )
        return run

    def drop_workers(self, plans: list[SidePlan]) -> None:
        """Stop the workers of these plans now (an audit's second instance: a process no run reuses)."""
        self.pool.drop({p.load_key for p in plans})

    def cancel(self) -> None:
        """Stop the command under way (safe from any thread): every side stops at its next token or
        before loading, and every run nested in the command is stored as cancelled."""
        self.pool.cancel()

    def close_cluster(self) -> None:
        """Stop this service's replicas on the cluster (and a local Ray instance): their memory and
        GPUs are freed; the next cluster run starts them again."""
        with self._lock:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None

    def close(self) -> None:
        self.pool.close()
        self.close_cluster()


def attach_images(run: Run, prompts: list[PromptSpec]) -> None:
    """Record each prompt's images (name, hash, size) with the run; the bytes are stored apart."""
    for pr, spec in zip(run.prompts, prompts):
        pr.images = [img.meta() for img in getattr(spec, "images", None) or []]
        if spec.images and not pr.prompt_text and spec.text:
            pr.prompt_text = spec.text
