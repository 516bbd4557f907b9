"""A whole RL run's trend without engines (recorded-only replays on a real tokenizer, real SQLite): the
step where a figure jumps named with its size, recorded-only figures equal to the store's pooling of
the same pair, follow mode picking up a step written while it runs, a gate failed as it goes, bad
steps (incomplete, another model's, ranks missing) named; the CLI, the report and History read it.
Real rollouts through real engines: tests/engines/test_replay_steps_engines.py."""
from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest

from fake_engine import fake_model
from parity_ui.analysis.changepoint import find_change
from parity_ui.core.config import build_config
from parity_ui.core.errors import ParityError
from parity_ui.core.trend import parse_gate
from parity_ui.service import ParityService, ReplayRequest, TrendRequest
from rl_dumps import synthetic_rows, write_nemo_step, write_parity_step, write_prime_step


@pytest.fixture(scope="module")
def model(build_tiny):
    return str(build_tiny("fake"))


@pytest.fixture
def service(tmp_path):
    svc = ParityService(db_path=str(tmp_path / "runs.db"))
    yield svc
    svc.close()


rows = synthetic_rows


def _req(root, model, **kw):
    return TrendRequest(root=str(root), model=model, config=build_config(None, []), **kw)


# -- the change-point ------------------------------------------------------------------------------


def test_a_jump_is_named_at_its_first_step_with_its_size_and_a_flat_or_drifting_series_is_not():
    cp = find_change("k3", [1, 2, 3, 4, 5], [2e-12, 3e-12, 4e-3, 5e-3, 4.5e-3])
    assert cp is not None and cp.step == 3 and cp.before == pytest.approx(2.5e-12) and cp.ratio > 1e8
    assert find_change("k3", [1, 2, 3, 4, 5], [1e-3, 1.1e-3, 0.9e-3, 1.05e-3, 1e-3]) is None
    assert find_change("outside_0.8_1.2", [1, 2, 3], [0.0, 0.0, 0.3]).step == 3  # a jump at the last step
    assert find_change("outside_0.8_1.2", [1, 2], [0.0, 0.3]) is None  # no baseline of 2 steps before it
    assert find_change("outside_0.8_1.2", range(1, 9), [0.01, 0.011, 0.012, 0.013, 0.014, 0.015, 0.016, 0.017]) is None
    cp = find_change("rho_mean", [1, 2, 3, 4], [1.0, 1.0001, 0.7, 0.71])
    assert cp is not None and cp.step == 3 and "jumps at step 3" in cp.sentence()


def test_gate_rules_parse_and_name_the_unknown():
    (rule,) = parse_gate(["k3 > 0.001"])
    assert rule.breached(0.002) and not rule.breached(0.0005)
    # A step that could not measure the figure (no scorable token; a figure its mode never computes)
    # fails the gate: a training script reading the exit code must not go on as if it passed.
    assert rule.breached(None) and rule.breached(float("nan"))
    assert parse_gate(["rho_mean<0.9"])[0].breached(0.8)
    with pytest.raises(ValueError, match="unknown figure 'kk'"):
        parse_gate(["kk>1"])
    with pytest.raises(ValueError, match="FIGURE>LIMIT"):
        parse_gate(["k3=1"])


# -- recorded-only replay ----------------------------------------------------------------------------


def test_recorded_only_figures_equal_the_store_pooled_figures_of_the_same_pair(service, model, tmp_path):
    from parity_ui.commands.replay_recorded import replay_recorded
    from parity_ui.core.replay_record import RECORDED_TRAINER, RECORDED_TRAINER_PAIR
    from parity_ui.measures.clipped import pool_clipped
    from parity_ui.measures.tokens import side_figures

    path = write_parity_step(tmp_path, 1, rows(3))
    req = ReplayRequest(dump=str(path), model=model, config=build_config(None, []))
    got = replay_recorded(service, req)
    run = got.run
    record = run.workload.replay
    assert run.kind == "replay" and run.status == "ok" and record.recorded_only
    # One pair, named as an engine replay names the same pair; "recorded~trainer" (its key before schema 3)
    (pair,) = record.pairs
    name = "recorded vs trainer (recorded)"
    assert pair.kind == RECORDED_TRAINER_PAIR and pair.name == name == got.pair and record.main is pair
    assert record.pair("recorded~trainer") is pair and run.workload.figures_of("recorded~trainer") is not None
    mem = run.workload.sides[name]
    stored = side_figures(service.store, run.id, name)  # what an engine replay pools its pairs with
    back = service.get_run(run.id, prompts=[2])
    pool_clipped(service.store, run.id, back.workload)  # the clipped-ratio measure's pooling, from the store
    assert dataclasses.asdict(mem.stats.tokens) == dataclasses.asdict(stored.stats.tokens)
    assert dataclasses.asdict(mem.hist) == dataclasses.asdict(stored.hist)
    assert mem.stats.families["clipped"] == back.workload.sides[name].stats.families["clipped"]
    assert mem.stats.families["clipped"]["rho_low_share"] == 0.0 and mem.stats.families["clipped"]["tokens"] == 66
    assert record.masked == 6 and record.tokens == 72 and mem.stats.tokens.pairs == 6 * 11
    # The token view's two streams: the recorded trainer (the reference) against the recorded rollout.
    p = back.prompts[0]
    assert set(p.results) == {RECORDED_TRAINER, "recorded"} and back.sides[0].name == RECORDED_TRAINER
    assert [s.logprob for s in p.results["recorded"].steps] == pytest.approx(rows(3)[2]["rollout"])
    assert all(s.text for s in p.results[RECORDED_TRAINER].steps)
    worst = record.worst_tokens[0]
    assert abs(worst.dlogp + 0.4) < 1e-2 and worst.pair == name and worst.side == "recorded" and worst.row
    assert got.figures.figures["k3"] == mem.stats.tokens.k3 and got.figures.figures["rho_low_share"] == 0.0
    assert "recorded only, no engine" in run.workload.headline and name in run.workload.headline
    with pytest.raises(ParityError, match="recorded-only replay"):
        service.resume(run.id)


def test_a_dump_without_trainer_logprobs_is_not_replayed_recorded_only(service, model, tmp_path):
    r = rows(1)
    for x in r:
        x["trainer"] = None
    path = write_parity_step(tmp_path, 1, r)
    with pytest.raises(ParityError) as e:
        service.replay_recorded(ReplayRequest(dump=str(path), model=model, config=build_config(None, [])))
    assert "holds no trainer logprobs" in str(e.value)
    assert "--side a=hf" in e.value.fix


# -- the trend ---------------------------------------------------------------------------------------


def test_the_trend_names_the_step_where_the_mismatch_jumps(service, model, tmp_path):
    for step in range(1, 6):
        write_prime_step(tmp_path / "run", step, rows(step))
    run = service.trend(_req(tmp_path / "run", model))
    report = service.store.trend(run.id)
    assert run.kind == "trend" and run.status == "ok"
    assert [s.step for s in report.steps] == [1, 2, 3, 4, 5] and all(s.status == "ok" for s in report.steps)
    first = report.changes[0]
    assert first.step == 3 and first.figure == "k3" and first.after > 1e3 * first.before
    assert {c.figure for c in report.changes} >= {"k3", "outside_0.8_1.2", "abs_dlogp_p99"}
    assert all(c.step == 3 for c in report.changes)
    # each step is its own replay, in the trend's group; its figures are that replay's
    step3 = report.step(3)
    replay = service.get_run(step3.run_id, prompts=[])
    assert replay.group_id == run.id and replay.kind == "replay"
    assert step3.figures.figures["k3"] == replay.workload.sides["recorded vs trainer (recorded)"].stats.tokens.k3
    assert step3.pair == report.pair == "recorded vs trainer (recorded)"
    assert step3.figures.figures["rho_clipped_share"] == replay.workload.sides[report.pair].stats.families[
        "clipped"]["rho_clipped_share"]
    assert step3.facts["ranks"] == [0, 1]
    assert "jumps at step 3" in report.headline


def test_several_policy_versions_in_a_step_get_their_own_figures(service, model, tmp_path):
    r = rows(4)
    for k, x in enumerate(r):
        x["version"] = 3 if k < 3 else 4
    write_parity_step(tmp_path / "run", 1, r)
    report = service.store.trend(service.trend(_req(tmp_path / "run", model, settle_s=0)).id)
    v = report.step(1).versions
    assert set(v) == {"3", "4"} and v["3"].rows == 3 and v["4"].rows == 3


def test_bad_steps_are_named_and_the_rest_replayed(service, model, tmp_path):
    root = tmp_path / "run"
    for step in range(1, 5):
        write_prime_step(root, step, rows(step, fault_from=99), stable=step != 2, skip_ranks=(1,) if step == 3 else ())
    other = rows(4, fault_from=99)
    other[0]["response"][0] = 10_000  # an id beyond this model's vocabulary: a dump of another model
    write_prime_step(root, 4, other)
    report = service.store.trend(service.trend(_req(root, model)).id)
    by = {s.step: s for s in report.steps}
    assert by[1].status == "ok" and by[2].status == "skipped" and "no STABLE marker" in by[2].note
    assert by[3].status == "partial" and "ranks 1 are missing" in by[3].note
    assert by[4].status == "error" and "written for another model" in by[4].note
    assert any("step 2 skipped" in f for f in report.findings)


def test_follow_picks_up_a_step_written_while_it_runs_and_fails_the_gate_there(service, model, tmp_path):
    root = tmp_path / "run"
    for step in (1, 2):
        write_prime_step(root, step, rows(step))
    seen = []
    req = _req(root, model, follow=True, poll_s=0.1, idle_exit_s=20, gate=parse_gate(["k3>0.001"]))

    def later():
        time.sleep(1.0)
        write_prime_step(root, 3, rows(3), stable=False)  # the ranks first, the marker once every rank flushed
        time.sleep(0.5)
        (root / "token_exports" / "step_3" / "STABLE").touch()

    writer = threading.Thread(target=later)
    writer.start()
    run = service.trend(req, on_step=lambda s, r: seen.append((s.step, s.status, dict(r.breach or {}))))
    writer.join()
    report = service.store.trend(run.id)
    assert [s for s, _, _ in seen] == [1, 2, 3] and report.follow
    assert report.breach["step"] == 3 and report.breach["rule"] == "k3 > 0.001" and run.status == "diverged"
    assert seen[-1][2]["step"] == 3  # the breach was known when step 3's line went out
    assert report.step(3).landed_s is not None and report.step(3).landed_s < 10


def test_follow_waits_for_an_empty_directory(service, model, tmp_path):
    root = tmp_path / "later"
    root.mkdir()

    def later():
        time.sleep(0.5)
        write_prime_step(root, 1, rows(1))

    threading.Thread(target=later).start()
    run = service.trend(_req(root, model, follow=True, poll_s=0.1, until_step=1, idle_exit_s=20))
    assert [s.step for s in service.store.trend(run.id).steps] == [1]


def test_a_directory_that_is_no_run_is_refused_before_anything_is_stored(service, model, tmp_path):
    write_nemo_step(tmp_path / "mixed", 1, rows(1))
    write_parity_step(tmp_path / "mixed", 2, rows(2))
    with pytest.raises(ParityError, match="mixes the step dumps of several formats"):
        service.trend(_req(tmp_path / "mixed", model))
    assert service.store.list_runs() == []


# -- the views ---------------------------------------------------------------------------------------


def test_cli_table_json_exit_codes_report_and_history(service, model, tmp_path, capsys):
    from parity_ui import cli
    from parity_ui.ui.history_tab import history_rows

    for step in range(1, 5):
        write_prime_step(tmp_path / "run", step, rows(step))
    db = str(tmp_path / "cli.db")
    code = cli.main(["--db", db, "replay", str(tmp_path / "run"), "--model", model, "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and "jumps at step 3" in out and " 3 *" in out
    code = cli.main(["--db", db, "replay", str(tmp_path / "run"), "--model", model, "--quiet", "--json",
                     "--fail-on", "outside_0.8_1.2>0.1", "--steps", "2-4"])
    got = json.loads(capsys.readouterr().out)
    assert code == 1 and [s["step"] for s in got["trend"]["steps"]] == [2, 3, 4]
    assert got["trend"]["breach"]["step"] == 3
    trend_id = got["run_id"]
    assert cli.main(["--db", db, "report", trend_id, "-o", str(tmp_path / "t.html")]) == 0
    page = (tmp_path / "t.html").read_text()
    step3 = got["trend"]["steps"][1]["run_id"]
    assert f'href="?run={step3}"' in page and "tr-chart" in page and "PARITY GATE FAILED at step 3" in page
    capsys.readouterr()
    assert cli.main(["--db", db, "runs", "show", trend_id]) == 0
    assert "PARITY GATE FAILED at step 3" in capsys.readouterr().out
    code = cli.main(["--db", db, "replay", str(tmp_path / "run" / "token_exports" / "step_3"), "--model", model,
                     "--recorded-only", "--quiet"])
    assert code == 0 and "recorded only, no engine" in capsys.readouterr().out
    from parity_ui.service import open_store

    listed = {r[-1]: r for r in history_rows(open_store(db))}
    assert "gate FAILED at step 3" in listed[trend_id][1] and str(tmp_path / "run") in listed[trend_id][4]


def test_with_engines_the_trend_follows_the_recorded_routes_against_the_trainers(tmp_path):
    """--side given: each step replayed through the sides (the fake kinds in real workers); a run whose
    rollout engine routes one layer otherwise from step 3 on: routes identical jumps there."""
    from fake_engine import FakeEngine, fake_service, registered

    def fake_routes(ids, moved):
        e = FakeEngine()
        e.args = {"route_flip_every": None}
        out = []
        for p in range(len(ids) - 1):
            row = [e._route(ids[: p + 1], p, layer)[0] for layer in (0, 1)]
            if moved:  # layer 1's second expert: one the trainer does not pick
                a, b = row[1]
                row[1] = [a, next(x for x in range(8) if x not in (a, b))]
            out.append(row)
        return out

    with registered():
        model = str(fake_model(tmp_path / "moe", max_position_embeddings=256, moe=True))
        root = tmp_path / "run"
        root.mkdir()
        for step in range(1, 6):
            with (root / f"step_{step}.jsonl").open("w") as f:
                for k in range(4):
                    prompt, resp = [1, 8 + k, 9 + step], [20 + k, 21, 22, 23, 24]
                    f.write(json.dumps({"prompt_ids": prompt, "response_ids": resp, "rollout_logprobs": [-1.0] * 5,
                                        "routed_experts": fake_routes(prompt + resp, step >= 3)}) + "\n")
        with fake_service(tmp_path / "runs.db") as svc:
            cfg = build_config(None, ["routes=true"], sides=["ref=fake", "b=fake"])
            req = TrendRequest(root=str(root), model=model, config=cfg, engines=True, floor="none", settle_s=0)
            run = svc.trend(req)
            report = svc.store.trend(run.id)
    assert report.mode == "engines" and [s.status for s in report.steps] == ["ok"] * 5, [s.note for s in report.steps]
    same = {s.step: s.figures.figures.get("route_same_set") for s in report.steps}
    assert same[1] == same[2] == 1.0 and same[3] == same[5] == 0.5, same
    change = next(c for c in report.changes if c.figure == "route_same_set")
    assert change.step == 3 and change.after == 0.5
    assert report.step(1).figures.figures["k3"] is not None  # the trainer re-run against the recorded rollout
