"""Token-level comparison on hand-built streams: where they diverge, why, and what is measured before."""
from __future__ import annotations

import math

import pytest

from parity_ui.compare import compare_streams, rank_of, top_margin
from parity_ui.types import EngineResult, TokenStep, TopLogprob


def step(pos: int, token_id: int, logprob: float | None = -0.5,
         top: list[tuple[int, float]] | None = None) -> TokenStep:
    top = top if top is not None else [(token_id, logprob if logprob is not None else -0.5)]
    return TokenStep(position=pos, token_id=token_id, text=f"t{token_id}", logprob=logprob, rank=1,
                     top=[TopLogprob(token_id=t, logprob=lp, text=f"t{t}") for t, lp in top])


def result(engine: str, steps: list[TokenStep]) -> EngineResult:
    return EngineResult(engine=engine, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps)


def stream(engine: str, ids: list[int], logprobs: list[float | None] | None = None) -> EngineResult:
    logprobs = logprobs or [-0.5] * len(ids)
    return result(engine, [step(i, t, lp) for i, (t, lp) in enumerate(zip(ids, logprobs))])


def test_identical_streams():
    c = compare_streams(stream("vllm", [5, 6, 7], [-0.1, -0.2, -0.3]),
                        stream("hf", [5, 6, 7], [-0.1, -0.25, -0.5]))
    assert c.identical is True
    assert c.first_divergence is None and c.divergence is None
    assert (c.compared, c.length_vllm, c.length_hf) == (3, 3, 3)
    assert c.logprob_gaps == pytest.approx([0.0, 0.05, 0.2])  # vllm - hf
    assert c.max_abs_gap == pytest.approx(0.2)
    assert c.mean_abs_gap == pytest.approx(0.25 / 3)
    assert c.topk_overlap == [1.0, 1.0, 1.0]


def test_empty_streams_are_identical():
    c = compare_streams(stream("vllm", []), stream("hf", []))
    assert c.identical is True and c.compared == 0
    assert c.logprob_gaps == [] and c.max_abs_gap is None and c.mean_abs_gap is None


def test_divergence_at_index_measures_only_before_it():
    c = compare_streams(stream("vllm", [5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4]),
                        stream("hf", [5, 6, 9, 8], [-0.2, -0.2, -0.9, -0.4]))
    assert c.identical is False
    assert c.first_divergence == 2
    assert c.compared == 4
    # Gaps and overlaps stop at the divergence: after it the contexts differ.
    assert c.logprob_gaps == pytest.approx([0.1, 0.0])
    assert len(c.topk_overlap) == 2
    assert c.max_abs_gap == pytest.approx(0.1)
    d = c.divergence
    assert (d.index, d.vllm_token_id, d.hf_token_id) == (2, 7, 9)
    assert (d.vllm_token_text, d.hf_token_text) == ("t7", "t9")
    assert d.reason == "token"


def test_divergence_at_first_token_has_no_gaps():
    c = compare_streams(stream("vllm", [1, 2]), stream("hf", [3, 2]))
    assert c.first_divergence == 0
    assert c.logprob_gaps == [] and c.topk_overlap == [] and c.max_abs_gap is None


@pytest.mark.parametrize("longer", ["vllm", "hf"])
def test_length_divergence(longer):
    long, short = stream(longer, [5, 6, 7]), stream("hf" if longer == "vllm" else "vllm", [5, 6])
    v, h = (long, short) if longer == "vllm" else (short, long)
    c = compare_streams(v, h)
    assert c.identical is False
    assert c.first_divergence == 2 and c.compared == 2
    assert len(c.logprob_gaps) == 2
    d = c.divergence
    assert d.reason == "length" and d.index == 2
    if longer == "vllm":
        assert (d.vllm_token_id, d.hf_token_id, d.vllm_token_text, d.hf_token_text) == (7, None, "t7", "")
    else:
        assert (d.vllm_token_id, d.hf_token_id, d.vllm_token_text, d.hf_token_text) == (None, 7, "", "t7")
    assert d.accepted_by_vllm_rule is None


def _diverge(vllm_top, hf_top):
    v = result("vllm", [step(0, 1), step(1, 3, -0.6, vllm_top)])
    h = result("hf", [step(0, 1), step(1, 4, -0.7, hf_top)])
    return compare_streams(v, h).divergence


def test_vllm_rule_accepts_when_each_token_is_in_the_others_topk():
    d = _diverge([(3, -0.6), (4, -0.8)], [(4, -0.7), (3, -0.71)])
    assert d.vllm_token_in_hf_topk is True and d.hf_token_in_vllm_topk is True
    assert d.accepted_by_vllm_rule is True


def test_vllm_rule_rejects_when_one_token_is_missing():
    d = _diverge([(3, -0.6), (4, -0.8)], [(4, -0.7), (8, -0.9)])
    assert d.vllm_token_in_hf_topk is False and d.hf_token_in_vllm_topk is True
    assert d.accepted_by_vllm_rule is False


def test_vllm_rule_unknown_without_topk():
    d = _diverge([], [(4, -0.7), (3, -0.71)])
    assert d.hf_token_in_vllm_topk is None and d.vllm_token_in_hf_topk is True
    assert d.accepted_by_vllm_rule is None


def test_topk_overlap_fraction():
    v = result("vllm", [step(0, 1, -0.1, [(1, -0.1), (2, -2), (3, -3), (4, -4)]),
                        step(1, 2, -0.1, [(2, -0.1), (5, -2)])])
    h = result("hf", [step(0, 1, -0.1, [(1, -0.1), (2, -2), (7, -3), (8, -4)]),
                      step(1, 2, -0.1, [(2, -0.1), (5, -2), (6, -3), (9, -4)])])
    c = compare_streams(v, h)
    assert c.topk_overlap == [0.5, 0.5]  # 2 of 4; then 2 shared over k = the larger top-k (4)


def test_topk_overlap_none_when_a_side_has_no_topk():
    c = compare_streams(result("vllm", [step(0, 1, -0.1, [])]), stream("hf", [1]))
    assert c.topk_overlap == [None]


def test_logprob_none_is_skipped_not_zero():
    c = compare_streams(stream("vllm", [1, 2, 3], [None, -0.1, -0.2]),
                        stream("hf", [1, 2, 3], [-0.3, None, -0.5]))
    assert c.logprob_gaps[:2] == [None, None]
    assert c.logprob_gaps[2] == pytest.approx(0.3)
    assert c.max_abs_gap == pytest.approx(0.3) and c.mean_abs_gap == pytest.approx(0.3)


def test_all_logprobs_none_gives_no_gap_stats():
    c = compare_streams(stream("vllm", [1, 2], [None, None]), stream("hf", [1, 2], [None, None]))
    assert c.logprob_gaps == [None, None] and c.max_abs_gap is None and c.mean_abs_gap is None


def test_infinite_gap_is_kept_but_left_out_of_stats():
    c = compare_streams(stream("vllm", [1, 2], [-math.inf, -0.1]), stream("hf", [1, 2], [-0.2, -0.3]))
    assert c.logprob_gaps[0] == -math.inf
    assert c.max_abs_gap == pytest.approx(0.2)


def test_top_margin():
    assert top_margin(step(0, 1, -0.1, [(1, -0.1), (2, -1.6), (3, -5.0)])) == pytest.approx(1.5)
    assert top_margin(step(0, 1, -0.1, [(1, -0.1)])) is None
    assert top_margin(step(0, 1, -0.1, [])) is None


def test_rank_of():
    s = step(0, 1, -0.1, [(1, -0.1), (7, -1.0), (3, -2.0)])
    assert [rank_of(t, s) for t in (1, 7, 3)] == [1, 2, 3]
    assert rank_of(99, s) is None
    assert rank_of(1, step(0, 1, -0.1, [])) is None
