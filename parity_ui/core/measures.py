"""The measures' declarations: what each figure family keeps in the records, registered once.

A measure is one figure family cut through every layer: the tokens, mixture-of-experts routes, the
whole distribution (full rows), the kept mass of shared-seed draws, a replay's recorded pairs. Its
runner half (when it is wanted, what preflight says, what it asks of the sides, what it harvests,
how it pools and judges) is a module of parity_ui.measures; its engine half (processors, hooks)
stays in parity_ui.engines; its section of the views in parity_ui.render.sections. What the records
need to know of it lives here, pure, so the records read back without importing any of those:

- `records`: what it keeps on a comparison (`Comparison.measures[key]`), each with its reader from
  stored JSON. A comparison's JSON keeps each record under its key beside the token fields, as
  before measures had a seam, so stored runs and `--json` read as they did;
- `key`: its name, also the key of its pooled figures on a workload's stats (`WorkloadStats.families`,
  where `pooled`) and of its verdict against the floor (`SideFigures.verdicts`): core.figures
  registers its figures under the same family name;
- `columns`: the optional per-token columns it adds to a side's steps (TokenStep, StepColumns).

Adding a family: its record type in its own core module, a MeasureSpec here, the measure module, the
render section, the engine hook (docs/architecture.md lists the files).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .distribution import DISTRIBUTION_COLUMNS, DistributionRecord, distribution_from_json
from .kept_mass import SAMPLING_COLUMNS, KeptMass, kept_mass_from_json
from .routes import RouteAgreement, RouteReplay, agreement_from_json, replay_from_json

T = TypeVar("T")


class HasMeasures(Protocol):
    measures: dict[str, Any]


@dataclass(frozen=True)
class RecordKey(Generic[T]):
    """One record a measure keeps on a comparison: its key and its reader from stored JSON."""

    key: str
    read: Callable[[Any], T | None]

    def of(self, c: HasMeasures) -> T | None:
        """The record on comparison `c`, None where the measure did not record it."""
        return c.measures.get(self.key)

    def put(self, c: HasMeasures, record: T | None) -> None:
        """Keep `record` on `c` (None: nothing recorded, the key left out)."""
        if record is None:
            c.measures.pop(self.key, None)
        else:
            c.measures[self.key] = record


ROUTES: RecordKey[RouteAgreement] = RecordKey("routes", agreement_from_json)  # the two sides' routes compared
ROUTE_REPLAY: RecordKey[RouteReplay] = RecordKey("route_replay", replay_from_json)  # b again with a's routes
KEPT_MASS: RecordKey[KeptMass] = RecordKey("kept_mass", kept_mass_from_json)  # both sides' draws, kept sets
DISTRIBUTION: RecordKey[DistributionRecord] = RecordKey("distribution", distribution_from_json)  # full rows met


@dataclass(frozen=True)
class MeasureSpec:
    key: str  # the measure's name: its runner (parity_ui.measures), figures family, verdict and section
    title: str  # for people: a section's heading
    pooled: bool = False  # a family of pooled figures on a workload's stats, judged against the floor's
    records: tuple[RecordKey[Any], ...] = ()
    columns: tuple[str, ...] = ()  # optional TokenStep columns it adds (absent = not recorded)


TOKENS = MeasureSpec("tokens", "the tokens")  # the token figures: WorkloadStats' own fields, SideFigures.verdict
ROUTING = MeasureSpec("routing", "mixture-of-experts routes", pooled=True, records=(ROUTES, ROUTE_REPLAY))
SAMPLING = MeasureSpec(
    "sampling", "sampled tokens: kept mass and ratios", pooled=True, records=(KEPT_MASS,), columns=SAMPLING_COLUMNS
)
FULL_ROWS = MeasureSpec(
    "distribution",
    "the whole distribution (full rows)",
    pooled=True,
    records=(DISTRIBUTION,),
    columns=DISTRIBUTION_COLUMNS,
)
REPLAY_PAIRS = MeasureSpec("replay_pairs", "a replay's recorded pairs")
# A replay pair's importance ratio as the trainer clips it (core.clipped): pooled, not judged.
CLIPPED = MeasureSpec("clipped", "the importance ratio as the trainer clips it", pooled=True)

SPECS: tuple[MeasureSpec, ...] = (TOKENS, ROUTING, SAMPLING, FULL_ROWS, REPLAY_PAIRS, CLIPPED)
RECORDS: dict[str, RecordKey[Any]] = {r.key: r for s in SPECS for r in s.records}
POOLED: tuple[str, ...] = tuple(s.key for s in SPECS if s.pooled)  # WorkloadStats.families' keys
STEP_COLUMNS: tuple[str, ...] = tuple(c for s in SPECS for c in s.columns)  # TokenStep's optional columns


def read_records(data: Mapping[str, Any]) -> dict[str, Any]:
    """A comparison's measure records from its JSON (each under its key; a `measures` dict too)."""
    out: dict[str, Any] = {}
    for key, value in {**data, **(data.get("measures") or {})}.items():
        r = RECORDS.get(key)
        if r is not None and value is not None:
            got = r.read(value)
            if got is not None:
                out[key] = got
    return out
