"""History's list and its two-run comparison (#33 item 12): the columns a user reads first, a long model
path shortened (the full one on hover), a bisect's trial runs folded under the bisect (with their count),
and two stored runs side by side (settings diff, headline figures, token panes of single comparisons)."""
from __future__ import annotations

import pytest

import sys
from pathlib import Path

from parity_ui.render.run_pair import run_pair_html, settings_pairs
from parity_ui.store import Store
from parity_ui.ui.history_tab import COLUMNS, ID, MODEL, PROMPT, RESULT, SIDES, STATUS, history_rows, model_cell, \
    short_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from history_runs import CACHE, store_history  # noqa: E402


@pytest.fixture
def st():
    from parity_ui.store.runs import open_db

    db = open_db(":memory:")
    store_history(db)
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
