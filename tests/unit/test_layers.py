"""Layer localisation (parity_ui.commands.layers): the figures and the verdict on synthetic captures, and the
bad inputs refused before anything loads. Real engines on tiny models whose weights differ in one known
layer and block are tests/engines/test_layers_engines.py."""
from __future__ import annotations

from array import array

import pytest

from parity_ui.core.errors import ParityError
from parity_ui.commands.layers import BlockFigure, LayersError, figures, first_divergent, plan, positions_for, summarise
from parity_ui.core.types import Comparison, ModelInfo, PromptResult, Run, SideInfo, SideResult
from parity_ui.run.worker_client import Capture


def _cap(rows: dict[str, list[list[float]]]) -> Capture:
    data = {n: array("f", [x for r in v for x in r]).tobytes() for n, v in rows.items()}
    return Capture(positions=[5, 4], names=list(rows), data=data, dims={n: len(v[0]) for n, v in rows.items()})


BASE = {"L0.attn": [[1.0, 2.0], [1.0, 2.0]], "L0.mlp": [[3.0, 1.0], [3.0, 1.0]],
        "L0.residual": [[2.0, 2.0], [2.0, 2.0]], "L1.attn": [[1.0, 0.5], [1.0, 0.5]],
        "L1.mlp": [[0.5, 1.0], [0.5, 1.0]], "L1.residual": [[4.0, 1.0], [4.0, 1.0]],
        "final_norm": [[1.0, 0.2], [1.0, 0.2]], "logits": [[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]]}


def _with(changes: dict[str, float]) -> Capture:
    out = {n: [list(r) for r in v] for n, v in BASE.items()}
    for name, delta in changes.items():
        out[name][0][0] += delta
    return _cap(out)


def test_the_first_block_over_the_floor_is_named_in_forward_order():
    floor = _with({n: 1e-6 for n in BASE})
    b = _with({"L1.mlp": 0.2, "L1.residual": 0.2, "final_norm": 0.1, "logits": 0.3})
    figs = figures(_cap(BASE), b, floor)
    assert [(f.layer, f.block) for f in figs][:3] == [(0, "attn"), (0, "mlp"), (0, "residual")]
    first = first_divergent(figs)
    assert (first.layer, first.block) == (1, "mlp")
    assert first.rel_l2[1] == 0 and first.rel_l2[0] > 0  # only the examined position moved: a local jump
    layer, block, text = summarise(figs, {}, "ref", "b", diverged=False)
    assert (layer, block) == (1, "mlp") and "layer 1's mlp" in text and "local jump" in text


def test_within_the_floor_everywhere_names_no_layer():
    floor = _with({n: 1e-3 for n in BASE})
    b = _with({n: 1e-5 for n in BASE})
    layer, block, text = summarise(figures(_cap(BASE), b, floor), {}, "ref", "b", diverged=False)
    assert layer is None and block is None and "within the noise floor" in text


def test_a_stream_over_the_floor_with_quiet_blocks_points_at_a_norm_and_logits_alone_at_the_head():
    floor = _with({n: 1e-6 for n in BASE})
    _, block, _ = summarise(figures(_cap(BASE), _with({"L0.residual": 0.5}), floor), {}, "a", "b", False)
    assert block == "norm"
    layer, block, text = summarise(figures(_cap(BASE), _with({"logits": 0.5}), floor), {}, "a", "b", False)
    assert (layer, block) == (None, "logits") and "lm_head" in text


def test_a_zero_floor_does_not_make_rounding_a_divergence():
    zero = _cap(BASE)
    f = figures(_cap(BASE), _with({"L0.attn": 1e-7}), zero)[0]
    assert isinstance(f, BlockFigure) and f.floor[0] == 0 and not f.over_floor(0)


def test_positions_examine_the_token_before_and_some_earlier():
    assert positions_for(10, 3) == [12, 11, 10, 8, 4]
    assert positions_for(2, 0) == [1, 0]


# -- bad input, refused before any engine starts ----------------------------------------------------

def _run(kinds=("hf", "vllm"), a_ids=(5, 6, 7, 8), b_ids=(5, 6, 9, 8), div=2) -> Run:
    names = ["ref", "b"]
    pr = PromptResult(index=0, prompt_text="p", prompt_token_ids=[1, 2, 3],
                      results={n: SideResult(side=n, prompt_index=0, token_ids=list(ids))
                               for n, ids in zip(names, (a_ids, b_ids))},
                      comparisons=[Comparison(a="ref", b="b", identical=div is None, first_divergence=div,
                                              compared=len(a_ids))])
    return Run(id="R1", created_utc="", model=ModelInfo(name="m", path="/m"), config={}, status="diverged",
               prompts=[pr], sides=[SideInfo(name=n, kind=k, reference=i == 0) for i, (n, k) in
                                    enumerate(zip(names, kinds))])


def test_plan_teacher_forces_the_prompt_and_the_common_prefix():
    p = plan(_run(), 0, None, None)
    assert (p.a, p.b, p.position) == ("ref", "b", 2) and p.ids == [1, 2, 3, 5, 6] and p.tokens == (7, 9)
    assert p.diverged


def test_a_pair_without_the_reference_is_compared_by_its_own_tokens():
    """A run compares each side with its reference only: b and c part at 2 although neither is the
    reference (it said 'never diverged', and a --position past the fork was taken)."""
    run = _run()
    pr = run.prompts[0]
    pr.results["c"] = SideResult(side="c", prompt_index=0, token_ids=[5, 6, 7, 4])
    run.sides.append(SideInfo(name="c", kind="hf"))
    p = plan(run, 0, None, ("b", "c"))
    assert (p.position, p.tokens, p.diverged) == (2, (9, 7), True)
    with pytest.raises(LayersError, match="after the divergence at 2"):
        plan(run, 0, 3, ("b", "c"))


@pytest.mark.parametrize("kw,needle,fix", [
    (dict(run=_run(div=None, b_ids=(5, 6, 7, 8))), "never diverged", "--position"),
    (dict(position=3), "after the divergence at 2", "from 0 to 2"),
    (dict(run=_run(div=None, b_ids=(5, 6, 7, 8)), position=4), "past what both sides share (0..3)", "from 0 to 3"),
    (dict(prompt=4), "no prompt 4", "--prompt 0..0"),
    (dict(sides=("ref", "zz")), "no result for side 'zz'", "--sides"),
    (dict(sides=("ref", "ref")), "the same", "two different sides"),
    (dict(run=_run(kinds=("hf", "openai"))), "needs in-process access", "kinds vllm, hf"),
])
def test_bad_localisation_requests_are_refused_with_a_fix(kw, needle, fix):
    with pytest.raises(LayersError) as e:
        plan(kw.get("run", _run()), kw.get("prompt", 0), kw.get("position"), kw.get("sides"))
    assert needle in e.value.message and fix in e.value.fix
    assert isinstance(e.value, ParityError)


def test_an_architecture_without_recognisable_layers_is_named():
    import torch

    from parity_ui.engines.base import EngineFault
    from parity_ui.engines.capture import find_blocks

    with pytest.raises(EngineFault, match="cannot find the decoder layers of Sequential") as e:
        find_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2)), 2)
    assert "Llama" in e.value.fix


def test_an_exact_tie_that_the_capture_does_not_reproduce_is_called_a_tie():
    floor = _with({n: 1e-3 for n in BASE})
    figs = figures(_cap(BASE), _with({}), floor)
    tie = {"argmax_a": 3, "argmax_b": 3, "margin_a": 0.0, "margin_b": 0.0, "reproduces": False}
    _, _, text = summarise(figs, tie, "hf", "vllm", diverged=True)
    assert "tied exactly in hf's teacher-forced logits" in text and "batched" not in text
    drift = {"argmax_a": 3, "argmax_b": 3, "margin_a": 0.4, "margin_b": 0.2, "reproduces": False}
    _, _, text = summarise(figs, drift, "hf", "vllm", diverged=True)
    assert "do not reproduce the fork" in text and "eagerly at batch 1" in text
    # They part under the capture too, but at other tokens: not "both pick the same token", not batching.
    other = {"argmax_a": 3, "argmax_b": 11, "margin_a": 0.4, "margin_b": 0.3, "reproduces": False,
             "token_a": 3, "token_b": 4}
    _, _, text = summarise(figs, other, "hf", "vllm", diverged=True)
    assert "part here too, at other tokens (hf picks 3, vllm 11" in text and "batched" not in text
    fork = {"argmax_a": 3, "argmax_b": 4, "margin_a": 0.4, "margin_b": -0.2, "reproduces": True}
    _, _, text = summarise(figs, fork, "hf", "vllm", diverged=True)
    assert "reproduce the fork" in text and "near-tie that rounding alone can flip" in text
