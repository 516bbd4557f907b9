"""Issue 12's figures in one table, before and after, read from the files the benches wrote under
bench/figures (each row names its file; a ratio is always taken within one file, i.e. one run).
It measures nothing itself: rerun the bench a row names to refresh that row.

    python bench/summary.py
"""
from __future__ import annotations

import json
import re
from pathlib import Path

FIG = Path(__file__).resolve().parent / "figures"


def _json(rel: str) -> dict:
    return json.loads((FIG / rel).read_text(encoding="utf-8"))


def _per_token(rel: str, run: str, side: str) -> float:
    """ms per token of one side in a gpu_sides Markdown table."""
    for line in (FIG / rel).read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 8 and cells[0] == run and cells[2] == side:
            return float(cells[8])
    raise LookupError(f"no row {run}/{side} in {rel}")


def _opens(rel: str) -> dict[str, dict[str, float]]:
    """bench/ui_render's 'click Open -> panes shown and interactive' per case, per section of the file."""
    out: dict[str, dict[str, float]] = {}
    section = ""
    for line in (FIG / rel).read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:].split(" ")[0]
        m = re.match(r"\s*browser, (.*): click Open -> panes shown and interactive ([\d.]+) s", line)
        if m:
            out.setdefault(section, {}).setdefault(m.group(1), float(m.group(2)))
    return out


def rows() -> list[tuple[str, str, str, str, str]]:
    """(goal, figure, before, after, source)."""
    before = _json("gpu-2026-11-23b/cold-start-before-h100.json")
    gap = _json("gpu-2026-11-23d/cold-start-before-fix-machineA.json")
    after = _json("gpu-2026-11-23d/cold-start-after-fix.json")
    graphed = _json("gpu-2026-11-23c/cold-start-graphed-h100.json")
    out = [
        ("1 cold start", "first answer, fresh `parity compare`, caches cold",
         f"{before['tool_cold']['first_side_done_s']:.1f} s", f"{after['tool_cold']['first_side_done_s']:.1f} s",
         "gpu-2026-11-23b, -23d"),
        ("1 cold start", "first answer, caches warm", f"{before['tool_warm']['first_side_done_s']:.1f} s",
         f"{after['tool_warm']['first_side_done_s']:.1f} s "
         f"({graphed['tool_warm_graphed']['first_side_done_s']:.1f} s with decode=graphed, -23c)",
         "gpu-2026-11-23b, -23d"),
        ("1 cold start", "whole comparison, caches cold / warm",
         f"{before['tool_cold']['wall_s']:.1f} / {before['tool_warm']['wall_s']:.1f} s",
         f"{after['tool_cold']['wall_s']:.1f} / {after['tool_warm']['wall_s']:.1f} s", "gpu-2026-11-23b, -23d"),
        ("1 cold start", "vLLM load in the tool / bare LLM(...), cold / warm",
         f"{gap['ratio_cold']['vllm_load_tool_to_bare']:.2f} / {gap['ratio_warm']['vllm_load_tool_to_bare']:.2f}",
         f"{after['ratio_cold']['vllm_load_tool_to_bare']:.2f} / {after['ratio_warm']['vllm_load_tool_to_bare']:.2f}",
         "gpu-2026-11-23d (before: machine A, before the unpickling fix)"),
    ]
    fresh = _json("gpu-2026-11-23d/hf-decode-fresh-sdpa-kernels.json")["fresh_process"]
    out.append(("1 HF first call", "fresh bf16 process, first 256-token generate",
                f"{fresh['plain']['first_generate_s']:.1f} s (torch's kernels)",
                f"{fresh['no-cudnn-sdpa']['first_generate_s']:.1f} s (sdpa_kernels=no-cudnn, opt-in)",
                "gpu-2026-11-23d/hf-decode-fresh-sdpa-kernels.json"))
    paths = "gpu-2026-11-23c/hf-paths-h100.md"
    for dtype in ("bfloat16", "float32"):
        ref, fast, v = (_per_token(paths, f"hf_paths_{dtype}", s) for s in ("ref", "graphed", "v"))
        out.append(("2 HF reference speed", f"HF / vLLM (CUDA graphs) per token, {dtype}",
                    f"{ref / v:.1f}x (plain generate {ref:.1f} ms)", f"{fast / v:.2f}x (decode=graphed {fast:.2f} ms)",
                    paths))
    demo = _json("gpu-2026-11-23c/hf-decode-demo-h100.json")["paths"]["float32"]["graphed"]
    out.append(("2 HF reference speed", "decode=graphed vs plain generate, fp32: tokens, largest logprob gap", "",
                f"identical={demo['identical']}, {demo['max_abs_logprob_gap_before']:.1e}",
                "gpu-2026-11-23c/hf-decode-demo-h100.json"))
    gpu_overhead = _json("gpu-2026-11-23b/overhead-h100.json")["overhead_ratio"]
    cpu_overhead = _json("cpu-2026-11-23d/overhead-contention1-r5.json")["overhead_ratio"]
    out.append(("5 overhead", "tool / bare engines, H100, warm", "1.015 (issue)", f"{gpu_overhead:.3f}",
                "gpu-2026-11-23b/overhead-h100.json"))
    out.append(("5 overhead", "tool / bare engines, 2 CPU cores shared with a busy process", "1.20-1.24 (issue)",
                f"{cpu_overhead:.3f}", "cpu-2026-11-23d/overhead-contention1-r5.json"))
    opens = _opens("cpu-2026-11-23d/ui-render.txt")
    for case, after_s in opens.get("after", {}).items():
        out.append(("4 16k view", f"click to panes shown and interactive: {case}",
                    f"{opens['before'][case]:.2f} s" if case in opens.get("before", {}) else "",
                    f"{after_s:.2f} s", "cpu-2026-11-23d/ui-render.txt"))
    return out


def main() -> None:
    print("| goal | figure | before | after | source (bench/figures/) |")
    print("|---|---|---|---|---|")
    for row in rows():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
