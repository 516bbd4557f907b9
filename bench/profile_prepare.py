"""Where a fresh process spends its time before any engine starts: imports and `prepare()` (model
files, tokenizer, chat template, mapping, memory plan, preflight), profiled.

    python bench/profile_prepare.py [--model demo] [--top 25]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    from parity_ui.core.config import build_config
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.prepare import RunRequest, prepare
    from parity_ui.inputs.prompts import PromptSpec

    t_import = time.perf_counter()
    gpu = on_gpu()
    t_gpu = time.perf_counter()
    prep = prepare(RunRequest(model=args.model, prompts=[PromptSpec(text="Give me a brief explanation of gravity.")],
                              config=build_config(None, ["chat=true"])), gpu)
    t_prep = time.perf_counter()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())
    print(f"PREPARE imports {t_import - t0:.2f} s, on_gpu() {t_gpu - t_import:.2f} s, prepare() {t_prep - t_gpu:.2f} s; "
          f"{len(prep.sides)} sides, {len(prep.prompts[0].token_ids)} prompt tokens")


if __name__ == "__main__":
    main()
