"""The real app in real headless Chromium, with both real engines on a tiny model.

One app process for the module (engines load once, ~40 s on CPU); the tests run in file order and
share the run the first one makes. The tiny Llama in bf16 diverges from itself across the engines
on this CPU, so there is a divergence to find. Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest_browser import ARTIFACTS, chromium, chromium_available, running_app  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.engines]

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

RUN_TIMEOUT_MS = 200_000


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tiny_models import build_model

    return str(build_model(tmp_path_factory.mktemp("models") / "tiny-llama-bf16", "llama", dtype="bfloat16"))


@pytest.fixture(scope="module")
def app(tmp_path_factory, tiny_model):
    ARTIFACTS.mkdir(exist_ok=True)
    db = tmp_path_factory.mktemp("db") / "runs.db"
    with running_app(db, ARTIFACTS / "browser-app.log") as url:
        yield {"url": url, "db": db, "model": tiny_model}


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def shared():
    return {}


def _shot(page, name: str, selector: str | None = None) -> None:
    if selector:
        page.locator(selector).scroll_into_view_if_needed()
        page.wait_for_timeout(300)  # let content-visibility lay out what just came into view
        page.locator(selector).screenshot(path=str(ARTIFACTS / f"{name}.png"))
    else:
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _stored(app, run_id):
    from parity_ui.store import get_run, open_db

    return get_run(open_db(app["db"]), run_id)


def _divergent_chips(page, root: str) -> dict:
    """Per pane: the index of each chip marked 'd' and whether it is inside the visible pane."""
    return page.evaluate("""(root) => {
        const out = {};
        document.querySelectorAll(root + ' .pt-pane').forEach((pane) => {
            const chips = Array.from(pane.querySelectorAll('.pt-body .t'));
            const body = pane.querySelector('.pt-body').getBoundingClientRect();
            const d = chips.map((c, i) => c.classList.contains('d') ? i : -1).filter((i) => i >= 0);
            const r = d.length ? chips[d[0]].getBoundingClientRect() : null;
            out[pane.dataset.engine] = {d, n: chips.length,
                visible: r ? (r.top >= body.top - 1 && r.bottom <= body.bottom + 1) : null};
        });
        return out;
    }""", root)


def _set_model(page, path: str) -> None:
    box = page.locator("#model-pick input")
    box.click()
    box.fill(path)
    box.press("Enter")
    page.wait_for_selector(f"#model-info:has-text('{path}')", timeout=30_000)


def test_run_streams_and_highlights_the_core_divergence(app, page, shared):
    page.goto(app["url"])
    page.wait_for_selector("#model-info .pc-model", timeout=60_000)  # the demo is preselected
    _shot(page, "01-start")
    _set_model(page, app["model"])
    page.wait_for_selector("#prompt-count:has-text('prompt tokens')", timeout=30_000)
    # Record whether live token panes appeared before the final view (the run takes seconds).
    page.evaluate("""() => { window.__sawLive = 0; new MutationObserver(() => {
        if (document.querySelector('#cmp-panes .pt-root[data-live] .pt-body .t')) window.__sawLive++;
    }).observe(document.body, {childList: true, subtree: true}); }""")
    page.click("#run-btn")
    summary = page.wait_for_selector("#cmp-summary .pc-summary", timeout=RUN_TIMEOUT_MS)
    run_id = summary.get_attribute("data-run")
    run = _stored(app, run_id)
    assert run is not None and run.status == "diverged", run and run.error
    div = run.first_divergence
    assert page.evaluate("window.__sawLive") > 0, "no live tokens were shown while the engines ran"
    assert page.locator(f"#cmp-panes .pt-root[data-div='{div}']").count() == 1
    chips = _divergent_chips(page, "#cmp-panes")
    for engine in ("vllm", "hf"):
        assert chips[engine]["d"] == [div], chips
        assert chips[engine]["visible"], f"{engine}: the divergent chip was not scrolled into view"
        assert chips[engine]["n"] == len(getattr(run.prompts[0], engine).steps)
    assert f"DIVERGED at token {div}" in summary.inner_text()
    # The details box opens on the divergence, with both engines' alternatives.
    info = page.locator("#cmp-panes .pt-info")
    assert f"Position {div}" in info.inner_text() and "first divergence" in info.inner_text()
    assert info.locator("table tr").count() > 2
    # Hovering a token in the identical prefix shows that position.
    page.locator("#cmp-panes [data-engine='hf'] .pt-body .t").nth(0).hover()
    assert "Position 0" in info.inner_text() and "same token in both" in info.inner_text()
    # Plotly draws client-side after the data arrives: wait for it rather than race it.
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 2", timeout=30_000)
    assert page.locator("#cmp-panes ~ * .js-plotly-plot, .js-plotly-plot").count() >= 2
    _shot(page, "02-compare-result")
    _shot(page, "03-token-panes", "#cmp-panes")
    shared["run_id"], shared["div"] = run_id, div


def test_history_reopens_the_same_view(app, page, shared):
    if "run_id" not in shared:
        pytest.skip("needs the run of the first test")
    page.goto(app["url"])
    page.get_by_role("tab", name="History").click()
    row = page.locator("#hist-table [data-testid^='cell-']").filter(has_text=shared["run_id"]).first
    row.wait_for(timeout=30_000)
    row.click()
    page.wait_for_selector(f"#hist-summary .pc-summary[data-run='{shared['run_id']}']", timeout=30_000)
    chips = _divergent_chips(page, "#hist-panes")
    assert chips["vllm"]["d"] == [shared["div"]] and chips["hf"]["d"] == [shared["div"]]
    assert chips["vllm"]["visible"] and chips["hf"]["visible"]
    page.click("#hist-export")
    page.wait_for_selector("a[href*='parity-run-']", timeout=30_000)
    _shot(page, "04-history")


def test_deep_link_opens_the_run(app, page, shared):
    if "run_id" not in shared:
        pytest.skip("needs the run of the first test")
    page.goto(app["url"] + f"?run={shared['run_id']}")
    page.wait_for_selector(f"#hist-summary .pc-summary[data-run='{shared['run_id']}']", timeout=30_000)
    assert page.get_by_role("tab", name="History").get_attribute("aria-selected") == "true"
    assert page.locator(f"#hist-panes .pt-root[data-div='{shared['div']}']").count() == 1
    page.goto(app["url"] + "?run=NOSUCHRUN")
    page.wait_for_selector("#hist-summary .pc-error", timeout=30_000)
    assert "no run with id" in page.locator("#hist-summary").inner_text()
    _shot(page, "05-deep-link-unknown")


def test_bad_config_is_explained_and_the_app_keeps_serving(app, page, shared):
    page.goto(app["url"])
    page.wait_for_selector("#model-info .pc-model", timeout=60_000)
    _set_model(page, app["model"])
    page.get_by_role("tab", name="Config").click()
    # The YAML editor: a wrong type names the key.
    editor = page.locator("#cfg-yaml .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("temperature: hot\n")
    # Validation runs on every keystroke: wait for the error about the finished text, not a
    # passing one about a half-typed line.
    err = page.wait_for_selector("#cfg-error .pc-error:has-text('must be a number')", timeout=30_000)
    assert "temperature" in err.inner_text() and "must be a number" in err.inner_text()
    _shot(page, "06-config-yaml-error")
    # The form: an out-of-range value is flagged next to its field.
    page.keyboard.press("Control+A")
    page.keyboard.type("max_new_tokens: 0\n")
    page.wait_for_selector("#cfg-error:has-text('max_new_tokens')", timeout=30_000)
    field = page.locator(".field-error")
    field.first.wait_for(timeout=30_000)
    assert "from 1 to 131072" in field.first.inner_text()
    _shot(page, "07-config-field-error")
    # Running with it shows a readable error, and stores it.
    page.get_by_role("tab", name="Compare").click()
    page.click("#run-btn")
    card = page.wait_for_selector("#cmp-summary .pc-summary[data-status='error']", timeout=30_000)
    assert "max_new_tokens" in card.inner_text() and "Fix:" in card.inner_text()
    assert _stored(app, card.get_attribute("data-run")).status == "error"
    _shot(page, "08-run-with-bad-config")
    # Fix it through the form and run again: the app still serves, the engines are still warm.
    page.get_by_role("tab", name="Config").click()
    number = page.locator(".field-error input").first
    number.fill("8")
    number.press("Enter")
    page.wait_for_selector(".field-error", state="detached", timeout=30_000)
    page.get_by_role("tab", name="Compare").click()
    page.click("#run-btn")
    card = page.wait_for_selector("#cmp-summary .pc-summary:not([data-status='error'])", timeout=RUN_TIMEOUT_MS)
    run = _stored(app, card.get_attribute("data-run"))
    assert run.status in ("ok", "diverged") and len(run.prompts[0].vllm.steps) == 8
    assert re.search(r"load 0\.00s", page.locator("#cmp-summary").inner_text()), "engines were not reused"
