"""An invariance audit (`parity audit`, issue 40) through parity-ui, timed per axis, against the bare vLLM
doing the audit's two main passes (every prompt alone, and the full batch) in one run.

    python3 bench/audit.py --setup vllm    --prompts 128 --tokens 512 --no-bare   # GPU: demo bf16, every axis
    python3 bench/audit.py --setup vllm-bi --prompts 128 --tokens 512 --no-bare   # the same, VLLM_BATCH_INVARIANT=1
    python3 bench/audit.py --setup vllm    --prompts 32  --tokens 512 --axes replay,batch   # the bare's ratio
    python3 bench/audit.py --setup hf      --prompts 16  --tokens 128             # HF bf16 (padded batches, kernels)
    python3 bench/audit.py --setup hf-det  --prompts 16  --tokens 128             # the same, deterministic=true
    python3 bench/audit.py --setup hf --setup hf-det --setup hf-det-nocudnn --prompts 16 --tokens 128 \
        --axes replay,instance          # the two same-setup axes only: three HF setups side by side in one command
    python3 bench/audit.py --setup vllm-8b --model /tmp/llama8b --prompts 24 --tokens 256 --no-bare   # 8B-shaped
    python bench/audit.py --small                                         # CPU, tiny, here: vllm and hf

One setup per command: a GPU command may run 10 minutes, and one audit of 128 prompts x 512 tokens is
meant to take at most that (the bare passes, another alone pass, would not fit beside it: the ratio
is measured at 32 prompts). Setups (one side each, audited alone):
- vllm:    b=vllm, dtype (bfloat16), enable_prefix_caching=true, CUDA graphs (vLLM's default on a GPU);
- vllm-bi: the same with batch_invariant=true (VLLM_BATCH_INVARIANT=1);
- hf:      ref=hf, dtype: batch 1 against a left-padded batch, eager against sdpa, decode against prefill;
- hf-det:  the same with deterministic=true (CUBLAS_WORKSPACE_CONFIG=:4096:8, torch's deterministic
  algorithms, cuDNN deterministic and, since the third 2026-11-28 lease, cuDNN's attention off): does
  the HF replay axis then hold on the GPU? (It did: bench/figures/gpu-2026-11-28c/det-*.)
- hf-det-nocudnn: hf-det with sdpa_kernels=no-cudnn spelled out. In that lease, before deterministic=true
  switched cuDNN's attention off, hf-det broke replay and a second instance as plain hf did, and this
  setup was certified: cuDNN's attention was the cause;
- vllm-8b: `vllm` on --model (bench/gpu33_build_llama8b.py builds the 8B-shaped model), where the
  kernels change with the batch.
Prompts: the built-in mixed-length set (parity_ui.inputs.audit_prompts), --prompts of up to --longest
words. Every axis unless --axes.

The tool: ParityService.audit on a fresh service (its workers start, load, run every axis's passes,
store every axis, the control, the evidence). Written: the audit's figures (verdict, each axis's status,
time, first break, tokens compared, tokens/s) and its certificate (JSON and HTML) under $OUT (or --out).
The bare engine (vLLM setups, unless --no-bare): vLLM loaded in a fresh process with exactly the
arguments the tool maps to, every prompt generated alone (the prefix cache emptied first, as the tool
does) after all of them in one call (the tool's order); like for like (asserted): its alone streams equal the tool's
stored alone streams, token ids and logprob bits. Ratios: the tool's alone pass and full-batch pass
against the bare ones (the goal is the whole audit in at most 10 minutes, not a ratio).
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bare_engines
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_models (--small)

from bare_engines import in_fresh_process  # noqa: E402

SETUPS = {
    "vllm": "b=vllm,dtype={dtype},enable_prefix_caching=true",
    "vllm-bi": "b=vllm,dtype={dtype},enable_prefix_caching=true,batch_invariant=true",
    "hf": "ref=hf,dtype={dtype}",
    "hf-det": "ref=hf,dtype={dtype},deterministic=true",
    "hf-det-nocudnn": "ref=hf,dtype={dtype},deterministic=true,sdpa_kernels=no-cudnn",
    "vllm-8b": "b=vllm,dtype={dtype},enable_prefix_caching=true",
}
GOAL_S = 600.0


def _config(args, setup: str):
    from parity_ui.core.config import build_config

    side = SETUPS[setup].format(dtype=args.dtype)
    # batch_size: what the audit sets it to (its full batch), so the bare vLLM loads with the same arguments
    settings = [f"max_new_tokens={args.tokens}", "ignore_eos=true", "logprobs=1", f"batch_size={args.prompts}"]
    if args.max_model_len:
        settings.append(f"max_model_len={args.max_model_len}")
    return build_config(None, settings, sides=[side], min_sides=1)


def _prompts(args):
    from parity_ui.inputs.audit_prompts import builtin_prompts

    return builtin_prompts(args.prompts, args.longest)


def _bits(x) -> str:
    return struct.pack("<f", x).hex() if x is not None else "none"


def bare_vllm(args, q) -> None:
    """The audit's alone and full-batch passes, in vLLM itself, with the tool's mapped arguments."""
    t0 = time.perf_counter()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.plan import RunRequest
    from parity_ui.run.prepare import prepare

    prep = prepare(RunRequest(model=args.model, prompts=_prompts(args), config=_config(args, args.setup)), on_gpu())
    v = prep.sides[0].args
    os.environ.update(v.env)
    from vllm import LLM, SamplingParams

    llm = LLM(**v.llm)
    sp = SamplingParams(**v.sampling)
    ids = [e.token_ids for e in prep.prompts]

    def gen(batch):
        outs = llm.generate([{"prompt_token_ids": x} for x in batch], sp, use_tqdm=False)
        return [(list(o.outputs[0].token_ids),
                 [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]) for o in outs]

    # In the tool's order: the full batch first (its first pass, which also pays the engine's warm-up),
    # then every prompt alone.
    llm.reset_prefix_cache()
    t = time.perf_counter()
    gen(ids)
    batch_s = time.perf_counter() - t
    t = time.perf_counter()
    alone = []
    for x in ids:
        llm.reset_prefix_cache()  # the tool's cold pass: nothing an earlier request left
        alone += gen([x])
    alone_s = time.perf_counter() - t
    q.put({"alone": [(a, [_bits(x) for x in lps]) for a, lps in alone], "alone_s": alone_s, "batch_s": batch_s,
           "wall_s": time.perf_counter() - t0})


def run_tool(args, setup: str) -> dict:
    from parity_ui.render.audit import audit_page_html, certificate_json, format_audit
    from parity_ui.service import AuditRequest, ParityService

    db = Path(tempfile.mkdtemp(prefix="parity-bench-audit-")) / "runs.db"
    svc = ParityService(db_path=str(db))
    t0 = time.perf_counter()
    try:
        out = svc.audit(AuditRequest(model=args.model, config=_config(args, setup), prompts=_prompts(args),
                                     axes=args.axes, source=f"bench/audit.py --setup {setup}"),
                        on_event=lambda e: print(f"[audit] {e.message}", file=sys.stderr, flush=True)
                        if e.kind == "status" else None)
        wall = time.perf_counter() - t0
        run, report = out.run, out.report
        stored = svc.get_run(run.id)
    finally:
        svc.close()
    print(format_audit(report, run.id))
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"audit-{setup}-certificate.json").write_text(json.dumps(certificate_json(report, run.id), default=str))
    (outdir / f"audit-{setup}-certificate.html").write_text(audit_page_html(report, run.id))
    side = report.sides[0]
    alone = [(list(p.results[side].token_ids), [_bits(s.logprob) for s in p.results[side].steps])
             for p in stored.prompts] if stored is not None and stored.prompts and side in stored.prompts[0].results else []
    return {
        "setup": setup,
        "run_id": run.id,
        "status": run.status,
        "error": run.error,
        "verdict": report.verdict,
        "certified": report.certified,
        "headline": report.headline(),
        "wall_s": round(wall, 2),
        "audit_s": report.seconds,
        "load_s": report.load_s,
        "tokens_checked": report.tokens_checked,
        "tokens_per_s": report.tokens_per_s,
        "goal_met": wall <= GOAL_S,
        "passes_s": report.passes,
        "axes": {r.axis: {"status": r.status, "seconds": r.seconds, "prompts": r.prompts, "broke": r.broken,
                          "tokens": r.tokens, "cached_tokens": r.cached_tokens, "settings": r.settings,
                          "first": r.first.describe() if r.first else None, "reason": r.reason,
                          "hint": r.hint}
                 for r in report.results},
        "controls": [{"kind": c.kind, "detected": c.detected, "description": c.description} for c in report.controls],
        # what the side's worker made of torch's determinism (hf sides: off, or on with the ops it warned about)
        "determinism": {k: v for k, v in ((report.evidence.get("sides") or {}).get(side, {}).get("resolved") or {}).items()
                        if k.startswith("determin") or k == "nondeterministic_ops"},
        "_alone": alone,
    }


def one(args, setup: str) -> dict:
    args.setup = setup
    tool = run_tool(args, setup)
    alone = tool.pop("_alone")
    if setup.startswith("vllm") and args.bare and tool["status"] in ("ok", "diverged"):
        bare = in_fresh_process(bare_vllm, args)
        same = bare["alone"] == [(a, b) for a, b in alone]
        assert same, "the bare vLLM's alone streams differ from the tool's (token ids or logprob bits)"
        tool["bare"] = {"alone_s": round(bare["alone_s"], 3), "batch_s": round(bare["batch_s"], 3),
                        "wall_s": round(bare["wall_s"], 2), "alone_streams_equal": same}
        p = tool["passes_s"].get(SETUPS[setup].split("=", 1)[0], {})
        if p.get("alone") and p.get("batch"):
            tool["ratio"] = {"alone": round(p["alone"] / bare["alone_s"], 3),
                             "batch": round(p["batch"] / bare["batch_s"], 3)}
    return tool


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="append", choices=sorted(SETUPS), help="repeatable (default: vllm)")
    ap.add_argument("--model", default=os.environ.get("PARITY_DEMO_MODEL") or "demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--longest", type=int, default=1500, help="the built-in set's longest prompt, in words")
    ap.add_argument("--axes", help="comma-separated (default: every axis)")
    ap.add_argument("--max-model-len", type=int, help="fixed context (default: what the prompts need)")
    ap.add_argument("--no-bare", dest="bare", action="store_false", help="skip the bare vLLM's passes")
    ap.add_argument("--small", action="store_true", help="CPU, here: a tiny model, 4 prompts x 8 tokens, float32")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/figures/audit")
    args = ap.parse_args()
    setups = args.setup or ["vllm"]
    if args.small:
        from tiny_models import build_model

        args.model = str(build_model(Path(tempfile.mkdtemp(prefix="parity-bench-tiny-")) / "llama", "llama"))
        args.dtype, args.prompts, args.tokens, args.longest, args.max_model_len = "float32", 4, 8, 300, 1024
        setups = args.setup or ["vllm", "hf"]  # batch invariance needs a GPU: vllm-bi is a GPU setup
    results = [one(args, s) for s in setups]
    for r in results:
        print(f"BENCH audit {r['setup']}: {r['verdict']} in {r['wall_s']:.1f} s (goal {GOAL_S:.0f} s: "
              f"{'met' if r['goal_met'] else 'MISSED'}); {r['tokens_checked']:,} tokens, {r['tokens_per_s']} tok/s; "
              + ", ".join(f"{k} {v['status']} {v['seconds']:.1f}s" for k, v in r["axes"].items()
                          if v["status"] not in ("not applicable", "not run"))
              + (f"; bare alone {r['bare']['alone_s']:.1f}s batch {r['bare']['batch_s']:.1f}s, ratio {r.get('ratio')}"
                 if "bare" in r else "")
              + (f"; {r['determinism']}" if r.get("determinism") else ""))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "audit-" + "-".join(setups) + ("-small" if args.small else "") + ".json"
    (out / name).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "results": results}, indent=1))
    print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
