"""Replay: an RL run's own rollouts (a dump: parity_ui.inputs.rollouts) through the trainer and the
rollout engine again, token by token, judged against the trainer's own noise floor.

It is the workload's machinery (parity_ui.commands.workload.run) with the tokens coming from the dump:
the same chunks, store rows, pooled figures, floor and Stop. Where a sequence's tokens come from:
- **recorded**: the dump's response tokens and the logprobs the rollout engine recorded for them
  (the "recorded" side: no engine behind it; it cannot generate or score);
- **forced**: every engine side teacher-forces the same tokens (ScoreBatch through the worker
  verbs): the reference is the trainer (an HF side, the trainer's dtype and settings), each other
  side a rollout-engine re-run (vLLM: prompt logprobs over prompt + response), and the floor the
  reference under a change that must not matter (another attention kernel).

The pairs (each a row of one table; each pair's samples pooled into the workload figures, with the
loss mask applied: masked tokens are left out and counted) are the replay-pairs measure's
(parity_ui.measures.replay_pairs), each named "b vs a" everywhere (core.replay_record): the recorded
rollout against the trainer (the run's own mismatch), each engine re-run against the trainer (numerics
and settings), the recorded logprobs against each re-run (does the engine reproduce its own
logprobs?), the recorded rollout against the dump's own trainer logprobs, R3 (MoE), and the floor.

Stored as a run of kind "replay" (its record: run.workload, with `replay` a core.replay_record.ReplayRecord:
the dump, the pairs, the masked tokens and the worst tokens), so the history, `parity runs show` and
`--json` read it.
Stop keeps the finished chunks and their figures; `resume_replay` (ParityService.resume, `parity
resume ID`) reads the same dump again (its size and row count checked) and replays the rows not yet
done, its counts and worst tokens carried on. A row that cannot be read (a truncated line) stops the
replay before any engine loads, naming it, or with on_bad="skip" is left out and named in a warning.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..analysis.compare import compare
from ..analysis.verdict_basis import verdict_basis
from ..core.config import ParityConfig, config_from_dict, routes_for
from ..core.errors import ConfigError, ParityError
from ..core.kinds import VllmOptions, get_kind
from ..core.pooled import EXCEEDS, TOO_FEW, PairSample
from ..core.replay_record import RECORDED, ReplayRecord
from ..core.requests import ScoreRequest
from ..core.runlog import EventCallback, RunEvent, new_run
from ..core.types import Comparison, Finding, RunStatus, SideInfo, SideResult, StepColumns, TokenStep
from ..core.workload_record import SideFigures, WorkloadOptions, WorkloadReport
from ..inputs.models import describe_model
from ..inputs.prompts import PromptSpec, tokenizer_for
from ..inputs.rollouts import Preflight, RolloutRow, open_dump, preflight
from ..measures import Made, PairSeen, Plan, RowSeen, ScoreAsk
from ..measures.replay_pairs import WORST_TOKENS, cleaned  # noqa: F401 - WORST_TOKENS: re-exported
from ..measures.routes import DumpRoutesCheck
from ..measures.tokens import pool_tokens
from ..run.plan import SidePlan
from ..run.recorder import decode_result
from ..run.sideset import SideSet
from .workload.run import FLOOR, Workload, WorkloadRequest, check_cluster, go_on_where, stored_to_resume

if TYPE_CHECKING:
    from ..core.types import Run
    from .service_api import Service


@dataclass
class ReplayRequest:
    dump: str
    model: str
    config: ParityConfig  # the reference = the trainer (an HF side); the other sides = engine re-runs
    format: str = "auto"
    trust_pickle: bool = False
    chat_template: bool = False  # verl: apply the model's chat template to the text prompt
    on_bad: str = "stop"
    limit: int | None = None
    policy_version: str | None = None
    chunk: int = 16
    floor: str = "auto"  # "auto" (kernel with an HF trainer), "kernel", "none"
    trust_remote_code: bool = False
    group_id: str | None = None  # a gate check's cases share one
    name: str | None = None  # the dump as people know it (the app's upload: its file name, not the temporary path)
    cluster: str | None = None  # on a Ray cluster: "local" or an address (parity_ui.core.cluster)
    replicas: dict[str, int] = dataclasses.field(default_factory=dict)  # {side or "*": count}


def _selected(rows: Iterator[RolloutRow], req: ReplayRequest) -> Iterator[RolloutRow]:
    n = 0
    for row in rows:
        if req.limit is not None and n >= req.limit:
            return
        if req.policy_version is not None and row.policy_version != req.policy_version:
            continue
        n += 1
        yield row


def check_request(req: ReplayRequest) -> None:
    if req.floor not in ("auto", "kernel", "none"):
        raise ConfigError(
            "floor",
            f"is {req.floor!r}; a replay's floor is auto, kernel or none",
            "e.g. --floor kernel (the trainer with another attention kernel)",
        )
    if not 1 <= req.chunk <= 100_000:
        raise ConfigError("chunk", "must be 1..100000", "e.g. --chunk 16")
    if len(req.config.sides) < 2:
        raise ConfigError(
            "sides",
            "a replay needs the trainer (the reference) and a rollout engine side",
            "e.g. --side a=hf --side b=vllm",
        )
    if not get_kind(req.config.sides[0].kind, "sides").can_score:
        raise ConfigError(
            "sides",
            f"the reference (the trainer) is a {req.config.sides[0].kind} side, which cannot score tokens it is handed",
            "make the first side an HF side: --side a=hf",
        )


def replay_sides(cfg: ParityConfig) -> list[Any]:
    """The sides with forced_tokens left unset made "auto": a rollout engine re-run forces the
    dump's tokens through decode steps (vLLM's trace replay) where its vLLM runs it, as the rollout
    made them; elsewhere it scores them as prompt logprobs, and the run says which ran."""
    out = []
    for side in cfg.sides:
        # (forced_tokens is a vLLM option: VllmOptions and its server and updated kinds)
        if isinstance(side.options, VllmOptions) and side.options.forced_tokens is None:
            side = dataclasses.replace(side, options=dataclasses.replace(side.options, forced_tokens="auto"))
        out.append(side)
    return out


def read_dump(
    req: ReplayRequest, emit: EventCallback, rows_out: list[RolloutRow] | None = None
) -> tuple[Any, list[PromptSpec], Preflight, int]:
    """The dump opened and checked (one streaming pass) before any engine loads: its prompts (ids as
    given), the preflight, the longest response. Raises ParityError naming the rows and the fix.
    `rows_out` (a recorded-only replay's, which reads each row once): the rows read are appended to it."""
    info = describe_model(req.model, trust_remote_code=req.trust_remote_code)
    tok = tokenizer_for(info.path, req.trust_remote_code)
    dump = open_dump(
        req.dump,
        req.format,
        tokenizer=tok.tok,
        trust_pickle=req.trust_pickle,
        on_bad=req.on_bad,
        chat_template=req.chat_template,
    )
    emit(RunEvent("status", f"reading {dump.describe()}"))
    prompts: list[PromptSpec] = []
    longest = 0

    routes = DumpRoutesCheck(info.path, bool(routes_for(req.config, info.num_experts).routes))  # MoE: recorded routes

    def keep(row: RolloutRow) -> None:
        nonlocal longest
        prompts.append(PromptSpec(text=f"{row.where}", token_ids=row.prompt_ids))
        longest = max(longest, len(row.response_ids))
        routes.see(row)
        if rows_out is not None:
            rows_out.append(row)

    pf = preflight(_selected(dump.rows(), req), vocab_size=len(tok.tok), eos_ids=tok.eos_token_ids, on_row=keep)
    routes.raise_if_bad()  # routes recorded for another model: named before any engine loads
    pf.findings += routes.findings()
    if dump.bad:  # --on-bad skip: the rows left out, named (the run goes on without them)
        named = "; ".join(f"{b.where}: {b.message}" for b in dump.bad[:3]) + (
            f"; and {len(dump.bad) - 3} more" if len(dump.bad) > 3 else ""
        )
        pf.findings.append(
            Finding(
                "replay-bad-rows",
                "warning",
                f"{len(dump.bad)} rows of the dump could not be read and were skipped (--on-bad skip): {named}",
                "fix or drop those rows, or pass --on-bad stop to stop at the first",
            )
        )
        pf.skipped = [b.where for b in dump.bad]
    if pf.errors:
        first, rest = pf.errors[0], pf.errors[1:]
        more = "" if not rest else " Also: " + " ".join(f.message for f in rest)
        raise ParityError(f"the dump cannot be replayed: {first.message}.{more}", first.fix, code=first.code)
    return dump, prompts, pf, longest


def dump_source(dump: Any, pf: Preflight, req: ReplayRequest) -> dict[str, Any]:
    """What a resume needs to read the same rows again (stored as the workload's source), and the
    size and mtime that tell it the file is still the one replayed."""
    import os

    st = os.stat(dump.path)
    return {
        "path": dump.path,
        "format": dump.format,
        "rows": pf.rows,
        "policy_version": req.policy_version,
        "limit": req.limit,
        "trust_pickle": req.trust_pickle,
        "chat_template": req.chat_template,
        "on_bad": req.on_bad,
        "size": st.st_size,
        "mtime": st.st_mtime,
        "description": f"{req.name or os.path.basename(dump.path)}: {pf.rows:,} rows ({dump.format})",
    }


def is_replay(service: Service, run_id: str) -> bool:
    stored = service.store.get_run(run_id, prompts=[])
    return stored is not None and stored.kind == "replay"


def resume_replay(
    service: Service,
    run_id: str,
    emit: EventCallback | None = None,
    *,
    cluster: str | None = None,
    replicas: dict[str, int] | None = None,
) -> Run:
    """Go on with a stopped, failed or interrupted replay: the dump read again (the same file: its
    size and row count are checked), the rows not yet finished replayed with the same sides, and the
    counts and worst tokens carried on. Raises ParityError when there is nothing to resume."""
    emit = emit or (lambda e: None)
    stored = stored_to_resume(
        service, run_id, "replay", "row", "start a new replay to measure again", lambda r: r.done >= r.n_prompts
    )
    report = stored.workload
    assert report is not None  # stored_to_resume refuses a run without its report
    src, o = report.options.source, report.options
    go_on_where(o, cluster, replicas)
    cfg = config_from_dict(stored.config)
    req = ReplayRequest(
        dump=src["path"],
        model=stored.model.name,
        config=cfg,
        format=src["format"],
        trust_pickle=bool(src.get("trust_pickle")),
        chat_template=bool(src.get("chat_template")),
        on_bad=src.get("on_bad") or "stop",
        limit=src.get("limit"),
        policy_version=src.get("policy_version"),
        chunk=o.chunk,
        floor=o.floor,
    )
    import os

    size = os.stat(src["path"]).st_size if os.path.exists(src["path"]) else None
    if size != src.get("size"):
        raise ParityError(
            f"the dump {src['path']} is not the file replayed "
            + ("(it is gone)" if size is None else f"({size:,} bytes now, {src.get('size'):,} then)"),
            "put the same file back, or start a new replay of the new one",
        )
    dump, prompts, pf, _ = read_dump(req, emit)
    if pf.rows != src.get("rows"):
        raise ParityError(
            f"the dump {src['path']} now reads {pf.rows} rows, {src.get('rows')} when replayed",
            "put the same file back, or start a new replay of the new one",
        )
    wreq = WorkloadRequest(
        model=req.model, prompts=prompts, config=cfg, options=o, kind="replay", group_id=stored.group_id
    )
    stored.prompts = new_run(run_id, stored.model.name, stored.config, prompts).prompts  # the rows are re-filled
    with service.recording(req.model, stored.config, prompts, resume=stored) as rec:
        engines = [s.name for s in stored.sides[1:] if s.kind != "recorded"]
        done = service.store.prompts_done(run_id, engines)
        emit(RunEvent("status", f"resuming replay {run_id}: {len(done)} of {report.n_prompts} rows are done"))
        Replay(service, rec, wreq, emit, dump, req, pf).run(done=done)
    emit(RunEvent("status", f"stored run {rec.run.id}: {rec.run.status}"))
    return rec.run


def run_replay(service: Service, req: ReplayRequest, emit: EventCallback | None = None) -> Run:
    """Replay the dump and store it as a run of kind "replay". Raises ParityError (nothing stored)
    for a dump that cannot be read or fails the preflight; never raises for an engine error (the run
    is stored with its status and what finished)."""
    emit = emit or (lambda e: None)
    check_request(req)
    dump, prompts, pf, longest = read_dump(req, emit)
    # Each side must hold prompt + response (+1: vLLM scores with one more token's request).
    cfg = dataclasses.replace(req.config, max_new_tokens=max(longest + 1, 1), sides=replay_sides(req.config))
    source = dump_source(dump, pf, req)
    options = WorkloadOptions(
        mode="replay",
        floor=req.floor,
        too_long="skip",
        chunk=req.chunk,
        source=source,
        cluster=req.cluster,
        replicas=dict(req.replicas),
    )
    check_cluster(options, [s.name for s in cfg.sides] + [FLOOR])
    wreq = WorkloadRequest(
        model=req.model,
        prompts=prompts,
        config=cfg,
        options=options,
        trust_remote_code=req.trust_remote_code,
        kind="replay",
        group_id=req.group_id,
    )
    with service.recording(req.model, cfg.to_dict(), prompts, kind="replay", group_id=req.group_id) as rec:
        Replay(service, rec, wreq, emit, dump, req, pf).run(done=set())
    emit(RunEvent("status", f"stored run {rec.run.id}: {rec.run.status}"))
    return rec.run


class Replay(Workload):
    """A workload whose sequences are a dump's rows, forced (see the module docstring)."""

    def __init__(
        self,
        service: Service,
        rec: Any,
        req: WorkloadRequest,
        emit: EventCallback,
        dump: Any,
        rreq: ReplayRequest,
        pf: Preflight,
    ):
        super().__init__(service, rec, req, emit)
        self.dump, self.rreq, self.pf = dump, rreq, pf
        self._rows = _selected(dump.rows(), rreq)
        self._next = 0
        # Rows read but not yet stored, by index: on a cluster, blocks ask for rows out of order and a
        # block whose replica was lost asks again (parity_ui.commands.workload.blocks).
        self._ahead: dict[int, RolloutRow] = {}
        self._wanted: set[int] | None = None

    # -- where the rows come from: the dump again, streamed in order ----------------------------------

    def _row(self, i: int) -> RolloutRow:
        if i in self._ahead:
            return self._ahead[i]
        if self._wanted is None:
            self._wanted = set(self.prep.kept)
        wanted = self._wanted
        while True:
            row = next(self._rows)
            self._next += 1
            if self._next - 1 == i:
                self._ahead[i] = row
                return row
            if self._next - 1 in wanted:
                self._ahead[self._next - 1] = row

    def _prepared(self) -> None:
        # The dump's findings beside the sides' own (fp32 lm_head on one side only, dtypes...), stored
        # with the run's header before any engine loads.
        run = self.rec.run
        run.warnings += [f for f in self.pf.findings if f not in run.warnings]

    def _plan(self, floor: SidePlan | None) -> Plan:
        """The replay's record (a resumed one goes on with its own: its pairs, counts and worst tokens),
        handed to the measures with the run (the replay-pairs measure declares its pairs into it)."""
        report = self.rec.run.workload
        assert report is not None
        if report.replay is None:
            pf = self.pf
            report.replay = ReplayRecord(
                dump=self.rreq.name or self.dump.path,
                format=self.dump.format,
                rows=pf.rows,
                notes=list(self.dump.notes),
                skipped=list(pf.skipped),
                reconstructed=pf.reconstructed,
                with_logprobs=pf.with_logprobs,
                with_trainer=pf.with_trainer,
                with_routes=pf.with_routes,
            )
        return dataclasses.replace(super()._plan(floor), replay=report.replay)

    def _forced_paths(self, sides: SideSet) -> dict[str, str]:
        """Each replayed side: how it forced the tokens (trace decode steps or prompt logprobs, and
        why), as its engine reported; sides that do not say (HF: always one teacher-forced forward)
        read "teacher-forced forward"."""
        names = [p.name for p in self.prep.sides] + ([self.floor.name] if self.floor is not None else [])
        out = {}
        for name in names:
            try:
                got = sides.info(name).resolved.get("forced_tokens")
            except (KeyError, AttributeError):
                got = None
            out[name] = got or "teacher-forced forward"
        return out

    # -- one chunk ------------------------------------------------------------------------------------

    def run_chunk(self, sides: SideSet, chunk: list[int]) -> None:
        prep, ref, run = self.prep, self.prep.reference, self.rec.run
        record = run.workload.replay if run.workload is not None else None
        assert record is not None
        if not any(s.name == RECORDED for s in run.sides):
            run.sides.append(
                SideInfo(name=RECORDED, kind="recorded", options={"dump": self.dump.path, "format": self.dump.format})
            )
        if not record.forced:
            record.forced = self._forced_paths(sides)
        rows = {j: self._row(prep.kept[j]) for j in chunk}
        k = max(prep.config.logprobs, 1)
        items = [ScoreRequest(prep.prompts[j].token_ids, rows[j].response_ids, k) for j in chunk]
        forced: dict[str, dict[int, Any]] = {}
        plans = [*prep.sides, *self._floors()]
        for p in plans:
            t0 = time.perf_counter()  # each side's own scoring time, round trips included (bench/replay.py)
            mine = [  # what the measures ask of each side's forcing (full_distribution: rows written and met)
                ScoreRequest(
                    it.prompt,
                    it.continuation,
                    it.logprobs,
                    **self.active.score_fields(ScoreAsk(p.name, p.name, j, "forced")),
                )
                for it, j in zip(items, chunk)
            ]
            forced[p.name] = dict(zip(chunk, sides.score_batch(p.name, mine)))
            record.score_s[p.name] = record.score_s.get(p.name, 0.0) + time.perf_counter() - t0
        # Stopped inside the chunk: the rows every side forced are kept; the Stop is reported by the next verb.
        done = [j for j in chunk if all(j in by for by in forced.values())]
        by_row: dict[int, dict[str, SideResult]] = {}
        for j in done:
            row, i = rows[j], prep.kept[j]
            by_row[j] = {name: self._forced(name, i, row, by[j]) for name, by in forced.items()}
            if row.rollout_logprobs is not None:
                by_row[j][RECORDED] = self._recorded(i, row)
        results: dict[str, dict[int, SideResult]] = {}
        for j in done:
            for name, r in by_row[j].items():
                results.setdefault(name, {})[j] = r
        seqs = {j: (prep.prompts[j].token_ids, rows[j].response_ids) for j in done}
        made = Made("forced", done, plans=plans, results=results, sequences=seqs, rows={j: rows[j] for j in done})
        made.items = dict(zip(chunk, items))
        self.active.collect(sides, made)  # the measures' own calls: routes on the forced tokens, R3
        comparisons: dict[int, list[Comparison]] = {j: [] for j in chunk}
        samples: dict[str, list[PairSample]] = {name: [] for name in self.active.pairs()}
        for j in done:
            res = by_row[j]
            self.active.row(RowSeen(j, prep.kept[j], rows[j], res, samples))
            for name in res:  # each side against the trainer, every token (they all forced the same ones)
                if name != ref.name:
                    pair = PairSeen(name, compare(res[ref.name], res[name]), res[ref.name], res[name], j, True)
                    pair.scored = forced[name][j] if name in forced else None
                    self.active.harvest(pair)
                    comparisons[j].append(pair.c)
        self._store(chunk, results, comparisons, samples)
        self.active.end_chunk(chunk)
        for j in chunk:
            self._ahead.pop(prep.kept[j], None)

    def _forced(self, name: str, i: int, row: RolloutRow, steps: list[TokenStep]) -> SideResult:
        # The worker's columns as they came (a list of TokenStep per position cost the parent ~as much as the scoring).
        res = SideResult(
            side=name,
            prompt_index=i,
            token_ids=list(row.response_ids),
            steps=steps if isinstance(steps, StepColumns) else list(steps),
            finish_reason="forced",
        )
        decode_result(self.prep.tokenizer, res)
        return res

    def _recorded(self, i: int, row: RolloutRow) -> SideResult:
        assert row.rollout_logprobs is not None
        return recorded_result(RECORDED, i, row, cleaned(row.rollout_logprobs), self.prep.tokenizer)

    # -- the figures ----------------------------------------------------------------------------------

    def _pool(self, report: WorkloadReport) -> None:
        """Each pair's token figures (the floor's too), from the store, then each measure's family on the
        pairs that compare a side with the trainer (routes, full rows)."""
        pool_tokens(self.service.store, self.rec.run.id, report, self.active.pairs())
        self.active.pool(self.service.store, self.rec.run.id, report)
        report.headline = replay_headline(report)

    def _status(self) -> RunStatus:
        report = self.rec.run.workload
        assert report is not None
        # ok: every pair within the floor (or no floor); a pair over it, even within sampling error, is not ok.
        return (
            "diverged"
            if any(f.verdict is not None and f.verdict.verdict in (EXCEEDS, TOO_FEW) for f in report.sides.values())
            else "ok"
        )


def recorded_result(
    side: str,
    i: int,
    row: RolloutRow,
    logprobs: list[float | None],
    tokenizer: Any,
    like: SideResult | None = None,
) -> SideResult:
    """One of a row's recorded logprob streams as a side's result (the rollout's, "recorded"; a
    recorded-only replay's trainer's too), its tokens the row's response: as columns (what the store
    keeps anyway), not a TokenStep per position. `logprobs`: NaN already None (replay_pairs.cleaned).
    The texts are decoded with the run's one tokenizer, or taken from `like`, the row's other recorded
    stream (the same tokens), rather than decoded again."""
    n = len(row.response_ids)
    cols = StepColumns(
        {
            "position": list(range(n)),
            "token_id": list(row.response_ids),
            "text": [""] * n,
            "logprob": logprobs,
            "rank": [None] * n,
            "top_n": [0] * n,
            "top_token_id": [],
            "top_logprob": [],
            "top_text": [],
        }
    )
    res = SideResult(side=side, prompt_index=i, token_ids=list(row.response_ids), steps=cols, finish_reason="recorded")
    if like is None:
        decode_result(tokenizer, res)
    else:
        other = cast(StepColumns, like.steps)
        cols.text, cols.raw = other.text, other.raw
        res.text = like.text
    return res


def replay_headline(report: WorkloadReport) -> str:
    """One line: rows replayed, the run's own pair (by its name) with the figure that decided its verdict
    (its floor and interval: analysis.verdict_basis), and its band share beside the floor's."""
    r = report.replay
    own = r.main if r is not None else None
    main = (report.sides.get(own.name) if own is not None else None) or next(iter(report.sides.values()), None)
    if main is None:
        return f"replay of {report.done}/{report.n_prompts} rows: no figures yet"
    t = main.stats.tokens
    share = _band_share(main)
    floor = f" (the floor's {_band_share(report.floor_figures)})" if report.floor_figures and main.verdict else ""
    basis = verdict_basis(main.verdict)
    how = ", recorded only, no engine" if r is not None and r.recorded_only else ""
    return (
        f"replay of {report.done}/{report.n_prompts} rows ({r.format if r else '?'}{how}), {t.pairs} tokens "
        f"({r.masked if r else 0} masked): {main.side}, "
        + (f"{basis}; " if basis else "")
        + f"ρ outside [0.8, 1.2] {share}{floor}"
    )


def _band_share(f: SideFigures) -> str:
    band = next((b for b in f.stats.tokens.outside if (b.low, b.high) == (0.8, 1.2)), None)
    return "-" if band is None or band.outside is None else f"{100 * band.outside:.2g}%"
