"""Determinism probes: does a side give the same tokens for the same prompt, alone and in a batch?

`run_probe` generates one prompt N times alone and N times inside a batch of B (the prompt plus B-1
LONGER companions, so an HF side left-pads it), on every side of the config, and for each side whose
kind has a batch-invariant mode also with it on, where the installed vLLM and device support it. It
counts distinct outputs and the first position where they fork, and stores everything as a Run of
kind "probe" (`Run.probes["sides"]`, one entry per probed setup).
"""
from __future__ import annotations

import time
from typing import Any

from .config import ParityConfig
from .errors import ConfigError
from .hardware import batch_invariant_support
from .prepare import Prepared, RunRequest
from .prompts import PromptSpec
from .runlog import RunEvent, finish, new_run, record_failure
from .service import decode_result, fill_side_info, side_info
from .store import new_run_id, save_run
from .types import Run, SideResult

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


def summarize_outputs(outputs: list[list[int]]) -> dict[str, Any]:
    """Distinct outputs (with counts, most common first) and the first fork. Pure."""
    counts: dict[tuple[int, ...], int] = {}
    for o in outputs:
        counts[tuple(o)] = counts.get(tuple(o), 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    return {"runs": len(outputs), "distinct": len(counts), "first_fork": first_fork(outputs),
            "counts": [c for _, c in ranked], "lengths": [len(s) for s, _ in ranked]}


def companions(ids: list[int], batch: int) -> list[list[int]]:
    """B-1 prompts longer than `ids` (it plus a growing piece of itself), so that in HF's left-padded
    batch the probed prompt is the padded one."""
    return [ids + ids[: 1 + (j * len(ids)) // max(batch - 1, 1)] for j in range(batch - 1)]


def _probe_side(service: Any, prep: Prepared, side: str, ids: list[int], n: int, batch: int,
                emit: Any) -> tuple[dict[str, Any], SideResult]:
    alone = service.generate_ids(prep, side, [ids] * n, 1, emit)
    prompts: list[list[int]] = []
    where: list[int] = []
    others = companions(ids, batch)
    for r in range(n):  # the probed prompt at a different slot in each batch
        group = list(others)
        slot = r % batch
        group.insert(slot, ids)
        where.append(len(prompts) + slot)
        prompts.extend(group)
    batched = service.generate_ids(prep, side, prompts, batch, emit)
    a = [res.token_ids for res in alone]
    b = [batched[i].token_ids for i in where]
    return {"alone": summarize_outputs(a), "batched": summarize_outputs(b),
            "alone_vs_batched": summarize_outputs([a[0], *b])}, alone[0]


def run_probe(service: Any, model: str, prompt: PromptSpec, cfg: ParityConfig, *, n: int = 4, batch: int = 4,
              trust_remote_code: bool = False, emit: Any = None) -> Run:
    """Probe every side's determinism on one prompt; store and return a Run of kind "probe".
    Never raises for a user or engine error: the run is stored with status "error"."""
    t0 = time.perf_counter()
    emit = emit or (lambda e: None)
    run = new_run(new_run_id(), model, cfg.to_dict(), [prompt], kind="probe")
    save_run(service.db, run)
    try:
        if n < 2 or batch < 2:
            raise ConfigError("probe", f"--n {n} --batch {batch}: a probe needs n >= 2 and batch >= 2",
                              "e.g. --n 4 --batch 4")
        req = RunRequest(model=model, prompts=[prompt], config=cfg, trust_remote_code=trust_remote_code)
        prep = service.prepare(req)
        run.model, run.warnings = prep.model, prep.warnings
        run.sides = [side_info(p, reference=i == 0) for i, p in enumerate(prep.sides)]
        pr = run.prompts[0]
        pr.prompt_text, pr.prompt_token_ids = prep.prompts[0].text, prep.prompts[0].token_ids
        ids = pr.prompt_token_ids
        supported, why = batch_invariant_support(prep.resolved.on_gpu)
        probes: dict[str, Any] = {"n": n, "batch": batch, "batch_invariant": {"supported": supported, "detail": why},
                                  "sides": {}}
        variants = []
        for info, plan in zip(run.sides, prep.sides):
            emit(RunEvent("status", f"probing {plan.name}: {n} alone, {n} in batches of {batch}"))
            entry, first = _probe_side(service, prep, plan.name, ids, n, batch, emit)
            probes["sides"][plan.name] = {**entry, "side": plan.name, "batch_invariant":
                                          bool(getattr(plan.spec.options, "batch_invariant", False))}
            decode_result(prep.tokenizer, first)
            pr.results[plan.name] = first
            fill_side_info(info, service.loaded_info(plan.name), 0.0)
            if plan.kind.can_batch_invariant and supported and not plan.spec.options.batch_invariant:
                variants.append(plan)
        for plan in variants:  # after the plain sides: each variant replaces its side's worker
            sides = [s.replace(batch_invariant=True) if s.name == plan.name else s for s in cfg.sides]
            p2 = service.prepare(RunRequest(model=model, prompts=[prompt], config=cfg.with_sides(sides),
                                            trust_remote_code=trust_remote_code))
            label = plan.name + INVARIANT
            emit(RunEvent("status", f"probing {label}: {n} alone, {n} in batches of {batch}"))
            entry, _ = _probe_side(service, p2, plan.name, ids, n, batch, emit)
            probes["sides"][label] = {**entry, "side": plan.name, "batch_invariant": True}
        run.probes = probes
        stable = all(e[m]["distinct"] == 1 for e in probes["sides"].values()
                     for m in ("alone", "batched", "alone_vs_batched"))
        run.status = "ok" if stable else "diverged"
    except Exception as e:  # noqa: BLE001 - stored as the run's error
        record_failure(run, e)
    finish(run, t0)
    save_run(service.db, run)
    return run


def format_probe(run: Run) -> str:
    """The probe as lines for a terminal."""
    if run.status == "error":
        return f"probe {run.id}: ERROR: {run.error}"
    p = run.probes or {}
    lines = [f"probe {run.id}: {'DETERMINISTIC' if run.status == 'ok' else 'NOT DETERMINISTIC'}  "
             f"model={run.model.name}  dtype={run.config.get('dtype')}  n={p.get('n')}  batch={p.get('batch')}"]
    for label, entry in (p.get("sides") or {}).items():
        for mode, what in (("alone", "alone"), ("batched", "in a batch"), ("alone_vs_batched", "alone vs batched")):
            s = entry[mode]
            fork = "" if s["first_fork"] is None else f", first fork at token {s['first_fork']}"
            lines.append(f"  {label:24s} {what:17s}: {s['distinct']} distinct of {s['runs']}{fork}")
    bi = p.get("batch_invariant", {})
    if not bi.get("supported"):
        lines.append(f"  batch-invariant mode: {bi.get('detail')}")
    return "\n".join(lines)
