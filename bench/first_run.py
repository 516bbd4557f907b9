"""A newcomer's first run against the second: `prepare()` of a demo comparison in a fresh process whose
tokenizer has never been verified ("cold": an empty parity-ui cache, as on a fresh machine) and again
once the first run left its verdict ("warm"), issue 44.

    python bench/first_run.py [--model demo] [--repeat 3] [--out $OUT/first_run.json]

Each repeat: a new empty PARITY_CACHE_DIR (the demo model itself is read where it is:
PARITY_DEMO_MODEL), one fresh process timed cold, then one warm. A process imports the service, opens
its store, prepares the gravity chat prompt (tokenizer, template, mapping, memory plan, preflight),
then waits for the tokenizer's verdict as a run does before its first generate (settle_tokenizers);
it reports both times and whether it imported transformers or torch itself. Before issue 44 the cold
prepare imported transformers and torch to verify the light tokenizer (15.2 s on the GPU machine,
0.45 s warm); now the verification runs in another process beside it. Goal: prepare <= 2 s cold.

The whole first `parity compare` against the bare engines is bench/cold_start.py --fresh-tokenizer.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Give me a brief explanation of gravity in simple terms."

CHILD = r"""
import sys, time; t0 = time.perf_counter()
from parity_ui.service import ParityService
from parity_ui.core.config import build_config
from parity_ui.run.plan import RunRequest
from parity_ui.inputs.prompts import PromptSpec
try:
    from parity_ui.inputs.prompts import settle_tokenizers
except ImportError:  # a checkout before issue 44: prepare verified the tokenizer itself
    settle_tokenizers = lambda: None
svc = ParityService(db_path={db!r})
t1 = time.perf_counter()
prep = svc.prepare(RunRequest(model={model!r}, prompts=[PromptSpec(text={prompt!r})],
                              config=build_config(None, ["chat=true"])))
t2 = time.perf_counter()
parent = ("transformers" in sys.modules, "torch" in sys.modules)
settle_tokenizers()
t3 = time.perf_counter()
print("FIRST-RUN " + __import__("json").dumps({{"import_and_store_s": t1 - t0, "prepare_s": t2 - t1,
      "to_prepared_s": t2 - t0, "verdict_wait_s": t3 - t2, "transformers_in_parent": parent[0],
      "torch_in_parent": parent[1], "light": prep.tokenizer.light, "prompt_tokens": len(prep.prompts[0].token_ids)}}))
"""


def demo_path(model: str) -> str:
    sys.path.insert(0, str(ROOT))
    from parity_ui.inputs.models import describe_model

    return describe_model(model).path


def one(model: str, cache: Path, work: Path, root: Path) -> dict:
    env = {**os.environ, "PARITY_CACHE_DIR": str(cache), "PARITY_DEMO_MODEL": demo_path("demo"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    code = CHILD.format(db=str(work / f"runs-{os.getpid()}.db"), model=model, prompt=PROMPT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                         timeout=600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("FIRST-RUN ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"the child failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(line[len("FIRST-RUN "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tool-root", default=str(ROOT), help="the checkout timed (another one for a before/after)")
    ap.add_argument("--out", help="write the figures as JSON here (default $OUT/first_run.json when $OUT is set)")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="parity-first-run-") as d:
        for i in range(args.repeat):
            cache = Path(d) / f"cache-{i}"
            cache.mkdir()
            cold = one(args.model, cache, Path(d), Path(args.tool_root))
            assert any((cache / "tokenizer-checks").glob("*.json")), "the cold run left no tokenizer verdict"
            warm = one(args.model, cache, Path(d), Path(args.tool_root))
            runs.append({"cold": cold, "warm": warm})
    med = {k: {f: statistics.median(r[k][f] for r in runs) for f in ("prepare_s", "to_prepared_s", "verdict_wait_s")}
           for k in ("cold", "warm")}
    figures = {"model": args.model, "repeat": args.repeat, "tool_root": args.tool_root, "load_average": os.getloadavg(), "median": med,
               "runs": runs, "goal_prepare_cold_s": 2.0, "meets_goal": med["cold"]["prepare_s"] <= 2.0}
    text = json.dumps(figures, indent=2)
    print(text)
    out = args.out or (str(Path(os.environ["OUT"]) / "first_run.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(text)


if __name__ == "__main__":
    main()
