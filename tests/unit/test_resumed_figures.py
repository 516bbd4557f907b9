"""A stopped-then-resumed workload's distribution and sampling families pool every stored chunk, as
the routing family does (tests/unit/test_routes_workloads.py): the figures equal an uninterrupted
run's exactly. Above the engines, on the fake kind: `distribution=true` puts the whole-distribution
scalars on its scored positions (what a reference meeting full rows computes), `draws=true` records
each token's kept set and mass (what a shared-seed sampler records)."""
from __future__ import annotations

import pytest

from fake_engine import fake_service, registered
from parity_ui.commands.workload.run import WorkloadRequest, resume_workload, run_workload
from parity_ui.core.config import build_config
from parity_ui.core.workload_record import WorkloadOptions
from parity_ui.inputs.prompts import PromptSpec

PROMPTS = [PromptSpec(text=f"def g{i}(y):\n    return y + {i}") for i in range(24)]
NEW = 8


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=64))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db") as svc:
        yield svc


def _workload(svc, model, sides, overrides=(), emit=None, **options):
    cfg = build_config(None, [f"max_new_tokens={NEW}", *overrides], sides=list(sides))
    opts = WorkloadOptions(**{"chunk": 8, **options})
    return run_workload(svc, WorkloadRequest(model=model, prompts=list(PROMPTS), config=cfg, options=opts), emit)


def _stopped_then_resumed(svc, model, sides, **kw):
    def stop_after_first_chunk(e):
        if e.kind == "progress" and e.prompt_index == 8:
            svc.cancel()

    run = _workload(svc, model, sides, emit=stop_after_first_chunk, **kw)
    assert run.status == "cancelled" and 8 <= run.workload.done < len(PROMPTS), run.error
    again = resume_workload(svc, run.id)
    assert again.status in ("ok", "diverged") and again.workload.done == len(PROMPTS), again.error
    return run, again


def test_a_resumed_scored_workload_pools_the_distribution_of_every_stored_chunk(service, model):
    # (a scored workload's floor is an HF reference's other kernel: none on the fake kind, so two sides)
    sides = ("ref=fake,distribution=true,delay_ms=2", "b=fake,shift=0.1", "c=fake,swap_at=3")
    kw = dict(overrides=["full_distribution=true"], mode="scored", floor="none")
    whole = _workload(service, model, sides, **kw)
    assert whole.status in ("ok", "diverged"), whole.error
    w = whole.workload
    dist = {n: w.sides[n].stats.family("distribution") for n in ("b", "c")}
    for d in dist.values():  # every scored position: the reference scores each side's 8 tokens of the 24 prompts
        assert d["positions"] == len(PROMPTS) * NEW and 0 < d["kl_mean"] < 0.02 and 0 < d["top1_agree"] < 1
    assert dist["b"] != dist["c"]  # c's tokens leave at position 3: the reference scores other sequences

    run, again = _stopped_then_resumed(service, model, sides, **kw)
    assert run.workload.sides["b"].stats.family("distribution")["positions"] == run.workload.done * NEW  # the figures so far
    # the resumed run counts the chunk run before the resume too: the uninterrupted run's figures, exactly
    stored = service.store.get_run(run.id, prompts=[]).workload
    for n in ("b", "c"):
        assert again.workload.sides[n].stats.family("distribution") == dist[n]
        assert stored.sides[n].stats.family("distribution") == dist[n]


def test_a_resumed_sampled_workload_pools_the_kept_mass_of_every_stored_chunk(service, model):
    sides = ("ref=fake,draws=true,delay_ms=2", "b=fake,draws=true,shift=0.01")
    whole = _workload(service, model, sides)
    assert whole.status in ("ok", "diverged"), whole.error
    w = whole.workload
    samp = w.sides["b"].stats.family("sampling")
    assert samp["tokens"] > len(PROMPTS) * NEW // 2 and 0 < samp["kept_sets_differ"] < 0.5
    assert 0.7 <= samp["kept_mass_mean"] < 1 and w.floor_figures.stats.family("sampling")["kept_sets_differ"] == 0.0
    assert w.sides["b"].verdicts.get("sampling")

    run, again = _stopped_then_resumed(service, model, sides)
    assert run.workload.sides["b"].stats.family("sampling")["tokens"] < samp["tokens"]  # the figures so far
    a = again.workload
    assert a.sides["b"].stats.family("sampling") == samp
    assert a.floor_figures.stats.family("sampling") == w.floor_figures.stats.family("sampling")
    assert a.sides["b"].verdicts.get("sampling") == w.sides["b"].verdicts.get("sampling")
    assert service.store.get_run(run.id, prompts=[]).workload.sides["b"].stats.family("sampling") == samp


def test_a_resumed_replay_pools_the_distribution_of_every_stored_chunk(service, model, tmp_path):
    import json
    import random

    from parity_ui.service import ReplayRequest

    rnd, n = random.Random(0), 16
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": [1, 8 + i, 9], "response_ids": [rnd.randrange(8, 400)
                                                                                       for _ in range(6)]}) + "\n"
                            for i in range(n)))
    cfg = build_config(None, ["full_distribution=true"], sides=["ref=fake,delay_ms=2", "b=fake,shift=0.1,distribution=true"])

    def replay(emit=None):
        return service.replay(ReplayRequest(dump=str(path), model=model, config=cfg, chunk=4), emit)

    whole = replay()
    assert whole.status in ("ok", "diverged"), whole.error
    dist = whole.workload.sides["b vs ref"].stats.family("distribution")
    assert dist["positions"] == n * 6 and 0 < dist["kl_mean"] < 0.02

    def stop_after_first_chunk(e):
        if e.kind == "progress" and e.prompt_index == 4:
            service.cancel()

    run = replay(stop_after_first_chunk)
    assert run.status == "cancelled" and 4 <= run.workload.done < n, run.error
    assert run.workload.sides["b vs ref"].stats.family("distribution")["positions"] == 6 * run.workload.done
    again = service.resume(run.id)
    assert again.status in ("ok", "diverged") and again.workload.done == n, again.error
    assert again.workload.sides["b vs ref"].stats.family("distribution") == dist
