"""HF teacher-forced scoring many rows a forward (parity_ui.engines.hf_score, issue 44) against the
same rows scored one at a time, bit for bit, on the CPU in float32 with a real tiny model in this
process (no worker): a few seconds.

- same-length (auto on the CPU): rows of one length share a forward without a mask; every row's
  columns (logprobs, ranks, top-k) are those of the row alone, `==`.
- padded with the first forward's spot check: the CPU's kernels move a padded row's last bits, the
  check finds it on the run's own rows, drops to same-length and rescores: the same bits again.
- padded as asked (no check): close to the rows alone, and the difference is what the load-time
  check would name; the packing keeps every row's own positions (no row's tokens are another's).
"""
from __future__ import annotations

import random

import pytest

from parity_ui.core.config import build_config
from parity_ui.core.requests import ScoreBatch, ScoreRequest
from parity_ui.engines.hf_engine import HfEngine
from parity_ui.engines.hf_score import BatchScorer, check
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.pipeline import load_request
from parity_ui.run.plan import RunRequest
from parity_ui.run.prepare import prepare


def _engine(model, score_batch: str) -> tuple[HfEngine, dict]:
    cfg = build_config(None, ["logprobs=3"], sides=[f"a=hf,dtype=float32,score_batch={score_batch}", "b=hf"])
    prep = prepare(RunRequest(model=str(model), prompts=[PromptSpec(text="x", token_ids=[1, 2, 3])], config=cfg),
                   gpu=False)
    engine = HfEngine()
    engine.should_stop = lambda: False
    info = engine.load(load_request(prep.side("a")))
    return engine, info.resolved


def _items(n: int = 18, seed: int = 1) -> list[ScoreRequest]:
    """Rows of a few shared lengths (so that rows of one length exist) and some lone ones."""
    rnd = random.Random(seed)
    out = []
    for j in range(n):
        prompt = [rnd.randrange(8, 1000) for _ in range(rnd.choice([5, 12, 12]))]
        cont = [rnd.randrange(8, 1000) for _ in range(rnd.choice([20, 33, 33]) + (j == 0) * 7)]
        out.append(ScoreRequest(prompt, cont, 1 + j % 4))
    return out


@pytest.fixture(scope="module")
def auto_engine(tiny_llama):
    return _engine(tiny_llama, "auto")


def test_auto_on_the_cpu_batches_rows_of_one_length_and_gives_the_bits_of_each_row_alone(auto_engine):
    engine, resolved = auto_engine
    assert "rows of one length together" in resolved["score_batch"]
    items = _items()
    forwards: list[int] = []
    real = engine.model.forward

    def counted(*a, **kw):
        forwards.append(kw["input_ids"].shape[0])
        return real(*a, **kw)

    engine.model.forward = counted
    try:
        got = engine.score_batch(ScoreBatch(items))
    finally:
        engine.model.forward = real
    assert max(forwards) > 1, "no forward held more than one row"
    assert sum(forwards) == len(items) + 1  # every row once, and the first forward's spot check once more
    alone = [engine._score_columns(it) for it in items]
    assert [g.columns() for g in got] == [a.columns() for a in alone]  # bit for bit, top-k and ranks too
    assert engine._scorer.mode == "same-length"  # the spot check found the same bits


def test_padded_rows_whose_bits_move_are_found_by_the_spot_check_and_scored_again(auto_engine):
    engine, _ = auto_engine
    items = _items(seed=2)
    said: list[str] = []
    scorer = BatchScorer(engine.model, "padded", 4096, True, said.append)
    got = scorer.score(items, lambda: False, lambda i: engine._score_columns(items[i]))
    alone = [engine._score_columns(it) for it in items]
    assert [g.columns() for g in got] == [a.columns() for a in alone]
    found = check(engine.model)
    if found.padded == 0.0:  # kernels that keep padded rows' bits: nothing to drop
        assert scorer.mode == "padded" and not said
    else:
        assert scorer.mode == "same-length" and "differed from the same row alone" in said[0]
    assert found.same_length == 0.0


def test_padded_as_asked_keeps_each_row_its_own_tokens_within_rounding(tiny_llama):
    engine, resolved = _engine(tiny_llama, "padded")
    assert resolved["score_batch"].startswith("rows by length, right-padded") and "(as asked)" in resolved["score_batch"]
    items = _items(seed=3)
    got = engine.score_batch(ScoreBatch(items))
    for g, it in zip(got, items):
        a = engine._score_columns(it)
        assert g.column("token_id") == list(it.continuation) and g.top_n == a.top_n
        worst = max(abs(x - y) for x, y in zip(g.column("logprob"), a.column("logprob")))
        assert worst < 1e-4, worst  # float32 rounding, not another row's context
    assert engine._scorer.mode == "padded"  # as asked: no check, no drop

