"""The `parity` command as a user runs it: exit codes, messages, stored rows, no tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from parity_ui.store import list_runs, open_db
from tiny_models import build_model


def parity(*args, db):
    proc = subprocess.run([sys.executable, "-m", "parity_ui.cli", "--db", str(db), *args],
                          capture_output=True, text=True, timeout=600)
    return proc


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
    ("vllm.enforce_eager=maybe", "config key 'vllm.enforce_eager'"),
])
def test_invalid_config_values(tmp_path, setting, needle):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", "demo", "--prompt", "hi", "--set", setting, db=db)
    _assert_clean_error(proc, needle)
    row = _only_run(db)
    assert row.status == "error" and needle in row.error


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


def test_config_show_prints_the_mapping_table(tmp_path, tiny):
    proc = parity("config", "show", "--model", str(tiny), "--set", "temperature=0.7", "--set", "top_k=0", db=tmp_path / "x.db")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert "SamplingParams.top_k=0" in rows["top_k"] and "generate.top_k=0" in rows["top_k"]
    assert "generate.do_sample=True" in rows["temperature"]


@pytest.mark.engines
def test_compare_json_runs_list_and_show(tmp_path, tiny):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x):", "--json", "--set", "dtype=float32",
                  "--set", "max_new_tokens=16", "--set", "ignore_eos=true", db=db)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("run_id", "status", "identical", "first_divergence", "config", "warnings"):
        assert key in out
    assert out["status"] == "ok" and out["identical"] is True and out["first_divergence"] is None
    for engine in ("vllm", "hf"):
        assert len(out[engine]["token_ids"]) == len(out[engine]["logprobs"]) == 16
        assert isinstance(out[engine]["text"], str)
    listed = parity("runs", "list", db=db)
    assert out["run_id"] in listed.stdout
    shown = parity("runs", "show", out["run_id"], "--json", db=db)
    assert json.loads(shown.stdout)["vllm"]["token_ids"] == out["vllm"]["token_ids"]
    missing = parity("runs", "show", "NOPE", db=db)
    assert missing.returncode == 2 and "no run with id" in missing.stderr
