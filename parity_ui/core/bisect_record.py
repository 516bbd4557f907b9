"""A bisect's record: the settings in which two sides differ, every trial (what it flipped, what the
oracle said, with which figures, whether the flips showed in the engine's resolved settings) and the
answer. Stored as the bisect run's `bisect_json` (parity_ui.store.runs) and read back by `report_from_json`;
`format_bisect` is its terminal screen. Pure: no engine, no store.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import ParityError
from .figures import count, display_name

# The run kinds of a bisect and of its trials (parity_ui.store.bisects reads them back by kind).
KIND, TRIAL_KIND = "bisect", "bisect-trial"
DEFAULT_PROMPTS = 8  # the run's worst prompts a trial runs, unless asked otherwise
MAX_PROMPTS = 10_000  # a trial runs this many of the run's prompts at most
# Outcomes of one trial.
RESTORES, DIVERGES, FAILED = "restores parity", "diverges", "failed"
# How a flip showed in the trial side's resolved settings.
APPLIED = "applied"  # the trial side resolved the reference's value
NOT_APPLIED = "not applied"  # it still resolved the diverging side's own value
NOT_SHOWN = "not shown"  # its engine does not report the setting
NO_VISIBLE_DIFFERENCE = "no visible difference"  # both sides resolved it alike in the stored run already
OTHER = "other value"  # it resolved something that is neither side's value
# Outcomes of the search.
FOUND, ENGINE, BUDGET, NOT_FOUND = "found", "engine", "budget", "not found"


@dataclass
class Factor:
    """One difference between the two sides, as asked (the side's option, else the run's value)."""

    key: str  # an option name, "model" (the model folder), "python" (the interpreter), or "engine"
    reference: Any  # the reference's value, as the user asked for it
    side: Any  # the diverging side's
    flippable: bool = True
    runtime_only: bool = False  # flipping it keeps the side's load key: a warm worker serves the trial
    resolved_key: str | None = None  # its row in the resolved settings (parity_ui.core.settings), if any
    resolved: dict[str, Any] = field(default_factory=dict)  # {"reference": v, "side": v} in the stored run
    note: str = ""
    engine_only: bool = False  # an option the reference's kind lacks: `reference` is the value a flip sets
    #                            (the option's flip_to in parity_ui.core.kinds), not the reference's own

    def describe(self) -> str:
        if self.engine_only:
            return f"{self.key} ({show_value(self.side)}, flipped to {show_value(self.reference)}; only this engine has it)"
        return f"{self.key} ({show_value(self.reference)} vs {show_value(self.side)})"


@dataclass
class FlipCheck:
    """Whether one flipped setting showed in the trial side's resolved settings."""

    key: str
    status: str  # APPLIED, NOT_APPLIED, NOT_SHOWN, NO_VISIBLE_DIFFERENCE, OTHER
    asked: Any  # the reference's value, set on the trial side
    resolved: Any  # what the trial side's engine reported (None: not reported)
    message: str


@dataclass
class Trial:
    index: int  # 1-based, in the order run
    flipped: list[str]  # the factors set to the reference's values
    purpose: str  # "as it ran", "every setting flipped", "ddmin", "one at a time"
    outcome: str  # RESTORES, DIVERGES, FAILED
    run_id: str | None = None  # the trial's stored run (kind "bisect-trial", the search's group)
    oracle: str = ""  # "identical tokens" (an exact pair: float32, greedy) or "noise floor"
    prompts: int = 0
    identical: int | None = None  # prompts token-identical to the reference
    first_divergence: int | None = None  # the earliest over the prompts
    verdict: str | None = None  # against the floor: "within noise", "exceeds noise", "too few prompts to tell",
    #                             "not comparable" (only "within noise" restores)
    exceeded: list[str] = field(default_factory=list)  # figures over the floor
    abs_dlogp_p99: float | None = None
    abs_dlogp_max: float | None = None
    seconds: float = 0.0
    warm: bool | None = None  # the trial side's worker was reused (nothing loaded)
    checks: list[FlipCheck] = field(default_factory=list)
    error: str | None = None

    @property
    def restores(self) -> bool:
        return self.outcome == RESTORES


@dataclass
class Estimate:
    """Trials the search may take for its number of flippable settings (each count includes the two
    first trials: the side as it ran and with every setting flipped), and the time at the seconds
    one trial took."""

    factors: int
    best: int
    worst: int
    one_at_a_time: int
    seconds_per_trial: float | None = None

    def line(self) -> str:
        t = self.seconds_per_trial
        when = f"; at {t:.1f} s a trial: {_duration(self.best * t)} to {_duration(self.worst * t)}" if t else ""
        trials = count(self.best, "trial") if self.best == self.worst else f"{self.best} to {self.worst} trials"
        when = when if self.best != self.worst or not t else f"; at {t:.1f} s a trial: {_duration(self.best * t)}"
        return (
            f"{count(self.factors, 'flippable setting')}: ddmin takes {trials} "
            f"(one at a time: {self.one_at_a_time}, which cannot find a pair){when}"
        )


@dataclass
class BisectReport:
    run_id: str  # the run bisected
    reference: str
    side: str
    group_id: str  # the search's group: its trials share it
    prompts: list[int] = field(default_factory=list)  # the run's prompts used, worst first
    factors: list[Factor] = field(default_factory=list)  # flippable, in the order the search splits them
    fixed: list[Factor] = field(default_factory=list)  # not flippable (the engine, kind-only options)
    oracle: str = ""
    floor: dict[str, Any] | None = None  # {"description", "run_id", "stats"}: measured once, reused
    estimate: Estimate | None = None
    strategy: str = "ddmin"
    max_trials: int | None = None
    trials: list[Trial] = field(default_factory=list)
    cache_hits: int = 0
    outcome: str = ""  # FOUND, ENGINE, BUDGET, NOT_FOUND; "" while running or when it failed
    culprit: list[str] = field(default_factory=list)  # the minimal set (or the best so far)
    needed: list[str] = field(default_factory=list)  # members shown needed (leaving each out broke parity)
    undecided: list[str] = field(default_factory=list)  # members not yet shown needed (budget)
    summary: str = ""
    elapsed_s: float = 0.0

    def factor(self, key: str) -> Factor | None:
        return next((f for f in self.factors + self.fixed if f.key == key), None)

    def unconfirmed(self) -> list[FlipCheck]:
        """Each flip the resolved settings did not confirm, once per setting (its first trial)."""
        seen: dict[str, FlipCheck] = {}
        for t in self.trials:
            for c in t.checks:
                if c.status != APPLIED and c.key not in seen:
                    seen[c.key] = c
        return list(seen.values())

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def report_from_json(d: dict[str, Any]) -> BisectReport:
    """The inverse of BisectReport.to_json (unknown keys, from a newer release, are dropped)."""

    def known(cls: Any, x: dict[str, Any]) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in x.items() if k in names}

    def trial(t: dict[str, Any]) -> Trial:
        return Trial(**{**known(Trial, t), "checks": [FlipCheck(**known(FlipCheck, c)) for c in t.get("checks") or []]})

    est = d.get("estimate")
    return BisectReport(
        **{
            **known(BisectReport, d),
            "factors": [Factor(**known(Factor, f)) for f in d.get("factors") or []],
            "fixed": [Factor(**known(Factor, f)) for f in d.get("fixed") or []],
            "estimate": Estimate(**known(Estimate, est)) if est else None,
            "trials": [trial(t) for t in d.get("trials") or []],
        }
    )


# -- the terminal screen ------------------------------------------------------------------------


def show_value(x: Any) -> str:
    """A setting's value for people: unset for None, true/false, else as written."""
    if x is None:
        return "unset"
    if isinstance(x, bool):
        return str(x).lower()
    return str(x)


def _g(x: float | None) -> str:
    return "-" if x is None else format(x + 0.0, ".3g")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def trial_figures(t: Trial) -> str:
    """A trial's figures in a few words: prompts identical, the earliest fork, the tail gap, the verdict."""
    if t.outcome == FAILED:
        return (t.error or "failed")[:90]
    parts = [f"identical {t.identical}/{t.prompts}"]
    if t.first_divergence is not None:
        parts.append(f"first fork {t.first_divergence}")
    parts.append(f"|dlogp| p99 {_g(t.abs_dlogp_p99)} max {_g(t.abs_dlogp_max)}")
    if t.oracle == "noise floor" and t.verdict:
        parts.append(t.verdict + (f" ({', '.join(display_name(k) for k in t.exceeded[:3])})" if t.exceeded else ""))
    return "; ".join(parts)


def trial_rows(report: BisectReport) -> list[dict[str, str]]:
    """The table of trials as strings (the CLI, the static report and the app show the same cells)."""
    rows = []
    for t in report.trials:
        flipped = ", ".join(t.flipped) if t.flipped else "nothing (as it ran)"
        notes = [c.key + ": " + c.status for c in t.checks if c.status != APPLIED]
        rows.append(
            {
                "trial": str(t.index),
                "flipped": flipped,
                "outcome": t.outcome,
                "oracle": t.oracle or "-",
                "figures": trial_figures(t),
                "seconds": f"{t.seconds:.1f}",
                "warm": "-" if t.warm is None else ("yes" if t.warm else "no"),
                "run": t.run_id or "-",
                "notes": "; ".join(notes),
            }
        )
    return rows


def format_bisect(report: BisectReport, bisect_id: str = "", status: str = "") -> str:
    """The bisect as one screen: the pair, the differing settings, the oracle, the estimate, the table
    of trials, the flips the resolved settings did not confirm, and the answer."""
    head = f"bisect {bisect_id} of run {report.run_id}: {report.side} against the reference {report.reference}"
    lines = [head + (f"  [{status}]" if status else "")]
    if report.prompts:
        lines.append(
            f"  on {len(report.prompts)} prompt(s) of the run, worst first: "
            + ", ".join(map(str, report.prompts[:12]))
            + (" ..." if len(report.prompts) > 12 else "")
        )
    if report.factors:
        lines.append(
            f"  settings that differ ({len(report.factors)}, flippable): "
            + "; ".join(f.describe() + (" [runtime only]" if f.runtime_only else "") for f in report.factors)
        )
    for f in report.fixed:
        lines.append(f"  not flippable: {f.describe()}" + (f": {f.note}" if f.note else ""))
    for f in report.factors:
        if f.note:
            lines.append(f"  note: {f.key}: {f.note}")
    if report.oracle:
        lines.append(f"  oracle: {report.oracle}")
    if report.estimate:
        lines.append(f"  estimate: {report.estimate.line()}")
    rows = trial_rows(report)
    if rows:
        w = max(10, min(48, max(len(r["flipped"]) for r in rows)))
        lines.append(
            f"  {'#':>3}  {'flipped to the reference':{w}}  {'outcome':15}  {'oracle':9}  {'s':>6}  "
            f"{'warm':4}  {'run':26}  figures"
        )
        for r in rows:
            oracle = {"identical tokens": "identical", "noise floor": "floor"}.get(r["oracle"], r["oracle"])
            lines.append(
                f"  {r['trial']:>3}  {r['flipped'][:w]:{w}}  {r['outcome']:15}  {oracle:9}  "
                f"{r['seconds']:>6}  {r['warm']:4}  {r['run']:26}  {r['figures']}"
            )
    for c in report.unconfirmed():
        lines.append(f"  NOT CONFIRMED: {c.message}")
    done = len(report.trials)
    if done:
        hits = f", {report.cache_hits} answered from the cache" if report.cache_hits else ""
        lines.append(f"  {done} trial(s){hits}, {_duration(report.elapsed_s)}")
    if report.summary:
        lines.append(f"  RESULT: {report.summary}")
    return "\n".join(lines)


def pair_value(pair: tuple[str, str]) -> str:
    """A pair as one string (a dropdown's value): side names cannot hold a comma (parity_ui.core.sides)."""
    return f"{pair[0]},{pair[1]}"


def parse_pair(value: Any) -> tuple[str, str] | None:
    """A pair from pair_value's string, a 2-item list or tuple, or None/"" (the default pair).
    Raises ParityError for anything else."""
    if value is None or value == "":
        return None
    names = [str(x).strip() for x in (value.split(",") if isinstance(value, str) else value)]
    if len(names) != 2 or not all(names):
        raise ParityError(f"the pair {value!r} is not two side names", "pick a pair like 'ref,b' (reference first)")
    return names[0], names[1]


def bisect_line(r: Any) -> str:
    """A stored bisect's one line for a runs table (r: parity_ui.store.bisects.BisectLine): the pair,
    the run searched and the answer (or its error)."""
    pair = f"{r.side} vs {r.reference} of {r.run_id}: " if r.run_id else ""
    answer = (
        r.summary if r.status in ("ok", "diverged") and r.summary else r.status + (f": {r.error}" if r.error else "")
    )
    return f"which setting? {pair}{answer}"
