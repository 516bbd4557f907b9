"""The run store: migrations (also of a database made by parity-ui 0.1), a full Run round trip,
error runs, interrupted runs, history filters, run ids."""
from __future__ import annotations

import math
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from parity_ui.store import runs as store
from parity_ui.analysis.compare import compare
from parity_ui.core.config import ParityConfig, config_from_dict
from parity_ui.core.findings import CrossScores, Explanation, GapStats, SideAtFork
from parity_ui.core.runlog import this_owner
from parity_ui.store.runs import get_run, list_runs, mark_interrupted, new_run_id, open_db, save_run
from parity_ui.core.types import (Finding, ModelInfo, PromptResult, Run, SideInfo, SideResult, SideTimings, TokenStep,
                             TopLogprob, to_dict)

LEGACY_DB = Path(__file__).resolve().parents[1] / "fixtures" / "runs-v0.1.0.db"  # made by parity-ui 0.1.0 (vLLM/HF pair)


@pytest.fixture
def db():
    d = open_db(":memory:")
    yield d
    d.close()


def side_result(side: str, index: int, ids: list[int]) -> SideResult:
    steps = [TokenStep(position=i, token_id=t, text=f"tok{t}", logprob=-0.25 * (i + 1), rank=1,
                       top=[TopLogprob(t, -0.25 * (i + 1), f"tok{t}"), TopLogprob(t + 100, -1e30, "\ufffd", "e2")],
                       raw="e2" if t == 7 else None)
             for i, t in enumerate(ids)]
    return SideResult(side=side, prompt_index=index, token_ids=ids, steps=steps, text="".join(s.text for s in steps),
                      finish_reason="length", timings=SideTimings(load_s=1.5, prefill_s=0.01, total_s=0.2))


def prompt_result(index: int, sides: dict[str, list[int]], **kw) -> PromptResult:
    results = {name: side_result(name, index, ids) for name, ids in sides.items()}
    ref, *others = results.values()
    comps = [compare(ref, b) for b in others]
    for c in comps:
        c.explanation = Explanation(verdict="identical" if c.identical else "near-tie", summary="s",
                                    thresholds={"x": 1.0}, differing_settings=["dtype"], sides=[c.a, c.b],
                                    a=SideAtFork(name=c.a, token_id=5, other_token_rank=None))
        c.cross_scores = CrossScores(directions={f"{c.b}_by_{c.a}": GapStats(c.b, c.a, 2, 1, rms_gap=0.1,
                                                                             gaps=[0.1, None]),
                                                 f"{c.a}_by_{c.b}": None})
    return PromptResult(index=index, prompt_text=f"<s>prompt {index}", prompt_token_ids=[1, 10 + index],
                        results=results, comparisons=comps, **kw)


def full_run(run_id: str = "01FULLRUN", created: str = "2026-01-02T10:00:00.000+00:00", **kw) -> Run:
    prompts = [
        prompt_result(0, {"ref": [5, 6, 7], "a": [5, 6, 7], "b": [5, 6, 7]}),
        prompt_result(1, {"ref": [5, 6, 7], "a": [5, 6, 7], "b": [5, 8, 7]},
                      messages=[{"role": "user", "content": "héllo | there"}]),
    ]
    sides = [SideInfo(name="ref", kind="hf", reference=True, options={"dtype": "float32"}, model_path="/models/demo",
                      version="5.0.0", device="cpu", dtype="float32", versions={"transformers": "5.0.0"},
                      resolved={"attention": "sdpa"}, load_s=1.5),
             SideInfo(name="a", kind="vllm", dtype="float32", device="cpu", python="/opt/old/bin/python"),
             SideInfo(name="b", kind="vllm", dtype="bfloat16", device="cpu", resolved={"cuda_graphs": "off"})]
    base = dict(
        id=run_id, created_utc=created,
        model=ModelInfo(name="demo", path="/models/demo", architecture="LlamaForCausalLM", model_type="llama",
                        config_dtype="bfloat16", eos_token_ids=[2, 3], generation_config={"temperature": 0.6},
                        rope_parameters={"rope_theta": 10000.0}, head_dim=64),
        config=ParityConfig().to_dict(), status="diverged", prompts=prompts, sides=sides,
        warnings=[Finding(code="prefix-caching", severity="warning", message="on", fix="off",
                          setting={"key": "b.enable_prefix_caching", "value": False}, side="b")],
        versions={"parity_ui": "0.2.0"}, duration_ms=1234, group_id="g1", timings={"load": 1.5, "generate": 0.4},
    )
    return Run(**{**base, **kw})


def error_run(run_id: str = "01ERRRUN", created: str = "2026-01-01T09:00:00.000+00:00", **kw) -> Run:
    base = dict(id=run_id, created_utc=created, model=ModelInfo(name="broken", path="/models/broken"),
                config={"dtype": "auto"}, status="error", error="side b: the engine process was killed",
                error_code="engine")
    return Run(**{**base, **kw})


# --- migrations -----------------------------------------------------------------------------


def test_migrations_apply_twice_safely(tmp_path):
    path = tmp_path / "sub" / "runs.db"
    db = open_db(path)
    save_run(db, full_run())
    store.migrations.apply(db)  # again on the same connection
    db.close()
    db = open_db(path)  # and again on reopening
    assert {"runs", "prompt_results", "side_results", "comparisons"} <= set(db.table_names())
    applied = list(db.query("SELECT name FROM _sqlite_migrations WHERE migration_set = 'parity_ui'"))
    assert [r["name"] for r in applied] == ["m001_runs", "m002_sides", "m003_localisations", "m004_images",
                                            "m005_step_columns", "m006_workloads", "m007_bisect", "m008_gate",
                                            "m009_replay_pair_names", "m010_audits",
                                            "m011_weight_checks", "m012_trends"]
    assert to_dict(get_run(db, "01FULLRUN")) == to_dict(full_run())  # the data survived
    db.close()


@pytest.fixture
def legacy(tmp_path):
    """A copy of the database parity-ui 0.1.0 wrote (kept as a fixture), before and after opening."""
    path = tmp_path / "runs.db"
    shutil.copy(LEGACY_DB, path)
    raw = sqlite3.connect(path)
    raw.row_factory = sqlite3.Row
    before = {
        "runs": [dict(r) for r in raw.execute("SELECT * FROM runs ORDER BY id")],
        "prompts": [dict(r) for r in raw.execute("SELECT * FROM prompt_results ORDER BY run_id, idx")],
    }
    raw.close()
    db = open_db(path)
    yield before, db
    db.close()


def test_a_database_made_by_0_1_migrates_in_place_with_nothing_lost(legacy):
    import json

    before, db = legacy
    assert "engines_json" in before["runs"][0] and "vllm_json" in before["prompts"][0]  # really the old schema
    assert "engines_json" not in db["runs"].columns_dict and "vllm_json" not in db["prompt_results"].columns_dict
    runs = {r.id: r for r in (get_run(db, row["id"]) for row in before["runs"])}
    assert len(runs) == len(before["runs"]) == 8
    for old in before["runs"]:
        new = runs[old["id"]]
        assert (new.status, new.kind, new.group_id, new.model.name) == (old["status"], old["kind"], old["group_id"],
                                                                       old["model"])
        assert (new.error, new.first_divergence, new.duration_ms) == (old["error"], old["first_divergence"],
                                                                      old["duration_ms"])
        if old["engines_json"] and json.loads(old["engines_json"]):  # a run that reached the engines
            engines = json.loads(old["engines_json"])
            assert [s.name for s in new.sides] == ["hf", "vllm"] and new.sides[0].reference
            assert new.side("vllm").version == engines["vllm"]["version"]
            assert new.side("hf").dtype == engines["hf"]["dtype"]
    for old in before["prompts"]:
        new = runs[old["run_id"]].prompts[old["idx"]]
        assert new.prompt_token_ids == json.loads(old["prompt_token_ids_json"])
        for side in ("vllm", "hf"):
            stored = json.loads(old[f"{side}_json"]) if old[f"{side}_json"] else None
            if stored is None:
                assert side not in new.results
                continue
            res = new.results[side]
            assert res.token_ids == stored["token_ids"] and res.side == side
            assert [s.logprob for s in res.steps] == [s["logprob"] for s in stored["steps"]]
        if old["comparison_json"]:
            oc = json.loads(old["comparison_json"])
            (c,) = new.comparisons
            assert (c.a, c.b) == ("hf", "vllm")  # the reference is HF: gaps keep their sign (vLLM - HF)
            assert c.first_divergence == oc["first_divergence"] and c.logprob_gaps == oc["logprob_gaps"]
            assert c.lengths == [oc["length_hf"], oc["length_vllm"]]
            if oc["divergence"]:
                d = oc["divergence"]
                assert c.divergence.token_ids == [d["hf_token_id"], d["vllm_token_id"]]
                assert c.divergence.accepted == d["accepted_by_vllm_rule"]
            expl = json.loads(old["explanation_json"])
            assert c.explanation.verdict == expl["verdict"] and c.explanation.summary == expl["summary"]
            if expl.get("vllm"):
                assert c.explanation.b.token_id == expl["vllm"]["token_id"]
            assert to_dict(c.cross_scores) == json.loads(old["cross_scores_json"])


def test_migrated_configs_load_as_sides_configs(legacy):
    before, db = legacy
    compare_runs = [r for r in before["runs"] if r["status"] != "error"]
    for row in compare_runs:
        run = get_run(db, row["id"])
        cfg = config_from_dict(run.config)  # a migrated config is a valid config: the run can be repeated
        assert [s.name for s in cfg.sides] == ["hf", "vllm"]
        assert cfg.generation_config == "neutral" and cfg.logprobs_mode == "raw_logprobs"


def test_migrated_probe_keeps_its_per_side_counts(legacy):
    before, db = legacy
    (row,) = [r for r in before["runs"] if r["kind"] == "probe"]
    import json

    old = json.loads(row["probes_json"])
    probes = to_dict(get_run(db, row["id"]).probes)
    assert set(probes["sides"]) == {"hf", "vllm"}
    assert probes["sides"]["vllm"]["alone"] == old["vllm"]["alone"]
    assert probes["sides"]["hf"]["batched"] == old["hf"]["batched"]


def test_steps_stored_in_result_json_move_to_columns_with_nothing_lost(tmp_path):
    """A database written before m005 (steps inside result_json) migrates in place; a row an older
    release writes afterwards (no steps_json) still reads."""
    import json

    path = tmp_path / "runs.db"
    db = open_db(path)
    run = full_run()
    save_run(db, run)
    # Back to the layout before m005: every side result's steps inside its result_json.
    for p in run.prompts:
        for res in p.results.values():
            db.execute("UPDATE side_results SET result_json = ? WHERE run_id = ? AND prompt_idx = ? AND side = ?",
                       [store._dumps(res), run.id, p.index, res.side])
    db["side_results"].transform(drop={"steps_json"})
    db.execute("DELETE FROM _sqlite_migrations WHERE name = 'm005_step_columns'")
    db.conn.commit()
    db.close()
    db = open_db(path)
    assert to_dict(get_run(db, run.id)) == to_dict(run)
    row = db.execute("SELECT result_json, steps_json FROM side_results WHERE side='b' AND prompt_idx=1").fetchone()
    assert "steps" not in json.loads(row[0])
    assert json.loads(row[1])["token_id"] == [5, 8, 7] and json.loads(row[1])["raw"] == {"2": "e2"}
    older = to_dict(run.prompts[0].results["a"])  # what an older release writes into this file
    db.execute("UPDATE side_results SET result_json = ?, steps_json = NULL WHERE side = 'a' AND prompt_idx = 0",
               [json.dumps(older)])
    assert to_dict(get_run(db, run.id)) == to_dict(run)
    db.close()


def test_a_failing_migration_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    shutil.copy(LEGACY_DB, path)
    monkeypatch.setattr(store, "legacy_sides", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        open_db(path)
    raw = sqlite3.connect(path)
    assert "engines_json" in [r[1] for r in raw.execute("PRAGMA table_info(runs)")]
    assert {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")} >= {"runs", "prompt_results"}
    assert "side_results" not in {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert [r[0] for r in raw.execute("SELECT name FROM _sqlite_migrations")] == ["m001_runs"]
    raw.close()


# --- round trips ----------------------------------------------------------------------------


def test_full_run_round_trip(db):
    run = full_run()
    save_run(db, run)
    back = get_run(db, run.id)
    assert to_dict(back) == to_dict(run)
    assert back.identical is False and back.first_divergence == 1
    assert isinstance(back.prompts[1].results["b"].steps[0].top[0], TopLogprob)
    assert back.prompts[1].comparison("b").divergence.token_ids == [6, 8]
    assert back.prompts[1].results["b"].steps[2].raw == "e2"
    assert back.warnings[0].setting == {"key": "b.enable_prefix_caching", "value": False}


def test_full_run_round_trip_on_a_file(tmp_path):
    db = open_db(tmp_path / "runs.db")
    run = full_run()
    save_run(db, run)
    db.close()
    db = open_db(tmp_path / "runs.db")
    assert to_dict(get_run(db, run.id)) == to_dict(run)
    db.close()


def test_one_row_per_prompt_and_side_and_per_comparison(db):
    save_run(db, full_run())
    rows = list(db.query("SELECT prompt_idx, side, n_tokens FROM side_results ORDER BY prompt_idx, side"))
    assert [(r["prompt_idx"], r["side"], r["n_tokens"]) for r in rows] == [
        (0, "a", 3), (0, "b", 3), (0, "ref", 3), (1, "a", 3), (1, "b", 3), (1, "ref", 3)]
    comps = list(db.query("SELECT prompt_idx, a, b, identical, first_divergence FROM comparisons ORDER BY rowid"))
    assert [tuple(r.values()) for r in comps] == [(0, "ref", "a", 1, None), (0, "ref", "b", 1, None),
                                                  (1, "ref", "a", 1, None), (1, "ref", "b", 0, 1)]


def test_error_run_without_prompt_results(db):
    run = error_run()
    save_run(db, run)
    back = get_run(db, run.id)
    assert to_dict(back) == to_dict(run)
    assert back.prompts == [] and back.status == "error"
    (summary,) = list_runs(db)
    assert summary.identical is None and summary.first_divergence is None and summary.n_prompts == 0


def test_saving_again_replaces_prompt_results(db):
    run = full_run()
    save_run(db, run)
    run.prompts = run.prompts[:1]
    run.status = "ok"
    save_run(db, run)
    back = get_run(db, run.id)
    assert len(back.prompts) == 1 and back.status == "ok" and back.identical is True
    assert len(list_runs(db)) == 1
    assert db.execute("SELECT count(*) FROM comparisons").fetchone()[0] == 2


def test_get_unknown_run_is_none(db):
    assert get_run(db, "NOPE") is None


def test_summary_columns(db):
    save_run(db, full_run())
    (s,) = list_runs(db)
    assert (s.id, s.status, s.identical, s.first_divergence) == ("01FULLRUN", "diverged", False, 1)
    assert (s.model, s.dtype, s.device, s.n_prompts, s.duration_ms) == ("demo", "float32/bfloat16", "cpu", 2, 1234)
    assert s.sides == "ref=hf, a=vllm, b=vllm"
    assert s.prompt_excerpt == "<s>prompt 0"


# --- interrupted runs -----------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_running_run_of_a_process_that_is_gone_becomes_interrupted(tmp_path):
    path = tmp_path / "runs.db"
    db = open_db(path)
    owner = {**this_owner(), "pid": _dead_pid()}
    save_run(db, full_run("01DEAD", status="running", owner=owner))
    save_run(db, full_run("01LIVE", status="running", owner=this_owner()))  # this process: still running
    save_run(db, full_run("01ELSE", status="running", owner={**owner, "host": "another-host"}))
    db.close()
    db = open_db(path)  # opening marks what a dead process left
    dead = get_run(db, "01DEAD")
    assert dead.status == "interrupted" and f"pid {owner['pid']}" in dead.error
    assert dead.prompts[1].results["b"].token_ids == [5, 8, 7]  # what was streamed is kept
    assert get_run(db, "01LIVE").status == "running"
    assert get_run(db, "01ELSE").status == "running"  # another machine's run is not ours to judge
    assert mark_interrupted(db) == []
    assert [r.id for r in list_runs(db, status="interrupted")] == ["01DEAD"]
    db.close()


def test_a_reused_pid_does_not_keep_a_dead_run_alive(tmp_path):
    db = open_db(tmp_path / "runs.db")
    owner = {**this_owner(), "start": "0"}  # our pid, but another process's start time
    save_run(db, full_run("01REUSED", status="running", owner=owner))
    assert mark_interrupted(db) == ["01REUSED"]
    db.close()


# --- history --------------------------------------------------------------------------------


@pytest.fixture
def history(db):
    save_run(db, full_run("01A", "2026-01-01T08:00:00.000+00:00", group_id="sweep-1"))
    save_run(db, error_run("01B", "2026-01-02T08:00:00.000+00:00"))
    save_run(db, full_run("01C", "2026-01-03T08:00:00.000+00:00", group_id="sweep-1", status="ok",
                          model=ModelInfo(name="qwen", path="/models/qwen")))
    save_run(db, full_run("01D", "2026-01-04T08:00:00.000+00:00", group_id=None))
    return db


def ids(rows) -> list[str]:
    return [r.id for r in rows]


def test_list_runs_newest_first(history):
    assert ids(list_runs(history)) == ["01D", "01C", "01B", "01A"]
    assert ids(list_runs(history, limit=2, offset=1)) == ["01C", "01B"]


@pytest.mark.parametrize("filters, expected", [
    ({"search": "process was killed"}, ["01B"]),  # the error text
    ({"search": "prompt 0"}, ["01D", "01C", "01A"]),  # the prompt excerpt
    ({"search": "01C"}, ["01C"]),  # the id
    ({"search": "qwe"}, ["01C"]),  # the model
    ({"search": "b=vllm"}, ["01D", "01C", "01A"]),  # a side
    ({"model": "demo"}, ["01D", "01A"]),
    ({"status": "error"}, ["01B"]),
    ({"status": "ok"}, ["01C"]),
    ({"since": "2026-01-02"}, ["01D", "01C", "01B"]),
    ({"until": "2026-01-02"}, ["01A"]),  # exclusive
    ({"since": "2026-01-02", "until": "2026-01-04"}, ["01C", "01B"]),
    ({"group_id": "sweep-1"}, ["01C", "01A"]),
    ({"group_id": "sweep-1", "model": "demo"}, ["01A"]),
    ({"search": "no such thing"}, []),
])
def test_list_runs_filters(history, filters, expected):
    assert ids(list_runs(history, **filters)) == expected


# --- run ids --------------------------------------------------------------------------------


def test_new_run_id_shape():
    rid = new_run_id()
    assert len(rid) == 26
    assert set(rid) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    assert new_run_id() != rid


def test_new_run_id_sorts_by_time(monkeypatch):
    clock = iter([1_700_000_000.000, 1_700_000_000.001, 1_700_000_001.0, 1_800_000_000.0])
    monkeypatch.setattr(store, "time", SimpleNamespace(time=lambda: next(clock)))  # store's clock only
    made = [new_run_id() for _ in range(4)]
    assert made == sorted(made)
    assert len(set(made)) == 4


def test_datasette_style_plain_sqlite_reads_every_table(tmp_path):
    path = tmp_path / "runs.db"
    db = open_db(path)
    save_run(db, full_run())
    db.close()
    raw = sqlite3.connect(path)  # what Datasette does: plain SQL, JSON in *_json text columns
    assert raw.execute("SELECT sides FROM runs").fetchone()[0] == "ref=hf, a=vllm, b=vllm"
    assert raw.execute("SELECT json_extract(result_json, '$.token_ids') FROM side_results WHERE side='b' "
                       "AND prompt_idx=1").fetchone()[0] == "[5,8,7]"
    raw.close()
    assert os.path.getsize(path) > 0


def test_non_finite_numbers_are_stored_as_valid_json(db):
    run = full_run()
    step = run.prompts[0].results["ref"].steps[0]
    step.logprob = -math.inf
    step.top = [TopLogprob(1, math.nan, "a"), TopLogprob(2, -math.inf, "b"), TopLogprob(3, -0.5, "c")]
    run.prompts[0].comparisons[0].explanation = Explanation(verdict="v", summary="", noise_before=math.nan)
    save_run(db, run)
    back = get_run(db, run.id)
    assert back.prompts[0].results["ref"].steps[0].logprob == -1e30
    assert [t.logprob for t in back.prompts[0].results["ref"].steps[0].top] == [None, -1e30, -0.5]  # as JSON stores them
    assert back.prompts[0].comparisons[0].explanation == Explanation(verdict="v", summary="", noise_before=None)
    assert db.execute("SELECT count(*) FROM side_results WHERE json_valid(result_json) = 0").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM side_results WHERE json_valid(steps_json) = 0").fetchone()[0] == 0


# --- stored steps as columns ----------------------------------------------------------------


def test_stored_steps_read_back_as_columns_equal_to_the_steps(db):
    import pickle

    from parity_ui.core.types import StepColumns, step_column

    run = full_run()
    save_run(db, run)
    made = run.prompts[1].results["b"].steps
    back = get_run(db, run.id).prompts[1].results["b"].steps
    assert isinstance(back, StepColumns) and back == made and made == back and len(back) == 3
    assert back[-1] == made[-1] and back[1:] == made[1:] and list(back) == made
    assert back[2] is back[2]  # built once
    with pytest.raises(IndexError):
        back[3]
    assert step_column(back, "token_id") == [5, 8, 7] == step_column(made, "token_id")
    assert back.top_logprobs(1) == [-1e30] * 3 and back.top_logprobs(2) == [None] * 3
    assert back.top_raw == {1: "e2", 3: "e2", 5: "e2"} and back.has_raw
    assert pickle.loads(pickle.dumps(back)) == made
    with pytest.raises(KeyError, match="no step column 'top'"):
        back.column("top")


def test_damaged_step_columns_are_refused_with_what_is_wrong():
    from parity_ui.core.types import StepColumns

    cols = StepColumns.from_steps(side_result("a", 0, [1, 2]).steps).columns()
    cols["top_logprob"] = cols["top_logprob"][:-1]
    with pytest.raises(ValueError, match="different lengths"):
        StepColumns(cols)



SQL_ALLOWED_OUTSIDE_THE_STORE: set[str] = set()  # none: every read and write is a named one in parity_ui/store


def test_no_module_outside_the_store_contains_sql():
    """The store package is the only code that speaks SQL (issue 28's grep, as a test)."""
    import re

    import parity_ui

    root = Path(parity_ui.__file__).parent
    sql = re.compile(r"SELECT|UPDATE|INSERT|DELETE")
    found = [f"{path.relative_to(root).as_posix()}:{n}: {line.strip()}"
             for path in sorted(root.rglob("*.py"))
             if path.relative_to(root).parts[0] != "store"
             and path.relative_to(root).as_posix() not in SQL_ALLOWED_OUTSIDE_THE_STORE
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if sql.search(line)]
    assert found == [], "SQL outside parity_ui/store (give the store a named read or write):\n" + "\n".join(found)


def test_the_store_reads_and_writes_a_check_through_the_one_migration_list(tmp_path):
    """The gate's tables come with the file (m008_gate): a check is saved and read with no set-up,
    its headline lands on its run's row, and "last-pass" finds the newest passing case."""
    from parity_ui.store import Store

    s = Store.open(tmp_path / "runs.db")
    run = full_run()
    save_run(s.db, run)
    case = {"case_name": "c", "model": "m", "model_path": "/m", "content_hash": "h", "run_id": "01WL",
            "control_run_id": None, "status": "pass", "passed": 1}
    s.save_check(run.id, "g", "2026-01-01T00:00:00Z", "spec.yaml", 0, {"headline": "1 of 1 passed"}, [case])
    assert s.check_result(run.id) == {"headline": "1 of 1 passed"}
    assert s.run_state(run.id).headline == "1 of 1 passed"
    assert s.last_pass("c", ("other", "/m"), "h") == "01WL" and s.last_pass("c", ("m",), "other") is None
    assert s.check_result("01NOSUCH") is None and s.run_state("01NOSUCH") is None
