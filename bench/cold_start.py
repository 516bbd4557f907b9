"""Cold start: a fresh `parity compare` process to its first result, per phase, against bare engines
started fresh with exactly the arguments the tool maps to, in one run.

    python bench/cold_start.py [--model demo] [--dtype bfloat16] [--max-new-tokens 256] [--out F.json]

Measured, each in a fresh process:
  tool      `python -m parity_ui.cli compare --json` (wall clock; its phases and each side's load)
  bare vLLM LLM(**the tool's arguments) + one generate (time to the first result)
  bare HF   from_pretrained + .to(device) + one generate (likewise)
Ratios: tool wall / (bare vLLM + bare HF) (the tool loads its sides in parallel where it can, the bare
ones run one after the other), and the tool's vLLM load / bare vLLM start. The token ids of the bare
runs must equal the tool's (asserted): the same work.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines

from bare_engines import in_fresh_process  # noqa: E402

PROMPT = "Give me a brief explanation of gravity in simple terms."


def _overrides(args) -> list[str]:
    return [f"dtype={args.dtype}", f"max_new_tokens={args.max_new_tokens}", "ignore_eos=true", "chat=true",
            "cross_score=false"]


def _prep(args):
    from parity_ui.config import build_config
    from parity_ui.hardware import on_gpu
    from parity_ui.prepare import RunRequest, prepare
    from parity_ui.prompts import PromptSpec

    cfg = build_config(None, _overrides(args))
    return prepare(RunRequest(model=args.model, prompts=[PromptSpec(text=PROMPT)], config=cfg), on_gpu())


def bare_vllm(args, q) -> None:
    t0 = time.perf_counter()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    prep = _prep(args)
    v = prep.side("vllm").args
    os.environ.update(v.env)
    from vllm import LLM, SamplingParams

    t_import = time.perf_counter()
    llm = LLM(**v.llm)
    t_load = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prep.prompts[0].token_ids}], SamplingParams(**v.sampling), use_tqdm=False)
    q.put({"first_result_s": time.perf_counter() - t0, "load_s": t_load - t_import,
           "generate_s": time.perf_counter() - t_load, "token_ids": list(out[0].outputs[0].token_ids)})


def bare_hf(args, q) -> None:
    t0 = time.perf_counter()
    import torch

    from bare_engines import load_bare_hf

    prep = _prep(args)
    t_import = time.perf_counter()
    model, ids, gc = load_bare_hf(prep)
    t_load = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    q.put({"first_result_s": time.perf_counter() - t0, "load_s": t_load - t_import,
           "generate_s": time.perf_counter() - t_load, "token_ids": out.sequences[0, ids.shape[1]:].tolist()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "parity_ui.cli", "--db", str(Path(d) / "runs.db"), "compare", "--model",
               args.model, "--prompt", PROMPT, "--json", "--quiet"]
        for o in _overrides(args):
            cmd += ["--set", o]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        tool_wall = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        raise SystemExit(f"the tool failed: {proc.stderr[-2000:]}")
    run = json.loads(proc.stdout)
    v = in_fresh_process(bare_vllm, args)
    h = in_fresh_process(bare_hf, args)
    sides = run["prompts"][0]["sides"]
    assert sides["vllm"]["token_ids"] == v["token_ids"], "bare vLLM generated other tokens than the tool"
    assert sides["hf"]["token_ids"] == h["token_ids"], "bare HF generated other tokens than the tool"
    loads = {s["name"]: s.get("load_s") for s in run["sides"]}
    figures = {
        "model": args.model, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens, "device": run.get("device"),
        "tool": {"wall_s": tool_wall, "phases_s": run.get("timings"), "side_load_s": loads},
        "bare_vllm": {k: v[k] for k in ("first_result_s", "load_s", "generate_s")},
        "bare_hf": {k: h[k] for k in ("first_result_s", "load_s", "generate_s")},
        "ratio_tool_wall_to_bare_sum": tool_wall / (v["first_result_s"] + h["first_result_s"]),
        "ratio_vllm_load_tool_to_bare": (loads.get("vllm") or 0) / v["load_s"] if v["load_s"] else None,
        "tokens": len(v["token_ids"]),
    }
    print("COLD-START " + json.dumps(figures))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
