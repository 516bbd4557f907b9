"""Replay above the engines, on the fake engine kind in real worker processes (seconds): the dump's
findings and the sides' traps stored before any engine loads (an fp32 lm_head on one side only),
Stop and resume, a truncated line kept going or stopped as chosen, a changed dump refused on resume.
The real engines replay real rollouts in tests/engines/test_replay_engines.py."""
from __future__ import annotations

import json
import random

import pytest

from fake_engine import fake_service, registered
from parity_ui.core.config import build_config
from parity_ui.core.errors import ParityError
from parity_ui.service import ReplayRequest
from parity_ui.store import runs as store
from parity_ui.store.runs import pair_samples

N = 20


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=256))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db") as svc:
        yield svc


def _dump(path, n=N, truncate=False):
    rnd = random.Random(0)
    lines = []
    for i in range(n):
        resp = [rnd.randrange(8, 400) for _ in range(6)]
        lines.append(json.dumps({"prompt_ids": [1, 8 + i, 9], "response_ids": resp,
                                 "rollout_logprobs": [-1.0 - 0.1 * t for t in range(6)],
                                 "sampling": {"temperature": 1.0, "logprobs_mode": "raw_logprobs"}}))
    if truncate:
        lines[5] = lines[5][:30]
    path.write_text("\n".join(lines) + "\n")
    return path


def _replay(svc, model, path, *sides, emit=None, **kw):
    cfg = build_config(None, [], sides=list(sides or ("ref=fake", "b=fake,shift=0.1")))
    return svc.replay(ReplayRequest(dump=str(path), model=model, config=cfg, **{"chunk": 4, **kw}), emit)


def test_stop_keeps_finished_chunks_and_resume_replays_each_row_once(service, model, tmp_path):
    def stop_after_first_chunk(e):
        if e.kind == "progress" and e.prompt_index == 4:
            service.cancel()

    path = _dump(tmp_path / "r.jsonl")
    run = _replay(service, model, path, "ref=fake,delay_ms=2", "b=fake,shift=0.1", emit=stop_after_first_chunk)
    assert run.status == "cancelled" and 4 <= run.workload.done < N, (run.status, run.error, run.workload.done)
    first = run.workload.replay
    assert first.tokens == 6 * run.workload.done and first.worst_tokens
    said = []
    again = service.resume(run.id, said.append)
    assert again.id == run.id and again.kind == "replay" and again.status in ("ok", "diverged"), again.error
    assert any("resuming replay" in e.message for e in said if e.kind == "status")
    for name in ("b vs ref", "recorded vs ref", "recorded vs b"):  # each pair's samples, under its one name
        assert sorted(s.prompt_index for s in pair_samples(service.db, run.id, name)) == list(range(N)), name
    rep = again.workload.replay
    assert again.workload.done == N and rep.tokens == 6 * N and again.workload.sides["b vs ref"].stats.tokens.pairs == 6 * N
    assert len(rep.worst_tokens) == 20 and rep.forced == first.forced
    with pytest.raises(ParityError, match="finished every row"):
        service.resume(run.id)
    # History's prompt column names the dump, not its first row ("line 1")
    listed = {r.id: r for r in service.store.list_runs()}[run.id]
    assert listed.prompt_excerpt == f"replay of r.jsonl: {N} rows (parity)", listed.prompt_excerpt


def test_resume_refuses_a_dump_that_changed(service, model, tmp_path):
    path = _dump(tmp_path / "r.jsonl")
    run = _replay(service, model, path, "ref=fake,fail_load=true", "b=fake")
    assert run.status == "error"
    _dump(path, n=N + 1)
    with pytest.raises(ParityError, match="not the file replayed") as e:
        service.resume(run.id)
    assert "start a new replay" in e.value.fix


def test_a_truncated_line_stops_the_replay_or_is_skipped_and_named(service, model, tmp_path):
    path = _dump(tmp_path / "cut.jsonl", truncate=True)
    before = len(service.store.list_runs())
    with pytest.raises(ParityError) as e:
        _replay(service, model, path)
    assert "line 6" in str(e.value) and "truncated" in str(e.value) and "--on-bad skip" in str(e.value)
    assert len(service.store.list_runs()) == before  # refused before anything is stored
    run = _replay(service, model, path, on_bad="skip")
    assert run.status in ("ok", "diverged"), run.error
    assert run.workload.done == N - 1 and run.workload.replay.skipped == ["line 6"]
    bad = next(w for w in run.warnings if w.code == "replay-bad-rows")
    assert "line 6" in bad.message and "not valid JSON" in bad.message


def test_an_fp32_lm_head_on_one_side_only_is_named_before_any_engine_loads(service, model, tmp_path):
    path = _dump(tmp_path / "r.jsonl", n=4)
    run = _replay(service, model, path, "ref=fake,dtype=bfloat16,fp32_logits=true,fail_load=true",
                  "b=fake,dtype=bfloat16")
    assert run.status == "error"  # no engine ever loaded ...
    found = next(w for w in run.warnings if w.code == "fp32-logits-one-sided")  # ... and the trap is named
    assert "fp32_logits is on for ref only" in found.message and "(b)" in found.message and "NeMo-RL #3936" in found.message and "every side, or for none" in found.fix
    stored = service.get_run(run.id)
    assert any(w.code == "fp32-logits-one-sided" for w in stored.warnings)


def test_a_gate_case_can_be_a_replay_with_thresholds_on_its_pairs(service, model, tmp_path):
    from parity_ui.cli import main
    from parity_ui.store.checks import check_result

    _dump(tmp_path / "rollouts.jsonl", n=6)
    spec = tmp_path / "gate.yaml"
    spec.write_text(f"""cases:
  - name: engine-rerun
    model: {model}
    sides: [{{name: ref, kind: fake}}, {{name: b, kind: fake}}]
    replay: {{file: rollouts.jsonl, limit: 4}}
    check_sides: [b]
    thresholds: {{abs_dlogp_max: 0.001, outside_0.8_1.2: 0}}
  - name: the-run
    model: {model}
    sides: [{{name: ref, kind: fake}}, {{name: b, kind: fake}}]
    replay: rollouts.jsonl
    thresholds: {{outside_0.8_1.2: 0.01}}
""")
    db = str(tmp_path / "gate.db")
    code = main(["--db", db, "check", str(spec), "--quiet", "--json"])
    assert code == 1  # the engine re-run passes; the recorded rollout (made up logprobs) fails
    from parity_ui.store.runs import list_runs, open_db

    runs = {r.kind for r in list_runs(open_db(db))}
    assert "replay" in runs and "check" in runs
    check = check_result(open_db(db), next(r.id for r in list_runs(open_db(db)) if r.kind == "check"))
    cases = {c["name"]: c for c in check["cases"]}
    assert cases["engine-rerun"]["status"] == "pass" and cases["the-run"]["status"] == "fail", cases


def test_a_replay_case_refuses_sequence_metrics_and_its_control_replays_the_dump(service, model, tmp_path):
    """Every replay row is identical by construction (the dump's tokens are forced): share_identical on a
    replay cannot fail and is refused. A replay case's control replays its dump with the control's
    change (it ran a workload of no prompts, which has no pair to judge: always an error)."""
    from parity_ui.cli import main
    from parity_ui.commands.gate.spec import SpecError, parse_spec
    from parity_ui.store.checks import check_result
    from parity_ui.store.runs import list_runs, open_db

    with pytest.raises(SpecError, match="share_identical cannot fail on a replay"):
        parse_spec(f"cases:\n  - name: r\n    model: {model}\n    replay: r.jsonl\n"
                   "    thresholds: {share_identical: 0.99}\n", base=tmp_path)
    _dump(tmp_path / "rollouts.jsonl", n=4)
    spec = tmp_path / "gate.yaml"
    spec.write_text(f"""cases:
  - name: rerun
    model: {model}
    sides: [{{name: ref, kind: fake}}, {{name: b, kind: fake}}]
    replay: rollouts.jsonl
    check_sides: [b]
    thresholds: {{abs_dlogp_max: 0.001}}
    control: {{set: {{b.shift: 0.5}}}}
""")
    db = str(tmp_path / "gate.db")
    main(["--db", db, "check", str(spec), "--quiet", "--json"])
    check = check_result(open_db(db), next(r.id for r in list_runs(open_db(db)) if r.kind == "check"))
    (case,) = check["cases"]
    # The control was judged on a replay of its own (the fake scores the dump's made-up tokens alike
    # whatever its shift, so this control cannot make the case fail: said as such, not as an error).
    control = case["control"]
    assert control["outcome"]["status"] == "fail" and "the gate cannot fail" in control["outcome"]["message"]
    assert [o["check"] for o in control["outcomes"]] == ["abs_dlogp_max <= 0.001"]
    assert sum(r.kind == "replay" for r in list_runs(open_db(db))) == 2  # the case's replay and its control's


def test_full_distribution_on_a_replay_names_the_sides_without_rows_and_goes_on(service, model, tmp_path):
    """full_distribution on a replay whose sides (the fake kind) cannot give full rows: each is named,
    the replay's own figures stand, and no pair has distribution figures (not recorded, never 0)."""
    path = _dump(tmp_path / "r.jsonl")
    cfg = build_config(None, ["full_distribution=true"], sides=["ref=fake", "b=fake,shift=0.1"])
    run = service.replay(ReplayRequest(dump=str(path), model=model, config=cfg, chunk=4))
    assert run.status in ("ok", "diverged"), run.error
    named = {w.message.split()[2] for w in run.warnings if w.code == "full-distribution-unavailable"}
    assert named == {"ref", "b"}
    assert run.workload.sides["b vs ref"].stats.tokens.pairs == 6 * N
    assert all(f.stats.family("distribution") is None for f in run.workload.sides.values())


def test_a_replay_stored_before_schema_3_opens_with_its_pairs_by_name(service, model, tmp_path):
    """A replay an older release stored (its pairs keyed by strings such as "recorded~b", its figures by
    those keys, a worst token's `pair` naming the rollout side, no verdicts by measure) opens with every
    pair by its one name and the same figures: the store's migration moves the pairs' samples to their
    names, and the record reads the old shape; --json keeps the old keys as aliases for one schema version."""
    from parity_ui.render.report import run_json
    from parity_ui.store.runs import open_db

    run = _replay(service, model, _dump(tmp_path / "r.jsonl"), "ref=fake", "b=fake,shift=0.1", floor="none")
    assert run.status in ("ok", "diverged"), run.error
    now = service.get_run(run.id, prompts=[]).workload
    assert list(now.sides) == ["recorded vs ref", "b vs ref", "recorded vs b"]
    # The old shape, as the release before schema 3 wrote it.
    db = service.db
    data = json.loads(next(db.query("SELECT workload_json FROM runs WHERE id = ?", [run.id]))["workload_json"])
    pairs = data["replay"]["pairs"]
    data["replay"]["pairs"] = [{"key": p["key"], "a": p["a"], "b": p["b"], "meaning": p["meaning"]} for p in pairs]
    data["replay"]["worst_tokens"] = [{**{k: v for k, v in w.items() if k != "side"}, "pair": w["side"]}
                                      for w in data["replay"]["worst_tokens"]]
    data["sides"] = {p["key"]: {**{k: v for k, v in data["sides"][p["name"]].items() if k != "verdicts"},
                                "side": p["key"]} for p in pairs}
    db.execute("UPDATE runs SET workload_json = ? WHERE id = ?", [json.dumps(data), run.id])
    for p in pairs:
        db.execute("UPDATE pair_samples SET side = ? WHERE run_id = ? AND side = ?", [p["key"], run.id, p["name"]])
    db.execute("DELETE FROM _sqlite_migrations WHERE name = 'm009_replay_pair_names'")
    db.conn.commit()
    reopened = open_db(tmp_path / "runs.db")  # the migration runs again on the old rows
    back = store.get_run(reopened, run.id, prompts=[]).workload
    assert list(back.sides) == list(now.sides)
    for name, f in now.sides.items():
        assert back.sides[name].stats.to_dict() == f.stats.to_dict() and back.sides[name].side == name
        assert sorted(s.prompt_index for s in pair_samples(reopened, run.id, name)) == list(range(N))
    assert [p.name for p in back.replay.pairs] == list(now.sides)
    assert back.replay.worst_tokens == now.replay.worst_tokens  # pair and side named as the new release names them
    assert back.figures_of("recorded~b") is back.sides["recorded vs b"]  # an old key still finds its pair
    out = run_json(store.get_run(reopened, run.id, prompts=[]))
    assert out["schema"] == 3 and out["workload"]["sides"]["recorded~b"] == out["workload"]["sides"]["recorded vs b"]
