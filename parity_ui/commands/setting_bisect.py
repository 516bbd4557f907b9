"""Which setting is it? The smallest set of differences between two sides of a stored run that explains
their divergence, found by delta debugging: `parity bisect`, and the app's Which setting?.

The driver of three parts, each on its own:
- the factors, the settings in which the diverging side b differs from the reference, and whether a
  flip showed in a trial's resolved settings (parity_ui.core.bisect_factors, in the settings
  vocabulary of parity_ui.core.settings);
- the oracle, a trial's figures and the noise floor to a verdict (parity_ui.analysis.trial_oracle);
- ddmin over the factors (parity_ui.analysis.ddmin).

A trial is a stored workload run (kind "bisect-trial", in the search's group): b with a subset S of
the factors set to the reference's values, run with the reference on the run's worst prompts; the
oracle says whether flipping S restores parity, and a trial that fails counts as "does not restore".
ddmin then finds a 1-minimal S: flipping it restores parity, leaving out any one of its settings does
not (a pair needed together comes out as the pair). When flipping everything flippable does not
restore parity, the answer is what cannot be flipped (the engine).

The floor is the reference against itself under a change that must not matter (again at another batch
size, its prompts in reverse order). The reference and the prompts are the same in every trial, so the
floor is measured ONCE, in the first trial (the side as it ran), and every later trial is judged against
it. Whether a trial's worker was warm is read from the trial itself (its side loaded in 0 s).

The search is itself a stored run (kind "bisect", its record in `run.bisect`, parity_ui.core.bisect_record),
linked to its trials by group_id; `bisect_run` is what the service's `bisect` calls.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis import trial_oracle
from ..analysis.ddmin import best_case_trials, ddmin, one_at_a_time_trials, worst_case_trials
from ..core.bisect_factors import check_flip, differences
from ..core.bisect_record import (
    APPLIED,
    BUDGET,
    DEFAULT_PROMPTS,
    DIVERGES,
    ENGINE,
    FAILED,
    FOUND,
    KIND,
    MAX_PROMPTS,
    NOT_FOUND,
    RESTORES,
    TRIAL_KIND,
    BisectReport,
    Estimate,
    Factor,
    Trial,
    show_value,
    trial_figures,
)
from ..core.config import config_from_dict
from ..core.errors import CancelledError, ParityError
from ..core.mapping import resolve
from ..core.pooled import WorkloadStats
from ..core.runlog import EventCallback, RunEvent, new_run
from ..core.settings import reported
from ..core.sides import SideSpec
from ..core.types import ModelInfo, Run, RunStatus, SideInfo
from ..core.workload_record import WorkloadOptions
from ..inputs.models import describe_model
from ..inputs.prompts import PromptSpec
from ..run.prepare import plan_side
from ..store.runs import new_run_id
from .workload.run import WorkloadRequest, given_prompts, run_workload

if TYPE_CHECKING:
    from ..run.recorder import RunRecorder
    from .service_api import Service

__all__ = ["BisectRequest", "bisect_run", "worst_prompts", "DEFAULT_PROMPTS", "MAX_PROMPTS", "KIND", "TRIAL_KIND"]

STRATEGIES = ("ddmin", "one-at-a-time")


@dataclass
class BisectRequest:
    run_id: str
    sides: tuple[str, str] | None = None  # (reference, diverging side); default: the run's reference and the
    #                                      first side that diverged from it, else the first set up otherwise
    prompts: int = DEFAULT_PROMPTS  # the run's prompts used, worst first (earliest divergence)
    max_trials: int | None = None  # None: as many as ddmin needs
    strategy: str = "ddmin"  # "one-at-a-time": each setting alone (a baseline for bench/bisect_trials.py)


def bisect_run(service: Service, req: BisectRequest, emit: EventCallback | None = None) -> Run:
    """Search the smallest set of the two sides' differences that explains their divergence (see the
    module docstring) and return the stored bisect (a Run of kind "bisect", `run.bisect` its record;
    its trials are runs of kind "bisect-trial" with its group_id). Status "ok": a minimal set was found;
    "diverged": no flippable subset restores parity (the engine itself); "error" with the message and
    fix for bad input (one side, nothing flippable, a model folder gone, nothing to bisect, the budget
    spent: the best set so far and what is undecided are in the record); "cancelled" on Stop.
    Raises ParityError only when `req.run_id` names no stored run (nothing to link a record to)."""
    emit = emit or (lambda e: None)
    stored = service.store.get_run(req.run_id, prompts=[])
    if stored is None:
        raise ParityError(f"no run with id {req.run_id!r}", "list the ids with 'parity runs list'")
    group = new_run_id()
    with service.recording(stored.model.name, stored.config, [], kind=KIND, group_id=group) as rec:
        rec.run.model = stored.model
        rec.run.sides = [dataclasses.replace(s) for s in stored.sides]
        Search(service, rec, stored, req, group, emit).run()
    emit(RunEvent("status", f"stored bisect {rec.run.id}: {rec.run.status}"))
    return rec.run


# -- the prompts --------------------------------------------------------------------------------------


def worst_prompts(service: Service, run_id: str, side: str, n: int) -> tuple[list[int], list[PromptSpec]]:
    """The run's n prompts on which `side` did worst against the reference (diverged first, earliest
    divergence first), with their specs as given. Raises ParityError for prompts not stored as given."""
    specs = given_prompts(service, run_id)
    rank = {
        f.prompt_idx: (f.identical, f.first_divergence is None, f.first_divergence or 0)
        for f in service.store.prompt_forks(run_id, side)
    }
    order = sorted(range(len(specs)), key=lambda i: (*rank.get(i, (True, True, 0)), i))[:n]
    return order, [specs[i] for i in order]


# -- the search -----------------------------------------------------------------------------------------


class Search:
    """One bisect inside its recording (see the module docstring)."""

    def __init__(
        self, service: Service, rec: RunRecorder, stored: Run, req: BisectRequest, group: str, emit: EventCallback
    ):
        self.service, self.rec, self.stored, self.req, self.group, self.emit = service, rec, stored, req, group, emit
        self.floor: WorkloadStats | None = None
        self.warm_key: str | None = None
        self._keys: dict[frozenset, str] = {}
        self._models: dict[str, ModelInfo] = {}
        self.t0 = time.perf_counter()

    # -- set-up and checks ---------------------------------------------------------------------------

    def run(self) -> None:
        stored, req = self.stored, self.req
        ref_name, side_name = self._pair()
        report = self.report = BisectReport(
            run_id=stored.id,
            reference=ref_name,
            side=side_name,
            group_id=self.group,
            strategy=req.strategy,
            max_trials=req.max_trials,
        )
        self.rec.run.bisect = report
        self.rec.run.sides = [dataclasses.replace(s) for s in stored.sides if s.name in (ref_name, side_name)]
        self.rec.save_header()
        if req.strategy not in STRATEGIES:
            raise ParityError(f"unknown bisect strategy {req.strategy!r}", f"use one of {', '.join(STRATEGIES)}")
        if not 1 <= req.prompts <= MAX_PROMPTS:
            raise ParityError(
                f"--prompts {req.prompts} is out of range", f"give a number of prompts from 1 to {MAX_PROMPTS}"
            )
        try:
            self.cfg = config_from_dict(stored.config)
        except ParityError as e:
            raise ParityError(f"run {stored.id}'s stored config no longer reads: {e.message}", e.fix) from None
        self.ref, self.side = self.cfg.side(ref_name), self.cfg.side(side_name)
        self.model = self._check_folders()
        self.model_name = stored.model.path or stored.model.name  # the folder checked above, whatever the cwd
        self.ref_info, self.side_info = stored.side(ref_name), stored.side(side_name)
        factors, fixed = differences(self.cfg, self.ref, self.side, self.model, self.service.on_gpu)
        report.fixed = fixed
        if not factors:
            raise nothing_to_flip(stored.id, ref_name, side_name, fixed)
        self.by_key = {f.key: f for f in factors}
        self.resolved = resolve(self.model, [], self.service.on_gpu)
        base_key = self._load_key(frozenset())
        for f in factors:
            f.runtime_only = self._load_key(frozenset([f.key])) == base_key
            f.resolved = {
                "reference": reported(self.ref_info, f.resolved_key),
                "side": reported(self.side_info, f.resolved_key),
            }
            if f.resolved["reference"] is not None and f.resolved["reference"] == f.resolved["side"] and not f.note:
                f.note = (
                    f"asked {show_value(f.reference)} and {show_value(f.side)}, both sides resolved "
                    f"{show_value(f.resolved['side'])} in the stored run: the side's own setting did not take "
                    "effect, or means the same here"
                )
        # Settings that need no reload innermost: they end up together in the parts ddmin splits off,
        # so trials that differ only in them reuse one warm worker.
        report.factors = sorted(factors, key=lambda f: f.runtime_only)
        self.keys = [f.key for f in report.factors]
        report.prompts, self.prompts = worst_prompts(self.service, stored.id, side_name, req.prompts)
        self.rec.run.prompts = new_run(self.rec.run.id, stored.model.name, stored.config, self.prompts).prompts
        self.rec.begin(self.prompts)
        n = len(self.keys)
        report.estimate = estimate = Estimate(
            factors=n,
            best=2 + best_case_trials(n),
            worst=2 + worst_case_trials(n),
            one_at_a_time=2 + one_at_a_time_trials(n),
        )
        if req.max_trials is not None and req.max_trials < 2:
            raise ParityError(
                f"--max-trials {req.max_trials} is too small: the search runs the side as it ran and "
                "with every setting flipped before anything else",
                f"give --max-trials {estimate.worst} (ddmin's most for {n} settings) or leave it out",
            )
        report.oracle = trial_oracle.describe(self.cfg.greedy)
        self._say(
            f"bisect {self.rec.run.id} of run {stored.id}: {side_name} against the reference {ref_name}, on "
            f"{len(self.prompts)} prompt(s) (worst first: {', '.join(map(str, report.prompts[:8]))})"
        )
        self._say(
            "settings that differ: "
            + "; ".join(f.describe() for f in report.factors)
            + "".join(f"; not flippable: {f.describe()}" for f in fixed)
        )
        self._say(
            "estimate: "
            + estimate.line()
            + (f"; the run itself took {stored.duration_ms / 1000:.1f} s" if stored.duration_ms else "")
        )
        self._search(estimate)

    def _pair(self) -> tuple[str, str]:
        stored, req = self.stored, self.req
        names = [s.name for s in stored.sides]
        if len(names) < 2:
            raise ParityError(
                f"run {stored.id} has {len(names)} side{'s' if len(names) != 1 else ''} as it ran"
                + (
                    f" (it ended: {stored.status}{': ' + stored.error if stored.error else ''})"
                    if stored.status not in ("ok", "diverged")
                    else ""
                )
                + ": a bisect needs two sides that diverge",
                "bisect a run with two sides, e.g. from parity compare ... --side ref=hf --side b=vllm",
            )
        if req.sides is not None:
            if len(req.sides) != 2 or req.sides[0] == req.sides[1] or any(n not in names for n in req.sides):
                raise ParityError(
                    f"--sides {','.join(req.sides)} does not name two sides of run {stored.id} "
                    f"(its sides: {', '.join(names)})",
                    f"e.g. --sides {names[0]},{names[1]}",
                )
            return req.sides[0], req.sides[1]
        diverged = self.service.store.forked_sides(stored.id, names[0])
        ref = stored.sides[0]

        def setup(s: SideInfo) -> tuple:
            return s.kind, s.options, s.model_path, s.python

        differs = [s.name for s in stored.sides[1:] if setup(s) != setup(ref)]
        return names[0], next((n for n in names[1:] if n in diverged), differs[0] if differs else names[1])

    def _check_folders(self) -> ModelInfo:
        """The run's model folder and the sides' own must still be there: every trial loads them."""
        stored = self.stored
        path = stored.model.path
        if path and not Path(path).exists():
            raise ParityError(
                f"the model folder {path} of run {stored.id} is gone",
                "put it back where it was, or run the comparison again with the model's new place and bisect that run",
            )
        for s in (self.ref, self.side):
            if s.model and not Path(s.model).exists():
                raise ParityError(
                    f"side {s.name}'s model folder {s.model} (model=) of run {stored.id} is gone",
                    "put it back, or run the comparison again and bisect that run",
                )
        try:
            return describe_model(
                stored.model.name if not path else path, trust_remote_code=stored.model.trust_remote_code
            )
        except ParityError as e:
            raise ParityError(f"run {stored.id}'s model no longer reads: {e.message}", e.fix) from None

    # -- trials ----------------------------------------------------------------------------------------

    def _spec(self, flipped: frozenset) -> SideSpec:
        """The diverging side with the settings in `flipped` set to the reference's values (an option only
        its engine has: to the value its factor names)."""
        spec = self.side
        opts = {
            k: self.by_key[k].reference if self.by_key[k].engine_only else self.ref.all_options()[k]
            for k in flipped
            if k not in ("model", "python")
        }
        if opts:
            spec = spec.replace(**opts)
        if "model" in flipped:
            spec = dataclasses.replace(spec, model=self.ref.model)
        if "python" in flipped:
            spec = dataclasses.replace(spec, python=self.ref.python)
        return spec

    def _load_key(self, flipped: frozenset) -> str:
        """What a warm worker must have loaded to serve this trial's side (parity_ui.run.plan.SidePlan.load_key)."""
        if flipped not in self._keys:
            spec = self._spec(flipped)
            try:
                model = self.model
                if spec.model:
                    model = self._models.get(spec.model) or describe_model(spec.model)
                    self._models[spec.model] = model
                self._keys[flipped] = plan_side(self.cfg, spec, self.resolved, model).load_key
            except Exception:  # noqa: BLE001 - the trial itself reports why it cannot plan
                self._keys[flipped] = f"unplannable {sorted(flipped)}"
        return self._keys[flipped]

    def _arrange(self, candidates: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """The round's candidates with the one the warm worker serves first, then those sharing a load key
        together (which of them ddmin tries does not change; only the order)."""
        keys = [self._load_key(frozenset(c)) for c in candidates]
        first_seen = {k: i for i, k in reversed(list(enumerate(keys)))}
        order = sorted(range(len(candidates)), key=lambda i: (keys[i] != self.warm_key, first_seen[keys[i]], i))
        return [candidates[i] for i in order]

    def trial(self, flipped: frozenset, purpose: str) -> Trial:
        """Run one trial and judge it; stored as a run of the search's group. Raises CancelledError on
        Stop; a trial that fails is returned as failed."""
        report = self.report
        if self.service.stopped:  # Stop between two trials: no trial is started to be stored as cancelled
            raise CancelledError("the bisect was stopped", "")
        index = len(report.trials) + 1
        names = [k for k in self.keys if k in flipped]
        cfg = self.cfg.with_sides([self.ref, self._spec(flipped)])
        first = self.floor is None
        opts = WorkloadOptions(
            mode="free",
            floor="auto" if first else "none",
            too_long="stop",
            chunk=max(len(self.prompts), 1),
            source={
                "bisect": self.rec.run.id,
                "flipped": names,
                "purpose": purpose,
                "description": f"bisect {self.rec.run.id}, trial {index}: "
                + (", ".join(names) or "nothing")
                + " flipped",
            },
        )
        self._say(
            f"trial {index}: {purpose}: flipping " + (", ".join(names) or "nothing") + " to the reference's values"
        )
        t0 = time.perf_counter()
        run = run_workload(
            self.service,
            WorkloadRequest(
                model=self.model_name,
                prompts=self.prompts,
                config=cfg,
                options=opts,
                trust_remote_code=self.stored.model.trust_remote_code,
                group_id=self.group,
                kind=TRIAL_KIND,
            ),
            emit=lambda e: (
                self.emit(RunEvent(e.kind, f"  trial {index}: {e.message}", e.side, e.prompt_index, e.step))
                # the trial's own "stored run ...: ok" speaks of its tokens; the trial's verdict (the oracle's) follows
                if e.kind == "status" and not e.message.startswith("stored run ")
                else None
            ),
        )
        seconds = time.perf_counter() - t0
        if run.status == "cancelled":
            raise CancelledError(f"the bisect was stopped during trial {index}", "")
        t = self._judge(run, index, names, purpose, first)
        t.seconds = round(seconds, 3)
        info = run.side(self.side.name)
        if info is not None and info.load_s is not None:  # it loaded: 0 s when a warm worker served it
            t.warm = info.load_s == 0
        self.warm_key = self._load_key(flipped)
        report.trials.append(t)
        report.elapsed_s = round(time.perf_counter() - self.t0, 3)
        if len(report.trials) == 3 and report.estimate is not None:  # the first trial of the search proper
            report.estimate.seconds_per_trial = t.seconds
            self._say("estimate, at the time of a trial of the search: " + report.estimate.line())
        self.rec.save_header()
        doubts = [f"{c.key} {c.status}" for c in t.checks if c.status != APPLIED]
        self._say(
            f"trial {index}: {t.outcome.upper()} ({t.seconds:.1f} s"
            + (", warm worker" if t.warm else "")
            + f"): {trial_figures(t)}"
            + (f" [flips not confirmed: {', '.join(doubts)}]" if doubts else "")
        )
        return t

    def _judge(self, run: Run, index: int, names: list[str], purpose: str, first: bool) -> Trial:
        side = self.side.name
        t = Trial(index=index, flipped=names, purpose=purpose, outcome=FAILED, run_id=run.id, prompts=len(self.prompts))
        trial_info = run.side(side)
        if trial_info is not None and trial_info.load_s is not None:  # loaded: its resolved settings are in
            t.checks = [check_flip(_factor(self.report, k), trial_info, self.ref_info, self.side_info) for k in names]
        figures = run.workload.sides.get(side) if run.workload is not None else None
        if run.status not in ("ok", "diverged") or figures is None or not figures.stats.sequences.n:
            t.error = run.error or "the trial made no figures"
            return t
        assert run.workload is not None, "the figures came from the run's workload"
        if first:
            floor = run.workload.floor_figures
            if floor is None:
                raise ParityError(
                    "the first trial measured no noise floor",
                    "report this: a bisect's first trial runs with the batch floor",
                )
            self.floor = floor.stats
            self.report.floor = {
                "description": run.workload.floor.description,
                "run_id": run.id,
                "stats": floor.stats.to_dict(),
            }
        ref_info = run.side(self.ref.name)
        assert self.floor is not None, "the first trial measured the floor"
        v = trial_oracle.judge(
            figures.stats, self.floor, exact=trial_oracle.exact_pair(self.cfg.greedy, ref_info, trial_info)
        )
        t.identical, t.first_divergence = v.identical, v.first_divergence
        t.abs_dlogp_p99, t.abs_dlogp_max = v.abs_dlogp_p99, v.abs_dlogp_max
        t.verdict, t.exceeded, t.oracle = v.verdict, list(v.exceeded), v.oracle
        t.outcome = RESTORES if v.restores else DIVERGES
        return t

    # -- the search itself ---------------------------------------------------------------------------

    def _search(self, estimate: Estimate) -> None:
        report, keys = self.report, self.keys
        base = self.trial(frozenset(), "as it ran")
        if base.outcome == FAILED:
            raise ParityError(
                f"side {report.side} as it ran failed on these prompts: {base.error}",
                "fix what the message names, run the comparison again and bisect that run",
            )
        if base.restores:
            how = "token-identical to" if base.oracle == "identical tokens" else "within the noise floor of"
            raise ParityError(
                f"nothing to bisect: on these {len(self.prompts)} prompt(s) {report.side} as it ran is "
                f"{how} the reference {report.reference} ({trial_figures(base)})",
                "give more prompts (--prompts N) if the run diverged on others; else the sides agree",
            )
        estimate.seconds_per_trial = base.seconds
        self._say(
            "estimate: " + estimate.line() + " (the first trial also started the reference and "
            "measured its noise floor: later ones take less)"
        )
        whole = self.trial(frozenset(keys), "every setting flipped")
        if not whole.restores:
            if whole.outcome == FAILED:
                raise ParityError(
                    f"the trial with every setting flipped to {report.reference}'s failed: {whole.error}",
                    "fix what the message names; until that side runs, no subset can be judged",
                )
            return self._engine(whole)
        if report.strategy == "one-at-a-time":
            return self._one_at_a_time()
        outcomes = {frozenset(): False, frozenset(keys): True}
        budget = None if report.max_trials is None else report.max_trials - len(report.trials)
        result = ddmin(
            keys, lambda s: self.trial(s, "ddmin").restores, budget=budget, known=outcomes, arrange=self._arrange
        )
        report.cache_hits = result.cache_hits
        report.culprit, report.needed = list(result.minimal), list(result.needed)
        report.undecided = list(result.undecided)
        report.elapsed_s = round(time.perf_counter() - self.t0, 3)
        if not result.complete:
            report.outcome = BUDGET
            report.summary = (
                f"the budget of {report.max_trials} trials ran out: flipping {_names(result.minimal)} "
                "restores parity (the best set so far); shown needed: "
                f"{_names(result.needed) or 'none'}; still undecided: {_names(result.undecided)}"
            )
            self.rec.save_header()
            raise ParityError(
                report.summary + ".",
                f"run it again with --max-trials {estimate.worst} (ddmin's most for {len(keys)} "
                "settings) or leave --max-trials out",
                code="bisect-budget",
            )
        report.outcome = FOUND
        report.summary = _found(report, result.minimal)
        self._finish("ok")

    def _engine(self, whole: Trial) -> None:
        report = self.report
        report.outcome = ENGINE
        report.culprit = [f.key for f in report.fixed]
        residual = "; ".join(f.describe() + (f": {f.note}" if f.note else "") for f in report.fixed)
        if report.fixed:
            report.summary = (
                f"no subset of the settings restores parity: with every flippable setting "
                f"({_names(self.keys)}) set to {report.reference}'s, {report.side} still diverges "
                f"(trial {whole.index}: {trial_figures(whole)}). The remaining difference is the engine "
                f"or kernel itself: {residual}"
            )
        else:
            report.summary = (
                f"no subset of the settings restores parity: with every setting set to "
                f"{report.reference}'s, {report.side} is the reference's own setup and still diverges "
                f"(trial {whole.index}: {trial_figures(whole)}): the remaining difference is not in the "
                "settings (the same setup does not reproduce itself on these prompts)"
            )
        self._finish("diverged")

    def _one_at_a_time(self) -> None:
        report = self.report
        alone = [k for k in self.keys if self.trial(frozenset([k]), "one at a time").restores]
        report.culprit = alone[:1]
        report.needed = alone[:1]
        if alone:
            report.outcome = FOUND
            report.summary = (
                f"flipping {alone[0]} alone restores parity"
                + (f" (so does {_names(alone[1:])} alone)" if len(alone) > 1 else "")
                + " (one setting at a time)"
            )
        else:
            report.outcome = NOT_FOUND
            report.summary = (
                "no single setting restores parity when flipped alone, although flipping them all does: "
                "the cause is a combination, which one at a time cannot find (ddmin does)"
            )
        self._finish("ok" if alone else "diverged")

    def _finish(self, status: RunStatus) -> None:
        report = self.report
        report.elapsed_s = round(time.perf_counter() - self.t0, 3)
        self.rec.run.status = status
        self._say(
            f"{len(report.trials)} trial(s) in {report.elapsed_s:.1f} s"
            + (f" ({report.cache_hits} more answered from the cache)" if report.cache_hits else "")
        )
        for c in report.unconfirmed():
            self._say(f"NOT CONFIRMED: {c.message}")
        self._say(f"RESULT: {report.summary}")

    def _say(self, message: str) -> None:
        self.emit(RunEvent("status", message))


def nothing_to_flip(run_id: str, ref: str, side: str, fixed: list) -> ParityError:
    """The error for a pair with no setting to flip, in plain words (the app says it before the click)."""
    if fixed:
        engine = fixed[0]
        problem = (
            f"sides {ref} and {side} of run {run_id} differ only in the engine itself ({engine.reference} "
            f"vs {engine.side}), which a bisect cannot switch on one side: there is no setting to flip"
        )
    else:
        problem = f"sides {ref} and {side} of run {run_id} are set up alike: there is no setting to flip"
    return ParityError(
        problem,
        "the run's settings diff shows what differs; to test the engine itself, compare "
        f"{side} against a side of the reference's kind with the same options",
        code="bisect-nothing-to-flip",
    )


def _factor(report: BisectReport, key: str) -> Factor:
    """Setting `key` of the bisect (every key a trial flips or a result names is one of its factors)."""
    f = report.factor(key)
    if f is None:
        raise KeyError(f"{key} is not a setting of bisect {report.side} vs {report.reference}")
    return f


def _names(keys: Any) -> str:
    keys = list(keys)
    return ", ".join(keys[:-1]) + f" and {keys[-1]}" if len(keys) > 1 else (keys[0] if keys else "")


def _found(report: BisectReport, minimal: tuple[str, ...]) -> str:
    values = "; ".join(
        f"{k}: {show_value(_factor(report, k).side)} -> {show_value(_factor(report, k).reference)}" for k in minimal
    )
    proof = next((t for t in reversed(report.trials) if t.restores and set(t.flipped) == set(minimal)), None)
    where = f" (trial {proof.index})" if proof else ""
    if len(minimal) == 1:
        return (
            f"{minimal[0]} explains the divergence: flipping it alone to {report.reference}'s value restores "
            f"parity{where}, and {report.side} as it ran diverges ({values})"
        )
    together = "both" if len(minimal) == 2 else f"all {len(minimal)}"
    return (
        f"{_names(minimal)} are needed together: flipping {together} restores parity{where}, leaving out any one "
        f"of them does not ({values})"
    )
