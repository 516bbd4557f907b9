"""The service's own logic above the engines, on the fake engine kind (tests/fake_engine.py) in real
worker processes: recording, flushing, Stop, generate-while-loading, failures, refusals, probes,
sweeps and layer requests. Seconds, not minutes: the real engines are tested in test_engines.py."""
from __future__ import annotations

import threading
import time

import pytest

from fake_engine import fake_service, registered
from parity_ui.run import recorder as recorder_mod
from parity_ui.core.config import build_config
from parity_ui.engines.base import GenerateRequest, ScoreRequest
from parity_ui.run.plan import RunRequest
from parity_ui.run.prepare import plan_sides
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.core.findings import ProbeReport
from parity_ui.store.runs import get_run, list_runs, localisations_of, open_db
from parity_ui.core.types import to_dict

PROMPTS = [PromptSpec(text="def parse(args):"), PromptSpec(text="import os\nimport sys"),
           PromptSpec(text="class Path:")]


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake"))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db") as svc:
        yield svc


def _run(svc, model, *sides, overrides=(), prompts=PROMPTS, on_event=None):
    cfg = build_config(None, ["max_new_tokens=12", *overrides], sides=list(sides))
    return svc.run(RunRequest(model=model, prompts=list(prompts), config=cfg), on_event=on_event)


def test_a_run_is_stored_as_it_ran(service, model):
    run = _run(service, model, "ref=fake", "b=fake,shift=0.25")
    assert run.status == "ok", run.error
    stored = get_run(service.db, run.id)
    assert to_dict(stored.prompts) == to_dict(run.prompts) and stored.status == "ok" and stored.owner is None
    assert [s.name for s in stored.sides] == ["ref", "b"] and stored.side("b").resolved == {"shift": 0.25}
    assert set(run.timings) >= {"prepare", "start", "check", "load", "generate", "compare", "cross_score", "explain"}
    (c, *_) = run.comparisons
    assert c.identical and c.max_abs_gap == pytest.approx(0.25)  # the planted gap, on every token
    assert set(c.cross_scores.directions) == {"b_by_ref", "ref_by_b"}
    assert c.explanation.verdict == "identical" and c.explanation.sides == ["ref", "b"]


def test_a_planted_fork_is_found_where_it_was_planted(service, model):
    run = _run(service, model, "ref=fake", "b=fake,swap_at=4")
    assert run.status == "diverged"
    assert [c.first_divergence for c in run.comparisons] == [4, 4, 4]
    c = run.comparisons[0]
    assert c.divergence.accepted and c.explanation.a.other_token_rank == 2  # b's pick was ref's second choice


def test_a_flush_writes_the_runs_row_and_only_the_prompts_that_streamed(service, model, monkeypatch):
    monkeypatch.setattr(recorder_mod, "FLUSH_S", 0.05)
    written: list[tuple[str, int, int]] = []  # (side, prompt, tokens) per side row a flush wrote
    real = recorder_mod.save_side_result

    def counting(db, run_id, res):
        written.append((res.side, res.prompt_index, len(res.token_ids)))
        real(db, run_id, res)

    monkeypatch.setattr(recorder_mod, "save_side_result", counting)
    seen: list[int] = []
    reader = open_db(service.db_path)

    def on_event(e):
        if e.kind == "token" and e.side == "b" and e.prompt_index == 1 and e.step.position == 6:
            rows = list(reader.query("SELECT prompt_idx, n_tokens FROM side_results WHERE side = 'b' ORDER BY "
                                     "prompt_idx"))
            seen.extend(r["prompt_idx"] for r in rows)

    run = _run(service, model, "ref=fake", "b=fake,delay_ms=15", on_event=on_event)
    assert run.status == "ok", run.error
    assert 0 in seen and 2 not in seen  # a running side's finished prompt is in the store; one not begun is not
    partial = [w for w in written if w[2] < 12]
    assert partial, "no flush wrote a partial row"
    for side, prompt in {(s, p) for s, p, _ in partial}:  # a row is written again only when it grew
        counts = [n for s, p, n in partial if (s, p) == (side, prompt)]
        assert counts == sorted(set(counts)) and counts[0] > 0, (side, prompt, counts)
    last = {(s, p): n for s, p, n in written}
    assert last == {(s, p): 12 for s in ("ref", "b") for p in range(3)}


def test_every_streamed_step_is_decoded_once(service, model, monkeypatch):
    calls = []
    real = recorder_mod.decode_step
    monkeypatch.setattr(recorder_mod, "decode_step", lambda tok, step: calls.append(step.position) or real(tok, step))
    run = _run(service, model, "ref=fake", "b=fake", overrides=["logprobs=3", "cross_score=false"])
    assert run.status == "ok"
    steps = sum(len(r.steps) for p in run.prompts for r in p.results.values())
    assert len(calls) == steps  # while streaming; the final results reuse those steps
    assert all(s.text for p in run.prompts for r in p.results.values() for s in r.steps)


def test_stop_keeps_every_token_made_before_it(service, model):
    def on_event(e):
        if e.kind == "token" and e.side == "b" and e.step.position == 3:
            service.cancel()

    run = _run(service, model, "ref=fake", "b=fake,delay_ms=20", overrides=["max_new_tokens=200"],
               prompts=PROMPTS[:1], on_event=on_event)
    assert run.status == "cancelled" and "stopped" in run.error or "cancelled" in run.error
    assert len(run.prompts[0].results["ref"].token_ids) == 200
    assert 4 <= len(run.prompts[0].results["b"].token_ids) < 200
    stored = get_run(service.db, run.id)
    assert stored.status == "cancelled" and stored.prompts[0].results["b"].token_ids == \
        run.prompts[0].results["b"].token_ids
    again = _run(service, model, "ref=fake", "b=fake,delay_ms=20")
    assert again.status == "ok", again.error  # the Stop was for the run it stopped


@pytest.mark.parametrize("mode", ["always", "never"])
def test_a_loaded_side_generates_while_a_slower_one_loads_only_when_asked(service, model, mode):
    said = []
    run = _run(service, model, "ref=fake", "b=fake,load_s=4", overrides=[f"generate_while_loading={mode}"],
               on_event=lambda e: e.kind != "token" and said.append((e.kind, e.side, e.message)))
    assert run.status == "ok", run.error
    ref_done = said.index(("side_done", "ref", "ref done"))
    b_loaded = next(i for i, (k, side, m) in enumerate(said) if side == "b" and m.startswith("b: loaded"))
    early = [w for w in run.warnings if w.code == "generated-while-loading"]
    if mode == "always":
        assert ref_done < b_loaded and early and early[0].message.startswith("ref generated while b")
    else:
        assert b_loaded < ref_done and not early
    # The phases before generating hold b's 4 s load. The load phase alone runs from the LAST side's check,
    # so when ref's check ends late on busy cores it is shorter (2.18 s seen at load 5); the phases up to
    # the last load cannot be, as b's load starts after the run does.
    t = run.timings
    assert t["start"] + t["check"] + t["load"] >= 3.99 and set(t) >= {"start", "check", "load", "generate"}, t


@pytest.mark.parametrize("mode", ["always", "never"])
def test_a_side_that_crashes_mid_stream_is_stored_with_what_it_made(service, model, mode):
    run = _run(service, model, "ref=fake", "b=fake,fail_at=5", overrides=[f"generate_while_loading={mode}"],
               prompts=PROMPTS[:1])
    assert run.status == "error" and run.error_code == "engine"
    assert "side b" in run.error and "crashed at token 5" in run.error and "worker log" in run.error
    b, ref = run.prompts[0].results["b"], run.prompts[0].results.get("ref")
    assert b.error and len(b.token_ids) == 5
    # In side order the reference has finished first; on their own ways b may have crashed before the
    # reference began (no result), or stopped it mid-stream (what it made is kept, with why).
    if mode == "never":
        assert len(ref.token_ids) == 12
    else:
        assert ref is None or len(ref.token_ids) == 12 or ref.error
    assert get_run(service.db, run.id).prompts[0].results["b"].token_ids == b.token_ids
    assert not service.pool.cancelled
    assert _run(service, model, "ref=fake", "b=fake").status == "ok"  # a fresh worker serves the next run


def test_refusals_name_every_side_that_cannot_run_and_nothing_loads(service, model):
    run = _run(service, model, "ref=fake,refuse=no ref here", "b=fake,refuse=no b here", "c=fake")
    assert run.status == "error" and run.error_code == "capability", run.error
    assert "side ref (fake engine (tests only)): no ref here" in run.error and "side b" in run.error
    assert "before loading the model" in run.error and "load" not in run.timings
    assert not any(s.load_s for s in run.sides)
    # Each side on its own way: the first refusal stops the run, and the refused side loads nothing.
    run = _run(service, model, "ref=fake", "b=fake,refuse=no b here", overrides=["generate_while_loading=always"])
    assert run.status == "error" and run.error_code == "capability" and "no b here" in run.error
    assert not run.side("b").load_s and not service.pool.cancelled


def test_a_load_the_engine_explains_is_an_error_run_with_its_words(service, model):
    run = _run(service, model, "ref=fake", "b=fake,fail_load=true")
    assert run.status == "error" and "told to fail its load" in run.error and "drop fail_load" in run.error
    assert list_runs(service.db)[0].id == run.id and list_runs(service.db)[0].status == "error"


def test_a_bad_request_is_recorded_before_anything_starts(service, model):
    run = service.record_failure(model, [PromptSpec(text="as typed")], {"overrides": ["dtype=int3"]},
                                 ValueError("dtype=int3 is not a dtype"))
    stored = get_run(service.db, run.id)
    assert stored.status == "error" and "int3" in stored.error and stored.prompts[0].prompt_text == "as typed"


def test_sides_answer_typed_verbs_without_an_earlier_run(service, model):
    """No method depends on what an earlier call left: a fresh service scores and generates in one block."""
    cfg = build_config(None, ["max_new_tokens=5"], sides=["ref=fake", "b=fake,shift=1.0"])
    plans = plan_sides(model, cfg, gpu=False)
    with service.sides(plans) as sides:
        (gen,) = sides.generate("ref", GenerateRequest(prompts=[[10, 11, 12]], sampling=plans[0].args.sampling,
                                                      stream=False))
        scored = sides.score("b", ScoreRequest([10, 11, 12], gen.token_ids, 2))
    assert gen.side == "ref" and len(gen.token_ids) == 5
    assert [s.logprob for s in scored] == pytest.approx([s.logprob + 1.0 for s in gen.steps])
    assert sides.info("b").resolved == {"shift": 1.0}


def test_a_probe_is_a_recorded_run_with_a_typed_report(service, model):
    from parity_ui.commands.probes import run_probe

    cfg = build_config(None, ["max_new_tokens=6"], sides=["ref=fake", "b=fake,swap_at=2"])
    run = run_probe(service, model, PROMPTS[0], cfg, n=2, batch=2)
    assert run.status == "ok" and run.kind == "probe", run.error  # each side agrees with itself
    assert isinstance(run.probes, ProbeReport) and set(run.probes.sides) == {"ref", "b"}
    assert get_run(service.db, run.id).probes == run.probes
    assert run.prompts[0].results["b"].token_ids  # the first output of each side is kept
    bad = run_probe(service, model, PROMPTS[0], cfg, n=1, batch=2)
    assert bad.status == "error" and "n >= 2" in bad.error


def test_a_sweep_point_is_a_recorded_run_of_its_group(service, model):
    from parity_ui.commands.sweep import parse_grid, run_sweep, summarize_sweep

    sweep = run_sweep(service, model, PROMPTS[0], parse_grid(["b.swap_at=2,5"]), sides=["ref=fake", "b=fake"],
                      overrides=["max_new_tokens=8"])
    assert [p.run.first_divergence for p in sweep.points] == [2, 5]
    assert {r.id for r in list_runs(service.db, group_id=sweep.group_id)} == {p.run.id for p in sweep.points}
    assert summarize_sweep(sweep)["effects"][0]["moves_divergence"]


def test_a_layer_request_the_sides_cannot_serve_is_stored_with_its_fix(service, model):
    run = _run(service, model, "ref=fake", "b=fake,swap_at=2")
    loc = service.localise(run, 0)
    assert loc.error and "in-process access" in loc.error and loc.id
    assert [x.id for x in localisations_of(service.db, run.id)] == [loc.id]
    bad = service.localise(run, 0, pair="ref")
    assert bad.error and "two side names" in bad.error


def test_commands_queue_behind_each_other(service, model):
    """One command at a time: a second run waits for the first instead of sharing its workers."""
    order = []

    def go(name, delay):
        _run(service, model, "ref=fake", f"b=fake,delay_ms={delay}", prompts=PROMPTS[:1],
             on_event=lambda e: e.kind == "side_done" and order.append((name, e.side)))

    first = threading.Thread(target=go, args=("first", 30))
    first.start()
    time.sleep(0.5)
    go("second", 0)
    first.join()
    assert order == [("first", "ref"), ("first", "b"), ("second", "ref"), ("second", "b")]


def test_one_stop_ends_a_whole_command_and_every_run_nested_in_it(service, model):
    """Stop is a scope, not a latch: pressed during a sweep's first point, it ends that point and
    every later one (each its own recording), with nothing re-armed between them; the next command
    starts unstopped."""
    stopped = []

    def on_event(e):
        if e.kind == "token" and e.step.position == 2 and not stopped:
            stopped.append(True)
            service.cancel()

    summary = service.sweep(model, PROMPTS[0], service.parse_grid(["b.swap_at=3,5,7"]),
                            sides=["ref=fake", "b=fake,delay_ms=5"], overrides=["max_new_tokens=40"], emit=on_event)
    assert [p["status"] for p in summary["points"]] == ["cancelled", "cancelled", "cancelled"]
    again = _run(service, model, "ref=fake", "b=fake")
    assert again.status == "ok", again.error  # the Stop was for the command it stopped


def test_a_side_that_fails_stops_its_set_without_stopping_the_command(service, model):
    """A failing side raises the flag to stop its set's other sides; the command's next run (a
    sweep's next point) is not stopped by it, since the user did not press Stop."""
    summary = service.sweep(model, PROMPTS[0], service.parse_grid(["b.fail_load=true,false"]),
                            sides=["ref=fake,load_s=0.5", "b=fake"], overrides=["max_new_tokens=8"])
    assert [p["status"] for p in summary["points"]] == ["error", "ok"], summary["points"]
