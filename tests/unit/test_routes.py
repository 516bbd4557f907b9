"""MoE routes above the engines: packing, comparison, the router near-tie verdict, the pooled routing
figures, the grid and the CLI lines, the store round trip and the MoE preflight (hand-built routes;
the real engines' routes are tests/engines/test_routes_engines.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from parity_ui.analysis.compare import compare
from parity_ui.analysis.explain import explain
from parity_ui.analysis.routes import compare_routes, comparable_steps, flip_summary, overlaps, route_figures
from parity_ui.core.config import build_config
from parity_ui.core.figures import FAMILIES, FIGURES
from parity_ui.core.routes import RouteReplay, Routes, pack, routes_from_json, unpack
from parity_ui.core.types import SideResult, TokenStep, TopLogprob, comparison_from_dict, side_result_from_dict, to_dict

LAYERS, K = [0, 1, 2], 2


def routes(rows: list[list[list[int]]], margins: float = 0.1, experts: int = 8) -> Routes:
    """Routes from [row][layer] -> expert ids; weights 0.6/0.4, every margin `margins`."""
    ids = [e for row in rows for layer in row for e in layer]
    return Routes(layers=LAYERS, top_k=K, num_experts=experts, ids=ids, weights=[0.6, 0.4] * (len(ids) // 2),
                  margins=[margins] * (len(rows) * len(LAYERS)), source="hooks")


SAME = [[[1, 2], [3, 4], [5, 6]]] * 4


def test_pack_round_trips_compactly_and_says_its_bytes_per_token():
    r = routes(SAME, margins=4.8e-7)
    back = unpack(pack(r))
    assert back.ids == r.ids and back.layers == LAYERS and back.rows == 4
    assert back.weights == pytest.approx(r.weights, abs=1e-3)  # float16
    assert back.margins[0] == pytest.approx(4.8e-7, rel=0.1)  # a near-tie stays visible in float16
    # uint8 ids + float16 weights + float16 margins: L*k + 2*L*k + 2*L bytes a token
    assert r.bytes_per_token() == 3 * 2 + 2 * 3 * 2 + 2 * 3 == 24
    assert len(pack(r)) == 16 + 2 * 3 + 4 * 24
    big = Routes(layers=list(range(48)), top_k=8, num_experts=128, ids=[0] * 384, weights=[0.0] * 384,
                 margins=[0.0] * 48)
    assert big.bytes_per_token() == 1248  # Qwen3-30B-A3B's shape
    wide = Routes(layers=[0], top_k=1, num_experts=300, ids=[299])
    assert unpack(pack(wide)).ids == [299] and unpack(pack(wide)).weights is None  # int16 ids, no weights
    with pytest.raises(ValueError, match="not a parity-ui routes blob"):
        unpack(b"junk")
    # through JSON (how a side result is stored): one base64 string, no list of floats per token
    text = json.dumps(to_dict(r))
    assert "0.6" not in text and routes_from_json(json.loads(text)).ids == r.ids


def test_compare_routes_grid_rates_and_first_flip():
    b_rows = [SAME[0], [[1, 2], [4, 3], [5, 6]], [[1, 2], [3, 7], [5, 6]], [[1, 2], [7, 0], [5, 6]]]
    a, b = routes(SAME, margins=2e-7), routes(b_rows)
    r = compare_routes(a, b, steps=3)  # the tokens forked at step 2: step 3 is not compared
    assert r.compared == 3 and r.grid == ["===", "=~=", "=1=", "..."]
    assert r.same_set_by_layer == pytest.approx([1, 2 / 3, 1])
    assert r.same_order_by_layer == pytest.approx([1, 1 / 3, 1])
    assert r.same_set == pytest.approx(8 / 9) and r.same_order == pytest.approx(7 / 9)
    assert r.mean_overlap == pytest.approx(17 / 18) and r.steps_any_differ == pytest.approx(1 / 3)
    f = r.first_flip
    assert (f.step, f.layer, f.experts, f.overlap) == (2, 1, [[3, 4], [3, 7]], 1)
    assert f.margins == [2e-7, 0.1]
    assert sorted(overlaps(r)) == [1] + [2] * 8
    assert "experts differ at layer 1, token 2: router margin 2e-07 (at the token fork" in flip_summary(r, 2)
    assert flip_summary(r, 1) is None  # a flip after the fork explains nothing
    assert comparable_steps(None, 5, 4) == 4 and comparable_steps(2, 5, 4) == 3
    # other layers or another k: not compared, and said so
    other = Routes(layers=[0, 1], top_k=2, num_experts=8, ids=[1, 2, 3, 4])
    assert compare_routes(a, other, 3).compared == 0
    assert "not compared: the sides recorded 3 vs 2 MoE layers" in compare_routes(a, other, 3).note
    assert compare_routes(a, None, 3) is None
    figs = route_figures([r, compare_routes(a, a, 4), None])
    assert figs["route_same_set"] == pytest.approx((8 + 12) / 21)
    assert figs["route_differ"] == pytest.approx(1 / 21)
    assert figs["route_tokens_any_differ"] == pytest.approx(1 / 7)
    assert set(figs) == {*FAMILIES["routing"], "cells", "tokens"} and set(FAMILIES["routing"]) <= set(FIGURES)
    assert (figs["cells"], figs["tokens"]) == (21, 7)
    assert route_figures([])["route_same_set"] is None  # "not recorded", never 0


def _step(pos: int, tid: int, top: list[tuple[int, float]]) -> TokenStep:
    return TokenStep(position=pos, token_id=tid, text=f"<{tid}>", logprob=dict(top)[tid], rank=1,
                     top=[TopLogprob(t, v, f"<{t}>") for t, v in top])


def _fork_at_2(margin_nats: float) -> tuple[SideResult, SideResult]:
    a = [_step(0, 10, [(10, -0.1), (99, -3)]), _step(1, 11, [(11, -0.1), (99, -3)]),
         _step(2, 12, [(12, -0.1), (13, -0.1 - margin_nats)])]
    b = [*a[:2], _step(2, 13, [(13, -0.1), (12, -0.1 - margin_nats)])]
    return (SideResult("ref", 0, [s.token_id for s in a], a), SideResult("b", 0, [s.token_id for s in b], b))


def test_a_flip_at_a_router_near_tie_gets_its_own_verdict():
    a, b = _fork_at_2(3.0)  # a real disagreement by the logprobs alone
    c = compare(a, b)
    b_rows = [SAME[0], SAME[0], [[1, 2], [3, 7], [5, 6]], SAME[0]]
    c.measures["routes"] = compare_routes(routes(SAME, margins=5e-7), routes(b_rows, margins=4e-7), 3)
    e = explain(c, a, b, build_config())
    assert e.verdict == "router near-tie"
    assert (e.route_layer, e.route_step, e.route_margin) == (1, 2, 4e-7)
    assert "experts differ at layer 1, token 2: router margin 4e-07" in e.summary
    # a wide router margin: the logprob verdict stays, and the flip is named beside it
    c.measures["routes"] = compare_routes(routes(SAME, margins=0.2), routes(b_rows, margins=0.3), 3)
    e = explain(c, a, b, build_config())
    assert e.verdict == "real disagreement" and "experts differ at layer 1, token 2: router margin 0.2" in e.summary
    # stored and read back with the comparison
    back = comparison_from_dict(json.loads(json.dumps(to_dict(c))))
    assert back.measures.get("routes") == c.measures.get("routes") and back.measures.get("routes").first_flip.layer == 1


def test_grid_html_and_cli_lines_mark_the_fork_and_the_flip():
    from parity_ui.render.sections.routing import grid_html, route_lines

    a, b = _fork_at_2(3.0)
    c = compare(a, b)
    b_rows = [SAME[0], SAME[0], [[1, 2], [3, 7], [5, 6]], SAME[0]]
    c.measures["routes"] = compare_routes(routes(SAME, margins=5e-7), routes(b_rows, margins=4e-7), 3)
    c.measures["route_replay"] = RouteReplay(mode="ids", source="ref", before_first_divergence=2, after_first_divergence=None,
                                 before_identical=False, after_identical=True, before_max_abs_gap=0.0,
                                 after_max_abs_gap=1e-6, compared=3)
    html = grid_html(c)
    assert html.count("<tr>") == 1 + len(LAYERS) and 'data-testid="route-grid"' in html
    assert 'class="rt-diff rt-fork rt-flip" title="layer 1, token 2: 1 of 2 experts shared"' in html
    assert "routes identical 89%" in html and "first difference at token 2, layer 1" in html
    assert "after identical" in html
    lines = "\n".join(route_lines(c))
    assert "same set by layer: L0 100%  L1 67%  L2 100%" in lines
    assert "route replay with ref's experts (ids): before fork at token 2" in lines
    assert "route_" not in lines and "route_" not in html  # display names only


def test_side_result_routes_survive_the_store():
    from parity_ui.store.runs import _insert_side_result, open_db

    db = open_db(":memory:")
    res = SideResult("hf", 0, [1, 2, 3, 4], [], routes=routes(SAME))
    _insert_side_result(db, "R", 0, res)
    row = next(db.query("SELECT result_json FROM side_results"))
    back = side_result_from_dict(json.loads(row["result_json"]))
    assert back.routes.ids == res.routes.ids and back.routes.layers == LAYERS and back.routes.source == "hooks"


def test_moe_preflight_names_shape_mismatch_and_sides_without_routes(tmp_path):
    from parity_ui.core.kinds import KINDS
    from parity_ui.measures.base import Plan
    from parity_ui.measures.routes import Routing
    from parity_ui.run.preflight_moe import check_moe, moe_shape

    def folder(name: str, **cfg) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        return str(tmp_path / name)

    a = folder("a", num_experts=8, num_experts_per_tok=2)
    b = folder("b", n_routed_experts=16, num_experts_per_tok=2)
    dense = folder("dense", hidden_size=8)
    assert moe_shape(a) == (8, 2) and moe_shape(b) == (16, 2) and moe_shape(dense) is None

    def side(name, kind, path, replay="off"):
        return SimpleNamespace(name=name, kind=KINDS[kind], model=SimpleNamespace(path=path),
                               spec=SimpleNamespace(kind=kind, options=SimpleNamespace(replay_routes=replay)))

    def found(prep, mode="compare"):  # the model check (run preflight) and the routing measure's
        return check_moe(prep) + Routing().preflight(Plan(prep, mode, SimpleNamespace(warnings=[])))

    prep = SimpleNamespace(config=SimpleNamespace(routes=True),
                           sides=[side("ref", "vllm", a), side("b", "hf", b, "ids"), side("s", "openai", a)])
    codes = {(f.code, f.side) for f in found(prep)}
    assert codes == {("moe-shape-mismatch", "b"), ("routes-unsupported", "s")}
    msg = next(f.message for f in found(prep) if f.code == "moe-shape-mismatch")
    assert "ref picks 2 of 8 experts, b 2 of 16" in msg
    prep.config.routes = False
    assert {f.code for f in found(prep)} == {"moe-shape-mismatch", "replay-without-routes"}
    prep = SimpleNamespace(config=SimpleNamespace(routes=True), sides=[side("ref", "hf", dense)])
    assert [f.code for f in found(prep)] == ["routes-no-moe"]
    prep = SimpleNamespace(config=SimpleNamespace(routes=True), sides=[side("ref", "hf", a, "ids"), side("b", "hf", a)])
    assert [f.code for f in found(prep)] == ["replay-on-reference"]
    assert found(prep, "replay") == []  # a replay's trainer replays the dump's routes (R3)


def test_routing_figures_are_judged_against_the_floor_and_named_by_the_gate():
    from parity_ui.commands.gate.metrics import METRICS
    from parity_ui.core.pooled import routing_against_floor

    side = {"route_differ": 0.10, "cells": 2000}
    assert "above the floor" in routing_against_floor(side, {"route_differ": 0.0, "cells": 2000})
    assert "within the floor" in routing_against_floor(side, {"route_differ": 0.1, "cells": 2000})
    assert routing_against_floor(side, None) is None and routing_against_floor(None, side) is None
    same, differ = METRICS["route_same_set"], METRICS["route_differ"]
    assert same.higher_is_better and not differ.higher_is_better and same.display == "routes identical"
    stats = SimpleNamespace(family={"routing": {"route_same_set": 0.9}}.get)
    assert same.get(stats) == 0.9 and differ.get(stats) is None  # not recorded: the check cannot pass
    assert same.get(SimpleNamespace(family={}.get)) is None


def test_vllm_answers_routes_of_its_own_generated_tokens_from_its_built_in_capture():
    """Issue 44: with vLLM's built-in capture (a GPU, not eager), the expert ids a generate kept for a
    sequence (prompt + its tokens) answer a routes request on exactly those tokens, aligned by input
    position; anything else (other ids, an array of the wrong length) is not kept or not answered."""
    from types import SimpleNamespace

    import numpy as np

    from parity_ui.core.requests import RoutesRequest
    from parity_ui.engines.vllm_engine import VllmEngine

    eng = VllmEngine()
    eng.llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=SimpleNamespace(get_num_experts=lambda: 8)))
    prompt, tokens = [5, 6, 7], [8, 9]
    routed = np.arange(4 * 2 * 2).reshape(4, 2, 2) % 8  # prompt + tokens - 1 positions, 2 layers, top-2
    eng._keep_routed(prompt, tokens, routed)
    eng._keep_routed([1], [2, 3], routed)  # 4 rows for 2 positions fed: not a capture of this sequence
    assert list(eng._routed) == [(5, 6, 7, 8, 9)]
    got = eng.routes(RoutesRequest(ids=prompt + tokens, positions=[2, 3]))  # the positions predicting the tokens
    assert got.source == "vllm built-in (as generated)" and got.num_experts == 8 and got.top_k == 2
    assert got.ids == routed[[2, 3]].reshape(-1).tolist()


def test_vllms_built_in_capture_keeps_the_moe_layers_only():
    """vLLM's routed-experts buffer has a row for every decoder layer (indexed by layer_id), the dense
    ones left zero: as DeepSeek's first_k_dense_replace layers. Those rows compared as 'the same experts'
    and counted in every share; the hooks and a dump's routes hold the MoE layers only."""
    import numpy as np

    from parity_ui.engines.routes import routes_generated

    cfg = SimpleNamespace(first_k_dense_replace=1, mlp_only_layers=None, decoder_sparse_step=1)
    engine = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=cfg, get_num_experts=lambda: 8))
    routed = np.zeros((4, 3, 2), dtype=np.int32)  # 4 positions, 3 decoder layers, top-2
    routed[:, 1:, :] = [[1, 2], [3, 4]]
    r = routes_generated(engine, routed, [1, 2, 3])
    assert r.layers == [1, 2] and r.top_k == 2 and len(r.ids) == 3 * 2 * 2 and 0 not in r.ids
    # every layer routed (no dense ones): all kept
    all_moe = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=SimpleNamespace(), get_num_experts=lambda: 8))
    assert routes_generated(all_moe, routed, [0]).layers == [0, 1, 2]
