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
loss mask applied: masked tokens are left out and counted), in the frameworks' convention
Δ = trainer − rollout and ρ = p_trainer / p_rollout:
- "recorded": the recorded rollout logprobs against the trainer: the run's own mismatch;
- "<engine>": the engine re-run against the trainer: numerics and settings (a pair for `parity bisect`);
- "recorded~<engine>": the recorded logprobs against the engine re-run: does the engine reproduce
  its own logprobs (batch composition, scheduling, cache), or were they made under other settings?
- "recorded~trainer": the recorded rollout against the run's recorded trainer logprobs, when the dump has them;
- the floor: the trainer against itself under another kernel.

Stored as a run of kind "replay" (its record: run.workload, with `replay` the dump, the pairs, the
masked tokens and the worst tokens), so the history, `parity runs show` and `--json` read it.
Stop keeps the finished chunks and their figures; `resume_replay` (ParityService.resume, `parity
resume ID`) reads the same dump again (its size and row count checked) and replays the rows not yet
done, its counts and worst tokens carried on. A row that cannot be read (a truncated line) stops the
replay before any engine loads, naming it, or with on_bad="skip" is left out and named in a warning.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..analysis.compare import compare
from ..core.config import ParityConfig, config_from_dict
from ..core.errors import ConfigError, ParityError
from ..core.kinds import get_kind
from ..core.pooled import EXCEEDS, TOO_FEW, PairSample
from ..core.requests import ScoreRequest
from ..core.runlog import EventCallback, RunEvent, new_run
from ..core.types import Comparison, Finding, SideInfo, SideResult, StepColumns, TokenStep, step_column
from ..core.workload_record import WorkloadOptions, WorkloadReport
from ..inputs.models import describe_model
from ..inputs.prompts import PromptSpec, tokenizer_for
from ..inputs.rollouts import Preflight, RolloutRow, open_dump, preflight
from ..run.pipeline import Sides
from ..run.recorder import decode_result
from .replay_routes import DumpRoutesCheck, replay_routes, route_shape
from .workload.report import pooled, pooled_routing
from .workload.run import FLOOR, Workload, WorkloadRequest, check_cluster, go_on_where, stored_to_resume

if TYPE_CHECKING:
    from ..core.types import Run
    from .service_api import Service

RECORDED = "recorded"
RECORDED_TRAINER = "recorded~trainer"
WORST_TOKENS = 20


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
        if hasattr(side.options, "forced_tokens") and side.options.forced_tokens is None:
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

    routes = DumpRoutesCheck(info.path, bool(getattr(req.config, "routes", False)))  # MoE: the recorded routes

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


def _logprobs(steps: Any) -> list[float | None]:
    return list(step_column(steps, "logprob"))  # from the columns, not a TokenStep built per position


def _clean(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


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
        self._worst: list[tuple[float, int, dict[str, Any]]] = []
        self._masked = self._tokens = 0
        before = rec.run.workload.replay if rec.run.workload is not None else None
        if before:  # a resumed replay: its counts and worst tokens so far go on
            self._tokens, self._masked = before.get("tokens", 0), before.get("masked", 0)
            for w in before.get("worst_tokens") or []:
                heapq.heappush(self._worst, (abs(w["dlogp"]), -(w["prompt_index"] * 1_000_000 + w["position"]), w))

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

    def _pairs(self) -> list[dict[str, str]]:
        engines = [p.name for p in self.prep.sides[1:]]
        trainer = self.prep.reference.name
        out = []
        if self.pf.with_logprobs:
            out.append(
                {
                    "key": RECORDED,
                    "a": trainer,
                    "b": RECORDED,
                    "meaning": "the recorded rollout logprobs against the trainer: the run's own mismatch",
                }
            )
        for e in engines:
            out.append(
                {
                    "key": e,
                    "a": trainer,
                    "b": e,
                    "meaning": f"the rollout engine re-run ({e}) against the trainer: numerics and settings",
                }
            )
        if self.pf.with_logprobs:
            for e in engines:
                out.append(
                    {
                        "key": f"{RECORDED}~{e}",
                        "a": e,
                        "b": RECORDED,
                        "meaning": f"the recorded logprobs against the engine re-run ({e}): does the engine "
                        "reproduce its own logprobs?",
                    }
                )
        if self.pf.with_trainer:
            out.append(
                {
                    "key": RECORDED_TRAINER,
                    "a": "trainer (recorded)",
                    "b": RECORDED,
                    "meaning": "the recorded rollout against the run's own recorded trainer logprobs",
                }
            )
        r3 = self._r3_name()
        if r3 is not None and self.pf.with_logprobs:
            out.append(
                {
                    "key": r3,
                    "a": r3,
                    "b": RECORDED,
                    "meaning": "the trainer routing with the rollout's recorded experts (rollout routing replay, "
                    "R3) against the recorded rollout: the mismatch left once routing is the rollout's",
                }
            )
        if self.floor is not None:
            out.append(
                {
                    "key": self.floor.name,
                    "a": trainer,
                    "b": self.floor.name,
                    "meaning": f"the floor: {self.rec.run.workload.floor.description}",
                }
            )
        return out

    def _prepared(self) -> None:
        # The dump's findings beside the sides' own (fp32 lm_head on one side only, dtypes...), stored
        # with the run's header before any engine loads.
        run = self.rec.run
        # In a replay the trainer (the reference) may replay the dump's recorded routes (replay_routes):
        # the comparison's "it replays no one's routes" does not hold here.
        run.warnings = [w for w in run.warnings if w.code != "replay-on-reference"] + [
            f for f in self.pf.findings if f not in run.warnings
        ]

    def _forced_paths(self, sides: Sides) -> dict[str, str]:
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

    def _chunk(self, sides: Sides, chunk: list[int]) -> None:
        prep, ref, run = self.prep, self.prep.reference, self.rec.run
        if not any(s.name == RECORDED for s in run.sides):
            run.sides.append(
                SideInfo(name=RECORDED, kind="recorded", options={"dump": self.dump.path, "format": self.dump.format})
            )
        if run.workload.replay is None:
            run.workload.replay = {
                "dump": self.rreq.name or self.dump.path,
                "format": self.dump.format,
                "notes": self.dump.notes,
                "rows": self.pf.rows,
                "tokens": 0,
                "masked": 0,
                "skipped": self.pf.skipped,
                "reconstructed": self.pf.reconstructed,
                "with_logprobs": self.pf.with_logprobs,
                "with_trainer": self.pf.with_trainer,
                "with_routes": self.pf.with_routes,
                "pairs": self._pairs(),
                "worst_tokens": [],
                "forced": self._forced_paths(sides),
            }
        rows = {j: self._row(prep.kept[j]) for j in chunk}
        k = max(prep.config.logprobs, 1)
        items = [ScoreRequest(prep.prompts[j].token_ids, rows[j].response_ids, k) for j in chunk]
        forced: dict[str, dict[int, Any]] = {}
        spent = run.workload.replay.setdefault("score_s", {})
        full = getattr(
            self, "full", None
        )  # full_distribution: the trainer writes its rows, the sides that can meet them
        for name in [ref.name] + [p.name for p in prep.sides[1:]] + ([self.floor.name] if self.floor else []):
            t0 = time.perf_counter()  # each side's own scoring time, round trips included (bench/replay.py)
            mine = (
                [dataclasses.replace(it, rows=full.forced_rows(name, j)) for it, j in zip(items, chunk)]
                if full
                else items
            )
            forced[name] = dict(zip(chunk, sides.score_batch(name, mine)))
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
        results: dict[str, dict[int, SideResult]] = {}
        comparisons: dict[int, list[Comparison]] = {j: [] for j in chunk}
        samples: dict[str, list[PairSample]] = {p["key"]: [] for p in run.workload.replay["pairs"]}
        routes = self._routes(sides, chunk, rows, list(forced))
        r3 = self._r3(sides, chunk, rows, items)
        for j in chunk:
            row, i = rows[j], prep.kept[j]
            if any(j not in by for by in forced.values()):
                continue  # stopped inside the chunk: the Stop is reported by the next verb
            res = {name: self._forced(name, i, row, by[j]) for name, by in forced.items()}
            if row.rollout_logprobs is not None:
                res[RECORDED] = self._recorded(i, row)
            for name, r in res.items():
                r.routes = routes.get(name, {}).get(j)
                results.setdefault(name, {})[j] = r
                if full and name in forced and name != ref.name:
                    full.harvest(name, r.steps, forced[name][j])
            lp = {name: _logprobs(r.steps) for name, r in res.items()}
            if row.trainer_logprobs is not None:
                lp[RECORDED_TRAINER + "!"] = [_clean(x) for x in row.trainer_logprobs]
            if j in r3:
                lp[self._r3_name()] = _logprobs(r3[j].steps)
            mask = row.mask()
            keep = [t for t in range(len(row.response_ids)) if t < len(mask) and mask[t]]
            self._tokens += len(row.response_ids)
            self._masked += len(row.response_ids) - len(keep)
            for pair in run.workload.replay["pairs"]:
                a = RECORDED_TRAINER + "!" if pair["key"] == RECORDED_TRAINER else pair["a"]
                if a not in lp or pair["b"] not in lp:
                    continue
                la, lb = lp[a], lp[pair["b"]]
                samples[pair["key"]].append(
                    PairSample(
                        prompt_index=i,
                        identical=True,
                        first_divergence=None,
                        length=len(row.response_ids),
                        verdict=None,
                        logp_side=[lb[t] for t in keep],
                        logp_ref=[la[t] for t in keep],
                        positions=keep,
                    )
                )
            for name in res:
                if name != ref.name:
                    comparisons[j].append(
                        self._routed_pair(
                            compare(res[ref.name], res[name]), res[ref.name], res[name], len(row.response_ids)
                        )
                    )
            self._note_worst(i, row, lp, keep, ref.name)
        replay = run.workload.replay
        replay["tokens"], replay["masked"] = self._tokens, self._masked
        replay["worst_tokens"] = [w for _, _, w in sorted(self._worst, key=lambda x: (-x[0], x[1]))]
        self._store(chunk, results, comparisons, samples)
        if full:
            full.end_chunk(chunk)
        for j in chunk:
            self._ahead.pop(prep.kept[j], None)

    # -- MoE routes (routes=true): every side's on the forced tokens, the recorded side's from the dump --

    def _routes(
        self, sides: Sides, chunk: list[int], rows: dict[int, RolloutRow], names: list[str]
    ) -> dict[str, dict[int, Any]]:
        if not getattr(self.prep.config, "routes", False):
            return {}
        prep = self.prep
        plans = {p.name: p for p in prep.sides + ([self.floor] if self.floor is not None else [])}
        seqs = {j: (prep.prompts[j].token_ids, rows[j].response_ids) for j in chunk}
        out = replay_routes(self.rec.run, sides, names, seqs, {n: plans[n].kind.can_record_routes for n in names})
        if not hasattr(self, "_shape"):
            self._shape = route_shape(prep.model.path)
        if self._shape is not None:
            out[RECORDED] = {
                j: self._shape.routes(rows[j]).rows_between(len(seqs[j][0]) - 1)
                for j in chunk
                if rows[j].routed_experts is not None
            }
        return out

    def _r3_name(self) -> str | None:
        """The pair of rollout routing replay (R3): the trainer with replay_routes, where the dump records
        routes and routes=true; None otherwise."""
        ref = self.prep.reference
        if not (
            getattr(self.prep.config, "routes", False)
            and self.pf.with_routes
            and getattr(ref.spec.options, "replay_routes", "off") != "off"
        ):
            return None
        from .routes import replayed_pair

        return replayed_pair(ref.name, RECORDED)

    def _r3(self, sides: Sides, chunk: list[int], rows: dict[int, RolloutRow], items: list[Any]) -> dict[int, Any]:
        """R3: the trainer scores each row again, routing with the rollout's recorded experts (one forced
        pass a row): {j: SideResult}."""
        if self._r3_name() is None or getattr(self, "_shape", None) is None:
            return {}
        from .routes import score_with_routes

        ref = self.prep.reference
        by_j = dict(zip(chunk, items))
        recorded = {j: self._shape.routes(rows[j]) for j in chunk if rows[j].routed_experts is not None}
        return score_with_routes(self.rec.run, sides, ref, ref.spec.options.replay_routes, by_j, recorded)

    @staticmethod
    def _routed_pair(c: Comparison, a: SideResult, b: SideResult, n: int) -> Comparison:
        """Both routed the same forced tokens: every token's routes compare."""
        if a.routes is not None and b.routes is not None:
            from ..analysis.routes import compare_routes

            c.routes = compare_routes(a.routes, b.routes, n)
        return c

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
        n, lps = len(row.response_ids), row.rollout_logprobs
        # As columns (what the store keeps anyway), not a TokenStep per position.
        steps = StepColumns(
            {
                "position": list(range(n)),
                "token_id": list(row.response_ids),
                "text": [""] * n,
                "logprob": [_clean(lps[t]) for t in range(n)],
                "rank": [None] * n,
                "top_n": [0] * n,
                "top_token_id": [],
                "top_logprob": [],
                "top_text": [],
            }
        )
        res = SideResult(
            side=RECORDED, prompt_index=i, token_ids=list(row.response_ids), steps=steps, finish_reason="recorded"
        )
        decode_result(self.prep.tokenizer, res)
        return res

    def _note_worst(
        self, i: int, row: RolloutRow, lp: dict[str, list[float | None]], keep: list[int], trainer: str
    ) -> None:
        """The worst tokens of the run's own pair (recorded vs trainer; without recorded logprobs, the
        first engine re-run vs the trainer), kept as a bounded heap."""
        side = RECORDED if RECORDED in lp else next((p.name for p in self.prep.sides[1:]), None)
        if side is None:
            return
        engines = [p.name for p in self.prep.sides[1:]]
        la, lb = lp[trainer], lp[side]
        for t in keep:
            a, b = la[t], lb[t]
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
                continue
            d = a - b
            key = (abs(d), -(i * 1_000_000 + t))
            full = len(self._worst) >= WORST_TOKENS
            if full and key <= self._worst[0][:2]:
                continue  # not among the worst: no entry (its text decoded) made for it
            entry = {
                "prompt_index": i,
                "row": row.where,
                "position": t,
                "token_id": row.response_ids[t],
                "text": self.prep.tokenizer.token_text(row.response_ids[t]),
                "pair": side,
                "trainer": a,
                "rollout": b,
                "dlogp": d,
                "engines": {e: lp[e][t] for e in engines if e in lp},
            }
            if full:
                heapq.heapreplace(self._worst, (*key, entry))
            else:
                heapq.heappush(self._worst, (*key, entry))

    # -- the figures ----------------------------------------------------------------------------------

    def _pool(self, report: WorkloadReport) -> None:
        keys = [p["key"] for p in (report.replay or {}).get("pairs", []) if p["key"] != report.floor.side]
        pooled(self.service.store, self.rec.run.id, report, keys)
        if (
            getattr(self, "full", None) is not None
        ):  # the distribution family per engine pair (its key is the side's name)
            self.full.report(report, self.service.store, self.rec.run.id)
        if getattr(self.prep.config, "routes", False):  # the recorded routes against the trainer's, each engine's
            pooled_routing(self.service.store, self.rec.run.id, report)
        report.headline = replay_headline(report)

    def _status(self) -> str:
        report = self.rec.run.workload
        # ok: every pair within the floor (or no floor); a pair over it, even within sampling error, is not ok.
        return (
            "diverged"
            if any(f.verdict is not None and f.verdict.verdict in (EXCEEDS, TOO_FEW) for f in report.sides.values())
            else "ok"
        )


def replay_headline(report: WorkloadReport) -> str:
    """One line: rows replayed, and the run's own pair's band share and verdict."""
    r = report.replay or {}
    main = report.sides.get(RECORDED) or next(iter(report.sides.values()), None)
    if main is None:
        return f"replay of {report.done}/{report.n_prompts} rows: no figures yet"
    t = main.stats.tokens
    band = next((b for b in t.outside if (b.low, b.high) == (0.8, 1.2)), None)
    share = "-" if band is None or band.outside is None else f"{100 * band.outside:.1f}%"
    verdict = f" ({main.verdict.verdict})" if main.verdict else ""
    return (
        f"replay of {report.done}/{report.n_prompts} rows ({r.get('format', '?')}), {t.pairs} tokens "
        f"({r.get('masked', 0)} masked): {main.side} vs trainer, ρ outside [0.8, 1.2] {share}{verdict}"
    )
