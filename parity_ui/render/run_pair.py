"""Two stored runs side by side (History's "Compare two runs", issue 33 item 12): what differs in
their settings (the model, the config, each side's options and resolved settings), their headline
figures (status, result, each comparison's first divergence, a workload's verdicts) and, for single
comparisons, their token panes (the caller passes them: the app's view builds them). Pure: two Runs
in, HTML out."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..core.types import Run
from .cards import _badge, divergence_line, esc
from .workload import verdicts_html

MISSING = "–"


@dataclass(frozen=True)
class PairRow:
    """One setting of two runs: its label, each run's value (MISSING where the run has none)."""

    label: str
    a: str
    b: str

    @property
    def differs(self) -> bool:
        return self.a != self.b


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            _flat(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flat(f"{prefix}[{i}]", v, out)
    else:
        out[prefix] = "" if value is None else str(value)


def run_settings(run: Run) -> dict[str, str]:
    """A run's settings as flat labels -> text: the model, the kind, the prompts, the config (its
    sides excepted) and each side by name (kind, dtype, device, version, options, resolved)."""
    out: dict[str, str] = {
        "model": run.model.path or run.model.name,
        "kind": run.kind,
        "prompts": str(run.workload.n_prompts if run.workload else len(run.prompts)),
    }
    config = {k: v for k, v in (run.config or {}).items() if k != "sides"}
    _flat("config", config, out)
    for s in run.sides:
        side = asdict(s)
        for key in ("kind", "dtype", "device", "version", "model_path", "python", "url"):
            if side.get(key) not in (None, ""):
                out[f"side {s.name}: {key}"] = str(side[key])
        out[f"side {s.name}: reference"] = "yes" if s.reference else "no"
        _flat(f"side {s.name}: option", s.options, out)
        _flat(f"side {s.name}: resolved", s.resolved, out)
    return out


def settings_pairs(a: Run, b: Run) -> list[PairRow]:
    """Every setting either run has, the ones that differ first (each group in the first run's order)."""
    sa, sb = run_settings(a), run_settings(b)
    labels = list(dict.fromkeys([*sa, *sb]))
    rows = [PairRow(k, sa.get(k, MISSING), sb.get(k, MISSING)) for k in labels]
    return [r for r in rows if r.differs] + [r for r in rows if not r.differs]


def result_line(run: Run) -> str:
    """What a run came to, in one line of text."""
    if run.bisect is not None:
        return f"which setting? {run.bisect.summary or run.status}"
    if run.workload is not None:
        return f"workload: {run.workload.headline}" if run.workload.headline else run.status
    if run.status == "error":
        return "error: " + (run.error or "")[:160]
    if run.status in ("cancelled", "interrupted", "running"):
        return run.status
    if run.identical:
        return "identical on every prompt"
    return f"diverged at token {run.first_divergence}"


def _figures(run: Run) -> str:
    """The run's headline figures: status, result, duration, and each comparison of its first
    prompt (a workload: each side's verdict against the floor)."""
    dur = f" · {run.duration_ms / 1000:.1f} s" if run.duration_ms else ""
    parts = [
        f'<div class="pc-head">{_badge(run)}<span class="pc-meta">{esc(run.created_utc[:19].replace("T", " "))}'
        f" UTC{dur}</span></div>",
        f'<div class="rp-result"><b>{esc(result_line(run))}</b></div>',
    ]
    if run.workload is not None:
        parts.append(verdicts_html(run.workload))
    elif run.prompts:
        p = run.prompts[0]
        if len(run.prompts) > 1:
            parts.append(f"<div>{len(run.prompts)} prompts; prompt 0:</div>")
        parts += [divergence_line(c) for c in p.comparisons]
    return "".join(parts)


def run_pair_html(a: Run, b: Run, panes_a: str = "", panes_b: str = "") -> str:
    """The two runs side by side: their ids and headline figures, the settings that differ (the
    equal ones folded), then their token panes where given (single comparisons)."""
    rows = settings_pairs(a, b)
    differ = [r for r in rows if r.differs]
    same = [r for r in rows if not r.differs]

    def trs(rs: list[PairRow], cls: str) -> str:
        return "".join(
            f'<tr class="{cls}"><th>{esc(r.label)}</th><td>{esc(r.a)}</td><td>{esc(r.b)}</td></tr>' for r in rs
        )

    head = f"<tr><th>setting</th><th>A · {esc(a.id)}</th><th>B · {esc(b.id)}</th></tr>"
    diff_table = (
        f'<table class="pc-setting-table rp-diff">{head}{trs(differ, "diff")}</table>'
        if differ
        else '<div class="pc-muted">No setting differs between the two runs.</div>'
    )
    same_table = (
        f'<details class="rp-same"><summary>{len(same)} settings the same</summary>'
        f'<table class="pc-setting-table">{head}{trs(same, "")}</table></details>'
        if same
        else ""
    )
    cols = "".join(
        f'<div class="rp-col" data-run="{esc(r.id)}"><div class="rp-label">{label} · '
        f'<a href="?run={esc(r.id)}">{esc(r.id)}</a> · {esc(r.model.name)}</div>{_figures(r)}</div>'
        for label, r in (("A", a), ("B", b))
    )
    panes = ""
    if panes_a or panes_b:
        panes = (
            '<div class="rp-cols rp-panes">'
            + "".join(
                f'<div class="rp-col"><div class="rp-label">{label} · {esc(r.id)}: tokens of prompt 0</div>{p or ""}</div>'
                for label, r, p in (("A", a, panes_a), ("B", b, panes_b))
            )
            + "</div>"
        )
    return (
        f'<div class="rp-pair" data-a="{esc(a.id)}" data-b="{esc(b.id)}"><div class="rp-cols">{cols}</div>'
        f"<h4>Settings: {len(differ)} differ</h4>{diff_table}{same_table}{panes}</div>"
    )


__all__ = ["PairRow", "run_settings", "settings_pairs", "result_line", "run_pair_html"]
