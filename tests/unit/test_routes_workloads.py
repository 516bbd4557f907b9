"""MoE routes in workloads and replays above the engines, on the fake kind (its routes: 2 MoE layers,
8 experts, top-2, a fixed function of the context; `route_flip_every` plants route flips): a resumed
workload pools every stored chunk's routes, scored mode compares the reference's routes on a side's
tokens with the side's own, a scored route replay, and a dump's recorded routes in a replay."""
from __future__ import annotations

import pytest

from fake_engine import fake_service, registered
from parity_ui.commands.workload.run import WorkloadRequest, resume_workload, run_workload
from parity_ui.core.config import build_config
from parity_ui.core.workload_record import WorkloadOptions
from parity_ui.inputs.prompts import PromptSpec

PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(24)]
NEW = 10


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=64))


@pytest.fixture
def service(model, tmp_path):
    with fake_service(tmp_path / "runs.db") as svc:
        yield svc


def _workload(svc, model, *sides, emit=None, overrides=(), **options):
    cfg = build_config(None, [f"max_new_tokens={NEW}", "routes=true", *overrides], sides=list(sides))
    opts = WorkloadOptions(**{"chunk": 8, **options})
    return run_workload(svc, WorkloadRequest(model=model, prompts=list(PROMPTS), config=cfg, options=opts), emit)


def test_a_resumed_workload_pools_the_routes_of_every_stored_chunk(service, model):
    sides = ("ref=fake,delay_ms=2", "b=fake,route_flip_every=3")
    whole = _workload(service, model, *sides)
    assert whole.status == "ok", whole.error
    full = whole.workload.sides["b"].stats.family("routing")
    # every prompt's 10 tokens x 2 layers compared (the tokens agree); flips at input positions % 3 == 0
    assert full["cells"] == len(PROMPTS) * NEW * 2 and full["tokens"] == len(PROMPTS) * NEW
    assert 0.1 < full["route_differ"] < 0.25 and full["route_same_set"] == pytest.approx(1 - full["route_differ"])
    assert whole.workload.floor_figures.stats.family("routing")["route_differ"] == 0.0
    assert "above the floor" in whole.workload.sides["b"].verdicts.get("routing")

    def stop_after_first_chunk(e):
        if e.kind == "progress" and e.prompt_index == 8:
            service.cancel()

    run = _workload(service, model, *sides, emit=stop_after_first_chunk)
    assert run.status == "cancelled" and 8 <= run.workload.done < len(PROMPTS), run.error
    assert run.workload.sides["b"].stats.family("routing")["tokens"] == run.workload.done * NEW  # the figures so far
    again = resume_workload(service, run.id)
    assert again.status == "ok" and again.workload.done == len(PROMPTS), again.error
    # the resumed run's routing figures count the chunks run before the resume too: the whole run's figures
    assert again.workload.sides["b"].stats.family("routing") == full
    assert again.workload.floor_figures.stats.family("routing") == whole.workload.floor_figures.stats.family("routing")
    assert again.workload.sides["b"].verdicts.get("routing") == whole.workload.sides["b"].verdicts.get("routing")
    stored = service.store.get_run(run.id, prompts=[]).workload
    assert stored.sides["b"].stats.family("routing") == full


def test_scored_mode_compares_the_references_routes_on_the_sides_tokens_and_replays_them_cheaply(service, model):
    run = _workload(service, model, "ref=fake", "b=fake,shift=0.2,route_flip_every=3,replay_routes=ids",
                    mode="scored", floor="none")
    assert run.status == "ok", run.error
    w = run.workload
    r = w.sides["b"].stats.family("routing")
    # the reference routed b's own sequences: every token compared, not only up to a fork
    assert r["cells"] == len(PROMPTS) * NEW * 2 and 0.1 < r["route_differ"] < 0.25
    stored = service.store.get_run(run.id, prompts=[0])
    c = stored.prompts[0].comparison("b")
    assert c.measures.get("routes").compared == NEW and c.measures.get("routes").first_flip.layer == 1 and min(c.measures.get("routes").first_flip.margins) <= 1e-3
    assert stored.prompts[0].results["ref"].routes.rows == NEW  # the reference's routes on b's tokens, stored
    # the replay: b scored its own tokens again routing with the reference's experts (the fake's gap was
    # all routing: it drops its shift), before/after on the comparison and pooled as its own pair
    rp = c.measures.get("route_replay")
    assert (rp.mode, rp.source) == ("ids", "ref") and rp.compared == NEW
    assert rp.before_max_abs_gap == pytest.approx(0.2) and rp.after_max_abs_gap == pytest.approx(0.0, abs=1e-9)
    after = w.sides["b+ref routes"].stats.tokens
    assert w.sides["b"].stats.tokens.abs_dlogp_max == pytest.approx(0.2)
    assert after.abs_dlogp_max == pytest.approx(0.0, abs=1e-9) and after.pairs == len(PROMPTS) * NEW
    from parity_ui.render.text import format_workload

    screen = format_workload(w, run.id)
    assert "b+ref routes" in screen and "routes identical" in screen
    print(screen)


def test_a_free_running_workload_says_it_does_not_replay_routes(service, model):
    run = _workload(service, model, "ref=fake", "b=fake,replay_routes=ids", floor="none")
    assert run.status == "ok", run.error
    (f,) = [w for w in run.warnings if w.code == "route-replay-free"]
    assert f.side == "b" and "--mode scored" in f.fix
    assert "b+ref routes" not in run.workload.sides and run.workload.sides["b"].stats.family("routing")["cells"] > 0


# -- a dump's recorded routes in a replay --------------------------------------------------------------

ROWS = 6
VOCAB = 0  # the fake MoE model's vocabulary (set by its fixture)


@pytest.fixture(scope="module")
def moe_model(build_tiny):
    import json
    from pathlib import Path

    global VOCAB
    with registered():
        path = build_tiny("fake-moe", arch="fake", max_position_embeddings=256, moe=True)
        VOCAB = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
        yield str(path)


def _fake_routes(ids):
    """The fake kind's own routes over ids (fake_engine.FakeEngine._route): [len(ids) - 1, 2, 2]."""
    from fake_engine import FakeEngine

    e = FakeEngine()
    e.args = {"route_flip_every": None}
    return [[e._route(ids[:p + 1], p, layer)[0] for layer in (0, 1)] for p in range(len(ids) - 1)]


def _fake_greedy(prompt, n):
    """The fake kind's own greedy tokens after prompt (so its logprobs of them move with its shift)."""
    from fake_engine import FakeEngine

    e = FakeEngine()
    e.args = {"vocab_size": VOCAB, "noise": 0.0, "batch_noise": 0.0, "shift": 0.0, "swap_at": None}
    ctx = list(prompt)
    for pos in range(n):
        ctx.append(e._top(ctx, pos, 2)[0][0])
    return ctx[len(prompt):]


def _routes_dump(path, plant=None, bad=None, greedy=False):
    """A parity-format dump whose routed_experts are the fake's own, but at `plant` = (row, position):
    layer 0's second expert moved (a route the replayed sides do not take); `bad` makes them another
    model's: "layers" (3), "top_k" (3), "experts" (an id 9 of 8), "rows" (one position short)."""
    import json
    import random

    rnd = random.Random(1)
    lines = []
    for i in range(ROWS):
        prompt = [1, 8 + i, 9]
        resp = _fake_greedy(prompt, 6) if greedy else [rnd.randrange(8, 400) for _ in range(6)]
        routed = _fake_routes(prompt + resp)
        if plant and plant[0] == i:
            a, b = routed[plant[1]][0]
            routed[plant[1]][0] = [a, next(e for e in range(8) if e not in (a, b))]
        if bad == "layers":
            routed = [row + [[0, 1]] for row in routed]
        elif bad == "top_k":
            routed = [[layer + [7] for layer in row] for row in routed]
        elif bad == "experts" and i == 2:
            routed[0][0] = [9, 1]
        elif bad == "rows":
            routed = routed[:-1]
        lines.append(json.dumps({"prompt_ids": prompt, "response_ids": resp, "routed_experts": routed,
                                 "rollout_logprobs": [-1.0] * 6,
                                 "sampling": {"temperature": 1.0, "logprobs_mode": "raw_logprobs"}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _replay(svc, model, path, routes=True, sides=("ref=fake", "b=fake")):
    from parity_ui.service import ReplayRequest

    cfg = build_config(None, [f"routes={'true' if routes else 'false'}"], sides=list(sides))
    return svc.replay(ReplayRequest(dump=str(path), model=model, config=cfg, chunk=4, floor="none"))


def test_a_dumps_recorded_routes_are_the_recorded_sides_and_compare_with_the_replayed_sides(service, moe_model,
                                                                                           tmp_path):
    run = _replay(service, moe_model, _routes_dump(tmp_path / "r.jsonl", plant=(3, 4)))
    assert run.status in ("ok", "diverged"), run.error
    w = run.workload
    rec, b = w.sides["recorded vs ref"].stats.family("routing"), w.sides["b vs ref"].stats.family("routing")
    # every response token of every row, both layers; the one planted route is the only difference
    assert rec["cells"] == b["cells"] == ROWS * 6 * 2 and rec["tokens"] == ROWS * 6
    assert b["route_differ"] == 0.0 and rec["route_differ"] == pytest.approx(1 / (ROWS * 6 * 2))
    stored = service.store.get_run(run.id, prompts=[3]).prompts[0]
    c = stored.comparison("recorded")
    f = c.measures.get("routes").first_flip  # position 4 of the row is response token 4 - (3 - 1) = 2, layer 0
    assert (f.step, f.layer, f.overlap) == (2, 0, 1) and f.margins[1] is None  # a dump records no margins
    assert stored.results["recorded"].routes.source == "rollout dump"
    assert stored.results["recorded"].routes.rows == 6
    # rollout routing replay (R3): the trainer scores again routing with the recorded experts, its own pair
    # (the fake's trainer gap was all routing: replayed, it drops its 0.3 shift)
    r3 = _replay(service, moe_model, _routes_dump(tmp_path / "r.jsonl", greedy=True),
                 sides=("ref=fake,shift=0.3,replay_routes=ids", "b=fake"))
    assert r3.status in ("ok", "diverged"), r3.error
    r3_pair = r3.workload.replay.pair("ref+recorded routes")  # found by its key from before schema 3 too
    assert r3_pair is not None and r3_pair.name == "recorded vs ref+recorded routes"
    assert not any(f.code == "replay-on-reference" for f in r3.warnings)
    from parity_ui.store.runs import pair_samples

    natural = {s.prompt_index: s for s in pair_samples(service.db, r3.id, "recorded vs ref")}
    replayed = {s.prompt_index: s for s in pair_samples(service.db, r3.id, r3_pair.name)}
    assert sorted(replayed) == sorted(natural) == list(range(ROWS))
    for i, s in replayed.items():
        assert s.logp_side == natural[i].logp_side  # the recorded rollout's, both
        assert s.logp_ref == pytest.approx([x - 0.3 for x in natural[i].logp_ref])
    # routes=false: the routes are read and not compared, and the run says so
    off = _replay(service, moe_model, _routes_dump(tmp_path / "r.jsonl"), routes=False)
    assert any(f.code == "replay-routes-off" for f in off.warnings) and off.workload.sides["recorded vs ref"].stats.family("routing") is None


@pytest.mark.parametrize("bad, said", [("layers", "routes for 3 layers, and the model has 2 layers"),
                                       ("top_k", "routes choose 3 experts a token, and the model 2"),
                                       ("experts", "expert id 9 outside the model's 8 experts"),
                                       ("rows", "routes for 7 positions, and the row has 8")])
def test_routes_recorded_for_another_model_are_named_before_loading(service, moe_model, tmp_path, bad, said):
    from parity_ui.core.errors import ParityError

    with pytest.raises(ParityError, match="recorded routes are not this model's") as e:
        _replay(service, moe_model, _routes_dump(tmp_path / "r.jsonl", bad=bad))
    assert said in e.value.message and "--model" in e.value.fix
    assert service.store.list_runs() == []  # refused before any run (or engine) started


# -- router scores in parity layers --------------------------------------------------------------------

def test_the_layer_localisation_names_where_the_routers_part_at_the_examined_position():
    from parity_ui.commands.layer_routes import router_view
    from parity_ui.core.routes import Routes

    def r(rows, margins):
        return Routes(layers=[0, 1, 2], top_k=2, num_experts=8, ids=[e for row in rows for layer in row for e in layer],
                      weights=[0.6, 0.4] * (3 * len(rows)), margins=margins)

    same = [[[1, 2], [3, 4], [5, 6]], [[1, 2], [3, 4], [5, 6]]]
    flipped = [[[1, 2], [3, 7], [5, 6]], [[1, 2], [3, 4], [6, 5]]]
    view, said = router_view(r(same, [0.2, 4e-7, 0.1] * 2), r(flipped, [0.2, 3e-7, 0.1] * 2), [9, 8], "ref", "b")
    assert view["position"] == 9 and [x["same_set"] for x in view["layers"]] == [True, False, True]
    assert view["layers"][1]["experts"] == [[3, 4], [3, 7]] and view["differ"] == [{"position": 9, "layer": 1}]
    assert "at layer 1 (ref: [3, 4], b: [3, 7]; router margin 3e-07; a router near-tie" in said
    calm, said = router_view(r(same, [0.2, 0.05, 0.1] * 2), r(same, [0.2, 0.05, 0.1] * 2), [9, 8], "ref", "b")
    assert not calm["differ"] and "chose the same experts" in said and "0.05, at layer 1" in said
