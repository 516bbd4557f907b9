"""The op map (parity_ui.core.op_map, parity_ui.commands.op_map, parity_ui.render.op_map): its figures and
verdicts on synthetic maps, its stored form, and the bad inputs refused before anything loads (an unknown
architecture, a window too large for memory, a swap the map has no module for, a CUDA-graph side). Real
engines with ten planted faults are tests/engines/test_op_map_engines.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from parity_ui.commands.layers import LayersError
from parity_ui.commands.op_map import choose_window, model_shape, parse_swap, parse_window
from parity_ui.core.op_map import (BYTES_PER_CELL, OPS_DENSE, OpMap, OpShape, UnknownArchitecture, op_map_from_dict,
                                   parse_cell, shape_from_config)

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
         "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152}
MOE = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 32, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1024, "num_local_experts": 8,
       "num_experts_per_tok": 2, "moe_intermediate_size": 64, "mlp_only_layers": [], "decoder_sparse_step": 1}


def test_shapes_are_read_from_config_json_and_name_every_row():
    s = shape_from_config(LLAMA)
    assert (s.arch, s.q, s.kv, s.moe) == ("Llama", 576, 192, False)
    rows = s.rows()
    assert rows[0] == (-1, "embed") and rows[-2:] == [(30, "norm"), (30, "logits")]
    assert len(rows) == 1 + 30 * len(OPS_DENSE) + 2
    m = shape_from_config(MOE)
    assert m.moe and m.experts == 8 and ("1", "router") != (1, "router") and (1, "router") in m.rows()
    assert (1, "gate") not in m.rows()
    # the demo model in bf16: ~0.65 MB a position of the reference's tensors, k and v 23 KB a position
    assert 0.6e6 < s.dump_bytes(1, 0, 2) < 0.7e6 and s.dump_bytes(0, 1, 2) == 30 * 384 * 2 and BYTES_PER_CELL == 80


def test_an_unknown_architecture_is_refused_by_name_with_what_is_supported(tmp_path):
    with pytest.raises(UnknownArchitecture, match="GPT2LMHeadModel"):
        shape_from_config({"architectures": ["GPT2LMHeadModel"]})
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 8}))
    with pytest.raises(LayersError) as e:
        model_shape(str(tmp_path))
    assert "GPT2LMHeadModel" in e.value.message and "Llama" in e.value.message and "Qwen3-MoE" in e.value.message
    assert "without --ops" in e.value.fix


def test_cells_and_swaps_are_parsed_or_refused_with_what_is_accepted():
    s = shape_from_config(LLAMA)
    assert parse_cell("3.q", 30, s.ops()) == (3, "q") and parse_cell("final.norm", 30, s.ops()) == (30, "norm")
    assert parse_swap("0.down", s) == (0, "down") and parse_swap(None, s) is None
    for bad, needle in (("31.q", "not a LAYER.OP"), ("2.router", "not a LAYER.OP"), ("2.attn_resid", "no module"),
                        ("final.logits", "nothing runs after")):
        with pytest.raises(LayersError, match=needle):
            parse_swap(bad, s)


def test_windows_are_read_and_bad_ones_refused():
    assert parse_window(None, 10) == (None, "every position")
    assert parse_window("3", 10)[0] == [7, 8, 9] and parse_window("2:5", 10)[0] == [2, 3, 4]
    assert parse_window("4:", 10)[0] == list(range(4, 10))
    for bad in ("x", "0", "5:3", "2:40"):
        with pytest.raises(LayersError):
            parse_window(bad, 10)


def test_a_window_too_large_for_memory_is_refused_with_the_estimate_before_anything_runs(monkeypatch):
    import parity_ui.commands.op_map as om

    monkeypatch.setattr(om, "available_memory", lambda: 8 * 2**30)
    big = OpShape(arch="Llama", layers=80, hidden=8192, q=8192, kv=1024, intermediate=28672, vocab=128256)
    with pytest.raises(LayersError) as e:
        choose_window(list(range(4000)), 4000, big, "bfloat16", None, 1)
    assert "GiB" in e.value.message and "MiB a position" in e.value.message and "8.0 GiB free" in e.value.message
    assert "at most" in e.value.fix
    # unasked, the window is the last positions that fit, said in a note
    positions, notes = choose_window(None, 4000, big, "bfloat16", None, 1)
    assert 0 < len(positions) < 4000 and positions[-1] == 3999 and "last" in notes[0]
    # a small model fits whole; a map too large to store is refused by its cells
    s = shape_from_config(LLAMA)
    assert choose_window(None, 300, s, "bfloat16", None, 1) == (list(range(300)), [])
    monkeypatch.setattr(om, "available_memory", lambda: 2**40)
    with pytest.raises(LayersError, match="cells against the"):
        choose_window(list(range(5000)), 5000, s, "bfloat16", None, 1)


def test_a_cuda_graph_side_is_re_run_eager_and_said(monkeypatch):
    from types import SimpleNamespace

    from parity_ui.commands.op_map import _prepared_specs
    from parity_ui.core.config import build_config

    cfg = build_config(None, [], sides=["ref=hf", "b=vllm,enforce_eager=false,enable_chunked_prefill=true"])
    notes: list[str] = []
    specs = _prepared_specs(cfg, ["ref", "b"], SimpleNamespace(on_gpu=True), notes)
    assert specs[1].options.enforce_eager is True and specs[1].options.enable_chunked_prefill is False
    assert any("CUDA graphs" in n and "re-ran it eager" in n for n in notes) and any("one piece" in n for n in notes)


def _map(R=6, T=5, over=None):
    rows = [(-1, "embed"), (0, "in_norm"), (0, "q"), (0, "out"), (1, "norm"), (1, "logits")][:R]
    rng = np.random.default_rng(0)
    floor = rng.uniform(1e-8, 2e-8, (R, T)).astype(np.float32)
    add = (floor * rng.uniform(0.5, 2, (R, T))).astype(np.float32)
    for r, t in over or []:
        add[r, t] = 1e-3
    stats = {"cum_rel": add.copy(), "cum_max": add, "cum_cos": np.ones((R, T), np.float32), "add_rel": add,
             "add_max": add, "add_cos": np.ones((R, T), np.float32), "floor_cum": floor, "floor_add": floor}
    tops = {"cum_idx": np.zeros((R, T, 3), np.int32), "cum_val": np.full((R, T, 3), 1e-9, np.float32),
            "add_idx": np.zeros((R, T, 3), np.int32), "add_val": np.full((R, T, 3), np.nan, np.float32)}
    return OpMap(arch="Llama", layers=1, rows=rows, positions=list(range(10, 10 + T)), prompt_len=12, examined=14,
                 token_text=[f"t{i}" for i in range(T)], stats=stats, tops=tops)


def test_the_first_cell_over_the_floor_is_in_forward_order_and_min_rel_guards_a_tiny_floor():
    m = _map(over=[(3, 1), (2, 4)])
    assert m.first_over("add") == (2, 4)  # row before token: q before the layer output
    assert m.over("add").sum() == 2
    assert _map().first_over("add") is None  # 1e-8 errors over a 1e-8 floor stay under MIN_REL
    cell = m.cell(2, 4)
    assert cell["add_over"] and cell["label"] == "L0 q" and cell["generated"] and cell["token"] == "t4"


def test_the_summary_says_whether_the_teacher_forced_logits_part_and_where():
    from parity_ui.commands.op_map import Pair, summarise

    m, pair = _map(), Pair("a", "b", None)
    argmax = {"a": [1, 2, 3, 4, 7], "b": [1, 2, 3, 4, 11]}  # examined token 14: the last position
    _, _, text = summarise(m, pair, argmax, (7, 9), True)  # the run had 7 and 9; the capture 7 and 11
    assert "part here too, at other tokens (a picks 7, b 11; the run had 7 and 9)" in text and "batched" not in text
    same = {"a": [1, 2, 3, 4, 7], "b": [1, 2, 3, 4, 7]}
    assert "how the run was batched" in summarise(m, pair, same, (7, 9), True)[2]
    fork = {"a": [1, 2, 3, 4, 7], "b": [1, 2, 3, 4, 9]}
    assert "reproduce the divergence (a picks 7, b picks 9)" in summarise(m, pair, fork, (7, 9), True)[2]


def test_the_stored_form_round_trips_and_json_has_no_nan():
    m = _map(over=[(2, 0)])
    m.routers = {0: {"margin_a": [0.1] * 5, "margin_b": [0.1] * 5, "same": [1.0] * 5}}
    back = op_map_from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.rows == m.rows and back.positions == m.positions and back.routers == m.routers
    for k in m.stats:
        np.testing.assert_array_equal(back.stats[k], m.stats[k])
    np.testing.assert_array_equal(back.tops["add_val"], m.tops["add_val"])
    readable = json.dumps(m.readable(), allow_nan=False)  # NaN written as null
    assert '"first_over_floor"' in readable and json.loads(readable)["first_over_floor"]["label"] == "L0 q"


def test_terminal_lines_and_the_static_report_mark_the_first_cell():
    from parity_ui.core.types import Localisation
    from parity_ui.render.op_map import format_op_map, localisation_json, op_map_html, png

    m = _map(over=[(2, 3)])
    loc = Localisation(run_id="R", prompt_index=0, a="ref", b="b", position=2, token_positions=[14],
                       first_divergent_layer=0, first_divergent_block="q", noise_floor={}, per_layer=[], summary="s",
                       op_map=m.to_dict())
    text = format_op_map(loc)
    assert "L0 q (q (after RoPE)) at position 13" in text and "80 bytes a cell" in text
    page = op_map_html(loc)
    assert page.count("<svg") == 2 and 'class="om-first"' in page and 'class="om-div"' in page
    assert "data:image/png;base64," in page
    raw = png([[(255, 0, 0), (0, 0, 255)]])
    assert raw.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" in raw
    assert localisation_json(loc)["op_map"]["row_labels"][2] == "L0 q"


def test_the_app_figure_marks_the_first_cell_and_the_examined_token_and_offers_the_views():
    pytest.importorskip("plotly")
    from parity_ui.core.types import Localisation
    from parity_ui.ui.op_map_view import cell_html, op_map_figure, swap_target

    m = _map(over=[(2, 3)])
    m.routers = {0: {"margin_a": [0.1] * 5, "margin_b": [0.2] * 5, "same": [1.0] * 5}}
    m.rows[2] = (0, "router")
    loc = Localisation(run_id="R", prompt_index=0, a="ref", b="b", position=2, token_positions=[14],
                       first_divergent_layer=0, first_divergent_block="router", noise_floor={}, per_layer=[],
                       summary="s", op_map=m.to_dict(), id="L1")
    fig = op_map_figure(loc)
    names = [t.name for t in fig.data]
    assert names[:2] == ["added", "cumulative"] and "router margin" in names
    assert {s.name for s in fig.layout.shapes} == {"divergence", "first over the floor", "generated from here"}
    assert fig.layout.xaxis.ticktext[0] == "10<br>t0"  # a short window names its tokens
    assert fig.layout.meta["loc"] == "L1"
    order = list(fig.layout.yaxis.categoryarray)
    assert order.index("L0 router margin") == order.index("L0 router") + 1
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["added", "cumulative"]
    assert "OVER" in cell_html(loc, 2, 3) and swap_target(loc, 2) == "0.router" and swap_target(loc, 5) is None


def test_a_refused_op_map_is_stored_with_its_fix_and_what_was_asked(tmp_path):
    from fake_engine import fake_service

    from parity_ui.core.types import Comparison, ModelInfo, PromptResult, Run, SideInfo, SideResult

    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    pr = PromptResult(index=0, prompt_text="p", prompt_token_ids=[1, 2, 3],
                      results={n: SideResult(side=n, prompt_index=0, token_ids=ids)
                               for n, ids in (("ref", [5, 6, 7]), ("b", [5, 6, 9]))},
                      comparisons=[Comparison(a="ref", b="b", identical=False, first_divergence=2, compared=3)])
    run = Run(id="R1", created_utc="", model=ModelInfo(name="gpt2", path=str(tmp_path / "gpt2")), config={},
              status="diverged", prompts=[pr], sides=[SideInfo(name="ref", kind="hf", reference=True),
                                                      SideInfo(name="b", kind="vllm")])
    with fake_service(tmp_path / "runs.db") as svc:
        loc = svc.localise(run, 0, ops=True, window="2")
        assert loc.id and loc.error and "GPT2LMHeadModel" in loc.error and "without --ops" in loc.error
        assert loc.notes == ["asked for the op map --window 2"]
        assert [x.id for x in svc.store.localisations_of("R1")] == [loc.id]
