"""HF teacher-forced scoring built as columns straight from the tensors (HfEngine.score_batch, the
replay's trainer side and the scored workload's reference) gives exactly what the per-position path
gave: the same logprobs, ranks and top-k as make_step over each position's own logits row, and the
same logprobs as bare log-softmax teacher-forcing, bit for bit. A real tiny model in this process
(no worker): a second or two."""
from __future__ import annotations

import math

from parity_ui.core.config import build_config
from parity_ui.core.requests import ScoreBatch, ScoreRequest
from parity_ui.core.types import StepColumns
from parity_ui.engines.hf_engine import HfEngine
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.pipeline import load_request
from parity_ui.run.plan import RunRequest
from parity_ui.run.prepare import prepare


def test_score_batch_columns_equal_the_per_position_steps_and_bare_teacher_forcing(tiny_llama):
    import torch

    cfg = build_config(None, ["logprobs=3"], sides=["a=hf,dtype=float32", "b=hf,dtype=float32"])
    prep = prepare(RunRequest(model=str(tiny_llama), prompts=[PromptSpec(text="x", token_ids=[1, 2, 3])], config=cfg),
                   gpu=False)
    engine = HfEngine()
    engine.should_stop = lambda: False
    engine.load(load_request(prep.side("a")))
    items = [ScoreRequest([1, 40, 41, 42], [50, 51, 52, 300, 7], 3), ScoreRequest([9], [100], 1),
             ScoreRequest([5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18], 4)]
    got = engine.score_batch(ScoreBatch(items))
    assert len(got) == 3 and all(isinstance(c, StepColumns) for c in got)
    for item, cols in zip(items, got):
        with torch.inference_mode():
            logits = engine.model(input_ids=torch.tensor([item.prompt + item.continuation])).logits[0]
            full_lp = torch.log_softmax(logits.float(), dim=-1)
        base, n = len(item.prompt), len(item.continuation)
        # The path before: one logits row per position, stacked, each step made by make_step.
        before = engine._steps_from_logits([logits[base - 1 + j].unsqueeze(0) for j in range(n)], 0,
                                           item.continuation, item.logprobs)
        assert cols == before and StepColumns.from_steps(before).columns() == cols.columns()
        assert engine.score(item) == before  # the one-item verb gives the same steps
        bare = [full_lp[base - 1 + j, t].item() for j, t in enumerate(item.continuation)]
        assert cols.column("logprob") == bare  # bit for bit, not approximately
        assert cols.top_n == [item.logprobs] * n and all(r >= 1 for r in cols.column("rank"))
        assert all(math.isfinite(x) for x in cols.top_logprob)
    # A Stop between items: the items scored so far, as the base engine's loop did.
    calls = iter([False, True])
    engine.should_stop = lambda: next(calls)
    assert len(engine.score_batch(ScoreBatch(items))) == 1
