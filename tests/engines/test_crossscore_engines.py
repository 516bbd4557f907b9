"""Teacher-forced cross-scoring on real engines: a run stores both directions, and each engine's `score`
on a tiny real model (one shared service). The statistics and which side scores which sequence, on
hand-built steps, are tests/unit/test_crossscore.py."""
from __future__ import annotations

import pytest

from parity_ui.core.config import build_config
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.core.types import to_dict


FP32 = ["dtype=float32", "max_new_tokens=16"]


@pytest.fixture(scope="module")
def run(service, tiny_llama):
    cfg = build_config(overrides=FP32)  # default sides: hf (the reference) and vllm
    return service.run(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text="def main(args):")], config=cfg))


def test_run_stores_cross_scores_for_both_directions(service, run):
    from parity_ui.store.runs import get_run

    assert run.status in ("ok", "diverged"), run.error
    stored = get_run(service.db, run.id).prompts[0]
    (c,) = stored.comparisons
    assert (c.a, c.b) == ("hf", "vllm")
    for k, gen, scorer in (("vllm_by_hf", "vllm", "hf"), ("hf_by_vllm", "hf", "vllm")):
        s = to_dict(c.cross_scores.get(k))
        assert (s["generator"], s["scorer"]) == (gen, scorer)
        assert s["positions"] == len(stored.results[gen].token_ids) > 0
        # float32 on both engines: teacher forcing reproduces the other's logprobs to rounding
        assert s["max_abs_gap"] < 1e-3 and s["share_outside_band"] == 0.0
        assert 0.999 < s["importance_ratio"]["min"] <= s["importance_ratio"]["max"] < 1.001


def _score(service, model, side, prompt, tokens, k=5):
    """`side` of the run's setup teacher-forcing `tokens` (its warm worker from the run serves it)."""
    from parity_ui.engines.base import ScoreRequest
    from parity_ui.run.prepare import plan_sides

    plans = plan_sides(str(model), build_config(overrides=FP32), service.on_gpu,
                       context_need=len(prompt) + len(tokens))
    with service.sides(plans) as sides:
        return sides.score(side, ScoreRequest(prompt, tokens, k))


def test_each_engine_scores_its_own_greedy_tokens_as_it_generated_them(service, run, tiny_llama):
    """`score` is aligned: side X teacher-forcing X's own greedy output gives X's generate logprobs
    and rank 1 at every position."""
    pr = run.prompts[0]
    for name in ("vllm", "hf"):
        res = pr.results[name]
        scored = _score(service, tiny_llama, name, pr.prompt_token_ids, res.token_ids, 5)
        assert [s.token_id for s in scored] == res.token_ids
        assert [s.rank for s in scored] == [1] * len(res.token_ids)
        for got, want in zip(scored, res.steps):
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


def test_both_engines_agree_on_an_unlikely_continuation(service, run, tiny_llama):
    """Off-distribution tokens (the prompt reversed): both engines give the same logprob and rank at
    each position, so neither `score` is shifted by one."""
    pr = run.prompts[0]
    tokens = list(reversed(pr.prompt_token_ids))[:6]
    v = _score(service, tiny_llama, "vllm", pr.prompt_token_ids, tokens, 5)
    h = _score(service, tiny_llama, "hf", pr.prompt_token_ids, tokens, 5)
    assert any(s.rank > 1 for s in h)  # really unlikely tokens, not the greedy path
    assert [s.rank for s in v] == [s.rank for s in h]
    for a, b in zip(v, h):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]


def test_vllm_score_batch_columns_are_its_score_steps_bit_for_bit(service, run, tiny_llama):
    """score_batch reads vLLM's flat prompt logprobs straight into columns (parity_ui.engines.prompt_logprobs),
    `score` its dict per position: the same steps, every logprob's bits, on the greedy tokens (rank 1: the
    scored token listed twice, in its own place and in the top-k) and on unlikely ones."""
    from parity_ui.core.types import StepColumns
    from parity_ui.engines.base import ScoreRequest
    from parity_ui.run.prepare import plan_sides

    pr = run.prompts[0]
    plans = plan_sides(str(tiny_llama), build_config(overrides=FP32), service.on_gpu,
                       context_need=len(pr.prompt_token_ids) + 16)
    with service.sides(plans) as sides:
        for tokens, k in ((pr.results["vllm"].token_ids, 5), (pr.results["vllm"].token_ids, 1),
                          (list(reversed(pr.prompt_token_ids))[:16], 1)):  # k=1: a replay's
            item = ScoreRequest(list(pr.prompt_token_ids), list(tokens), k)
            alone = StepColumns.from_steps(sides.score("vllm", item))
            (batched,) = sides.score_batch("vllm", [item])
            assert isinstance(batched, StepColumns)
            assert batched.columns() == alone.columns()
            assert [x.hex() for x in batched.logprob] == [x.hex() for x in alone.logprob]
            assert [x.hex() for x in batched.top_logprob] == [x.hex() for x in alone.top_logprob]
            assert batched.top_n == [k] * len(tokens)
