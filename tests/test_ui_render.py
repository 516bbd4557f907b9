"""The view code that turns a stored Run into the two token panes, the cards and the plots.

Runs are built by hand here: this is code above the engines, and these tests pin what a person
sees (which chip is marked divergent, whitespace markers, escaping), not engine behaviour.
"""
from __future__ import annotations

import html
import json
import re

import pytest

pytest.importorskip("gradio")
pytest.importorskip("plotly")

from parity_ui.compare import compare_streams  # noqa: E402
from parity_ui.service import RunEvent  # noqa: E402
from parity_ui.types import EngineResult, Finding, ModelInfo, PromptResult, Run, TokenStep, TopLogprob  # noqa: E402
from parity_ui.ui import cards, plots, tokens  # noqa: E402
from parity_ui.ui.live import LiveRun  # noqa: E402
from parity_ui.ui.result_view import view_parts  # noqa: E402


def _step(pos: int, tid: int, text: str, lp: float = -0.5, alt: tuple[int, str] = (999, "alt")) -> TokenStep:
    return TokenStep(position=pos, token_id=tid, text=text, logprob=lp, rank=1,
                     top=[TopLogprob(tid, lp, text), TopLogprob(alt[0], lp - 0.3, alt[1])])


def _engine(name: str, toks: list[tuple[int, str]]) -> EngineResult:
    steps = [_step(i, tid, text) for i, (tid, text) in enumerate(toks)]
    return EngineResult(engine=name, prompt_index=0, token_ids=[s.token_id for s in steps], steps=steps,
                        text="".join(s.text for s in steps), finish_reason="length")


def _run(v: list[tuple[int, str]], h: list[tuple[int, str]], n_prompts: int = 1) -> Run:
    prompts = []
    for i in range(n_prompts):
        ve, he = _engine("vllm", v), _engine("hf", h)
        ve.prompt_index = he.prompt_index = i
        prompts.append(PromptResult(index=i, prompt_text="hi", prompt_token_ids=[1, 2], vllm=ve, hf=he,
                                    comparison=compare_streams(ve, he)))
    run = Run(id="01TESTRUN", created_utc="2026-01-01T00:00:00.000+00:00", model=ModelInfo(name="demo", path="/m"),
              config={"dtype": "bfloat16"}, status="ok", prompts=prompts)
    run.status = "ok" if run.identical else "diverged"
    return run


def _chips(pane_html: str) -> list[tuple[str, str]]:
    """(class, inner html) of every token chip, in order."""
    return re.findall(r'<span class="t ([a-z ]+)">(.*?)</span>', pane_html)


def _panes(page: str) -> dict[str, str]:
    before, after = page.split('data-engine="hf"')
    return {"vllm": before.split('data-engine="vllm"')[1], "hf": after.split('<div class="pt-info">')[0]}


SAME = [(10, "The"), (11, " cat"), (12, " sat")]


def test_divergent_chip_is_marked_at_the_reported_index():
    run = _run(SAME + [(13, " on"), (14, " the")], SAME + [(15, " in"), (14, " the")])
    assert run.first_divergence == 3
    page = view_parts(run)["panes"]
    for name, pane in _panes(page).items():
        classes = [c for c, _ in _chips(pane)]
        assert classes == ["m", "m", "m", "d", "a"], name
    assert 'data-div="3"' in page


def test_identical_streams_have_no_divergence():
    run = _run(SAME, SAME)
    page = view_parts(run)["panes"]
    assert "data-div" not in page
    assert all(c == "m" for pane in _panes(page).values() for c, _ in _chips(pane))
    assert "IDENTICAL" in view_parts(run)["summary"]


def test_shorter_stream_marks_where_it_ended():
    run = _run(SAME + [(13, " on")], SAME)
    page = view_parts(run)["panes"]
    panes = _panes(page)
    assert [c for c, _ in _chips(panes["vllm"])] == ["m", "m", "m", "d"]
    assert "stream ended here" in panes["hf"] and "stream ended here" not in panes["vllm"]


def test_whitespace_is_visible():
    assert tokens.visible_text(" a\tb\n") == "<i>·</i>a<i>→</i>b<i>⏎</i>"
    assert tokens.visible_text("") == "<i>∅</i>"
    assert tokens.visible_text("\x0e") == "<i>\\x0e</i>"
    run = _run([(1, "x\n"), (2, " y")], [(1, "x\n"), (2, " y")])
    pane = _panes(view_parts(run)["panes"])["vllm"]
    assert "x<i>⏎</i></span><br>" in pane  # a newline token also breaks the line


def test_token_text_is_escaped_everywhere():
    evil = "<script>alert(1)</script>"
    run = _run([(66, evil)], [(67, '"><img src=x onerror=alert(2)>')])
    parts = view_parts(run)
    page = parts["panes"] + parts["summary"]
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # The hover details travel as JSON in a text node: escaped there, intact once parsed.
    blob = re.search(r'<div class="pt-json" hidden>(.*?)</div>', page, re.S).group(1)
    data = json.loads(html.unescape(blob))
    assert data["vocab"]["66"] == evil
    assert data["vllm"][0][0] == 66 and data["hf"][0][0] == 67


def test_details_json_holds_both_engines_topk():
    run = _run(SAME, SAME[:2] + [(20, " ran")])
    blob = re.search(r'<div class="pt-json" hidden>(.*?)</div>', view_parts(run)["panes"], re.S).group(1)
    data = json.loads(html.unescape(blob))
    tid, lp, rank, top = data["hf"][2]
    assert (tid, rank) == (20, 1) and lp == pytest.approx(-0.5)
    assert top == [20, -0.5, 999, pytest.approx(-0.8)]
    assert data["vocab"]["999"] == "alt"


def test_16k_tokens_per_engine_render():
    n = 16384
    v = [(i % 500, f" w{i % 500}") for i in range(n)]
    h = list(v)
    h[12000] = (777, " other")
    run = _run(v, h)
    page = view_parts(run)["panes"]
    assert page.count('class="t ') == 2 * n
    assert page.count('<div class="b"') == 2 * (n // tokens.BLOCK)
    assert 'data-div="12000"' in page


def test_summary_card_states_the_divergence_and_run_link():
    run = _run(SAME + [(13, " on")], SAME + [(15, " in")])
    run.prompts[0].explanation = {"verdict": "numerical near-tie", "summary": "a <b>tiny</b> margin"}
    run.warnings = [Finding(code="low-precision", severity="warning", message="bf16", fix="use float32")]
    html_ = view_parts(run)["summary"]
    assert "DIVERGED at token 3" in html_
    assert "numerical near-tie" in html_ and "a &lt;b&gt;tiny&lt;/b&gt; margin" in html_
    assert "low-precision" in html_ and "use float32" in html_
    assert 'href="?run=01TESTRUN"' in html_


def test_error_run_shows_message_and_fix():
    run = _run(SAME, SAME)
    run.status, run.error = "error", "model 'x/y' not found Fix: check the id"
    html_ = cards.run_summary_html(run)
    assert "ERROR" in html_ and "model &#x27;x/y&#x27; not found" in html_ and "<b>Fix:</b> check the id" in html_


def test_plots_mark_the_divergence():
    run = _run(SAME + [(13, " on")], SAME + [(15, " in")])
    p = run.prompts[0]
    fig = plots.logprob_figure(p)
    names = [t.name for t in fig.data]
    assert names == ["vLLM logprob", "HF logprob", "gap vLLM − HF"]
    assert list(fig.data[2].y) == pytest.approx([0.0, 0.0, 0.0])  # gaps only before the divergence
    assert any(s.x0 == 3 for s in fig.layout.shapes)
    margin = plots.margin_figure(p)
    assert list(margin.data[0].y) == pytest.approx([0.3] * 4)
    assert any(s.x0 == 3 for s in margin.layout.shapes)


def test_batch_plot_has_one_bar_per_prompt():
    run = _run(SAME + [(13, " on")], SAME + [(15, " in")], n_prompts=3)
    parts = view_parts(run, prompt_index=2)
    assert parts["batch"] is not None
    assert list(parts["batch"].data[0].y) == [3, 3, 3]
    assert "Prompt 2 of 3" in parts["summary"]


def test_live_view_marks_divergence_as_tokens_arrive():
    live = LiveRun(n_prompts=1, max_new_tokens=8)
    live.feed(RunEvent("status", "loading models (warm workers are reused)"))
    for i, (tid, text) in enumerate(SAME):
        live.feed(RunEvent("token", engine="vllm", prompt_index=0, step=_step(i, tid, text)))
    live.feed(RunEvent("token", engine="hf", prompt_index=0, step=_step(0, 10, "The")))
    live.feed(RunEvent("token", engine="hf", prompt_index=0, step=_step(1, 42, " dog")))
    assert "Loading" in live.progress() and "3 / 8 tokens" in live.progress()
    page = live.panes()
    assert 'data-live="1"' in page and 'data-div="1"' in page
    assert [c for c, _ in _chips(_panes(page)["hf"])] == ["m", "d"]


def test_first_difference_waits_for_a_shorter_stream_while_live():
    assert tokens.first_difference([1, 2, 3], [1, 2], finished=False) is None
    assert tokens.first_difference([1, 2, 3], [1, 2], finished=True) == 2
    assert tokens.first_difference([1, 5], [1, 2], finished=False) == 1
