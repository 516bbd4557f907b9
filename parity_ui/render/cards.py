"""Small HTML cards: run summary, sides, settings diff, error, model info, progress. Pure functions,
everything escaped. Shared by the app and the static report."""

from __future__ import annotations

from ..analysis.crossscore import key as cross_key
from ..core.config import decoding_text
from ..core.figures import count
from ..core.fixes import Place, fix_text
from ..core.runlog import PHASES
from ..core.settings import settings_diff
from ..core.types import Comparison, Finding, ModelInfo, PromptResult, Run
from .markup import esc  # noqa: F401 - other modules take esc from here too
from .sections import SECTIONS

_FIX = " Fix: "


def split_fix(message: str) -> tuple[str, str]:
    """ParityError's str() is 'message Fix: fix'; stored runs keep only that string."""
    if _FIX in message:
        msg, fix = message.split(_FIX, 1)
        return msg, fix
    return message, ""


def error_html(message: str, fix: str = "", title: str = "Error") -> str:
    fix_html = f'<div class="pc-fix"><b>Fix:</b> {esc(fix)}</div>' if fix else ""
    return (
        f'<div class="pc-card pc-error" role="alert"><div class="pc-title">{esc(title)}</div>'
        f'<div class="pc-msg">{esc(message)}</div>{fix_html}</div>'
    )


def notice_html(message: str) -> str:
    return f'<div class="pc-card pc-notice">{esc(message)}</div>'


def _params(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def model_html(info: ModelInfo, label: str = "") -> str:
    rows = [
        ("architecture", info.architecture or info.model_type or "unknown"),
        ("parameters", _params(info.num_parameters)),
        (
            "dtype in config",
            info.config_dtype or ("not stated" + (f" (weights: {info.weights_dtype})" if info.weights_dtype else "")),
        ),
        ("max context", f"{info.max_position_embeddings:,}" if info.max_position_embeddings else "not stated"),
        ("chat template", "yes" if info.has_chat_template else "no"),
        ("folder", info.path),
    ]
    if info.num_experts:  # routes follow the model: on here unless the config sets them off
        rows.insert(
            1,
            (
                "experts",
                f"mixture of experts ({info.num_experts} experts, top-{info.experts_per_token}): "
                "routes recorded unless routes is off",
            ),
        )
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    warn = (
        '<div class="pc-warn">trust_remote_code is ON: this model\'s own Python code will run.</div>'
        if info.trust_remote_code
        else ""
    )
    return (
        f'<div class="pc-card pc-model"><div class="pc-title">{esc(label or info.name)}</div>'
        f'<table class="pc-kv">{cells}</table>{warn}</div>'
    )


def _badge(run: Run) -> str:
    if run.kind == "replay" and run.status in ("ok", "diverged"):  # forced tokens cannot part: the gaps tell
        return '<span class="pc-badge ok">REPLAYED</span>'
    if run.status == "ok":
        return '<span class="pc-badge ok">IDENTICAL</span>'
    if run.status == "diverged":
        return f'<span class="pc-badge div">DIVERGED at token {run.first_divergence}</span>'
    if run.status == "cancelled":
        return '<span class="pc-badge cancel">CANCELLED</span>'
    if run.status == "running":
        return '<span class="pc-badge cancel">RUNNING</span>'
    if run.status == "interrupted":
        return '<span class="pc-badge cancel">INTERRUPTED</span>'
    return '<span class="pc-badge err">ERROR</span>'


def _tok(text: str) -> str:
    return f'<code class="pc-tok">{esc(repr(text))}</code>'


def divergence_line(c: Comparison, forced: bool = False, sampled: bool = False) -> str:
    """One pair's line; `forced`: a replay's row, every side scoring the run's own tokens, so "identical
    tokens" says nothing and the logprob gap is the finding; `sampled`: drawn tokens, where vLLM's
    greedy top-k acceptance rule says nothing (a sampled token is seldom in the other's top-k)."""
    pair = f"<b>{esc(c.b)}</b> vs <b>{esc(c.a)}</b>"
    if forced:
        gap = f"; max |logprob gap| {c.max_abs_gap:.3g}" if c.max_abs_gap is not None else ""
        return f"<div>{pair}: {c.compared} forced tokens (the run's own, on every side){gap}.</div>"
    if c.identical:
        # Equal ids are not equal bits: say which, so "identical" never hides a logprob that moved
        # (an audit's broken axis often has every id held and the bits apart).
        if c.max_abs_gap is None:
            gap = ""
        elif c.max_abs_gap == 0:
            gap = "; their logprobs equal too (max |logprob gap| 0)"
        else:
            gap = f"; their logprobs are not: max |logprob gap| {c.max_abs_gap:.3g}"
        return f"<div>{pair}: all {c.compared} generated tokens identical{gap}.</div>"
    d = c.divergence
    gap = f" Max |logprob gap| before it: {c.max_abs_gap:.3g}." if c.max_abs_gap is not None else ""
    if d is None:
        return f"<div>{pair}: first divergence at generated token {c.first_divergence}.{gap}</div>"
    if d.reason == "length":
        return (
            f"<div>{pair}: one side stopped at token {c.first_divergence}: {esc(c.a)} made {c.lengths[0]} "
            f"tokens, {esc(c.b)} {c.lengths[1]}.{gap}</div>"
        )
    rule = ""
    if d.accepted is not None and not sampled:
        rule = (
            " Each token is in the other side's top-k (vLLM's own test rule accepts this)."
            if d.accepted
            else " At least one token is NOT in the other side's top-k."
        )
    return (
        f"<div>{pair}: at generated token <b>{c.first_divergence}</b> {esc(c.a)} chose {_tok(d.texts[0])} "
        f"(id {d.token_ids[0]}), {esc(c.b)} chose {_tok(d.texts[1])} (id {d.token_ids[1]}).{rule}{gap}</div>"
    )


def _explanation(c: Comparison) -> str:
    e = c.explanation
    if e is None or not (e.verdict or e.summary):
        return ""
    return f'<div class="pc-verdict"><b>{esc(e.verdict)}</b> {esc(e.summary)}</div>'


def _cross_scores(c: Comparison, sampled: bool = False) -> str:
    cs = c.cross_scores
    if cs is None or not (cs.directions or cs.error):
        return ""
    if cs.error is not None:
        return f'<div class="pc-muted">cross-scoring failed: {esc(cs.error)}</div>'
    rows = []
    for gen, scorer in ((c.b, c.a), (c.a, c.b)):
        s = cs.get(cross_key(gen, scorer))
        if s is None or s.rms_gap is None:
            continue
        r = s.importance_ratio
        ratio = f"ratio {r.min:.3f}..{r.max:.3f}, " if r is not None else ""
        # Greedy only: where the scorer's argmax is another token. Sampling draws, so its argmax means nothing.
        argmax = (
            "" if sampled else f", {count(s.other_disagrees, 'position')} where {esc(scorer)} would pick another token"
        )
        rows.append(
            f"<tr><th>{esc(gen)}'s tokens scored by {esc(scorer)}</th><td>RMS gap {s.rms_gap:.3g}, "
            f"max {s.max_abs_gap:.3g} nats, {100 * (s.share_outside_band or 0):.1f}% outside [0.9, 1.1]"
            f"{', ' + ratio.rstrip(', ') if ratio else ''}{argmax}</td></tr>"
        )
    if not rows:
        return ""
    return (
        f'<details class="pc-cross"><summary>teacher-forced cross-scores ({esc(c.b)} and {esc(c.a)})</summary>'
        f'<table class="pc-kv">{"".join(rows)}</table></details>'
    )


def findings_html(findings: list[Finding], place: Place = "app") -> str:
    if not findings:
        return ""
    items = []
    for f in findings:
        sev = f.severity if f.severity in ("info", "warning", "error") else "info"
        fix = fix_text(f, place)
        fix_html = f' <span class="pc-fixinline">Fix: {esc(fix)}</span>' if fix else ""
        items.append(f'<li class="sev-{sev}"><b>{esc(f.code)}</b>: {esc(f.message)}{fix_html}</li>')
    return f'<ul class="pc-findings">{"".join(items)}</ul>'


def _timings(p: PromptResult) -> str:
    out = []
    for name, r in p.results.items():
        t = r.timings
        parts = [f"{len(r.token_ids)} tokens", f"finish {r.finish_reason or '?'}"]
        for what, v in (("load", t.load_s), ("first token", t.prefill_s), ("total", t.total_s)):
            if v is not None:
                parts.append("loaded before (warm)" if what == "load" and v == 0 else f"{what} {v:.2f}s")
        out.append(f"<div><b>{esc(name)}</b>: {esc(', '.join(parts))}</div>")
    return "".join(out)


def phases_html(run: Run) -> str:
    """Where the run's time went, per phase."""
    if not run.timings:
        return ""
    total = sum(run.timings.values()) or 1.0
    cells = "".join(
        f"<td>{esc(name)}<br><b>{run.timings[name]:.2f}s</b><br>{100 * run.timings[name] / total:.0f}%</td>"
        for name in PHASES
        if name in run.timings
    )
    return f'<table class="pc-phases"><tr>{cells}</tr></table>'


def sides_html(run: Run) -> str:
    """The sides as they ran: kind, model folder, environment, device, dtype, versions, load time."""
    if not run.sides:
        return ""
    rows = []
    for s in run.sides:
        ref = ' <span class="pt-ref">reference</span>' if s.reference else ""
        versions = ", ".join(f"{k} {v}" for k, v in s.versions.items())
        # 0 exactly: the side's worker was loaded by an earlier run and reused (no load in this run).
        load = "–" if s.load_s is None else "warm" if s.load_s == 0 else f"{s.load_s:.1f}s"
        rows.append(
            f"<tr><th>{esc(s.name)}{ref}</th><td>{esc(s.kind)}</td><td>{esc(s.dtype)}</td>"
            f"<td>{esc(s.device)}</td><td>{esc(versions)}</td><td>{esc(s.python or 'this environment')}</td>"
            f"<td>{load}</td></tr>"
        )
    return (
        '<table class="pc-sides"><tr><th>side</th><th>kind</th><th>dtype</th><th>device</th><th>versions</th>'
        f"<th>environment</th><th>load</th></tr>{''.join(rows)}</table>"
    )


def settings_html(run: Run, open_: bool = False) -> str:
    """Resolved runtime settings side by side, the rows that differ first (and marked)."""
    rows = settings_diff(run.sides)
    if not rows or not any(s.resolved for s in run.sides):
        return ""
    names = [s.name for s in run.sides]
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    body = "".join(
        f'<tr class="{"diff" if r.differs else ""}"><th>{esc(r.label)}</th>'
        + "".join(f"<td>{esc(r.values[n])}</td>" for n in names)
        + "</tr>"
        for r in rows
    )
    n_diff = sum(r.differs for r in rows)
    return (
        f'<details class="pc-settings"{" open" if open_ else ""}><summary>resolved settings: {n_diff} differ '
        f'between the sides</summary><table class="pc-setting-table"><tr><th>setting</th>{head}</tr>{body}'
        "</table></details>"
    )


def _sections(c: Comparison) -> str:
    """Each measure's part of the comparison's card (routes: the layer x token grid)."""
    return "".join(s.comparison_html(c) for s in SECTIONS)


def run_summary_html(run: Run, prompt_index: int = 0, reveal: bool = False) -> str:
    """The card above the panes: verdict per side, what ran where, and the run's id and permalink."""
    dtypes = "/".join(dict.fromkeys(s.dtype for s in run.sides if s.dtype)) or run.config.get("dtype")
    meta = [f"model <b>{esc(run.model.name)}</b>"] + ([f"dtype {esc(dtypes)}"] if dtypes else [])
    if run.sides:
        meta.append("sides " + " · ".join(esc(s.name) + (" (ref)" if s.reference else "") for s in run.sides))
    if run.device:
        meta.append(f"device {esc(run.device)}")
    sampled = float(run.config.get("temperature") or 0.0) > 0.0
    if sampled:  # never read as greedy: the decoding is named on the card
        meta.append(esc(decoding_text(run.config)))
    body = [f'<div class="pc-head">{_badge(run)}<span class="pc-meta">{" · ".join(meta)}</span></div>']
    if run.status in ("error", "cancelled", "interrupted") and run.error:
        msg, fix = split_fix(run.error)
        title = {"error": "Run failed", "cancelled": "Run stopped", "interrupted": "Run interrupted"}[run.status]
        body.append(error_html(msg, fix, title))
    if run.prompts and 0 <= prompt_index < len(run.prompts):
        p = run.prompts[prompt_index]
        if len(run.prompts) > 1:
            body.append(f"<div>Prompt {prompt_index} of {len(run.prompts)}.</div>")
        for c in p.comparisons:
            body += [
                divergence_line(c, run.kind == "replay", sampled),
                _explanation(c),
                _cross_scores(c, sampled),
                _sections(c),
            ]
        body.append(
            f'<details class="pc-timings"><summary>per side and per phase timings</summary>{_timings(p)}'
            f"{phases_html(run)}</details>"
        )
    return finish_card(run, body, "run", "pc-summary", reveal)


def finish_card(run: Run, body: list[str], label: str, css: str, reveal: bool) -> str:
    """A run card's common end (its sides, settings, findings and a footer linking the run), wrapped:
    `label` names the run in the footer, `css` the card's kind."""
    body = [*body, sides_html(run), settings_html(run), findings_html(run.warnings, "app")]
    when = run.created_utc[:19].replace("T", " ")
    body.append(
        f'<div class="pc-foot">{esc(label)} <a href="?run={esc(run.id)}" class="pc-runlink">{esc(run.id)}</a>'
        f" · {esc(when)} UTC · parity-ui {esc(run.versions.get('parity_ui', ''))}</div>"
    )
    attrs = ' data-reveal="1"' if reveal else ""
    return (
        f'<div class="pc-card {css}" data-run="{esc(run.id)}" data-status="{esc(run.status)}"{attrs}>'
        f"{''.join(body)}</div>"
    )


def status_progress_html(phase: str, lines: list[str], elapsed: float) -> str:
    """A command that tells where it is in status lines (an audit's axes, a weight check's steps), in
    progress: its phase, the time so far, its last lines."""
    log = "".join(f"<li>{esc(x)}</li>" for x in lines)
    return (
        f'<div class="pc-card pc-progress pc-status-progress"><div class="pc-title">{esc(phase)} '
        f'<span class="pp-time">{elapsed:.1f}s</span></div><ul class="pp-log">{log}</ul></div>'
    )


def progress_html(
    phase: str,
    lines: list[str],
    counts: dict[str, int],
    expected: int | None,
    elapsed: float,
    states: dict[str, str] | None = None,
) -> str:
    """The live status box: the current phase, tokens so far per side and what each side is doing
    (`states`: loading, waiting for another side, warming up its first call...), elapsed time."""
    bars = []
    for name, n in counts.items():
        pct = min(100, 100 * n / expected) if expected else 0
        total = f" / {expected}" if expected else ""
        state = (states or {}).get(name)
        doing = f' <span class="pp-state">· {esc(state)}</span>' if state else ""
        bars.append(
            f'<div class="pp-row" data-side="{esc(name)}"><span class="pp-name">{esc(name)}</span>'
            f'<span class="pp-bar"><span style="width:{pct:.0f}%"></span></span>'
            f'<span class="pp-n">{n}{total} tokens{doing}</span></div>'
        )
    log = "".join(f"<li>{esc(x)}</li>" for x in lines[-4:])
    return (
        f'<div class="pc-card pc-progress"><div class="pc-title">{esc(phase)} '
        f'<span class="pp-time">{elapsed:.1f}s</span></div>{"".join(bars)}<ul class="pp-log">{log}</ul></div>'
    )
