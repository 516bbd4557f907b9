"""Stored runs for History's tests (unit and browser): comparisons with a long hub-cache model path,
a bisect with its trial runs (#33 item 12). Written with the store's functions, no engine."""
from __future__ import annotations

from parity_ui.analysis.compare import compare
from parity_ui.core.bisect_record import BisectReport
from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob

CACHE = "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/7ae557604adf67be50417f59c2c2f167def9a775"


def _side(name: str, ids: list[int]) -> SideResult:
    steps = [TokenStep(position=i, token_id=t, text=f" t{t}", logprob=-0.1 * (i + 1), rank=1,
                       top=[TopLogprob(t, -0.1 * (i + 1), f" t{t}")]) for i, t in enumerate(ids)]
    return SideResult(side=name, prompt_index=0, token_ids=ids, steps=steps, finish_reason="length")


def _run(run_id: str, created: str, *, model: str = CACHE, b_ids=(1, 2, 3, 4), dtype: str = "bfloat16",
         kind: str = "compare", group_id: str | None = None, status: str | None = None, **kw) -> Run:
    ref, b = _side("ref", [1, 2, 3, 4]), _side("b", list(b_ids))
    c = compare(ref, b)
    p = PromptResult(index=0, prompt_text="def f(x):\n    return x", prompt_token_ids=[1], results={"ref": ref, "b": b},
                     comparisons=[c])
    return Run(id=run_id, created_utc=created, model=ModelInfo(name=model, path=model), config={"dtype": dtype},
               status=status or ("ok" if c.identical else "diverged"), prompts=[p], kind=kind, group_id=group_id,
               sides=[SideInfo(name="ref", kind="hf", reference=True, dtype="float32", options={"dtype": "float32"}),
                      SideInfo(name="b", kind="vllm", dtype=dtype, options={"dtype": dtype, "enforce_eager": True})],
               **kw)


def store_history(db, extra: int = 0) -> None:
    """Into `db`: 01PLAIN (b forks at token 2, a hub-cache model path), 01OTHER (identical, a hub id,
    float32), the bisect 01BISECT of 01PLAIN with its three trial runs 01TRIAL0-2, and `extra` more
    plain runs (01MORE00...) a day earlier."""
    from parity_ui.store.runs import save_run

    save_run(db, _run("01PLAIN", "2026-01-01T10:00:00.000+00:00", b_ids=(1, 2, 9, 9)))
    save_run(db, _run("01OTHER", "2026-01-01T11:00:00.000+00:00", model="Qwen/Qwen2.5-0.5B", dtype="float32"))
    bisect = _run("01BISECT", "2026-01-01T12:00:00.000+00:00", kind="bisect", group_id="G1", status="ok",
                  bisect=BisectReport(run_id="01PLAIN", reference="ref", side="b", group_id="G1",
                                      summary="dtype explains the divergence"))
    bisect.prompts = []
    save_run(db, bisect)
    for i in range(3):  # its trials: stored runs of the bisect's group, not listed
        save_run(db, _run(f"01TRIAL{i}", f"2026-01-01T12:0{i + 1}:00.000+00:00", kind="bisect-trial", group_id="G1"))
    for i in range(extra):
        save_run(db, _run(f"01MORE{i:02d}", f"2025-12-31T{i % 24:02d}:00:00.000+00:00", b_ids=(1, 2, 3, 5)))
