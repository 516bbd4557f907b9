"""The app's side of workloads, above the engines: a workload uploaded on the Compare tab (read,
described or refused before anything runs), run with its progress and ETA, stopped and resumed;
the workload view (card, verdicts, charts, figures table, prompt table, a prompt's token view) on a
stored workload run built with the fake engine kind; History's list and open; the static report's
section. Seconds, not minutes: the fake engine in real worker processes.
"""
from __future__ import annotations

import json
import re
import pytest

pytest.importorskip("gradio")

import gradio as gr  # noqa: E402

from fake_engine import registered  # noqa: E402
from parity_ui.store import runs as store  # noqa: E402
from parity_ui.core.config import build_config  # noqa: E402
from parity_ui.inputs.prompts import PromptSpec  # noqa: E402
from parity_ui.render.workload import (histogram_svg, prompt_rows, prompt_table_html, survival_svg,  # noqa: E402
                                       workload_card_html)
from parity_ui.render.report import html_report, stored_html_report, workload_report_prompts  # noqa: E402
from parity_ui.core.runlog import RunEvent  # noqa: E402
from parity_ui.ui.live import WorkloadLive  # noqa: E402
from parity_ui.ui.runner import AppService  # noqa: E402
from parity_ui.core.workload_record import WorkloadOptions, report_from_json  # noqa: E402
from parity_ui.commands.workload.run import WorkloadRequest, run_workload  # noqa: E402

N = 24
PROMPTS = [PromptSpec(text=f"def f{i}(x):\n    return x * {i}") for i in range(N)]
SIDES = ["ref=fake", "b=fake,shift=0.2,swap_at=5", "c=fake"]


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=64))


@pytest.fixture(scope="module")
def runner(model, tmp_path_factory):
    """The app's AppService over a database holding one stored workload (b forks at 5, c is
    identical), shared by the tests that only read it. (The fake kind stays registered for the
    module: `model`.)"""
    r = AppService(str(tmp_path_factory.mktemp("db") / "runs.db"))
    cfg = build_config(None, ["max_new_tokens=10"], sides=SIDES)
    run = run_workload(r, WorkloadRequest(model=model, prompts=list(PROMPTS), config=cfg,
                                                  options=WorkloadOptions(chunk=8)))
    assert run.status == "diverged", run.error
    r.stored = run
    yield r
    r.close()


def _tab(cls, runner):
    tab = cls(runner)
    with gr.Blocks():
        tab.create_ui()
    return tab


# -- the report's histograms, pooled with the figures -----------------------------------------------

def test_histograms_are_pooled_with_the_figures_stored_and_old_reports_still_read(runner):
    w = store.get_run(runner.db, runner.stored.id, prompts=[]).workload
    b, c, floor = w.sides["b"], w.sides["c"], w.floor_figures
    assert b.hist.total == b.stats.tokens.pairs == N * 5  # the same scorable pairs, up to each fork
    assert b.hist.zero == 0 and sum(b.hist.counts) == b.hist.total
    peak = b.hist.edges()[max(range(len(b.hist.counts)), key=b.hist.counts.__getitem__)]
    assert peak <= -0.699 < peak + b.hist.width  # log10(0.2): the planted gap's bin
    assert c.hist.zero == c.hist.total == c.stats.tokens.pairs and floor.hist.zero == floor.hist.total
    old = w.to_json()
    for f in [*old["sides"].values(), old["floor_figures"]]:
        del f["hist"]  # a report stored before the histograms
    back = report_from_json(json.loads(json.dumps(old)))
    assert back.sides["b"].hist is None and back.sides["b"].stats == b.stats


# -- the view's parts -------------------------------------------------------------------------------

def test_the_card_gives_the_headline_and_each_sides_verdict_with_the_figures_over_the_floor(runner):
    run = store.get_run(runner.db, runner.stored.id, prompts=[])
    html = workload_card_html(run)
    assert run.workload.headline in html and "EXCEEDS NOISE" in html
    b = re.search(r'<div class="wl-verdict div" data-side="b".*?</table>', html).group(0)
    assert "EXCEEDS the reference" in b and "|Δlogprob| p99" in b and "floor is zero" in b  # the display name, not the key
    assert 'data-side="c" data-verdict="within noise"' in html
    assert "Resume" not in html  # finished: nothing to resume


def test_the_prompt_table_has_a_row_per_prompt_with_sortable_values(runner):
    rows = prompt_rows(store.pair_rows(runner.db, runner.stored.id),
                       store.prompt_excerpts(runner.db, runner.stored.id))
    assert [r.index for r in rows] == list(range(N)) and set(rows[3].pairs) == {"b", "c", "floor"}
    assert rows[3].excerpt == PROMPTS[3].text
    html = prompt_table_html(rows, ["b", "c"], pick="hist", floor="floor")
    assert html.count("<tr data-i=") == N and 'data-pick="hist"' in html
    first = re.search(r'<tr data-i="3">(.*?)</tr>', html).group(1)
    cells = re.findall(r"<td([^>]*)>(.*?)</td>", first)
    assert cells[2] == (' data-v="5" class="div"', "5")  # b forks at 5
    assert cells[5][0] == ' data-v="1e+12"' and cells[5][1] == "identical"  # c: sorts after every fork
    assert float(re.search(r'data-v="([^"]+)"', cells[3][0]).group(1)) == pytest.approx(0.2)


def test_a_huge_workloads_table_lists_its_first_rows_and_says_so(runner):
    rows = prompt_rows(store.pair_rows(runner.db, runner.stored.id), {})
    html = prompt_table_html(rows, ["b", "c"], limit=10)
    assert html.count("<tr data-i=") == 10 and f"the first 10 of {N} prompts" in html


def test_the_charts_are_inline_svg_for_the_report(runner):
    run = store.get_run(runner.db, runner.stored.id, prompts=[])
    surv = survival_svg(run)
    assert surv.startswith("<svg") and surv.count("<polyline") == 3  # b, c and the floor
    b_curve = re.search(r'points="([^"]+)" data-side="b"', surv).group(1).split()
    ys = sorted({float(p.split(",")[1]) for p in b_curve})
    assert len(ys) == 2  # 100% until token 5, then 0%
    hist = histogram_svg(run.workload)
    assert hist.count("<polyline") == 3 and "exactly 0" in hist


def test_the_static_report_opens_with_the_workload_and_shows_only_the_earliest_forks(runner):
    page = stored_html_report(runner.store.for_report(runner.stored.id, workload_report_prompts))
    assert page.startswith("<!doctype html>") and 'class="wl-section"' in page
    assert page.count("<svg class=\"wl-svg\"") == 2 and "wl-figures" in page and page.count("<tr data-i=") == N
    shown = workload_report_prompts(store.get_run(runner.db, runner.stored.id, prompts=[]))
    assert 1 <= len(shown) <= 8 and page.count('class="pt-root"') == len(shown)
    assert 'src="http' not in page and 'href="http' not in page and 'table class="wl-table" data-pick' not in page
    # html_report on the whole run (no rows): the same section, the same few panes.
    whole = html_report(store.get_run(runner.db, runner.stored.id))
    assert 'class="wl-section"' in whole and whole.count('class="pt-root"') == len(shown)


def test_parity_report_writes_a_workloads_page_from_its_rows(runner, tmp_path, monkeypatch):
    """`parity report` goes through stored_html_report: the prompt table, the earliest forks' panes,
    and no other prompt's tokens read."""
    from parity_ui.cli import main

    shown = workload_report_prompts(store.get_run(runner.db, runner.stored.id, prompts=[]))
    real = store.get_run

    def few_prompts(db, run_id, prompts=None):
        assert prompts is not None and len(prompts) <= len(shown), "the report read every prompt"
        return real(db, run_id, prompts=prompts)

    monkeypatch.setattr(store, "get_run", few_prompts)
    out = tmp_path / "w.html"
    assert main(["--db", runner.db_path, "report", runner.stored.id, "-o", str(out)]) == 0
    page = out.read_text()
    assert page.count("<tr data-i=") == N and page.count('class="pt-root"') == len(shown)
    assert main(["--db", runner.db_path, "report", "01NOSUCHRUN"]) == 2


def test_the_view_opens_a_workload_without_reading_a_logprob_and_a_row_opens_that_prompt(runner, monkeypatch):
    from parity_ui.ui.history_tab import HistoryTab

    def no_logprobs(*a, **kw):
        raise AssertionError("the view read the logprob samples")

    monkeypatch.setattr(store, "pair_samples", no_logprobs)
    tab = _tab(HistoryTab, runner)
    wv = tab.wview
    shown = wv.show(runner.stored.id)
    assert shown[wv.box].visible and shown[wv.run_id] == runner.stored.id
    assert shown[wv.survival_plot].visible and shown[wv.hist_plot].visible
    assert "<polyline" in shown[wv.survival_plot].value and "<polyline" in shown[wv.hist_plot].value  # inline SVG
    assert shown[wv.table].count("<tr data-i=") == N and runner.stored.workload.headline in shown[wv.card]
    assert shown[wv.resume_btn].visible is False
    assert wv.show("01NOSUCHRUN")[wv.box].visible is False
    opened = tab.open(runner.stored.id)  # the token view waits for a prompt: no run is read whole
    assert "pick a prompt" in opened[tab.view.summary] and opened[tab.view.panes] == ""
    got = wv.open_prompt(runner.stored.id, "7")
    panes = got[tab.view.panes]
    assert 'data-div="5"' in panes and panes.count('class="pt-pane"') == 4  # ref, b, c and the floor
    assert "Prompt 7 of workload" in got[tab.view.summary] and "DIVERGED at token 5" in got[tab.view.summary]
    assert got[tab.view.logprob_plot].visible is False  # the panes first; the figures follow (#33 item 6)
    figs = wv.prompt_figures(runner.stored.id, "7")
    assert figs[tab.view.logprob_plot].visible and figs[tab.view.logprob_plot].value is not None
    # Another side of that prompt, and the hover details a long view fetches, read prompt 7 alone.
    other = tab.switch_view(runner.stored.id, 7, "c")
    assert "data-div" not in other[tab.view.panes].split(">")[0] and 'data-sel="c"' in other[tab.view.panes]
    details = json.loads(tab.pane_details(f"{runner.stored.id}:7"))
    assert set(details["sides"]) == {"ref", "b", "c", "floor"}
    assert "has no stored tokens" in wv.open_prompt(runner.stored.id, "99")[tab.view.summary]


def test_history_lists_a_workload_with_its_headline(runner):
    from parity_ui.ui.history_tab import ID, RESULT, history_rows

    (row,) = [r for r in history_rows(runner.store) if r[ID] == runner.stored.id]
    assert row[RESULT] == f"workload: {runner.stored.workload.headline}"
    assert store.list_runs(runner.db)[0].headline == runner.stored.workload.headline


# -- uploads on the Compare tab ---------------------------------------------------------------------

def _compare(runner):
    from parity_ui.ui.compare_tab import CompareTab, RunGate

    tab = CompareTab(runner, RunGate(runner))
    with gr.Blocks():
        tab.create_ui()
    return tab


def _jsonl(path, n, broken_at=None):
    lines = [json.dumps({"prompt": p.text}) for p in PROMPTS[:n]]
    if broken_at is not None:
        lines.insert(broken_at, "{broken")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_an_uploaded_workload_is_described_before_it_runs_and_its_options_reselect(runner, tmp_path):
    from parity_ui.ui.workload_input import WorkloadPick

    tab = _compare(runner)
    got = tab.upload(_jsonl(tmp_path / "w.jsonl", 12, broken_at=4), WorkloadPick())
    pick = got[tab.workload]
    assert pick.error and "w.jsonl line 5" in pick.error and "on-bad skip" in pick.fix.replace("--", "")
    assert "Workload file refused" in got[tab.prompt_info] and got[tab.file_prompts] is None
    changed = tab.workload_options(pick, "free", "auto", "", None, None, True)  # skip broken lines
    pick = changed[tab.workload]
    assert pick.error is None and pick.prompts == 12 and "1 line skipped" in pick.description
    assert "w.jsonl line 5" in changed[tab.prompt_info] and "Runs as a workload" in changed[tab.prompt_info]
    pick = tab.workload_options(pick, "scored", "none", "", 3, None, True)[tab.workload]
    assert (pick.prompts, pick.mode, pick.floor) == (3, "scored", "none") and "the first 3" in pick.description
    assert "Runs as a workload" in tab.count_tokens("demo", False, "ignored", None, "", pick)
    bad = tab.workload_options(pick, "scored", "none", "", 2.5, None, True)[tab.workload]
    assert "whole number" in bad.fix
    # A Ray cluster the user names: Run starts the workload there (docs/cluster.md); a bad one is refused.
    on = tab.workload_options(pick, "scored", "none", "", 3, None, True, "local", "ref=1,b=2")[tab.workload]
    assert on.error is None and on.options().cluster == "local" and on.options().replicas == {"ref": 1, "b": 2, "*": 1}
    refused = tab.workload_options(on, "scored", "none", "", 3, None, True, "local", "b=zero")
    assert "ref=1,b=4" in refused[tab.workload].fix and "not a count of replicas" in refused[tab.prompt_info]
    assert tab.workload_options(on, "scored", "none", "", 3, None, True, "", "")[tab.workload].options().cluster is None
    one = tab.upload(_jsonl(tmp_path / "one.jsonl", 1), WorkloadPick())[tab.workload]
    assert one.prompts == 1 and not one.is_workload
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"question": [p.text for p in PROMPTS[:5]]}), tmp_path / "w.parquet")
    par = tab.upload(str(tmp_path / "w.parquet"), WorkloadPick())[tab.workload]
    assert par.prompts == 5 and par.is_workload and "field 'question'" in par.description
    (tmp_path / "w.csv").write_text("prompt\nhi\n")
    assert tab.upload(str(tmp_path / "w.csv"), WorkloadPick())[tab.workload].active is False  # not a workload type
    assert tab.clear_file(par)[tab.workload].active is False


def test_a_refused_workload_is_shown_not_stored_and_the_tab_keeps_working(runner, model, tmp_path):
    """A refusal that needs no run is not an ERROR row in History (#33 item 12): the card says why and
    the fix, and nothing is stored."""
    from parity_ui.ui.workload_input import WorkloadPick

    tab = _compare(runner)
    before = len(store.list_runs(runner.db))
    pick = tab.upload(_jsonl(tmp_path / "w.jsonl", 6, broken_at=2), WorkloadPick())[tab.workload]
    cfg = build_config(None, ["max_new_tokens=6"], sides=SIDES[:2]).to_yaml()
    (last,) = list(tab.run(model, False, "", None, cfg, None, pick))
    assert last[tab.run_id] is None and len(store.list_runs(runner.db)) == before
    assert "Not run (nothing stored)" in last[tab.view.summary] and "w.jsonl line 3" in last[tab.view.summary]
    assert "Fix:" in last[tab.view.summary]
    # A config that does not read is refused the same way.
    (bad,) = list(tab.run(model, False, "hi", None, "max_new_tokens: [", None, None))
    assert bad[tab.run_id] is None and "Not run" in bad[tab.view.summary]
    assert len(store.list_runs(runner.db)) == before


def test_a_workload_runs_from_the_compare_tab_with_its_progress_and_opens_in_the_view(runner, model, tmp_path,
                                                                                       monkeypatch):
    from parity_ui.ui import compare_tab
    from parity_ui.ui.workload_input import WorkloadPick

    monkeypatch.setattr(compare_tab, "THROTTLE_S", 0.05)
    # Chunks of 5 prompts (the app runs 64 at a time): progress lines to see in 20 prompts.
    monkeypatch.setattr(WorkloadPick, "options",
                        lambda self: WorkloadOptions(mode=self.mode, floor=self.floor, chunk=5))
    # Every progress line the run makes, as its live view is fed them (issue 46 item 20: the test read
    # the throttled page updates, and passed or failed on which of two wordings one happened to carry).
    from parity_ui.ui.live import WorkloadLive

    lines: list[tuple[int, float | None, str]] = []
    feed = WorkloadLive.feed

    def recording(self, ev):
        if ev.kind == "progress":
            lines.append((ev.prompt_index, ev.fraction, ev.message))
        feed(self, ev)

    monkeypatch.setattr(WorkloadLive, "feed", recording)
    tab = _compare(runner)
    pick = tab.upload(_jsonl(tmp_path / "w.jsonl", 20), WorkloadPick())[tab.workload]
    pick = tab.workload_options(pick, "free", "order", "", None, None, False)[tab.workload]
    cfg = build_config(None, ["max_new_tokens=8", "batch_size=4"], sides=["ref=fake,delay_ms=1", "b=fake,swap_at=3"])
    updates = list(tab.run(model, False, "", None, cfg.to_yaml(), None, pick))
    assert all(set(u) == {tab.progress} for u in updates[1:-1])  # no token panes to send
    # One wording inside a chunk and between chunks; each chunk's calls and its end are told.
    one = re.compile(r"^\d+% of the work, (about .* left|time left: after the first tokens); \d+/20 prompts stored"
                     r"(, [\d.]+ prompts/s)?(; chunk [1-4] of 4: (ref|b|floor) (generating|scoring).*)?$")
    assert lines and all(one.match(m) for _, _, m in lines), [m for _, _, m in lines if not one.match(m)]
    assert [d for d, _, m in lines if "chunk" not in m] == [5, 10, 15, 20]  # each chunk's end, in order
    assert lines[-1][1] == 1.0 and lines[-1][2].startswith("100% of the work") and "20/20 prompts stored" in lines[-1][2]
    last = updates[-1]
    run = store.get_run(runner.db, last[tab.run_id], prompts=[])
    assert run.kind == "workload" and run.status == "diverged" and run.workload.n_prompts == 20
    assert run.workload.floor.change == "order" and run.workload.options.source["path"] == "w.jsonl"
    assert run.workload.options.source["description"] == "all 20 prompts from w.jsonl (field 'prompt')"
    assert "pick a prompt" in last[tab.view.summary].lower()
    shown = tab.wview.revealed(run.id)
    assert 'data-reveal="1"' in shown[tab.wview.card] and shown[tab.wview.table].count("<tr data-i=") == 20


def test_stop_keeps_the_finished_prompts_and_resume_goes_on_from_the_view(runner, model, monkeypatch):
    from parity_ui.ui import workload_view
    from parity_ui.ui.history_tab import HistoryTab

    cfg = build_config(None, ["max_new_tokens=8"], sides=["ref=fake,delay_ms=3", "b=fake,shift=0.1"])

    def stop_after_first_chunk(e):
        if e.kind == "progress" and e.prompt_index == 8:
            runner.cancel()

    run = runner.run(WorkloadRequest(model=model, prompts=list(PROMPTS), config=cfg,
                                              options=WorkloadOptions(chunk=8)), stop_after_first_chunk)
    assert run.status == "cancelled" and 8 <= run.workload.done < N, run.error
    tab = _tab(HistoryTab, runner)
    wv = tab.wview
    shown = wv.show(run.id)
    assert shown[wv.resume_btn].visible and "STOPPED" in shown[wv.card] and "Resume goes on" in shown[wv.card]
    assert shown[wv.table].count("<tr data-i=") == run.workload.done  # every finished prompt, kept
    monkeypatch.setattr(workload_view, "THROTTLE_S", 0.05)
    updates = list(wv.resume(run.id))
    assert updates[0][wv.stop_btn].visible and updates[0][wv.resume_btn].visible is False
    said = [u[wv.progress] for u in updates[1:-1]]
    assert said and all("wl-progress" in p for p in said)
    assert any(re.search(r"resuming run \w+: \d+ of 24 prompts are done", p) for p in said)
    final = updates[-1]
    assert final[wv.resume_btn].visible is False and final[wv.table].count("<tr data-i=") == N
    assert store.get_run(runner.db, run.id, prompts=[]).status == "ok"
    again = list(wv.resume(run.id))[-1]
    assert "Nothing to resume" in again[wv.progress] and "finished every prompt" in again[wv.progress]


def test_the_live_card_shows_prompts_done_and_the_time_left():
    live = WorkloadLive(1000, "all 1,000 prompts from w.jsonl (field 'prompt')")
    live.feed(RunEvent("status", "preparing 1000 prompts"))
    assert "Preparing" in live.progress()
    live.feed(RunEvent("progress", "13% of the work, about 7 min left; 128/1000 prompts stored, 2.10 prompts/s",
                       prompt_index=128))
    html = live.progress()
    assert "13% of the work, about 7 min left; 128/1000 prompts stored, 2.10 prompts/s" in html
    assert 'data-done="128"' in html
    assert "width:13%" in html and "w.jsonl" in html
