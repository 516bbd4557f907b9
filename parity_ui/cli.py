"""The `parity` command: each command parses its arguments, makes one call to the service (the one
door: parity_ui.service) and prints what it returns.

Exit codes of `parity compare`: 0 every side identical to the reference, 1 some diverged, 2 error
(message and fix on stderr; the failed run is stored too). `parity bisect`: 0 a minimal set of settings
found, 1 none restores parity (the engine itself), 2 error.

May import: service, core, inputs, render.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core.config import (
    PRESETS,
    SIDE_PRESETS,
    ParityConfig,
    apply_overrides,
    apply_side_args,
    build_config,
    load_config_file,
)
from .core.errors import ParityError, PromptError
from .core.types import Run, to_dict
from .inputs.images import MAX_IMAGES_PER_PROMPT, read_image
from .inputs.prompts import PromptSpec, read_prompt_file

if TYPE_CHECKING:
    from .service import ParityService

EXIT_IDENTICAL, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="canonical config, YAML or JSON")
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset (before --config and --set)")
    p.add_argument(
        "--side",
        dest="sides",
        action="append",
        default=[],
        metavar="NAME=KIND[,key=value...]",
        help="a side; the first is the reference; repeatable (replaces the config's sides), e.g. "
        "--side ref=hf,dtype=float32 --side b=vllm,enforce_eager=false",
    )
    p.add_argument("--sides-preset", choices=sorted(SIDE_PRESETS), help="a common set of sides, e.g. eager-vs-graphs")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key (SIDE.option for a side's: b.enforce_eager=true); repeatable",
    )


def _base(args: argparse.Namespace) -> dict[str, Any]:
    base = dict(PRESETS[args.preset]) if getattr(args, "preset", None) else {}
    if getattr(args, "sides_preset", None):
        base["sides"] = [dict(s) for s in SIDE_PRESETS[args.sides_preset]]
    return base


def _overrides(args: argparse.Namespace) -> list[str]:
    return [*args.overrides, *(["chat=true"] if getattr(args, "chat", False) else [])]


def _config(args: argparse.Namespace) -> ParityConfig:
    return build_config(args.config, _overrides(args), base=_base(args), sides=args.sides)


def _raw_config(args: argparse.Namespace) -> dict[str, Any]:
    """What the user asked for, even when invalid, for the stored error row."""
    try:
        data = {**_base(args), **(load_config_file(args.config) if args.config else {})}
        return apply_overrides(apply_side_args(data, args.sides), _overrides(args))
    except ParityError:
        return {"overrides": args.overrides, "sides": args.sides, "config_file": args.config}


def _prompts(args: argparse.Namespace) -> list[PromptSpec]:
    if args.prompt is not None:
        if not args.prompt.strip():
            raise PromptError("the prompt is empty", "give --prompt 'some text' or --prompt-file FILE")
        images = [read_image(path) for path in getattr(args, "image", None) or []]
        if len(images) > MAX_IMAGES_PER_PROMPT:
            raise PromptError(
                f"{len(images)} images were given; parity-ui takes at most {MAX_IMAGES_PER_PROMPT} a prompt",
                "give fewer --image",
            )
        return [PromptSpec(text=args.prompt, images=images)]
    if getattr(args, "image", None):
        raise PromptError(
            "--image goes with --prompt; a prompt file names its own images",
            'in the .jsonl file: {"prompt": "...", "images": ["cat.png"]} or image parts in '
            '"messages": {"type": "image", "path": "cat.png"}',
        )
    return read_prompt_file(args.prompt_file)


def _as_given(args: argparse.Namespace) -> list[PromptSpec]:
    """The prompts as typed, for a run that failed before they could be read."""
    from .inputs.prompts import prompts_as_given

    return prompts_as_given(
        getattr(args, "prompt", None),
        getattr(args, "image", None) or [],
        prompt_file=getattr(args, "prompt_file", None),
    )


def _service(args: argparse.Namespace) -> ParityService:
    from .service import ParityService

    return ParityService(db_path=args.db)


PROGRESS_EVERY_S = 5.0  # a workload's progress inside a chunk: a line at most this often (each chunk's end always)
_last_progress: dict[str, Any] = {"t": 0.0, "done": None}


def _progress(event: Any) -> None:
    if event.kind == "progress":
        import time

        now = time.monotonic()
        if event.prompt_index == _last_progress["done"] and now - _last_progress["t"] < PROGRESS_EVERY_S:
            return
        _last_progress.update(t=now, done=event.prompt_index)
    if event.kind in ("status", "side_done", "progress"):
        print(f"[parity] {event.message}", file=sys.stderr)


def _emit(args: argparse.Namespace) -> Any:
    """The progress printer: lines on stderr unless --quiet. --json keeps them (its object is on stdout;
    a long replay or workload was silent under it: issue 46 item 10)."""
    return _progress if not args.quiet else None


def _is_workload_file(path: str | None) -> bool:
    if not path:
        return False
    return Path(path).suffix.lower() in (".jsonl", ".parquet")


def _workload(args: argparse.Namespace) -> Any:
    """The prompt file read as a workload (parity_ui.inputs.workload_source), or None for a single prompt."""
    if not _is_workload_file(getattr(args, "prompt_file", None)):
        return None
    from .inputs.workload_source import load_workload

    return load_workload(
        args.prompt_file, field=args.field, limit=args.limit, sample=args.sample, seed=args.seed, on_bad=args.on_bad
    )


def _workload_options(args: argparse.Namespace) -> Any:
    from .core.workload_record import WorkloadOptions

    cluster, replicas = _cluster_args(args)
    return WorkloadOptions(
        mode=args.mode,
        floor=args.floor,
        floor_batch_size=args.floor_batch_size,
        too_long=args.too_long,
        chunk=args.chunk,
        cluster=cluster,
        replicas=replicas,
    )


def _cluster_args(args: argparse.Namespace) -> tuple[str | None, dict[str, int]]:
    """--cluster and --replicas, read (parity_ui.core.cluster). Raises ConfigError."""
    from .core.cluster import parse_cluster, parse_replicas

    cluster = parse_cluster(getattr(args, "cluster", None))
    replicas = parse_replicas(args.replicas) if getattr(args, "replicas", None) else {}
    return cluster, replicas


def cmd_compare(args: argparse.Namespace) -> int:
    from .service import WorkloadRequest, plan_request

    service = _service(args)
    try:
        # Refused before anything runs (a bad config, prompt or workload file): the error and its fix
        # on stderr, rc 2, nothing stored, as the app (issue 46 item 5); main() prints it.
        source = _workload(args)
        prompts = [] if source is not None else _prompts(args)
        cfg = _config(args)
        options = _workload_options(args)
        req = plan_request(
            args.model, cfg, prompts, source=source, options=options, trust_remote_code=args.trust_remote_code
        )
        if isinstance(req, WorkloadRequest) and not args.quiet:
            print(f"[parity] workload: {source.describe()}", file=sys.stderr)
            for bad in source.skipped[:5]:
                print(f"[parity] skipped {bad.where}: {bad.message}", file=sys.stderr)
        return _report(service.run(req, on_event=_emit(args)), args, service)
    finally:
        service.close()


def cmd_replay(args: argparse.Namespace) -> int:
    from .service import ReplayRequest

    if args.steps or args.follow or _is_run_dir(args.dump):
        return cmd_trend(args)
    service = _service(args)
    try:
        cluster, replicas = _cluster_args(args)
        req = ReplayRequest(
            dump=args.dump,
            model=args.model,
            config=_config(args),
            format=args.format,
            trust_pickle=args.trust_pickle,
            chat_template=args.chat_template,
            on_bad=args.on_bad,
            limit=args.limit,
            policy_version=args.policy_version,
            chunk=args.chunk,
            floor=args.floor,
            trust_remote_code=args.trust_remote_code,
            cluster=cluster,
            replicas=replicas,
        )
        if args.recorded_only:  # the dump's own pair, no engine
            return _report(service.replay_recorded(req, on_event=_emit(args)), args, service)
        return _report(service.replay(req, on_event=_emit(args)), args, service)
    finally:
        service.close()


def _is_run_dir(path: str) -> bool:
    """A directory of a run's steps (not one step's own directory: prime-rl's step_N/, verl's <step>/)."""
    from .inputs.step_dumps import detect_step_format

    p = Path(path)
    return p.is_dir() and detect_step_format(p) is None


def cmd_trend(args: argparse.Namespace) -> int:
    """`parity replay DIR` (or --steps, --follow): every step of the run, the trend, the jumps, a gate."""
    from .core.trend import parse_gate
    from .inputs.run_steps import parse_steps
    from .render.trend import breach_line, step_json, step_line, trend_text
    from .service import TrendRequest

    try:
        gate, steps = parse_gate(args.fail_on), parse_steps(args.steps)
    except ValueError as e:
        raise PromptError(str(e), "see parity replay --help (--fail-on, --steps)") from None
    engines = bool(args.sides or args.sides_preset or args.config)  # engines only when sides are asked for
    service = _service(args)
    said: set[int] = set()

    def on_step(step: Any, report: Any) -> None:
        if not args.follow:
            return
        print(step_json(step, report) if args.json else step_line(step), flush=True)
        if report.breach and report.breach["step"] not in said:
            said.add(report.breach["step"])
            print(breach_line(report), flush=True)

    try:
        req = TrendRequest(
            root=args.dump,
            model=args.model,
            config=_config(args),
            engines=engines,
            format=args.format,
            steps=steps,
            follow=args.follow,
            settle_s=args.settle,
            poll_s=args.poll,
            idle_exit_s=args.idle_exit,
            until_step=args.until_step,
            gate=gate,
            keep_going=args.keep_going,
            trust_pickle=args.trust_pickle,
            on_bad=args.on_bad,
            policy_version=args.policy_version,
            limit=args.limit,
            chunk=args.chunk,
            floor=args.floor,
            trust_remote_code=args.trust_remote_code,
        )
        run = service.trend(req, on_event=_emit(args), on_step=on_step)
        report = service.store.trend(run.id)
    finally:
        service.close()
    if report is None or run.status == "error":
        print(f"parity: error: {run.error or 'the trend was not stored'}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps({"run_id": run.id, "status": run.status, "trend": report.to_json()}, default=str))
    else:
        print(trend_text(report, run.id))
    return EXIT_DIVERGED if report.breach else EXIT_IDENTICAL


def cmd_resume(args: argparse.Namespace) -> int:
    service = _service(args)
    try:
        cluster, replicas = _cluster_args(args)
        return _report(service.resume(args.id, _emit(args), cluster=cluster, replicas=replicas or None), args, service)
    finally:
        service.close()


def _exit_code(run: Run) -> int:
    if run.status not in ("ok", "diverged"):
        return EXIT_ERROR
    return EXIT_IDENTICAL if run.status == "ok" else EXIT_DIVERGED


def _report(run: Run, args: argparse.Namespace, service: ParityService | None = None) -> int:
    """Print the run (a workload as one screen, its prompts with --per-prompt) and its exit code."""
    from .render.report import format_summary, run_json

    if run.status not in ("ok", "diverged"):
        print(f"parity: error: {run.error}", file=sys.stderr)
        print(f"parity: stored as run {run.id}", file=sys.stderr)
    if run.workload is not None and service is not None and getattr(args, "per_prompt", False):
        run = service.get_run(run.id) or run  # every prompt, read back from the store
    if args.json:
        print(json.dumps(run_json(run)))
    elif run.workload is not None:
        from .render.text import format_workload

        print(format_summary(run, prompts=getattr(args, "per_prompt", False)))
        print(format_workload(run.workload, run.id, run.status))
    elif run.status in ("ok", "diverged"):
        print(format_summary(run))
    return _exit_code(run)


def cmd_config_show(args: argparse.Namespace) -> int:
    from .core.mapping import format_table

    try:
        cfg = _config(args)
        if args.yaml:
            print(cfg.to_yaml(), end="")
            return 0
        from .service import ParityService

        service = ParityService(db_path=":memory:")
        rows = service.mapping(args.model, cfg, args.trust_remote_code)
    except ParityError as e:
        print(f"parity: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(format_table(rows, {s.name: f"{s.name} ({s.kind})" for s in cfg.sides}))
    return 0


def cmd_runs_list(args: argparse.Namespace) -> int:
    from .service import open_store

    rows = open_store(args.db).list_runs(search=args.search, model=args.model, status=args.status, limit=args.limit)
    if args.json:
        print(json.dumps([to_dict(r) for r in rows]))
        return 0
    print(f"{'id':26}  {'when (UTC)':19}  {'status':11}  {'first div':9}  {'model':20}  {'sides':24}  prompt")
    for r in rows:
        fd = "-" if r.first_divergence is None else str(r.first_divergence)
        tail = r.prompt_excerpt[:40] if not r.error else "ERROR: " + r.error[:60]
        print(
            f"{r.id:26}  {r.datetime_utc[:19]:19}  {r.status:11}  {fd:9}  {r.model[:20]:20}  {r.sides[:24]:24}  {tail}"
        )
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    from .render.report import format_summary, run_json
    from .service import open_store

    only = None if args.prompt is None else [args.prompt]
    store = open_store(args.db)
    run = store.get_run(args.id, prompts=only)
    if run is None:
        print(
            f"parity: error: no run with id {args.id!r} in {args.db or 'runs.db'}. "
            "Fix: list the ids with 'parity runs list'",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if only and not run.prompts:
        print(
            f"parity: error: run {args.id} has no prompt {args.prompt}. Fix: give --prompt from 0 to "
            f"{_n_prompts(args, run) - 1}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    trend = store.trend(run.id) if run.kind == "trend" else None
    if trend is not None:  # a run's trend over its steps: its record is the whole of it
        from .render.trend import trend_text

        print(
            json.dumps({**run_json(run), "trend": trend.to_json()}, default=str)
            if args.json
            else trend_text(trend, run.id)
        )
    elif args.json:
        print(json.dumps(run_json(run)))
    elif run.workload is not None and only is None:
        from .render.text import format_workload

        print(format_summary(run, prompts=False))
        print(format_workload(run.workload, run.id, run.status))
    else:
        print(format_summary(run))
    return 0


def _n_prompts(args: argparse.Namespace, run: Run) -> int:
    return run.workload.n_prompts if run.workload is not None else len(run.prompts)


def cmd_report(args: argparse.Namespace) -> int:
    from .render.report import stored_html_report, workload_report_prompts
    from .service import open_store

    # the store reads a workload's header, prompt rows and earliest forks only, not every prompt's
    # tokens (a 10,000-prompt run); any other run whole
    page = stored_html_report(open_store(args.db).for_report(args.id, workload_report_prompts))
    if page is None:
        print(
            f"parity: error: no run with id {args.id!r} in {args.db or 'runs.db'}. "
            "Fix: list the ids with 'parity runs list'",
            file=sys.stderr,
        )
        return EXIT_ERROR
    out = Path(args.output or f"parity-run-{args.id}.html")
    out.write_text(page, encoding="utf-8")
    print(out)
    return 0


def cmd_layers(args: argparse.Namespace) -> int:
    from .render.op_map import format_op_map, localisation_json
    from .render.text import format_localisation

    service = _service(args)
    try:
        loc = service.localise(
            args.id,
            args.prompt,
            args.position,
            args.sides,
            emit=_emit(args),
            ops=args.ops,
            window=args.window,
            swap=args.swap,
        )
    finally:
        service.close()
    if loc.error:
        print(f"parity: error: {loc.error}", file=sys.stderr)
        print(f"parity: stored as localisation {loc.id} of run {loc.run_id}", file=sys.stderr)
    if args.json:
        print(json.dumps(localisation_json(loc)))
    elif not loc.error:
        print(format_localisation(loc))
        if loc.op_map:
            print(format_op_map(loc))
    return EXIT_ERROR if loc.error else 0


def cmd_bisect(args: argparse.Namespace) -> int:
    """Exit 0: a minimal set of settings explains the divergence; 1: no flippable subset restores parity
    (the engine itself); 2: an error (stored with the trials so far)."""
    from .core.bisect_record import format_bisect

    sides = None
    if args.sides:
        names = [s.strip() for s in args.sides.split(",") if s.strip()]
        sides = tuple(names) if len(names) == 2 else (args.sides,)
    service = _service(args)
    try:
        run = service.bisect(args.id, sides, prompts=args.prompts, max_trials=args.max_trials, emit=_emit(args))
    finally:
        service.close()
    if run.status not in ("ok", "diverged"):
        print(f"parity: error: {run.error}", file=sys.stderr)
        print(f"parity: stored as bisect {run.id}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    "bisect_id": run.id,
                    "status": run.status,
                    "error": run.error,
                    "error_code": run.error_code,
                    "group_id": run.group_id,
                    "bisect": to_dict(run.bisect),
                }
            )
        )
    elif run.bisect is not None:
        from .core.settings import format_text, settings_diff

        rows = [r for r in settings_diff(run.sides) if r.differs]
        if rows:
            print("resolved settings that differ in the stored run:\n" + format_text(rows))
        print(format_bisect(run.bisect, run.id, run.status))
    return _exit_code(run)


def _single_prompt(args: argparse.Namespace) -> PromptSpec:
    if not args.prompt.strip():
        raise PromptError("the prompt is empty", "give --prompt 'some text'")
    return PromptSpec(text=args.prompt)


def cmd_probe(args: argparse.Namespace) -> int:
    from .render.text import format_probe

    service = _service(args)
    try:
        try:
            prompt, cfg = _single_prompt(args), _config(args)
        except ParityError as e:
            return _report(
                service.record_failure(args.model, _as_given(args), _raw_config(args), e, kind="probe"), args
            )
        run = service.probe(
            args.model,
            prompt,
            cfg,
            n=args.n,
            batch=args.batch,
            trust_remote_code=args.trust_remote_code,
            emit=_emit(args),
        )
    finally:
        service.close()
    if run.status == "error":
        print(f"parity: error: {run.error}", file=sys.stderr)
        print(f"parity: stored as run {run.id}", file=sys.stderr)
    if args.json:
        from .render.report import run_json

        print(json.dumps(run_json(run)))
    elif run.status != "error":
        print(format_probe(run))
    return _exit_code(run)


def cmd_sweep(args: argparse.Namespace) -> int:
    from .render.text import format_sweep

    service = _service(args)
    try:
        try:
            prompt, grid = _single_prompt(args), service.parse_grid(args.grid)
            _config(args)  # the base config must be valid before any point runs
        except ParityError as e:
            return _report(
                service.record_failure(
                    args.model, _as_given(args), {**_raw_config(args), "grid": args.grid}, e, kind="sweep"
                ),
                args,
            )
        summary = service.sweep(
            args.model,
            prompt,
            grid,
            config_path=args.config,
            overrides=_overrides(args),
            base=_base(args),
            sides=args.sides,
            trust_remote_code=args.trust_remote_code,
            emit=_emit(args),
        )
    finally:
        service.close()
    print(json.dumps(summary) if args.json else format_sweep(summary))
    statuses = {p["status"] for p in summary["points"]}
    return (
        EXIT_ERROR if statuses - {"ok", "diverged"} else (EXIT_DIVERGED if "diverged" in statuses else EXIT_IDENTICAL)
    )


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0: every threshold held and every control failed them; 1: a threshold failed or a control
    passed; 2: an error (a spec that does not validate writes nothing: no run, no JUnit, no summary)."""
    if bool(args.spec) == bool(args.self_test):
        print(
            "parity: error: give a spec file, or --self-test (not both). Fix: parity check examples/gate.yaml, "
            "or parity check --self-test",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if args.model and not args.self_test:
        print(
            "parity: error: --model goes with --self-test; a spec names each case's model. Fix: drop --model",
            file=sys.stderr,
        )
        return EXIT_ERROR
    quiet = args.quiet  # --json's object goes to stdout; progress stays on stderr

    def say(message: str) -> None:
        if not quiet:
            print(f"[parity] {message}", file=sys.stderr)

    service = _service(args)
    try:
        check = service.check(
            args.spec,
            self_test_model=(args.model or "demo") if args.self_test else None,
            only=args.only,
            overrides=args.overrides,
            limit=args.limit,
            junit=args.junit,
            markdown=args.markdown,
            say=say,
            emit=_emit(args),
        )
    except ParityError as e:  # the spec (SpecError: case and line) or a case's preparation
        print(f"parity: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        service.close()
    print(json.dumps(check.to_dict()) if args.json else check.screen)
    return check.exit_code


def _audit_prompts(args: argparse.Namespace) -> tuple[list[PromptSpec], str]:
    """An audit's prompts: a file (.txt one prompt; .jsonl/.parquet a workload, --limit), else the
    built-in mixed-length set of --prompts N, up to --longest words."""
    if args.prompt_file:
        if _is_workload_file(args.prompt_file):
            from .inputs.workload_source import load_workload

            w = load_workload(args.prompt_file, field=args.field, limit=args.limit)
            return list(w.prompts), w.describe()
        specs = read_prompt_file(args.prompt_file)
        return specs[: args.limit] if args.limit else specs, f"{len(specs)} prompt(s) from {args.prompt_file}"
    from .inputs.audit_prompts import builtin_prompts, describe_builtin

    return builtin_prompts(args.prompts, args.longest), describe_builtin(args.prompts, args.longest)


EXIT_CERTIFIED, EXIT_NOT_CERTIFIED = 0, 1


def cmd_audit(args: argparse.Namespace) -> int:
    """Exit 0: no axis broke (with --certify: certified zero, every applicable axis identical and the
    control detected); 1: an axis broke, was vacuous, or the control was not detected (VOID); 2: an
    error or a Stop (stored with the axes finished before it)."""
    from .render.audit import audit_page_html, certificate_json, format_audit
    from .service import AuditRequest

    service = _service(args)
    try:
        # Refused before anything runs (bad prompts, settings or sides; later, in the audit, a model not
        # found or a prompt over the context): the error and its fix on stderr, rc 2, nothing stored
        # (issue 46 item 5, as compare); main() prints it.
        prompts, source = _audit_prompts(args)
        cfg = build_config(args.config, _overrides(args), base=_base(args), sides=args.sides, min_sides=1)
        req = AuditRequest(
            model=args.model,
            config=cfg,
            prompts=prompts,
            axes=args.axes,
            batch_size=args.batch,
            control_setting=args.control_setting or bool(args.control_set),
            control_set=args.control_set,
            source=source,
            trust_remote_code=args.trust_remote_code,
            seed=args.seed,
        )
        out = service.audit(req, on_event=_emit(args), refuse=True)
    finally:
        service.close()
    run, report = out.run, out.report
    if run.status not in ("ok", "diverged"):
        print(f"parity: error: {run.error}", file=sys.stderr)
        print(f"parity: stored as audit {run.id} (the axes finished before it are kept)", file=sys.stderr)
    if args.certify or args.evidence:
        base = Path(args.evidence or f"parity-audit-{run.id}")
        base = base.with_suffix("") if base.suffix in (".json", ".html") else base
        js, page = base.with_name(base.name + ".json"), base.with_name(base.name + ".html")
        js.write_text(json.dumps(certificate_json(report, run.id), indent=1, default=str), encoding="utf-8")
        page.write_text(audit_page_html(report, run.id), encoding="utf-8")
        if not args.quiet:  # stderr: --json's object is alone on stdout
            print(f"[parity] evidence: {js} and {page}", file=sys.stderr)
    if args.json:
        print(json.dumps(certificate_json(report, run.id), default=str))
    elif report.results:
        print(format_audit(report, run.id))
    if run.status not in ("ok", "diverged"):
        return EXIT_ERROR
    if args.certify:
        return EXIT_CERTIFIED if report.certified else EXIT_NOT_CERTIFIED
    return EXIT_IDENTICAL if run.status == "ok" else EXIT_DIVERGED


def cmd_weights(args: argparse.Namespace) -> int:
    """Exit 0: every tensor equal to the fresh load and the probe at the floor (a server whose weights
    cannot be read: the probe alone); 1: a tensor differs or the probe is above the floor; 2: an error."""
    import yaml

    from .render.weights import format_weights
    from .service import WeightsCheckRequest

    extra: dict[str, Any] = {}
    for item in args.vllm_options:
        key, sep, value = item.partition("=")
        if not sep:
            print(
                f"parity: error: --vllm {item!r} is not KEY=VALUE. Fix: e.g. --vllm enforce_eager=true", file=sys.stderr
            )
            return EXIT_ERROR
        extra[key.strip()] = yaml.safe_load(value)
    req = WeightsCheckRequest(
        model=args.model,
        start_from=getattr(args, "from"),
        url=args.url,
        served_model=args.served_model,
        skip=args.skip,
        zero=args.zero,
        sleep=args.sleep,
        update_path=args.update_path,
        dtype=args.dtype,
        probe=not args.no_probe,
        probe_tokens=args.probe_tokens,
        probe_sequences=args.probe_sequences,
        vllm_options=extra,
        trust_remote_code=args.trust_remote_code,
    )
    service = _service(args)
    try:
        # Bad input refused before an engine starts: main() prints it, rc 2, nothing stored (issue 46 item 5).
        report = service.weights(req, on_event=_emit(args), refuse=True)
    finally:
        service.close()
    if report.error:
        print(f"parity: error: {report.error}", file=sys.stderr)
    print(json.dumps(report.to_dict()) if args.json else format_weights(report))
    return report.exit_code


JSON_HELP = "print one JSON object (on stdout; progress stays on stderr)"


def _add_output_args(
    p: argparse.ArgumentParser, json_help: str | None = None, progress: bool = True, as_json: bool = True
) -> None:
    """The options the subcommands share, defined once: --json (one object on stdout, progress on
    stderr), --quiet (no progress lines; only where there is progress) and --db (the top-level option
    repeated after the subcommand; SUPPRESS keeps a top-level --db when this one is not given)."""
    if as_json:
        p.add_argument(
            "--json", action="store_true", help=json_help or (JSON_HELP if progress else "print one JSON object")
        )
    if progress:
        p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--db", default=argparse.SUPPRESS, help="run database (as the top-level --db, after the command)")


def _add_single_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo", help="'demo', a folder, or an HF id")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template (once)")
    p.add_argument("--trust-remote-code", action="store_true")
    _add_output_args(p)
    _add_config_args(p)


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("workload (a .jsonl or .parquet --prompt-file of several prompts)")
    w.add_argument(
        "--field",
        help="the key or column holding the prompt (text or chat messages); default: "
        "prompt, messages, text, question or input",
    )
    pick = w.add_mutually_exclusive_group()
    pick.add_argument("--limit", type=int, help="the first N prompts")
    pick.add_argument("--sample", type=int, help="a random N prompts (reproducible with --seed)")
    w.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    w.add_argument(
        "--on-bad",
        choices=["stop", "skip"],
        default="stop",
        help="a broken line or row: stop with its number, or skip it and count it",
    )
    w.add_argument(
        "--too-long",
        choices=["skip", "stop"],
        default="skip",
        help="a prompt longer than the context: skip it and count it (default), or stop",
    )
    w.add_argument(
        "--mode",
        choices=["free", "scored"],
        default="free",
        help="free: every side generates; scored: the reference teacher-forces the other sides' tokens "
        "(its cost is a prefill per sequence, not a decode)",
    )
    w.add_argument(
        "--floor",
        choices=["auto", "batch", "order", "kernel", "none"],
        default="auto",
        help="the reference's own noise: batch (again at another batch size and order), order, kernel "
        "(an HF reference with another attention kernel), none; auto (default): batch when free, "
        "kernel when scored with an HF reference, else none",
    )
    w.add_argument("--floor-batch-size", type=int, default=8, help="the batch floor's batch size (default 8)")
    w.add_argument("--chunk", type=int, default=64, help="prompts done and stored together (default 64)")
    w.add_argument("--per-prompt", action="store_true", help="also list every prompt, as a single run does")
    _add_cluster_args(p)


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("on a Ray cluster (pip install 'parity-ui[cluster]'; see docs/cluster.md)")
    c.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run each side as replicas on Ray: 'local' starts Ray on this machine; an address ('auto', "
        "HOST:6379, ray://HOST:10001) joins a running cluster; blocks of --chunk prompts go to idle "
        "replicas, and this process alone stores the run",
    )
    c.add_argument(
        "--replicas",
        metavar="N|SIDE=N,...",
        help="replicas of each side on the cluster: one number for every side, or per side "
        "(ref=2,b=4; '2,b=4': b four, the others two); default 1",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="parity",
        description="Compare engine setups (sides) token by token: vLLM vs HF transformers, vLLM vs vLLM, ...",
    )
    ap.add_argument("--db", default=None, help="run database (default: $PARITY_DB or ./runs.db)")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="run every side on the same prompt(s), compare with the reference, store")
    c.add_argument("--model", default="demo", help="'demo' (bundled SmolLM2-135M-Instruct), a folder, or an HF id")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help='.txt (one prompt) or .jsonl ({"prompt"} or {"messages"} a line)')
    c.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image for the prompt (repeatable; a vision-language model; the chat template places it)",
    )
    c.add_argument("--chat", action="store_true", help="apply the model's chat template (once)")
    c.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code")
    _add_output_args(c)
    _add_config_args(c)
    _add_workload_args(c)
    c.set_defaults(func=cmd_compare)

    rp = sub.add_parser(
        "replay",
        help="an RL run's own rollouts (a dump) teacher-forced through the trainer (the "
        "reference) and the rollout engine again, against the trainer's floor",
    )
    rp.add_argument(
        "dump",
        help="the dump: parity-ui's rollout format (.jsonl/.parquet), NeMo-RL "
        "train_data_step*.jsonl, verl rollout_data_dir .jsonl, slime/miles rollout_*.pt, a prime-rl "
        "token_exports/step_N directory, a verl <step>/gen_batch.dp; or a run's directory of step dumps "
        "(every step replayed, the trend over the steps: see --steps, --follow)",
    )
    rp.add_argument("--model", required=True, help="the model the run trained (a folder or an HF id)")
    rp.add_argument(
        "--format",
        default="auto",
        choices=["auto", "parity", "nemo-rl", "verl", "slime", "prime-rl", "verl-dp"],
        help="the dump's format (default: detected)",
    )
    rp.add_argument(
        "--trust-pickle",
        action="store_true",
        help="load a .pt pickle that a safe load refuses (unpickling runs the code the file names)",
    )
    rp.add_argument(
        "--chat-template", action="store_true", help="verl: apply the model's chat template to each text prompt"
    )
    rp.add_argument(
        "--on-bad",
        choices=["stop", "skip"],
        default="stop",
        help="a broken row: stop with its number, or skip it and count it",
    )
    rp.add_argument("--limit", type=int, help="the first N rows")
    rp.add_argument("--policy-version", help="only the rows of this policy version")
    rp.add_argument("--chunk", type=int, default=16, help="rows replayed and stored together (default 16)")
    rp.add_argument(
        "--floor",
        choices=["auto", "kernel", "none"],
        default="auto",
        help="the trainer's own noise: kernel (another attention kernel; auto with an HF trainer), none",
    )
    rp.add_argument("--trust-remote-code", action="store_true")
    rp.add_argument(
        "--recorded-only",
        action="store_true",
        help="pool the dump's own pair (its rollout against its trainer logprobs) without loading any engine; "
        "a run's directory is replayed this way unless --side is given",
    )
    t = rp.add_argument_group("a run's directory of step dumps: the trend over its steps")
    t.add_argument("--steps", metavar="N,A-B,C-", help="only these steps (e.g. 1-10,12 or 100-: from 100 on)")
    t.add_argument(
        "--follow",
        action="store_true",
        help="watch the directory and replay each step as it lands (after its marker, or once its files stop "
        "growing), appending to the same trend; one line per step on stdout (--json: a JSON object per line)",
    )
    t.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="FIGURE>LIMIT",
        help="a gate judged as each step lands, e.g. k3>0.001 or outside_0.8_1.2>0.02 (repeatable): the first "
        "breach prints 'PARITY GATE FAILED ...' and ends with exit code 1",
    )
    t.add_argument("--keep-going", action="store_true", help="a gate breach is reported, the follow goes on")
    t.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="a step without a completion marker is complete once its files are unchanged this long (s)",
    )
    t.add_argument("--poll", type=float, default=1.0, help="--follow: seconds between looks at the directory")
    t.add_argument("--idle-exit", type=float, help="--follow: end after this many seconds without a new step")
    t.add_argument("--until-step", type=int, help="--follow: end once this step is replayed")
    _add_cluster_args(rp)
    _add_output_args(rp)
    _add_config_args(rp)
    rp.set_defaults(func=cmd_replay)

    rs = sub.add_parser("resume", help="go on with a stopped, failed or interrupted workload or replay run")
    rs.add_argument("id", help="the workload or replay run's id")
    rs.add_argument("--per-prompt", action="store_true", help="also list every prompt")
    _add_cluster_args(rs)
    _add_output_args(rs)
    rs.set_defaults(func=cmd_resume)

    cfg = sub.add_parser("config", help="the canonical config")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    show = cfg_sub.add_parser("show", help="print the mapping table: canonical key -> what each side gets")
    show.add_argument("--model", default="demo")
    show.add_argument("--trust-remote-code", action="store_true")
    show.add_argument("--yaml", action="store_true", help="print the resolved config as YAML instead")
    _add_config_args(show)
    show.set_defaults(func=cmd_config_show)

    runs = sub.add_parser("runs", help="stored runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    ls = runs_sub.add_parser("list", help="newest first")
    ls.add_argument("--search", help="matches id, model, sides, prompt and error text")
    ls.add_argument("--model")
    ls.add_argument("--status", choices=["ok", "diverged", "error", "cancelled", "interrupted", "running"])
    ls.add_argument("--limit", type=int, default=50)
    _add_output_args(ls, progress=False)
    ls.set_defaults(func=cmd_runs_list)
    sh = runs_sub.add_parser("show", help="one run")
    sh.add_argument("id")
    sh.add_argument("--prompt", type=int, help="only this prompt (a workload's: its token-level comparison)")
    _add_output_args(sh, progress=False)
    sh.set_defaults(func=cmd_runs_show)

    rp = sub.add_parser("report", help="write a stored run as one self-contained HTML page")
    rp.add_argument("id")
    rp.add_argument("-o", "--output", help="file to write (default parity-run-ID.html)")
    _add_output_args(rp, as_json=False, progress=False)
    rp.set_defaults(func=cmd_report)

    ly = sub.add_parser(
        "layers",
        help="where inside the model two sides of a stored run part: per-layer errors against a measured noise floor",
    )
    ly.add_argument("id", help="a stored run's id")
    ly.add_argument("--prompt", type=int, default=0, help="which prompt of the run (default 0)")
    ly.add_argument("--position", type=int, help="generated-token position to examine (default: the divergence)")
    ly.add_argument(
        "--sides", help="two side names, e.g. ref,b (default: the reference and the first side that diverged)"
    )
    ly.add_argument(
        "--ops",
        action="store_true",
        help="the op map: every layer x op (norms, q/k/v, attention, o_proj, MLP or router/experts) x token, the "
        "error each op adds against a measured floor",
    )
    ly.add_argument(
        "--window",
        help="the op map's positions: N (the last N), A:B (positions A..B-1 of the prompt and tokens) or all "
        "(default: every position that fits in memory); implies --ops",
    )
    ly.add_argument(
        "--swap",
        metavar="LAYER.OP",
        help="the causal check: run side b again with side a's output of this op (e.g. 3.q, 0.down, final.norm) "
        "swapped in; does the divergence disappear? implies --ops",
    )
    _add_output_args(ly)
    ly.set_defaults(func=cmd_layers)

    bi = sub.add_parser(
        "bisect",
        help="which setting is it? the smallest set of the two sides' differing settings "
        "whose flipping to the reference's values restores parity (delta debugging)",
    )
    bi.add_argument("id", help="a stored run's id")
    bi.add_argument(
        "--sides",
        help="the reference and the diverging side, e.g. ref,b (default: the reference and the "
        "first side that diverged)",
    )
    bi.add_argument("--prompts", type=int, default=8, help="the run's worst N prompts each trial runs (default 8)")
    bi.add_argument(
        "--max-trials",
        type=int,
        help="stop after this many trials (the best set so far and what is undecided are reported)",
    )
    _add_output_args(bi)
    bi.set_defaults(func=cmd_bisect)

    pr = sub.add_parser("probe", help="determinism: one prompt N times alone and N times in batches, per side")
    _add_single_prompt_args(pr)
    pr.add_argument("--n", type=int, default=4, help="repetitions per mode (>= 2)")
    pr.add_argument("--batch", type=int, default=4, help="batch size for the batched repetitions (>= 2)")
    pr.set_defaults(func=cmd_probe)

    sw = sub.add_parser("sweep", help="one prompt across a grid of settings: which ones move the divergence")
    _add_single_prompt_args(sw)
    sw.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="KEY=V1,V2",
        help="a config key and its values, e.g. dtype=float32,bfloat16 or b.enforce_eager=true,false; repeatable",
    )
    sw.set_defaults(func=cmd_sweep)

    au = sub.add_parser(
        "audit",
        help="certify zero: every invariance axis of every side (replay, batch, order, prefix cache, prefill "
        "vs decode, chunked prefill, a second instance, CUDA graphs, async scheduling, TP, attention kernels), "
        "token ids and logprob bits exactly, with a control that must fail",
    )
    au.add_argument("--model", default="demo", help="'demo', a folder, or an HF id")
    au.add_argument(
        "--prompt-file",
        help=".txt (one prompt), .jsonl or .parquet (many); default: the built-in mixed-length set",
    )
    au.add_argument("--field", help="the prompt's key or column in a .jsonl/.parquet file")
    au.add_argument("--limit", type=int, help="the file's first N prompts")
    au.add_argument("--prompts", type=int, default=8, help="the built-in set's size (default 8)")
    au.add_argument(
        "--longest", type=int, default=600, help="the built-in set's longest prompt, in words (default 600)"
    )
    au.add_argument(
        "--axes",
        help="comma-separated axes (default all): replay, batch, order, prefix, prefill_decode, chunked, "
        "instance, graphs, async, tp, attention",
    )
    au.add_argument("--batch", type=int, help="the full batch's size (default: every prompt in one batch)")
    au.add_argument(
        "--control-setting",
        action="store_true",
        help="also the setting control: the first side with its dtype flipped (float32 <-> bfloat16) must break "
        "(one engine more; the planted one-ulp control always runs)",
    )
    au.add_argument(
        "--control-set",
        metavar="OPTION=VALUE",
        help="the setting control's change instead of the dtype, e.g. fp32_logits=true (implies --control-setting)",
    )
    au.add_argument(
        "--certify",
        action="store_true",
        help="exit 0 only when every applicable axis is identical and the control was detected; write the "
        "evidence (JSON and HTML)",
    )
    au.add_argument(
        "--evidence", metavar="PATH", help="where the evidence goes: PATH.json and PATH.html (default parity-audit-ID)"
    )
    au.add_argument("--seed", type=int, default=0, help="the shuffled pass's order (default 0)")
    au.add_argument("--chat", action="store_true", help="apply the model's chat template (once)")
    au.add_argument("--trust-remote-code", action="store_true")
    _add_output_args(au, json_help="print the certificate as one JSON object (on stdout; progress stays on stderr)")
    _add_config_args(au)
    au.set_defaults(func=cmd_audit)

    ck = sub.add_parser(
        "check",
        help="a CI gate: run a spec's cases, judge thresholds, baseline and control; "
        "JUnit and Markdown out; exit 0 pass, 1 fail, 2 error",
    )
    ck.add_argument("spec", nargs="?", help="the gate spec (YAML; see docs/ci-gate.md)")
    ck.add_argument(
        "--self-test",
        action="store_true",
        help="run a built-in spec (HF fp32 vs vLLM fp32; control: vLLM bf16) that must pass, and whose "
        "control must fail",
    )
    ck.add_argument("--model", help="the self-test's model (default demo)")
    ck.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="CASE",
        help="run only this case (repeatable, or comma-separated)",
    )
    ck.add_argument("--junit", metavar="FILE", help="write JUnit XML (a test per case x threshold x side)")
    ck.add_argument(
        "--markdown",
        metavar="FILE",
        help="write a Markdown summary (also appended to $GITHUB_STEP_SUMMARY when that is set)",
    )
    ck.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key in every case (e.g. max_new_tokens=8); repeatable",
    )
    ck.add_argument("--limit", type=int, help="at most N prompts per case (a quick local run of a CI spec)")
    _add_output_args(ck, json_help="print the results as one JSON object")
    ck.set_defaults(func=cmd_check)

    wt = sub.add_parser(
        "weights",
        help="did the weights land? a vLLM started from --from receives --model in flight, then every tensor is "
        "checked against --model loaded fresh, and a logprob probe against the noise floor; exit 0 equal, "
        "1 not, 2 error",
    )
    wt.add_argument("--model", required=True, help="the checkpoint the engine should serve now (B): a folder or 'demo'")
    wt.add_argument("--from", metavar="A", help="the checkpoint the engine starts from; --model is pushed into it")
    wt.add_argument("--url", help="instead of --from: a running vLLM server (its /v1 base) updated elsewhere")
    wt.add_argument("--served-model", help="with --url: the model name the server serves (unset: its only one)")
    wt.add_argument("--skip", metavar="REGEX", help="checkpoint tensors left out of the push (a planted stale tensor)")
    wt.add_argument("--zero", metavar="REGEX", help="checkpoint tensors pushed as zeros (a planted fault)")
    wt.add_argument(
        "--sleep",
        type=int,
        nargs="?",
        const=1,
        default=0,
        choices=(0, 1, 2),
        help="push around a sleep/wake cycle of this level (--sleep alone: 1); vLLM's CPU build has no sleep mode",
    )
    wt.add_argument(
        "--update-path",
        choices=("auto", "load_weights", "reload"),
        default="auto",
        help="model.load_weights (RL frameworks' path) or vLLM's reload_weights; auto: reload on the CPU build",
    )
    wt.add_argument("--dtype", default="auto", help="every side's dtype (auto: the model's)")
    wt.add_argument("--probe-tokens", type=int, default=256, help="forced tokens the probe scores per side")
    wt.add_argument("--probe-sequences", type=int, default=8, help="sequences they are spread over")
    wt.add_argument("--no-probe", action="store_true", help="tensors only (no hf side, no probe)")
    wt.add_argument(
        "--vllm",
        dest="vllm_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of both vLLM sides (e.g. enforce_eager=true, tensor_parallel_size=2); repeatable",
    )
    wt.add_argument("--trust-remote-code", action="store_true")
    _add_output_args(wt, json_help="print the report as one JSON object (on stdout; progress stays on stderr)")
    wt.set_defaults(func=cmd_weights)
    return ap


AHEAD = {
    "compare",
    "replay",
    "resume",
    "layers",
    "bisect",
    "probe",
    "sweep",
    "check",
    "audit",
    "weights",
}  # commands that load a tokenizer


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None and getattr(args, "command", None) in AHEAD:  # a fresh process (not a test calling main)
        from .inputs.prompts import import_tokenizers_ahead

        import_tokenizers_ahead(getattr(args, "model", None))
    try:
        return args.func(args)
    except ParityError as e:  # anything not already turned into a stored run
        print(f"parity: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("parity: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
