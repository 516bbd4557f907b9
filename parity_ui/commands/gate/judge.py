"""Judging a workload run: each threshold of a case, for each checked side, is one Outcome.

Pure: a WorkloadReport (and a baseline's) in, Outcomes out. Every failure message carries the
figure and the limit, so a CI page says why without opening the run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ...core.figures import display_name
from ...core.pooled import NOT_IDENTICAL, TOO_FEW, FloorVerdict, WorkloadStats, compare_to_floor, factor_text
from ...core.workload_record import WorkloadReport
from .metrics import METRICS, WITHIN_FLOOR, fmt
from .spec import BaselineSpec, Slack, Threshold

Status = Literal["pass", "fail", "error", "skipped"]


@dataclass
class Outcome:
    kind: str  # "threshold" | "floor" | "baseline" | "control" | "run"
    check: str  # what was checked: "share_identical >= 0.9", "within 1.5x the noise floor", ...
    side: str | None
    status: Status
    message: str  # the figure and the limit (or why it could not be judged)
    value: float | None = None
    limit: float | None = None
    line: int | None = None  # the spec line the check comes from

    @property
    def name(self) -> str:
        return self.check + (f" [{self.side}]" if self.side else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(report: WorkloadReport, sides: list[str], thresholds: list[Threshold], run_id: str = "") -> list[Outcome]:
    """Each threshold for each side of `sides` (one Outcome each, thresholds in spec order)."""
    out = []
    where = f" (run {run_id})" if run_id else ""
    for t in thresholds:
        for side in sides:
            figures = report.figures_of(side)  # a replay's pair by its name (or its old key)
            if figures is None:
                out.append(
                    Outcome("threshold", t.label(), side, "error", f"side {side} has no figures{where}", line=t.line)
                )
            elif t.metric == WITHIN_FLOOR:
                out.append(_floor(report, figures.stats, side, t, where))
            else:
                out.append(_metric(figures.stats, side, t, where))
    return out


def _metric(stats: WorkloadStats, side: str, t: Threshold, where: str) -> Outcome:
    m = METRICS[t.metric]
    assert t.limit is not None, "a metric's threshold always has a limit (only a per-figure floor has none)"
    value = m.get(stats)
    n = stats.sequences.n
    if value is None:
        if m.none_passes:
            return Outcome(
                "threshold",
                t.label(),
                side,
                "pass",
                f"{t.metric}: no prompt diverged ({n} prompts)",
                None,
                t.limit,
                t.line,
            )
        return Outcome(
            "threshold",
            t.label(),
            side,
            "fail",
            f"{t.metric} could not be computed for side {side} ({n} prompts, {stats.tokens.pairs} "
            f"token pairs){where}: a gate that cannot measure fails",
            None,
            t.limit,
            t.line,
        )
    ok = value >= t.limit if m.higher_is_better else value <= t.limit
    message = (
        f"{t.metric} = {fmt(value)} {'meets' if ok else 'fails'} the limit {m.op} {fmt(t.limit)} "
        f"(side {side}, {n} prompts){where}"
    )
    return Outcome("threshold", t.label(), side, "pass" if ok else "fail", message, value, t.limit, t.line)


def _floor(report: WorkloadReport, stats: WorkloadStats, side: str, t: Threshold, where: str) -> Outcome:
    floor = report.floor_figures
    if floor is None:
        return Outcome("floor", t.label(), side, "error", f"the run measured no noise floor{where}", line=t.line)
    if not t.figures:
        assert t.limit is not None, "a floor threshold without per-figure factors has the tolerance"
        v = compare_to_floor(stats, floor.stats, tolerance=t.limit)
        if v.verdict == "within noise":
            return Outcome("floor", t.label(), side, "pass", f"side {side}: {v.summary}", None, t.limit, t.line)
        if v.verdict == "not comparable":
            return Outcome("floor", t.label(), side, "fail", f"side {side}: {v.summary}{where}", None, t.limit, t.line)
        if v.verdict == TOO_FEW:  # not shown to exceed, not shown within: a gate that cannot tell fails, saying so
            return Outcome("floor", t.label(), side, "fail", f"side {side}: {v.summary}{where}", None, t.limit, t.line)
        worst = max((c for c in v.figures if c.exceeds), key=lambda c: c.factor if c.factor is not None else 0)
        factor = worst.factor if worst.factor is not None and math.isfinite(worst.factor) else None
        return Outcome(
            "floor",
            t.label(),
            side,
            "fail",
            f"side {side}: {v.summary}{where}{_zero_floor(v)}",
            factor,
            t.limit,
            t.line,
        )
    failed: list[str] = []
    passed: list[str] = []
    for name, factor in t.figures.items():
        v = compare_to_floor(stats, floor.stats, tolerance=factor)
        c = next(c for c in v.figures if c.name == name)
        text = _figure_text(c, v, factor)
        (failed if c.exceeds or c.uncertain or c.note == "not comparable" else passed).append(text)
    status: Status = "fail" if failed else "pass"
    return Outcome(
        "floor",
        t.label(),
        side,
        status,
        f"side {side}: " + "; ".join(failed or passed) + (where if failed else ""),
        None,
        None,
        t.line,
    )


def _zero_floor(v: FloorVerdict) -> str:
    """The fix when only a zero floor was exceeded (measured: vLLM eager at another batch was
    bit-identical on an H100, so CUDA graphs' small gap "exceeded" it on every figure)."""
    if not v.zero_floor_only:
        return ""
    return (
        ". The floor is zero on every figure that exceeds it (the reference gave the same numbers bit for bit "
        "under the floor's change), so a factor of it fails any difference: gate this pair on absolute limits "
        "instead (e.g. abs_dlogp_p99: 0.3, k3: 0.001) or pick a floor that moves the reference (floor: kernel)"
    )


def _figure_text(c: Any, v: Any, factor: float) -> str:
    name = display_name(c.name)
    if c.name == NOT_IDENTICAL and c.note != "not comparable":
        return f"{name}: {c.note}"
    if c.note == "not comparable":
        return f"{name}: not comparable (no figure on both)"
    verdict = "exceeds" if c.exceeds else TOO_FEW if c.uncertain else "within"
    return f"{name} {fmt(c.side)} vs floor {fmt(c.floor)} ({factor_text(c)}; limit {c.limit:g}x): {verdict}"


def corridor(
    report: WorkloadReport, base: WorkloadReport, base_id: str, sides: list[str], spec: BaselineSpec
) -> list[Outcome]:
    """Each slack metric for each side: no worse than the baseline's value by more than the slack."""
    out = []
    for s in spec.slack:
        for side in sides:
            mine, theirs = report.figures_of(side), base.figures_of(side)
            label = _corridor_label(s)
            if mine is None or theirs is None:
                out.append(
                    Outcome(
                        "baseline",
                        label,
                        side,
                        "error",
                        f"side {side} has no figures in {'this run' if mine is None else f'baseline {base_id}'}",
                        line=s.line,
                    )
                )
                continue
            out.append(_corridor(mine.stats, theirs.stats, side, s, base_id, label))
    return out


def _corridor_label(s: Slack) -> str:
    m = METRICS[s.metric]
    sign = "-" if m.higher_is_better else "+"
    return f"baseline: {s.metric} {m.op} baseline {sign} {s.label()}"


def _corridor(stats: WorkloadStats, base: WorkloadStats, side: str, s: Slack, base_id: str, label: str) -> Outcome:
    m = METRICS[s.metric]
    value, ref = m.get(stats), m.get(base)
    if value is None and ref is None:
        # None for a metric where none is good (nothing diverged, in both): a pass. Otherwise neither run
        # measured it, and a gate that cannot measure fails, as a threshold does.
        return Outcome(
            "baseline",
            label,
            side,
            "pass" if m.none_passes else "fail",
            f"{s.metric}: none in this run and the baseline"
            + ("" if m.none_passes else ": neither measured it, so the corridor checked nothing"),
            line=s.line,
        )
    if value is None or ref is None:
        if m.none_passes and value is None:  # e.g. nothing diverged now: better than any baseline
            return Outcome("baseline", label, side, "pass", f"{s.metric}: none now (baseline {fmt(ref)})", line=s.line)
        if m.none_passes and ref is None:  # nothing diverged in the baseline; now something did
            return Outcome(
                "baseline",
                label,
                side,
                "fail",
                f"{s.metric} = {fmt(value)} now; in baseline {base_id} no prompt diverged",
                value,
                None,
                s.line,
            )
        return Outcome(
            "baseline",
            label,
            side,
            "fail",
            f"{s.metric} could not be computed ({'this run' if value is None else f'baseline {base_id}'})",
            value,
            None,
            s.line,
        )
    slack = s.amount * abs(ref) if s.relative else s.amount
    limit = ref - slack if m.higher_is_better else ref + slack
    ok = value >= limit if m.higher_is_better else value <= limit
    msg = (
        f"{s.metric} = {fmt(value)} against baseline {base_id}'s {fmt(ref)}: limit {m.op} {fmt(limit)} "
        f"(slack {s.label()}), {'within' if ok else 'outside'} the corridor (side {side})"
    )
    return Outcome("baseline", label, side, "pass" if ok else "fail", msg, value, limit, s.line)
