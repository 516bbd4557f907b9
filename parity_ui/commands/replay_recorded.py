"""Recorded-only replay: a dump that holds both the rollout engine's and the trainer's logprobs of the
same tokens (prime-rl's token export, NeMo-RL's train_data_step*.jsonl, slime's rollout dump joined
with its train dump v2, parity-ui's format with trainer_logprobs) has the run's own mismatch in it.
Its pair "recorded vs trainer (recorded)" and every figure of it are pooled here WITHOUT loading any
engine: reading and pooling only (seconds for 10,000 rows; bench/replay_steps.py).

The run is stored as a replay (kind "replay", its record a core.replay_record.ReplayRecord with
`recorded_only` set) like one made with engines, so History, `parity runs show`, `parity report`, the
gate and the trend read it the same way: two recorded sides, the trainer's logprobs as the reference
("trainer (recorded)") and the rollout's ("recorded"), each row's two token streams (the token view
shows them), the pair's samples (the prompt table's gaps) and its pooled figures, the worst tokens
first. There is no Plan (no side is prepared), so the measures are not started; their pieces are used
as the engine replay's measures use them: the pair (replay_pairs.recorded_trainer_pair), each row's
sample, token counts and worst tokens (replay_pairs.sample_row, WorstTokens), the recorded streams
(replay.recorded_result), and the pooling, in memory as rows come rather than read back from the store
(tokens.PairPool, the clipped ratio's core.clipped.ClipStats). So the figures equal an engine replay's
same pair to the digit (tests/engines/test_replay_steps_engines.py). There is no floor (no engine ran
to measure one): no verdict, and the status is "ok" unless the run failed.

Beside the run, `RecordedResult` carries what the trend keeps of a step: its figures and the figures
per policy version where the rows name several, the recorded kept sets' mean size and the run's
prefix-cache and speculative-decoding facts.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.clipped import ClipStats
from ..core.errors import ParityError
from ..core.pooled import Accumulator, PairSample, WorkloadStats
from ..core.replay_record import RECORDED, RECORDED_TRAINER, ReplayPair, ReplayRecord
from ..core.runlog import EventCallback, RunEvent
from ..core.trend import StepFigures, figures_of
from ..core.types import SideInfo, SideResult
from ..core.workload_record import FloorSpec, SideFigures, WorkloadOptions, WorkloadReport
from ..inputs.models import describe_model
from ..inputs.prompts import tokenizer_for
from ..inputs.rollouts import RolloutRow
from ..measures.clipped import put_clipped
from ..measures.replay_pairs import WorstTokens, cleaned, recorded_trainer_pair, sample_row
from ..measures.tokens import PairPool
from .replay import ReplayRequest, _selected, dump_source, read_dump, recorded_result, replay_headline

if TYPE_CHECKING:
    from ..core.types import ModelInfo, Run
    from ..inputs.prompts import PromptTokenizer
    from ..inputs.rollouts import Preflight, RolloutDump
    from ..run.recorder import RunRecorder
    from .service_api import Service

CHUNK = 256  # rows stored together
KEEP_TOKENS = 2_000_000  # response tokens of a dump kept from its preflight's pass (else it is read twice)


def can_replay_recorded(pf: Preflight) -> bool:
    """The dump holds both logprob columns (on some row): its own mismatch needs no engine."""
    return pf.rows > 0 and pf.with_logprobs > 0 and pf.with_trainer > 0


def recorded_pair() -> ReplayPair:
    """The one pair of a recorded-only replay: the engine replay's "recorded vs trainer (recorded)"."""
    return recorded_trainer_pair(
        "the recorded rollout logprobs against the run's own recorded trainer logprobs: the run's mismatch, "
        "pooled without an engine"
    )


class RecordedPool:
    """The pair pooled in memory as rows come: its token figures and histogram (tokens.PairPool, what the
    store's pooling runs), its clipped ratio, each policy version's own pool, the recorded kept sets' size."""

    def __init__(self, by_version: bool = False):
        self.pair, self.clip = PairPool(), ClipStats()
        self.by_version = by_version
        self.versions: dict[str, tuple[Accumulator, ClipStats, list[int]]] = {}
        self.kept_sum, self.kept_n = 0, 0
        self.rows = 0

    def add(self, s: PairSample, row: RolloutRow) -> None:
        self.pair.add(s)
        self.clip.add(s.logp_ref, s.logp_side)
        self.rows += 1
        if row.kept_ids is not None:
            for t in s.positions:
                if t < len(row.kept_ids):
                    self.kept_sum += len(row.kept_ids[t])
                    self.kept_n += 1
        if self.by_version:
            v = row.policy_version or "?"
            acc, clip, rows = self.versions.setdefault(v, (Accumulator(), ClipStats(), [0]))
            acc.add(s)
            clip.add(s.logp_ref, s.logp_side)
            rows[0] += 1

    def figures(self, name: str) -> SideFigures:
        """The pair's pooled figures, its clipped-ratio family on them, as the measures pool them."""
        figs = self.pair.figures(name)
        put_clipped(figs, self.clip)
        return figs

    def kept_size(self) -> float | None:
        return self.kept_sum / self.kept_n if self.kept_n else None

    def step_figures(self, stats: WorkloadStats) -> tuple[StepFigures, dict[str, StepFigures]]:
        """The step's figures (from `stats`, this pool's figures) and each policy version's."""
        own = StepFigures(self.rows, stats.tokens.pairs, figures_of(stats, self.kept_size()))
        versions = {}
        for v, (acc, clip, rows) in sorted(self.versions.items()):
            f = SideFigures(v, acc.result(top_n=0))
            put_clipped(f, clip)
            versions[v] = StepFigures(rows[0], f.stats.tokens.pairs, figures_of(f.stats))
        return own, versions


@dataclass
class RecordedResult:
    run: Run
    figures: StepFigures | None = None
    versions: dict[str, StepFigures] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    pair: str | None = None  # the pair the figures are of (its name)
    seconds: float = 0.0


def replay_recorded(service: Service, req: ReplayRequest, emit: EventCallback | None = None) -> RecordedResult:
    """Replay the dump's own pair without an engine and store it as a run of kind "replay". Raises
    ParityError (nothing stored) for a dump that cannot be read, fails the preflight, or holds no
    trainer logprobs (then only an engine can stand for the trainer: `parity replay` with sides)."""
    emit = emit or (lambda e: None)
    t0 = time.perf_counter()
    kept = RowsKept()  # the rows read by the preflight's pass, pooled without reading the dump again
    dump, prompts, pf, _ = read_dump(req, emit, kept)
    if not can_replay_recorded(pf):
        missing = "trainer logprobs" if not pf.with_trainer else "rollout logprobs"
        raise ParityError(
            f"{dump.describe()} holds no {missing}: the run's own pair cannot be pooled without an engine",
            "replay it with the trainer as an engine (parity replay DUMP --model M --side a=hf --side b=vllm)",
            code="replay-not-recorded",
        )
    # A recorded-only replay scores no row with one checkpoint: several policy versions are facts here.
    pf.findings = [f for f in pf.findings if f.code != "replay-versions"]
    info = describe_model(req.model, trust_remote_code=req.trust_remote_code)
    tok = tokenizer_for(info.path, req.trust_remote_code)
    cfg = req.config.to_dict()
    with service.recording(req.model, cfg, prompts, kind="replay", group_id=req.group_id) as rec:
        result = RecordedResult(run=rec.run)
        Recorded(rec, req, dump, pf, tok, info, result, emit).run(None if kept.overflow else kept)
    result.seconds = time.perf_counter() - t0
    emit(RunEvent("status", f"stored run {rec.run.id}: {rec.run.status} ({result.seconds:.1f}s, no engine)"))
    return result


class RowsKept(list[RolloutRow]):
    """The rows a preflight read, kept up to KEEP_TOKENS response tokens (a step of a run: 1,000 rows x
    512 tokens take ~60 MB); past that, none (`overflow`) and the dump is read again as it streams, so a
    dump of any size is pooled in bounded memory."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.overflow = 0, False

    def append(self, row: RolloutRow) -> None:
        if self.overflow:
            return
        self.tokens += len(row.response_ids)
        if self.tokens > KEEP_TOKENS:
            self.overflow = True
            self.clear()
            return
        super().append(row)


class Recorded:
    """One recorded-only replay inside its recording."""

    def __init__(
        self,
        rec: RunRecorder,
        req: ReplayRequest,
        dump: RolloutDump,
        pf: Preflight,
        tok: PromptTokenizer,
        info: ModelInfo,
        result: RecordedResult,
        emit: EventCallback,
    ):
        self.rec, self.req, self.dump, self.pf, self.tok, self.info = rec, req, dump, pf, tok, info
        self.result, self.emit = result, emit
        self.worst = WorstTokens()
        self.facts: Counter[str] = Counter()

    def run(self, kept: list[RolloutRow] | None) -> None:
        run, pf, dump = self.rec.run, self.pf, self.dump
        run.model = self.info
        run.warnings = list(pf.findings)
        options = {"dump": dump.path, "format": dump.format}
        run.sides = [
            SideInfo(
                name=RECORDED_TRAINER, kind="recorded", reference=True, options={**options, "logprobs": "trainer"}
            ),
            SideInfo(name=RECORDED, kind="recorded", options={**options, "logprobs": "rollout"}),
        ]
        report = WorkloadReport(
            options=WorkloadOptions(
                mode="replay", floor="none", too_long="skip", chunk=CHUNK, source=dump_source(dump, pf, self.req)
            ),
            floor=FloorSpec("none", None, "no floor: recorded-only, no engine ran"),
            n_prompts=pf.rows,
        )
        self.record = report.replay = ReplayRecord(
            dump=self.req.name or dump.path,
            format=dump.format,
            rows=pf.rows,
            notes=list(dump.notes),
            skipped=list(pf.skipped),
            reconstructed=pf.reconstructed,
            with_logprobs=pf.with_logprobs,
            with_trainer=pf.with_trainer,
            with_routes=pf.with_routes,
            pairs=[recorded_pair()],
            recorded_only=True,
        )
        run.workload = report
        named = [v for v in pf.versions if v is not None]
        pool = RecordedPool(by_version=len(named) > 1)
        self.emit(RunEvent("status", f"pooling {pf.rows:,} rows' recorded pair (no engine)"))
        rows = iter(kept) if kept is not None else _selected(self.dump.rows(), self.req)
        chunk: list[tuple[int, RolloutRow]] = []
        for i, row in enumerate(rows):
            run.prompts[i].prompt_token_ids = list(row.prompt_ids)
            chunk.append((i, row))
            if len(chunk) >= CHUNK:
                self._chunk(chunk, pool)
                chunk = []
        if chunk:
            self._chunk(chunk, pool)
        self.rec.keep_prompts()
        pair = self.record.pairs[0]
        figs = pool.figures(pair.name)
        report.sides = {pair.name: figs}
        self.record.worst_tokens = self.worst.worst()
        report.done = pf.rows
        report.headline = replay_headline(report)
        self.result.figures, self.result.versions = pool.step_figures(figs.stats)
        self.result.pair = pair.name
        self.result.facts = self._facts()
        run.status = "ok"
        self.rec.save_header()

    def _chunk(self, chunk: list[tuple[int, RolloutRow]], pool: RecordedPool) -> None:
        """A chunk of rows: each row's pair sample (replay_pairs.sample_row, the engine replay's), pooled,
        its two recorded streams and its worst tokens; stored together."""
        results: list[SideResult] = []
        samples: dict[str, list[PairSample]] = {}
        pair = self.record.pairs[0]
        for i, row in chunk:
            self._see_facts(row)
            lp = {}
            if row.rollout_logprobs is not None:
                lp[RECORDED] = cleaned(row.rollout_logprobs)
            if row.trainer_logprobs is not None:
                lp[RECORDED_TRAINER] = cleaned(row.trainer_logprobs)
            made = sample_row(self.record, i, row, lp, samples)
            s = made.get(pair.name)
            if s is None:  # a row without both columns: counted, nothing to compare
                continue
            pool.add(s, row)
            trainer = recorded_result(RECORDED_TRAINER, i, row, lp[RECORDED_TRAINER], self.tok)
            results += [trainer, recorded_result(RECORDED, i, row, lp[RECORDED], self.tok, like=trainer)]
            self.worst.see(i, row, pair, s, self.tok.token_text, {})
        self.rec.keep_chunk(results, [], samples)

    def _see_facts(self, row: RolloutRow) -> None:
        f = row.facts or {}
        pc, spec = f.get("prefix_cache_info") or {}, f.get("spec_info") or {}
        self.facts["cached_tokens"] += int(pc.get("cached_tokens") or 0)
        self.facts["prompt_tokens"] += int(pc.get("total_prompt_tokens") or 0)
        self.facts["spec_accept"] += int(spec.get("spec_accept_token_num") or 0)
        self.facts["spec_draft"] += int(spec.get("spec_draft_token_num") or 0)
        if f.get("rank") is not None:
            self.facts[f"rank {f['rank']}"] += 1

    def _facts(self) -> dict[str, Any]:
        c, out = self.facts, dict[str, Any]()
        if c["prompt_tokens"]:
            out["prefix_cache_hit_rate"] = c["cached_tokens"] / c["prompt_tokens"]
        if c["spec_draft"]:
            out["spec_accept_rate"] = c["spec_accept"] / c["spec_draft"]
        ranks = sorted(int(k.split()[1]) for k in c if k.startswith("rank "))
        if ranks:
            out["ranks"] = ranks
        return out


def refuse_resume(service: Service, run_id: str) -> None:
    """A recorded-only replay has no engine to go on with: raise ParityError saying to run it again."""
    stored = service.store.get_run(run_id, prompts=[])
    replay = stored.workload.replay if stored is not None and stored.workload is not None else None
    if replay is not None and replay.recorded_only:
        raise ParityError(
            f"run {run_id} is a recorded-only replay: it loads no engine, so there is nothing to resume",
            f"run it again (seconds): parity replay {replay.dump or 'DUMP'} --model MODEL --recorded-only",
        )
