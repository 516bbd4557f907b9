"""The GPU figures: demo model, bf16 (eager, CUDA graphs) and fp32 (eager), short chat prompt and a
9k-token prompt, through the `parity` CLI itself. Writes a Markdown table and the raw JSON to --out.
    python bench/gpu_report.py --out DIR [--max-new-tokens 256] [--tokens 9000]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODES = [("bfloat16", True, "bf16, enforce_eager"), ("bfloat16", False, "bf16, CUDA graphs"),
         ("float32", True, "fp32, enforce_eager")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=9000)
    ap.add_argument("--modes", default="0,1,2")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "prompts.jsonl"
    subprocess.run([sys.executable, "bench/long_prompt.py", "--tokens", str(args.tokens), "--out", str(prompts)],
                   check=True)
    rows = ["| mode | prompt tokens | first divergence | HF top-2 margin there | verdict | max abs logprob gap before | "
            "vLLM load / total | HF load / total | exit |", "|---|---|---|---|---|---|---|---|---|"]
    for m in [MODES[int(i)] for i in args.modes.split(",")]:
        dtype, eager, label = m
        cmd = [sys.executable, "-m", "parity_ui.cli", "--db", str(out / "runs.db"), "compare", "--model", "demo",
               "--prompt-file", str(prompts), "--preset", "long-context-9k", "--set", f"dtype={dtype}",
               "--set", f"vllm.enforce_eager={'true' if eager else 'false'}", "--set",
               f"max_new_tokens={args.max_new_tokens}", "--set", "ignore_eos=true", "--json", "--quiet"]
        t = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t
        (out / f"{dtype}-{'eager' if eager else 'graphs'}.json").write_text(proc.stdout or "{}")
        if not proc.stdout.strip():
            rows.append(f"| {label} | - | ERROR | | | | | | {proc.returncode}: {proc.stderr.strip()[-300:]} |")
            continue
        d = json.loads(proc.stdout)
        for p in d["prompts"]:
            c = p["comparison"] or {}
            fd = p["first_divergence"]
            margin = ""
            if fd is not None and p["hf"] and fd < len(p["hf"]["top_logprobs"]):
                top = p["hf"]["top_logprobs"][fd]
                if len(top) > 1:
                    margin = f"{top[0]['logprob'] - top[1]['logprob']:.3f}"
            verdict = (p.get("explanation") or {}).get("verdict", "")
            gap = c.get("max_abs_gap")
            v, h = p["vllm"]["timings"], p["hf"]["timings"]
            rows.append(f"| {label} | {p['prompt_tokens']} | {fd if fd is not None else 'none (identical)'} | {margin} | "
                        f"{verdict} | {gap:.4g} | {v['load_s']:.1f}s / {v['total_s']:.2f}s | "
                        f"{h['load_s']:.1f}s / {h['total_s']:.2f}s | {proc.returncode} |"
                        if gap is not None else f"| {label} | {p['prompt_tokens']} | {fd} | {margin} | {verdict} | n/a | | | {proc.returncode} |")
        print(f"{label}: exit {proc.returncode} in {wall:.0f}s", flush=True)
    table = "\n".join(rows)
    (out / "gpu_figures.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
