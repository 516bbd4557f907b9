"""The replay-pairs measure: a replay's pairs (core.replay_record.ReplayPair), each b's logprobs against
a's on every token of every row the loss mask keeps, in the RL frameworks' convention Δ = trainer −
rollout and ρ = p_trainer / p_rollout; the worst tokens of the run's own pair; the rows' token counts.

The pairs, declared from what the dump records (the replay's record: core.replay_record.ReplayRecord):
- "recorded vs <trainer>": the recorded rollout logprobs against the trainer: the run's own mismatch;
- "<engine> vs <trainer>": the engine re-run against the trainer: numerics and settings;
- "recorded vs <engine>": the recorded logprobs against the engine re-run: does the engine reproduce its
  own logprobs (batch composition, scheduling, cache), or were they made under other settings?
- "recorded vs trainer (recorded)": against the run's own recorded trainer logprobs, when the dump has them;
- "recorded vs <trainer>+recorded routes" (R3, MoE with routes=true and replay_routes on the trainer):
  the trainer routing with the rollout's recorded experts, one forced pass a row;
- "<floor> vs <trainer>": the trainer against itself under another kernel.
Each pair's samples are stored under its name (the floor's under the floor side, as a workload's) and
pooled as the token figures are (parity_ui.measures.tokens.pool_tokens).

A recorded-only replay (parity_ui.commands.replay_recorded: no engine, so no Plan) samples its one pair,
counts its rows' tokens and keeps its worst tokens with the same pieces (`recorded_trainer_pair`,
`sample_row`, `WorstTokens`, `cleaned`), so its figures equal an engine replay's same pair to the digit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.config import ParityConfig
from ..core.mapping import route_replay_mode
from ..core.measures import REPLAY_PAIRS
from ..core.pooled import PairSample, scorable
from ..core.replay_record import (
    ENGINE_PAIR,
    FLOOR_PAIR,
    RECORDED,
    RECORDED_ENGINE_PAIR,
    RECORDED_PAIR,
    RECORDED_TRAINER,
    RECORDED_TRAINER_PAIR,
    ROUTE_REPLAY_PAIR,
    ReplayPair,
    ReplayRecord,
    WorstToken,
)
from ..core.types import Finding, SideResult, step_column
from ..run.sideset import SideSet
from .base import Made, MeasureRun, Mode, Plan
from .routes import replayed_pair, route_shape, score_with_routes

WORST_TOKENS = 20


class ReplayPairs:
    spec = REPLAY_PAIRS

    def wanted(self, cfg: ParityConfig, mode: Mode) -> bool:
        return mode == "replay"

    def preflight(self, plan: Plan) -> list[Finding]:
        return []  # the dump's own checks run before any engine loads (parity_ui.commands.replay.read_dump)

    def start(self, plan: Plan) -> MeasureRun:
        return ReplayPairsRun(plan)


def declare(plan: Plan, record: ReplayRecord) -> list[ReplayPair]:
    """The replay's pairs, in the table's order (the floor last)."""
    engines = [p.name for p in plan.prep.sides[1:]]
    trainer = plan.prep.reference.name
    out = []
    if record.with_logprobs:
        out.append(
            ReplayPair(
                RECORDED_PAIR,
                trainer,
                RECORDED,
                "the recorded rollout logprobs against the trainer: the run's own mismatch",
                side=RECORDED,
                key=RECORDED,
            )
        )
    for e in engines:
        out.append(
            ReplayPair(
                ENGINE_PAIR,
                trainer,
                e,
                f"the rollout engine re-run ({e}) against the trainer: numerics and settings",
                side=e,
                key=e,
            )
        )
    if record.with_logprobs:
        for e in engines:
            out.append(
                ReplayPair(
                    RECORDED_ENGINE_PAIR,
                    e,
                    RECORDED,
                    f"the recorded logprobs against the engine re-run ({e}): does the engine reproduce its own "
                    "logprobs?",
                    key=f"{RECORDED}~{e}",
                )
            )
    if record.with_trainer:
        out.append(recorded_trainer_pair())
    r3 = r3_side(plan, record)
    if r3 is not None and record.with_logprobs:
        out.append(
            ReplayPair(
                ROUTE_REPLAY_PAIR,
                r3,
                RECORDED,
                "the trainer routing with the rollout's recorded experts (rollout routing replay, R3) against "
                "the recorded rollout: the mismatch left once routing is the rollout's",
                key=r3,
            )
        )
    if plan.floor is not None:
        out.append(
            ReplayPair(
                FLOOR_PAIR,
                trainer,
                plan.floor.name,
                f"the floor: {plan.run.workload.floor.description}" if plan.run.workload else "the floor",
                side=plan.floor.name,
                key=plan.floor.name,
            )
        )
    return out


def recorded_trainer_pair(
    meaning: str = "the recorded rollout against the run's own recorded trainer logprobs",
) -> ReplayPair:
    """ "recorded vs trainer (recorded)": the dump's own pair, both ends as the run recorded them."""
    return ReplayPair(RECORDED_TRAINER_PAIR, RECORDED_TRAINER, RECORDED, meaning, key="recorded~trainer")


def r3_side(plan: Plan, record: ReplayRecord) -> str | None:
    """Rollout routing replay (R3): the trainer with replay_routes, where the dump records routes and
    routes=true: the name of its forced pass; None otherwise."""
    ref = plan.prep.reference
    if not (plan.config.routes and record.with_routes and route_replay_mode(ref.spec) != "off"):
        return None
    return replayed_pair(ref.name, RECORDED)


@dataclass
class RowSeen:
    """A replayed row once every side forced its tokens: `results` by side (the recorded side's where the
    row has logprobs), `row` the dump's (its loss mask, its recorded trainer logprobs)."""

    j: int
    index: int  # the run's prompt index
    row: Any  # parity_ui.inputs.rollouts.RolloutRow
    results: dict[str, SideResult]
    samples: dict[str, list[PairSample]]  # by where each pair's samples are stored (ReplayPair.stored)


class ReplayPairsRun(MeasureRun):
    def __init__(self, plan: Plan):
        self.plan, self.prep = plan, plan.prep
        record = plan.replay
        assert record is not None, "a replay's measures start with its record"
        self.record = record
        if not record.pairs:
            record.pairs = declare(plan, record)
        self.r3_name = r3_side(plan, record)
        self.shape = route_shape(plan.prep.model.path) if self.r3_name is not None else None
        self.r3: dict[int, list[float | None]] = {}  # R3's logprobs by row j (a chunk's, until it is stored)
        self.worst = WorstTokens(record.worst_tokens)  # a resumed replay goes on from its stored ones

    def pairs(self) -> list[str]:
        return [p.stored for p in self.record.pairs if p.kind != FLOOR_PAIR]

    def collect(self, sides: SideSet, made: Made) -> None:
        """R3: the trainer scores each row again, routing with the rollout's recorded experts (one forced
        pass a row)."""
        if made.kind != "forced" or self.r3_name is None or self.shape is None:
            return
        ref = self.prep.reference
        rows = made.rows
        recorded = {j: self.shape.routes(rows[j]) for j in made.chunk if rows[j].routed_experts is not None}
        got = score_with_routes(self.plan.run, sides, ref, route_replay_mode(ref.spec), made.items, recorded)
        self.r3.update({j: _logprobs(res.steps) for j, res in got.items()})

    def row(self, seen: RowSeen) -> None:
        """A row's samples for every pair both of whose ends it has, its token counts, its worst tokens."""
        row, i = seen.row, seen.index
        lp = {name: _logprobs(r.steps) for name, r in seen.results.items()}
        if row.trainer_logprobs is not None:
            lp[RECORDED_TRAINER] = cleaned(row.trainer_logprobs)
        if seen.j in self.r3 and self.r3_name is not None:
            lp[self.r3_name] = self.r3.pop(seen.j)
        made = sample_row(self.record, i, row, lp, seen.samples)
        own = self.record.own(made)
        if own is not None:
            engines = {e: lp[e] for e in (p.name for p in self.prep.sides[1:]) if e in lp}
            self.worst.see(i, row, own, made[own.name], self.prep.tokenizer.token_text, engines)

    def end_chunk(self, chunk: Sequence[int]) -> None:
        self.record.worst_tokens = self.worst.worst()
        for j in chunk:
            self.r3.pop(j, None)


def kept_positions(row: Any) -> list[int]:
    """The response positions the row's loss mask keeps (every one without a mask)."""
    mask = row.mask()
    return [t for t in range(len(row.response_ids)) if t < len(mask) and mask[t]]


def sample_row(
    record: ReplayRecord,
    i: int,
    row: Any,
    lp: dict[str, list[float | None]],
    samples: dict[str, list[PairSample]],
) -> dict[str, PairSample]:
    """A row's sample of every pair of the record both of whose ends `lp` (logprobs by side, NaN as None)
    has, on the tokens its loss mask keeps, appended to `samples` by where each pair is stored; the row's
    tokens and masked tokens counted on the record. Returns the samples made, by pair name."""
    keep = kept_positions(row)
    n = len(row.response_ids)
    record.tokens += n
    record.masked += n - len(keep)
    made = {}
    for pair in record.pairs:
        if pair.a not in lp or pair.b not in lp:
            continue
        la, lb = lp[pair.a], lp[pair.b]
        made[pair.name] = s = PairSample(
            prompt_index=i,
            identical=True,
            first_divergence=None,
            length=n,
            verdict=None,
            logp_side=[lb[t] for t in keep],
            logp_ref=[la[t] for t in keep],
            positions=keep,
        )
        samples.setdefault(pair.stored, []).append(s)
    return made


class WorstTokens:
    """The worst tokens of the run's own pair (the largest |Δ| = |trainer − rollout|, masked and unscorable
    tokens left out, as the figures leave them out), kept as a bounded heap of WORST_TOKENS."""

    def __init__(self, kept: Sequence[WorstToken] = ()):
        self.heap: list[tuple[float, int, WorstToken]] = []
        for w in kept:
            heapq.heappush(self.heap, (abs(w.dlogp), -(w.prompt_index * 1_000_000 + w.position), w))

    def see(
        self,
        i: int,
        row: Any,
        pair: ReplayPair,
        s: PairSample,
        text: Callable[[int], str],
        engines: dict[str, list[float | None]],
    ) -> None:
        """Row i's sample `s` of the run's own `pair` (its positions, trainer and rollout logprobs);
        `text`: a token id's text (decoded only for an entry made); `engines`: each engine re-run's
        logprobs of the row, shown beside it."""
        if len(self.heap) >= WORST_TOKENS:  # a row whose largest gap cannot enter is passed over at C speed
            top = s.max_abs_gap()
            if top is None or top < self.heap[0][0]:
                return
        for t, a, b in zip(s.positions, s.logp_ref, s.logp_side):
            if not (scorable(a) and scorable(b)):
                continue
            d = a - b
            key = (abs(d), -(i * 1_000_000 + t))
            full = len(self.heap) >= WORST_TOKENS
            if full and key <= self.heap[0][:2]:
                continue  # not among the worst: no entry (its text decoded) made for it
            entry = WorstToken(
                prompt_index=i,
                row=row.where,
                position=t,
                token_id=row.response_ids[t],
                text=text(row.response_ids[t]),
                pair=pair.name,
                side=pair.b,
                trainer=a,
                rollout=b,
                dlogp=d,
                engines={e: lps[t] for e, lps in engines.items()},
            )
            if full:
                heapq.heapreplace(self.heap, (*key, entry))
            else:
                heapq.heappush(self.heap, (*key, entry))

    def worst(self) -> list[WorstToken]:
        """The worst first."""
        return [w for _, _, w in sorted(self.heap, key=lambda x: (-x[0], x[1]))]


def _logprobs(steps: Any) -> list[float | None]:
    return list(step_column(steps, "logprob"))  # from the columns, not a TokenStep built per position


def clean(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def cleaned(xs: Sequence[float | None]) -> list[float | None]:
    """A recorded logprob column with NaN (not recorded) as None, as a side's columns hold it: the list
    itself where it holds none (the usual case: its sum is NaN iff some value is, found at C speed)."""
    total: float
    try:
        total = sum(xs)  # type: ignore[arg-type]
    except TypeError:  # a None among them
        total = math.nan
    return xs if total == total and isinstance(xs, list) else [clean(x) for x in xs]
