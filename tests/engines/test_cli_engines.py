"""The `parity` command as a user runs it, through real engines: a comparison as JSON, listed, shown and
reported; a CLI killed mid-run. The rest of the CLI, which runs no engine, is tests/unit/test_cli.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from parity_cli import parity, tiny  # noqa: F401  (tiny: a fixture)
from parity_ui.store.runs import get_run, list_runs, open_db


def test_compare_json_runs_list_show_and_report(tmp_path, tiny):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x):", "--json", "--set", "dtype=float32",
                  "--set", "max_new_tokens=16", "--set", "ignore_eos=true", db=db)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("schema", "run_id", "status", "identical", "first_divergence", "config", "warnings", "sides",
                "comparisons", "settings_diff", "timings"):
        assert key in out
    assert out["schema"] == 2 and out["reference"] == "hf"
    assert out["status"] == "ok" and out["identical"] is True and out["first_divergence"] is None
    assert [s["name"] for s in out["sides"]] == ["hf", "vllm"] and out["sides"][1]["resolved"]["engine"].startswith("vLLM")
    (c,) = out["comparisons"]
    assert (c["a"], c["b"], c["identical"], c["prompt"]) == ("hf", "vllm", True, 0)
    for side in ("vllm", "hf"):
        stream = out["prompts"][0]["sides"][side]
        assert len(stream["token_ids"]) == len(stream["logprobs"]) == 16 and isinstance(stream["text"], str)
    assert set(out["timings"]) >= {"prepare", "load", "generate", "compare"}
    listed = parity("runs", "list", db=db)
    assert out["run_id"] in listed.stdout and "hf=hf, vllm=vllm" in listed.stdout
    shown = parity("runs", "show", out["run_id"], "--json", db=db)
    assert json.loads(shown.stdout)["prompts"][0]["sides"]["vllm"]["token_ids"] == \
        out["prompts"][0]["sides"]["vllm"]["token_ids"]
    text = parity("runs", "show", out["run_id"], db=db)
    assert "vllm vs hf: IDENTICAL for all 16 tokens" in text.stdout
    report = tmp_path / "r.html"
    made = parity("report", out["run_id"], "-o", str(report), db=db)
    assert made.returncode == 0, made.stderr
    page = report.read_text()
    assert out["run_id"] in page and 'data-side="vllm"' in page and "resolved settings" in page
    assert "<script" in page and 'src="http' not in page and 'href="http' not in page  # self-contained
    missing = parity("runs", "show", "NOPE", db=db)
    assert missing.returncode == 2 and "no run with id" in missing.stderr


def test_a_cli_killed_mid_run_leaves_an_interrupted_run_and_no_worker(tmp_path, tiny_llama):
    import psutil

    db = tmp_path / "runs.db"
    cmd = [sys.executable, "-m", "parity_ui.cli", "--db", str(db), "compare", "--model", str(tiny_llama), "--prompt",
           "def f(x):", "--set", "dtype=float32", "--set", "max_new_tokens=600", "--set", "ignore_eos=true",
           "--side", "a=vllm", "--side", "b=hf", "--side", "c=vllm,max_num_seqs=8", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    run_id = None
    while time.monotonic() < deadline:  # wait until the first side has finished and been stored
        assert proc.poll() is None, "the CLI ended before it could be killed mid-run"
        rows = list_runs(open_db(db))
        if rows and rows[0].status == "running":
            run_id = rows[0].id
            run = get_run(open_db(db), run_id)
            a = run.prompts[0].results.get("a") if run.prompts else None
            if a is not None and a.finish_reason is not None:  # finished, not one of its streamed partial saves
                break
        time.sleep(0.2)
    assert run_id is not None, "the run never showed as running"
    workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in workers if psutil.pid_exists(p)], timeout=10)
    assert not alive, f"workers left behind: {[p.pid for p in alive]}"
    listed = parity("runs", "list", "--json", db=db)
    (row,) = json.loads(listed.stdout)
    assert row["id"] == run_id and row["status"] == "interrupted" and f"pid {proc.pid}" in row["error"]
    run = get_run(open_db(db), run_id)
    assert len(run.prompts[0].results["a"].token_ids) == 600  # what was made before the kill is kept
