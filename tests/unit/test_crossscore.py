"""Teacher-forced cross-scoring: the statistics (pure, hand-built steps) and which side scores which
sequence. Each engine's `score` on a tiny real model is tests/engines/test_crossscore_engines.py."""
from __future__ import annotations

import math

import pytest

from parity_ui.analysis.compare import compare
from parity_ui.analysis.crossscore import RATIO_BAND, cross_score, gap_stats, key, summary_line
from parity_ui.core.findings import cross_scores_from_json
from parity_ui.core.types import SideResult, TokenStep, to_dict


# The figures as they are stored (the typed records' JSON), which is what these tests read.
def stats(*args):
    return to_dict(gap_stats(*args))


def cross(*args):
    return cross_score(*args).to_json()


def line(cs):
    return summary_line(None if cs is None else cross_scores_from_json(cs))


def steps(logprobs: list[float], ranks: list[int] | None = None, first_id: int = 100) -> list[TokenStep]:
    ranks = ranks or [1] * len(logprobs)
    return [TokenStep(position=i, token_id=first_id + i, text="", logprob=lp, rank=r)
            for i, (lp, r) in enumerate(zip(logprobs, ranks))]


def side(name: str, logprobs: list[float], first_id: int = 100) -> SideResult:
    st = steps(logprobs, first_id=first_id)
    return SideResult(side=name, prompt_index=0, token_ids=[s.token_id for s in st], steps=st)


def recorder(logprob: float = -0.2):
    """A ScoreFn that records (scorer, continuation) and scores every token at `logprob`."""
    calls: list[tuple[str, tuple[int, ...], tuple[int, ...], int]] = []

    def score(scorer, prompt, continuation, k):
        calls.append((scorer, tuple(prompt), tuple(continuation), k))
        return steps([logprob] * len(continuation), first_id=continuation[0] if continuation else 0)

    return score, calls


def test_key():
    assert key("cand", "ref") == "cand_by_ref" and key("ref", "cand") == "ref_by_cand"


def test_gap_stats_numbers():
    own = steps([-0.1, -0.5, -2.0, -1.0])
    other = steps([-0.1, -0.4, -2.3, -1e30], ranks=[1, 1, 3, 9])  # the last one masked by the scorer
    s = stats("cand", "ref", "ref", own, other)
    gaps = [0.0, -0.1, 0.3]  # own - teacher-forced
    assert (s["generator"], s["scorer"]) == ("cand", "ref")
    assert s["positions"] == 4 and s["skipped"] == 1 and s["gaps"][3] is None
    assert s["gaps"][:3] == pytest.approx(gaps)
    assert s["mean_gap"] == pytest.approx(sum(gaps) / 3)
    assert s["mean_abs_gap"] == pytest.approx(sum(abs(g) for g in gaps) / 3)
    assert s["max_abs_gap"] == pytest.approx(0.3)
    assert s["rms_gap"] == pytest.approx(math.sqrt(sum(g * g for g in gaps) / 3))
    lo, hi = RATIO_BAND
    assert s["share_outside_band"] == pytest.approx(sum(not lo <= math.exp(g) <= hi for g in gaps) / 3)
    assert s["share_outside_band"] == pytest.approx(1 / 3)  # only exp(0.3) leaves the band; exp(-0.1) = 0.905 is in
    assert s["ratio_band"] == list(RATIO_BAND)
    assert s["other_rank"] == [1, 1, 3, 9] and s["other_disagrees"] == 2
    # generator is not the reference: ratio = exp(logp_reference - logp_side) = exp(scored - own) = exp(-gap)
    r = [math.exp(-g) for g in gaps]
    assert s["importance_ratio"]["min"] == pytest.approx(min(r))
    assert s["importance_ratio"]["max"] == pytest.approx(max(r))
    assert s["importance_ratio"]["mean"] == pytest.approx(sum(r) / 3)


def test_importance_ratio_direction_follows_the_reference():
    own, other = steps([-1.0]), steps([-1.5])
    # the reference generated: its own logprob is logp_reference
    assert stats("ref", "cand", "ref", own, other)["importance_ratio"]["max"] == pytest.approx(math.exp(0.5))
    # a side generated and the reference scored: the scored logprob is logp_reference
    assert stats("cand", "ref", "ref", own, other)["importance_ratio"]["max"] == pytest.approx(math.exp(-0.5))
    # the gap itself is own - scored whoever generated
    assert stats("ref", "cand", "ref", own, other)["gaps"] == pytest.approx([0.5])
    assert stats("cand", "ref", "ref", own, other)["gaps"] == pytest.approx([0.5])


def test_gap_stats_with_nothing_comparable():
    s = stats("cand", "ref", "ref", steps([-0.1, -math.inf]), steps([-1e30, -0.2], ranks=[None, 2]))
    assert s["positions"] == 2 and s["skipped"] == 2 and s["gaps"] == [None, None]
    assert s["mean_gap"] is None and s["rms_gap"] is None and s["max_abs_gap"] is None
    assert s["share_outside_band"] is None and s["importance_ratio"] is None
    assert s["other_disagrees"] == 1
    assert line({key("cand", "ref"): s}) == ""  # nothing to report


def test_gap_stats_survives_a_huge_finite_gap():
    s = stats("cand", "ref", "ref", steps([-0.1, -0.2]), steps([-0.1, -65504.0]))
    assert s["positions"] == 2 and s["share_outside_band"] == pytest.approx(0.5)


def test_cross_score_scores_each_sequence_with_the_other_side():
    a, b = side("ref", [-0.1, -0.3], first_id=7), side("cand", [-0.2, -0.25, -0.4], first_id=20)
    score, calls = recorder(-0.2)
    out = cross(score, compare(a, b), [1, 2], {"ref": a, "cand": b}, 5, {"ref", "cand"})
    # the side's tokens scored by the reference, then the reference's by the side; prompt and k passed on
    assert calls == [("ref", (1, 2), (20, 21, 22), 5), ("cand", (1, 2), (7, 8), 5)]
    assert list(out) == ["cand_by_ref", "ref_by_cand"]
    cb, rb = out["cand_by_ref"], out["ref_by_cand"]
    assert (cb["generator"], cb["scorer"], cb["positions"]) == ("cand", "ref", 3)
    assert (rb["generator"], rb["scorer"], rb["positions"]) == ("ref", "cand", 2)
    assert cb["gaps"] == pytest.approx([0.0, -0.05, -0.2])
    assert rb["gaps"] == pytest.approx([0.1, -0.1])
    # the reference is the comparison's `a`: the ratio is exp(logp_ref - logp_side) in both directions
    assert cb["importance_ratio"]["max"] == pytest.approx(math.exp(0.2))  # ref scored cand's tokens
    assert rb["importance_ratio"]["max"] == pytest.approx(math.exp(0.1))  # ref generated


def test_cross_score_skips_a_generator_without_tokens():
    a = SideResult(side="ref", prompt_index=0)
    b = side("cand", [-0.1, -0.1], first_id=7)
    score, calls = recorder()
    out = cross(score, compare(a, b), [1, 2], {"ref": a, "cand": b}, 5, {"ref", "cand"})
    assert [(c[0], c[2]) for c in calls] == [("ref", (7, 8))]
    assert out["ref_by_cand"] is None and out["cand_by_ref"]["scorer"] == "ref"
    assert "cand's tokens scored by ref" in line(out)
    assert "ref's tokens scored by cand" not in line(out)


def test_cross_score_skips_a_failed_or_missing_generator():
    a, b = side("ref", [-0.1], first_id=7), side("cand", [-0.1, -0.2], first_id=7)
    b.error = "worker died"
    score, calls = recorder()
    c = compare(a, b)
    out = cross(score, c, [1], {"ref": a, "cand": b}, 5, {"ref", "cand"})
    assert out["cand_by_ref"] is None and out["ref_by_cand"]["positions"] == 1
    assert [x[0] for x in calls] == ["cand"]
    calls.clear()
    out = cross(score, c, [1], {"ref": a}, 5, {"ref", "cand"})  # no result for cand at all
    assert out["cand_by_ref"] is None and out["ref_by_cand"] is not None


@pytest.mark.parametrize("cannot", ["ref", "cand"])
def test_cross_score_only_asks_sides_that_can_score(cannot):
    a, b = side("ref", [-0.1], first_id=7), side("cand", [-0.2], first_id=8)
    score, calls = recorder()
    out = cross(score, compare(a, b), [1], {"ref": a, "cand": b}, 5, {"ref", "cand"} - {cannot})
    assert [x[0] for x in calls] == [b.side if cannot == "ref" else a.side]
    assert all(x[0] != cannot for x in calls)
    # the direction that needs the non-scoring side is left out, not recorded as None
    assert set(out) == ({"ref_by_cand"} if cannot == "ref" else {"cand_by_ref"})


def test_three_sides_are_each_cross_scored_against_the_reference():
    res = {"ref": side("ref", [-0.1, -0.2], first_id=7), "b": side("b", [-0.1, -0.3], first_id=7),
           "c": side("c", [-0.4], first_id=9)}
    score, calls = recorder()
    outs = {n: cross(score, compare(res["ref"], res[n]), [1], res, 5, set(res)) for n in ("b", "c")}
    assert set(outs["b"]) == {"b_by_ref", "ref_by_b"}
    assert set(outs["c"]) == {"c_by_ref", "ref_by_c"}
    assert all(s["scorer"] == sc for o in outs.values() for k, s in o.items() for sc in [k.split("_by_")[1]])
    # b and c never score each other: every call has the reference on one end
    assert sorted(x[0] for x in calls) == ["b", "c", "ref", "ref"]
    assert [x[2] for x in calls if x[0] == "ref"] == [(7, 8), (9,)]


def test_cross_score_lets_engine_errors_propagate():
    a, b = side("ref", [-0.1], first_id=7), side("cand", [-0.1], first_id=7)

    def score(*args):
        raise RuntimeError("scorer crashed")

    with pytest.raises(RuntimeError, match="scorer crashed"):
        cross(score, compare(a, b), [1], {"ref": a, "cand": b}, 5, {"ref", "cand"})


def test_summary_line():
    own, other = steps([-0.1, -0.5]), steps([-0.1, -0.2])
    cs = {key("cand", "ref"): stats("cand", "ref", "ref", own, other),
          key("ref", "cand"): stats("ref", "cand", "ref", other, own)}
    text = line(cs)
    first, second = text.split("; ")
    assert first.startswith("cand's tokens scored by ref: RMS gap ")
    assert second.startswith("ref's tokens scored by cand: RMS gap ")
    assert f"RMS gap {math.sqrt(0.09 / 2):.3g}, max 0.3 nats, 50.0% outside" in first
    assert line(None) == "" and line({}) == ""
    assert line({"error": "boom"}) == "cross-scoring failed: boom"
    assert line({key("cand", "ref"): None, key("ref", "cand"): cs[key("ref", "cand")]}) == second
