"""The run store: migrations, a full Run round trip, error runs, history filters, run ids."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from parity_ui import store
from parity_ui.compare import compare_streams
from parity_ui.config import ParityConfig
from parity_ui.store import get_run, list_runs, new_run_id, open_db, save_run
from parity_ui.types import (
    EngineInfo, EngineResult, EngineTimings, Finding, ModelInfo, PromptResult, Run, TokenStep, TopLogprob,
    to_dict,
)


@pytest.fixture
def db():
    d = open_db(":memory:")
    yield d
    d.close()


def engine_result(engine: str, index: int, ids: list[int]) -> EngineResult:
    steps = [TokenStep(position=i, token_id=t, text=f"tok{t}", logprob=-0.25 * (i + 1), rank=1,
                       top=[TopLogprob(t, -0.25 * (i + 1), f"tok{t}"), TopLogprob(t + 100, -math.inf, "é")])
             for i, t in enumerate(ids)]
    return EngineResult(engine=engine, prompt_index=index, token_ids=ids, steps=steps, text="".join(s.text for s in steps),
                        finish_reason="length", timings=EngineTimings(load_s=1.5, prefill_s=0.01, total_s=0.2))


def prompt_result(index: int, vllm_ids: list[int], hf_ids: list[int], **kw) -> PromptResult:
    v, h = engine_result("vllm", index, vllm_ids), engine_result("hf", index, hf_ids)
    return PromptResult(index=index, prompt_text=f"<s>prompt {index}", prompt_token_ids=[1, 10 + index],
                        vllm=v, hf=h, comparison=compare_streams(v, h), **kw)


def full_run(run_id: str = "01FULLRUN", created: str = "2026-01-02T10:00:00.000+00:00", **kw) -> Run:
    prompts = [
        prompt_result(0, [5, 6, 7], [5, 6, 7], explanation={"verdict": "identical", "notes": ["a", "b"]}),
        prompt_result(1, [5, 6, 7], [5, 8, 7], messages=[{"role": "user", "content": "héllo | there"}],
                      explanation={"verdict": "near-tie", "margin": 0.01, "nested": {"x": [1, None]}},
                      cross_scores={"vllm_on_hf": [-0.1, -0.2]}),
    ]
    base = dict(
        id=run_id, created_utc=created,
        model=ModelInfo(name="demo", path="/models/demo", architecture="LlamaForCausalLM", model_type="llama",
                        config_dtype="bfloat16", eos_token_ids=[2, 3], generation_config={"temperature": 0.6},
                        rope_parameters={"rope_theta": 10000.0}),
        config=ParityConfig().to_dict(), status="diverged", prompts=prompts,
        warnings=[Finding(code="eos-mismatch", severity="warning", message="EOS differs", fix="set it")],
        engines={"vllm": EngineInfo(name="vllm", version="0.32.0", device="cpu", dtype="float32"),
                 "hf": EngineInfo(name="hf", version="5.0.0", device="cpu", dtype="float32",
                                  torch_version="2.9", details={"attn": "sdpa"})},
        versions={"parity_ui": "0.1.0"}, device="cpu", duration_ms=1234, group_id="g1",
    )
    return Run(**{**base, **kw})


def error_run(run_id: str = "01ERRRUN", created: str = "2026-01-01T09:00:00.000+00:00", **kw) -> Run:
    base = dict(id=run_id, created_utc=created, model=ModelInfo(name="broken", path="/models/broken"),
                config={"dtype": "auto"}, status="error", error="vLLM worker ran out of memory",
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
    assert {"runs", "prompt_results"} <= set(db.table_names())
    applied = list(db.query("SELECT name FROM _sqlite_migrations WHERE migration_set = 'parity_ui'"))
    assert [r["name"] for r in applied] == ["m001_runs"]
    assert get_run(db, "01FULLRUN") is not None  # the data survived
    db.close()


# --- round trips ----------------------------------------------------------------------------


def test_full_run_round_trip(db):
    run = full_run()
    save_run(db, run)
    back = get_run(db, run.id)
    assert to_dict(back) == to_dict(run)
    assert back.identical is False and back.first_divergence == 1
    assert isinstance(back.prompts[1].vllm.steps[0].top[0], TopLogprob)
    assert back.prompts[1].comparison.divergence.hf_token_id == 8


def test_full_run_round_trip_on_a_file(tmp_path):
    db = open_db(tmp_path / "runs.db")
    run = full_run()
    save_run(db, run)
    db.close()
    db = open_db(tmp_path / "runs.db")
    assert to_dict(get_run(db, run.id)) == to_dict(run)
    db.close()


def test_error_run_without_prompt_results(db):
    run = error_run()
    save_run(db, run)
    back = get_run(db, run.id)
    assert to_dict(back) == to_dict(run)
    assert back.prompts == [] and back.status == "error"
    assert (back.error, back.error_code) == ("vLLM worker ran out of memory", "engine")
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


def test_get_unknown_run_is_none(db):
    assert get_run(db, "NOPE") is None


def test_summary_columns(db):
    save_run(db, full_run())
    (s,) = list_runs(db)
    assert (s.id, s.status, s.identical, s.first_divergence) == ("01FULLRUN", "diverged", False, 1)
    assert (s.model, s.dtype, s.device, s.n_prompts, s.duration_ms) == ("demo", "float32", "cpu", 2, 1234)
    assert s.prompt_excerpt == "<s>prompt 0"


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
    ({"search": "out of memory"}, ["01B"]),  # the error text
    ({"search": "prompt 0"}, ["01D", "01C", "01A"]),  # the prompt excerpt
    ({"search": "01C"}, ["01C"]),  # the id
    ({"search": "qwe"}, ["01C"]),  # the model
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
