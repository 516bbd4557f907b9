"""The bisect's oracle on its own (parity_ui.analysis.trial_oracle): a trial's pooled figures and the
reference's noise floor to a verdict, for an exact pair (identical tokens) and any other (the floor).
Pure: no engine, no store; milliseconds."""
from __future__ import annotations

import pytest

from parity_ui.analysis.trial_oracle import FLOOR, IDENTICAL, describe, exact_pair, judge
from parity_ui.core.pooled import PairSample, workload_stats
from parity_ui.core.types import SideInfo


def _sample(i, gaps, *, first=None):
    return PairSample(prompt_index=i, identical=first is None, first_divergence=first, length=len(gaps),
                      verdict=None, logp_side=[-1.0] * len(gaps), logp_ref=[-1.0 - g for g in gaps],
                      positions=list(range(len(gaps))))


def _stats(gaps_by_prompt, forks=None):
    forks = forks or {}
    return workload_stats([_sample(i, g, first=forks.get(i)) for i, g in enumerate(gaps_by_prompt)])


FLOOR_STATS = _stats([[0.01, 0.02, 0.0, 0.01] * 4] * 4)  # the reference against itself: a small gap


def _info(kind="vllm", dtype="float32"):
    return SideInfo(name="x", kind=kind, resolved={"dtype": dtype})


def test_a_side_as_close_as_the_floor_restores_parity_and_one_far_beyond_does_not():
    near = judge(_stats([[0.01, 0.015, 0.0, 0.01] * 4] * 4), FLOOR_STATS, exact=False)
    assert near.restores and near.oracle == FLOOR and near.verdict == "within noise" and not near.exceeded
    far = judge(_stats([[0.5, 0.4, 0.6, 0.5] * 4] * 4), FLOOR_STATS, exact=False)
    assert not far.restores and far.verdict == "exceeds noise" and far.exceeded
    assert far.abs_dlogp_max == pytest.approx(0.6) and far.identical == 4 and far.prompts == 4


def test_an_exact_pair_demands_identical_tokens_whatever_the_floor_says():
    forked = _stats([[0.0] * 8, [0.0] * 3, [0.0] * 8], forks={1: 3})
    v = judge(forked, FLOOR_STATS, exact=True)
    assert not v.restores and v.oracle == IDENTICAL and v.identical == 2 and v.first_divergence == 3
    same = judge(_stats([[0.0] * 8] * 3), FLOOR_STATS, exact=True)
    assert same.restores and same.oracle == IDENTICAL


def test_forking_at_the_first_token_everywhere_is_outside_any_noise():
    """No token pair to weigh, and over two prompts 0/2 and 2/2 identical overlap in their intervals:
    the oracle still calls it a divergence, and says why first."""
    v = judge(_stats([[], []], forks={0: 0, 1: 0}), FLOOR_STATS, exact=False)
    assert not v.restores and v.verdict == "exceeds noise"
    assert v.exceeded[0].startswith("forks at the first token on every prompt (the floor compared 64 tokens)")


def test_a_pair_is_exact_only_when_greedy_both_sides_resolved_float32_and_one_engine():
    assert exact_pair(True, _info(), _info())
    assert not exact_pair(True, _info("hf"), _info("vllm"))  # other kernels in float32: the floor decides
    assert not exact_pair(False, _info(), _info())  # sampling: no pair is exact
    assert not exact_pair(True, _info(), _info(dtype="bfloat16"))
    assert not exact_pair(True, _info(), None)  # the trial side never loaded
    legacy = SideInfo(name="x", kind="vllm", dtype="float32")  # no dtype row: its recorded dtype
    assert exact_pair(True, legacy, _info())


def test_the_oracle_says_in_words_which_rule_applies():
    assert "identical tokens on every prompt where the pair is exact" in describe(True)
    assert "no pair is exact" in describe(False) and "noise floor" in describe(False)
