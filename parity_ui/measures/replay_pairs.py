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
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.config import ParityConfig
from ..core.mapping import route_replay_mode
from ..core.measures import REPLAY_PAIRS
from ..core.pooled import PairSample
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
        out.append(
            ReplayPair(
                RECORDED_TRAINER_PAIR,
                RECORDED_TRAINER,
                RECORDED,
                "the recorded rollout against the run's own recorded trainer logprobs",
                key="recorded~trainer",
            )
        )
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
        # The worst tokens so far (a resumed replay goes on from its stored ones): a bounded heap.
        self.worst: list[tuple[float, int, WorstToken]] = []
        for w in record.worst_tokens:
            heapq.heappush(self.worst, (abs(w.dlogp), -(w.prompt_index * 1_000_000 + w.position), w))

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
            lp[RECORDED_TRAINER] = [clean(x) for x in row.trainer_logprobs]
        if seen.j in self.r3 and self.r3_name is not None:
            lp[self.r3_name] = self.r3.pop(seen.j)
        mask = row.mask()
        keep = [t for t in range(len(row.response_ids)) if t < len(mask) and mask[t]]
        self.record.tokens += len(row.response_ids)
        self.record.masked += len(row.response_ids) - len(keep)
        for pair in self.record.pairs:
            if pair.a not in lp or pair.b not in lp:
                continue
            la, lb = lp[pair.a], lp[pair.b]
            seen.samples.setdefault(pair.stored, []).append(
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
        self._note_worst(i, row, lp, keep)

    def end_chunk(self, chunk: Sequence[int]) -> None:
        self.record.worst_tokens = [w for _, _, w in sorted(self.worst, key=lambda x: (-x[0], x[1]))]
        for j in chunk:
            self.r3.pop(j, None)

    def _note_worst(self, i: int, row: Any, lp: dict[str, list[float | None]], keep: list[int]) -> None:
        """The worst tokens of the run's own pair, kept as a bounded heap."""
        main = self.record.main
        side = RECORDED if RECORDED in lp else next((p.name for p in self.prep.sides[1:]), None)
        if side is None:
            return
        trainer = self.prep.reference.name
        pair = next((p.name for p in self.record.pairs if p.b == side and p.a == trainer), main.name if main else "")
        engines = [p.name for p in self.prep.sides[1:]]
        la, lb = lp[trainer], lp[side]
        for t in keep:
            a, b = la[t], lb[t]
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
                continue
            d = a - b
            key = (abs(d), -(i * 1_000_000 + t))
            full = len(self.worst) >= WORST_TOKENS
            if full and key <= self.worst[0][:2]:
                continue  # not among the worst: no entry (its text decoded) made for it
            entry = WorstToken(
                prompt_index=i,
                row=row.where,
                position=t,
                token_id=row.response_ids[t],
                text=self.prep.tokenizer.token_text(row.response_ids[t]),
                pair=pair,
                side=side,
                trainer=a,
                rollout=b,
                dlogp=d,
                engines={e: lp[e][t] for e in engines if e in lp},
            )
            if full:
                heapq.heapreplace(self.worst, (*key, entry))
            else:
                heapq.heappush(self.worst, (*key, entry))


def _logprobs(steps: Any) -> list[float | None]:
    return list(step_column(steps, "logprob"))  # from the columns, not a TokenStep built per position


def clean(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v
