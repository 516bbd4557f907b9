"""A whole RL run, not one dump: every step of a run's directory replayed, the mismatch's trend over
the steps, the step where a figure jumps, and a follow mode (`parity replay DIR`, `--steps`,
`--follow`).

The run's directory is read by parity_ui.inputs.run_steps (which steps, in which format, complete or
not). Each step is replayed as its own run of kind "replay", its group_id the trend's id:
- recorded-only (the default): the dump's own pair, the recorded rollout against the recorded trainer
  logprobs, pooled without any engine (parity_ui.commands.replay_recorded);
- with engines (`engines=True`, the CLI's --side): the step replayed through the sides
  (parity_ui.commands.replay), for dumps without trainer logprobs (verl, slime without its train dump)
  and for the pairs only an engine makes (routes, kept mass under the trainer).
The trend itself is a run of kind "trend" whose record (core.trend.TrendReport) is stored through the
store as each step lands: per step (and policy version) the pair's figures, the step's run id, why a
step was skipped (incomplete, ranks missing, written for another model), and the change-points
(parity_ui.analysis.changepoint).

Follow mode watches the directory and replays each step once it is complete (its marker, or its files
unchanged for `settle_s`), appending to the same trend; the time from a step's completion to its
figures is kept per step (`landed_s`). A gate (`GateRule`s: `k3>0.001`) is judged as each step lands:
the first breach is recorded and reported (`on_step`); it ends a follow unless `keep_going`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..analysis.changepoint import find_changes
from ..core.config import ParityConfig
from ..core.errors import ParityError
from ..core.measures import ROUTING, SAMPLING
from ..core.runlog import EventCallback, RunEvent
from ..core.trend import WATCHED, GateRule, StepFigures, TrendReport, TrendStep, figures_of, followed_pair
from ..inputs.rollouts import DumpError
from ..inputs.run_steps import SETTLE_S, RunLayout, StepSource, readiness, scan_run, step_wanted
from .replay import ReplayRequest
from .replay_recorded import replay_recorded

if TYPE_CHECKING:
    from ..core.types import Run
    from ..run.recorder import RunRecorder
    from .service_api import Service

KIND = "trend"


@dataclass
class TrendRequest:
    root: str
    model: str
    config: ParityConfig  # with engines: the sides (the first the trainer); else unused but stored
    engines: bool = False  # each step replayed with the sides (else recorded-only)
    format: str = "auto"
    steps: set[int] | None = None  # parse_steps's answer; None: every step
    follow: bool = False
    settle_s: float = SETTLE_S
    poll_s: float = 1.0
    idle_exit_s: float | None = None  # follow: end after this long without a new step (None: until stopped)
    until_step: int | None = None  # follow: end once this step is replayed
    gate: list[GateRule] = field(default_factory=list)
    keep_going: bool = False  # a breach is recorded and reported, the trend goes on
    trust_pickle: bool = False
    on_bad: str = "stop"
    policy_version: str | None = None
    limit: int | None = None  # rows per step
    chunk: int = 16
    floor: str = "auto"
    trust_remote_code: bool = False


StepCallback = Callable[[TrendStep, TrendReport], None]


def run_trend(
    service: Service, req: TrendRequest, emit: EventCallback | None = None, on_step: StepCallback | None = None
) -> Run:
    """Replay every (wanted) step of the run's directory and store the trend as a run of kind "trend".
    Raises ParityError (nothing stored) for a directory that is not a run's (no step; formats or runs
    mixed), unless following (then an empty directory is waited on)."""
    emit = emit or (lambda e: None)
    layout = _scan(req)
    fmt = layout.format if layout is not None else req.format
    report = TrendReport(
        root=req.root,
        format=fmt,
        mode="engines" if req.engines else "recorded",
        gate=list(req.gate),
        follow=req.follow,
    )
    with service.recording(req.model, req.config.to_dict(), [], kind=KIND) as rec:
        rec.run.sides = []
        trend = Trend(service, req, rec, report, emit, on_step)
        trend.run(layout)
    emit(RunEvent("status", f"stored trend {rec.run.id}: {rec.run.status}"))
    return rec.run


def _scan(req: TrendRequest) -> RunLayout | None:
    try:
        return scan_run(req.root, req.format)
    except DumpError as e:
        if req.follow and e.message.startswith("no step dumps"):
            return None  # a run that has not written its first step yet: waited for
        raise ParityError(e.message, e.fix, code="trend-dir") from None


class Trend:
    def __init__(
        self,
        service: Service,
        req: TrendRequest,
        rec: RunRecorder,
        report: TrendReport,
        emit: EventCallback,
        on_step: StepCallback | None,
    ):
        self.service, self.req, self.rec, self.report, self.emit = service, req, rec, report, emit
        self.on_step = on_step or (lambda s, r: None)
        self.waiting: dict[int, str] = {}

    def save(self) -> None:
        self.report.headline = trend_headline(self.report)
        self.service.store.save_trend(self.rec.run.id, self.report)

    def run(self, layout: RunLayout | None) -> None:
        report, req = self.report, self.req
        if layout is not None:
            report.findings += [f"left out: {x}" for x in layout.ignored]
        self.save()
        if not req.follow:
            assert layout is not None
            for src in layout.steps:
                if step_wanted(src.step, req.steps) and not self._stopped():
                    ready = readiness(src, settle_s=req.settle_s)
                    if ready.ready:
                        self._replay(src)
                    else:
                        self._skip(src, f"incomplete: {ready.why}")
        else:
            self._follow(layout)
        self.rec.run.status = "diverged" if report.breach else "ok"
        self.save()

    def _stopped(self) -> bool:
        """The user's Stop; in a follow, also a gate's breach (unless keep_going): the training script
        reads its line and the exit code. A trend over a finished run replays every step either way."""
        breach = self.report.breach is not None and self.req.follow and not self.req.keep_going
        return bool(self.service.stopped) or breach

    def _follow(self, layout: RunLayout | None) -> None:
        req, done = self.req, set()
        last = time.monotonic()
        self.emit(RunEvent("status", f"following {req.root}: each step is replayed once it is complete"))
        try:
            while not self._stopped():
                if layout is not None:
                    for src in layout.steps:
                        if src.step in done or not step_wanted(src.step, req.steps):
                            continue
                        ready = readiness(src, settle_s=req.settle_s)
                        if not ready.ready:
                            if self.waiting.get(src.step) != ready.why:
                                self.waiting[src.step] = ready.why
                                self.emit(RunEvent("status", f"step {src.step}: waiting ({ready.why})"))
                            continue
                        self.waiting.pop(src.step, None)
                        done.add(src.step)
                        self._replay(src, landed=ready.since)
                        last = time.monotonic()
                        if self._stopped():
                            return
                if req.until_step is not None and req.until_step in done:
                    return
                if req.idle_exit_s is not None and time.monotonic() - last > req.idle_exit_s:
                    self.emit(RunEvent("status", f"no new step for {req.idle_exit_s:g}s: the follow ends"))
                    return
                time.sleep(req.poll_s)
                layout = self._rescan(layout)
        except KeyboardInterrupt:  # Ctrl-C is how a follow ends: the trend so far is kept
            self.report.findings.append("the follow was ended by the user (Ctrl-C)")

    def _rescan(self, layout: RunLayout | None) -> RunLayout | None:
        try:
            fresh = scan_run(self.req.root, self.req.format if layout is None else layout.format)
        except DumpError as e:
            if e.message.startswith("no step dumps"):
                return layout
            raise ParityError(e.message, e.fix, code="trend-dir") from None
        if self.report.format in ("auto", ""):
            self.report.format = fresh.format
        return fresh

    # -- one step ------------------------------------------------------------------------------------

    def _skip(self, src: StepSource, why: str) -> None:
        step = TrendStep(step=src.step, status="skipped", note=why, files=[str(p) for p in src.files])
        self.report.findings.append(f"step {src.step} skipped: {why}")
        self._add(step)

    def _request(self, src: StepSource) -> ReplayRequest:
        req = self.req
        return ReplayRequest(
            dump=str(src.path),
            model=req.model,
            config=req.config,
            format=src.format,
            trust_pickle=req.trust_pickle,
            on_bad=req.on_bad,
            limit=req.limit,
            policy_version=req.policy_version,
            chunk=req.chunk,
            floor=req.floor,
            trust_remote_code=req.trust_remote_code,
            group_id=self.rec.run.id,
            name=f"step {src.step} of {req.root}",
        )

    def _replay(self, src: StepSource, landed: float | None = None) -> None:
        self.emit(RunEvent("status", f"step {src.step}: replaying {src.path}"))
        t0 = time.perf_counter()
        step = TrendStep(step=src.step, status="ok", files=[str(p) for p in src.files])
        notes = []
        if src.missing_ranks:
            notes.append(f"ranks {', '.join(map(str, src.missing_ranks))} are missing (their rows are not in it)")
            step.status = "partial"
        try:
            if self.req.engines:
                run = self.service_replay(src)
                step.run_id = run.id
                if run.status == "error":
                    raise ParityError(run.error or "the step's replay failed", "open the step's run for its error")
                step.figures, step.pair = engine_figures(run)
            else:
                got = replay_recorded(self.service, self._request(src))
                run = got.run
                step.run_id, step.facts, step.pair = run.id, got.facts, got.pair
                step.figures, step.versions = got.figures or StepFigures(), got.versions
            skipped = run.workload.replay.skipped if run.workload is not None and run.workload.replay else []
            if skipped:
                notes.append(f"{len(skipped)} rows could not be read and were skipped")
                step.status = "partial"
        except ParityError as e:
            step.status = "error"
            notes.append(_step_error(e))
            self.report.findings.append(f"step {src.step}: {notes[-1]}")
        step.note = "; ".join(notes) or None
        step.seconds = time.perf_counter() - t0
        if landed is not None:
            step.landed_s = max(0.0, time.time() - landed)
        self._add(step)

    def service_replay(self, src: StepSource) -> Run:
        from .replay import run_replay

        return run_replay(self.service, self._request(src), self.emit)

    def _add(self, step: TrendStep) -> None:
        report = self.report
        if not report.pair and step.pair:
            report.pair = step.pair  # the pair the trend follows: its first step's (followed_pair)
        report.steps = sorted([s for s in report.steps if s.step != step.step] + [step], key=lambda s: s.step)
        report.changes = find_changes({f: report.series(f) for f in WATCHED}, WATCHED)
        if report.breach is None and step.status in ("ok", "partial"):
            for rule in report.gate:
                value = step.figures.figures.get(rule.figure)
                if rule.breached(value):
                    report.breach = {"step": step.step, "rule": rule.text(), "figure": rule.figure, "value": value}
                    break
        self.save()
        self.on_step(step, report)


def _step_error(e: ParityError) -> str:
    code = getattr(e, "code", "")
    if code == "replay-vocab" or "outside the model's vocabulary" in e.message:
        return f"written for another model: {e.message}"
    if code == "replay-not-recorded":
        return f"{e.message} (pass --side to replay it with engines)"
    return e.message + (f" ({e.fix})" if e.fix else "")


def engine_figures(run: Run) -> tuple[StepFigures, str | None]:
    """A step replayed with engines: the figures of the pair the trend follows (core.trend.followed_pair:
    the recorded rollout against the recorded trainer where the dump has it, else against the trainer
    re-run), its clipped ratio among them (the clipped-ratio measure pooled it), and the routing and
    kept-mass families of the replay's own pair (the recorded routes against the trainer re-run's) where
    the followed pair has none; and the followed pair's name."""
    report = run.workload
    record = report.replay if report is not None else None
    pair = followed_pair(record)
    figs = report.sides.get(pair.name) if report is not None and pair is not None else None
    if report is None or record is None or pair is None or figs is None:
        return StepFigures(), None
    stats = dataclasses.replace(figs.stats, families=dict(figs.stats.families))
    own = record.main
    other = report.sides.get(own.name) if own is not None else None
    if other is not None:
        for key in (ROUTING.key, SAMPLING.key):
            got = other.stats.family(key)
            if key not in stats.families and got:
                stats.families[key] = got
    return StepFigures(report.done, figs.stats.tokens.pairs, figures_of(stats)), pair.name


def trend_headline(report: TrendReport) -> str:
    """One line: the steps replayed, the first jump named (or none), a gate's breach."""
    done = [s for s in report.steps if s.status in ("ok", "partial")]
    left = [s for s in report.steps if s.status not in ("ok", "partial")]
    if not report.steps:
        return f"trend of {report.root}: no step replayed yet"
    span = f"steps {done[0].step}-{done[-1].step}" if done else "no step"
    out = f"trend of {len(done)} steps ({span}, {report.format}, {report.mode})"
    if left:
        out += f", {len(left)} not replayed"
    if report.changes:
        out += ": " + report.changes[0].sentence()
    else:
        out += ": no jump"
    if report.breach:
        out += f"; gate FAILED at step {report.breach['step']} ({report.breach['rule']})"
    return out
