"""A new worker of a setup already seen: forked by a fork server (parity_ui.run.fork_server) against
started on its own, in one run of this script.

One service per mode (PARITY_FORK_SERVER=0, then 1) compares a tiny model built here, then --models - 1
others of the same setup (another seed: another model folder, so each needs new vLLM and HF workers, as
when a user switches models in the app), then the first model in bfloat16 (another load). Per mode: each
run's wall time, its "start" and "load" phases, and the CPU seconds of the whole process tree (the
service, its fork servers, its workers); the token ids and logprobs of every run must be the same in both
modes (asserted), and the first run of each mode pays the imports either way.

    python bench/worker_start.py [--models 3] [--tokens 16] [--out bench/figures/F.json]
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

ROOT = Path(__file__).resolve().parents[1]

ONE_MODE = r"""
import json, os, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import psutil
from parity_ui.core.config import build_config
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.prepare import RunRequest
from parity_ui.service import ParityService

def tree_cpu():
    me = psutil.Process(); total = sum(os.times()[:4])
    for c in me.children(recursive=True):
        try:
            t = c.cpu_times(); total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total

svc = ParityService(db_path={db!r})
out = []
for model, dtype in {runs!r}:
    c0, w0 = tree_cpu(), time.perf_counter()
    cfg = build_config(None, [f"dtype={{dtype}}", "max_new_tokens={tokens}", "ignore_eos=true"])
    run = svc.run(RunRequest(model=model, prompts=[PromptSpec(text="def parse_args(self, args=None):")], config=cfg))
    wall, cpu = time.perf_counter() - w0, tree_cpu() - c0
    p = run.prompts[0]
    out.append({{"model": os.path.basename(model), "dtype": dtype, "status": run.status, "wall_s": wall, "cpu_s": cpu,
                "start_s": run.timings.get("start", 0.0), "load_s": run.timings.get("load", 0.0),
                "tokens": {{s: r.token_ids for s, r in p.results.items()}},
                "logprobs": {{s: [st.logprob for st in r.steps] for s, r in p.results.items()}}}})
svc.close()
print("RESULT " + json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--out")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import build_model

    work = Path(tempfile.mkdtemp(prefix="parity-bench-worker-start-"))
    models = [str(build_model(work / f"m{i}", "qwen2", seed=i + 1)) for i in range(args.models)]
    runs = [(m, "float32") for m in models] + [(models[0], "bfloat16")]
    figures = {}
    for mode in ("0", "1"):
        script = ONE_MODE.format(root=str(ROOT), tests=str(ROOT / "tests"), db=str(work / f"runs-{mode}.db"),
                                 runs=runs, tokens=args.tokens)
        env = {**os.environ, "PARITY_FORK_SERVER": mode, "HF_HUB_OFFLINE": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"mode {mode} failed:\n{proc.stderr[-3000:]}")
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        figures[{"0": "on_its_own", "1": "forked"}[mode]] = {"runs": json.loads(line[7:]),
                                                             "process_s": time.perf_counter() - t0}
    own, forked = figures["on_its_own"]["runs"], figures["forked"]["runs"]
    for a, b in zip(own, forked):  # the same answers, bit for bit, whichever way the workers started
        assert a["status"] == b["status"] and a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"], (a, b)
    summary = {
        "runs": len(runs),
        "later_runs_cpu_s": {k: round(sum(r["cpu_s"] for r in v["runs"][1:]), 1) for k, v in figures.items()},
        "later_runs_wall_s": {k: round(sum(r["wall_s"] for r in v["runs"][1:]), 1) for k, v in figures.items()},
        "first_run_wall_s": {k: round(v["runs"][0]["wall_s"], 1) for k, v in figures.items()},
        "process_s": {k: round(v["process_s"], 1) for k, v in figures.items()},
        "same_tokens_and_logprobs": True,
        "load_average": os.getloadavg()[0],
    }
    for r in (*own, *forked):
        r.pop("tokens"), r.pop("logprobs")
    result = {"summary": summary, "figures": figures}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
