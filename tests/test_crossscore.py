"""Teacher-forced cross-scoring: the statistics (pure, hand-built steps) and both engines' `score`
on a tiny real model (one shared service: one vLLM load for the module)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from parity_ui.config import build_config
from parity_ui.crossscore import RATIO_BAND, cross_score_prompt, gap_stats, summary_line
from parity_ui.prompts import PromptSpec
from parity_ui.service import RunRequest
from parity_ui.types import EngineResult, PromptResult, TokenStep


def steps(logprobs: list[float], ranks: list[int] | None = None) -> list[TokenStep]:
    ranks = ranks or [1] * len(logprobs)
    return [TokenStep(position=i, token_id=100 + i, text="", logprob=lp, rank=r)
            for i, (lp, r) in enumerate(zip(logprobs, ranks))]


def test_gap_stats_numbers():
    own = steps([-0.1, -0.5, -2.0, -1.0])
    other = steps([-0.1, -0.4, -2.3, -1e30], ranks=[1, 1, 3, 9])  # the last one masked by the scorer
    s = gap_stats("vllm", own, other)
    gaps = [0.0, -0.1, 0.3]
    assert s["positions"] == 4 and s["skipped"] == 1 and s["gaps"][3] is None
    assert s["gaps"][:3] == pytest.approx(gaps)
    assert s["mean_gap"] == pytest.approx(sum(gaps) / 3)
    assert s["max_abs_gap"] == pytest.approx(0.3)
    assert s["rms_gap"] == pytest.approx(math.sqrt(sum(g * g for g in gaps) / 3))
    lo, hi = RATIO_BAND
    assert s["share_outside_band"] == pytest.approx(sum(not lo <= math.exp(g) <= hi for g in gaps) / 3)
    assert s["other_disagrees"] == 2
    # generator vLLM: ratio = exp(logp_hf - logp_vllm) = exp(-gap)
    r = [math.exp(-g) for g in gaps]
    assert s["importance_ratio"]["min"] == pytest.approx(min(r))
    assert s["importance_ratio"]["max"] == pytest.approx(max(r))
    assert s["importance_ratio"]["mean"] == pytest.approx(sum(r) / 3)


def test_importance_ratio_direction_follows_the_generator():
    own, other = steps([-1.0]), steps([-1.5])
    assert gap_stats("hf", own, other)["importance_ratio"]["max"] == pytest.approx(math.exp(0.5))
    assert gap_stats("vllm", own, other)["importance_ratio"]["max"] == pytest.approx(math.exp(-0.5))


def test_cross_score_prompt_scores_each_sequence_with_the_other_engine():
    calls = []

    def score(engine, prompt, continuation, k):  # records which engine scores which sequence
        calls.append((engine, tuple(continuation)))
        return steps([-0.2] * len(continuation))

    pr = PromptResult(index=0, prompt_text="p", prompt_token_ids=[1, 2],
                      vllm=EngineResult("vllm", 0, token_ids=[7, 8], steps=steps([-0.1, -0.1])),
                      hf=EngineResult("hf", 0, token_ids=[], steps=[]))
    out = cross_score_prompt(score, pr, 5)
    assert calls == [("hf", (7, 8))]
    assert out["hf_by_vllm"] is None and out["vllm_by_hf"]["scorer"] == "hf"
    assert "vLLM's tokens scored by HF" in summary_line(out)
    assert summary_line({"error": "boom"}).endswith("boom")


# -- real engines ----------------------------------------------------------------------------------

FP32 = ["dtype=float32", "max_new_tokens=16"]


@pytest.fixture(scope="module")
def model(tiny_llama) -> Path:
    return tiny_llama


@pytest.fixture(scope="module")
def run(service, model):
    cfg = build_config(overrides=FP32)
    return service.run(RunRequest(model=str(model), prompts=[PromptSpec(text="def main(args):")], config=cfg))


@pytest.mark.engines
def test_run_stores_cross_scores_for_both_directions(service, run):
    from parity_ui.store import get_run

    assert run.status in ("ok", "diverged"), run.error
    stored = get_run(service.db, run.id).prompts[0]
    cs = stored.cross_scores
    for key, gen in (("vllm_by_hf", "vllm"), ("hf_by_vllm", "hf")):
        s = cs[key]
        assert s["positions"] == len(getattr(stored, gen).token_ids) > 0
        # float32 on both engines: teacher forcing reproduces the other's logprobs to rounding
        assert s["max_abs_gap"] < 1e-3 and s["share_outside_band"] == 0.0
        assert 0.999 < s["importance_ratio"]["min"] <= s["importance_ratio"]["max"] < 1.001


@pytest.mark.engines
def test_each_engine_scores_its_own_greedy_tokens_as_it_generated_them(service, run):
    """`score` is aligned: engine X teacher-forcing X's own greedy output gives X's generate logprobs
    and rank 1 at every position."""
    pr = run.prompts[0]
    for name in ("vllm", "hf"):
        res = getattr(pr, name)
        scored = service.score(name, pr.prompt_token_ids, res.token_ids, 5)
        assert [s.token_id for s in scored] == res.token_ids
        assert [s.rank for s in scored] == [1] * len(res.token_ids)
        for got, want in zip(scored, res.steps):
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


@pytest.mark.engines
def test_both_engines_agree_on_an_unlikely_continuation(service, run):
    """Off-distribution tokens (the prompt reversed): both engines give the same logprob and rank at
    each position, so neither `score` is shifted by one."""
    pr = run.prompts[0]
    tokens = list(reversed(pr.prompt_token_ids))[:6]
    v = service.score("vllm", pr.prompt_token_ids, tokens, 5)
    h = service.score("hf", pr.prompt_token_ids, tokens, 5)
    assert any(s.rank > 1 for s in h)  # really unlikely tokens, not the greedy path
    assert [s.rank for s in v] == [s.rank for s in h]
    for a, b in zip(v, h):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]
