"""Workload runs above the engines, on the fake engine kind in real worker processes: chunks stored
as they finish, pooled figures read back from the store, the noise floor and the verdict, scored
mode, Stop and resume, failures half way, bad input, and the CLI's screen. Seconds, not minutes; the
real engines run workloads in test_workload_engines.py."""
from __future__ import annotations

import json

import pytest

from fake_engine import fake_service, registered
from parity_ui.cli import main
from parity_ui.core.config import build_config
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.store.runs import get_run, pair_samples
from parity_ui.core.workload_record import WorkloadOptions, report_from_json
from parity_ui.commands.workload.run import WorkloadRequest, resume_workload, run_workload

PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(30)]


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=64))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db") as svc:
        yield svc


def _workload(svc, model, *sides, prompts=PROMPTS, overrides=(), emit=None, **options):
    cfg = build_config(None, ["max_new_tokens=10", *overrides], sides=list(sides))
    opts = WorkloadOptions(**{"chunk": 8, **options})
    return run_workload(svc, WorkloadRequest(model=model, prompts=list(prompts), config=cfg, options=opts), emit)


def _samples(svc, run, side):
    return list(pair_samples(svc.db, run.id, side))


def test_identical_sides_are_within_a_zero_floor_and_every_prompt_is_stored_once(service, model):
    run = _workload(service, model, "ref=fake", "b=fake")
    assert run.status == "ok" and run.kind == "workload", run.error
    w = run.workload
    assert (w.n_prompts, w.done) == (30, 30) and w.floor.side == "floor" and w.floor.change == "batch"
    b = w.sides["b"]
    assert b.stats.sequences.share_identical == 1.0 and b.stats.tokens.abs_dlogp_max == 0.0
    assert w.floor_figures.stats.sequences.share_identical == 1.0 and w.floor_figures.stats.tokens.abs_dlogp_max == 0
    assert b.verdict.verdict == "within noise"
    assert sorted(s.prompt_index for s in _samples(service, run, "b")) == list(range(30))
    assert all(not p.results and not p.comparisons for p in run.prompts)  # the steps left memory for the store
    stored = get_run(service.db, run.id)
    assert report_from_json(stored.workload.to_json()) == stored.workload and stored.workload.sides["b"] == b
    assert len(stored.prompts) == 30 and set(stored.prompts[7].results) == {"ref", "b", "floor"}
    assert [c.b for c in stored.prompts[7].comparisons] == ["b", "floor"]
    assert stored.prompts[7].given == {"text": PROMPTS[7].text, "messages": None}
    assert "30 prompts, free-running: b 100% identical (within noise)" == w.headline


def test_a_planted_gap_exceeds_a_zero_floor_and_the_survival_curve_drops_where_it_forks(service, model):
    run = _workload(service, model, "ref=fake", "b=fake,shift=0.25,swap_at=6")
    w = run.workload
    b = w.sides["b"].stats
    assert run.status == "diverged" and b.sequences.share_identical == 0 and b.sequences.median_first_divergence == 6
    assert b.sequences.survival.value(5) == 1.0 and b.sequences.survival.value(6) == 0.0
    assert b.tokens.abs_dlogp_p50 == pytest.approx(0.25) and b.tokens.pairs == 30 * 6  # up to each fork
    v = w.sides["b"].verdict
    assert v.verdict == "exceeds noise" and "abs_dlogp_p99" in v.exceeded
    assert run.first_divergence == 6


def test_a_batch_variant_reference_sets_a_floor_a_smaller_gap_stays_within(service, model):
    """The reference moves by up to 0.5 nats when batched (its floor, at batch 8); a side 0.05 off at
    batch 1 is within that noise, one 2 nats off is not."""
    near = _workload(service, model, "ref=fake,batch_noise=0.5", "b=fake,shift=-0.05")
    floor = near.workload.floor_figures.stats.tokens
    assert floor.abs_dlogp_max > 0.3  # measured, not assumed
    assert near.workload.sides["b"].verdict.verdict == "within noise", near.workload.sides["b"].verdict.summary
    far = _workload(service, model, "ref=fake,batch_noise=0.5", "b=fake,shift=-2.0")
    v = far.workload.sides["b"].verdict
    assert v.verdict == "exceeds noise" and all(c.factor > 1.5 for c in v.figures if c.exceeds and c.factor)


def test_scored_mode_gives_free_runnings_per_token_gaps_up_to_the_fork(service, model):
    free = _workload(service, model, "ref=fake", "b=fake,shift=0.2,swap_at=5", floor="none")
    scored = _workload(service, model, "ref=fake", "b=fake,shift=0.2,swap_at=5", mode="scored", floor="none")
    assert scored.workload.options.mode == "scored" and scored.status == "diverged"
    f, s = _samples(service, free, "b"), _samples(service, scored, "b")
    assert [x.first_divergence for x in f] == [x.first_divergence for x in s] == [5] * 30
    for a, b in zip(f, s):
        n = a.first_divergence
        assert [x - y for x, y in zip(a.logp_side, a.logp_ref)] == \
            pytest.approx([x - y for x, y in zip(b.logp_side[:n], b.logp_ref[:n])])
        assert len(b.logp_side) == 10  # scored: the whole sequence
    stored = get_run(service.db, scored.id, prompts=[3])
    (p,) = stored.prompts
    assert p.results["ref"].finish_reason == "scored" and p.comparisons[0].first_divergence == 5


def test_stop_keeps_every_finished_chunk_and_resume_finishes_each_prompt_exactly_once(service, model):
    def stop_after_first_chunk(e):
        if e.kind == "progress" and e.prompt_index == 8:
            service.cancel()

    run = _workload(service, model, "ref=fake,delay_ms=2", "b=fake,shift=0.1", emit=stop_after_first_chunk)
    assert run.status == "cancelled" and run.workload.done >= 8, run.error
    done = run.workload.done
    assert run.workload.sides["b"].stats.sequences.n == done  # the figures so far, from the store
    said = []
    again = resume_workload(service, run.id, said.append)
    assert again.id == run.id and again.status == "ok", again.error
    assert any("resuming" in e.message for e in said if e.kind == "status")
    for side in ("b", "floor"):
        assert sorted(s.prompt_index for s in _samples(service, again, side)) == list(range(30))
    assert again.workload.done == 30 and again.workload.sides["b"].stats.sequences.n == 30
    assert get_run(service.db, run.id, prompts=[]).duration_ms >= run.duration_ms
    with pytest.raises(Exception, match="finished every prompt"):
        resume_workload(service, run.id)


def test_a_side_that_fails_half_way_keeps_the_finished_chunks_and_is_resumable(service, model):
    run = _workload(service, model, "ref=fake", "b=fake,fail_after=12")
    assert run.status == "error" and "crashed after 12 prompts" in run.error
    assert run.workload.done == 8 and run.workload.sides["b"].stats.sequences.n == 8
    again = resume_workload(service, run.id)  # a fresh worker: it fails again 12 prompts later
    assert again.status == "error" and again.workload.done == 16


def test_too_long_prompts_are_skipped_and_counted_or_stop_the_run(service, model):
    long = PromptSpec(text="import os\n" * 40)
    run = _workload(service, model, "ref=fake", "b=fake", prompts=[*PROMPTS[:5], long, *PROMPTS[5:8]])
    assert run.status == "ok" and run.workload.skipped_too_long == [5] and run.workload.done == 8
    assert 5 not in {s.prompt_index for s in _samples(service, run, "b")}
    stop = _workload(service, model, "ref=fake", "b=fake", prompts=[long, *PROMPTS[:3]], too_long="stop")
    assert stop.status == "error" and "prompt 0" in stop.error and "context" in stop.error


@pytest.mark.parametrize("sides,options,needle", [
    (["ref=fake", "b=fake"], {"mode": "scored", "floor": "batch"}, "changes nothing in scored mode"),
    (["ref=fake", "b=fake"], {"floor": "kernel"}, "switches an HF reference's attention kernel"),
    (["ref=fake", "b=fake"], {"mode": "fast"}, "must be one of free, scored"),
])
def test_bad_workload_options_are_error_runs_with_a_fix(service, model, sides, options, needle):
    run = _workload(service, model, *sides, prompts=PROMPTS[:3], **options)
    assert run.status == "error" and needle in run.error, run.error
    assert get_run(service.db, run.id, prompts=[]).status == "error"


def test_the_cli_prints_one_screen_json_and_a_prompt_on_demand(model, tmp_path, capsys):
    f = tmp_path / "w.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": p.text}) for p in PROMPTS[:12]) + "\n{broken\n")
    db = str(tmp_path / "cli.db")
    with registered():
        code = main(["--db", db, "compare", "--model", model, "--prompt-file", str(f), "--side", "ref=fake",
                     "--side", "b=fake,swap_at=3", "--set", "max_new_tokens=6", "--on-bad", "skip", "--quiet"])
        out = capsys.readouterr().out
        assert code == 1 and "12 prompts, free-running: b 0% identical" in out and "EXCEEDS" in out
        assert out.count("prompt ") < 40  # a screen, not a page per prompt
        run_id = out.split("workload ")[1].split(":")[0]
        assert main(["--db", db, "runs", "show", run_id, "--prompt", "4"]) == 0
        shown = capsys.readouterr().out
        assert "prompt 4:" in shown and "FIRST DIVERGENCE at generated token 3" in shown and "prompt 5:" not in shown
        assert main(["--db", db, "runs", "show", run_id, "--prompt", "40"]) == 2
        code = main(["--db", db, "compare", "--model", model, "--prompt-file", str(f), "--side", "ref=fake",
                     "--side", "b=fake", "--set", "max_new_tokens=6", "--on-bad", "skip", "--json", "--limit", "5"])
        got = json.loads(capsys.readouterr().out)
        assert code == 0 and got["workload"]["n_prompts"] == 5 and got["workload"]["sides"]["b"]["stats"]
        assert got["workload"]["options"]["source"]["content_hash"]
        code = main(["--db", db, "compare", "--model", model, "--prompt-file", str(f), "--side", "ref=fake",
                     "--side", "b=fake", "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and "line 13" in err and "--on-bad skip" in err


def test_a_stop_while_the_reference_scores_keeps_the_finished_chunks_and_resume_finishes(service, model):
    """Scored mode's scoring runs on a thread (commands/workload/pieces.py): a Stop during it reaches
    the run as a Stop, the chunks stored before it stay, and the resume scores the rest once."""
    def stop_at_second_scoring(e):
        if e.kind == "progress" and "scoring" in e.message and "chunk 2 " in e.message:
            service.cancel()

    run = _workload(service, model, "ref=fake", "b=fake,shift=0.1", mode="scored", floor="none",
                    emit=stop_at_second_scoring)
    assert run.status == "cancelled" and run.workload.done == 8, run.error
    assert sorted(s.prompt_index for s in _samples(service, run, "b")) == list(range(8))
    again = resume_workload(service, run.id)
    assert again.status in ("ok", "diverged") and again.workload.done == 30, again.error
    assert sorted(s.prompt_index for s in _samples(service, again, "b")) == list(range(30))
