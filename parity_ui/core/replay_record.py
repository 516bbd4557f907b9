"""A replay's record (a run of kind "replay": parity_ui.commands.replay, its pairs measured by
parity_ui.measures.replay_pairs): the dump it read, its pairs, its token counts and its worst tokens.
Plain data; stored as the `replay` of the run's WorkloadReport.

Names, one each, the same in the CLI, `--json`, the app and the report:
- a pair is named "b vs a" (`ReplayPair.name`): "recorded vs hf" (the rollout's recorded logprobs
  against the trainer hf), "vllm vs hf" (the engine re-run against the trainer), "recorded vs vllm",
  "recorded vs trainer (recorded)", "recorded vs hf+recorded routes" (R3), "floor vs hf". It keys the
  pair's figures (WorkloadReport.sides) and its stored pair samples; until schema 3 a pair had a key of
  its own ("recorded", "vllm", "recorded~vllm", "recorded~trainer", "hf+recorded routes", "floor"),
  kept as `ReplayPair.key` and accepted wherever a pair is looked up (`ReplayRecord.pair`) for one
  schema version;
- a row is named by its place in the dump (`ReplayRow.name`: "line 3", "row 3" of a parquet file,
  "sample 3" of a .pt), in every table and when it is opened; its index in the run (`parity runs show
  RUN --prompt N`) is said beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

RECORDED = "recorded"  # the recorded side: the rollout's own logprobs, no engine behind it
RECORDED_TRAINER = "trainer (recorded)"  # the dump's own trainer logprobs (a pair's `a`)

# What a pair compares (ReplayPair.kind), in the table's order:
RECORDED_PAIR = "recorded"  # the recorded rollout logprobs against the trainer: the run's own mismatch
ENGINE_PAIR = "engine"  # an engine re-run against the trainer: numerics and settings
RECORDED_ENGINE_PAIR = "recorded-engine"  # the recorded logprobs against an engine re-run
RECORDED_TRAINER_PAIR = "recorded-trainer"  # the recorded rollout against the dump's own trainer logprobs
ROUTE_REPLAY_PAIR = "route-replay"  # R3: the trainer routing with the rollout's recorded experts, against it
FLOOR_PAIR = "floor"  # the trainer against itself under a change that must not matter
# The run's own pair, in order of preference (ReplayRecord.main, .own): the recorded rollout against the
# trainer; without recorded logprobs an engine re-run against it; with no engine at all (a recorded-only
# replay: parity_ui.commands.replay_recorded) the recorded rollout against the dump's own trainer logprobs.
OWN_KINDS = (RECORDED_PAIR, ENGINE_PAIR, RECORDED_TRAINER_PAIR)


@dataclass
class ReplayPair:
    """One pair of a replay: b's logprobs against a's on every token the loss mask keeps, in the RL
    frameworks' convention Δ = a − b, ρ = p_a / p_b (a: the trainer's end)."""

    kind: str  # what it compares (the *_PAIR names above)
    a: str  # the trainer side, "trainer (recorded)", an engine re-run, "<trainer>+recorded routes"
    b: str  # "recorded", an engine re-run, the floor side
    meaning: str  # one line for people
    side: str | None = None  # the side whose stored comparison with the trainer it is (routes, full rows); None: none
    key: str = ""  # its key before schema 3 (an alias, looked up for one schema version)

    @property
    def name(self) -> str:
        return f"{self.b} vs {self.a}"

    @property
    def stored(self) -> str:
        """Where its pair samples are stored: its name, the floor's under the floor side (as a workload's)."""
        return self.side or self.b if self.kind == FLOOR_PAIR else self.name

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclass
class ReplayRow:
    """A row of the dump as the replay names it: its place in the dump, and its index in the run."""

    index: int  # the run's prompt index (parity runs show RUN --prompt N)
    name: str  # where it is in the dump: "line 3", "row 3", "sample 3"

    def describe(self, run_id: str) -> str:
        return f"{self.name} of replay {run_id} (prompt {self.index})"


@dataclass
class WorstToken:
    """One of the largest |Δ| = |trainer − rollout| of the run's own pair (the recorded rollout against
    the trainer; without recorded logprobs, the first engine re-run against it), masked tokens left out."""

    prompt_index: int  # the row's index in the run
    row: str  # the row's name (ReplayRow.name: its place in the dump)
    position: int  # response token
    token_id: int
    text: str
    pair: str  # the pair it is among the worst of (ReplayPair.name)
    side: str  # that pair's rollout end ("recorded", or the engine re-run)
    trainer: float
    rollout: float
    dlogp: float  # trainer − rollout
    engines: dict[str, float | None] = field(default_factory=dict)  # each engine re-run's logprob there

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ReplayRecord:
    """What a replay read and measured, besides its pairs' figures (WorkloadReport.sides, by pair name)."""

    dump: str  # the dump as people know it (an upload's file name), or its path
    format: str
    rows: int  # rows read (the preflight's count)
    notes: list[str] = field(default_factory=list)
    tokens: int = 0  # response tokens replayed
    masked: int = 0  # of those, left out by the loss mask
    skipped: list[str] = field(default_factory=list)  # rows that could not be read (--on-bad skip), by name
    reconstructed: int = 0
    with_logprobs: int = 0
    with_trainer: int = 0
    with_routes: int = 0
    pairs: list[ReplayPair] = field(default_factory=list)  # the floor last
    worst_tokens: list[WorstToken] = field(default_factory=list)  # the worst first
    forced: dict[str, str] = field(default_factory=dict)  # side -> how it forced the tokens
    score_s: dict[str, float] = field(default_factory=dict)  # side -> seconds spent scoring
    # No engine ran: the dump's own pair pooled from its recorded logprobs alone (a recorded-only replay,
    # parity_ui.commands.replay_recorded); it is run again, not resumed
    recorded_only: bool = False

    def pair(self, name: str) -> ReplayPair | None:
        """A pair by its name, or by its key before schema 3 (an alias for one schema version)."""
        return next((p for p in self.pairs if p.name == name), None) or next(
            (p for p in self.pairs if p.key and p.key == name), None
        )

    @property
    def main(self) -> ReplayPair | None:
        """The run's own pair: the recorded rollout against the trainer; without recorded logprobs the
        first engine re-run against it; recorded-only, the recorded rollout against the recorded trainer."""
        return self.own(None)

    def own(self, have: Container[str] | None) -> ReplayPair | None:
        """The run's own pair (OWN_KINDS' order) among the pairs named in `have` (a row's: those it has
        both ends of); None: among all of them."""
        return next(
            (p for kind in OWN_KINDS for p in self.pairs if p.kind == kind and (have is None or p.name in have)), None
        )

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["pairs"] = [p.to_json() for p in self.pairs]
        out["worst_tokens"] = [w.to_json() for w in self.worst_tokens]
        return out


def _old_kind(key: str, a: str, b: str, floor: str | None) -> str:
    if key == floor:
        return FLOOR_PAIR
    if key == RECORDED:
        return RECORDED_PAIR
    if key == "recorded~trainer":
        return RECORDED_TRAINER_PAIR
    if key.startswith(RECORDED + "~"):
        return RECORDED_ENGINE_PAIR
    if key.endswith("+recorded routes"):
        return ROUTE_REPLAY_PAIR
    return ENGINE_PAIR


def pair_from_json(d: dict[str, Any], floor: str | None = None) -> ReplayPair:
    """A pair from its JSON; one stored before schema 3 ({"key", "a", "b", "meaning"}) too."""
    if "kind" in d:
        names = {f.name for f in dataclasses.fields(ReplayPair)}
        return ReplayPair(**{k: v for k, v in d.items() if k in names})
    key, a, b = str(d.get("key", "")), str(d.get("a", "")), str(d.get("b", ""))
    kind = _old_kind(key, a, b, floor)
    a = RECORDED_TRAINER if kind == RECORDED_TRAINER_PAIR else a
    side = b if kind in (RECORDED_PAIR, ENGINE_PAIR, FLOOR_PAIR) else None
    return ReplayPair(kind=kind, a=a, b=b, meaning=str(d.get("meaning", "")), side=side, key=key)


def replay_record_from_json(d: dict[str, Any] | ReplayRecord | None, floor: str | None = None) -> ReplayRecord | None:
    """The record from its JSON, one stored before schema 3 too (pairs keyed by string, a worst token's
    `pair` its rollout side); `floor`: the floor side's name (an old record's floor pair has its key)."""
    if d is None or isinstance(d, ReplayRecord):
        return d
    pairs = [pair_from_json(p, floor) for p in d.get("pairs") or []]
    by_side = {p.b: p for p in pairs if p.kind in (RECORDED_PAIR, ENGINE_PAIR)}
    worst = []
    for w in d.get("worst_tokens") or []:
        if "side" not in w:  # before schema 3: `pair` named the rollout side
            p = by_side.get(w.get("pair", ""))
            w = {**w, "side": w.get("pair", ""), "pair": p.name if p else w.get("pair", "")}
        names = {f.name for f in dataclasses.fields(WorstToken)}
        worst.append(WorstToken(**{k: v for k, v in w.items() if k in names}))
    plain = {f.name for f in dataclasses.fields(ReplayRecord)} - {"pairs", "worst_tokens"}
    return ReplayRecord(
        **{
            "dump": "",
            "format": "",
            "rows": 0,
            **{k: v for k, v in d.items() if k in plain},
            "pairs": pairs,
            "worst_tokens": worst,
        }
    )
