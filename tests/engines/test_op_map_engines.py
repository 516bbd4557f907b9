"""The op map (parity_ui.commands.op_map) on real engines in float32: ten planted faults, each a checkpoint
side with ONE op's weight perturbed by ~1e-3 relative, must be named by the map as the first (layer, op)
to leave the floor, and swapping the reference's output of the planted op into the side must remove the
divergence.

Engines: the reference is vLLM-CPU on the clean tiny model (one warm worker for the nine dense faults,
one for the MoE fault's model), the faulty sides are transformers, each its own checkpoint (a tiny HF
load is seconds, a vLLM load ~25 s): the map is vLLM against HF, and vLLM's own op functions run in
every map all the same (its floor pass feeds each of its ops the noisy reference input). One fault is
also planted on a vLLM side against an HF reference (the other direction, vLLM's fused qkv split as
the side). Figures on synthetic maps and the bad inputs refused before anything loads are
tests/unit/test_op_map.py."""
from __future__ import annotations

import pytest

PROMPT = "def parse_args(self, args=None, namespace=None):"

# (checkpoint tensor, row or None, the (layer, op) the map must name)
DENSE = [
    ("model.layers.0.self_attn.q_proj.weight", None, (0, "q")),
    ("model.layers.1.self_attn.k_proj.weight", None, (1, "k")),
    ("model.layers.1.self_attn.v_proj.weight", None, (1, "v")),
    ("model.layers.0.self_attn.o_proj.weight", None, (0, "o_proj")),
    ("model.layers.1.mlp.gate_proj.weight", None, (1, "gate")),
    ("model.layers.0.mlp.up_proj.weight", None, (0, "up")),
    ("model.layers.1.mlp.down_proj.weight", None, (1, "down")),
    ("model.layers.0.input_layernorm.weight", None, (0, "in_norm")),
    ("model.layers.1.post_attention_layernorm.weight", None, (1, "post_norm")),
]
MOE = ("model.layers.1.mlp.gate.weight", 3, (1, "router"))  # one router row


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from tiny_models import build_moe_model

    return build_moe_model(tmp_path_factory.mktemp("moe") / "qwen3moe", "qwen3_moe")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_llama, tiny_moe):
    from tiny_models import copy_model, perturb_relative

    root = tmp_path_factory.mktemp("faults")
    out = []
    for i, (tensor, row, want) in enumerate([*DENSE, MOE]):
        src = tiny_moe if (tensor, row, want) == MOE else tiny_llama
        folder = perturb_relative(copy_model(src, root / f"f{i}"), tensor, scale=1e-3, row=row, seed=i + 1)
        out.append((src, folder, tensor, want))
    return out


def _run(service, model, sides, tokens=6):
    from parity_ui.core.config import build_config
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.prepare import RunRequest

    cfg = build_config(None, ["dtype=float32", f"max_new_tokens={tokens}", "ignore_eos=true"], sides=sides)
    run = service.run(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT)], config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    return run


def _map(service, run, swap=None, window=None):
    from parity_ui.core.op_map import op_map_from_dict

    c = run.prompts[0].comparisons[0]
    position = None if c.first_divergence is not None else c.compared - 1
    loc = service.localise(run, 0, position, None, ops=True, swap=swap, window=window)
    assert not loc.error, loc.error
    return loc, op_map_from_dict(loc.op_map)


def _swap_name(layer, op, layers):
    return f"{'final' if layer >= layers else layer}.{op}"


def test_ten_planted_faults_are_named_by_the_map_and_removed_by_the_swap(service, checkpoints, capsys):
    found, removed, table = 0, 0, []
    for src, folder, tensor, (layer, op) in checkpoints:
        run = _run(service, src, ["ref=vllm", f"b=hf,model={folder}"])
        loc, m = _map(service, run, swap=f"{layer}.{op}")
        first = m.first_over("add")
        named = None if first is None else m.rows[first[0]]
        hit = named == (layer, op)
        found += hit
        removed += bool(m.swap and m.swap["removes"])
        table.append(f"{tensor:48} planted {layer}.{op:9} named {named}  swap removes: {m.swap['removes']}")
        # the planted op adds error at every position; the ops it feeds add none of their own
        r = m.row_of(layer, op)
        assert m.over("add")[r].all(), (tensor, loc.summary)
        assert m.swap["before"]["cells_over_downstream"] > 0, loc.summary
        assert m.swap["sentence"] in loc.summary
    with capsys.disabled():
        print("\n" + "\n".join(table) + f"\nnamed {found}/10, swap removed {removed}/10")
    assert found >= 9, "\n".join(table)
    assert removed == 10, "\n".join(table)


def test_the_clean_pair_leaves_the_floor_nowhere_and_the_moe_rows_carry_router_margins(service, tiny_llama, tiny_moe):
    run = _run(service, tiny_llama, ["ref=vllm", "b=hf"])
    loc, m = _map(service, run)
    assert m.first_over("add") is None and m.first_over("cum") is None, loc.summary
    assert (m.stats["floor_add"][1:] > 0).mean() > 0.9  # measured, not assumed zero
    assert loc.first_divergent_layer is None and "stays within" in loc.summary
    assert loc.per_layer and {f["block"] for f in loc.per_layer} >= {"attn", "mlp", "residual", "logits"}
    moe = _run(service, tiny_moe, ["ref=vllm", "b=hf"])
    _, mm = _map(service, moe, window="4")
    assert mm.first_over("add") is None
    assert sorted(mm.routers) == [0, 1] and all(len(v["margin_a"]) == 4 for v in mm.routers.values())
    assert all(v["same"] == [1.0] * 4 for v in mm.routers.values())
    assert len(mm.positions) == 4 and mm.positions[-1] == mm.examined


def test_a_vllm_side_with_a_planted_fault_against_an_hf_reference(service, checkpoints):
    src, folder, tensor, (layer, op) = checkpoints[0]  # q_proj: vLLM's fused qkv_proj, split by the map
    run = _run(service, src, ["ref=hf", f"b=vllm,model={folder}"])
    loc, m = _map(service, run, swap=f"{layer}.{op}")
    first = m.first_over("add")
    assert first is not None and m.rows[first[0]] == (layer, op), loc.summary
    assert m.swap["removes"], m.swap["sentence"]
    assert m.swap["after"]["logits_rel_examined"] < m.swap["before"]["logits_rel_examined"] / 100


def test_three_way_against_an_fp32_side_says_which_op_is_beyond_the_dtype_rounding(service, tiny_llama, tmp_path):
    """bf16 sides and an fp32 one (transformers alone: three quick loads): a q_proj perturbed by 5% (beyond
    bf16's rounding) is named, and against fp32 its error is beyond twice the reference's own, while ops
    that only round as the reference does stay within."""
    from tiny_models import copy_model, perturb_relative

    fault = perturb_relative(copy_model(tiny_llama, tmp_path / "q5"), "model.layers.1.self_attn.q_proj.weight",
                             scale=5e-2)
    from parity_ui.core.config import build_config
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.prepare import RunRequest

    cfg = build_config(None, ["dtype=bfloat16", "max_new_tokens=4", "ignore_eos=true"],
                       sides=["ref=hf", f"b=hf,model={fault}", "f32=hf,dtype=float32"])
    run = service.run(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text=PROMPT)], config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    c = run.prompts[0].comparisons[0]
    loc = service.localise(run, 0, None if c.first_divergence is not None else c.compared - 1, ("ref", "b"),
                           ops=True)
    assert not loc.error, loc.error
    from parity_ui.core.op_map import op_map_from_dict

    m = op_map_from_dict(loc.op_map)
    assert m.three_way is not None and m.three_way["side"] == "f32"
    first = m.first_over("add")
    assert first is not None and m.rows[first[0]] == (1, "q"), loc.summary
    beyond = m.beyond_fp32("add")
    assert beyond[m.row_of(1, "q")].mean() > 0.5 and "Three-way against the fp32 side f32" in loc.summary
    assert beyond[m.row_of(0, "q")].mean() < 0.5  # layer 0's q rounds as the reference's does


def test_a_fault_in_the_final_norm_is_removed_by_swapping_it(service, tiny_llama, tmp_path):
    """The final norm feeds the logits, which the map computes from the norm's rows itself: with the norm
    swapped they must be computed from the swapped rows (they were from the side's own, so the swap
    looked as if it removed nothing)."""
    from tiny_models import copy_model, perturb_relative

    folder = perturb_relative(copy_model(tiny_llama, tmp_path / "final-norm"), "model.norm.weight", scale=1e-2, seed=5)
    run = _run(service, tiny_llama, ["ref=vllm", f"b=hf,model={folder}"])
    loc, m = _map(service, run, swap="final.norm")
    assert m.swap["before"]["logits_over"] > 0, loc.summary  # the fault reaches the logits
    assert m.swap["removes"] and m.swap["after"]["logits_over"] == 0, loc.summary
