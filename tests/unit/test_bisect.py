"""parity bisect above the engines: ddmin on its own (pure), then whole searches on the fake engine kind
in real worker processes (planted causes among harmless differences, a pair needed together, a flag
that does not take effect, a trial that fails, a budget that runs out, the engine itself as the
residual), the bad inputs, the stored records and the CLI. Seconds; real engines: test_bisect_engines.py."""
from __future__ import annotations

import itertools
import json
import shutil

import pytest

from fake_engine import fake_service, registered
from parity_ui.commands.setting_bisect import BisectRequest, bisect_run
from parity_ui.core.bisect_factors import check_flip, differences
from parity_ui.core.bisect_record import (APPLIED, BUDGET, DIVERGES, ENGINE, FAILED, FOUND, NO_VISIBLE_DIFFERENCE,
                                     NOT_APPLIED, NOT_FOUND, NOT_SHOWN, OTHER, RESTORES, Factor, report_from_json)
from parity_ui.cli import main
from parity_ui.core.config import build_config
from parity_ui.analysis.ddmin import best_case_trials, ddmin, split, worst_case_trials
from parity_ui.core.errors import ParityError
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.bisects import bisects_of
from parity_ui.store.runs import get_run, list_runs
from parity_ui.core.types import ModelInfo, SideInfo

PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(3)]
# Differences that change nothing the fake computes (a reported flag, one it ignores, a delay, a batch
# size with no batch noise, options its mapper does not read).
HARMLESS = ["flag=x", "ignored_flag=y", "delay_ms=1", "batch_size=2", "fp32_logits=true", "device=cpu",
            "generation_config=model", "image_min_pixels=4096", "dtype=bfloat16"]


# -- ddmin alone ------------------------------------------------------------------------------------

def _dd(n, cause, **kw):
    items = list(range(n))
    calls = []

    def restores(s):
        calls.append(s)
        return cause <= s

    r = ddmin(items, restores, known={frozenset(): False, frozenset(items): True}, **kw)
    return r, calls


def test_split_keeps_the_order_and_every_item():
    assert split(list("abcde"), 2) == [("a", "b"), ("c", "d", "e")]
    assert [len(p) for p in split(list(range(10)), 4)] == [2, 2, 3, 3]
    assert sum(split(list(range(7)), 7), ()) == tuple(range(7))


@pytest.mark.parametrize("n", [3, 6, 10])
def test_ddmin_names_every_single_cause_alone_and_every_pair_as_the_pair(n):
    for k in range(n):
        r, calls = _dd(n, {k})
        assert r.minimal == (k,) and r.complete and r.needed == (k,)
        assert len(calls) == r.trials == len(set(calls))  # each set tried once (the cache)
    for pair in itertools.combinations(range(n), 2):
        r, _ = _dd(n, set(pair))
        assert r.minimal == pair and r.complete and r.needed == pair
        assert r.outcomes[frozenset([pair[0]])] is False and r.outcomes[frozenset([pair[1]])] is False


def test_ddmin_takes_fewer_trials_than_one_at_a_time_as_the_settings_grow():
    """One at a time takes n trials for n settings (and cannot find a pair at all); ddmin's worst
    single cause takes about 2 log2 n: fewer from 10 settings on, on average from 6, under half from 16."""
    for n in (10, 16, 32):
        counts = [_dd(n, {k})[0].trials for k in range(n)]
        assert max(counts) < n and (n < 16 or sum(counts) / n < n / 2), (n, counts)
    counts6 = [_dd(6, {k})[0].trials for k in range(6)]
    assert sum(counts6) / 6 < 6
    assert best_case_trials(10) <= min(_dd(10, {k})[0].trials for k in range(10))
    for n in (3, 6, 10):
        worst = max(_dd(n, set(p))[0].trials for p in itertools.combinations(range(n), 2))
        assert worst <= worst_case_trials(n)


def test_ddmin_budget_gives_the_best_set_so_far_and_what_is_undecided():
    r, calls = _dd(10, {2, 7}, budget=7)
    assert not r.complete and len(calls) == 7
    assert {2, 7} <= set(r.minimal) and len(r.minimal) < 10  # smaller than the whole, still restores parity
    assert r.outcomes[frozenset(r.minimal)] is True
    assert set(r.undecided) | set(r.needed) == set(r.minimal) and r.undecided


def test_ddmin_refuses_a_search_with_nothing_to_minimise():
    with pytest.raises(ValueError, match="every difference"):
        ddmin([1, 2], lambda s: True, known={frozenset([1, 2]): False})
    with pytest.raises(ValueError, match="already restores"):
        ddmin([1, 2], lambda s: True, known={frozenset(): True})


# -- pure parts of the search ---------------------------------------------------------------------

def _info(name, **resolved):
    return SideInfo(name=name, kind="vllm", resolved=resolved, model_path="/m")


@pytest.mark.parametrize("trial, status", [
    ({"prefix_caching": False}, APPLIED),
    ({"prefix_caching": True}, NOT_APPLIED),  # still the side's own value: the flip did not take effect
    ({"prefix_caching": "weird"}, OTHER),
    ({}, NOT_SHOWN),
])
def test_a_flip_is_checked_against_the_trial_sides_resolved_settings(trial, status):
    f = Factor("enable_prefix_caching", False, True, resolved_key="prefix_caching")
    c = check_flip(f, _info("b", **trial), _info("ref", prefix_caching=False), _info("b", prefix_caching=True))
    assert c.status == status and c.key == "enable_prefix_caching"
    if status != APPLIED:
        assert "enable_prefix_caching" in c.message and "prefix_caching" in c.message


def test_a_setting_the_stored_sides_resolved_alike_is_reported_as_not_visible():
    f = Factor("async_scheduling", None, True, resolved_key="async_scheduling")
    c = check_flip(f, _info("b", async_scheduling=False), _info("ref", async_scheduling=False),
                   _info("b", async_scheduling=False))
    assert c.status == NO_VISIBLE_DIFFERENCE and "did not take effect" in c.message


def test_differences_are_taken_as_asked_with_the_runs_values_filled_in():
    model = ModelInfo(name="m", path="/models/m", config_dtype="float32")
    cfg = build_config(None, ["dtype=float32"], sides=["ref=vllm",
                                                       "b=vllm,dtype=float32,max_num_seqs=4,python=/x/python",
                                                       "c=hf,dtype=bfloat16,attn_implementation=eager,model=/other"])
    flips, fixed = differences(cfg, cfg.side("ref"), cfg.side("b"), model, on_gpu=False)
    assert [f.key for f in flips] == ["max_num_seqs", "python"] and not fixed  # dtype float32 is the run's
    flips, fixed = differences(cfg, cfg.side("ref"), cfg.side("c"), model, on_gpu=False)
    assert [f.key for f in flips] == ["dtype", "model"] and [f.key for f in fixed] == ["engine"]
    assert not fixed[0].flippable and "attn_implementation=eager" in fixed[0].note
    assert flips[1].reference == "/models/m" and flips[1].side == "/other"


# -- whole searches on the fake kind -----------------------------------------------------------------

@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=256))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db", other=True) as svc:
        yield svc


def _compare(svc, model, *sides, overrides=("max_new_tokens=8",)):
    cfg = build_config(None, list(overrides), sides=list(sides))
    return svc.run(RunRequest(model=model, prompts=list(PROMPTS), config=cfg))


def _bisect(svc, run, **kw):
    said = []
    b = bisect_run(svc, BisectRequest(run.id, **{"prompts": 2, **kw}), said.append)
    return b, [e.message for e in said if e.kind == "status"]


def _trial(b, *flipped):
    return next(t for t in b.bisect.trials if set(t.flipped) == set(flipped))


def test_a_planted_cause_among_harmless_differences_is_named_alone(service, model):
    run = _compare(service, model, "ref=fake", ",".join(["b=fake", *HARMLESS[:5], "shift=0.3", *HARMLESS[5:]]))
    assert run.status == "ok", run.error  # same tokens: the gap shows against the noise floor only
    b, said = _bisect(service, run)
    r = b.bisect
    assert b.status == "ok" and b.kind == "bisect" and r.outcome == FOUND, b.error
    assert r.culprit == ["shift"] and r.needed == ["shift"]
    assert len(r.factors) == 10 and {f.key for f in r.factors} >= {"shift", "flag", "ignored_flag", "generation_config"}
    assert _trial(b).outcome == DIVERGES and _trial(b, "shift").outcome == RESTORES
    assert _trial(b).verdict == "exceeds noise" and _trial(b, "shift").verdict == "within noise"
    assert all(t.oracle == "noise floor" for t in r.trials)
    assert len(r.trials) <= r.estimate.worst and r.estimate.best <= len(r.trials) < r.estimate.one_at_a_time
    assert r.floor["run_id"] == r.trials[0].run_id and "batch" in r.floor["description"]
    # Settings that need no reload sit innermost, and their trials reuse a warm worker.
    runtime = [f.key for f in r.factors if f.runtime_only]  # the fake loads nothing else from these
    assert {"batch_size", "device", "generation_config"} <= set(runtime) and "shift" not in runtime
    assert [f.key for f in r.factors][-len(runtime):] == runtime
    assert r.trials[1].warm  # every setting flipped: the reference's own setup, its worker is warm
    # Every trial is a stored run of the search's group; the search has a record of its own.
    group = [x for x in list_runs(service.db, group_id=b.group_id) if x.id != b.id]
    assert sorted(x.id for x in group) == sorted(t.run_id for t in r.trials)
    assert {x.kind for x in group} == {"bisect-trial"}
    first = get_run(service.db, r.trials[0].run_id, prompts=[])
    assert first.workload.floor.side == "floor" and get_run(service.db, r.trials[1].run_id).workload.floor.side is None
    assert first.workload.options.source["bisect"] == b.id
    stored = get_run(service.db, b.id)
    assert stored.bisect == r and report_from_json(json.loads(json.dumps(r.to_json()))) == r
    assert [p.given["text"] for p in stored.prompts] == [PROMPTS[i].text for i in r.prompts]
    assert [s.name for s in stored.sides] == ["ref", "b"]
    # Shown before and after: the estimate, each trial, the answer.
    assert said[0].startswith(f"bisect {b.id} of run {run.id}: b against the reference ref")  # the id to follow
    assert any(m.startswith("estimate: 10 flippable settings") for m in said)  # a count, not "setting(s)"
    assert any("RESULT: shift explains the divergence" in m for m in said)
    # ignored_flag is accepted by the engine but never shows in its resolved settings: reported.
    (doubt,) = [c for c in r.unconfirmed() if c.key == "ignored_flag"]
    assert doubt.status == NOT_SHOWN and "cannot be checked" in doubt.message
    assert all(c.status == APPLIED for t in r.trials for c in t.checks if c.key in ("shift", "flag"))


def test_two_settings_needed_together_are_named_as_the_pair(service, model):
    run = _compare(service, model, "ref=fake", "b=fake,flag=x,shift=0.2,delay_ms=1,noise=0.2,batch_size=2")
    b, said = _bisect(service, run)
    r = b.bisect
    assert b.status == "ok" and r.culprit == ["shift", "noise"] and r.needed == ["shift", "noise"], b.error
    assert _trial(b, "shift").outcome == DIVERGES and _trial(b, "noise").outcome == DIVERGES
    assert _trial(b, "shift", "noise").outcome == RESTORES
    assert "shift and noise are needed together" in r.summary
    # One setting at a time cannot find it, and says so.
    alone, _ = _bisect(service, run, strategy="one-at-a-time")
    assert alone.status == "diverged" and alone.bisect.outcome == NOT_FOUND and "combination" in alone.bisect.summary
    assert len(alone.bisect.trials) == 2 + 5


def test_another_interpreter_is_one_flippable_factor(service, model):
    """b's worker under another path to this venv's Python (python=): the interpreter as a whole is one
    setting; flipping it moves the side to the reference's, and the resolved settings show that."""
    import sys
    from pathlib import Path

    other = str(Path(sys.executable).with_name("python3.11"))
    run = _compare(service, model, "ref=fake", f"b=fake,shift=0.3,python={other}")
    assert run.status == "ok", run.error
    b, _ = _bisect(service, run)
    r = b.bisect
    assert b.status == "ok" and r.culprit == ["shift"], b.error
    python = next(f for f in r.factors if f.key == "python")
    assert (python.reference, python.side) == ("this environment", other) and python.flippable
    checks = [c for t in r.trials for c in t.checks if c.key == "python"]
    assert checks and all(c.status == APPLIED and c.resolved == "this environment" for c in checks)


def test_the_exact_oracle_demands_identical_tokens(service, model):
    run = _compare(service, model, "ref=fake,dtype=float32", "b=fake,dtype=float32,swap_at=3,flag=x,delay_ms=1")
    assert run.status == "diverged"
    b, _ = _bisect(service, run)
    assert b.status == "ok" and b.bisect.culprit == ["swap_at"], b.error
    assert {t.oracle for t in b.bisect.trials} == {"identical tokens"}
    assert _trial(b).identical == 0 and _trial(b).first_divergence == 3


def test_a_side_forking_at_its_first_token_everywhere_is_not_within_noise(service, model):
    """Free-running figures stop at each fork: a fork at token 0 leaves no token to weigh, and over two
    prompts the Wilson intervals of 0/2 and 2/2 overlap. The oracle still calls it a divergence."""
    run = _compare(service, model, "ref=fake", "b=fake,swap_at=0,flag=x")
    b, _ = _bisect(service, run)
    assert b.status == "ok" and b.bisect.culprit == ["swap_at"], b.error
    base = _trial(b)
    assert base.outcome == DIVERGES and base.verdict == "exceeds noise" and "first token" in base.exceeded[0]


def test_a_trial_that_fails_counts_as_not_restoring_and_the_search_goes_on(service, model):
    """flag=r on the reference, fail_with_flag on b: a trial that flips flag but not fail_with_flag cannot
    load. The divergence itself is b's batch noise at batch 4 (flipping batch_size or batch_noise ends it)."""
    run = _compare(service, model, "ref=fake,flag=r", "b=fake,batch_noise=0.5,batch_size=4,fail_with_flag=true")
    b, said = _bisect(service, run)
    r = b.bisect
    assert b.status == "ok" and r.culprit in (["batch_size"], ["batch_noise"]), b.error
    failed = [t for t in r.trials if t.outcome == FAILED]
    assert failed and all("flag" in t.flipped and "fail_with_flag" not in t.flipped for t in failed)
    assert "fail_with_flag" in failed[0].error and get_run(service.db, failed[0].run_id).status == "error"
    assert any("FAILED" in m for m in said)
    # batch_size needs no reload: the trial that flips it alone runs on a warm worker.
    assert next(f for f in r.factors if f.key == "batch_size").runtime_only


def test_a_budget_too_small_reports_the_best_set_so_far_and_what_is_undecided(service, model, tmp_path):
    run = _compare(service, model, "ref=fake",
                   "b=fake,flag=x,shift=0.2,delay_ms=1,noise=0.2,batch_size=2,ignored_flag=y")
    b, _ = _bisect(service, run, max_trials=4)
    r = b.bisect
    assert b.status == "error" and b.error_code == "bisect-budget" and r.outcome == BUDGET
    assert len(r.trials) == 4 and {"shift", "noise"} <= set(r.culprit) and r.undecided
    assert "best set so far" in b.error and "undecided" in b.error and "--max-trials" in b.error
    assert get_run(service.db, b.id).bisect.trials == r.trials  # nothing lost
    too_small, _ = _bisect(service, run, max_trials=1)
    assert too_small.status == "error" and "--max-trials 1 is too small" in too_small.error
    assert not too_small.bisect.trials


def test_when_only_the_engine_can_explain_it_the_search_says_so(service, model):
    run = _compare(service, model, "ref=fake", "b=fake-other,flag=x,other_only=true,delay_ms=1")
    b, _ = _bisect(service, run)
    r = b.bisect
    assert b.status == "diverged" and r.outcome == ENGINE, b.error
    assert [f.key for f in r.fixed] == ["engine"] and "other_only=True" in r.fixed[0].note
    assert r.culprit == ["engine"] and {f.key for f in r.factors} == {"flag", "delay_ms"}
    assert len(r.trials) == 2 and r.trials[1].outcome == DIVERGES
    assert "engine or kernel itself" in r.summary and "fake-other" in r.summary and "other_only" in r.summary


def test_against_another_engine_its_own_settings_are_flipped_to_their_plain_values(service, model):
    """#33 item 1 with the fake kinds: b is the other engine with its own numerics made the fake's
    (engine_shift=0), a gap only its kind can make (graphs_gap, like vLLM's CUDA graphs; its kind names 0
    as the value to flip it to) and a harmless flag. The engine-only setting is a factor, named as such,
    and found; both sides float32 and greedy, the oracle across engines is still the measured floor."""
    run = _compare(service, model, "ref=fake,dtype=float32", "b=fake-other,dtype=float32,engine_shift=0,graphs_gap=0.4,"
                   "flag=x,other_only=true")
    b, said = _bisect(service, run)
    r = b.bisect
    assert b.status == "ok" and r.outcome == FOUND and r.culprit == ["graphs_gap"], b.error
    gap = r.factor("graphs_gap")
    assert gap.engine_only and (gap.side, gap.reference) == (0.4, 0.0) and "only fake-other has it" in gap.note
    assert "flipped to 0.0; only this engine has it" in gap.describe()
    assert {f.key for f in r.factors} == {"graphs_gap", "flag"}
    # engine_shift has no value to flip it to: it stays with the engine, as other_only does.
    assert [f.key for f in r.fixed] == ["engine"] and "engine_shift=0" in r.fixed[0].note
    assert "other_only=True" in r.fixed[0].note and "graphs_gap" not in r.fixed[0].note
    assert {t.oracle for t in r.trials} == {"noise floor"}  # not "identical tokens": two engines
    assert all(c.status == APPLIED for t in r.trials for c in t.checks if c.key == "graphs_gap")
    assert any("graphs_gap (0.4, flipped to 0.0; only this engine has it)" in m for m in said)


def test_vllms_own_settings_are_factors_against_an_hf_reference():
    """The vLLM side's options HF lacks, set away from their plain values, are factors flipped to them
    (eager, no prefix caching, the Transformers model code); on the CPU vLLM is eager already."""
    model = ModelInfo(name="m", path="/models/m", config_dtype="float32")
    cfg = build_config(None, [], sides=["ref=hf", "b=vllm,enforce_eager=false,enable_prefix_caching=true,"
                                                   "max_num_seqs=4"])
    flips, fixed = differences(cfg, cfg.side("ref"), cfg.side("b"), model, on_gpu=True)
    by = {f.key: f for f in flips}
    assert set(by) == {"enforce_eager", "enable_prefix_caching", "async_scheduling", "model_impl"}
    assert all(f.engine_only for f in flips)
    assert (by["enforce_eager"].reference, by["enable_prefix_caching"].reference) == (True, False)
    assert by["model_impl"].reference == "transformers" and by["model_impl"].resolved_key == "model_impl"
    assert by["enforce_eager"].resolved_key == "cuda_graphs" and "numerics" in by["enforce_eager"].note
    assert "max_num_seqs=4" in fixed[0].note and "enforce_eager" not in fixed[0].note
    plain = build_config(None, [], sides=["ref=hf", "b=vllm,model_impl=transformers,async_scheduling=false"])
    flips, fixed = differences(plain, plain.side("ref"), plain.side("b"), model, on_gpu=False)
    assert flips == [] and [f.key for f in fixed] == ["engine"]


@pytest.mark.parametrize("sides, needle", [
    (("ref=fake", "b=fake,flag=x,delay_ms=1"), "nothing to bisect"),  # already within the noise floor
    (("ref=fake", "b=fake-other"), "only in the engine itself"),  # nothing flippable
])
def test_pairs_with_nothing_to_search_are_clear_errors(service, model, sides, needle):
    run = _compare(service, model, *sides)
    b, _ = _bisect(service, run)
    assert b.status == "error" and needle in b.error and "Fix:" in b.error
    assert get_run(service.db, b.id).status == "error"


def test_bad_input_is_a_stored_error_with_a_fix(service, model, tmp_path):
    failed = service.record_failure(model, list(PROMPTS), {"sides": "nonsense"}, ParityError("bad", "fix it"))
    b, _ = _bisect(service, failed)
    assert b.status == "error" and "0 sides" in b.error and "Fix:" in b.error
    run = _compare(service, model, "ref=fake", "b=fake,shift=0.3", "c=fake")
    b, _ = _bisect(service, run, sides=("ref", "nope"))
    assert b.status == "error" and "--sides ref,nope" in b.error and "ref, b, c" in b.error
    gone = shutil.copytree(model, tmp_path / "gone")
    run = _compare(service, str(gone), "ref=fake", "b=fake,shift=0.3")
    shutil.rmtree(gone)
    b, _ = _bisect(service, run)
    assert b.status == "error" and f"the model folder {gone} of run {run.id} is gone" in b.error
    with pytest.raises(ParityError, match="no run with id"):
        bisect_run(service, BisectRequest("NOPE"))


def test_the_default_pair_is_the_first_side_that_diverged(service, model):
    run = _compare(service, model, "ref=fake", "same=fake", "b=fake,shift=0.3,flag=x")
    b, _ = _bisect(service, run)
    assert (b.bisect.reference, b.bisect.side) == ("ref", "b") and b.bisect.culprit == ["shift"], b.error


def test_stop_during_the_search_is_stored_as_cancelled(service, model):
    run = _compare(service, model, "ref=fake", "b=fake,flag=x,shift=0.2,delay_ms=1,noise=0.2")

    def stop_after_two(e):
        if e.kind == "status" and e.message.startswith("trial 2: RESTORES"):
            service.cancel()

    b = bisect_run(service, BisectRequest(run.id, prompts=2), stop_after_two)
    assert b.status == "cancelled" and len(get_run(service.db, b.id).bisect.trials) == 2


def test_the_cli_prints_the_table_exits_by_the_answer_and_writes_the_report(service, model, tmp_path, capsys):
    db = service.db_path
    found = _compare(service, model, "ref=fake", "b=fake,shift=0.3,flag=x,ignored_flag=y")
    engine = _compare(service, model, "ref=fake", "b=fake-other,flag=x")
    assert main(["--db", db, "bisect", found.id, "--prompts", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "RESULT: shift explains the divergence" in out and "restores parity" in out and "NOT CONFIRMED" in out
    assert main(["--db", db, "bisect", engine.id, "--prompts", "2", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "diverged" and data["bisect"]["outcome"] == ENGINE and len(data["bisect"]["trials"]) == 2
    bisect_id = data["bisect_id"]
    assert main(["--db", db, "bisect", found.id, "--max-trials", "2", "--quiet"]) == 2
    assert "best set so far" in capsys.readouterr().err
    assert main(["--db", db, "bisect", "NOPE"]) == 2
    assert "no run with id 'NOPE'" in capsys.readouterr().err
    out_html = tmp_path / "b.html"
    assert main(["--db", db, "report", bisect_id, "-o", str(out_html)]) == 0
    page = out_html.read_text()
    assert "Which setting is it?" in page and "engine or kernel itself" in page and "flipped to the reference" in page
    assert main(["--db", db, "runs", "show", bisect_id]) == 0
    assert "bisect " + bisect_id in capsys.readouterr().out
    # What the app calls: the service's door, and a run's bisects for its history view.
    again = service.bisect(engine.id, ("ref", "b"), prompts=2)
    assert again.kind == "bisect" and again.bisect.outcome == ENGINE
    assert [x.id for x in bisects_of(service.db, engine.id)] == [again.id, bisect_id]
