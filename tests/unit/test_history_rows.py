"""History's list and its two-run comparison (#33 item 12): the columns a user reads first, a long model
path shortened (the full one on hover), a bisect's trial runs folded under the bisect (with their count),
and two stored runs side by side (settings diff, headline figures, token panes of single comparisons)."""
from __future__ import annotations

import pytest

from parity_ui.analysis.compare import compare
from parity_ui.core.bisect_record import BisectReport
from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob
from parity_ui.render.run_pair import run_pair_html, settings_pairs
from parity_ui.store import Store
from parity_ui.ui.history_tab import COLUMNS, ID, MODEL, PROMPT, RESULT, SIDES, STATUS, history_rows, model_cell, \
    short_model

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


@pytest.fixture
def st():
    from parity_ui.store.runs import open_db, save_run

    db = open_db(":memory:")
    save_run(db, _run("01PLAIN", "2026-01-01T10:00:00.000+00:00", b_ids=(1, 2, 9, 9)))
    save_run(db, _run("01OTHER", "2026-01-01T11:00:00.000+00:00", model="Qwen/Qwen2.5-0.5B", dtype="float32"))
    bisect = _run("01BISECT", "2026-01-01T12:00:00.000+00:00", kind="bisect", group_id="G1", status="ok",
                  bisect=BisectReport(run_id="01PLAIN", reference="ref", side="b", group_id="G1",
                                      summary="dtype explains the divergence"))
    bisect.prompts = []
    save_run(db, bisect)
    for i in range(3):  # its trials: stored runs of the bisect's group, not listed
        save_run(db, _run(f"01TRIAL{i}", f"2026-01-01T12:0{i + 1}:00.000+00:00", kind="bisect-trial", group_id="G1"))
    yield Store(db)
    db.close()


def test_a_cache_path_is_shown_by_its_repo_name_and_the_full_path_on_hover():
    assert short_model(CACHE) == "Qwen/Qwen2.5-0.5B-Instruct"
    assert short_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a hub id as it is
    assert short_model("/data/models/my_llama/") == "my_llama"
    assert short_model("./tiny") == "tiny"
    cell = model_cell(CACHE)
    assert cell.startswith("<span title=") and "snapshots" in cell and ">Qwen/Qwen2.5-0.5B-Instruct</span>" in cell
    assert model_cell("my_model") == "my&#95;model"  # not read as markdown emphasis


def test_the_columns_a_user_reads_first_come_first():
    assert COLUMNS[:5] == ["status", "result", "model", "sides (reference first)", "prompt"] and COLUMNS[ID] == "id"


def test_history_folds_a_bisects_trials_under_it(st):
    rows = history_rows(st)
    ids = [r[ID] for r in rows]
    assert ids == ["01BISECT", "01OTHER", "01PLAIN"]  # no trial listed as a run
    bisect = rows[0]
    assert bisect[RESULT].startswith("which setting? b vs ref of 01PLAIN: dtype explains") and "(3 trials" in bisect[RESULT]
    plain = rows[2]
    assert (plain[STATUS], plain[RESULT]) == ("diverged", "diverged at token 2")
    assert "Qwen/Qwen2.5-0.5B-Instruct</span>" in plain[MODEL] and plain[SIDES] and "def f(x): return x" == plain[PROMPT]
    assert history_rows(st, search="01TRIAL") == []  # a search does not bring the trials back as runs


def test_two_stored_runs_side_by_side(st):
    a, b = st.get_run("01PLAIN"), st.get_run("01OTHER")
    rows = settings_pairs(a, b)
    differ = {r.label for r in rows if r.differs}
    assert {"model", "config.dtype", "side b: dtype", "side b: option.dtype"} <= differ
    assert "side b: option.enforce_eager" not in differ and "side ref: kind" not in differ
    assert rows[0].differs  # the differences first
    html = run_pair_html(a, b, "<div class='pt-root'>A panes</div>", "<div class='pt-root'>B panes</div>")
    assert 'data-a="01PLAIN"' in html and 'data-b="01OTHER"' in html
    assert "diverged at token 2" in html and "identical on every prompt" in html
    assert "A panes" in html and "B panes" in html and "Settings: " in html


def test_the_history_tab_compares_two_runs_with_their_panes(st):
    import gradio as gr

    from parity_ui.ui.history_tab import HistoryTab

    class Runner:  # the app's AppService, as far as History reads
        reader = st

    tab = HistoryTab(Runner(), gate=object())
    with gr.Blocks():
        tab.create_ui()
    out = tab.compare_pair("01PLAIN", "01OTHER")
    assert 'data-a="01PLAIN"' in out and out.count("pt-root") >= 2  # each run's token panes
    assert "Nothing to compare" in tab.compare_pair("01PLAIN", "")
    assert "01NOPE&#x27; (run B)" in tab.compare_pair("01PLAIN", "01NOPE")
    bis = tab.compare_pair("01BISECT", "01PLAIN")  # a bisect: its answer, no panes
    assert "dtype explains" in bis and "pt-root" not in bis
