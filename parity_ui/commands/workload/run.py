"""A workload run: many prompts through the same sides, in chunks, each chunk generated, compared and
stored before the next; the pooled figures judged against the reference's own noise floor.

Two ways to run it, with the same pooled report:
- free-running ("free"): every side generates, each at its own batch size (the reference can stay
  at batch 1 while the others batch as in production); token figures up to each first divergence.
- scored ("scored"): the sides under test generate; the reference teacher-forces their tokens, one
  forward pass per sequence (what an RL trainer does to compute the mismatch), so its cost is a
  prefill, not a decode. Under greedy decoding the reference would have made a side's sequence
  exactly where it ranks every one of its tokens first, so share identical and first divergence
  are defined here too; the token figures cover whole sequences.

The floor is the reference under a change that should not matter, run as one more side ("floor")
and compared like the others: "batch" the reference again at another batch size, its prompts in
another order; "order" the same batch size, another order; "kernel" (an HF reference) another SDPA
attention kernel; "none". In scored mode the floor side scores the same tokens ("kernel" only:
scoring is per sequence, so order and batch change nothing there).

Memory stays bounded: a chunk's steps go to the store and leave memory; the pooled figures are read
back from the store (parity_ui.commands.workload.report.pooled). Stop keeps every finished chunk and computes
the figures so far; `resume_workload` takes a stopped, failed or interrupted run up again.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...analysis.compare import compare
from ...analysis.explain import explain
from ...analysis.kept_mass import kept_mass
from ...core.cluster import check_sides, parse_cluster
from ...core.config import ParityConfig, config_from_dict
from ...core.errors import ConfigError, ParityError
from ...core.mapping import route_replay_mode
from ...core.pooled import PairSample
from ...core.requests import GenerateRequest, ScoreRequest
from ...core.runlog import EventCallback, RunEvent, new_run, phase
from ...core.settings import differing
from ...core.types import Comparison, Finding, Run, SideResult, StepColumns, TokenStep, step_column
from ...core.workload_record import FLOORS, MODES, FloorSpec, WorkloadOptions, WorkloadReport
from ...inputs.prompts import PromptSpec
from ...run.plan import Prepared, RunRequest, SidePlan
from ...run.prepare import plan_extra_side
from ...run.recorder import RunRecorder, decode_columns, decode_result, side_info
from ...run.sideset import SideSet
from .blocks import time_left_text
from .pieces import pieces, scored_in_pieces
from .report import pooled, pooled_routing, pooled_sampling

if TYPE_CHECKING:
    from ..service_api import Service

FLOOR = "floor"  # the floor side's name (suffixed when a user's side has it)


@dataclass
class WorkloadRequest:
    model: str
    prompts: list[PromptSpec]
    config: ParityConfig
    options: WorkloadOptions = dataclasses.field(default_factory=WorkloadOptions)
    trust_remote_code: bool = False
    group_id: str | None = None
    kind: str = "workload"  # the stored run's kind ("bisect-trial": a trial of parity_ui.commands.setting_bisect)


def run_workload(service: Service, req: WorkloadRequest, emit: EventCallback | None = None) -> Run:
    """Run the workload and store it as a run of kind "workload" (or `req.kind`; run.workload: the
    report). Never raises for a user or engine error: the run is stored with its status, its finished
    prompts and their pooled figures."""
    emit = emit or (lambda e: None)
    with service.recording(req.model, req.config.to_dict(), req.prompts, kind=req.kind, group_id=req.group_id) as rec:
        check_options(req.options, req.config)
        Workload(service, rec, req, emit).run(done=set())
    emit(RunEvent("status", f"stored run {rec.run.id}: {rec.run.status}"))
    return rec.run


def resume_workload(
    service: Service,
    run_id: str,
    emit: EventCallback | None = None,
    *,
    cluster: str | None = None,
    replicas: dict[str, int] | None = None,
) -> Run:
    """Go on with a stopped, failed or interrupted workload run: the prompts it has not finished,
    with the same sides, options and prompts (as given); on the cluster it ran on, unless `cluster`
    names another ("none": in process) or `replicas` other counts. Raises ParityError when there is
    nothing to resume (no such run, not a workload, already finished, or it is running in another
    process)."""
    emit = emit or (lambda e: None)
    stored = stored_to_resume(
        service,
        run_id,
        "workload",
        "prompt",
        "start a new run to measure again",
        lambda r: r.done + len(r.skipped_too_long) >= r.n_prompts,
    )
    report = stored.workload
    go_on_where(report.options, cluster, replicas)
    prompts = given_prompts(service, run_id)
    req = WorkloadRequest(
        model=stored.model.name,
        prompts=prompts,
        config=config_from_dict(stored.config),
        options=report.options,
        group_id=stored.group_id,
    )
    stored.prompts = new_run(run_id, stored.model.name, stored.config, prompts).prompts  # the rows are re-filled
    with service.recording(req.model, req.config.to_dict(), prompts, resume=stored) as rec:
        sides = [s.name for s in stored.sides[1:]]
        done = service.store.prompts_done(run_id, sides)
        emit(RunEvent("status", f"resuming run {run_id}: {len(done)} of {report.n_prompts} prompts are done"))
        Workload(service, rec, req, emit).run(done=done)
    emit(RunEvent("status", f"stored run {rec.run.id}: {rec.run.status}"))
    return rec.run


def stored_to_resume(
    service: Service, run_id: str, kind: str, unit: str, fix_done: str, finished: Callable[[WorkloadReport], bool]
) -> Run:
    """The stored run `run_id` if a `kind` run ("workload", "replay") can go on from it; else a
    ParityError naming why: no such run, another kind, running in another process, or every `unit`
    (prompt, row) finished."""
    stored = service.store.get_run(run_id, prompts=[])
    if stored is None:
        raise ParityError(f"no run with id {run_id!r}", "list the ids with 'parity runs list'")
    if stored.kind != kind or stored.workload is None:
        raise ParityError(f"run {run_id} is a {stored.kind} run, not a {kind}", f"resume a {kind} run")
    if stored.status == "running":
        raise ParityError(
            f"run {run_id} is still running (in process {(stored.owner or {}).get('pid')})",
            "wait for it, or stop it first",
        )
    if stored.status in ("ok", "diverged") and finished(stored.workload):
        raise ParityError(f"run {run_id} finished every {unit}", fix_done)
    return stored


def go_on_where(o: WorkloadOptions, cluster: str | None, replicas: dict[str, int] | None) -> None:
    """A resume's place: the cluster it ran on, unless `cluster` names another ("none": in process),
    and `replicas` other counts."""
    if cluster is not None:
        o.cluster = parse_cluster(cluster)
        if o.cluster is None:
            o.replicas = {}
    if replicas is not None:
        o.replicas = dict(replicas)


def given_prompts(service: Service, run_id: str) -> list[PromptSpec]:
    """A stored run's prompts as the user gave them (parity_ui.store.workloads.given_prompts: raises
    ParityError for prompts not stored as given)."""
    return service.store.given_prompts(run_id)


def check_options(o: WorkloadOptions, cfg: ParityConfig) -> None:
    """The rules a workload's options must meet with its config (a gate's spec is checked by the same).
    Raises ConfigError naming the key."""
    if o.mode not in MODES:
        raise ConfigError("mode", f"is {o.mode!r}, must be one of {', '.join(MODES)}", "e.g. --mode scored")
    if o.floor not in FLOORS:
        raise ConfigError("floor", f"is {o.floor!r}, must be one of {', '.join(FLOORS)}", "e.g. --floor batch")
    if o.too_long not in ("skip", "stop"):
        raise ConfigError("too_long", f"is {o.too_long!r}, must be skip or stop", "e.g. --too-long skip")
    if not 1 <= o.chunk <= 100_000 or not 1 <= o.floor_batch_size <= 1024:
        raise ConfigError("chunk", "chunk must be 1..100000 and floor_batch_size 1..1024", "e.g. --chunk 64")
    if len(cfg.sides) < 2:
        raise ConfigError("sides", "a workload compares at least two sides", "add a side: --side b=vllm")
    if o.cluster is not None or o.replicas:
        check_cluster(o, [s.name for s in cfg.sides] + [FLOOR])
    if o.mode == "scored":
        if not cfg.greedy:
            raise ConfigError(
                "temperature",
                "scored mode compares greedy sequences (temperature 0)",
                "set temperature=0, or use --mode free",
            )
        if o.floor in ("batch", "order"):
            raise ConfigError(
                "floor",
                f"{o.floor!r} changes nothing in scored mode: the reference scores one sequence at a time",
                "use --floor kernel (an HF reference) or --floor none",
            )


def check_cluster(o: WorkloadOptions, sides: list[str]) -> None:
    """A cluster run's options (parity_ui.core.cluster): an address, and replicas of the run's sides
    only with one. Raises ConfigError."""
    o.cluster = parse_cluster(o.cluster)
    if o.replicas and not o.cluster:
        raise ConfigError(
            "replicas",
            "replicas run on a Ray cluster",
            "add --cluster local (this machine) or --cluster ADDRESS, or leave out --replicas",
        )
    check_sides(o.replicas, sides)


def floor_plan(prep: Prepared, o: WorkloadOptions) -> tuple[SidePlan | None, FloorSpec]:
    """The reference under the floor's change, as one more side (or none), planned into `prep` (its GPU
    memory shared with the other sides)."""
    ref = prep.reference
    names = {p.name for p in prep.sides}
    name = next(n for n in (FLOOR, FLOOR + "_", FLOOR + "2") if n not in names)
    change = o.floor
    if change == "auto":  # free: the batch floor; scored: another kernel where the reference has one to switch
        change = "batch" if o.mode == "free" else ("kernel" if ref.kind.name == "hf" else "none")
    if change == "none":
        return None, FloorSpec("none", None, "no floor: the sides' figures stand alone")
    if change == "kernel":
        if ref.kind.name != "hf":
            raise ConfigError(
                "floor",
                f"the kernel floor switches an HF reference's attention kernel; the reference "
                f"{ref.name} is {ref.kind.label}",
                "use --floor batch or order, or none",
            )
        now = ref.spec.options.sdpa_kernels
        other = "math" if now != "math" else "auto"
        spec = dataclasses.replace(ref.spec.replace(sdpa_kernels=other), name=name)
        desc = f"the reference {ref.name} with SDPA kernels {other!r} instead of {now!r}"
    else:
        bs = ref.spec.batch_size(prep.config.batch_size)
        floor_bs = o.floor_batch_size if change == "batch" else bs
        if change == "batch" and floor_bs == bs:
            floor_bs = 1 if bs > 1 else o.floor_batch_size
        spec = dataclasses.replace(ref.spec.replace(batch_size=floor_bs), name=name)
        desc = (
            f"the reference {ref.name} again at batch {floor_bs} (it runs at {bs}), its prompts in reverse order"
            if change == "batch"
            else f"the reference {ref.name} again, its prompts in reverse order"
        )
    try:
        plan = plan_extra_side(prep, spec, like=ref.name, scored=prep.config.cross_score or o.mode == "scored")
    except ParityError as e:  # the floor is resident with every other side: it may be what does not fit
        if not prep.resolved.on_gpu:
            raise
        raise ConfigError(
            "floor",
            f"the noise floor's side ({desc}) runs beside the other sides and does not fit "
            f"on the GPU with them: {e.message}",
            "run without a floor (--floor none), give the floor's reference less to hold (a smaller "
            "batch_size or max_new_tokens), or lower a vLLM side's gpu_memory_utilization; "
            f"without the floor: {e.fix}",
        ) from None
    return plan, FloorSpec(change, name, desc)


class Workload:
    """One workload run inside its recording (see the module docstring)."""

    def __init__(self, service: Service, rec: RunRecorder, req: WorkloadRequest, emit: EventCallback):
        self.service, self.rec, self.req, self.emit = service, rec, req, emit
        self.opts = req.options

    def run(self, done: set[int]) -> None:
        run, o = self.rec.run, self.opts
        self.emit(RunEvent("status", f"preparing {len(self.req.prompts)} prompts"))
        with phase(run, "prepare"):
            rreq = RunRequest(
                model=self.req.model,
                prompts=self.req.prompts,
                config=self.req.config,
                trust_remote_code=self.req.trust_remote_code,
                too_long=o.too_long,
            )
            if not o.cluster:  # replicas start on the cluster, not here
                self.service.head_start(rreq)  # the engines import while this process tokenizes every prompt
            prep = self.service.prepare(rreq)
        self.prep = prep
        self.rec.prepared(prep)
        self._prepared()
        if o.mode == "free" and prep.config.routes:
            for p in prep.sides[1:]:
                if route_replay_mode(p.spec) != "off":
                    run.warnings.append(
                        Finding(
                            code="route-replay-free",
                            severity="warning",
                            side=p.name,
                            message=f"{p.name}.replay_routes is not run in a free-running workload (it would generate "
                            "every prompt again, alone); the routes are still recorded and compared",
                            fix="use --mode scored, where the replay is one forced pass per sequence",
                        )
                    )
        floor, spec = floor_plan(prep, o)
        if floor is not None:
            run.sides.append(side_info(floor, reference=False))
        report = (
            run.workload
            if run.workload is not None and done
            else WorkloadReport(options=o, floor=spec, n_prompts=len(self.req.prompts))
        )
        report.skipped_too_long = [i for i in prep.skipped_too_long]
        report.floor = spec
        run.workload = report
        self.floor = floor
        self.compared = [p.name for p in prep.sides[1:]] + ([floor.name] if floor else [])
        self.full = None  # full_distribution in scored mode: rows meet in the scorers (distribution.FullRows)
        if prep.config.full_distribution and o.mode in ("scored", "replay"):
            from .distribution import FullRows

            self.full = FullRows(prep, floor, self.compared, run.warnings, forced=o.mode == "replay", chunk=o.chunk)
        elif prep.config.full_distribution:
            run.warnings.append(
                Finding(
                    code="full-distribution-free",
                    severity="info",
                    fix="use --mode scored",
                    message="full_distribution compares the sides where they see the same context: "
                    "a free-running workload has none past each fork, so it is computed "
                    "in scored mode and replays only; this run has no distribution figures",
                )
            )
        todo = [j for j, i in enumerate(prep.kept) if i not in done]
        report.done = len(prep.kept) - len(todo)
        self.rec.save_header()
        plans = prep.sides + ([floor] if floor else [])
        on_loaded = lambda p, got: self.rec.loaded(p.name, got.info, got.load_s)  # noqa: E731
        try:
            if o.cluster:  # the same chunks, as blocks on Ray's replicas (parity_ui.commands.workload.on_cluster)
                from .on_cluster import run_on_cluster

                run_on_cluster(self, plans, todo, on_loaded)
            else:
                with self.service.sides(
                    plans,
                    gpu=prep.resolved.on_gpu,
                    emit=self.emit,
                    findings=run.warnings,
                    timings=run.timings,
                    on_loaded=on_loaded,
                ) as sides:
                    with phase(run, "generate"):
                        self._chunks(sides, todo)
        finally:
            if self.full is not None:
                self.full.close()
            with phase(run, "pool"):  # also after a Stop or a failure: the figures of what finished
                self._pool(report)
                self.rec.save_header()
        run.status = self._status()

    def _prepared(self) -> None:
        """After prepare, before any engine loads (a replay adds its dump's findings here)."""

    def _pool(self, report: WorkloadReport) -> None:
        """The figures of every compared side (and the floor's), from the store."""
        pooled(
            self.service.store, self.rec.run.id, report, [p.name for p in self.prep.sides[1:]] + self._replayed_pairs()
        )
        if getattr(self, "full", None) is not None:  # every stored chunk's columns, a resume's earlier ones too
            self.full.report(report, self.service.store, self.rec.run.id)
        pooled_sampling(self.service.store, self.rec.run.id, report)  # the same: every stored kept-mass record
        if self.prep.config.routes:  # every stored chunk's routes, a resume's earlier ones too
            pooled_routing(self.service.store, self.rec.run.id, report)

    def _status(self) -> str:
        return "ok" if self.rec.run.identical else "diverged"

    # -- the chunks ---------------------------------------------------------------------------------

    def _chunks(self, sides: SideSet, todo: list[int]) -> None:
        report = self.rec.run.workload
        t0, finished = time.perf_counter(), 0
        size = self.opts.chunk
        n_chunks = -(-len(todo) // size) if todo else 0
        self.emit(
            RunEvent(
                "status",
                f"generating {len(todo)} prompt(s) in {n_chunks} chunk(s) of up to {size}; "
                "progress moves as each side's tokens come",
            )
        )
        self.progress = progress = Progress(self.emit, report, len(todo), self.prep.config.max_new_tokens, n_chunks)
        for k, start in enumerate(range(0, len(todo), size)):
            chunk = todo[start : start + size]
            progress.chunk(k, len(chunk), self.calls_per_chunk())
            self.run_chunk(sides, chunk)
            finished += len(chunk)
            report.done += len(chunk)
            report.rate = finished / max(time.perf_counter() - t0, 1e-9)
            progress.chunk_done(len(chunk))
            self.rec.save_header()

    def calls_per_chunk(self) -> int:
        """The engine calls one chunk makes (each side's generate, each scoring): progress's unit."""
        n_sides = len(self.prep.sides) - 1
        return (
            (2 * n_sides + (1 if self.floor else 0))
            if self.opts.mode == "scored"
            else (1 + n_sides + (1 if self.floor else 0))
        )

    def run_chunk(self, sides: SideSet, chunk: list[int]) -> None:
        """One chunk's sequences made, compared and stored (a replay forces a dump's tokens instead)."""
        if self.opts.mode == "scored":
            self._scored(sides, chunk)
        else:
            self._free(sides, chunk)

    def _generate(
        self,
        sides: SideSet,
        p: SidePlan,
        chunk: list[int],
        reverse: bool = False,
        rows: bool = False,
        decode: bool = True,
    ) -> dict[int, SideResult]:
        """One side's results for the chunk's prompts, by prompt position (decoded, unless not `decode`);
        with `rows`, its full rows written for the scorer to meet (full_distribution)."""
        prep = self.prep
        order = list(reversed(chunk)) if reverse else chunk
        prompts = prep.prompts_of(p.name)
        greq = GenerateRequest(
            prompts=[prompts[j].token_ids for j in order],
            sampling=p.args.sampling,
            batch_size=p.spec.batch_size(prep.config.batch_size),
            logprobs=max(prep.config.logprobs, 1),
            stream=False,
            counts=True,
            rows=self.full.generate_rows(p.name, order) if rows and self.full else None,
        )
        self.progress.call(p.name, "generating")
        got = sides.generate(p.name, greq, on_counts=self.progress.counts)
        self.progress.call_done()
        out = {}
        for res, j in zip(got, order):
            res.prompt_index = prep.kept[j]
            if decode:
                decode_result(prep.tokenizer, res)
            out[j] = res
        return out

    def _free(self, sides: SideSet, chunk: list[int]) -> None:
        ref = self.prep.reference
        results = {ref.name: self._generate(sides, ref, chunk)}
        for p in self.prep.sides[1:]:
            results[p.name] = self._generate(sides, p, chunk)
        if self.floor is not None:
            results[self.floor.name] = self._generate(sides, self.floor, chunk, reverse=True)
        routes = self.prep.config.routes
        if routes:
            from ..routes import chunk_routes

            chunk_routes(
                self.prep,
                self.rec.run,
                sides,
                [*self.prep.sides] + ([self.floor] if self.floor else []),
                results,
                chunk,
            )
        comparisons = {
            j: [
                self._explained(self._routed(compare(results[ref.name][j], results[n][j]), results, j), results, j)
                for n in self.compared
            ]
            for j in chunk
        }
        for j in chunk:  # sampled tokens' kept sets, where both sides drew (shared-seed sampling)
            for c in comparisons[j]:
                c.kept_mass = kept_mass(c, results[c.a][j], results[c.b][j])  # stored; pooled from the store
        samples = {
            n: [free_sample(c, results[ref.name][j], results[n][j]) for j in chunk for c in comparisons[j] if c.b == n]
            for n in self.compared
        }
        self._store(chunk, results, comparisons, samples)

    def _scored(self, sides: SideSet, chunk: list[int]) -> None:
        prep, ref = self.prep, self.prep.reference
        k = max(prep.config.logprobs, 1)
        full = self.full
        routes = prep.config.routes
        # Decoded below, piece by piece, while the reference scores the next piece (pieces.py).
        gen = {p.name: self._generate(sides, p, chunk, rows=True, decode=False) for p in prep.sides[1:]}
        if routes:  # each generating side's routes on its own tokens
            from ..routes import chunk_routes

            chunk_routes(prep, self.rec.run, sides, prep.sides[1:], gen, chunk)
        results: dict[str, dict[int, SideResult]] = {n: dict(r) for n, r in gen.items()}
        comparisons: dict[int, list[Comparison]] = {j: [] for j in chunk}
        samples: dict[str, list[PairSample]] = {n: [] for n in self.compared + self._replayed_pairs()}
        first = prep.sides[1].name  # the reference's view (its choice given a side's prefix) is shown for this one
        for p in prep.sides[1:]:
            floor = self.floor if self.floor is not None and p.name == first else None
            items = [
                ScoreRequest(
                    prep.prompts[j].token_ids,
                    gen[p.name][j].token_ids,
                    k,
                    rows=full.score_rows(p.name, j, floor is not None) if full else None,
                )
                for j in chunk
            ]
            floor_items = (
                [dataclasses.replace(it, rows=full.floor_rows(j) if full else None) for it, j in zip(items, chunk)]
                if floor is not None
                else []
            )
            scorers = [(ref, items)] + ([(floor, floor_items)] if floor is not None else [])

            def call(side: SidePlan, its: list[ScoreRequest]) -> Callable[[range], list[Any]]:
                return lambda part: sides.score_batch(side.name, [its[x] for x in part])  # noqa: B023 (`part` is the lambda's own)

            # Routes (and the route replay) call the workers from this thread: before the scoring, which
            # then runs inline, as on a cluster (a block's calls hand the driver lock over from its thread).
            # Full rows keep their order in pieces: per piece the reference's call (writing its rows for
            # the floor) comes before the floor's (meeting them), on the one scoring thread.
            ref_routes, floor_routes, replayed = (
                self._scored_routes(sides, p, chunk, gen, items, floor is not None) if routes else ({}, {}, {})
            )
            inline = bool(self.opts.cluster) or bool(routes)
            self.progress.call(ref.name, f"scoring {p.name}'s tokens" + (" (and the floor)" if floor else ""))
            parts = pieces(len(chunk), per_item=not inline and all(s.kind.name == "hf" for s, _ in scorers))
            # closing(): an error in the parent's own work stops the thread's calls at once, not when the
            # traceback holding this frame is freed.
            with closing(scored_in_pieces([call(s, its) for s, its in scorers], parts, threaded=not inline)) as scoring:
                for part, got in scoring:
                    for x, j in enumerate(chunk[part.start : part.stop]):
                        scored = got[0][x]
                        decode_result(prep.tokenizer, gen[p.name][j])
                        view = reference_view(ref.name, gen[p.name][j], scored, prep)
                        base = len(prep.prompts[j].token_ids)
                        if j in ref_routes:
                            view.routes = ref_routes[j].rows_between(base - 1)
                        if p.name == first:
                            results.setdefault(ref.name, {})[j] = view
                        c = self._explained(
                            self._forced_routes(compare(view, gen[p.name][j]), view, gen[p.name][j]),
                            {ref.name: {j: view}, p.name: gen[p.name]},
                            j,
                        )
                        comparisons[j].append(c)
                        samples[p.name].append(before := scored_sample(c, gen[p.name][j], scored))
                        if full:
                            full.harvest(p.name, gen[p.name][j].steps, scored)
                        if j in replayed:
                            samples[self._replayed_name(p)].append(
                                self._route_replay(c, view, gen[p.name][j], replayed[j].steps, scored, before)
                            )
                        if floor is not None:
                            fscored = got[1][x]
                            fview = reference_view(floor.name, gen[p.name][j], fscored, prep)
                            if full:
                                full.harvest(floor.name, fview.steps, fscored)
                            if j in floor_routes:
                                fview.routes = floor_routes[j].rows_between(base - 1)
                            results.setdefault(floor.name, {})[j] = fview
                            fc = self._explained(
                                self._forced_routes(compare(view, fview), view, fview),
                                {ref.name: {j: view}, floor.name: {j: fview}},
                                j,
                            )
                            comparisons[j].append(fc)
                            samples[floor.name].append(scored_sample(fc, _as_result(gen[p.name][j], fscored), scored))
            self.progress.call_done()
            if floor is not None:
                self.progress.call_done()  # the floor's scoring: one call of the chunk's count (calls_per_chunk)
        self._store(chunk, results, comparisons, samples)
        if full:
            full.end_chunk(chunk)

    # -- MoE routes in scored mode: the scorer's routes on the side's tokens, and the cheap route replay --

    def _scored_routes(
        self,
        sides: SideSet,
        p: SidePlan,
        chunk: list[int],
        gen: dict[str, dict[int, SideResult]],
        items: list[ScoreRequest],
        with_floor: bool,
    ) -> tuple[dict, dict, dict]:
        """The reference's (and the floor's) routes on p's sequences, from input position 0, and, where p
        asks for replay_routes, p's scoring of its own tokens routing with the reference's experts."""
        from ..routes import forced_routes, score_with_routes

        prep, run = self.prep, self.rec.run
        seqs = {j: (prep.prompts[j].token_ids, gen[p.name][j].token_ids) for j in chunk}
        ref_routes = forced_routes(run, sides, prep.reference, seqs)
        floor_routes = forced_routes(run, sides, self.floor, seqs) if with_floor else {}
        mode = route_replay_mode(p.spec)
        replayed = {}
        if mode != "off" and ref_routes:
            self.progress.call(p.name, f"scoring its tokens with {prep.reference.name}'s expert routes")
            replayed = score_with_routes(run, sides, p, mode, dict(zip(chunk, items)), ref_routes)
            self.progress.call_done()
        return ref_routes, floor_routes, replayed

    def _replayed_name(self, p: SidePlan) -> str:
        from ..routes import replayed_pair

        return replayed_pair(p.name, self.prep.reference.name)

    def _replayed_pairs(self) -> list[str]:
        """The pooled pairs of a scored workload's route replays (sides with replay_routes), by name."""
        if self.opts.mode != "scored" or not self.prep.config.routes:
            return []
        return [self._replayed_name(p) for p in self.prep.sides[1:] if route_replay_mode(p.spec) != "off"]

    @staticmethod
    def _forced_routes(c: Comparison, a: SideResult, b: SideResult) -> Comparison:
        """Scored mode: both routed the same input (the side's sequence), so every token's routes compare."""
        if a.routes is not None and b.routes is not None:
            from ...analysis.routes import compare_routes

            c.routes = compare_routes(a.routes, b.routes, min(len(a.token_ids), len(b.token_ids)))
        return c

    def _route_replay(
        self,
        c: Comparison,
        view: SideResult,
        side: SideResult,
        replayed: Sequence[TokenStep],
        scored: Sequence[TokenStep],
        before: PairSample,
    ) -> PairSample:
        """The side's own tokens scored again with the reference's routes: the comparison's before/after
        (c.route_replay: the first token where the two would choose differently, and the largest
        |Δlogprob| over the whole sequence, as scored mode measures it) and the replayed pair's sample
        (pooled as its own row)."""
        from ...core.routes import RouteReplay

        p = next(x for x in self.prep.sides if x.name == side.side)
        after = compare(view, reference_view(side.side, side, replayed, self.prep))
        sample = scored_sample(after, _as_result(side, replayed), scored)
        c.route_replay = RouteReplay(
            mode=route_replay_mode(p.spec),
            source=view.side,
            before_first_divergence=c.first_divergence,
            after_first_divergence=after.first_divergence,
            before_identical=c.identical,
            after_identical=after.identical,
            before_max_abs_gap=_max_gap(before),
            after_max_abs_gap=_max_gap(sample),
            compared=len(sample.positions),
        )
        return sample

    def _routed(self, c: Comparison, results: dict[str, dict[int, SideResult]], j: int) -> Comparison:
        """MoE (routes=true): the pair's route agreement, stored with the comparison (the routing figures
        are pooled from the store)."""
        a, b = results[c.a][j], results[c.b][j]
        if a.routes is not None and b.routes is not None:
            from ...analysis.routes import comparable_steps, compare_routes

            c.routes = compare_routes(
                a.routes, b.routes, comparable_steps(c.first_divergence, len(a.token_ids), len(b.token_ids))
            )
        return c

    def _explained(self, c: Comparison, results: dict[str, dict[int, SideResult]], j: int) -> Comparison:
        run = self.rec.run
        c.explanation = explain(c, results[c.a][j], results[c.b][j], self.prep.config, differing(run.sides, c.a, c.b))
        return c

    def _store(
        self,
        chunk: list[int],
        results: dict[str, dict[int, SideResult]],
        comparisons: dict[int, list[Comparison]],
        samples: dict[str, list[PairSample]],
    ) -> None:
        """The chunk's rows in one transaction; then its steps leave memory (the store has them)."""
        run = self.rec.run
        prompts = [run.prompts[self.prep.kept[j]] for j in chunk]
        for j, pr in zip(chunk, prompts):
            pr.comparisons = comparisons[j]
        self.rec.keep_chunk([res for by_prompt in results.values() for res in by_prompt.values()], prompts, samples)
        for pr in prompts:
            pr.comparisons = []


class Progress:
    """Where a workload is, as the share of its work done: finished chunks, then inside the chunk the
    calls it makes (each side's generate, each scoring) and, inside a generate, each prompt's tokens
    (the worker's counts). A "progress" event at most every EVERY_S, and at each call's end, with
    the prompts done, what runs now, the share done and the time left (from the pace so far)."""

    EVERY_S = 1.0

    def __init__(self, emit: EventCallback, report: WorkloadReport, todo: int, max_new: int, n_chunks: int):
        self.emit, self.report, self.todo, self.max_new, self.n_chunks = emit, report, max(todo, 1), max_new, n_chunks
        self.t0 = time.perf_counter()
        self.finished = 0  # prompts of this run's finished chunks
        self.k = self.size = self.calls = self.call_i = 0
        self.side, self.what = "", ""
        self.tokens: dict[int, int] = {}
        self.last = 0.0

    def chunk(self, k: int, size: int, calls: int) -> None:
        self.k, self.size, self.calls, self.call_i = k, size, max(calls, 1), 0

    def call(self, side: str, what: str) -> None:
        self.side, self.what, self.tokens = side, what, {}
        self.tell(force=True)

    def counts(self, moved: dict[int, int]) -> None:
        self.tokens.update(moved)
        self.tell()

    def call_done(self) -> None:
        self.call_i, self.tokens = self.call_i + 1, {}

    def chunk_done(self, size: int) -> None:
        self.finished += size
        self.call_i, self.what = self.calls, ""
        self.tell(force=True)

    def fraction(self) -> float:
        inner = sum(min(n, self.max_new) for n in self.tokens.values()) / max(self.size * self.max_new, 1)
        in_chunk = min(1.0, (self.call_i + inner) / self.calls) if self.what else 0.0
        return min(1.0, (self.finished + self.size * in_chunk) / self.todo)

    def tell(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.EVERY_S:
            return
        self.last = now
        r, f = self.report, self.fraction()
        spent = now - self.t0
        left = time_left_text(spent, f)
        line = f"{r.done}/{r.n_prompts} prompts done"
        if self.what:
            made = sum(self.tokens.values())
            doing = f"{self.side} {self.what}"
            if self.what == "generating":
                doing += f" ({made:,} tokens of up to {self.size * self.max_new:,})"
            line += f"; chunk {self.k + 1} of {self.n_chunks}: {doing}; {100 * f:.0f}% of the work, {left}"
        else:
            line += f", {r.rate:.2f} prompts/s, {left} ({100 * f:.0f}% of the work)"
        self.emit(RunEvent("progress", line, prompt_index=r.done, side=self.side if self.what else None, fraction=f))


def free_sample(c: Comparison, ref: SideResult, side: SideResult) -> PairSample:
    """Free-running: the two sides' own logprobs on the same context, up to the first divergence."""
    n = c.first_divergence if c.first_divergence is not None else c.compared
    return PairSample(
        prompt_index=side.prompt_index,
        identical=c.identical,
        first_divergence=c.first_divergence,
        length=len(side.token_ids),
        verdict=c.explanation.verdict if c.explanation else None,
        logp_side=step_column(side.steps, "logprob")[:n],
        logp_ref=step_column(ref.steps, "logprob")[:n],
        positions=list(range(n)),
    )


def scored_sample(c: Comparison, side: SideResult, scored: Sequence[TokenStep]) -> PairSample:
    """Scored: the side's own logprobs against the reference's teacher-forced ones, every token."""
    lr = step_column(scored, "logprob")
    return PairSample(
        prompt_index=side.prompt_index,
        identical=c.identical,
        first_divergence=c.first_divergence,
        length=len(side.token_ids),
        verdict=c.explanation.verdict if c.explanation else None,
        logp_side=step_column(side.steps, "logprob"),
        logp_ref=lr,
        positions=list(range(len(lr))),
    )


def reference_view(name: str, side: SideResult, scored: Sequence[TokenStep], prep: Prepared) -> SideResult:
    """What the scorer would have chosen at each position of the side's sequence (its top-1 given the
    side's prefix): the side's own sequence up to where the scorer ranks a token second or worse,
    which is where a greedy scorer would have forked. Built as columns from the scored columns."""
    cols = StepColumns.from_steps(scored)
    decode_columns(prep.tokenizer, cols)
    starts = cols.top_starts()
    first = [starts[i] if cols.top_n[i] else None for i in range(len(cols))]
    ids = [cols.top_token_id[k] if k is not None else cols.token_id[i] for i, k in enumerate(first)]
    view = StepColumns(
        {
            "position": list(cols.position),
            "token_id": ids,
            "text": [cols.top_text[k] if k is not None else cols.text[i] for i, k in enumerate(first)],
            "logprob": [cols.top_logprob[k] if k is not None else cols.logprob[i] for i, k in enumerate(first)],
            "rank": [1] * len(cols),
            "top_n": list(cols.top_n),
            "top_token_id": list(cols.top_token_id),
            "top_logprob": list(cols.top_logprob),
            "top_text": list(cols.top_text),
            "raw": {i: cols.top_raw[k] for i, k in enumerate(first) if k is not None and k in cols.top_raw},
            "top_raw": dict(cols.top_raw),
        }
    )
    return SideResult(
        side=name,
        prompt_index=side.prompt_index,
        token_ids=ids,
        steps=view,
        text=prep.tokenizer.decode(ids),
        finish_reason="scored",
    )


def _max_gap(s: PairSample) -> float | None:
    """The largest |Δlogprob| of a pair sample (None: no finite pair)."""
    gaps = [
        abs(x - y) for x, y in zip(s.logp_side, s.logp_ref) if x is not None and y is not None and math.isfinite(x - y)
    ]
    return max(gaps) if gaps else None


def _as_result(side: SideResult, scored: Sequence[TokenStep]) -> SideResult:
    """The floor scorer's logprobs of the side's tokens, as a result whose steps carry them."""
    return dataclasses.replace(side, steps=scored)
