"""The view code that turns a stored Run into token panes (one per side), the cards and the plots.

Runs are built by hand here: this is code above the engines, and these tests pin what a person
sees (which chip is marked divergent, whitespace and byte markers, escaping, the words of a fix),
not engine behaviour.
"""
from __future__ import annotations

import html
import json
import re

import pytest

pytest.importorskip("gradio")
pytest.importorskip("plotly")

from parity_ui.analysis.compare import compare  # noqa: E402
from parity_ui.render import cards, tokens  # noqa: E402
from parity_ui.render.report import html_report  # noqa: E402
from parity_ui.core.runlog import RunEvent  # noqa: E402
from parity_ui.core.findings import Explanation  # noqa: E402
from parity_ui.core.types import (Finding, ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep,  # noqa: E402
                             TopLogprob)
from parity_ui.ui import plots  # noqa: E402
from parity_ui.ui.live import LiveRun  # noqa: E402
from parity_ui.ui.result_view import view_parts  # noqa: E402


def _step(pos: int, tid: int, text: str, lp: float = -0.5, alt: tuple[int, str] = (999, "alt"),
          raw: str | None = None) -> TokenStep:
    return TokenStep(position=pos, token_id=tid, text=text, logprob=lp, rank=1, raw=raw,
                     top=[TopLogprob(tid, lp, text, raw), TopLogprob(alt[0], lp - 0.3, alt[1])])


def _side(name: str, toks: list[tuple], index: int = 0) -> SideResult:
    steps = [_step(i, *t) for i, t in enumerate(toks)]
    return SideResult(side=name, prompt_index=index, token_ids=[s.token_id for s in steps], steps=steps,
                      text="".join(s.text for s in steps), finish_reason="length")


def _run(streams: dict[str, list[tuple]], n_prompts: int = 1) -> Run:
    """A run whose first stream is the reference."""
    prompts = []
    for i in range(n_prompts):
        results = {name: _side(name, toks, i) for name, toks in streams.items()}
        ref, *others = results.values()
        prompts.append(PromptResult(index=i, prompt_text="hi", prompt_token_ids=[1, 2], results=results,
                                    comparisons=[compare(ref, b) for b in others]))
    names = list(streams)
    run = Run(id="01TESTRUN", created_utc="2026-01-01T00:00:00.000+00:00", model=ModelInfo(name="demo", path="/m"),
              config={"dtype": "bfloat16"}, status="ok", prompts=prompts,
              sides=[SideInfo(name=n, kind="hf" if i == 0 else "vllm", reference=i == 0, dtype="bfloat16",
                              resolved={"cuda_graphs": "off" if n != "graphs" else "on"})
                     for i, n in enumerate(names)], versions={"parity_ui": "0.2.0"})
    run.status = "ok" if run.identical else "diverged"
    return run


def _chips(pane_html: str) -> list[tuple[str, str]]:
    """(class, inner html) of every token chip, in order."""
    return re.findall(r'<span class="t ([a-z ]+)">(.*?)</span>(?!</span>)', pane_html)


def _panes(page: str) -> dict[str, str]:
    parts = re.split(r'<div class="pt-pane" data-side="([^"]+)">', page)
    return {parts[i]: parts[i + 1].split('<div class="pt-info">')[0] for i in range(1, len(parts), 2)}


def _classes(pane: str) -> list[str]:
    return [c.split()[0] for c, _ in _chips(pane)]


SAME = [(10, "The"), (11, " cat"), (12, " sat")]


def test_divergent_chip_is_marked_at_the_reported_index():
    run = _run({"hf": SAME + [(13, " on"), (14, " the")], "vllm": SAME + [(15, " in"), (14, " the")]})
    assert run.first_divergence == 3
    page = view_parts(run)["panes"]
    panes = _panes(page)
    assert list(panes) == ["hf", "vllm"]  # the reference first
    for name, pane in panes.items():
        assert _classes(pane) == ["m", "m", "m", "d", "a"], name
    assert 'data-div="3"' in page and 'data-sel="vllm"' in page
    assert "reference" in panes["hf"].split('<div class="pt-body">')[0]


def test_three_sides_each_marked_against_the_reference():
    run = _run({"ref": SAME + [(13, " on")], "same": SAME + [(13, " on")], "other": SAME[:1] + [(40, " dog"), (12, " sat"), (13, " on")]})
    parts = view_parts(run)
    panes = _panes(parts["panes"])
    assert list(panes) == ["ref", "same", "other"]
    assert _classes(panes["same"]) == ["m", "m", "m", "m"]
    assert _classes(panes["other"]) == ["m", "d", "a", "a"]
    assert _classes(panes["ref"]) == ["m", "d", "a", "a"]  # marked against the side that diverged
    assert parts["side"] == "other" and 'style="--n:3"' in parts["panes"]
    picked = view_parts(run, side="same")  # the reference against the other side
    assert _classes(_panes(picked["panes"])["ref"]) == ["m", "m", "m", "m"]
    assert "same vs ref" in picked["logprob"].layout.title.text


def test_identical_streams_have_no_divergence():
    run = _run({"hf": SAME, "vllm": SAME})
    page = view_parts(run)["panes"]
    assert "data-div" not in page
    assert all(c == "m" for pane in _panes(page).values() for c in _classes(pane))
    assert "IDENTICAL" in view_parts(run)["summary"]


def test_shorter_stream_marks_where_it_ended():
    run = _run({"hf": SAME, "vllm": SAME + [(13, " on")]})
    panes = _panes(view_parts(run)["panes"])
    assert _classes(panes["vllm"]) == ["m", "m", "m", "d"]
    assert "stream ended here" in panes["hf"] and "stream ended here" not in panes["vllm"]


def test_whitespace_is_visible():
    assert tokens.visible_text(" a\tb\n") == "<i>·</i>a<i>→</i>b<i>⏎</i>"
    assert tokens.visible_text("") == "<i>∅</i>"
    assert tokens.visible_text("\x0e") == "<i>\\x0e</i>"
    run = _run({"hf": [(1, "x\n"), (2, " y")], "vllm": [(1, "x\n"), (2, " y")]})
    pane = _panes(view_parts(run)["panes"])["vllm"]
    assert "x<i>⏎</i></span><br>" in pane  # a newline token also breaks the line


def test_byte_tokens_carry_their_bytes_and_a_toggle_shows_them():
    lossy = [(10, "The"), (300, "\ufffd", -0.5, (999, "alt"), "e2"), (301, "\ufffd", -0.5, (999, "alt"), "80a2")]
    run = _run({"hf": lossy, "vllm": lossy})
    page = view_parts(run)["panes"]
    assert 'class="pt-bytes-cb"' in page  # the toggle appears when there are byte tokens
    assert '<span class="t m r"><span class="tx">\ufffd</span><b class="x">e2</b></span>' in page
    assert '<b class="x">80 a2</b>' in page
    blob = re.search(r'<div class="pt-json" hidden>(.*?)</div>', page, re.S).group(1)
    assert json.loads(html.unescape(blob))["raw"] == {"300": "e2", "301": "80a2"}
    plain = view_parts(_run({"hf": SAME, "vllm": SAME}))["panes"]
    assert "pt-bytes-cb" not in plain


def test_token_text_is_escaped_everywhere():
    evil = "<script>alert(1)</script>"
    run = _run({"hf": [(66, evil)], "vllm": [(67, '"><img src=x onerror=alert(2)>')]})
    parts = view_parts(run)
    page = parts["panes"] + parts["summary"]
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # The hover details travel as JSON in a text node: escaped there, intact once parsed.
    blob = re.search(r'<div class="pt-json" hidden>(.*?)</div>', page, re.S).group(1)
    data = json.loads(html.unescape(blob))
    assert data["vocab"]["66"] == evil
    assert data["steps"]["hf"][0][0] == 66 and data["steps"]["vllm"][0][0] == 67


def test_details_json_holds_every_sides_topk():
    run = _run({"hf": SAME, "vllm": SAME[:2] + [(20, " ran")]})
    blob = re.search(r'<div class="pt-json" hidden>(.*?)</div>', view_parts(run)["panes"], re.S).group(1)
    data = json.loads(html.unescape(blob))
    assert data["sides"] == ["hf", "vllm"]
    tid, lp, rank, top = data["steps"]["vllm"][2]
    assert (tid, rank) == (20, 1) and lp == pytest.approx(-0.5)
    assert top == [20, -0.5, 999, pytest.approx(-0.8)]
    assert data["vocab"]["999"] == "alt"


LONG = 16384


def _long_run() -> Run:
    """LONG tokens per side, the sides parting at 12000 (' other', id 777)."""
    v = [(i % 500, f" w{i % 500}") for i in range(LONG)]
    h = list(v)
    h[12000] = (777, " other")
    return _run({"hf": v, "vllm": h})


def test_16k_tokens_per_side_render():
    n = LONG
    run = _long_run()
    page = view_parts(run)["panes"]
    # Every block is there, but only those around the divergence are built on the server: the page
    # script builds the rest from the details JSON as they scroll near (a small DOM at 16k).
    assert page.count('<div class="b"') == 2 * (n // tokens.BLOCK)
    built = 2 * (2 * tokens.NEAR + 1) * tokens.BLOCK
    assert page.count('class="t ') == built
    assert page.count('data-lazy="1"') == 2 * (n // tokens.BLOCK) - 2 * (2 * tokens.NEAR + 1)
    div_block = f'<div class="b" data-o="{12000 // tokens.BLOCK * tokens.BLOCK}">'
    assert page.count(div_block) == 2  # the divergence's block is built in both panes
    assert 'data-div="12000"' in page
    assert '"vocab"' in page and page.count("w499") >= 1  # what the script builds from


def test_a_long_stored_view_inlines_only_the_built_positions_and_serves_the_rest_on_request():
    import gradio as gr

    from parity_ui.ui.result_view import pane_details

    n = LONG
    run = _long_run()
    page = view_parts(run)["panes"]
    assert f'data-src="{run.id}:0"' in page
    inline = json.loads(html.unescape(re.search(r'<div class="pt-json" hidden>(.*?)</div>', page, re.S).group(1)))
    lo = (12000 // tokens.BLOCK - tokens.NEAR) * tokens.BLOCK
    assert inline["off"] == lo and inline["len"] == {"hf": n, "vllm": n}
    assert len(inline["steps"]["vllm"]) == (2 * tokens.NEAR + 1) * tokens.BLOCK
    assert inline["steps"]["vllm"][12000 - lo][0] == 777  # the divergence's own row is inline
    full = json.loads(pane_details(lambda rid: run if rid == run.id else None, f"{run.id}:0"))
    assert "off" not in full and len(full["steps"]["hf"]) == n and full["steps"]["vllm"][12000][0] == 777
    for bad in (f"{run.id}:1", f"{run.id}:x", "nope:0", ""):
        with pytest.raises(gr.Error, match="no stored view"):
            pane_details(lambda rid: run if rid == run.id else None, bad)


def test_a_live_or_short_view_keeps_every_detail_inline():
    n = 4096
    v = [(i % 50, f" w{i % 50}") for i in range(n)]
    streams = [tokens.Stream("hf", "hf", _run({"hf": v, "vllm": v}).prompts[0].results["hf"].steps)]
    live = tokens.panes_html(streams * 2, live=True, details_src="r:0")
    assert "data-src" not in live and '"off"' not in live
    short = view_parts(_run({"hf": v[:100], "vllm": v[:100]}))["panes"]
    assert "data-src" not in short


def test_short_panes_are_built_whole():
    v = [(i % 50, f" w{i % 50}") for i in range(tokens.LAZY_OVER)]
    page = view_parts(_run({"hf": v, "vllm": list(v)}))["panes"]
    assert page.count('class="t ') == 2 * tokens.LAZY_OVER and "data-lazy" not in page


def test_a_view_opened_at_a_token_marks_it_in_every_pane_and_builds_its_blocks():
    """A replay's worst token opens the view there (workload_view.open_prompt: "12@5"): its chip marked
    in every pane, the legend saying so, the page told where to open, and in a long pane the blocks
    around it built, not those around the divergence."""
    from parity_ui.ui.result_view import pane_parts

    n = tokens.LAZY_OVER * 4
    v = [(i % 50, f" w{i % 50}") for i in range(n)]
    run = _run({"hf": v, "vllm": v[:5] + [(777, " x")] + v[6:]})  # diverges at 5
    at = n - 10
    page = pane_parts(run, focus=at)["panes"]
    assert f'data-focus="{at}"' in page and "opened token" in page
    assert len(re.findall(r'class="t [a-z]+ f"', page)) == 2  # the chip at `at`, in both panes
    chips = re.findall(r'<div class="b" data-o="(\d+)">', page)
    assert at // tokens.BLOCK * tokens.BLOCK in map(int, chips) and 0 not in map(int, chips)
    plain = pane_parts(run)["panes"]
    assert "data-focus" not in plain and not re.findall(r'class="t [a-z]+ f"', plain) and "opened token" not in plain


def test_summary_card_states_each_divergence_the_settings_and_the_run_link():
    run = _run({"hf": SAME + [(13, " on")], "graphs": SAME + [(15, " in")]})
    run.prompts[0].comparisons[0].explanation = Explanation(verdict="numerical near-tie", summary="a <b>tiny</b> margin")
    run.warnings = [Finding(code="low-precision", severity="warning", message="bf16", fix="see if it is numerical",
                            setting={"key": "dtype", "value": "float32"}),
                    Finding(code="prefix-caching", severity="warning", message="on", fix="turn it off",
                            setting={"key": "graphs.enable_prefix_caching", "value": False}, side="graphs")]
    html_ = view_parts(run, reveal=True)["summary"]
    assert "DIVERGED at token 3" in html_ and "<b>graphs</b> vs <b>hf</b>" in html_
    assert "numerical near-tie" in html_ and "a &lt;b&gt;tiny&lt;/b&gt; margin" in html_
    # Fixes in the app name the control to change, never a CLI flag.
    assert "Config tab: dtype = float32" in html_ and "--set" not in html_
    assert "Sides panel: side graphs, option enable_prefix_caching = false" in html_
    assert 'href="?run=01TESTRUN"' in html_ and 'data-reveal="1"' in html_
    assert '<tr class="diff"><th>CUDA graphs</th><td>off</td><td>on</td></tr>' in html_


def test_error_run_shows_message_and_fix():
    run = _run({"hf": SAME, "vllm": SAME})
    run.status, run.error = "error", "model 'x/y' not found Fix: check the id"
    html_ = cards.run_summary_html(run)
    assert "ERROR" in html_ and "model &#x27;x/y&#x27; not found" in html_ and "<b>Fix:</b> check the id" in html_


def test_interrupted_run_says_so():
    run = _run({"hf": SAME, "vllm": SAME[:1]})
    run.status, run.error = "interrupted", "interrupted: the process that ran it (pid 7) ended"
    html_ = cards.run_summary_html(run)
    assert "INTERRUPTED" in html_ and "Run interrupted" in html_ and "pid 7" in html_


def test_plots_mark_the_divergence():
    run = _run({"hf": SAME + [(13, " on")], "vllm": SAME + [(15, " in")]})
    p = run.prompts[0]
    c = p.comparisons[0]
    fig = plots.logprob_figure(c, p.results["hf"], p.results["vllm"])
    assert [t.name for t in fig.data] == ["hf logprob", "vllm logprob", "gap vllm − hf"]
    assert list(fig.data[2].y) == pytest.approx([0.0, 0.0, 0.0])  # gaps only before the divergence
    assert any(s.x0 == 3 for s in fig.layout.shapes)
    margin = plots.margin_figure(c, p.results["hf"], p.results["vllm"])
    assert list(margin.data[0].y) == pytest.approx([0.3] * 4)
    assert any(s.x0 == 3 for s in margin.layout.shapes)


def test_long_traces_are_thinned_to_real_points_keeping_the_extremes():
    import numpy as np

    n = 16384
    x = np.arange(n)
    lp = np.full(n, -0.5)
    lp[9999], lp[5] = -40.0, np.nan  # one deep dip, one missing logprob
    xs, ys = plots.thin(x, lp, "min")
    assert len(xs) <= plots.MAX_POINTS and 9999 in xs and ys.min() == -40.0
    assert np.all(np.diff(xs) > 0) and np.all(lp[xs][~np.isnan(ys)] == ys[~np.isnan(ys)])  # real pairs, in order
    gap = np.full(n, 1e-4)
    gap[1234] = -2.0  # a spike below zero still counts by its magnitude
    xs, ys = plots.thin(x, gap, "absmax")
    assert 1234 in xs and ys.min() == -2.0
    short = np.array([0.1234567891, -1.0])
    assert list(plots.thin(np.arange(2), short, "min")[0]) == [0, 1]  # short traces keep every point


def test_batch_plot_has_one_bar_per_prompt_and_side():
    run = _run({"hf": SAME + [(13, " on")], "a": SAME + [(15, " in")], "b": SAME + [(13, " on")]}, n_prompts=3)
    parts = view_parts(run, prompt_index=2)
    assert [t.name for t in parts["batch"].data] == ["a", "b"]
    assert list(parts["batch"].data[0].y) == [3, 3, 3] and list(parts["batch"].data[1].y) == [4, 4, 4]
    assert "Prompt 2 of 3" in parts["summary"]


def test_live_view_marks_divergence_as_tokens_arrive():
    live = LiveRun(["hf", "vllm"], n_prompts=1, max_new_tokens=8)
    live.feed(RunEvent("status", "loading hf, vllm (warm sides are reused)"))
    for i, (tid, text) in enumerate(SAME):
        live.feed(RunEvent("token", side="hf", prompt_index=0, step=_step(i, tid, text)))
    live.feed(RunEvent("token", side="vllm", prompt_index=0, step=_step(0, 10, "The")))
    live.feed(RunEvent("token", side="vllm", prompt_index=0, step=_step(1, 42, " dog")))
    assert "Starting the sides" in live.progress() and "3 / 8 tokens" in live.progress()
    page = live.panes()
    assert 'data-live="1"' in page and 'data-div="1"' in page
    assert _classes(_panes(page)["vllm"]) == ["m", "d"]


def test_first_difference_waits_for_a_shorter_stream_while_live():
    assert tokens.first_difference([1, 2, 3], [1, 2], finished=False) is None
    assert tokens.first_difference([1, 2, 3], [1, 2], finished=True) == 2
    assert tokens.first_difference([1, 5], [1, 2], finished=False) == 1


def test_static_report_is_one_self_contained_page():
    run = _run({"hf": SAME + [(13, " on")], "vllm": SAME + [(15, " in")]})
    page = html_report(run)
    assert page.startswith("<!doctype html>") and "parity-ui run 01TESTRUN" in page
    assert 'data-side="vllm"' in page and "<script>" in page and "resolved settings" in page
    assert 'src="http' not in page and 'href="http' not in page


def test_history_reads_a_finished_run_once_and_a_running_one_every_time(tmp_path):
    from types import SimpleNamespace

    from parity_ui.store import Store
    from parity_ui.store.runs import open_db, save_run
    from parity_ui.ui.history_tab import HistoryTab

    db = open_db(tmp_path / "runs.db")
    tab = HistoryTab(SimpleNamespace(db=db, reader=Store(db)))
    runs = []
    for i, status in enumerate(["diverged", "ok", "ok", "running"]):
        run = _run({"hf": SAME + [(13, " on")], "vllm": SAME + [(15, " in")]})
        run.id, run.status = f"01RUN{i}", status
        save_run(db, run)
        runs.append(run)
    first = tab._load("01RUN0")
    assert first is not None and first.status == "diverged"
    assert tab._load(" 01RUN0 ") is first  # the view, its details fetch, a switch: one read
    tab._load("01RUN1"), tab._load("01RUN2")
    assert tab._load("01RUN0") is not first  # only the last RECENT finished runs are kept
    assert tab._load("01RUN3") is not tab._load("01RUN3")  # a running run changes: read afresh
    assert tab._load("../etc") is None and tab._load("01NOPE") is None


def test_history_reads_the_newest_listed_run_ahead_once_and_stands_down_for_an_open(tmp_path, monkeypatch):
    import threading
    import time

    import gradio as gr

    from parity_ui.store import Store
    from parity_ui.store import runs as store
    from parity_ui.ui import result_view
    from parity_ui.ui.history_tab import HistoryTab

    db = store.open_db(tmp_path / "runs.db")
    old, new = _run({"hf": [(1, "a"), (2, "b")], "vllm": [(1, "a"), (3, "c")]}), _long_run()
    old.id, old.created_utc, new.id = "01OLDRUN", "2025-12-31T00:00:00.000+00:00", "01NEWRUN"
    store.save_run(db, old)
    store.save_run(db, new)
    reads = []
    real_get_run = store.get_run

    def counting_get_run(d, run_id, prompts=None):
        reads.append(run_id)
        time.sleep(0.3)  # a long read: an open arriving meanwhile must wait for it, not read again
        return real_get_run(d, run_id, prompts)

    monkeypatch.setattr(store, "get_run", counting_get_run)  # the store's read, whoever calls it
    builds, figures = [], []
    real_pane_parts, real_plot_parts = result_view.pane_parts, result_view.plot_parts

    def counting_pane_parts(run, *a, **kw):
        builds.append(run.id)
        return real_pane_parts(run, *a, **kw)

    def counting_plot_parts(run, *a, **kw):
        figures.append(run.id)
        return real_plot_parts(run, *a, **kw)

    monkeypatch.setattr(result_view, "pane_parts", counting_pane_parts)
    monkeypatch.setattr(result_view, "plot_parts", counting_plot_parts)
    tab = HistoryTab(type("Service", (), {"db": db, "reader": Store(db)})())
    with gr.Blocks():
        tab.create_ui()
    tab.PREFETCH_AFTER_S = 0.0

    tab.refresh("", None, None, "any time")  # lists both, newest first: reads 01NEWRUN ahead
    time.sleep(0.1)
    opened = tab.open("01NEWRUN")  # arrives during the read ahead
    assert reads == ["01NEWRUN"]  # read once, by the read ahead
    assert "01NEWRUN:0" in opened[tab.view.panes]  # the panes of that run
    for t in [t for t in threading.enumerate() if t.name == "parity-prefetch"]:
        t.join(5)
    assert builds == ["01NEWRUN"]  # its view was built once, by whichever came first, and kept
    assert tab.view.parts(tab._load("01NEWRUN")) is tab.view.built.peek(("01NEWRUN", 0, None, False))
    assert builds == ["01NEWRUN"]
    # The open sent no figures: they follow in their own event, built once and kept, whichever
    # side name (None: the one that diverged first) asks for them.
    assert opened[tab.view.logprob_plot].visible is False and opened[tab.view.margin_plot].visible is False
    figures_sent = tab.figures("01NEWRUN", 0, None)
    logprob, margin = figures_sent[tab.view.logprob_plot], figures_sent[tab.view.margin_plot]
    assert logprob.visible and margin.visible and logprob.value is not None
    assert tab.figures("01NEWRUN", 0, "vllm")[tab.view.logprob_plot].value == logprob.value
    assert figures == ["01NEWRUN"]

    # Right after an open, a new list reads nothing ahead: that open's page is still being built.
    tab._recent.clear()
    tab.refresh("", None, None, "any time")
    for t in [t for t in threading.enumerate() if t.name == "parity-prefetch"]:
        t.join(5)
    assert reads == ["01NEWRUN"]


# --- the app's handlers and wiring (built, not launched) ------------------------------------


@pytest.fixture(scope="module")
def built_app(tmp_path_factory):
    from parity_ui.ui.app import create_app
    from parity_ui.ui.runner import AppService

    runner = AppService(str(tmp_path_factory.mktemp("app") / "runs.db"))
    yield create_app(runner)
    runner.close()


def test_no_text_field_reaches_the_server_on_every_key(built_app):
    """Typing runs no server handler: a text field is read when it is left (or on Enter); per key only
    the page's own edit counter moves. Per-keystroke round trips queued up on a busy machine."""
    types = {c["id"]: c["type"] for c in built_app.config["components"]}
    per_key = [(d["api_name"], types.get(t), event) for d in built_app.config["dependencies"] if d["backend_fn"]
               for t, event in d["targets"] if event in ("input", "change", "key_up")
               and types.get(t) in ("textbox", "code", "number")]
    assert per_key == []
    counted = [d for d in built_app.config["dependencies"] if not d["backend_fn"] and d["js"]
               and any(types.get(t) == "textbox" and e == "input" for t, e in d["targets"])]
    assert counted, "the slots' keystrokes are no longer counted in the page"
    left = {(types.get(t), e) for d in built_app.config["dependencies"] if d["backend_fn"] for t, e in d["targets"]}
    assert {("textbox", "blur"), ("textbox", "submit"), ("code", "blur"), ("number", "blur")} <= left


def test_the_api_keeps_its_endpoints_and_their_outputs(built_app):
    """API clients (gradio_client, the browser tests) see the same endpoints, inputs and outputs,
    whatever the handlers return inside."""
    eps = built_app.get_api_info()["named_endpoints"]
    assert sorted(eps) == ["/add_side", "/apply_preset", "/audit", "/compare_runs", "/count_tokens", "/describe_model",
                           "/export_run", "/history",
                           "/load_config", "/open_run", "/report_run", "/reset_config", "/run", "/save_config",
                           "/sides_preset", "/stop", "/upload_prompts", "/validate_config"]

    def shape(name):
        return ([p["parameter_name"] for p in eps[name]["parameters"]], [r["component"] for r in eps[name]["returns"]])

    # ... then the op map's (issue 42), appended: its checkbox and window, the heatmap and a clicked cell
    view = ["Html", "Dropdown", "Dropdown", "Html", "Plot", "Plot", "Plot", "Html", "Plot",
            "Checkbox", "Textbox", "Plot", "Html"]
    assert shape("/compare_runs") == (["a", "b"], ["Html"])  # two stored runs side by side (#33 item 12)
    assert shape("/run") == (["model", "trust", "prompt", "cfg_text", "images"], ["Html", *view])
    assert shape("/open_run") == (["run_id"], view)
    assert shape("/count_tokens") == (["model", "trust", "prompt", "cfg_text"], ["Html"])
    # the form; routes appended last (issue 46 item 12): the earlier outputs keep their places
    form = ["Dropdown", "Number", "Number", "Number", "Number", "Number", "Number", "Number", "Number", "Checkbox",
            "Dropdown"]
    assert shape("/validate_config") == (["text", "model", "trust"], ["Html", "Html", "Html", *form])
    assert shape("/upload_prompts") == (["path"], ["Html"])
    slots = ["Textbox", "Dropdown", "Textbox", "Textbox", "Textbox"] * 4
    assert shape("/add_side")[1] == ["Code", *slots]


def test_an_open_in_history_is_one_event_and_no_event_touches_the_tabs(built_app):
    """#33 item 6: Gradio's page runs the listeners of one click one after the other (a round trip and
    a redraw each), and on every status message of every event it walks each component any event
    has touched so far, a container with its whole subtree. So an open in History is ONE backend
    event (the token view, the workload view and Which setting? together, its figures chained after
    it), and no backend event has the Tabs (the whole app below them) among its inputs or outputs."""
    cfg = built_app.config
    comps = {c["id"]: c for c in cfg["components"]}
    by_elem = {c["props"].get("elem_id"): i for i, c in comps.items() if c["props"].get("elem_id")}
    backend = [d for d in cfg["dependencies"] if d["backend_fn"]]
    on_open = [d for d in backend if [by_elem["hist-open"], "click"] in [list(t) for t in d["targets"]]]
    assert len(on_open) == 1, [d["api_name"] for d in on_open]
    outs = set(on_open[0]["outputs"])
    assert {by_elem["hist-wl"], by_elem["hist-ws"], by_elem["hist-panes"], by_elem["hist-wl-prompts"]} <= outs
    touched = {i for d in backend for i in (*d["inputs"], *d["outputs"])}
    assert not [comps[i]["type"] for i in touched if comps[i]["type"] in ("tabs", "tabitem")]
    # A row of a workload's prompt table opens its token view with one event too (its figures after it).
    assert len([d for d in backend if [by_elem["hist-wl-open"], "click"] in [list(t) for t in d["targets"]]]) == 1


def _sides_panel():
    import gradio as gr

    from parity_ui.ui.sides_panel import SidesPanel

    panel = SidesPanel()
    with gr.Blocks():
        panel.create_ui()
        yaml_box = gr.Code(language="yaml")
        panel.create_event_handlers(yaml_box, lambda event: None)
    return panel


def _slot_values(sides):
    from parity_ui.ui.sides_panel import slots_from_sides

    return slots_from_sides(sides)


def test_a_sides_slot_writes_the_yaml_when_left_and_only_after_an_edit():
    import gradio as gr

    from parity_ui.ui.config_tab import default_yaml
    from parity_ui.ui.sides_panel import agreed, sides_in_yaml

    panel = _sides_panel()
    text = default_yaml() + "# my note\n"
    drawn = agreed(sides_in_yaml(text))
    count, values = _slot_values([{"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm"}])
    # Left without an edit: nothing is written (the YAML keeps its comment), nothing else changes.
    assert panel.flush(None, text, drawn, 3, count, *values) == {panel.error: ""}
    values[7] = "dtype=float32"  # side 2's options, pasted: the page's count of it may not be in yet
    out = panel.flush(None, text, drawn, 3, count, *values)
    assert "dtype: float32" in out[panel.yaml] and out[panel.error] == ""
    assert out[panel.drawn] == agreed(sides_in_yaml(out[panel.yaml]))  # the slots and the YAML agree again
    values[5] = ""  # side 2's name, cleared: the error box says so and the YAML is left as it was
    out = panel.flush(None, text, out[panel.drawn], 4, count, *values)
    assert panel.yaml not in out and panel.drawn not in out and "has no name" in out[panel.error]


def test_run_takes_the_slots_as_they_are_at_the_click():
    """Issue 46 item 1: whether the slots hold edits the YAML has not had is told by their content
    (against the sides they last agreed on), not by a count of edits that lags the click."""
    import gradio as gr

    from parity_ui.ui.config_tab import config_from_text, default_yaml
    from parity_ui.ui.sides_panel import agreed, sides_in_yaml

    panel = _sides_panel()
    text = default_yaml()
    drawn = agreed(sides_in_yaml(text))
    count, values = _slot_values([{"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm"}])
    assert panel.commit(text, drawn, 0, count, *values) == gr.skip()  # nothing edited: the YAML stands
    values[5], values[7] = "fp32", "dtype=float32"  # renamed, then options pasted, Run clicked at once
    out = panel.commit(text, drawn, 0, count, *values)  # the page had counted no edit yet
    assert config_from_text(out[panel.yaml]).side("fp32").options.dtype == "float32"
    assert out[panel.drawn] == agreed(sides_in_yaml(out[panel.yaml]))
    # The rename alone reached the YAML first (its write landed), the paste did not: still written.
    renamed = panel.flush(None, text, drawn, 1, count, *[*values[:7], "", *values[8:]])
    out = panel.commit(renamed[panel.yaml], renamed[panel.drawn], 1, count, *values)
    assert config_from_text(out[panel.yaml]).side("fp32").options.dtype == "float32"
    values[5] = ""
    with pytest.raises(gr.Error, match="has no name"):
        panel.commit(text, drawn, 2, count, *values)  # no run with the old sides while the panel says otherwise
    # The YAML edited in the Config tab while the slots are unedited: the YAML stands (its redraw of
    # the slots may still be on its way), and the redraw notes its sides as agreed.
    edited = text.replace("kind: vllm", "kind: hf")
    count, values = _slot_values([{"name": "hf", "kind": "hf"}, {"name": "vllm", "kind": "vllm"}])
    assert panel.commit(edited, drawn, 3, count, *values) == gr.skip()
    redrawn = panel.from_yaml(edited)
    assert redrawn[panel.drawn] == agreed(sides_in_yaml(edited)) and redrawn[panel.slots[6]] == "hf"


def test_the_form_writes_the_yaml_only_when_a_value_differs(tmp_path):
    import gradio as gr

    from parity_ui.ui.config_tab import ConfigTab, default_yaml
    from parity_ui.ui.runner import AppService

    runner = AppService(str(tmp_path / "runs.db"))
    tab = ConfigTab(runner)
    with gr.Blocks():
        tab.create_ui()
        model, trust, line = gr.Textbox(), gr.Checkbox(), gr.HTML()
        tab.create_event_handlers(model, trust, line)
    text = default_yaml() + "# kept\n"
    values = [comp.value for comp in tab.field_list]
    assert tab.form_changed(text, "demo", False, *values) == gr.skip()  # a field left unedited
    values[1] = 8  # max_new_tokens, whatever the page had counted of the edit
    out = tab.form_changed(text, "demo", False, *values)
    assert "max_new_tokens: 8" in out[tab.yaml]
    assert "max_new_tokens 8" in out[line]
    runner.close()


def test_the_app_says_where_its_defaults_differ_from_a_bare_cli_run():
    from parity_ui.cli import _config, build_parser
    from parity_ui.core.config import build_config
    from parity_ui.ui.config_tab import (APP_DEFAULTS, CLI_FLAGS, app_defaults_note, config_from_text,
                                         config_summary_html, default_yaml)

    app, cli = config_from_text(default_yaml()).to_dict(), build_config().to_dict()
    # Every difference is declared (and so said on the page); nothing else differs.
    assert {k for k in app if app[k] != cli[k]} == set(APP_DEFAULTS) == {"chat"}
    line = config_summary_html(config_from_text(default_yaml()))
    assert "chat template on <i>(the CLI&#x27;s default is off: --chat)</i>" in line
    assert app_defaults_note() == ('<div class="pc-cfgline">The app starts from the CLI&#x27;s defaults, except: '
                                   'chat template on (the CLI&#x27;s default is off: --chat).</div>')
    assert "CLI" not in config_summary_html(build_config())  # a config like the CLI's: nothing to say
    # The flags named give a CLI run the app's values.
    args = build_parser().parse_args(["compare", "--model", "m", "--prompt", "p", *CLI_FLAGS.values()])
    assert {k: _config(args).to_dict()[k] for k in APP_DEFAULTS} == APP_DEFAULTS


def test_a_running_compare_sends_only_what_changed(monkeypatch, tmp_path):
    """While tokens stream, each update sets the progress and the panes only (the rest is left as it
    is); the end sets the whole view and the run id."""
    import gradio as gr

    from parity_ui.ui import compare_tab
    from parity_ui.ui.compare_tab import CompareTab, RunGate

    from types import SimpleNamespace

    from parity_ui.store import Store

    service = SimpleNamespace(reader=Store.open(tmp_path / "runs.db"))
    tab = CompareTab(service, RunGate(service))
    with gr.Blocks():
        tab.create_ui()
    monkeypatch.setattr(compare_tab, "THROTTLE_S", 0.0)
    run = _run({"hf": SAME, "vllm": SAME})
    def work(emit):
        emit(RunEvent("token", side="hf", prompt_index=0, step=_step(0, 10, "The")))
        return run

    active, events = tab.gate.launch("s", "a comparison", LiveRun(["hf", "vllm"], 1, 8), work)
    first, *streaming, last = list(tab._stream(active, events))
    assert tab.run_id not in first and first[tab.view.panes] == "" and tab.progress in first
    assert streaming and all(set(u) == {tab.progress, tab.view.panes} for u in streaming)
    assert 'data-live="1"' in streaming[-1][tab.view.panes]
    assert last[tab.run_id] == run.id and last[tab.progress] == "" and set(tab.view.outputs) <= set(last)
    assert "IDENTICAL" in last[tab.view.summary]


def test_a_side_whose_worker_was_reused_reads_warm_not_a_zero_second_load():
    """Found walking the app: a second run on warm workers listed "load 0.0s" for both sides."""
    from parity_ui.render.cards import sides_html
    from parity_ui.render.report import format_summary

    run = Run(id="r", created_utc="", status="ok", model=ModelInfo(name="m", path="/m"), config={},
              sides=[SideInfo(name="hf", kind="hf", reference=True, load_s=0.0),
                     SideInfo(name="vllm", kind="vllm", load_s=12.34)])
    html = sides_html(run)
    assert "<td>warm</td>" in html and "<td>12.3s</td>" in html and "0.0s" not in html
    text = format_summary(run, prompts=False)
    assert "load warm (loaded before)" in text and "load 12.34s" in text
