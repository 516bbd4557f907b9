"""A stored run for people and programs: the terminal summary, the `--json` object (schema 2) and
the static HTML report. Shared by the CLI and the app; imports neither gradio nor plotly.
"""

from __future__ import annotations

import html
from typing import Any

from ..analysis.crossscore import summary_line
from ..core.fixes import fix_text
from ..core.settings import format_text, settings_diff
from ..core.types import Localisation, Run, to_dict
from .sections import SECTIONS, workload_html
from .sections.distribution import distribution_line  # noqa: F401 - re-exported (the CLI summary's line)
from .sections.sampling import sampling_figures, sampling_lines  # noqa: F401 - re-exported

# 1: parity-ui 0.1 (vllm/hf keys); 2: sides; 3: a replay's pairs by name ("recorded vs hf"), verdicts by measure,
# the token figures' k1. Keys schema 3 renamed stay as aliases for one schema version (docs/cli.md).
SCHEMA_VERSION = 3


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}s"


def format_summary(run: Run, prompts: bool = True) -> str:
    """The run as lines for a terminal: sides, the settings that differ, findings with their --set
    fix, and (with `prompts`) per prompt every side against the reference."""
    dtypes = "/".join(dict.fromkeys(s.dtype for s in run.sides if s.dtype)) or run.config.get("dtype")
    lines = [f"run {run.id}: {run.status.upper()}  model={run.model.name}  dtype={dtypes}  device={run.device}"]
    if run.error:
        lines.append(f"  {run.error}")
    for s in run.sides:
        ref = " (reference)" if s.reference else ""
        env = f"  python={s.python}" if s.python else ""
        versions = "  ".join(f"{k} {v}" for k, v in s.versions.items())
        lines.append(
            f"  side {s.name}{ref}: {s.kind}  {s.dtype}  {s.device}  {versions}  load {'warm (loaded before)' if s.load_s == 0 else _s(s.load_s)}{env}"
        )
    rows = [r for r in settings_diff(run.sides) if r.differs]
    if rows and any(s.resolved for s in run.sides):
        lines.append("  resolved settings that differ:")
        lines.append(format_text(rows))
    for w in run.warnings:
        fix = fix_text(w, "cli")
        lines.append(f"  [{w.severity}] {w.code}: {w.message}" + (f" Fix: {fix}" if fix else ""))
    for p in run.prompts if prompts and run.bisect is None else []:  # a bisect: its trials have the tokens
        lines.append(f"prompt {p.index}: {len(p.prompt_token_ids)} prompt tokens")
        for img in p.images:
            tokens = ", ".join(f"{k} {v}" for k, v in (img.get("tokens") or {}).items())
            lines.append(
                f"  image {img.get('name')}: {img.get('width')} x {img.get('height')}"
                + (f", image tokens: {tokens}" if tokens else "")
            )
        for name, r in p.results.items():
            t = r.timings
            lines.append(
                f"  {name:8s}: {len(r.token_ids)} tokens, finish={r.finish_reason}, "
                f"first token {_s(t.prefill_s)}, total {_s(t.total_s)}"
            )
        for c in p.comparisons:
            gap = f"{c.max_abs_gap:.3g}" if c.max_abs_gap is not None else "n/a"
            if c.identical:
                lines.append(f"  {c.b} vs {c.a}: IDENTICAL for all {c.compared} tokens; max |logprob gap| {gap}")
            else:
                d = c.divergence
                lines.append(
                    f"  {c.b} vs {c.a}: FIRST DIVERGENCE at generated token {c.first_divergence} "
                    f"(max |logprob gap| before it: {gap})"
                )
                if d is not None and d.reason == "length":
                    lines.append(f"    one side stopped: {c.a} made {c.lengths[0]} tokens, {c.b} {c.lengths[1]}")
                elif d is not None:
                    lines.append(
                        f"    {c.a} chose {d.texts[0]!r} (id {d.token_ids[0]}), "
                        f"{c.b} chose {d.texts[1]!r} (id {d.token_ids[1]})"
                    )
                    if d.accepted is not None and not float(run.config.get("temperature") or 0.0):  # greedy only
                        lines.append(
                            f"    each in the other's top-k (vLLM's acceptance rule): {'yes' if d.accepted else 'no'}"
                        )
                res_a = p.results.get(c.a)
                if res_a is not None and c.first_divergence:
                    prefix = "".join(s.text for s in res_a.steps[: c.first_divergence])
                    lines.append(f"    matched prefix: {prefix[-120:]!r}")
            if c.explanation and c.explanation.verdict and not c.identical:
                lines.append(f"    verdict: {c.explanation.verdict}: {c.explanation.summary}")
            if c.cross_scores:
                lines.append(f"    teacher-forced: {summary_line(c.cross_scores)}")
            for sec in SECTIONS:  # each measure's lines (the full distribution, routes...)
                lines += sec.comparison_lines(c)
    for sec in SECTIONS:
        lines += sec.run_lines(run)
    if run.timings:
        lines.append("  time per phase: " + "  ".join(f"{k} {v:.2f}s" for k, v in run.timings.items()))
    if run.bisect is not None:
        from ..core.bisect_record import format_bisect

        lines.append(format_bisect(run.bisect, run.id, run.status))
    return "\n".join(lines)


def _stream(res: Any) -> dict[str, Any]:
    return {
        "token_ids": res.token_ids,
        "text": res.text,
        "logprobs": [s.logprob for s in res.steps],
        "finish_reason": res.finish_reason,
        "timings": to_dict(res.timings),
        "error": res.error,
        "top_logprobs": [[{"token_id": t.token_id, "logprob": t.logprob} for t in s.top] for s in res.steps],
        "routes": to_dict(res.routes),  # MoE: packed experts, weights and margins (core.routes), or null
        # Each measure's per-token columns (shared-seed draws, the full distribution); absent when not recorded.
        **{k: v for sec in SECTIONS for k, v in sec.stream_json(res).items()},
    }


def _comparison(c: Any, prompt: int) -> dict[str, Any]:
    return {"prompt": prompt, **to_dict(c)}


def run_json(run: Run) -> dict[str, Any]:
    """The --json object: stable top-level keys; `sides` as they ran, `comparisons` (one per prompt
    and non-reference side), per-side streams under `prompts`."""
    prompts: list[dict[str, Any]] = []
    for p in run.prompts:
        prompts.append(
            {
                "index": p.index,
                "prompt_tokens": len(p.prompt_token_ids),
                "images": p.images,
                "identical": all(c.identical for c in p.comparisons) if p.comparisons else None,
                "first_divergence": min(
                    (c.first_divergence for c in p.comparisons if c.first_divergence is not None), default=None
                ),
                "sides": {name: _stream(r) for name, r in p.results.items()},
                "comparisons": [_comparison(c, p.index) for c in p.comparisons],
            }
        )
    return {
        "schema": SCHEMA_VERSION,
        "run_id": run.id,
        "status": run.status,
        "identical": run.identical,
        "first_divergence": run.first_divergence,
        "error": run.error,
        "error_code": run.error_code,
        "kind": run.kind,
        "group_id": run.group_id,
        "config": run.config,
        "model": to_dict(run.model),
        "device": run.device,
        "versions": run.versions,
        "reference": run.reference,
        "sides": to_dict(run.sides),
        "comparisons": [c for p in prompts for c in p["comparisons"]],
        "settings_diff": [to_dict(r) for r in settings_diff(run.sides)],
        "warnings": to_dict(run.warnings),
        "probes": to_dict(run.probes),
        "timings": run.timings,
        "workload": _workload_json(run),
        "bisect": to_dict(run.bisect),
        "duration_ms": run.duration_ms,
        "prompts": prompts,
        **{k: v for sec in SECTIONS for k, v in sec.run_json(run).items()},  # the sampling family per side
    }


def _workload_json(run: Run) -> Any:
    """The workload's record; a replay's pairs also under their keys from before schema 3 (aliases for
    one schema version: "recorded", "vllm", "recorded~vllm"... beside "recorded vs hf"...)."""
    out = to_dict(run.workload)
    replay = run.workload.replay if run.workload is not None else None
    if replay is not None:
        sides = out["sides"]
        for p in replay.pairs:
            if p.key and p.key != p.name and p.name in sides and p.key not in sides:
                sides[p.key] = sides[p.name]
    return out


WORKLOAD_PANES = 8  # a workload's report shows the token panes of this many prompts: the earliest forks


def workload_report_prompts(run: Run, n: int = WORKLOAD_PANES) -> list[int]:
    """The prompts whose token panes a workload's report shows: each side's earliest forks in turn
    (from its pooled report), up to `n`."""
    w = run.workload
    if w is None:
        return []
    queues = [[x.prompt_index for x in f.stats.worst_by_divergence] for f in w.sides.values()]
    out: list[int] = []
    for k in range(max((len(q) for q in queues), default=0)):
        for q in queues:
            if k < len(q) and q[k] not in out and len(out) < n:
                out.append(q[k])
    return out or ([0] if w.done else [])  # nothing forked: the first prompt, as a sample


def stored_html_report(stored: Any) -> str | None:
    """The static report of a stored run from what the store read for it
    (parity_ui.store.Store.for_report(run_id, workload_report_prompts): a workload's header, its
    prompt rows and the few prompts whose panes it shows; any other run whole). None for None (no
    such run). Reads nothing itself."""
    if stored is None:
        return None
    if getattr(stored, "audit", None) is not None:  # an audit's page is its certificate
        from .audit import audit_page_html

        return audit_page_html(stored.audit, stored.run.id)
    if getattr(stored, "trend", None) is not None:  # a run's trend over its steps: its own page
        from .trend import trend_page

        return trend_page(stored.trend, stored.run)
    rows = None
    if stored.pairs is not None:
        from .workload import prompt_rows

        rows = prompt_rows(stored.pairs, stored.excerpts or {})
    return html_report(stored.run, stored.localisations, stored.images, rows=rows)


def html_report(
    run: Run, localisations: list[Localisation] | None = None, images: Any = None, rows: list[Any] | None = None
) -> str:
    """One self-contained HTML page for a run (no network, no external files): the summary, the
    sides and their resolved settings, each prompt's panes with hover details, the findings. A
    workload's page opens with its section (render.workload: the card, the survival curve and the
    |dlogp| histograms as inline SVG, the figures table and, given its `rows`, the sortable prompt
    table) and shows the panes of its earliest forks only (workload_report_prompts)."""
    from .assets import CSS, JS
    from .cards import run_summary_html, settings_html
    from .images import images_html
    from .report_parts import extra_sections
    from .tokens import Stream, panes_html

    if run.bisect is not None:  # a bisect's page is its trials; its prompts carry no tokens of their own
        from .report_parts import bisect_html

        parts = [bisect_html(run), settings_html(run, open_=True)]
        title = f"parity-ui bisect {run.id}"
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>body{{font-family:system-ui,sans-serif;margin:24px;}}{CSS}</style>{JS}</head><body>"
            f"<h2>{html.escape(title)}</h2>{''.join(parts)}</body></html>"
        )
    prompts = run.prompts
    if run.workload is not None:
        from .workload import workload_section_html

        shown = set(workload_report_prompts(run))
        prompts = [p for p in run.prompts if p.index in shown]
        parts = [workload_section_html(run, rows), settings_html(run, open_=True)]
        own = workload_html(run.workload)  # a replay: its pairs and worst tokens after the workload section
        if own:
            parts.insert(1, own)
        if prompts:
            parts.append(
                f"<h3>The {len(prompts)} prompt(s) that fork earliest</h3><p class=pc-muted>Open any other "
                f"with <code>parity runs show {html.escape(run.id)} --prompt N</code>.</p>"
            )
    else:
        parts = [run_summary_html(run, 0), settings_html(run, open_=True)]
    for p in prompts:
        if len(run.prompts) > 1 or run.workload is not None:
            parts.append(f"<h3>Prompt {p.index}</h3>")
        parts.append(
            f'<details class="pc-prompt"><summary>prompt: {len(p.prompt_token_ids)} tokens</summary>'
            f"<pre>{html.escape(p.prompt_text[:20000])}</pre></details>"
        )
        parts.append(images_html(p.images, images))  # `images`: sha256 -> (bytes, format), e.g. from the store
        divs = {c.b: c.first_divergence for c in p.comparisons}
        streams = [
            Stream(s.name, f"{s.name} ({s.kind})", p.results[s.name].steps, divs.get(s.name))
            for s in run.sides
            if s.name in p.results
        ]
        if streams:
            parts.append(panes_html(streams))
    parts.extend(extra_sections(run, localisations))
    title = f"parity-ui run {run.id}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>body{{font-family:system-ui,sans-serif;margin:24px;}}{CSS}</style>{JS}</head><body>"
        f"<h2>{html.escape(title)}</h2>{''.join(parts)}</body></html>"
    )
