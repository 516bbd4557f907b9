"""The `parity` command as a user runs it: exit codes, messages, stored rows, no tracebacks (no engine runs;
the runs that do are in tests/engines/test_cli_engines.py)."""
from __future__ import annotations

import pytest

from parity_cli import parity, tiny  # noqa: F401  (tiny: a fixture)
from parity_ui.store.runs import get_run, list_runs, open_db
from tiny_models import build_model


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


def _nothing_stored(db):
    """A refusal before anything ran stores nothing, as the app (issue 46 item 5): no run, and no row
    of any table names one."""
    d = open_db(db)
    assert list_runs(d) == []
    for table in d.tables:
        if "run_id" in table.columns_dict:
            assert table.count == 0, table.name


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
    _nothing_stored(db)


@pytest.mark.parametrize("sides, needle", [
    (["a=nosuchkind", "b=hf"], "side 'a': unknown kind 'nosuchkind'"),
    (["a=vllm", "a=hf"], "side 'a': two sides have this name"),
    (["only=vllm"], "has 1 side; a comparison needs two or more"),
    (["a=hf,enforce_eager=true", "b=vllm"], "side 'a': 'enforce_eager' is not an option of kind hf"),
    (["a=hf", "b=vllm,deterministic=true"], "side 'b': 'deterministic' is not an option of kind vllm (it is an "
                                            "option of kind hf) Fix: vLLM's own switch for bitwise-reproducible "
                                            "batches is batch_invariant=true"),
    (["a=hf", "b=vllm,python=/no/such/python"], "side 'b': '/no/such/python' is not an executable file"),
    (["a=hf", "b=vllm,python=/bin/sh"], "side 'b'"),
])
def test_bad_sides_name_the_side_and_store_nothing(tmp_path, tiny, sides, needle):
    db = tmp_path / "runs.db"
    args = [a for s in sides for a in ("--side", s)]
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x):", "--set", "max_new_tokens=8", *args, db=db)
    _assert_clean_error(proc, needle)
    _nothing_stored(db)


def test_a_python_without_the_kinds_engine_is_refused_before_anything_loads(tmp_path, tiny):
    """An environment that has Python but no vLLM: the side is named, nothing starts."""
    import venv

    bare = tmp_path / "bare-env"
    venv.create(bare, with_pip=False)
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x):", "--set", "max_new_tokens=8",
                  "--side", "ref=hf", "--side", f"b=vllm,python={bare}/bin/python", db=db)
    _assert_clean_error(proc, "side 'b'", "has no vllm installed")
    _nothing_stored(db)  # refused before any worker started


def test_a_python_with_the_kinds_package_but_no_torch_is_refused_before_anything_loads(tmp_path, tiny):
    """An environment where transformers is installed but torch is not (a .pth into a venv since
    deleted, a half-done install): refused by name, not a worker's ModuleNotFoundError."""
    import venv

    bare = tmp_path / "no-torch-env"
    venv.create(bare, with_pip=False)
    site = next((bare / "lib").glob("python3*/site-packages"))
    dist = site / "transformers-5.0.0.dist-info"  # what importlib.metadata reads: the package is "installed"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.0.0\n")
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x):", "--set", "max_new_tokens=8",
                  "--side", "ref=hf", "--side", f"b=hf,python={bare}/bin/python", db=db)
    _assert_clean_error(proc, "side 'b'", "has no torch installed, which kind hf needs")
    _nothing_stored(db)


def test_missing_model_path(tmp_path):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tmp_path / "nope"), "--prompt", "hi", db=db)
    _assert_clean_error(proc, "not found", "does not exist")
    _nothing_stored(db)


def test_a_model_id_neither_a_folder_nor_reachable_is_not_found_and_nothing_is_stored(tmp_path, monkeypatch):
    """Issue 46 item 5: said as "not found" with each place tried, no raw hub-library text; nothing stored."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", "no-such-org/no-such-model", "--prompt", "hi", db=db)
    _assert_clean_error(proc, "model 'no-such-org/no-such-model' not found", "there is no folder",
                        "it is not in", "HF_HUB_OFFLINE=1", "hf download")
    _nothing_stored(db)


def test_a_chat_run_of_a_model_without_a_chat_template_stores_nothing(tmp_path, tiny):
    import json
    import shutil

    bare = tmp_path / "no-template"
    shutil.copytree(tiny, bare)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(bare), "--prompt", "def f(x):", "--chat", db=db)
    _assert_clean_error(proc, "chat=true but the model has no chat template")
    _nothing_stored(db)


def test_empty_prompt(tmp_path):
    db = tmp_path / "runs.db"
    _assert_clean_error(parity("compare", "--prompt", "   ", db=db), "the prompt is empty")
    _nothing_stored(db)


def test_non_utf8_prompt_file(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("caf\xe9".encode("latin-1"))
    db = tmp_path / "runs.db"
    _assert_clean_error(parity("compare", "--prompt-file", str(f), db=db), "is not UTF-8")
    _nothing_stored(db)


def test_prompt_longer_than_the_context(tmp_path, tiny):
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(tiny), "--prompt", "def f(x): return x + 1\n" * 20, db=db)
    _assert_clean_error(proc, "over the context of 64")
    _nothing_stored(db)


def test_max_model_len_past_the_models_positions_is_refused_before_anything_loads(tmp_path):
    """vLLM used to load, then fail with its raw ValidationError and 'see the worker log'."""
    model = build_model(tmp_path / "m512", "llama", max_position_embeddings=512)
    db = tmp_path / "runs.db"
    proc = parity("compare", "--model", str(model), "--prompt", "def f(x):", "--set", "max_model_len=2100", db=db)
    _assert_clean_error(proc, "config key 'max_model_len': 2,100 is over the 512 positions",
                        "lower max_model_len to 512 or less")
    assert "worker log" not in proc.stderr
    _nothing_stored(db)  # refused before anything loaded


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
    _nothing_stored(db)  # refused before anything loaded


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


def test_json_keeps_the_progress_on_stderr_and_quiet_drops_it(tmp_path, capsys):
    """Issue 46 item 10: under --json no progress reached stderr at all (long replays and workloads were
    silent). The object is alone on stdout; the progress lines stay on stderr unless --quiet. In this
    process on the fake kind (its workers in seconds)."""
    import json

    from fake_engine import fake_model, registered
    from parity_ui.cli import main

    with registered():
        model = str(fake_model(tmp_path / "fake", max_position_embeddings=64))
        args = ["compare", "--model", model, "--prompt", "def f(x):", "--side", "ref=fake", "--side", "b=fake",
                "--set", "max_new_tokens=4"]
        assert main(["--db", str(tmp_path / "a.db"), *args, "--json"]) == 0
        out = capsys.readouterr()
        assert json.loads(out.out)["status"] == "ok"  # stdout: the object alone
        assert "[parity] preparing" in out.err and "[parity] stored run" in out.err, out.err
        assert main(["--db", str(tmp_path / "b.db"), *args, "--json", "--quiet"]) == 0
        out = capsys.readouterr()
        assert json.loads(out.out)["status"] == "ok" and "[parity]" not in out.err


def test_the_shared_output_options_are_defined_once_and_mean_the_same_on_every_subcommand():
    """--json/--quiet/--db come from one helper (cli._add_output_args): --db after any subcommand
    overrides the top-level one, and a subcommand without it keeps the top-level one."""
    from parity_ui.cli import build_parser

    parser = build_parser()
    commands = {
        ("compare",): ["--prompt", "p"], ("replay",): ["d.jsonl", "--model", "m"], ("resume",): ["ID"], ("runs", "list"): [],
        ("runs", "show"): ["ID"], ("report",): ["ID"], ("layers",): ["ID"], ("bisect",): ["ID"],
        ("probe",): ["--prompt", "p"], ("sweep",): ["--prompt", "p", "--grid", "dtype=float32"],
        ("audit",): [], ("check",): ["gate.yaml"], ("weights",): ["--model", "B"],
    }
    for words, rest in commands.items():
        try:
            after = parser.parse_args(["--db", "top.db", *words, *rest, "--db", "mine.db"])
            kept = parser.parse_args(["--db", "top.db", *words, *rest])
        except SystemExit as e:  # a required option this table does not give: name it
            raise AssertionError(f"{' '.join(words)}: {e}") from e
        assert after.db == "mine.db", words
        assert kept.db == "top.db", words
        if words != ("report",):
            assert parser.parse_args([*words, *rest, "--json"]).json is True, words
    assert parser.parse_args(["audit", "--quiet"]).quiet is True
    assert not hasattr(parser.parse_args(["runs", "list"]), "quiet")  # nothing to quieten: no progress
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "ID", "--json"])
