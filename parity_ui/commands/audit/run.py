"""`parity audit`: certify zero. Every axis an engine promises to be invariant on, for each side (an
engine setup) of the config, over a prompt set, judged bit for bit, with a control that must fail.

How it runs:
1. Prepared as any run (the prompts tokenized once); a prompt set over the context is refused here,
   every prompt that does not fit named, before anything loads. Which axes each side has is decided
   now (parity_ui.commands.audit.axes): not applicable (the reason), not run (what it needs, or not
   asked for), or to run.
2. The sides' own engines load once and serve every shared axis (replay, batch, order, prefix cache,
   prefill vs decode): passes made once and read by every axis that needs them
   (parity_ui.commands.audit.passes).
3. The control: a planted one-ulp change in one recorded logprob, judged by the very code that judges
   the axes (and, when asked, the first side with a logit-affecting setting changed). Not detected:
   the audit is VOID.
4. The axes that need an engine of their own (chunked prefill, a second instance, CUDA graphs, async
   scheduling, TP, attention kernels), one engine at a time.
5. The evidence: weights' digests, versions, resolved settings, prompt digests, run ids.

The audit is a run of kind "audit"; its record (parity_ui.core.audit_record) is stored as each axis
finishes, so a Stop keeps every finished axis (the rest read "not run: stopped"). A broken axis's two
streams are stored as a run of their own (parity_ui.commands.audit.pairs) that the token view opens at
the break and `parity layers` / `parity bisect` take.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...analysis.bitwise import next_up
from ...core.audit_record import (
    AXES,
    AXIS_KEYS,
    BROKEN,
    ERROR,
    KIND,
    NOT_APPLICABLE,
    NOT_ASKED,
    NOT_RUN,
    VACUOUS,
    AuditPrompt,
    AuditReport,
    AxisResult,
    Break,
    ControlResult,
    axis_label,
)
from ...core.config import ParityConfig
from ...core.errors import CancelledError, ConfigError, ParityError, PromptError
from ...core.runlog import EventCallback, RunEvent, utcnow
from ...core.types import Run, SideInfo
from ...inputs.prompts import PromptSpec
from ...run.plan import Prepared, RunRequest, SidePlan
from . import evidence
from .axes import (
    SHARED,
    VARIANT,
    Machine,
    Variant,
    axis_hint,
    chunk_budget,
    control_variant,
    gpu_count,
    needs_for_chunks,
    not_running,
    parse_axes,
    variant,
)
from .judge import judge_axis
from .pairs import store_pair
from .passes import Passes, Stream

if TYPE_CHECKING:
    from ...run.recorder import RunRecorder
    from ..service_api import Service

STOPPED = "stopped before it ran"


@dataclass
class AuditRequest:
    model: str
    config: ParityConfig
    prompts: list[PromptSpec]
    axes: list[str] | str | None = None  # None / "all": every axis
    batch_size: int | None = None  # the full batch's size; None: every prompt in one batch
    control_setting: bool = False  # also the setting control (one engine more)
    control_set: str | None = None  # its change, "OPTION=VALUE" (default: the dtype, float32 <-> bfloat16)
    source: str = ""  # where the prompts came from, in words
    trust_remote_code: bool = False
    group_id: str | None = None
    seed: int = 0  # the shuffled pass's order


@dataclass
class AuditOutcome:
    run: Run
    report: AuditReport


def run_audit(
    service: Service, req: AuditRequest, emit: EventCallback | None = None, *, refuse: bool = False
) -> AuditOutcome:
    """Run the audit, store it, return the run and its record. Never raises for a user or engine error:
    the run is stored with status "error" (its message names the problem and the fix) and the axes
    finished before it are kept; Ctrl-C is stored, then raised. With `refuse`, a refusal before any
    side started (a ConfigError, ModelError or PromptError while preparing: service.recording) raises
    and stores nothing, its audit record included."""
    report = AuditReport(sides=[s.name for s in req.config.sides], axes=[], source=req.source)
    with service.recording(
        req.model, req.config.to_dict(), req.prompts, kind=KIND, group_id=req.group_id, refuse=refuse
    ) as rec:
        auditor = _Auditor(service, req, rec, report, emit or (lambda e: None))
        try:
            auditor.run()
            auditor.judge()
        finally:
            auditor.close()
    # After the recording's last write of the run row: the audit's headline is the row's one line.
    service.store.save_audit(rec.run.id, rec.run.created_utc, report)
    return AuditOutcome(rec.run, report)


class _Auditor:
    def __init__(self, service: Service, req: AuditRequest, rec: RunRecorder, report: AuditReport, emit: EventCallback):
        self.service, self.req, self.rec, self.report, self.emit = service, req, rec, report, emit
        self.t0 = time.perf_counter()
        self.prep: Prepared | None = None
        self.passes: dict[str, Passes] = {}
        self.pending: list[tuple[str, str]] = []  # (side, axis) still to run, in run order
        self.variants: dict[str, dict[str, Any]] = {}  # "side/axis" -> the second engine's change and settings
        # The config the engines load with: its batch size the audit's full batch, so that a setup sized by
        # it (vLLM's CUDA-graph capture sizes) is the one a batch of that size meets in production.
        n = len(req.prompts)
        self.config = dataclasses.replace(req.config, batch_size=max(1, min(req.batch_size or n, n)))

    # -- the record -----------------------------------------------------------------------------------

    def _set(self, result: AxisResult) -> None:
        rs = self.report.results
        for k, r in enumerate(rs):
            if r.side == result.side and r.axis == result.axis:
                rs[k] = result
                return
        rs.append(result)

    def save(self) -> None:
        self.report.seconds = round(time.perf_counter() - self.t0, 3)
        self.service.store.save_audit(self.rec.run.id, self.rec.run.created_utc, self.report)

    def say(self, message: str) -> None:
        self.emit(RunEvent("status", message))

    def judge(self) -> None:
        """The run's status once every axis ran: error when an axis failed, ok when nothing broke, was
        vacuous or went unseen (VOID), else diverged."""
        run = self.rec.run
        errors = [r for r in self.report.results if r.status == ERROR]
        if errors:
            run.status = "error"
            run.error = "; ".join(f"{r.side} {axis_label(r.axis)}: {r.reason}" for r in errors)[:2000]
            return
        clean = not self.report.broken and not self.report.void
        clean = clean and not any(r.status == VACUOUS for r in self.report.results)
        run.status = "ok" if clean else "diverged"

    def close(self) -> None:
        """Whatever ended the audit: the axes never reached say why, and the record is stored."""
        stopped = self.service.stopped
        for side, axis in self.pending:
            r = self.report.result(side, axis)
            if r is not None and r.status == NOT_RUN and r.reason == "pending":
                r.reason = STOPPED if stopped else "not reached: the audit ended before it (see the run's error)"
        self.report.stopped = self.report.stopped or stopped
        self.save()

    # -- preparation ----------------------------------------------------------------------------------

    def _prepare(self) -> Prepared:
        """The run prepared; PromptError naming every prompt over the context (before anything loads)."""
        req = self.req
        self._check_lengths()
        return self.service.prepare(
            RunRequest(
                model=req.model, prompts=req.prompts, config=self.config, trust_remote_code=req.trust_remote_code
            )
        )

    def _check_lengths(self) -> None:
        """An audit certifies the prompts it is given, all of them: one over the context refuses the audit,
        every such prompt named with its length, before anything loads."""
        from ...core.context import max_context
        from ...inputs.models import describe_model
        from ...inputs.prompts import tokenizer_for

        req, cfg = self.req, self.req.config
        if not req.prompts:
            raise PromptError("no prompt to audit", "give a prompt file, or leave it out for the built-in set")
        model = describe_model(req.model, trust_remote_code=req.trust_remote_code)
        limit = max_context(cfg, model)
        if limit is None:
            return
        tok = tokenizer_for(model.path, req.trust_remote_code)
        over = []
        for i, spec in enumerate(req.prompts):
            n = len(tok.encode(spec, cfg.chat).token_ids)
            if n + cfg.max_new_tokens > limit:
                over.append(f"prompt {i} ({n:,} tokens)")
        if over:
            raise PromptError(
                f"{len(over)} of the {len(req.prompts)} prompts do not fit the context of {limit:,} positions with "
                f"max_new_tokens={cfg.max_new_tokens}: " + ", ".join(over[:20]) + ("..." if len(over) > 20 else ""),
                "drop or shorten them, lower max_new_tokens, or raise the context (max_model_len with rope_scaling); "
                "an audit certifies the prompts it is given, all of them",
            )

    def _plan_axes(self, prep: Prepared, axes: list[str]) -> None:
        machine = Machine(self.service.on_gpu, gpu_count() if self.service.on_gpu else 0)
        lengths = [len(e.token_ids) for e in prep.prompts]
        for plan in prep.sides:
            for axis in AXIS_KEYS:
                r = AxisResult(axis=axis, side=plan.name, status=NOT_RUN, reason="pending")
                if axis not in axes:
                    r.reason = f"{NOT_ASKED} (--axes)"
                elif (why := not_running(axis, plan.spec, plan.kind, machine, plan.model)) is not None:
                    r.status, r.reason = why
                elif axis in ("batch", "order") and len(lengths) < 2:
                    r.reason = f"it needs at least 2 prompts (a batch of others); this audit has {len(lengths)}"
                elif axis == "chunked" and chunk_budget(lengths) is None:
                    r.reason = needs_for_chunks(lengths)
                else:
                    self.pending.append((plan.name, axis))
                self._set(r)

    # -- the audit ------------------------------------------------------------------------------------

    def run(self) -> None:
        req, report = self.req, self.report
        axes = parse_axes(req.axes)
        report.axes = axes
        if req.batch_size is not None and req.batch_size < 2:
            raise ConfigError(  # a setting refused before anything runs
                f"--batch {req.batch_size}: the batch axis needs a batch of at least 2 prompts",
                "give --batch 2 or more, or leave it out (every prompt in one batch)",
            )
        prep = self.prep = self._prepare()
        self.rec.prepared(prep)
        n = len(prep.prompts)
        report.prompts = [
            AuditPrompt(i, len(e.token_ids), " ".join(e.text.split())[:100]) for i, e in enumerate(prep.prompts)
        ]
        report.max_new_tokens = prep.config.max_new_tokens
        report.batch_size = min(req.batch_size or n, n)
        self._plan_axes(prep, axes)
        self.save()
        self.say(
            f"audit of {', '.join(report.sides)}: {len(self.pending)} axes to run over {n} prompts x "
            f"{report.max_new_tokens} tokens"
        )
        ids = [list(e.token_ids) for e in prep.prompts]
        t_load = time.perf_counter()
        with self.service.sides(
            prep.sides,
            gpu=prep.resolved.on_gpu,
            emit=self.emit,
            findings=self.rec.run.warnings,
            on_loaded=lambda p, got: self.rec.loaded(p.name, got.info, got.load_s),
        ) as sides:
            report.load_s = round(time.perf_counter() - t_load, 3)
            for plan in prep.sides:
                self.passes[plan.name] = Passes(
                    sides,
                    plan,
                    ids,
                    max(prep.config.logprobs, 1),
                    report.batch_size,
                    prep.config.greedy,
                    req.seed,
                )
            for plan in prep.sides:
                for axis in SHARED:
                    if (plan.name, axis) in self.pending:
                        self._axis(plan.name, axis, functools.partial(self._shared, axis, plan))
                # What the other axes will compare with, made while this engine is loaded.
                needs = {a for s, a in self.pending if s == plan.name}
                self._check_stop()
                self._base_passes(plan.name, needs, first=plan is prep.sides[0])
            self._check_stop()
            self._ulp_control()
            self._keep_base_streams()
            report.passes = {name: dict(p.seconds) for name, p in self.passes.items()}
        for plan in prep.sides:
            for axis in VARIANT:
                if (plan.name, axis) in self.pending:
                    self._axis(plan.name, axis, functools.partial(self._variant, axis, plan))
        if req.control_setting:
            self._check_stop()
            self._setting_control()
        self._evidence()

    def _check_stop(self) -> None:
        """Stop between steps: a Stop pressed while nothing streams still ends the audit here."""
        if self.service.stopped:
            raise CancelledError("the audit was stopped", "")

    def _axis(self, side: str, axis: str, fn: Callable[[], AxisResult]) -> None:
        """One axis run and stored; an engine failure is this axis's error (the audit goes on), a Stop
        ends the audit with every finished axis kept."""
        self._check_stop()
        self.say(f"{side}: {axis_label(axis)} ({AXES[axis][1]})")
        t = time.perf_counter()
        try:
            result = fn()
        except CancelledError:
            self.report.stopped = True
            raise
        except ParityError as e:
            result = AxisResult(
                axis=axis, side=side, status=ERROR, reason=f"{e.message}" + (f" ({e.fix})" if e.fix else "")
            )
        result.seconds = round(time.perf_counter() - t, 3)
        self._set(result)
        self.pending.remove((side, axis))
        self.save()
        self.say(f"{side}: {axis_label(axis)}: {result.status}" + (f" ({result.reason})" if result.reason else ""))

    # -- the shared axes --------------------------------------------------------------------------------

    def _shared(self, axis: str, plan: SidePlan) -> AxisResult:
        p = self.passes[plan.name]
        n = len(p.prompts)
        full = f"one batch of {p.batch_size}" if p.batch_size >= n else f"batches of {p.batch_size}"
        if axis == "replay":
            return self._judged(plan, axis, p.batch(), p.again(), (f"the prompts in {full}", "the same requests again"))
        if axis == "batch":
            return self._judged(plan, axis, p.alone(), p.batch(), ("each prompt alone (batch 1)", f"inside {full}"))
        if axis == "order":
            return self._judged(
                plan, axis, p.batch(), p.shuffled(), (f"{full}, in order", "the same, submitted shuffled")
            )
        if axis == "prefix":
            return self._prefix(plan, p)
        if axis == "prefill_decode":
            return self._judged(
                plan,
                axis,
                p.alone(),
                p.rescored(),
                ("decoded alone: each token's logprob", "the same tokens rescored in one prefill"),
            )
        raise ValueError(axis)

    def _prefix(self, plan: SidePlan, p: Passes) -> AxisResult:
        info = p.sides.info(plan.name)
        block = info.resolved.get("block_size")
        if not isinstance(block, int) or block <= 0:
            return AxisResult("prefix", plan.name, NOT_APPLICABLE, "the engine reports no KV block size")
        cold = p.batch()
        warm, prefix = p.warm(block)
        if all(s.cached is None for s in warm.values()):
            return AxisResult(
                "prefix", plan.name, NOT_APPLICABLE, "this side's engine reports no cached-token count per request"
            )
        # A cell tests the cache only where the warm request read MORE cached tokens than the cold one: vLLM
        # caches blocks as it allocates them, so in a cold batch a prompt that shares a prefix with an
        # earlier one (a few-shot header, a chat template's first block) is served from the cache too, and
        # cold and warm were then served alike.
        vacuous = {i for i, s in warm.items() if i in cold and (s.cached or 0) <= (cold[i].cached or 0)}
        result = self._judged(
            plan,
            "prefix",
            cold,
            warm,
            (
                "cold: the prefix cache emptied first",
                f"warm: each prompt's block-aligned prefix ({block}-token blocks) served first",
            ),
            vacuous=vacuous,
        )
        result.cached_tokens = sum(s.cached or 0 for s in warm.values())
        for c in result.cells:
            read_cold = cold[c.prompt].cached if c.prompt in cold else None
            if c.prompt in vacuous and read_cold and warm[c.prompt].cached:
                c.note = (
                    f"the cold request already read {read_cold} cached tokens (an earlier prompt in its batch "
                    f"shares its prefix), the warm one {warm[c.prompt].cached}: both were served from the cache"
                )
                continue
            if c.prompt in vacuous:
                k = prefix.get(c.prompt, 0)
                c.note = (
                    f"no cached token: shorter than one KV block ({block} tokens), nothing to cache"
                    if k == 0
                    else f"no cached token although a {k}-token prefix was served first"
                )
            if read_cold:
                c.note = (
                    c.note + "; " if c.note else ""
                ) + f"the cold request read {cold[c.prompt].cached} cached tokens"
        if result.status == VACUOUS and not result.cached_tokens:
            result.reason = (
                f"no request was served from the cache (0 cached tokens over {len(warm)} prompts): the axis could "
                f"not have seen a difference; give prompts longer than one KV block ({block} tokens)"
            )
        elif result.status == VACUOUS:
            result.reason = (
                f"every cold request read as many cached tokens as its warm one (the prompts share a prefix, "
                f"which the cold batch cached for itself): the axis could not have seen a difference; give "
                f"prompts that share no first KV block ({block} tokens)"
            )
        elif vacuous:
            result.reason = (
                result.reason + "; " if result.reason else ""
            ) + f"{len(vacuous)} prompt(s) where the warm request read no more cached tokens than the cold (vacuous)"
        return result

    def _judged(
        self,
        plan: SidePlan,
        axis: str,
        a: dict[int, Stream],
        b: dict[int, Stream],
        labels: tuple[str, str],
        *,
        vacuous: set[int] | None = None,
        skipped: dict[int, str] | None = None,
        second: tuple[SidePlan, SideInfo | None] | None = None,
    ) -> AxisResult:
        """The axis judged, and a broken one's streams stored as a pair run (with its commands)."""
        assert self.prep is not None
        result = judge_axis(
            plan.name, axis, a, b, len(self.prep.prompts), vacuous=vacuous, skipped=skipped, labels=labels
        )
        if result.status == BROKEN:
            compared = {
                i: s for i, s in a.items() if i in b and i not in (vacuous or set()) and i not in (skipped or {})
            }
            breaks = [c.brk for c in result.cells if c.brk is not None]
            info = self.rec.run.side(plan.name)
            other_plan, other_info = second or (plan, info)
            result.pair_run = store_pair(
                self.service,
                self.prep,
                self.rec.run.id,
                axis,
                (plan, other_plan),
                (info, other_info),
                compared,
                {i: b[i] for i in compared},
                breaks,
                f"audit {self.rec.run.id}, side {plan.name}, {axis_label(axis)}",
            )
            result.pair_prompts = sorted(compared)
            result.commands = _commands(result, axis)
            result.hint = axis_hint(axis, plan.spec, dict(info.resolved) if info is not None else {})
        return result

    # -- the passes the other axes compare with, and the control ---------------------------------------

    def _base_passes(self, side: str, needs: set[str], first: bool) -> None:
        p = self.passes[side]
        if "chunked" in needs:
            p.alone()
        if needs & {"instance", "graphs", "async", "tp", "attention"} or (first and self.req.control_setting):
            p.batch()
        if first and not p.made:  # the planted control needs one recorded pass
            p.alone()

    def _ulp_control(self) -> None:
        """A planted one-ulp change in one recorded logprob: the axes' own judgement must call it broken
        at exactly that prompt and token, one ulp apart; else the audit is VOID."""
        side = self.report.sides[0]
        p = self.passes[side]
        source = p.alone() if "alone" in p.made else p.batch()
        desc = "one recorded logprob moved by one ulp"
        pick = _plant_site(source)
        if pick is None:
            self.report.controls.append(
                ControlResult(
                    "ulp", desc, None, error="no recorded float32 logprob to plant a change in (no token was generated)"
                )
            )
            return
        i, k = pick
        planted = {j: s for j, s in source.items()}
        lps = list(source[i].logprobs)
        real = lps[k]
        assert real is not None  # _plant_site picks a finite one
        planted_value, space = next_up(real)
        lps[k] = planted_value
        planted[i] = dataclasses.replace(source[i], logprobs=lps)
        res = judge_axis(side, "control", source, planted, len(p.prompts))
        brk = res.first
        detected = res.status == BROKEN and brk is not None and (brk.prompt, brk.token, brk.ulps) == (i, k, 1)
        run_id = None
        if self.prep is not None:
            plan = self.prep.side(side)
            info = self.rec.run.side(side)
            changed = dataclasses.replace(
                source[i].result, steps=_with_logprob(source[i].result.steps, k, planted_value)
            )
            planted_stream = dataclasses.replace(planted[i], result=changed)
            run_id = store_pair(
                self.service,
                self.prep,
                self.rec.run.id,
                "control",
                (plan, plan),
                (info, info),
                {i: source[i]},
                {i: planted_stream},
                [brk] if brk is not None else [],
                f"audit {self.rec.run.id}: the planted control",
            )
        self.report.controls.append(
            ControlResult(
                "ulp",
                f"{desc} ({space}): side {side}, prompt {i}, token {k} ({source[i].logprobs[k]!r} -> {lps[k]!r})",
                detected,
                brk,
                run_id,
            )
        )
        self.save()
        self.say("control: " + ("detected, as it must be" if detected else "NOT detected: the audit is VOID"))

    def _keep_base_streams(self) -> None:
        """The audit run's own tokens: each side's first pass (alone where made), the streams certified."""
        assert self.prep is not None
        results = []
        for name, p in self.passes.items():
            made = p.made.get("alone") or p.made.get("batch")
            if not made:
                continue
            for r in made:
                res = dataclasses.replace(r, side=name)
                from ...run.recorder import decode_result

                decode_result(self.prep.tokenizer, res)
                results.append(res)
        if results:
            self.rec.keep(results)

    # -- the axes with an engine of their own -----------------------------------------------------------

    def _on_variant(self, v: Variant, plan: SidePlan, work: Callable[[Passes], Any]) -> tuple[Any, SidePlan, SideInfo]:
        """`work` done on the second engine `v` (the same prompts and sampling as the base)."""
        assert self.prep is not None
        req = self.req
        prep_v = self.service.prepare(
            RunRequest(
                model=req.model,
                prompts=req.prompts,
                config=self.config.with_sides([v.spec]),
                trust_remote_code=req.trust_remote_code,
            )
        )
        vplan = prep_v.sides[0]
        vplan.worker_env = {**vplan.worker_env, **v.env}
        base = self.passes[plan.name]
        try:
            return self._run_on(vplan, base, work)
        finally:
            if v.env:  # a second instance: its own process, which no later run asks for again
                self.service.drop_workers([vplan])

    def _run_on(self, vplan: SidePlan, base: Passes, work: Callable[[Passes], Any]) -> tuple[Any, SidePlan, SideInfo]:
        with self.service.sides([vplan], gpu=self.service.on_gpu, emit=self.emit) as vs:
            got = vs.loaded[vplan.name]
            info = SideInfo(
                name=vplan.name,
                kind=vplan.kind.name,
                options=vplan.spec.all_options(),
                model_path=vplan.model.path,
                version=got.info.version,
                device=got.info.device,
                dtype=got.info.dtype,
                versions=dict(got.info.versions),
                resolved=dict(got.info.resolved),
                load_s=round(got.load_s, 3),
            )
            vp = Passes(vs, vplan, base.prompts, base.logprobs, base.batch_size, base.greedy, base.seed)
            return work(vp), vplan, info

    def _variant(self, axis: str, plan: SidePlan) -> AxisResult:
        assert self.prep is not None
        info = self.rec.run.side(plan.name)
        resolved = dict(info.resolved) if info is not None else {}
        base = self.passes[plan.name]
        if axis == "chunked":
            budget = chunk_budget([len(x) for x in base.prompts])
            assert budget is not None
            long = [i for i, x in enumerate(base.prompts) if len(x) > budget]
            v = variant(axis, plan.spec, resolved, budget=budget)
            b, vplan, vinfo = self._on_variant(v, plan, lambda vp: vp.alone(only=long))
            a = base.alone(only=long)
            skipped = {
                i: f"{len(x)} tokens: within the budget of {budget}, prefilled whole either way"
                for i, x in enumerate(base.prompts)
                if i not in long
            }
            base_budget = resolved.get("max_num_batched_tokens")
            labels = (
                f"alone, the setup's own budget ({base_budget or 'vLLM default'} tokens a step"
                + (", chunked prefill on" if resolved.get("chunked_prefill") else "")
                + ")",
                f"alone, chunked prefill with a budget of {budget} tokens a step",
            )
        else:
            v = variant(axis, plan.spec, resolved, nonce=self.rec.run.id)
            b, vplan, vinfo = self._on_variant(v, plan, lambda vp: vp.batch())
            a, skipped = base.batch(), None
            labels = (f"the full batch, side {plan.name} as set", f"the full batch, {v.changed}")
        result = self._judged(plan, axis, a, b, labels, skipped=skipped, second=(vplan, vinfo))
        result.settings = _differing(resolved, vinfo.resolved)
        self.variants[f"{plan.name}/{axis}"] = {
            "changed": v.changed,
            "resolved": vinfo.resolved,
            "versions": vinfo.versions,
            "device": vinfo.device,
        }
        return result

    def _setting_control(self) -> None:
        """The first side with one logit-affecting setting changed: the full batch must break."""
        assert self.prep is not None
        plan = self.prep.sides[0]
        info = self.rec.run.side(plan.name)
        dtype = (info.dtype if info is not None else "") or plan.dtype
        try:
            v = control_variant(plan.spec, dtype, self.req.control_set)
            b, vplan, vinfo = self._on_variant(v, plan, lambda vp: vp.batch())
            res = judge_axis(plan.name, "control", self.passes[plan.name].batch(), b, len(self.prep.prompts))
            detected = res.status == BROKEN
            self.report.controls.append(
                ControlResult("setting", f"side {plan.name} with {v.changed}: the full batch", detected, res.first)
            )
            self.variants[f"{plan.name}/control"] = {"changed": v.changed, "resolved": vinfo.resolved}
        except CancelledError:
            raise
        except ParityError as e:
            self.report.controls.append(
                ControlResult("setting", f"side {plan.name} with a logit-affecting setting changed", None, error=str(e))
            )
        self.save()

    # -- the evidence -----------------------------------------------------------------------------------

    def _evidence(self) -> None:
        assert self.prep is not None
        prep, run = self.prep, self.rec.run
        folders = dict.fromkeys([prep.model.path, *(p.model.path for p in prep.sides)])
        self.report.evidence = {
            "tolerance": 0.0,
            "compared": "each generated token's id and its logprob's bits (float32), float equality, no tolerance",
            "audit_run": run.id,
            "created_utc": run.created_utc,
            "finished_utc": utcnow(),
            "model": {"name": prep.model.name, "path": prep.model.path, "architecture": prep.model.architecture},
            "weights": {f: evidence.weights_digests(f) for f in folders},
            "sides": {
                s.name: {
                    "kind": s.kind,
                    "options": s.options,
                    "dtype": s.dtype,
                    "device": s.device,
                    "versions": s.versions,
                    "resolved": s.resolved,
                }
                for s in run.sides
            },
            "second_engines": self.variants,
            "config": prep.config.to_dict(),
            "prompts": [
                {"index": i, "tokens": len(e.token_ids), "sha256": evidence.prompt_digest(e.token_ids)}
                for i, e in enumerate(prep.prompts)
            ],
            "pair_runs": {f"{r.side}/{r.axis}": r.pair_run for r in self.report.results if r.pair_run},
            "control_runs": [c.run_id for c in self.report.controls if c.run_id],
            "parity_ui": run.versions,
            "machine": {**evidence.machine(), "device": run.device},
        }


def _plant_site(streams: dict[int, Stream]) -> tuple[int, int] | None:
    """(prompt, token) to plant the control's change at: the middle token of the longest stream whose
    logprob there is finite (else the first finite one)."""
    order = sorted(streams, key=lambda i: (-len(streams[i].ids), i))
    for i in order:
        lps = streams[i].logprobs
        for k in [len(lps) // 2, *range(len(lps))] if lps else []:
            x = lps[k]
            if x is not None and math.isfinite(x):
                return i, k
    return None


def _with_logprob(steps: Any, k: int, value: float) -> Any:
    """A copy of `steps` with step k's chosen logprob set to `value` (the planted stream, as stored)."""
    from ...core.types import StepColumns

    if isinstance(steps, StepColumns):
        cols = steps.columns()
        cols["logprob"] = list(cols["logprob"])
        cols["logprob"][k] = value
        return StepColumns(cols)
    out = list(steps)
    out[k] = dataclasses.replace(out[k], logprob=value)
    return out


def _differing(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """The resolved settings two engines differ in (what an axis changed, as the engines reported it)."""
    keys = [k for k in dict.fromkeys([*a, *b]) if k not in ("warmup_s",)]
    return {k: [a.get(k), b.get(k)] for k in keys if a.get(k) != b.get(k)}


def _commands(result: AxisResult, axis: str) -> list[str]:
    """How to go on from a broken axis: the layer where the two setups part, and which setting it is."""
    from .axes import PAIR_NAMES

    brk: Break | None = result.first
    if brk is None or result.pair_run is None:
        return []
    a, b = PAIR_NAMES.get(axis, ("a", "b"))
    j = result.pair_index(brk.prompt)
    out = [f"parity layers {result.pair_run} --prompt {j} --position {brk.token} --sides {a},{b}"]
    if axis in VARIANT and axis != "instance":
        out.append(f"parity bisect {result.pair_run} --sides {a},{b}")
    return out
