"""What a user types or uploads in the app, in real headless Chromium (the app with the fake engine
kinds, tests/fake_app.py, on a fresh database): nothing typed is lost (#33 item 8), and bad input
gets a card naming the problem and the fix, Run refuses while the page shows it, and the card goes
once it is fixed (#33 item 13). Meant to pass on a machine whose cores are busy with other work."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium, chromium_available, running_app  # noqa: E402

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 180_000  # a page of the app loaded, on a machine whose cores are busy with other work
REPLY_MS = 90_000  # a server round trip's result on the page
FAKE_APP = Path(__file__).resolve().parents[1] / "fake_app.py"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    ARTIFACTS.mkdir(exist_ok=True)
    db = tmp_path_factory.mktemp("db") / "runs.db"
    with running_app(db, ARTIFACTS / "browser-inputs.log", script=FAKE_APP) as url:
        yield {"url": url, "db": db}


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, app):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(PAGE_MS)
    pg.goto(app["url"])
    pg.wait_for_selector("#model-info .pc-model", timeout=PAGE_MS)
    yield pg
    ctx.close()


def _yaml_text(page) -> str:
    """The Config tab's YAML as the editor holds it."""
    return page.evaluate("() => { const v = document.querySelector('#cfg-yaml .cm-content');"
                         " return v ? Array.from(v.querySelectorAll('.cm-line')).map((l) => l.textContent).join('\\n') : ''; }")


def test_an_option_typed_right_after_renaming_a_side_reaches_the_yaml(page):
    page.click("#sides-panel >> text=Sides")
    name = page.locator("#side-1-name input")
    name.click()
    name.press("Control+A")
    name.type("b", delay=30)
    page.keyboard.press("Tab")  # to the kind dropdown
    opts = page.locator("#side-1-options input")
    opts.click()  # at once: the rename's write is still on its way
    opts.type("dtype=bfloat16", delay=30)
    page.keyboard.press("Tab")
    assert opts.input_value() == "dtype=bfloat16"
    page.wait_for_selector("#config-line:has-text('b (vllm, dtype=bfloat16)')", timeout=REPLY_MS)
    # Nothing else lands later and takes it back out.
    page.wait_for_timeout(3000)
    assert "b (vllm, dtype=bfloat16)" in page.locator("#config-line").inner_text()
    page.get_by_role("tab", name="Config").click()
    page.wait_for_selector("#cfg-yaml .cm-content", timeout=REPLY_MS)
    text = _yaml_text(page)
    assert "name: b" in text and "dtype: bfloat16" in text, text


def test_an_upload_over_the_limit_gets_a_card_with_the_fix_and_run_refuses(page, tmp_path):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:  # 60 MB, as the user tried: over the app's 50 MiB, under gradio's own cap
        fh.truncate(60 * 10**6)
    with page.expect_file_chooser() as chooser:  # the upload button opens the system's file dialog
        page.click("#prompt-file")
    chooser.value.set_files(str(big))
    card = page.wait_for_selector("#prompt-count .pc-error", timeout=REPLY_MS)
    text = card.inner_text()
    assert "57.2 MiB" in text and "50 MiB upload limit" in text and "parity compare" in text, text
    page.click("#run-btn")
    refused = page.wait_for_selector("#cmp-summary .pc-error", timeout=REPLY_MS)
    assert "big.jsonl" in refused.inner_text() and "Not run" in refused.inner_text()
    page.click("#clear-file")  # back to the text box: the refusal goes
    page.wait_for_selector("#prompt-count .pc-error", state="detached", timeout=REPLY_MS)


def test_garbage_yaml_reads_line_and_column_run_refuses_and_the_card_goes_once_fixed(page):
    page.get_by_role("tab", name="Config").click()
    editor = page.locator("#cfg-yaml .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("max_new_tokens: 8\ntemperature: : 0\n")
    editor.blur()
    card = page.wait_for_selector("#cfg-error .pc-error", timeout=REPLY_MS)
    assert "line 2, column" in card.inner_text() and "temperature: : 0" in card.inner_text()
    page.get_by_role("tab", name="Compare").click()
    assert "line 2" in page.locator("#config-line").inner_text()
    page.click("#run-btn")
    refused = page.wait_for_selector("#cmp-summary .pc-error", timeout=REPLY_MS)
    assert "line 2" in refused.inner_text() and "Fix:" in refused.inner_text()
    page.get_by_role("tab", name="Config").click()
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("max_new_tokens: 8\n")
    editor.blur()
    page.wait_for_selector("#cfg-error .pc-error", state="detached", timeout=REPLY_MS)
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#config-line:not(:has(.pc-bad))", timeout=REPLY_MS)


def test_a_second_run_click_while_a_run_is_under_way_says_so_and_the_next_one_runs(page, tmp_path):
    """Gradio drops a click on Run while this tab's run is pending (trigger_mode "once"): the page
    must say that the click started nothing, and a click after the run has ended must run."""
    from fake_engine import fake_model

    model = str(fake_model(tmp_path / "fake", max_position_embeddings=256))
    box = page.locator("#model-pick input")
    box.click()
    box.fill(model)
    box.press("Enter")
    page.wait_for_selector(f"#model-info:has-text('{model}')", timeout=REPLY_MS)
    page.get_by_role("tab", name="Config").click()
    editor = page.locator("#cfg-yaml .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("max_new_tokens: 24\nsides: [{name: ref, kind: fake, delay_ms: 400}, {name: b, kind: fake}]\n")
    editor.blur()
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#config-line:has-text('ref (fake')", timeout=REPLY_MS)
    page.click("#run-btn")
    page.wait_for_function("() => (document.querySelector('#progress')?.innerText || '').trim().length > 0",
                           timeout=REPLY_MS)  # the run is under way (its workers load, then tokens stream)
    page.click("#run-btn")
    note = page.wait_for_selector("#stop-note:has-text('started nothing')", timeout=REPLY_MS)
    assert "press Stop" in note.inner_text()
    first = page.wait_for_selector("#cmp-summary .pc-summary[data-run]", timeout=REPLY_MS).get_attribute("data-run")
    page.click("#run-btn")  # the run has ended: this click runs, and says nothing
    page.wait_for_selector(f"#cmp-summary .pc-summary[data-run]:not([data-run='{first}'])", timeout=REPLY_MS)
    assert "started nothing" not in page.locator("#stop-note").inner_text()
