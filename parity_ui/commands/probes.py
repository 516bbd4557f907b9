"""Determinism probes: does a side give the same tokens for the same prompt, alone and in a batch?

`run_probe` generates one prompt N times alone and N times inside a batch of B (the prompt plus B-1
LONGER companions, so an HF side left-pads it), on every side of the config, and for each side whose
kind has a batch-invariant mode also with it on, where the installed vLLM and device support it. It
counts distinct outputs and the first position where they fork, and stores everything as a Run of
kind "probe" (`Run.probes`, a ProbeReport with one entry per probed setup).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.config import ParityConfig
from ..core.errors import ConfigError
from ..core.findings import BatchInvariantSupport, OutputsSummary, ProbeReport, SideProbe
from ..core.mapping import option
from ..core.requests import GenerateRequest
from ..core.runlog import EventCallback, RunEvent
from ..core.types import Run, SideResult
from ..inputs.prompts import PromptSpec
from ..run.hardware import batch_invariant_support
from ..run.pipeline import Sides
from ..run.plan import RunRequest, SidePlan
from ..run.recorder import decode_result

if TYPE_CHECKING:
    from .service_api import Service

INVARIANT = "+batch_invariant"  # suffix of a probed setup with batch-invariant mode on


def first_fork(outputs: list[list[int]]) -> int | None:
    """The first position where any output differs from the first one (length included); None
    when all are equal. Pure."""
    if not outputs:
        return None
    ref = outputs[0]
    forks = []
    for o in outputs[1:]:
        n = min(len(o), len(ref))
        i = next((j for j in range(n) if o[j] != ref[j]), None)
        if i is None and len(o) != len(ref):
            i = n
        if i is not None:
            forks.append(i)
    return min(forks) if forks else None


def summarize_outputs(outputs: list[list[int]]) -> OutputsSummary:
    """Distinct outputs (with counts, most common first) and the first fork. Pure."""
    counts: dict[tuple[int, ...], int] = {}
    for o in outputs:
        counts[tuple(o)] = counts.get(tuple(o), 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    return OutputsSummary(
        runs=len(outputs),
        distinct=len(counts),
        first_fork=first_fork(outputs),
        counts=[c for _, c in ranked],
        lengths=[len(s) for s, _ in ranked],
    )


def companions(ids: list[int], batch: int) -> list[list[int]]:
    """B-1 prompts longer than `ids` (it plus a growing piece of itself), so that in HF's left-padded
    batch the probed prompt is the padded one."""
    return [ids + ids[: 1 + (j * len(ids)) // max(batch - 1, 1)] for j in range(batch - 1)]


def _probe_side(sides: Sides, plan: SidePlan, ids: list[int], n: int, batch: int) -> tuple[SideProbe, SideResult]:
    def generate(prompts: list[list[int]], batch_size: int) -> list[SideResult]:
        return sides.generate(
            plan.name,
            GenerateRequest(
                prompts=prompts, sampling=plan.args.sampling, batch_size=batch_size, logprobs=1, stream=False
            ),
        )

    alone = generate([ids] * n, 1)
    prompts: list[list[int]] = []
    where: list[int] = []
    others = companions(ids, batch)
    for r in range(n):  # the probed prompt at a different slot in each batch
        group = list(others)
        slot = r % batch
        group.insert(slot, ids)
        where.append(len(prompts) + slot)
        prompts.extend(group)
    batched = generate(prompts, batch)
    a = [res.token_ids for res in alone]
    b = [batched[i].token_ids for i in where]
    probe = SideProbe(
        side=plan.name,
        batch_invariant=bool(plan.kind.can_batch_invariant and option(plan.spec, "batch_invariant", False)),
        alone=summarize_outputs(a),
        batched=summarize_outputs(b),
        alone_vs_batched=summarize_outputs([a[0], *b]),
    )
    return probe, alone[0]


def run_probe(
    service: Service,
    model: str,
    prompt: PromptSpec,
    cfg: ParityConfig,
    *,
    n: int = 4,
    batch: int = 4,
    trust_remote_code: bool = False,
    emit: EventCallback | None = None,
) -> Run:
    """Probe every side's determinism on one prompt; store and return a Run of kind "probe".
    Never raises for a user or engine error: the run is stored with status "error"."""
    emit = emit or (lambda e: None)
    with service.recording(model, cfg.to_dict(), [prompt], kind="probe") as rec:
        if n < 2 or batch < 2:
            raise ConfigError(
                "probe", f"--n {n} --batch {batch}: a probe needs n >= 2 and batch >= 2", "e.g. --n 4 --batch 4"
            )
        req = RunRequest(model=model, prompts=[prompt], config=cfg, trust_remote_code=trust_remote_code)
        prep = service.prepare(req)
        rec.prepared(prep)
        ids = prep.prompts[0].token_ids
        supported, why = batch_invariant_support(prep.resolved.on_gpu)
        report = ProbeReport(n=n, batch=batch, batch_invariant=BatchInvariantSupport(supported, why))
        variants = []
        with service.sides(
            prep.sides,
            gpu=prep.resolved.on_gpu,
            emit=emit,
            findings=rec.run.warnings,
            on_loaded=lambda p, got: rec.loaded(p.name, got.info, 0.0),
        ) as sides:
            for plan in prep.sides:
                emit(RunEvent("status", f"probing {plan.name}: {n} alone, {n} in batches of {batch}"))
                report.sides[plan.name], first = _probe_side(sides, plan, ids, n, batch)
                decode_result(prep.tokenizer, first)
                rec.keep([first])
                if plan.kind.can_batch_invariant and supported and not option(plan.spec, "batch_invariant", False):
                    variants.append(plan)
        for plan in variants:  # after the plain sides: each variant replaces its side's worker
            specs = [s.replace(batch_invariant=True) if s.name == plan.name else s for s in cfg.sides]
            p2 = service.prepare(
                RunRequest(
                    model=model, prompts=[prompt], config=cfg.with_sides(specs), trust_remote_code=trust_remote_code
                )
            )
            label = plan.name + INVARIANT
            emit(RunEvent("status", f"probing {label}: {n} alone, {n} in batches of {batch}"))
            with service.sides(p2.sides, gpu=p2.resolved.on_gpu, emit=emit) as sides:
                probe, _ = _probe_side(sides, p2.side(plan.name), ids, n, batch)
            probe.batch_invariant = True
            report.sides[label] = probe
        rec.run.probes = report
        rec.run.status = "ok" if report.stable else "diverged"
    return rec.run
