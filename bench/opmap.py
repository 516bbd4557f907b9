"""The op map (issue 42, `parity layers ID --ops`) timed through parity-ui's own service.

    python3 bench/opmap.py --out $OUT              # the GPU machine: the demo model (SmolLM2-135M, 30 layers)
                                                   # in bf16, the map over 256 positions
    python bench/opmap.py --small --out /tmp/om    # the CPU: a tiny 4-layer Llama in bf16, 48 positions

What it does:
  1. a comparison of ref=hf against b=vllm (enforce_eager=true: the op map's own setup, so its workers are the
     comparison's, warm) in bf16 on a prompt long enough that prompt + the tokens both sides share reach the
     window (the bf16 fork: the two engines part after a few dozen tokens);
  2. the op map over the last WINDOW positions (layers x ops x positions), once to warm the workers (a
     vLLM sized for the map's context may load) and the hooks' kernels, then again: THE figure, seconds with the engines warm (goal: <= 60 s for 30 layers x 256 positions),
     with its passes (the reference's dump, the side's trace, the floor);
  3. the causal swap of the first op over the floor (or the last layer's q when none), timed;
  4. the bare engines doing one pass's work: one teacher-forced prefill of the same ids in each engine,
     eager, warm (vLLM max_tokens=1, HF one forward), in this process after the service is closed: the
     map's three passes against three bare prefills, as a ratio.
Writes OUT/opmap.json and prints a summary between the markers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models (--small)
BEGIN, END = "@@OPMAP_BEGIN@@", "@@OPMAP_END@@"

TEXT = (
    "Explain, step by step and with examples, how a compiler turns source code into machine code: the lexer, "
    "the parser and its grammar, the abstract syntax tree, semantic analysis and type checking, the intermediate "
    "representation, the classic optimisations (constant folding, dead code elimination, inlining, loop "
    "invariant code motion, register allocation by graph colouring), instruction selection and scheduling, and "
    "finally the linker. For each stage say what can go wrong, how a compiler engineer debugs it, which data "
    "structures are involved and why they were chosen, and give a short code sample in C or Python that makes "
    "the stage visible. End with a comparison of ahead-of-time and just-in-time compilation, the role of "
    "profile-guided optimisation, and what changes when the target is a GPU instead of a CPU. Then do the same "
    "for an interpreter: the bytecode compiler, the evaluation loop, the object model, reference counting and "
    "garbage collection, the calling convention, exceptions and tracebacks, and the import system; say where "
    "an interpreter spends its time on a typical web request, and which of the compiler's techniques carry over."
)  # long enough that the prompt alone fills the 256 positions mapped on the demo model


def build_small(folder: Path) -> Path:
    from tiny_models import build_model

    if (folder / "config.json").exists():
        return folder
    return build_model(folder, "llama", num_hidden_layers=4, dtype="bfloat16")


def compare(service: Any, model: str, max_new: int) -> Any:
    from parity_ui.core.config import build_config
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.prepare import RunRequest

    cfg = build_config(
        None,
        ["dtype=bfloat16", f"max_new_tokens={max_new}", "ignore_eos=true", "cross_score=false"],
        sides=["ref=hf", "b=vllm,enforce_eager=true"],
    )
    t0 = time.perf_counter()
    run = service.run(RunRequest(model=model, prompts=[PromptSpec(text=TEXT)], config=cfg))
    return run, time.perf_counter() - t0


def op_map(service: Any, run: Any, window: int, swap: str | None = None) -> tuple[Any, float]:
    c = run.prompts[0].comparisons[0]
    position = None if c.first_divergence is not None else c.compared - 1
    t0 = time.perf_counter()
    loc = service.localise(run, 0, position, None, ops=True, window=str(window), swap=swap)
    return loc, time.perf_counter() - t0


def figures(loc: Any, wall: float) -> dict[str, Any]:
    from parity_ui.core.op_map import op_map_from_dict

    if loc.error:
        return {"error": loc.error}
    m = op_map_from_dict(loc.op_map)
    first = m.first_over("add")
    over = m.over("add")
    out: dict[str, Any] = {
        "wall_s": round(wall, 2),
        "seconds": loc.seconds,
        "passes_s": loc.noise_floor.get("passes_s"),
        "layers": m.layers,
        "rows": len(m.rows),
        "positions": len(m.positions),
        "cells": len(m.rows) * len(m.positions),
        "stored_bytes": len(json.dumps(loc.op_map)),
        "first_over_floor": None if first is None else m.cell(*first),
        "ops_adding_error": [m.label(r) for r in range(len(m.rows)) if over[r].any()][:20],
        "summary": loc.summary,
        "notes": loc.notes,
    }
    if m.swap:
        out["swap"] = {k: m.swap[k] for k in ("label", "before", "after", "removes", "sentence")}
    return out


def bare(model: str, ids: list[int]) -> dict[str, float]:
    """One teacher-forced prefill of `ids` in each engine, eager, the second of two timed."""
    import torch

    out: dict[str, float] = {}
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to(dev).eval()
    x = torch.tensor([ids], device=dev)
    for _ in range(2):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            hf(input_ids=x, use_cache=False, logits_to_keep=1)
        if dev == "cuda":
            torch.cuda.synchronize()
        out["hf_prefill_s"] = time.perf_counter() - t0
    del hf
    if dev == "cuda":
        torch.cuda.empty_cache()
    from vllm import LLM, SamplingParams

    kw: dict[str, Any] = {"gpu_memory_utilization": 0.3} if dev == "cuda" else {}
    llm = LLM(model=model, dtype="bfloat16", enforce_eager=True, max_model_len=max(512, len(ids) + 8), **kw)
    for _ in range(2):
        t0 = time.perf_counter()
        llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        out["vllm_prefill_s"] = time.perf_counter() - t0
    return {k: round(v, 4) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/opmap-bench"))
    ap.add_argument("--small", action="store_true", help="the CPU: a tiny 4-layer Llama, 48 positions")
    ap.add_argument("--model", default=None, help="default: the demo model (SmolLM2-135M); --small: a tiny Llama")
    ap.add_argument("--window", type=int, default=None, help="positions mapped (default 256; --small 48)")
    ap.add_argument("--max-new", type=int, default=None, help="tokens generated (default 128; --small 24)")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare engines' prefills")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PARITY_DB", str(out / "runs.db"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from parity_ui.run.workers import EnginePool
    from parity_ui.service import ParityService

    window = args.window or (48 if args.small else 256)
    max_new = args.max_new or (24 if args.small else 128)
    model = args.model or (str(build_small(out / "tiny-llama-4l")) if args.small else "demo")
    gpu = torch.cuda.is_available()
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0) if gpu else None, "model": model}
    # The pool reuses a worker whose setup the next command needs and stops the others before it loads
    # (their GPU memory): the first map may load an eager vLLM sized for the map's context, the second
    # map finds both sides warm.
    service = ParityService(db_path=str(out / "runs.db"), pool=EnginePool())
    try:
        run, run_s = compare(service, model, max_new)
        c = run.prompts[0].comparisons[0]
        result["compare"] = {
            "status": run.status,
            "error": run.error,
            "seconds": round(run_s, 2),
            "prompt_tokens": len(run.prompts[0].prompt_token_ids),
            "first_divergence": c.first_divergence,
            "compared": c.compared,
        }
        if run.status not in ("ok", "diverged"):
            raise SystemExit(f"the comparison failed: {run.error}")
        warm_loc, warm_s = op_map(service, run, window)
        result["map_first"] = figures(warm_loc, warm_s)
        loc, wall = op_map(service, run, window)
        result["map_warm"] = figures(loc, wall)
        swap = None
        if not loc.error:
            from parity_ui.core.op_map import op_map_from_dict

            m = op_map_from_dict(loc.op_map)
            first = m.first_over("add")
            layer, op = m.rows[first[0]] if first is not None else (m.layers - 1, "q")
            if op in ("embed", "attn_resid", "logits"):
                layer, op = m.layers - 1, "q"
            swap = f"{'final' if layer >= m.layers else layer}.{op}"
            s_loc, s_wall = op_map(service, run, window, swap)
            result["map_swap"] = figures(s_loc, s_wall)
        ids = list(run.prompts[0].prompt_token_ids) + list(run.prompts[0].results["ref"].token_ids)
        n_ids = len(run.prompts[0].prompt_token_ids) + (
            c.first_divergence if c.first_divergence is not None else c.compared - 1
        )
        ids = ids[:n_ids]
    finally:
        service.close()
    if not args.no_bare:
        from parity_ui.inputs.models import describe_model

        b = bare(describe_model(model).path, ids)
        result["bare"] = b
        passes = (result.get("map_warm") or {}).get("passes_s") or {}
        if passes and all(passes.values()):
            work = passes["dump"] + passes["floor"] + passes["trace"]
            base = 2 * b["hf_prefill_s"] + b["vllm_prefill_s"]  # ref=hf dumps and floors, b=vllm traces
            result["ratio_passes_vs_bare_prefills"] = round(work / base, 2)
    (out / "opmap.json").write_text(json.dumps(result, indent=2, default=str))
    w = result.get("map_warm", {})
    print(BEGIN)
    print(
        f"op map, {result['model']} ({result['gpu'] or 'cpu'}): {w.get('layers')} layers x {w.get('rows')} op rows x "
        f"{w.get('positions')} positions = {w.get('cells')} cells; warm {w.get('wall_s')} s wall ({w.get('seconds')} s "
        f"inside; passes {w.get('passes_s')}); first map {result['map_first'].get('wall_s')} s; swap "
        f"{(result.get('map_swap') or {}).get('wall_s')} s ({swap}); stored {w.get('stored_bytes')} bytes"
    )
    print(f"first op over the floor: {(w.get('first_over_floor') or {}).get('label')}; summary: {w.get('summary')}")
    if "bare" in result:
        print(f"bare prefills {result['bare']}; passes / bare = {result.get('ratio_passes_vs_bare_prefills')}")
    print(END)


if __name__ == "__main__":
    main()
