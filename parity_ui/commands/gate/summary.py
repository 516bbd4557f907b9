"""A check for people: Markdown for a CI job's summary page ($GITHUB_STEP_SUMMARY), plain text for
the terminal. Both list each case, every failed check with its figure and limit, each control, and,
where sides run in other environments (`python=`), the per-model table of old against new.
"""

from __future__ import annotations

from typing import Any

from .check import CaseResult, CheckResult
from .metrics import fmt

_MARK = {"pass": "✅ pass", "fail": "❌ FAIL", "error": "⚠️ ERROR", "skipped": "⏭ skipped"}


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _control_text(c: CaseResult) -> str:
    if c.control is None:
        return "none"
    o = c.control.outcome
    run = f" (`{c.control.run_id}`)" if c.control.run_id else ""
    if o.status == "pass":
        return f"fails, as it must{run}"
    if o.status == "fail":
        return f"**passed: the gate cannot fail**{run}"
    return f"error{run}"


def markdown(check: CheckResult) -> str:
    """The check as Markdown (GitHub-flavoured: tables, details)."""
    lines = [
        f"## parity check: {check.verdict}",
        "",
        f"{check.headline()} · spec `{check.spec_path}` · check run `{check.run_id}` · "
        f"group `{check.group_id}` · {check.duration_s:.0f} s",
        "",
        "| case | model | result | checks passed | run | control |",
        "|---|---|---|---|---|---|",
    ]
    for c in check.cases:
        ok = sum(o.status == "pass" for o in c.checks)
        lines.append(
            f"| {_cell(c.name)} | {_cell(c.model)} | {_MARK[c.status]} | {ok}/{len(c.checks)} | "
            f"{'`' + c.run_id + '`' if c.run_id else '-'} | {_control_text(c)} |"
        )
    bad = [(c, o) for c in check.cases for o in c.checks if o.status in ("fail", "error")]
    if bad:
        lines += ["", "### What failed", ""]
        lines += [f"- **{_cell(c.name)}** · {_cell(o.name)}: {_cell(o.message)}" for c, o in bad]
    table = upgrade_rows(check)
    if table:
        header, rows = table
        lines += [
            "",
            "### Upgrade: each environment's side, per model",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        lines += ["| " + " | ".join(_cell(x) for x in r) + " |" for r in rows]
    for c in check.cases:
        lines += [
            "",
            f"<details><summary>{_cell(c.name)}: every check</summary>",
            "",
            "| check | side | value | limit | result |",
            "|---|---|---|---|---|",
        ]
        for o in c.outcomes + (c.control.outcomes if c.control else []):
            prefix = "control · " if c.control and o in c.control.outcomes else ""
            lines.append(
                f"| {prefix}{_cell(o.check)} | {o.side or '-'} | {fmt(o.value)} | {fmt(o.limit)} | {_MARK[o.status]} |"
            )
        lines += ["", "</details>"]
    if check.cases and check.cases[0].run_id:
        rid = check.cases[0].run_id
        lines += [
            "",
            f"Open a case's run: `parity runs show {rid}`, `parity report {rid}`, or the app's history "
            f"(the check's runs share group `{check.group_id}`).",
        ]
    return "\n".join(lines) + "\n"


def text(check: CheckResult) -> str:
    """The check for a terminal."""
    out = [check.headline() + f"  (check run {check.run_id}, {check.duration_s:.0f} s)"]
    for c in check.cases:
        out.append(f"  {c.status.upper():5}  {c.name}  ({c.model}; run {c.run_id or '-'})")
        for o in c.outcomes:
            out.append(f"         {o.status:7} {o.name}: {o.message}")
        if c.control:
            o = c.control.outcome
            said = (
                f"control ({c.control.description}): its thresholds failed, as they must"
                if o.status == "pass"
                else o.message
            )
            out.append(f"         {'ok' if o.status == 'pass' else o.status:7} {said}")
    table = upgrade_rows(check)
    if table:
        header, rows = table
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        out.append("  upgrade, per model:")
        for r in [header, *rows]:
            out.append("    " + "  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    return "\n".join(out)


def upgrade_rows(check: CheckResult) -> tuple[list[str], list[list[str]]] | None:
    """The old-vs-new table: one row per (model, case) that has a side in another environment
    (`python=`), one column per side name: the side's engine version and its verdict (PASS/FAIL
    against the reference, or "reference"). None when no case has such a side."""
    cases = [c for c in check.cases if any(s.get("python") for s in c.sides)]
    if not cases:
        return None
    names: list[str] = []
    for c in cases:
        names += [s["name"] for s in c.sides if s["name"] not in names and not s["name"].startswith("floor")]
    rows = []
    for c in cases:
        row = [c.model, c.name]
        by_name = {s["name"]: s for s in c.sides}
        for n in names:
            s = by_name.get(n)
            if s is None:
                row.append("-")
                continue
            version = f"{s['kind']} {s.get('version') or ''}".strip()
            if n == c.reference:
                row.append(f"{version}: reference")
                continue
            mine = [o for o in c.outcomes if o.side == n]
            state = (
                "ERROR"
                if any(o.status == "error" for o in mine)
                else "FAIL"
                if any(o.status == "fail" for o in mine)
                else "PASS"
                if mine
                else "not checked"
            )
            row.append(f"{version}: {state}")
        rows.append(row)
    return ["model", "case", *names], rows
