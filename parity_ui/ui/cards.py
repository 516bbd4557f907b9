"""Small HTML cards: run summary, error, model info, progress. Pure functions, everything escaped."""
from __future__ import annotations

import html
from typing import Any

from ..types import Finding, ModelInfo, PromptResult, Run

_FIX = " Fix: "


def esc(value: Any) -> str:
    return html.escape(str(value))


def split_fix(message: str) -> tuple[str, str]:
    """ParityError's str() is 'message Fix: fix'; stored runs keep only that string."""
    if _FIX in message:
        msg, fix = message.split(_FIX, 1)
        return msg, fix
    return message, ""


def error_html(message: str, fix: str = "", title: str = "Error") -> str:
    fix_html = f'<div class="pc-fix"><b>Fix:</b> {esc(fix)}</div>' if fix else ""
    return (f'<div class="pc-card pc-error" role="alert"><div class="pc-title">{esc(title)}</div>'
            f'<div class="pc-msg">{esc(message)}</div>{fix_html}</div>')


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
        ("dtype in config", info.config_dtype or "not stated"),
        ("max context", f"{info.max_position_embeddings:,}" if info.max_position_embeddings else "not stated"),
        ("chat template", "yes" if info.has_chat_template else "no"),
        ("folder", info.path),
    ]
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    warn = ('<div class="pc-warn">trust_remote_code is ON: this model\'s own Python code will run.</div>'
            if info.trust_remote_code else "")
    return (f'<div class="pc-card pc-model"><div class="pc-title">{esc(label or info.name)}</div>'
            f'<table class="pc-kv">{cells}</table>{warn}</div>')


def _badge(run: Run) -> str:
    if run.status == "ok":
        return '<span class="pc-badge ok">IDENTICAL</span>'
    if run.status == "diverged":
        return f'<span class="pc-badge div">DIVERGED at token {run.first_divergence}</span>'
    if run.status == "cancelled":
        return '<span class="pc-badge cancel">CANCELLED</span>'
    return '<span class="pc-badge err">ERROR</span>'


def _tok(text: str) -> str:
    return f'<code class="pc-tok">{esc(repr(text))}</code>'


def _divergence_line(p: PromptResult) -> str:
    c = p.comparison
    if c is None:
        return ""
    if c.identical:
        gap = f"; max |logprob gap| {c.max_abs_gap:.3g}" if c.max_abs_gap is not None else ""
        return f"<div>All {c.compared} generated tokens identical{gap}.</div>"
    d = c.divergence
    gap = f" Max |logprob gap| before it: {c.max_abs_gap:.3g}." if c.max_abs_gap is not None else ""
    if d is None:
        return f"<div>First divergence at generated token {c.first_divergence}.{gap}</div>"
    if d.reason == "length":
        return (f"<div>One engine stopped at token {c.first_divergence}: vLLM made {c.length_vllm} "
                f"tokens, HF {c.length_hf}.{gap}</div>")
    rule = ""
    if d.accepted_by_vllm_rule is not None:
        rule = (" Each token is in the other engine's top-k (vLLM's own test rule accepts this)."
                if d.accepted_by_vllm_rule else " At least one token is NOT in the other engine's top-k.")
    return (f"<div>At generated token <b>{c.first_divergence}</b> vLLM chose {_tok(d.vllm_token_text)} "
            f"(id {d.vllm_token_id}), HF chose {_tok(d.hf_token_text)} (id {d.hf_token_id}).{rule}{gap}</div>")


def _explanation(p: PromptResult) -> str:
    e = p.explanation
    if not isinstance(e, dict) or not (e.get("verdict") or e.get("summary")):
        return ""
    return (f'<div class="pc-verdict"><b>{esc(e.get("verdict", ""))}</b> '
            f'{esc(e.get("summary", ""))}</div>')


def _cross_scores(p: PromptResult) -> str:
    cs = p.cross_scores
    if not isinstance(cs, dict) or not cs:
        return ""
    simple = [(k, v) for k, v in cs.items() if isinstance(v, (str, int, float, bool)) or v is None]
    if not simple:
        return ""
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(round(v, 4) if isinstance(v, float) else v)}</td></tr>"
                    for k, v in simple[:12])
    return f'<details class="pc-cross"><summary>cross-scores</summary><table class="pc-kv">{cells}</table></details>'


def findings_html(findings: list[Finding]) -> str:
    if not findings:
        return ""
    items = []
    for f in findings:
        sev = f.severity if f.severity in ("info", "warning", "error") else "info"
        fix = f' <span class="pc-fixinline">Fix: {esc(f.fix)}</span>' if f.fix else ""
        items.append(f'<li class="sev-{sev}"><b>{esc(f.code)}</b>: {esc(f.message)}{fix}</li>')
    return f'<ul class="pc-findings">{"".join(items)}</ul>'


def _timings(p: PromptResult) -> str:
    out = []
    for name, label in (("vllm", "vLLM"), ("hf", "HF")):
        r = getattr(p, name)
        if r is None:
            continue
        t = r.timings
        parts = [f"{len(r.token_ids)} tokens", f"finish {r.finish_reason or '?'}"]
        for what, v in (("load", t.load_s), ("first token", t.prefill_s), ("total", t.total_s)):
            if v is not None:
                parts.append(f"{what} {v:.2f}s")
        out.append(f"<div><b>{label}</b>: {esc(', '.join(parts))}</div>")
    return "".join(out)


def run_summary_html(run: Run, prompt_index: int = 0) -> str:
    """The card above the panes: verdict, what ran where, and the run's id and permalink."""
    dtype = run.engines["hf"].dtype if "hf" in run.engines else run.config.get("dtype")
    meta = [f"model <b>{esc(run.model.name)}</b>"] + ([f"dtype {esc(dtype)}"] if dtype else [])
    if run.device:
        meta.append(f"device {esc(run.device)}")
    versions = " · ".join(f"{esc(k)} {esc(v)}" for k, v in run.versions.items() if k in ("vllm", "transformers", "torch"))
    body = [f'<div class="pc-head">{_badge(run)}<span class="pc-meta">{" · ".join(meta)}</span></div>']
    if run.status in ("error", "cancelled") and run.error:
        msg, fix = split_fix(run.error)
        body.append(error_html(msg, fix, "Run failed" if run.status == "error" else "Run stopped"))
    if run.prompts and 0 <= prompt_index < len(run.prompts):
        p = run.prompts[prompt_index]
        if len(run.prompts) > 1:
            body.append(f"<div>Prompt {prompt_index} of {len(run.prompts)}.</div>")
        body += [_divergence_line(p), _explanation(p), _timings(p), _cross_scores(p)]
    body.append(findings_html(run.warnings))
    when = run.created_utc[:19].replace("T", " ")
    body.append(f'<div class="pc-foot">run <a href="?run={esc(run.id)}" class="pc-runlink">{esc(run.id)}</a>'
                f" · {esc(when)} UTC" + (f" · {versions}" if versions else "") + "</div>")
    return f'<div class="pc-card pc-summary" data-run="{esc(run.id)}" data-status="{esc(run.status)}">{"".join(body)}</div>'


def progress_html(phase: str, lines: list[str], counts: dict[str, int], expected: int | None,
                  elapsed: float) -> str:
    """The live status box: the current phase, tokens so far per engine, elapsed time."""
    bars = []
    for name, label in (("vllm", "vLLM"), ("hf", "HF")):
        n = counts.get(name, 0)
        pct = min(100, 100 * n / expected) if expected else 0
        total = f" / {expected}" if expected else ""
        bars.append(f'<div class="pp-row"><span class="pp-name">{label}</span>'
                    f'<span class="pp-bar"><span style="width:{pct:.0f}%"></span></span>'
                    f'<span class="pp-n">{n}{total} tokens</span></div>')
    log = "".join(f"<li>{esc(x)}</li>" for x in lines[-4:])
    return (f'<div class="pc-card pc-progress"><div class="pc-title">{esc(phase)} '
            f'<span class="pp-time">{elapsed:.1f}s</span></div>{"".join(bars)}<ul class="pp-log">{log}</ul></div>')
