"""The `parity` command as a user runs it: exit codes, messages, stored rows, no tracebacks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from parity_ui.store.runs import get_run, list_runs, open_db
from tiny_models import build_model


def parity(*args, db, timeout=600):
    return subprocess.run([sys.executable, "-m", "parity_ui.cli", "--db", str(db), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("cli") / "llama", "llama", max_position_embeddings=64)


def _assert_clean_error(proc, *needles):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Fix:" in proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr


def _only_run(db):
    rows = list_runs(open_db(db))
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("setting, needle", [
    ("top_p=1.5", "config key 'top_p'"),
    ("max_new_tokens=0", "config key 'max_new_tokens'"),
    ("no_such_key=1", "config key 'no_such_key'"),
    ("max_new_tokens=many", "config key 'max_new_tokens': must be an integer"),
    ("vllm.enforce_eager=maybe", "side 'vllm': option 'enforce_eager'"),
])
def test_invalid_config_values(tmp_path, setting, needle):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", "demo", "--prompt", "hi", "--set", setting, db=db)
    _assert_clean_error(proc, needle)
    row = _only_run(db)
    assert row.status == "error" and needle in row.error


@pytest.mark.parametrize("sides, needle", [
    (["a=nosuchkind", "b=hf"], "side 'a': unknown kind 'nosuchkind'"),
    (["a=vllm", "a=hf"], "side 'a': two sides have this name"),
    (["only=vllm"], "has 1 side; a comparison needs two or more"),
    (["a=hf,enforce_eager=true", "b=vllm"], "side 'a': 'enforce_eager' is not an option of kind hf"),
    (["a=hf", "b=vllm,python=/no/such/python"], "side 'b': '/no/such/python' is not an executable file"),
    (["a=hf", "b=vllm,python=/bin/sh"], "side 'b'"),
])
def test_bad_sides_name_the_side_and_are_stored(tmp_path, tiny, sides, needle):
    db = tmp_path / "runs.db"
    args = [a for s in sides for a in ("--side", s)]
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x):", "--set", "max_new_tokens=8", *args, db=db)
    _assert_clean_error(proc, needle)
    row = _only_run(db)
    assert row.status == "error" and needle in row.error


def test_a_python_without_the_kinds_engine_is_refused_before_anything_loads(tmp_path, tiny):
    """An environment that has Python but no vLLM: the side is named, nothing starts."""
    import venv

    bare = tmp_path / "bare-env"
    venv.create(bare, with_pip=False)
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x):", "--set", "max_new_tokens=8",
                  "--side", "ref=hf", "--side", f"b=vllm,python={bare}/bin/python", db=db)
    _assert_clean_error(proc, "side 'b'", "has no vllm installed")
    run = get_run(open_db(db), _only_run(db).id)
    assert "start" not in run.timings  # refused before any worker started


def test_missing_model_path(tmp_path):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tmp_path / "nope"), "--prompt", "hi", db=db)
    _assert_clean_error(proc, "does not exist")
    assert _only_run(db).status == "error"


def test_empty_prompt(tmp_path):
    db = tmp_path / "runs.db"
    _assert_clean_error(parity("compare", "--prompt", "   ", db=db), "the prompt is empty")
    assert _only_run(db).status == "error"


def test_non_utf8_prompt_file(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("caf\xe9".encode("latin-1"))
    db = tmp_path / "runs.db"
    _assert_clean_error(parity("compare", "--prompt-file", str(f), db=db), "is not UTF-8")
    assert _only_run(db).error_code == "prompt"


def test_prompt_longer_than_the_context(tmp_path, tiny):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x): return x + 1\n" * 20, db=db)
    _assert_clean_error(proc, "over the context of 64")
    row = _only_run(db)
    assert row.status == "error" and row.error_code == "prompt"


def test_max_model_len_past_the_models_positions_is_refused_before_anything_loads(tmp_path):
    """vLLM used to load, then fail with its raw ValidationError and 'see the worker log'."""
    model = build_model(tmp_path / "m512", "llama", max_position_embeddings=512)
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(model), "--prompt", "def f(x):", "--set", "max_model_len=2100", db=db)
    _assert_clean_error(proc, "config key 'max_model_len': 2,100 is over the 512 positions",
                        "lower max_model_len to 512 or less")
    assert "worker log" not in proc.stderr
    run = get_run(open_db(db), _only_run(db).id)
    assert run.status == "error" and run.error_code == "config" and "load" not in run.timings


def test_max_model_len_over_a_cpu_sides_kv_cache_is_refused_before_anything_loads(tmp_path):
    """12 KiB of KV a token: 131,072 positions need 1.5 GiB, over a CPU vLLM side's 1 GiB."""
    model = build_model(tmp_path / "long", "llama", max_position_embeddings=131072, num_hidden_layers=3,
                        num_key_value_heads=4, head_dim=128)
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(model), "--prompt", "def f(x):", "--set", "max_model_len=131072", db=db)
    _assert_clean_error(proc, "side 'vllm': max_model_len=131,072 needs 1.50 GiB of KV cache",
                        "over this side's kv_cache_gib=1", "lower max_model_len to 87,168",
                        "--set vllm.kv_cache_gib=1.51")
    assert "worker log" not in proc.stderr
    run = get_run(open_db(db), _only_run(db).id)
    assert run.status == "error" and run.error_code == "side" and "load" not in run.timings


@pytest.mark.parametrize("command", [["probe", "--n", "2", "--batch", "2"], ["sweep", "--grid", "dtype=float32,bfloat16"]])
def test_probe_and_sweep_store_a_failed_run_for_an_invalid_set(tmp_path, tiny, command):
    db = tmp_path / "runs.db"
    proc = parity(*command, "--model", str(tiny), "--prompt", "def f(x):", "--set", "top_p=7", db=db)
    _assert_clean_error(proc, "config key 'top_p'")
    row = _only_run(db)
    assert row.status == "error" and row.kind == command[0] and "top_p" in row.error


def test_sweep_stores_a_failed_run_for_an_invalid_grid(tmp_path, tiny):
    db = tmp_path / "runs.db"
    proc = parity("sweep", "--model", str(tiny), "--prompt", "def f(x):", "--grid", "dtype", db=db)
    _assert_clean_error(proc, "is not of the form key=v1,v2")
    assert _only_run(db).kind == "sweep"


def test_config_show_prints_one_column_per_side(tmp_path, tiny):
    proc = parity("config", "show", "--model", str(tiny), "--set", "temperature=0.7", "--set", "top_k=0",
                  "--side", "ref=hf", "--side", "b=vllm,enforce_eager=false", db=tmp_path / "x.db")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert "| ref (hf) | b (vllm) |" in lines[0]
    rows = {line.split("|")[1].strip(): line for line in lines}
    assert "SamplingParams.top_k=0" in rows["top_k"] and "generate.top_k=0" in rows["top_k"]
    assert "generate.do_sample=True" in rows["temperature"]
    assert "LLM.enforce_eager=False" in rows["b.enforce_eager"]


def test_config_show_yaml_lists_the_sides(tmp_path):
    proc = parity("config", "show", "--yaml", "--sides-preset", "eager-vs-graphs", db=tmp_path / "x.db")
    assert proc.returncode == 0, proc.stderr
    assert "name: eager" in proc.stdout and "enforce_eager: false" in proc.stdout


@pytest.mark.engines
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


@pytest.mark.engines
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
