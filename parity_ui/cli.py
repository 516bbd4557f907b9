"""The `parity` command: thin commands over the service and the store.

Exit codes of `parity compare`: 0 identical, 1 diverged, 2 error (message on stderr).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .config import PRESETS, ParityConfig, build_config, load_config_file, apply_overrides
from .errors import ParityError, PromptError
from .prompts import PromptSpec, read_prompt_file
from .types import Run, to_dict

EXIT_IDENTICAL, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="canonical config, YAML or JSON")
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset (before --config and --set)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key (dotted for sections: vllm.enforce_eager=true); repeatable")


def _config(args: argparse.Namespace) -> ParityConfig:
    base = dict(PRESETS[args.preset]) if getattr(args, "preset", None) else {}
    overrides = list(args.overrides)
    if getattr(args, "chat", False):
        overrides.append("chat=true")
    return build_config(args.config, overrides, base=base)


def _raw_config(args: argparse.Namespace) -> dict[str, Any]:
    """What the user asked for, even when invalid, for the stored error row."""
    try:
        data = load_config_file(args.config) if args.config else {}
        return apply_overrides(data, args.overrides)
    except ParityError:
        return {"overrides": args.overrides, "config_file": args.config}


def _prompts(args: argparse.Namespace) -> list[PromptSpec]:
    if args.prompt is not None:
        if not args.prompt.strip():
            raise PromptError("the prompt is empty", "give --prompt 'some text' or --prompt-file FILE")
        return [PromptSpec(text=args.prompt)]
    return read_prompt_file(args.prompt_file)


def _service(args: argparse.Namespace) -> Any:
    from .service import ParityService

    return ParityService(db_path=args.db)


def cmd_compare(args: argparse.Namespace) -> int:
    from .service import RunRequest

    service = _service(args)
    try:
        try:
            prompts = _prompts(args)
            cfg = _config(args)
        except ParityError as e:
            specs = [PromptSpec(text=args.prompt)] if args.prompt else \
                [PromptSpec(text=f"(prompt file {args.prompt_file})")]
            run = service.record_failure(args.model, specs, _raw_config(args), e)
            return _report(run, args)
        run = service.run(RunRequest(model=args.model, prompts=prompts, config=cfg,
                                     trust_remote_code=args.trust_remote_code),
                          on_event=_progress if not args.json and not args.quiet else None)
        return _report(run, args)
    finally:
        service.close()


def _progress(event: Any) -> None:
    if event.kind == "status":
        print(f"[parity] {event.message}", file=sys.stderr)


def run_json(run: Run) -> dict[str, Any]:
    """The --json object: stable top-level keys, per-engine streams under `prompts`."""
    prompts = []
    for p in run.prompts:
        entry: dict[str, Any] = {
            "index": p.index, "prompt_tokens": len(p.prompt_token_ids),
            "identical": p.comparison.identical if p.comparison else None,
            "first_divergence": p.comparison.first_divergence if p.comparison else None,
            "comparison": to_dict(p.comparison), "explanation": p.explanation, "cross_scores": p.cross_scores,
        }
        for name in ("vllm", "hf"):
            res = getattr(p, name)
            entry[name] = None if res is None else {
                "token_ids": res.token_ids, "text": res.text,
                "logprobs": [s.logprob for s in res.steps], "finish_reason": res.finish_reason,
                "timings": to_dict(res.timings), "error": res.error,
                "top_logprobs": [[{"token_id": t.token_id, "logprob": t.logprob} for t in s.top] for s in res.steps],
            }
        prompts.append(entry)
    first = prompts[0] if prompts else {}
    return {
        "run_id": run.id, "status": run.status, "identical": run.identical,
        "first_divergence": run.first_divergence, "error": run.error, "config": run.config,
        "model": to_dict(run.model), "device": run.device, "versions": run.versions,
        "engines": to_dict(run.engines), "warnings": to_dict(run.warnings),
        "explanation": first.get("explanation"), "cross_scores": first.get("cross_scores"),
        "probes": run.probes, "duration_ms": run.duration_ms,
        # The first prompt's streams at the top level: the common single-prompt case reads simply.
        "vllm": first.get("vllm"), "hf": first.get("hf"),
        "prompts": prompts,
    }


def _exit_code(run: Run) -> int:
    if run.status in ("error", "cancelled"):
        return EXIT_ERROR
    return EXIT_IDENTICAL if run.identical else EXIT_DIVERGED


def _report(run: Run, args: argparse.Namespace) -> int:
    if run.status in ("error", "cancelled"):
        print(f"parity: error: {run.error}", file=sys.stderr)
        print(f"parity: stored as run {run.id}", file=sys.stderr)
    if args.json:
        print(json.dumps(run_json(run), indent=None))
    elif run.status not in ("error", "cancelled"):
        print(format_summary(run))
    return _exit_code(run)


def format_summary(run: Run) -> str:
    ran = run.engines["hf"].dtype if "hf" in run.engines else None
    asked = run.config.get("dtype")
    dtype = f"{ran} (auto)" if ran and asked == "auto" else (ran or asked)
    lines = [f"run {run.id}: {run.status.upper()}  model={run.model.name}  dtype={dtype}  device={run.device}"]
    if run.versions:
        lines.append("  " + "  ".join(f"{k} {v}" for k, v in run.versions.items()))
    for w in run.warnings:
        lines.append(f"  [{w.severity}] {w.code}: {w.message}" + (f" Fix: {w.fix}" if w.fix else ""))
    for p in run.prompts:
        c = p.comparison
        lines.append(f"prompt {p.index}: {len(p.prompt_token_ids)} prompt tokens")
        for name in ("vllm", "hf"):
            r = getattr(p, name)
            if r is not None:
                t = r.timings
                lines.append(f"  {name:4s}: {len(r.token_ids)} tokens, finish={r.finish_reason}, "
                             f"load {_s(t.load_s)}, first token {_s(t.prefill_s)}, total {_s(t.total_s)}")
        if p.cross_scores:
            from .crossscore import summary_line

            lines.append(f"  teacher-forced: {summary_line(p.cross_scores)}")
        if c is None:
            continue
        gap = f"{c.max_abs_gap:.3g}" if c.max_abs_gap is not None else "n/a"
        if c.identical:
            lines.append(f"  IDENTICAL for all {c.compared} tokens; max |logprob gap| {gap}")
            continue
        d = c.divergence
        lines.append(f"  FIRST DIVERGENCE at generated token {c.first_divergence} "
                     f"(max |logprob gap| before it: {gap})")
        if d is not None and d.reason == "length":
            lines.append(f"    one engine stopped: vLLM made {c.length_vllm} tokens, HF {c.length_hf}")
        elif d is not None:
            lines.append(f"    vLLM chose {d.vllm_token_text!r} (id {d.vllm_token_id}), "
                         f"HF chose {d.hf_token_text!r} (id {d.hf_token_id})")
            if d.accepted_by_vllm_rule is not None:
                lines.append(f"    each in the other's top-k (vLLM's acceptance rule): "
                             f"{'yes' if d.accepted_by_vllm_rule else 'no'}")
        if p.explanation and p.explanation.get("verdict"):
            lines.append(f"    verdict: {p.explanation['verdict']}: {p.explanation.get('summary', '')}")
        if p.vllm is not None and c.first_divergence:
            prefix = "".join(s.text for s in p.vllm.steps[: c.first_divergence])
            lines.append(f"    matched prefix: {prefix[-120:]!r}")
    return "\n".join(lines)


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}s"


def cmd_config_show(args: argparse.Namespace) -> int:
    from .mapping import format_table

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
    print(format_table(rows))
    return 0


def cmd_runs_list(args: argparse.Namespace) -> int:
    from .store import list_runs, open_db

    db = open_db(args.db)
    rows = list_runs(db, search=args.search, model=args.model, status=args.status, limit=args.limit)
    if args.json:
        print(json.dumps([to_dict(r) for r in rows]))
        return 0
    print(f"{'id':26}  {'when (UTC)':19}  {'status':9}  {'first div':9}  {'model':24}  {'dtype':8}  prompt")
    for r in rows:
        fd = "-" if r.first_divergence is None else str(r.first_divergence)
        print(f"{r.id:26}  {r.datetime_utc[:19]:19}  {r.status:9}  {fd:9}  {r.model[:24]:24}  "
              f"{str(r.dtype or '')[:8]:8}  {r.prompt_excerpt[:50] if not r.error else 'ERROR: ' + r.error[:43]}")
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    from .store import get_run, open_db

    run = get_run(open_db(args.db), args.id)
    if run is None:
        print(f"parity: error: no run with id {args.id!r} in {args.db or 'runs.db'}. "
              "Fix: list the ids with 'parity runs list'", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(run_json(run)))
    else:
        print(format_summary(run) if run.status not in ("error",) else
              f"run {run.id}: ERROR ({run.error_code}): {run.error}")
    return 0


def _single_prompt(args: argparse.Namespace) -> PromptSpec:
    if not args.prompt.strip():
        raise PromptError("the prompt is empty", "give --prompt 'some text'")
    return PromptSpec(text=args.prompt)


def cmd_probe(args: argparse.Namespace) -> int:
    from .probes import format_probe, run_probe

    service = _service(args)
    try:
        run = run_probe(service, args.model, _single_prompt(args), _config(args), n=args.n, batch=args.batch,
                        trust_remote_code=args.trust_remote_code,
                        emit=_progress if not args.json and not args.quiet else None)
    finally:
        service.close()
    if run.status == "error":
        print(f"parity: error: {run.error}", file=sys.stderr)
    if args.json:
        print(json.dumps(run_json(run)))
    elif run.status != "error":
        print(format_probe(run))
    return _exit_code(run)


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import format_sweep, parse_grid, run_sweep, summarize_sweep

    grid = parse_grid(args.grid)
    base = dict(PRESETS[args.preset]) if args.preset else {}
    overrides = [*args.overrides, *(["chat=true"] if args.chat else [])]
    service = _service(args)
    try:
        sweep = run_sweep(service, args.model, _single_prompt(args), grid, config_path=args.config,
                          overrides=overrides, base=base, trust_remote_code=args.trust_remote_code,
                          emit=_progress if not args.json and not args.quiet else None)
    finally:
        service.close()
    summary = summarize_sweep(sweep)
    print(json.dumps(summary) if args.json else format_sweep(summary))
    statuses = {p["status"] for p in summary["points"]}
    return EXIT_ERROR if statuses & {"error", "cancelled"} else \
        (EXIT_DIVERGED if "diverged" in statuses else EXIT_IDENTICAL)


def _add_single_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo", help="'demo', a folder, or an HF id")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template (once)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--db", default=argparse.SUPPRESS)
    _add_config_args(p)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="parity", description="Compare vLLM and HF transformers token by token.")
    ap.add_argument("--db", default=None, help="run database (default: $PARITY_DB or ./runs.db)")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="run both engines on the same prompt(s), compare, store")
    c.add_argument("--model", default="demo", help="'demo' (bundled SmolLM2-135M-Instruct), a folder, or an HF id")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help=".txt (one prompt) or .jsonl ({\"prompt\"} or {\"messages\"} a line)")
    c.add_argument("--chat", action="store_true", help="apply the model's chat template (once)")
    c.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c.add_argument("--db", default=argparse.SUPPRESS)
    _add_config_args(c)
    c.set_defaults(func=cmd_compare)

    cfg = sub.add_parser("config", help="the canonical config")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    show = cfg_sub.add_parser("show", help="print the mapping table canonical -> vLLM -> HF")
    show.add_argument("--model", default="demo")
    show.add_argument("--trust-remote-code", action="store_true")
    show.add_argument("--yaml", action="store_true", help="print the resolved config as YAML instead")
    _add_config_args(show)
    show.set_defaults(func=cmd_config_show)

    runs = sub.add_parser("runs", help="stored runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    ls = runs_sub.add_parser("list", help="newest first")
    ls.add_argument("--search")
    ls.add_argument("--model")
    ls.add_argument("--status", choices=["ok", "diverged", "error", "cancelled"])
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--db", default=argparse.SUPPRESS)
    ls.set_defaults(func=cmd_runs_list)
    sh = runs_sub.add_parser("show", help="one run")
    sh.add_argument("id")
    sh.add_argument("--json", action="store_true")
    sh.add_argument("--db", default=argparse.SUPPRESS)
    sh.set_defaults(func=cmd_runs_show)

    pr = sub.add_parser("probe", help="determinism: one prompt N times alone and N times in batches, per engine")
    _add_single_prompt_args(pr)
    pr.add_argument("--n", type=int, default=4, help="repetitions per mode (>= 2)")
    pr.add_argument("--batch", type=int, default=4, help="batch size for the batched repetitions (>= 2)")
    pr.set_defaults(func=cmd_probe)

    sw = sub.add_parser("sweep", help="one prompt across a grid of settings: which ones move the divergence")
    _add_single_prompt_args(sw)
    sw.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2",
                    help="a config key and its values, e.g. dtype=float32,bfloat16; repeatable")
    sw.set_defaults(func=cmd_sweep)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
