"""Token-level comparison on hand-built streams: where two sides diverge, why, what is measured before,
and how a run with several sides is compared with its reference."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from parity_ui.analysis.compare import compare, first_mismatch, rank_of, top_margin
from parity_ui.core.config import build_config
from parity_ui.core.kinds import KINDS
from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob


def step(pos: int, token_id: int, logprob: float | None = -0.5,
         top: list[tuple[int, float]] | None = None) -> TokenStep:
    top = top if top is not None else [(token_id, logprob if logprob is not None else -0.5)]
    return TokenStep(position=pos, token_id=token_id, text=f"t{token_id}", logprob=logprob, rank=1,
                     top=[TopLogprob(token_id=t, logprob=lp, text=f"t{t}") for t, lp in top])


def result(side: str, steps: list[TokenStep]) -> SideResult:
    return SideResult(side=side, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps)


def stream(side: str, ids: list[int], logprobs: list[float | None] | None = None) -> SideResult:
    logprobs = logprobs or [-0.5] * len(ids)
    return result(side, [step(i, t, lp) for i, (t, lp) in enumerate(zip(ids, logprobs))])


def test_identical_streams():
    c = compare(stream("ref", [5, 6, 7], [-0.1, -0.25, -0.5]),
                stream("cand", [5, 6, 7], [-0.1, -0.2, -0.3]))
    assert (c.a, c.b) == ("ref", "cand")
    assert c.identical is True
    assert c.first_divergence is None and c.divergence is None
    assert c.compared == 3 and c.lengths == [3, 3]
    assert c.logprob_gaps == pytest.approx([0.0, 0.05, 0.2])  # b - a
    assert c.max_abs_gap == pytest.approx(0.2)
    assert c.mean_abs_gap == pytest.approx(0.25 / 3)
    assert c.topk_overlap == [1.0, 1.0, 1.0]


def test_gap_sign_is_b_minus_a():
    c = compare(stream("ref", [1, 2], [-1.0, -0.2]), stream("cand", [1, 2], [-0.4, -0.5]))
    assert c.logprob_gaps == pytest.approx([0.6, -0.3])
    assert c.max_abs_gap == pytest.approx(0.6) and c.mean_abs_gap == pytest.approx(0.45)


def test_a_masked_logprob_has_no_gap_and_does_not_become_the_noise():
    """-inf is stored as -1e30 (JSON carries no inf): it is masked, not a 1e30-nat gap, which would
    have made every later fork a 'near-tie' within the noise before it."""
    c = compare(stream("ref", [5, 6, 7], [-1e30, -0.2, -0.3]), stream("cand", [5, 6, 7], [-0.1, -0.25, -0.3]))
    assert c.logprob_gaps[1:] == pytest.approx([-0.05, 0.0])  # the series keeps the masked position's
    assert c.max_abs_gap == pytest.approx(0.05) and c.mean_abs_gap == pytest.approx(0.025)


def test_empty_streams_are_identical():
    c = compare(stream("ref", []), stream("cand", []))
    assert c.identical is True and c.compared == 0 and c.lengths == [0, 0]
    assert c.logprob_gaps == [] and c.max_abs_gap is None and c.mean_abs_gap is None


def test_divergence_at_index_measures_only_before_it():
    c = compare(stream("ref", [5, 6, 9, 8], [-0.2, -0.2, -0.9, -0.4]),
                stream("cand", [5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4]))
    assert c.identical is False
    assert c.first_divergence == 2
    assert c.compared == 4 and c.lengths == [4, 4]
    # Gaps and overlaps stop at the divergence: after it the contexts differ.
    assert c.logprob_gaps == pytest.approx([0.1, 0.0])
    assert len(c.topk_overlap) == 2
    assert c.max_abs_gap == pytest.approx(0.1)
    d = c.divergence
    assert d.index == 2 and d.token_ids == [9, 7] and d.texts == ["t9", "t7"]
    assert d.reason == "token"


def test_divergence_at_first_token_has_no_gaps():
    c = compare(stream("ref", [1, 2]), stream("cand", [3, 2]))
    assert c.first_divergence == 0 and c.divergence.token_ids == [1, 3]
    assert c.logprob_gaps == [] and c.topk_overlap == [] and c.max_abs_gap is None


@pytest.mark.parametrize("longer", ["a", "b"])
def test_length_divergence(longer):
    long_ids, short_ids = [5, 6, 7], [5, 6]
    a = stream("ref", long_ids if longer == "a" else short_ids)
    b = stream("cand", long_ids if longer == "b" else short_ids)
    c = compare(a, b)
    assert c.identical is False
    assert c.first_divergence == 2 and c.compared == 2
    assert c.lengths == ([3, 2] if longer == "a" else [2, 3])
    assert len(c.logprob_gaps) == 2
    d = c.divergence
    assert d.reason == "length" and d.index == 2
    if longer == "a":
        assert (d.token_ids, d.texts) == ([7, None], ["t7", ""])
    else:
        assert (d.token_ids, d.texts) == ([None, 7], ["", "t7"])
    assert d.accepted is None and d.in_other_topk == [None, None]


def _diverge(a_top, b_top):
    a = result("ref", [step(0, 1), step(1, 3, -0.6, a_top)])
    b = result("cand", [step(0, 1), step(1, 4, -0.7, b_top)])
    return compare(a, b).divergence


def test_vllm_rule_accepts_when_each_token_is_in_the_others_topk():
    d = _diverge([(3, -0.6), (4, -0.8)], [(4, -0.7), (3, -0.71)])
    assert d.token_ids == [3, 4]
    assert d.in_other_topk == [True, True]  # [a's token in b's top-k, b's token in a's]
    assert d.accepted is True


def test_vllm_rule_rejects_when_one_token_is_missing():
    d = _diverge([(3, -0.6), (4, -0.8)], [(4, -0.7), (8, -0.9)])
    assert d.in_other_topk == [False, True]  # a's 3 is not in b's top-k; b's 4 is in a's
    assert d.accepted is False


def test_vllm_rule_unknown_without_topk():
    d = _diverge([], [(4, -0.7), (3, -0.71)])
    assert d.in_other_topk == [True, None]  # a recorded no top-k: b's token cannot be looked up
    assert d.accepted is None


def test_topk_overlap_fraction():
    a = result("ref", [step(0, 1, -0.1, [(1, -0.1), (2, -2), (3, -3), (4, -4)]),
                       step(1, 2, -0.1, [(2, -0.1), (5, -2)])])
    b = result("cand", [step(0, 1, -0.1, [(1, -0.1), (2, -2), (7, -3), (8, -4)]),
                        step(1, 2, -0.1, [(2, -0.1), (5, -2), (6, -3), (9, -4)])])
    c = compare(a, b)
    assert c.topk_overlap == [0.5, 0.5]  # 2 of 4; then 2 shared over k = the larger top-k (4)


def test_topk_overlap_none_when_a_side_has_no_topk():
    c = compare(result("ref", [step(0, 1, -0.1, [])]), stream("cand", [1]))
    assert c.topk_overlap == [None]


def test_logprob_none_is_skipped_not_zero():
    c = compare(stream("ref", [1, 2, 3], [-0.3, None, -0.5]),
                stream("cand", [1, 2, 3], [None, -0.1, -0.2]))
    assert c.logprob_gaps[:2] == [None, None]
    assert c.logprob_gaps[2] == pytest.approx(0.3)
    assert c.max_abs_gap == pytest.approx(0.3) and c.mean_abs_gap == pytest.approx(0.3)


def test_all_logprobs_none_gives_no_gap_stats():
    c = compare(stream("ref", [1, 2], [None, None]), stream("cand", [1, 2], [None, None]))
    assert c.logprob_gaps == [None, None] and c.max_abs_gap is None and c.mean_abs_gap is None


def test_infinite_gap_is_kept_but_left_out_of_stats():
    c = compare(stream("ref", [1, 2], [-0.2, -0.3]), stream("cand", [1, 2], [-math.inf, -0.1]))
    assert c.logprob_gaps[0] == -math.inf
    assert c.max_abs_gap == pytest.approx(0.2) and c.mean_abs_gap == pytest.approx(0.2)


@pytest.mark.parametrize("a, b, want", [
    ([1, 2, 3], [1, 2, 3], None),
    ([], [], None),
    ([1, 5, 3], [1, 6, 3], 1),
    ([1, 2], [1, 2, 3], 2),  # a shorter stream differs where it ended
    ([1, 2, 3], [1, 2], 2),
    ([], [4], 0),
    ([1, 5], [1, 6, 7], 1),  # a token mismatch before the end wins
])
def test_first_mismatch(a, b, want):
    assert first_mismatch(a, b) == want
    assert first_mismatch(b, a) == want


def test_top_margin():
    assert top_margin(step(0, 1, -0.1, [(1, -0.1), (2, -1.6), (3, -5.0)])) == pytest.approx(1.5)
    assert top_margin(step(0, 1, -0.1, [(1, -0.1)])) is None
    assert top_margin(step(0, 1, -0.1, [])) is None


def test_rank_of():
    s = step(0, 1, -0.1, [(1, -0.1), (7, -1.0), (3, -2.0)])
    assert [rank_of(t, s) for t in (1, 7, 3)] == [1, 2, 3]
    assert rank_of(99, s) is None
    assert rank_of(1, step(0, 1, -0.1, [])) is None


# -- symmetry: compare(b, a) is compare(a, b) with the sides swapped --------------------------------

def _pairs() -> dict[str, tuple[SideResult, SideResult]]:
    topk_fork = (result("ref", [step(0, 1, -0.1, [(1, -0.1), (2, -2.0), (3, -3.0)]),
                                step(1, 3, -0.6, [(3, -0.6), (4, -0.8)])]),
                 result("cand", [step(0, 1, -0.3, [(1, -0.3), (2, -1.0)]),
                                 step(1, 4, -0.7, [(4, -0.7), (8, -0.9)])]))
    return {
        "identical": (stream("ref", [5, 6, 7], [-0.1, -0.25, -0.5]), stream("cand", [5, 6, 7], [-0.1, -0.2, -0.3])),
        "token": topk_fork,
        "length": (stream("ref", [5, 6, 7], [-0.1, -0.2, -0.3]), stream("cand", [5, 6], [-0.4, -0.2])),
        "no topk": (result("ref", [step(0, 1, -0.2), step(1, 3, -0.6, [])]),
                    result("cand", [step(0, 1, -0.1), step(1, 4, -0.7, [(4, -0.7), (3, -0.71)])])),
    }


@pytest.mark.parametrize("case", ["identical", "token", "length", "no topk"])
def test_compare_is_symmetric_and_names_both_sides(case):
    a, b = _pairs()[case]
    ab, ba = compare(a, b), compare(b, a)
    assert (ab.a, ab.b) == ("ref", "cand") and (ba.a, ba.b) == ("cand", "ref")
    assert ab.identical == ba.identical and ab.first_divergence == ba.first_divergence
    assert ab.compared == ba.compared and ab.lengths == ba.lengths[::-1]
    assert ab.logprob_gaps == pytest.approx([-g for g in ba.logprob_gaps])
    assert any(g != 0 for g in ab.logprob_gaps)  # so the negation is observable
    assert ab.topk_overlap == ba.topk_overlap
    assert ab.max_abs_gap == pytest.approx(ba.max_abs_gap) and ab.mean_abs_gap == pytest.approx(ba.mean_abs_gap)
    if case == "identical":
        assert ab.divergence is None and ba.divergence is None
        return
    d, e = ab.divergence, ba.divergence
    assert d.index == e.index and d.reason == e.reason and d.accepted == e.accepted
    assert d.token_ids == e.token_ids[::-1] and d.texts == e.texts[::-1]
    assert d.in_other_topk == e.in_other_topk[::-1]
    if case == "token":
        assert d.in_other_topk == [False, True]  # asymmetric, so a swap that forgot to reverse fails


# -- several sides: every other side against the reference ----------------------------------------

def _three_sides() -> dict[str, SideResult]:
    return {"ref": stream("ref", [5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4]),
            "same": stream("same", [5, 6, 7, 8], [-0.1, -0.25, -0.3, -0.4]),
            "fork": stream("fork", [5, 9, 7], [-0.15, -0.2, -0.3])}


def test_three_sides_give_two_comparisons_against_the_reference():
    res = _three_sides()
    pr = PromptResult(index=0, prompt_text="p", prompt_token_ids=[1], results=res,
                      comparisons=[compare(res["ref"], res[b]) for b in ("same", "fork")])
    same, fork = pr.comparison("same"), pr.comparison("fork")
    assert (same.a, same.b) == ("ref", "same") and (fork.a, fork.b) == ("ref", "fork")
    assert pr.comparison("ref") is None and pr.comparison("nope") is None
    assert same.identical and same.logprob_gaps == pytest.approx([0.0, -0.05, 0.0, 0.0])
    assert not fork.identical and fork.first_divergence == 1 and fork.lengths == [4, 3]
    assert fork.divergence.token_ids == [6, 9] and fork.logprob_gaps == pytest.approx([-0.05])

    sides = [SideInfo(name="ref", kind="hf", reference=True), SideInfo(name="same", kind="vllm"),
             SideInfo(name="fork", kind="vllm")]
    run = Run(id="r", created_utc="", model=ModelInfo(name="m", path="/m"), config={}, status="diverged",
              prompts=[pr], sides=sides)
    assert run.reference == "ref"
    assert run.comparisons == [same, fork]
    assert run.identical is False  # one side forked
    assert run.first_divergence == 1
    pr.comparisons = [same]  # a side's comparison is missing (it errored): undecided
    assert run.identical is None
    pr.comparisons = [same, compare(res["ref"], stream("fork", [5, 6, 7, 8]))]
    assert run.identical is True and run.first_divergence is None


def test_service_compares_every_side_with_the_reference():
    """The service's compare step (compare_run.finish_comparisons) on stand-ins: no engine, no worker.
    Each non-reference side gets one comparison against the reference, with cross-scores only in the
    directions a scorer can score, and an explanation naming the pair's own differing settings."""
    from parity_ui.commands.compare import finish_comparisons
    from parity_ui.run.recorder import RunRecorder
    from parity_ui.store.runs import open_db

    res = _three_sides()
    calls = []

    def score(side, req):
        prompt, continuation, k = req.prompt, req.continuation, req.logprobs
        calls.append((side, tuple(continuation)))
        return [TokenStep(position=i, token_id=t, text="", logprob=-0.3, rank=1) for i, t in enumerate(continuation)]

    no_score = dataclasses.replace(KINDS["vllm"], can_score=False)
    plans = [SimpleNamespace(name="ref", kind=KINDS["hf"]), SimpleNamespace(name="same", kind=KINDS["vllm"]),
             SimpleNamespace(name="fork", kind=no_score)]
    prep = SimpleNamespace(reference=plans[0], sides=plans, config=build_config())
    sides = [SideInfo(name="ref", kind="hf", reference=True, resolved={"engine": "hf", "dtype": "bfloat16"}),
             SideInfo(name="same", kind="vllm", resolved={"engine": "vllm", "dtype": "bfloat16"}),
             SideInfo(name="fork", kind="vllm", resolved={"engine": "vllm", "dtype": "float32"})]
    pr = PromptResult(index=0, prompt_text="p", prompt_token_ids=[1, 2], results=res)
    run = Run(id="r", created_utc="", model=ModelInfo(name="m", path="/m"), config={}, status="running",
              prompts=[pr], sides=sides)

    batches = []

    def score_batch(side, items):  # a scorer that keeps each row's bits in any grouping gets one call
        batches.append((side, len(items)))
        return [score(side, r) for r in items]

    finish_comparisons(prep, RunRecorder(open_db(":memory:"), run), SimpleNamespace(score=score, score_batch=score_batch),
                       lambda e: None)

    assert [(c.a, c.b) for c in pr.comparisons] == [("ref", "same"), ("ref", "fork")]
    same, fork = pr.comparisons
    assert same.identical and not fork.identical and fork.first_divergence == 1
    assert set(same.cross_scores.directions) == {"same_by_ref", "ref_by_same"}
    assert set(fork.cross_scores.directions) == {"fork_by_ref"}  # fork's kind cannot score the reference's tokens
    assert sorted(calls) == sorted([("ref", (5, 6, 7, 8)), ("same", (5, 6, 7, 8)), ("ref", (5, 9, 7))])
    assert batches == [("ref", 2)]  # the HF reference's two sequences in one call; vLLM's one row a call
    assert same.explanation.sides == ["ref", "same"] and same.explanation.verdict == "identical"
    assert fork.explanation.sides == ["ref", "fork"]
    assert "dtype" in fork.explanation.differing_settings
    assert "dtype" not in same.explanation.differing_settings
    assert set(run.timings) >= {"compare", "cross_score", "explain"}
