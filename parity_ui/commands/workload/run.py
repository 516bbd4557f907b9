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
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ... import measures
from ...analysis.compare import compare
from ...analysis.explain import explain
from ...core.cluster import check_sides, parse_cluster
from ...core.config import ParityConfig, config_from_dict
from ...core.errors import ConfigError, ParityError
from ...core.kinds import HfOptions
from ...core.pooled import PairSample
from ...core.requests import GenerateRequest, ScoreRequest
from ...core.runlog import EventCallback, RunEvent, new_run, phase
from ...core.settings import differing
from ...core.types import Comparison, Run, RunStatus, SideResult
from ...core.workload_record import FLOORS, MODES, FloorSpec, WorkloadOptions, WorkloadReport
from ...inputs.prompts import PromptSpec
from ...measures import Made, Mode, PairSeen, Plan, ScoreAsk
from ...measures.base import Role
from ...measures.tokens import as_result, reference_view
from ...run.plan import Prepared, RunRequest, SidePlan
from ...run.prepare import plan_extra_side
from ...run.recorder import RunRecorder, decode_result, side_info
from ...run.sideset import SideSet
from .blocks import progress_line, time_left_text
from .pieces import pieces, scored_in_pieces
from .report import headline, pool_tokens

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


def run_workload(
    service: Service, req: WorkloadRequest, emit: EventCallback | None = None, *, refuse: bool = False
) -> Run:
    """Run the workload and store it as a run of kind "workload" (or `req.kind`; run.workload: the
    report). Never raises for a user or engine error: the run is stored with its status, its finished
    prompts and their pooled figures; with `refuse`, a refusal before any side started raises and
    stores nothing (service.recording)."""
    emit = emit or (lambda e: None)
    with service.recording(
        req.model, req.config.to_dict(), req.prompts, kind=req.kind, group_id=req.group_id, refuse=refuse
    ) as rec:
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
    assert report is not None  # stored_to_resume refuses a run without its report
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
        hf_options = ref.spec.options
        assert isinstance(hf_options, HfOptions)  # an HF side's options (checked just above)
        now = hf_options.sdpa_kernels
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
        # The measures (parity_ui.measures): their preflight's findings with the run's, then their state.
        self.active = measures.start(self._plan(floor))
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
            self.active.close()
            with phase(run, "pool"):  # also after a Stop or a failure: the figures of what finished
                self._pool(report)
                self.rec.save_header()
        run.status = self._status()

    def _prepared(self) -> None:
        """After prepare, before any engine loads (a replay adds its dump's findings here)."""

    def _plan(self, floor: SidePlan | None) -> Plan:
        """The run as its measures see it (a replay adds its record)."""
        o = self.opts
        mode = cast(Mode, o.mode)  # checked against MODES (check_options)
        return Plan(self.prep, mode, self.rec.run, floor=floor, cluster=o.cluster, chunk=o.chunk)

    def _pool(self, report: WorkloadReport) -> None:
        """The figures of every compared pair (and the floor's), from the store: the token figures, then
        each measure's family onto them."""
        names = [p.name for p in self.prep.sides[1:]] + self.active.pairs()
        pool_tokens(self.service.store, self.rec.run.id, report, names)
        self.active.pool(self.service.store, self.rec.run.id, report)
        report.headline = headline(report)

    def _status(self) -> RunStatus:
        return "ok" if self.rec.run.identical else "diverged"

    # -- the chunks ---------------------------------------------------------------------------------

    def _chunks(self, sides: SideSet, todo: list[int]) -> None:
        report = self.rec.run.workload
        assert report is not None  # run() set the report before any chunk
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
        with `rows`, what the measures add to a side under test's request (full_distribution: its full
        rows written for the scorer to meet)."""
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
            **(self.active.generate_fields(p.name, order) if rows else {}),
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
        prep, ref = self.prep, self.prep.reference
        results = {ref.name: self._generate(sides, ref, chunk)}
        for p in prep.sides[1:]:
            results[p.name] = self._generate(sides, p, chunk)
        if self.floor is not None:
            results[self.floor.name] = self._generate(sides, self.floor, chunk, reverse=True)
        self.active.collect(sides, Made("generated", chunk, plans=[*prep.sides, *self._floors()], results=results))
        comparisons: dict[int, list[Comparison]] = {j: [] for j in chunk}
        samples: dict[str, list[PairSample]] = {n: [] for n in self.compared}
        for j in chunk:
            for n in self.compared:
                a, b = results[ref.name][j], results[n][j]
                self._pair(PairSeen(n, compare(a, b), a, b, j), comparisons, samples)
        self._store(chunk, results, comparisons, samples)

    def _pair(
        self, pair: PairSeen, comparisons: dict[int, list[Comparison]], samples: dict[str, list[PairSample]]
    ) -> None:
        """One compared pair through the measures: harvested, explained, sampled (a sample by pooled pair)."""
        self.active.harvest(pair)
        run = self.rec.run
        c = pair.c
        c.explanation = explain(c, pair.a, pair.b, self.prep.config, differing(run.sides, c.a, c.b))
        comparisons[pair.j].append(c)
        self.active.sample(pair)
        for name, sample in pair.samples.items():
            samples[name].append(sample)

    def _floors(self) -> list[SidePlan]:
        return [self.floor] if self.floor is not None else []

    def _scored(self, sides: SideSet, chunk: list[int]) -> None:
        prep, ref = self.prep, self.prep.reference
        k = max(prep.config.logprobs, 1)
        # Decoded below, piece by piece, while the reference scores the next piece (pieces.py).
        gen = {p.name: self._generate(sides, p, chunk, rows=True, decode=False) for p in prep.sides[1:]}
        self.active.collect(sides, Made("generated", chunk, plans=prep.sides[1:], results=gen))
        results: dict[str, dict[int, SideResult]] = {n: dict(r) for n, r in gen.items()}
        comparisons: dict[int, list[Comparison]] = {j: [] for j in chunk}
        samples: dict[str, list[PairSample]] = {n: [] for n in self.compared + self.active.pairs()}
        first = prep.sides[1].name  # the reference's view (its choice given a side's prefix) is shown for this one
        for p in prep.sides[1:]:
            floor = self.floor if self.floor is not None and p.name == first else None

            def ask(scorer: SidePlan, j: int, role: Role) -> ScoreRequest:
                return ScoreRequest(
                    prep.prompts[j].token_ids,
                    gen[p.name][j].token_ids,  # noqa: B023 (called in this iteration only)
                    k,
                    **self.active.score_fields(ScoreAsk(scorer.name, p.name, j, role, with_floor=floor is not None)),  # noqa: B023
                )

            items = [ask(ref, j, "reference") for j in chunk]
            floor_items = [ask(floor, j, "floor") for j in chunk] if floor is not None else []
            scorers = [(ref, items)] + ([(floor, floor_items)] if floor is not None else [])

            def call(side: SidePlan, its: list[ScoreRequest]) -> Callable[[range], list[Any]]:
                return lambda part: sides.score_batch(side.name, [its[x] for x in part])  # noqa: B023 (`part` is the lambda's own)

            # A measure's own engine calls (routes, the route replay) are made from this thread: before the
            # scoring, which then runs inline, as on a cluster (a block's calls hand the driver lock over from
            # its thread). Full rows keep their order in pieces: per piece the reference's call (writing its
            # rows for the floor) comes before the floor's (meeting them), on the one scoring thread.
            seqs = {j: (prep.prompts[j].token_ids, gen[p.name][j].token_ids) for j in chunk}
            made = Made("scored", chunk, side=p, items=dict(zip(chunk, items)), floor=floor, sequences=seqs)
            made.progress = self.progress
            self.active.collect(sides, made)
            inline = bool(self.opts.cluster) or self.active.calls_engines()
            self.progress.call(ref.name, f"scoring {p.name}'s tokens" + (" (and the floor)" if floor else ""))
            parts = pieces(len(chunk), per_item=not inline and all(s.kind.name == "hf" for s, _ in scorers))
            # closing(): an error in the parent's own work stops the thread's calls at once, not when the
            # traceback holding this frame is freed.
            with closing(scored_in_pieces([call(s, its) for s, its in scorers], parts, threaded=not inline)) as scoring:
                for part, got in scoring:
                    for x, j in enumerate(chunk[part.start : part.stop]):
                        scored, side = got[0][x], gen[p.name][j]
                        decode_result(prep.tokenizer, side)
                        view = reference_view(ref.name, side, scored, prep)
                        base = len(prep.prompts[j].token_ids)
                        if p.name == first:
                            results.setdefault(ref.name, {})[j] = view
                        pair = PairSeen(
                            p.name,
                            compare(view, side),
                            view,
                            side,
                            j,
                            forced=True,
                            sample_side=side,
                            ref_steps=scored,
                            scored=scored,
                            base=base,
                            generated=side,
                        )
                        self._pair(pair, comparisons, samples)
                        if floor is not None:
                            fscored = got[1][x]
                            fview = reference_view(floor.name, side, fscored, prep)
                            results.setdefault(floor.name, {})[j] = fview
                            fpair = PairSeen(
                                floor.name,
                                compare(view, fview),
                                view,
                                fview,
                                j,
                                forced=True,
                                sample_side=as_result(side, fscored),
                                ref_steps=scored,
                                scored=fscored,
                                base=base,
                                generated=side,
                            )
                            self._pair(fpair, comparisons, samples)
            self.progress.call_done()
            if floor is not None:
                self.progress.call_done()  # the floor's scoring: one call of the chunk's count (calls_per_chunk)
        self._store(chunk, results, comparisons, samples)
        self.active.end_chunk(chunk)

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
        left = time_left_text(now - self.t0, f)
        doing = ""
        if self.what:
            doing = f"chunk {self.k + 1} of {self.n_chunks}: {self.side} {self.what}"
            if self.what == "generating":
                doing += f" ({sum(self.tokens.values()):,} tokens of up to {self.size * self.max_new:,})"
        line = progress_line(r.done, r.n_prompts, f, left, r.rate, doing)
        self.emit(RunEvent("progress", line, prompt_index=r.done, side=self.side if self.what else None, fraction=f))
