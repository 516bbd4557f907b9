"""An invariance audit's record (parity_ui.commands.audit): for each audited side, every axis an engine
promises to be invariant on, judged bit for bit (token ids AND logprob bits, float equality, tolerance
0), with the control that must fail, and the evidence a certificate names.

An axis reads one of:
- identical: every prompt's two streams agree in every token id and every logprob's bits;
- broken: some prompt's streams part; the first break names (prompt, token), its kind, the two values,
  their absolute difference and how many units in the last place (ulps) they are apart;
- vacuous: the axis ran but could not have seen a difference (the prefix cache served no cached token):
  never counted as identical;
- not applicable: the setup has no such axis (the reason is said);
- not run: the axis applies but this audit could not run it (what it needs is said: two GPUs, a long
  prompt, not asked for, stopped);
- error: the axis's engine failed (its message).

The audit is VOID when its control passed: a planted one-ulp change in one recorded logprob (and, when
asked, the same engine with one logit-affecting setting changed) must be reported as a break, or the
audit proves nothing. A certificate needs every applicable axis identical and every control detected.

Stored as JSON (parity_ui.store.audits); `report_from_json` reads it back. Pure: no engine, no store.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

KIND, PAIR_KIND = "audit", "audit-pair"  # the audit's run, and the run of a broken axis's two streams
SCHEMA = 1

IDENTICAL, BROKEN, VACUOUS = "identical", "broken", "vacuous"
NOT_APPLICABLE, NOT_RUN, ERROR = "not applicable", "not run", "error"
STATUSES = (IDENTICAL, BROKEN, VACUOUS, NOT_APPLICABLE, NOT_RUN, ERROR)

# The axes, in the order an audit runs them: key -> (label, what the two streams are).
AXES: dict[str, tuple[str, str]] = {
    "replay": ("replay", "the same requests twice in one engine"),
    "batch": ("batch", "each prompt alone against inside one full batch of the others (mixed lengths, a named slot)"),
    "order": ("order", "the full batch against the same requests submitted shuffled"),
    "prefix": ("prefix cache", "cold against warm: a shared prefix served first, its cached tokens counted"),
    "prefill_decode": ("prefill vs decode", "the decode's logprobs against a prefill rescoring of the same tokens"),
    "chunked": ("chunked prefill", "a long prompt prefilled under two chunk budgets"),
    "instance": ("second instance", "the full batch in a fresh engine process with the same settings"),
    "graphs": ("CUDA graphs vs eager", "the full batch with CUDA graphs on and off"),
    "async": ("async scheduling", "the full batch with async scheduling on and off"),
    "tp": ("TP 1 vs 2", "the full batch at tensor parallel 1 and 2"),
    "attention": ("attention kernels", "the full batch with eager and sdpa attention"),
}
AXIS_KEYS = tuple(AXES)

# Cell states of one prompt on one axis.
CELL_IDENTICAL, CELL_BROKEN, CELL_VACUOUS, CELL_SKIPPED = "identical", "broken", "vacuous", "skipped"


def axis_label(key: str) -> str:
    return AXES.get(key, (key, ""))[0]


@dataclass
class Break:
    """Where two streams first part: `kind` "token" (another token id), "logprob" (the same token, other
    logprob bits), "length" (one stream ended) or "missing" (one side recorded no logprob there)."""

    prompt: int
    token: int  # the generated position
    kind: str
    a_token: int | None = None
    b_token: int | None = None
    a_logprob: float | None = None
    b_logprob: float | None = None
    abs_diff: float | None = None  # |a - b| of the two logprobs at that position (None: one is missing)
    ulps: int | None = None  # units in the last place between them
    ulp_space: str = "float32"  # float32 where both logprobs are float32 values, else float64

    def describe(self) -> str:
        where = f"prompt {self.prompt}, token {self.token}"
        if self.kind == "length":
            return f"{where}: one stream ended ({_n(self.a_token)} vs {_n(self.b_token)})"
        if self.kind == "missing":
            who = "neither side" if self.a_logprob is None and self.b_logprob is None else "one side"
            return f"{where}: {who} recorded a logprob, so its bits cannot be compared"
        size = f"|d logprob| {self.abs_diff:.3g}, {self.ulps:,} ulp" if self.abs_diff is not None else ""
        if self.kind == "token":
            return f"{where}: token {self.a_token} vs {self.b_token}" + (f" ({size})" if size else "")
        return f"{where}: same token {self.a_token}, logprob bits differ ({self.a_logprob!r} vs {self.b_logprob!r}; {size})"


def _n(x: Any) -> str:
    return "end" if x is None else str(x)


@dataclass
class Cell:
    """One prompt on one axis."""

    prompt: int
    status: str  # CELL_*
    tokens: int = 0  # positions compared (the shorter stream; the whole stream where identical)
    brk: Break | None = None
    slot: str = ""  # where the prompt sat: "slot 3 of 8", "slot 5 of 8 (shuffled)"
    cached: int | None = None  # prefix axis: cached tokens the engine reported for the warm request
    note: str = ""


@dataclass
class AxisResult:
    axis: str
    side: str
    status: str
    reason: str = ""  # not applicable / not run / error: why; broken: the first break in words
    a: str = ""  # the first stream, in words ("alone, batch 1")
    b: str = ""  # the second ("slot k of a full batch of 8")
    cells: list[Cell] = field(default_factory=list)
    first: Break | None = None  # the earliest break (prompt order, then token)
    broken: int = 0  # prompts whose streams part
    prompts: int = 0  # prompts compared
    tokens: int = 0  # positions compared
    cached_tokens: int | None = None  # prefix axis: cached tokens over every warm request
    seconds: float = 0.0  # the engine time spent for this axis (passes it was first to need, a variant's load)
    pair_run: str | None = None  # the stored run of the two streams (a broken axis), opened in the token view
    pair_prompts: list[int] = field(default_factory=list)  # the audit's prompts in the pair run, in its order
    digests: dict[str, str] = field(default_factory=dict)  # "a"/"b": sha256 of the streams' ids and logprob bits
    settings: dict[str, list[Any]] = field(default_factory=dict)  # what the two streams' engines differ in
    commands: list[str] = field(default_factory=list)  # parity layers / bisect on the pair run
    hint: str = ""  # a broken axis: the setup's own switch that may make it hold, as the CLI takes it

    @property
    def applicable(self) -> bool:
        return self.status != NOT_APPLICABLE

    def pair_index(self, prompt: int) -> int | None:
        """Where the audit's prompt `prompt` sits in the pair run (None: not in it)."""
        return self.pair_prompts.index(prompt) if prompt in self.pair_prompts else None


@dataclass
class ControlResult:
    """A perturbation the audit must detect. `detected` False makes the audit VOID."""

    kind: str  # "ulp": a planted one-ulp change in a recorded logprob; "setting": a logit-affecting setting changed
    description: str
    detected: bool | None  # None: could not run (error)
    brk: Break | None = None
    run_id: str | None = None  # the stored pair (the real stream against the perturbed one)
    error: str | None = None


@dataclass
class AuditPrompt:
    index: int
    tokens: int
    excerpt: str = ""


@dataclass
class AuditReport:
    sides: list[str]
    axes: list[str]  # asked for, in run order
    prompts: list[AuditPrompt] = field(default_factory=list)
    max_new_tokens: int = 0
    batch_size: int = 0
    source: str = ""  # where the prompts came from ("built-in mixed-length set of 8", a file)
    results: list[AxisResult] = field(default_factory=list)
    controls: list[ControlResult] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)  # weights' digests, versions, resolved settings
    seconds: float = 0.0
    load_s: float = 0.0  # the base engines' loads
    passes: dict[str, dict[str, float]] = field(default_factory=dict)  # side -> pass (alone, batch...) -> seconds
    stopped: bool = False
    schema: int = SCHEMA

    # -- judgement ------------------------------------------------------------------------------------

    def result(self, side: str, axis: str) -> AxisResult | None:
        return next((r for r in self.results if r.side == side and r.axis == axis), None)

    @property
    def tokens_checked(self) -> int:
        return sum(r.tokens for r in self.results)

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.tokens_checked / self.seconds, 1) if self.seconds > 0 else None

    @property
    def void(self) -> bool:
        """A control was not detected (or none ran): the audit could not have seen a break."""
        return not self.controls or any(c.detected is not True for c in self.controls)

    @property
    def broken(self) -> list[AxisResult]:
        return [r for r in self.results if r.status == BROKEN]

    @property
    def certified(self) -> bool:
        """Every asked axis that applies ran and is identical, at least one did, every control detected."""
        applicable = [r for r in self.results if r.applicable]
        return (
            not self.void
            and not self.stopped
            and bool(applicable)
            and any(r.status == IDENTICAL for r in applicable)
            and all(r.status == IDENTICAL for r in applicable if not _asked_out(r))
        )

    @property
    def verdict(self) -> str:
        if self.void:
            return "VOID"
        if self.certified:
            return "CERTIFIED ZERO"
        if self.broken:
            return "BROKEN"
        if any(r.status == ERROR for r in self.results):
            return "ERROR"
        if self.stopped:
            return "STOPPED"
        return "NOT CERTIFIED"

    def headline(self) -> str:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        parts = [f"{counts[s]} {s}" for s in STATUSES if counts.get(s)]
        first = self.broken[0] if self.broken else None
        at = f"; first: {first.side} {axis_label(first.axis)} at {first.reason}" if first else ""
        ctl = "control VOID (not detected)" if self.void else "control detected"
        rate = f"; {self.tokens_checked:,} tokens" + (f" at {self.tokens_per_s:,.0f}/s" if self.tokens_per_s else "")
        return f"audit {self.verdict}: {', '.join(parts) or 'no axis'}{at}; {ctl}{rate}"

    # -- storage --------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(
            verdict=self.verdict,
            certified=self.certified,
            void=self.void,
            tokens_checked=self.tokens_checked,
            tokens_per_s=self.tokens_per_s,
            tolerance=0.0,
            headline=self.headline(),
        )
        return out


def _asked_out(r: AxisResult) -> bool:
    """An axis left out by the user (--axes) is listed as not run, and is no part of the certificate."""
    return r.status == NOT_RUN and r.reason.startswith(NOT_ASKED)


NOT_ASKED = "not asked for"


def _fields(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _break(data: Any) -> Break | None:
    return Break(**_fields(Break, data)) if isinstance(data, dict) else None


def report_from_json(data: dict[str, Any] | None) -> AuditReport | None:
    """An AuditReport from what `to_json` wrote (computed keys ignored, unknown keys too)."""
    if not isinstance(data, dict):
        return None
    results = [
        AxisResult(
            **{
                **_fields(AxisResult, r),
                "cells": [Cell(**{**_fields(Cell, c), "brk": _break(c.get("brk"))}) for c in r.get("cells") or []],
                "first": _break(r.get("first")),
            }
        )
        for r in data.get("results") or []
    ]
    controls = [
        ControlResult(**{**_fields(ControlResult, c), "brk": _break(c.get("brk"))}) for c in data.get("controls") or []
    ]
    prompts = [AuditPrompt(**_fields(AuditPrompt, p)) for p in data.get("prompts") or []]
    return AuditReport(
        **{
            **_fields(AuditReport, data),
            "results": results,
            "controls": controls,
            "prompts": prompts,
        }
    )
