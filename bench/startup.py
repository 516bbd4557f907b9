"""A fresh CLI process's own time before any engine starts (issue 33 item 4), for a before/after:

  preflight  `parity compare --chat` on a model with no chat template: the wall time to its refusal
             (needs no weights; the goal is <= 3 s on a busy 2-core machine)
  prepared   a fresh process: import the service, open its store, prepare() a comparison of the demo
             model (tokenizer, template, mapping, memory plan, preflight): the time before workers
             would start (goal <= 2 s on the GPU machine)
  imports    `import parity_ui.cli` and `import parity_ui.service`, alone

    python bench/startup.py [--tool-root DIR] [--label after] [--repeat 3] [--out bench/figures/F.json]

Each figure is the median of --repeat fresh processes; the machine's load average is recorded with it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PREPARED = r"""
import time; t0 = time.perf_counter()
from parity_ui.service import ParityService
from parity_ui.core.config import build_config
from parity_ui.run.plan import RunRequest
from parity_ui.inputs.prompts import PromptSpec
svc = ParityService(db_path={db!r})
t1 = time.perf_counter()
prep = svc.prepare(RunRequest(model="demo", prompts=[PromptSpec(text="Give me a brief explanation of gravity.")],
                              config=build_config(None, ["chat=true"])))
t2 = time.perf_counter()
print("TIMES", t1 - t0, t2 - t1, t2 - t0)
"""


def no_template_model(folder: Path) -> Path:
    """The demo model's config and tokenizer without its chat template (no weights needed)."""
    sys.path.insert(0, str(ROOT))
    from parity_ui.inputs.models import describe_model

    src = Path(describe_model("demo").path)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                 "merges.txt", "generation_config.json"):
        if (src / name).exists():
            text = (src / name).read_text()
            if name == "tokenizer_config.json":
                cfg = json.loads(text)
                cfg.pop("chat_template", None)
                text = json.dumps(cfg)
            (folder / name).write_text(text)
    return folder


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t = time.perf_counter()
    # cwd: `python -m`/`-c` put the working directory first on sys.path, ahead of PYTHONPATH (the tool
    # root leads it)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=env["PYTHONPATH"].split(os.pathsep)[0])
    return time.perf_counter() - t, p.stdout + p.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool-root", default=str(ROOT))
    ap.add_argument("--label", default="after")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="parity-startup-"))
    # the tool root first, then whatever the environment already had (the GPU machine's packages live
    # on PYTHONPATH: /tmp/site)
    path = os.pathsep.join(filter(None, [a.tool_root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PARITY_DB": str(tmp / "runs.db"), "HF_HUB_OFFLINE": "1"}
    model = no_template_model(tmp / "no-template")
    out: dict[str, list[float]] = {"preflight": [], "prepared": [], "import_cli": [], "import_service": []}
    load: list[float] = []
    for _ in range(a.repeat):
        load.append(os.getloadavg()[0])
        t, text = timed([py, "-m", "parity_ui.cli", "compare", "--model", str(model), "--prompt", "hi", "--chat"], env)
        assert "chat template" in text, text[-2000:]
        out["preflight"].append(t)
        _, text = timed([py, "-c", PREPARED.format(db=str(tmp / "p.db"))], env)
        line = next(x for x in text.splitlines() if x.startswith("TIMES"))
        out["prepared"].append(float(line.split()[3]))
        out["import_cli"].append(timed([py, "-c", "import parity_ui.cli"], env)[0])
        out["import_service"].append(timed([py, "-c", "import parity_ui.service"], env)[0])
    med = {k: round(statistics.median(v), 2) for k, v in out.items()}
    record = {"label": a.label, "date": date.today().isoformat(), "tool_root": a.tool_root, "median_s": med,
              "all_s": {k: [round(x, 2) for x in v] for k, v in out.items()}, "load1": [round(x, 2) for x in load],
              "cores": os.cpu_count()}
    print(json.dumps(record))
    if a.out:
        path = Path(a.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(old + [record], indent=1) + "\n")


if __name__ == "__main__":
    main()
