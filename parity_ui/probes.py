"""Determinism probes: does an engine give the same tokens for the same prompt, alone and in a batch?

`run_probe` generates one prompt N times alone and N times inside a batch of B (the prompt plus B-1
LONGER companions, so HF left-pads it), on vLLM and on HF, with and without vLLM's batch-invariant
mode where the installed vLLM and device support it. It counts distinct outputs and the first
position where they fork, and stores everything as a Run of kind "probe" (`Run.probes`).
"""
from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from . import __version__
from .config import ParityConfig
from .errors import ParityError
from .prompts import PromptSpec
from .store import new_run_id, save_run
from .types import EngineResult, ModelInfo, PromptResult, Run

# Where vLLM keeps its batch-invariant kernels (the module moved between releases).
_BATCH_INVARIANT_MODULES = ("model_executor/determinism/batch_invariant.py",
                            "model_executor/layers/batch_invariant.py")


def batch_invariant_support(on_gpu: bool) -> tuple[bool, str]:
    """(supported, why) for VLLM_BATCH_INVARIANT=1, decided without importing vllm or torch.

    vLLM enables it only in its GPU worker, on CUDA compute capability >= 8.0."""
    spec = find_spec("vllm")  # a top-level find_spec does not import the package
    if spec is None or not spec.submodule_search_locations:
        return False, "vLLM is not installed"
    root = Path(list(spec.submodule_search_locations)[0])
    if not any((root / m).is_file() for m in _BATCH_INVARIANT_MODULES):
        return False, "unsupported on this vLLM (no batch-invariant kernels)"
    if not on_gpu:
        return False, "unsupported on this vLLM/device: vLLM's CPU worker never enables it"
    cap = _compute_capability()
    if cap is not None and cap < 8.0:
        return False, f"unsupported on this device: compute capability {cap} < 8.0"
    return True, "supported"


def _compute_capability() -> float | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.split()
        return float(out[0]) if out else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


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


def _probe_engine(service: Any, prep: Any, engine: str, ids: list[int], n: int, batch: int,
                  emit: Any) -> tuple[dict[str, Any], EngineResult, dict[str, Any]]:
    alone, infos = service.generate_ids(prep, engine, [ids] * n, 1, emit)
    prompts: list[list[int]] = []
    where: list[int] = []
    others = companions(ids, batch)
    for r in range(n):  # the probed prompt at a different slot in each batch
        group = list(others)
        slot = r % batch
        group.insert(slot, ids)
        where.append(len(prompts) + slot)
        prompts.extend(group)
    batched, _ = service.generate_ids(prep, engine, prompts, batch, emit)
    a = [res.token_ids for res in alone]
    b = [batched[i].token_ids for i in where]
    return {"alone": summarize_outputs(a), "batched": summarize_outputs(b),
            "alone_vs_batched": summarize_outputs([a[0], *b])}, alone[0], infos


def run_probe(service: Any, model: str, prompt: PromptSpec, cfg: ParityConfig, *, n: int = 4, batch: int = 4,
              trust_remote_code: bool = False, emit: Any = None) -> Run:
    """Probe both engines' determinism on one prompt; store and return a Run of kind "probe".
    Never raises for a user or engine error: the run is stored with status "error"."""
    from .service import RunRequest, _utcnow

    t0 = time.perf_counter()
    emit = emit or (lambda e: None)
    run = Run(id=new_run_id(), created_utc=_utcnow(), model=ModelInfo(name=model, path=""), kind="probe",
              config=cfg.to_dict(), status="error", group_id=None,
              versions={"parity_ui": __version__, "python": platform.python_version()},
              prompts=[PromptResult(index=0, prompt_text=prompt.text or "", prompt_token_ids=[],
                                    messages=prompt.messages)])
    try:
        if n < 2 or batch < 2:
            raise ParityError(f"--n {n} --batch {batch}: a probe needs n >= 2 and batch >= 2",
                              "e.g. --n 4 --batch 4", code="config")
        req = RunRequest(model=model, prompts=[prompt], config=cfg, trust_remote_code=trust_remote_code)
        prep = service.prepare(req)
        run.model, run.warnings = prep.model, prep.warnings
        pr = run.prompts[0]
        pr.prompt_text, pr.prompt_token_ids = prep.prompts[0].text, prep.prompts[0].token_ids
        ids = pr.prompt_token_ids
        supported, why = batch_invariant_support(prep.resolved.on_gpu)
        probes: dict[str, Any] = {"n": n, "batch": batch, "batch_invariant": {"supported": supported,
                                                                                "detail": why}}
        modes = [False, True] if supported else [False]
        for inv in modes:
            c = dataclasses.replace(cfg, vllm=dataclasses.replace(cfg.vllm, batch_invariant=inv))
            p = service.prepare(dataclasses.replace(req, config=c))
            label = "vllm_batch_invariant" if inv else "vllm"
            emit_status(emit, f"probing {label}: {n} alone, {n} in batches of {batch}")
            probes[label], first, infos = _probe_engine(service, p, "vllm", ids, n, batch, emit)
            if not inv:
                pr.vllm = first
                run.engines, run.device = infos, infos["vllm"].device
        emit_status(emit, f"probing hf: {n} alone, {n} in batches of {batch}")
        probes["hf"], pr.hf, _ = _probe_engine(service, prep, "hf", ids, n, batch, emit)
        for res in (pr.vllm, pr.hf):
            res.text = prep.tokenizer.decode(res.token_ids)
            for step in res.steps:
                step.text = prep.tokenizer.token_text(step.token_id)
        run.versions.update({"vllm": run.engines["vllm"].version, "transformers": run.engines["hf"].version})
        run.probes = probes
        stable = all(probes[k][m]["distinct"] == 1 for k in probes if isinstance(probes[k], dict)
                     and "alone" in probes[k] for m in ("alone", "batched", "alone_vs_batched"))
        run.status = "ok" if stable else "diverged"
    except ParityError as e:
        run.status, run.error, run.error_code = "error", str(e), e.code
    except Exception as e:  # an internal bug: stored and reported
        run.status, run.error, run.error_code = "error", f"internal error: {type(e).__name__}: {e}", "internal"
    run.duration_ms = int((time.perf_counter() - t0) * 1000)
    save_run(service.db, run)
    return run


def emit_status(emit: Any, message: str) -> None:
    from .service import RunEvent

    emit(RunEvent("status", message))


def format_probe(run: Run) -> str:
    """The probe as lines for a terminal."""
    if run.status == "error":
        return f"probe {run.id}: ERROR: {run.error}"
    p = run.probes or {}
    lines = [f"probe {run.id}: {'DETERMINISTIC' if run.status == 'ok' else 'NOT DETERMINISTIC'}  "
             f"model={run.model.name}  dtype={run.config.get('dtype')}  n={p.get('n')}  batch={p.get('batch')}"]
    for label in ("vllm", "vllm_batch_invariant", "hf"):
        entry = p.get(label)
        if not entry:
            continue
        for mode, what in (("alone", "alone"), ("batched", "in a batch"), ("alone_vs_batched", "alone vs batched")):
            s = entry[mode]
            fork = "" if s["first_fork"] is None else f", first fork at token {s['first_fork']}"
            lines.append(f"  {label:20s} {what:17s}: {s['distinct']} distinct of {s['runs']}{fork}")
    bi = p.get("batch_invariant", {})
    if not bi.get("supported"):
        lines.append(f"  vLLM batch-invariant mode: {bi.get('detail')}")
    return "\n".join(lines)
