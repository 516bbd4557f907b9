"""Recorded-only replay: a dump that holds both the rollout engine's and the trainer's logprobs of the
same tokens (prime-rl's token export, NeMo-RL's train_data_step*.jsonl, slime's rollout dump joined
with its train dump v2, parity-ui's format with trainer_logprobs) has the run's own mismatch in it.
Its pair "recorded vs trainer" and every figure of it are pooled here WITHOUT loading any engine:
reading and pooling only (seconds for 10,000 rows; bench/replay_steps.py).

The run is stored as a replay (kind "replay") like one made with engines, so History, `parity runs
show`, `parity report`, the gate and the trend read it the same way: two recorded sides, the
trainer's logprobs as the reference ("trainer (recorded)") and the rollout's ("recorded"), each row's
two token streams (the token view shows them), the pair's samples (the prompt table's gaps) and its
pooled figures, the worst tokens first. The pair's samples are made exactly as parity_ui.commands.replay
makes its "recorded~trainer" pair (the same logprobs, positions and loss mask), so the figures equal
an engine replay's recorded pair to the digit (tests/engines/test_replay_steps_engines.py). There is
no floor (no engine ran to measure one): no verdict, and the status is "ok" unless the run failed.

Beside the run, `RecordedResult` carries what the trend keeps of a step: the clipped importance ratio
(core.trend.ClipStats), the figures per policy version where the rows name several, the recorded kept
sets' mean size and the run's prefix-cache and speculative-decoding facts.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from operator import sub
from typing import TYPE_CHECKING, Any, cast

from ..core.pooled import Accumulator, PairSample
from ..core.runlog import EventCallback, RunEvent
from ..core.trend import ClipStats, StepFigures, all_scorable, figures_of
from ..core.types import SideInfo, SideResult, StepColumns
from ..core.workload_record import DlogpHistogram, FloorSpec, SideFigures, WorkloadOptions, WorkloadReport
from ..inputs.rollouts import RolloutRow
from ..run.recorder import decode_result
from .replay import RECORDED, RECORDED_TRAINER, WORST_TOKENS, ReplayRequest, _selected, dump_source, read_dump

if TYPE_CHECKING:
    from ..core.types import Run
    from .service_api import Service

TRAINER = "trainer (recorded)"  # the reference side: the trainer's logprobs as the run recorded them
PAIR = RECORDED_TRAINER  # the pair's key: its samples and figures are stored under it, as an engine replay's
CHUNK = 256  # rows stored together
KEEP_TOKENS = 2_000_000  # response tokens of a dump kept from its preflight's pass (else it is read twice)


def can_replay_recorded(pf: Any) -> bool:
    """The dump holds both logprob columns (on some row): its own mismatch needs no engine."""
    return pf.rows > 0 and pf.with_logprobs > 0 and pf.with_trainer > 0


def _clean(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _cleaned(xs: list[float]) -> list[float | None]:
    """NaN (a logprob not recorded) as None, as the replay's columns hold it; the list itself where it
    holds none (the usual case: its sum, NaN iff some value is, found at C speed)."""
    try:
        total = sum(xs)
    except TypeError:  # a None among them
        total = math.nan
    return xs if total == total else [_clean(x) for x in xs]  # type: ignore[return-value]


class _Sample(PairSample):
    """A PairSample whose largest gap (the store's prompt table column, the worst tokens' filter) is
    found at C speed where every pair is scorable, and once."""

    _max: float | None | bool = False

    def max_abs_gap(self) -> float | None:
        if self._max is False:
            if all_scorable(self.logp_side) and all_scorable(self.logp_ref):
                side, ref = cast("list[float]", self.logp_side), cast("list[float]", self.logp_ref)
                self._max = max(map(abs, map(sub, side, ref)), default=None)
            else:
                self._max = super().max_abs_gap()
        return cast("float | None", self._max)


def pair_sample(
    i: int, row: RolloutRow, cleaned: tuple[list[float | None], list[float | None]] | None = None
) -> PairSample | None:
    """The row's recorded rollout against its recorded trainer logprobs, on the tokens the loss mask
    keeps: exactly the sample parity_ui.commands.replay stores for its "recorded~trainer" pair. None
    for a row without both columns."""
    if row.rollout_logprobs is None or row.trainer_logprobs is None:
        return None
    n, mask = len(row.response_ids), row.mask()
    keep = [t for t in range(n) if t < len(mask) and mask[t]]
    side, ref = cleaned or (_cleaned(row.rollout_logprobs), _cleaned(row.trainer_logprobs))
    return _Sample(
        prompt_index=i,
        identical=True,
        first_divergence=None,
        length=n,
        verdict=None,
        logp_side=[side[t] for t in keep],
        logp_ref=[ref[t] for t in keep],
        positions=keep,
    )


class RecordedPool:
    """The pair pooled in memory as rows come (the same Accumulator the store's figures come from),
    with the clip counts, the per-version pools and the recorded kept sets' size."""

    def __init__(self, by_version: bool = False):
        self.acc, self.hist, self.clip = Accumulator(), DlogpHistogram(), ClipStats()
        self.by_version = by_version
        self.versions: dict[str, tuple[Accumulator, ClipStats, list[int]]] = {}
        self.kept_sum, self.kept_n = 0, 0
        self.rows = 0

    def add(self, s: PairSample, row: RolloutRow) -> None:
        self.acc.add(s)
        self.hist.add(s.logp_side, s.logp_ref)
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

    def kept_size(self) -> float | None:
        return self.kept_sum / self.kept_n if self.kept_n else None

    def step_figures(self, stats: Any) -> tuple[StepFigures, dict[str, StepFigures]]:
        """The step's figures (from `stats`, this pool's result) and each policy version's."""
        own = StepFigures(self.rows, stats.tokens.pairs, figures_of(stats, self.clip, self.kept_size()))
        versions = {}
        for v, (acc, clip, rows) in sorted(self.versions.items()):
            st = acc.result(top_n=0)
            versions[v] = StepFigures(rows[0], st.tokens.pairs, figures_of(st, clip))
        return own, versions


@dataclass
class RecordedResult:
    run: Run
    figures: StepFigures | None = None
    versions: dict[str, StepFigures] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def replay_recorded(service: Service, req: ReplayRequest, emit: EventCallback | None = None) -> RecordedResult:
    """Replay the dump's own pair without an engine and store it as a run of kind "replay". Raises
    ParityError (nothing stored) for a dump that cannot be read, fails the preflight, or holds no
    trainer logprobs (then only an engine can stand for the trainer: `parity replay` with sides)."""
    from ..core.errors import ParityError
    from ..inputs.models import describe_model
    from ..inputs.prompts import tokenizer_for

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
        self, rec: Any, req: ReplayRequest, dump: Any, pf: Any, tok: Any, info: Any, result: RecordedResult, emit: Any
    ):
        self.rec, self.req, self.dump, self.pf, self.tok, self.info = rec, req, dump, pf, tok, info
        self.result, self.emit = result, emit
        self.worst: list[tuple[float, int, dict[str, Any]]] = []
        self.masked = self.tokens = 0
        self.facts: Counter[str] = Counter()

    def run(self, kept: list[RolloutRow] | None) -> None:
        run, pf, dump = self.rec.run, self.pf, self.dump
        run.model = self.info
        run.warnings = list(pf.findings)
        options = {"dump": dump.path, "format": dump.format}
        run.sides = [
            SideInfo(name=TRAINER, kind="recorded", reference=True, options={**options, "logprobs": "trainer"}),
            SideInfo(name=RECORDED, kind="recorded", options={**options, "logprobs": "rollout"}),
        ]
        report = WorkloadReport(
            options=WorkloadOptions(
                mode="replay", floor="none", too_long="skip", chunk=CHUNK, source=dump_source(dump, pf, self.req)
            ),
            floor=FloorSpec("none", None, "no floor: recorded-only, no engine ran"),
            n_prompts=pf.rows,
        )
        report.replay = {
            "dump": self.req.name or dump.path,
            "format": dump.format,
            "notes": dump.notes,
            "rows": pf.rows,
            "tokens": 0,
            "masked": 0,
            "skipped": pf.skipped,
            "reconstructed": pf.reconstructed,
            "with_logprobs": pf.with_logprobs,
            "with_trainer": pf.with_trainer,
            "with_routes": pf.with_routes,
            "recorded_only": True,
            "pairs": [
                {
                    "key": PAIR,
                    "a": TRAINER,
                    "b": RECORDED,
                    "meaning": "the recorded rollout logprobs against the run's own recorded trainer logprobs: the "
                    "run's mismatch, pooled without an engine",
                }
            ],
            "worst_tokens": [],
            "forced": {},
        }
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
        stats = pool.acc.result()
        report.sides = {PAIR: SideFigures(PAIR, stats, verdict=None, hist=pool.hist)}
        report.replay["tokens"], report.replay["masked"] = self.tokens, self.masked
        report.replay["worst_tokens"] = [w for _, _, w in sorted(self.worst, key=lambda x: (-x[0], x[1]))]
        report.done = pf.rows
        report.headline = recorded_headline(report)
        self.result.figures, self.result.versions = pool.step_figures(stats)
        self.result.facts = self._facts()
        run.status = "ok"
        self.rec.save_header()

    def _chunk(self, chunk: list[tuple[int, RolloutRow]], pool: RecordedPool) -> None:
        results: list[SideResult] = []
        samples: list[PairSample] = []
        for i, row in chunk:
            both = row.rollout_logprobs is not None and row.trainer_logprobs is not None
            cleaned = (_cleaned(row.rollout_logprobs), _cleaned(row.trainer_logprobs)) if both else None  # type: ignore[arg-type]
            s = pair_sample(i, row, cleaned)
            n = len(row.response_ids)
            self.tokens += n
            self.masked += n - (len(s.positions) if s is not None else 0)
            self._see_facts(row)
            if s is None:
                continue
            pool.add(s, row)
            samples.append(s)
            assert cleaned is not None
            trainer = self._stream(TRAINER, i, row, cleaned[1])
            results += [trainer, self._stream(RECORDED, i, row, cleaned[0], like=trainer)]
            self._note_worst(i, row, s)
        self.rec.keep_chunk(results, [], {PAIR: samples})

    def _stream(
        self, side: str, i: int, row: RolloutRow, lps: list[float | None], like: SideResult | None = None
    ) -> SideResult:
        """One recorded stream of the row as a side's result (`lps`: its logprobs, NaN already None);
        `like`: the row's other stream, whose texts (the same tokens) it shares rather than decoding
        them again."""
        n = len(row.response_ids)
        cols = StepColumns(
            {
                "position": list(range(n)),
                "token_id": list(row.response_ids),
                "text": [""] * n,
                "logprob": lps,
                "rank": [None] * n,
                "top_n": [0] * n,
                "top_token_id": [],
                "top_logprob": [],
                "top_text": [],
            }
        )
        res = SideResult(
            side=side, prompt_index=i, token_ids=list(row.response_ids), steps=cols, finish_reason="recorded"
        )
        if like is None:
            decode_result(self.tok, res)  # the texts with the run's one tokenizer, as a replay's recorded side
        else:
            other = cast(StepColumns, like.steps)
            cols.text, cols.raw = other.text, other.raw  # type: ignore[attr-defined]
            res.text = like.text
        return res

    def _note_worst(self, i: int, row: RolloutRow, s: PairSample) -> None:
        """The worst tokens of the pair (largest |Δ| = |trainer − rollout|), a bounded heap: the entries
        parity_ui.commands.replay keeps, so the replay view lists and opens them the same way."""
        if len(self.worst) >= WORST_TOKENS:  # a row whose largest gap cannot enter the heap is passed over
            top = s.max_abs_gap()
            if top is None or top < self.worst[0][0]:
                return
        for t, a, b in zip(s.positions, s.logp_ref, s.logp_side):
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
                continue
            d = a - b
            key = (abs(d), -(i * 1_000_000 + t))
            full = len(self.worst) >= WORST_TOKENS
            if full and key <= self.worst[0][:2]:
                continue
            entry = {
                "prompt_index": i,
                "row": row.where,
                "position": t,
                "token_id": row.response_ids[t],
                "text": self.tok.token_text(row.response_ids[t]),
                "pair": RECORDED,
                "trainer": a,
                "rollout": b,
                "dlogp": d,
                "engines": {},
            }
            (heapq.heapreplace if full else heapq.heappush)(self.worst, (*key, entry))

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
    from ..core.errors import ParityError

    stored = service.store.get_run(run_id, prompts=[])
    replay = stored.workload.replay if stored is not None and stored.workload is not None else None
    if replay and replay.get("recorded_only"):
        raise ParityError(
            f"run {run_id} is a recorded-only replay: it loads no engine, so there is nothing to resume",
            f"run it again (seconds): parity replay {replay.get('dump', 'DUMP')} --model MODEL --recorded-only",
        )


def recorded_headline(report: WorkloadReport) -> str:
    """One line: rows pooled, the pair's k3 and its [0.8, 1.2] band share."""
    r = report.replay or {}
    figs = report.sides.get(PAIR)
    if figs is None:
        return f"recorded-only replay of {report.n_prompts} rows: no figures"
    t = figs.stats.tokens
    band = next((b for b in t.outside if (b.low, b.high) == (0.8, 1.2)), None)
    share = "-" if band is None or band.outside is None else f"{100 * band.outside:.1f}%"
    k3 = "-" if t.k3 is None else f"{t.k3:.3g}"
    return (
        f"replay of {report.done}/{report.n_prompts} rows ({r.get('format', '?')}, recorded only, no engine), "
        f"{t.pairs} tokens ({r.get('masked', 0)} masked): recorded vs trainer, KL k3 {k3}, ρ outside [0.8, 1.2] {share}"
    )
