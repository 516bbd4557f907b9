"""The real app in real headless Chromium, with the real engines on a tiny model.

One app process for the module (sides load once, ~40 s on CPU); the tests run in file order and
share the run the first one makes. The tiny Llama in bf16 diverges from itself across the engines
on this CPU, so there is a divergence to find. Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402

pytestmark = pytest.mark.engines  # starts the real app's engines too; browser/ sets `browser`

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

# Caps on waits for a state, not waits for a time (each returns as soon as its state shows): high
# enough for a machine whose cores are busy with other work, where a page of the app takes up to a
# minute to load and a server reply tens of seconds.
RUN_TIMEOUT_MS = 200_000  # a run of the sides, or a layer localisation
PAGE_MS = 180_000  # a page of the app loaded (after goto, after a login)
REPLY_MS = 90_000  # a server round trip's result on the page (a check, a count, an opened run)
CLIENT_MS = 30_000  # the page's own work (scrolling, building blocks, drawing a figure's data)


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


@pytest.fixture
def page(new_page):
    with new_page() as pg:
        pg.set_default_timeout(PAGE_MS)  # clicks and reads wait for their element: a page may still be loading
        yield pg


@pytest.fixture(scope="module")
def shared():
    return {}


def _shot(page, name: str, selector: str | None = None) -> None:
    if selector:
        page.locator(selector).scroll_into_view_if_needed()
        # Two frames: content-visibility lays out what just came into view, then it is painted.
        page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
        page.locator(selector).screenshot(path=str(ARTIFACTS / f"{name}.png"))
    else:
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _stored(app, run_id):
    from parity_ui.store.runs import get_run, open_db

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
            out[pane.dataset.side] = {d, n: chips.length,
                visible: r ? (r.top >= body.top - 1 && r.bottom <= body.bottom + 1) : null};
        });
        return out;
    }""", root)


def _set_model(page, path: str) -> None:
    box = page.locator("#model-pick input")
    box.click()
    box.fill(path)
    box.press("Enter")
    page.wait_for_selector(f"#model-info:has-text('{path}')", timeout=REPLY_MS)


def test_run_streams_and_highlights_the_core_divergence(app, page, shared):
    page.goto(app["url"])
    page.wait_for_selector("#model-info .pc-model", timeout=PAGE_MS)  # the demo is preselected
    _shot(page, "01-start")
    _set_model(page, app["model"])
    page.wait_for_selector("#prompt-count:has-text('prompt tokens')", timeout=REPLY_MS)
    # Record whether live token panes appeared before the final view (the run takes seconds).
    page.evaluate("""() => { window.__sawLive = 0; new MutationObserver(() => {
        if (document.querySelector('#cmp-panes .pt-root[data-live] .pt-body .t')) window.__sawLive++;
    }).observe(document.body, {childList: true, subtree: true}); }""")
    page.click("#run-btn")
    page.mouse.move(0, 0)  # off the panes: the view scrolls when it ends, and a token under a resting pointer is "hovered"
    summary = page.wait_for_selector("#cmp-summary .pc-summary", timeout=RUN_TIMEOUT_MS)
    run_id = summary.get_attribute("data-run")
    run = _stored(app, run_id)
    assert run is not None and run.status == "diverged", run and run.error
    div = run.first_divergence
    assert page.evaluate("window.__sawLive") > 0, "no live tokens were shown while the engines ran"
    assert page.locator(f"#cmp-panes .pt-root[data-div='{div}']").count() == 1
    chips = _divergent_chips(page, "#cmp-panes")
    for side in ("vllm", "hf"):
        assert chips[side]["d"] == [div], chips
        assert chips[side]["visible"], f"{side}: the divergent chip was not scrolled into view"
        assert chips[side]["n"] == len(run.prompts[0].results[side].steps)
    assert f"DIVERGED at token {div}" in summary.inner_text()
    # The verdict was brought into view when the run ended.
    page.wait_for_function("""() => { const r = document.querySelector('#cmp-summary .pc-summary').getBoundingClientRect();
        return r.top >= -1 && r.top < window.innerHeight / 2; }""", timeout=CLIENT_MS)
    # Fixes on the page name the app's controls, not CLI flags.
    assert "--set" not in summary.inner_text()
    # The details box opens on the divergence, with every side's alternatives and the bytes.
    info = page.locator("#cmp-panes .pt-info")
    assert f"Position {div}" in info.inner_text() and "first divergence" in info.inner_text()
    assert info.locator("table tr").count() > 2 and "bytes" in info.inner_text()
    # Hovering a token in the identical prefix shows that position.
    page.locator("#cmp-panes [data-side='hf'] .pt-body .t").nth(0).hover()
    assert "Position 0" in info.inner_text() and "same token on the compared sides" in info.inner_text()
    # Plotly draws client-side after the data arrives: wait for it rather than race it.
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 2", timeout=REPLY_MS)
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
    row.wait_for(timeout=REPLY_MS)
    row.click()
    page.wait_for_selector(f"#hist-summary .pc-summary[data-run='{shared['run_id']}']", timeout=REPLY_MS)
    chips = _divergent_chips(page, "#hist-panes")
    assert chips["vllm"]["d"] == [shared["div"]] and chips["hf"]["d"] == [shared["div"]]
    assert chips["vllm"]["visible"] and chips["hf"]["visible"]
    assert "hf=hf, vllm=vllm" in page.locator("#hist-table").inner_text()  # the sides of each run
    page.click("#hist-export")
    page.wait_for_selector("a[href*='parity-run-'][href$='.json']", timeout=REPLY_MS)
    page.click("#hist-report")
    page.wait_for_selector("a[href*='parity-run-'][href$='.html']", timeout=REPLY_MS)
    _shot(page, "04-history")


def test_deep_link_opens_the_run(app, page, shared):
    if "run_id" not in shared:
        pytest.skip("needs the run of the first test")
    page.goto(app["url"] + f"?run={shared['run_id']}")
    page.wait_for_selector(f"#hist-summary .pc-summary[data-run='{shared['run_id']}']", timeout=PAGE_MS)
    assert page.get_by_role("tab", name="History").get_attribute("aria-selected") == "true"
    assert page.locator(f"#hist-panes .pt-root[data-div='{shared['div']}']").count() == 1
    page.goto(app["url"] + "?run=NOSUCHRUN")
    page.wait_for_selector("#hist-summary .pc-error", timeout=PAGE_MS)
    assert "no run with id" in page.locator("#hist-summary").inner_text()
    _shot(page, "05-deep-link-unknown")


def test_find_the_layer_localises_the_divergence_and_keeps_it_with_the_run(app, page, shared):
    if "run_id" not in shared:
        pytest.skip("needs the run of the first test")
    from parity_ui.store.runs import localisations_of, open_db

    page.goto(app["url"] + f"?run={shared['run_id']}")
    page.wait_for_selector(f"#hist-summary .pc-summary[data-run='{shared['run_id']}']", timeout=PAGE_MS)
    page.click("#hist-layers-btn")
    card = page.wait_for_selector("#hist-layers .pc-layers", timeout=RUN_TIMEOUT_MS)
    text = card.inner_text()
    assert "Where inside the model: vllm vs hf" in text and f"generated token {shared['div']}" in text
    assert "Noise floor: measured" in text
    (loc,) = localisations_of(open_db(app["db"]), shared["run_id"])
    assert loc.error is None and loc.position == shared["div"] and loc.per_layer
    verdict = "none (within the noise floor)" if loc.first_divergent_block is None else loc.first_divergent_block
    assert verdict in text
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 3", timeout=REPLY_MS)
    _shot(page, "06-find-the-layer", "#hist-layers")
    page.reload()  # stored: reopening the run shows it again
    page.wait_for_selector("#hist-layers .pc-layers", timeout=PAGE_MS)


def test_bad_config_is_explained_and_the_app_keeps_serving(app, page, shared):
    page.goto(app["url"])
    page.wait_for_selector("#model-info .pc-model", timeout=PAGE_MS)
    _set_model(page, app["model"])
    page.get_by_role("tab", name="Config").click()
    # The YAML editor: a wrong type names the key.
    editor = page.locator("#cfg-yaml .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("temperature: hot\n")
    editor.blur()  # the YAML is checked when the editor is left, not on every key
    err = page.wait_for_selector("#cfg-error .pc-error:has-text('must be a number')", timeout=REPLY_MS)
    assert "temperature" in err.inner_text() and "must be a number" in err.inner_text()
    _shot(page, "06-config-yaml-error")
    # The form: an out-of-range value is flagged next to its field.
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("max_new_tokens: 0\n")
    editor.blur()
    page.wait_for_selector("#cfg-error:has-text('max_new_tokens')", timeout=REPLY_MS)
    field = page.locator(".field-error")
    field.first.wait_for(timeout=REPLY_MS)
    assert "from 1 to 131072" in field.first.inner_text()
    _shot(page, "07-config-field-error")
    # Running with it shows a readable error, and stores nothing (#33 item 12: no ERROR row for a refusal).
    page.get_by_role("tab", name="Compare").click()
    page.click("#run-btn")
    card = page.wait_for_selector("#cmp-summary .pc-error:has-text('Not run (nothing stored)')", timeout=REPLY_MS)
    assert "max_new_tokens" in card.inner_text() and "Fix:" in card.inner_text()
    _shot(page, "08-run-with-bad-config")
    # Fix it through the form and run again: the app still serves, the engines are still warm.
    page.get_by_role("tab", name="Config").click()
    number = page.locator(".field-error input").first
    number.fill("8")
    number.press("Enter")  # a number field is written into the YAML on Enter or when it is left
    page.wait_for_selector(".field-error", state="detached", timeout=REPLY_MS)
    page.get_by_role("tab", name="Compare").click()
    page.click("#run-btn")
    card = page.wait_for_selector("#cmp-summary .pc-summary:not([data-status='error'])", timeout=RUN_TIMEOUT_MS)
    run = _stored(app, card.get_attribute("data-run"))
    assert run.status in ("ok", "diverged") and len(run.prompts[0].results["vllm"].steps) == 8
    assert all(s.load_s == 0.0 for s in run.sides), f"the warm sides were not reused: {[(s.name, s.load_s) for s in run.sides]}, config {run.config}"


def _paste_into(page, selector: str, text: str) -> None:
    """Select the field's text and paste over it (Ctrl+V from the clipboard), as a user pastes."""
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    box = page.locator(f"{selector} input, {selector} textarea").first
    box.click()
    box.press("Control+A")
    page.evaluate("(t) => navigator.clipboard.writeText(t)", text)
    box.press("Control+V")


def _pick_kind(page, slot: int, label: str) -> None:
    page.click(f"#side-{slot}-kind input")
    page.get_by_role("option", name=label).click()


def test_the_sides_panel_adds_a_side_and_every_pane_is_labelled(app, page):
    page.goto(app["url"])
    page.wait_for_selector("#model-info .pc-model", timeout=PAGE_MS)
    _set_model(page, app["model"])
    page.click("#sides-panel >> text=Sides")
    page.click("#sides-add")
    page.wait_for_selector("#side-2-name", state="visible", timeout=REPLY_MS)
    # Issue 46 item 1, the way a user does it: rename the side, paste its options, Run at once. Each
    # slot writes into the YAML when left, but the run must not wait on those writes (nor on the
    # page's count of edits, which a paste and a Tab outran): it reads the slots as they are.
    _paste_into(page, "#side-2-name", "fp32")
    page.keyboard.press("Tab")
    _paste_into(page, "#side-2-options", "dtype=float32")
    page.click("#run-btn")
    card = page.wait_for_selector("#cmp-summary .pc-summary:not([data-status='error'])", timeout=RUN_TIMEOUT_MS)
    run = _stored(app, card.get_attribute("data-run"))
    assert [s.name for s in run.sides] == ["hf", "vllm", "fp32"] and run.side("fp32").dtype == "float32"
    page.wait_for_selector("#config-line:has-text('fp32 (vllm, dtype=float32)')", timeout=REPLY_MS)
    _shot(page, "09-sides-panel")
    panes = page.locator("#cmp-panes .pt-pane")
    assert panes.count() == 3
    assert [panes.nth(i).get_attribute("data-side") for i in range(3)] == ["hf", "vllm", "fp32"]
    assert "reference" in panes.nth(0).locator(".pt-head").inner_text()
    assert "fp32 vs hf" in card.inner_text()
    _shot(page, "10-three-sides", "#cmp-panes")
    # A kind picked is written at once (no field to leave).
    _pick_kind(page, 2, "HF transformers (generate)")
    page.wait_for_selector("#config-line:has-text('fp32 (hf, dtype=float32)')", timeout=REPLY_MS)
    _pick_kind(page, 2, "vLLM (offline LLM)")
    page.wait_for_selector("#config-line:has-text('fp32 (vllm, dtype=float32)')", timeout=REPLY_MS)
    # The YAML names the third side too: one source of truth.
    page.get_by_role("tab", name="Config").click()
    page.wait_for_selector("#cfg-yaml .cm-content:has-text('name: fp32')", timeout=REPLY_MS)
    # Back to the pair for the next tests.
    page.get_by_role("tab", name="Compare").click()
    page.click("#side-2-remove")
    page.wait_for_selector("#config-line:not(:has-text('fp32'))", timeout=REPLY_MS)


def _lossy_run(run_id: str):
    """A stored run whose tokens include pieces of a multi-byte character (no engine needed: this
    pins what the viewer shows)."""
    from parity_ui.analysis.compare import compare
    from parity_ui.core.types import ModelInfo, PromptResult, Run, SideInfo, SideResult, TokenStep, TopLogprob

    def steps():
        toks = [(10, "A", None), (300, "\ufffd", "e2"), (301, "\ufffd", "80a2"), (11, " b", None)]
        return [TokenStep(position=i, token_id=t, text=x, logprob=-0.1, rank=1, raw=r,
                          top=[TopLogprob(t, -0.1, x, r)]) for i, (t, x, r) in enumerate(toks)]
    results = {n: SideResult(side=n, prompt_index=0, token_ids=[10, 300, 301, 11], steps=steps()) for n in ("ref", "b")}
    return Run(id=run_id, created_utc="2026-11-22T00:00:00.000+00:00", model=ModelInfo(name="m", path="/m"),
               config={}, status="ok", sides=[SideInfo(name="ref", kind="hf", reference=True),
                                              SideInfo(name="b", kind="vllm")],
               prompts=[PromptResult(index=0, prompt_text="p", prompt_token_ids=[1], results=results,
                                     comparisons=[compare(results["ref"], results["b"])])])


def test_byte_tokens_show_their_bytes_on_hover_and_as_bytes_on_demand(app, page):
    from playwright.sync_api import expect

    from parity_ui.store.runs import open_db, save_run

    # In the shared app, after this module's earlier runs, History's list pushes the panes below the
    # fold, and Chromium renders nothing inside an off-screen `content-visibility: auto` block: its
    # chips' innerText reads "" until it scrolls near (checked in Chromium alone: off screen '', in
    # view the text). _byte_view scrolls the pane into view first, as a reader does.
    save_run(open_db(app["db"]), _lossy_run("01BYTES"))
    _byte_view(page, app["url"], expect)


def _byte_view(page, url, expect):
    page.goto(url + "?run=01BYTES")
    page.wait_for_selector("#hist-summary .pc-summary[data-run='01BYTES']", timeout=PAGE_MS)
    # The panes build their token chips in blocks after the summary shows (a long run's DOM stays
    # small): wait for each text rather than read a chip that may not be filled yet.
    chips = page.locator("#hist-panes [data-side='b'] .pt-body .t")
    chip = chips.nth(1)
    chip.scroll_into_view_if_needed()
    expect(chip).to_have_text("\ufffd", use_inner_text=True, timeout=PAGE_MS)
    chip.hover()
    expect(page.locator("#hist-panes .pt-info")).to_contain_text("bytes e2", timeout=PAGE_MS)
    page.locator("#hist-panes .pt-bytes-cb").check()
    expect(chip).to_have_text("e2", use_inner_text=True, timeout=PAGE_MS)
    expect(chips.nth(2)).to_have_text("80 a2", use_inner_text=True, timeout=PAGE_MS)
    expect(chips.nth(3)).to_have_text("·b", use_inner_text=True, timeout=PAGE_MS)  # text stays text
    _shot(page, "11-byte-view", "#hist-panes")


def test_a_16k_run_opens_with_a_small_dom_and_builds_blocks_as_they_scroll_near(app, page):
    """Long panes ship only the blocks around the divergence; the rest are built in the page from the
    details JSON, with the same chip classes and texts the server would have written."""
    import time as _time

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from ui_render import synthetic_run

    from parity_ui.store.runs import open_db, save_run

    n = 16384
    run = synthetic_run(n)
    save_run(open_db(app["db"]), run)
    page.goto(app["url"])
    t0 = _time.perf_counter()
    page.goto(app["url"] + f"?run={run.id}")
    page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=PAGE_MS)
    opened = _time.perf_counter() - t0
    built = page.evaluate("document.querySelectorAll('#hist-panes .pt-body .t').length")
    assert built < n // 4, built  # not 32k chips
    inline = page.evaluate("document.querySelector('#hist-panes .pt-json').textContent.length")
    assert inline < 300_000, inline  # only the built positions' details came with the view
    page.wait_for_selector("#hist-panes .pt-root[data-full='1']", timeout=REPLY_MS)  # the rest, fetched
    chip = page.locator("#hist-panes [data-side='vllm'] .pt-body .t.d")
    assert chip.count() == 1 and chip.is_visible()  # the divergence is built and scrolled into view
    # Scroll the reference pane to the top: the first block is built with the right classes and text.
    page.evaluate("document.querySelector('#hist-panes [data-side=\"hf\"] .pt-body').scrollTop = 0")
    first = page.locator("#hist-panes [data-side='hf'] .pt-body .b").first
    first.locator(".t").first.wait_for(timeout=CLIENT_MS)
    # the panes sit below History's taller table now: bring them on screen (off-screen blocks are not
    # rendered, and a chip's text reads '' until it is), as a user scrolls to read them
    page.locator("#hist-panes [data-side='hf'] .pt-body").scroll_into_view_if_needed()
    page.wait_for_function("(() => { const t = document.querySelector("
                           "'#hist-panes [data-side=\"hf\"] .pt-body .b .t'); return t && t.innerText.length > 0; })()",
                           timeout=CLIENT_MS)
    assert first.locator(".t.m").count() == 128
    want = run.prompts[0].results["hf"].steps[0].text.replace(" ", "·")
    assert first.locator(".t").first.inner_text() == want
    first.locator(".t").nth(3).hover()
    assert "Position 3" in page.locator("#hist-panes .pt-info").inner_text()
    # After the divergence the other pane's lazily built chips are marked as after it.
    page.evaluate("document.querySelector('#hist-panes [data-side=\"vllm\"] .pt-body').scrollTop = 1e9")
    page.wait_for_function("document.querySelectorAll('#hist-panes [data-side=\"vllm\"] .t.a').length > 128",
                           timeout=CLIENT_MS)
    print(f"16k run opened and usable in {opened:.2f} s; {built} chips built at open")
    _shot(page, "12-16k-lazy", "#hist-panes")


def test_a_stored_workload_opens_in_history_sorts_in_the_page_and_a_row_opens_its_tokens(app, page):
    """A workload (60 prompts, written with the store's functions) opens in History in its view: the
    headline, the survival curve, the prompt table; the table sorts in the page; a row opens that
    prompt's token view, its divergence marked where the table said."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from ui_render import synthetic_workload

    from parity_ui.store.runs import open_db, pair_rows

    run = synthetic_workload(open_db(app["db"]), 60, 32, created="2027-01-01T00:00:00.000+00:00")
    forks = {r["prompt_idx"]: r["first_divergence"] for r in pair_rows(open_db(app["db"]), run.id) if r["side"] == "b"}
    page.goto(app["url"])
    page.get_by_role("tab", name="History").click()
    row = page.locator("#hist-table [data-testid^='cell-']").filter(has_text=run.id).first
    row.wait_for(timeout=REPLY_MS)
    assert "workload: 60 prompts, free-running: b" in page.locator("#hist-table").inner_text()  # its headline
    row.click()
    card = page.wait_for_selector(f"#hist-wl-card .pc-workload[data-run='{run.id}']", timeout=REPLY_MS)
    assert run.workload.headline in card.inner_text() and "EXCEEDS NOISE" in card.inner_text()
    page.wait_for_selector("#hist-wl-survival svg.wl-svg", timeout=REPLY_MS)
    assert page.locator("#hist-wl-survival svg polyline").count() == 2  # b and the floor
    page.wait_for_selector("#hist-wl-hist svg.wl-svg", timeout=REPLY_MS)
    table = "#hist-wl-prompts table.wl-table[data-init]"
    page.wait_for_selector(table, timeout=REPLY_MS)
    assert page.locator(f"{table} tbody tr").count() == 60
    assert "pick a prompt" in page.locator("#hist-summary").inner_text()  # no prompt read yet
    _shot(page, "14-workload-view", "#hist-wl")

    def order() -> list[int]:
        return page.evaluate(f"Array.from(document.querySelectorAll('{table} tbody tr'), (r) => Number(r.dataset.i))")

    # Sorted in the page by b's first divergence: the earliest forks first, identical prompts last.
    page.click(f"{table} th[data-col='fork:b']")
    assert page.locator(f"{table} th[data-col='fork:b']").get_attribute("aria-sort") == "ascending"
    want = sorted(forks, key=lambda i: (1e12 if forks[i] is None else forks[i], i))
    assert order() == want
    page.click(f"{table} th[data-col='fork:b']")
    assert order()[:5] == sorted(forks, key=lambda i: (-(1e12 if forks[i] is None else forks[i]), i))[:5]
    page.click(f"{table} th[data-col='fork:b']")
    # A row opens that prompt's tokens below, its divergence where the table said.
    first = want[0]
    page.locator(f"{table} tbody tr").first.click()
    page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=REPLY_MS)
    page.wait_for_selector(f"#hist-summary:has-text('Prompt {first} of workload')", timeout=REPLY_MS)
    chips = _divergent_chips(page, "#hist-panes")
    assert chips["b"]["d"] == [forks[first]] and chips["b"]["n"] == 32
    assert page.locator(f"{table} tbody tr.sel").get_attribute("data-i") == str(first)
    _shot(page, "15-workload-prompt", "#hist-panes")


def test_a_login_is_required_when_auth_is_set(tmp_path_factory, new_page):
    db = tmp_path_factory.mktemp("auth-db") / "runs.db"
    with running_app(db, ARTIFACTS / "browser-auth.log", env={"PARITY_AUTH": "team:s3cret-demo"}) as url, \
            new_page() as pg:
        pg.set_default_timeout(PAGE_MS)
        pg.goto(url)
        pg.wait_for_selector("input[type='password']", timeout=PAGE_MS)
        assert pg.locator("#run-btn").count() == 0  # nothing of the app before logging in
        pg.fill("input[type='text']", "team")
        pg.fill("input[type='password']", "wrong")
        pg.keyboard.press("Enter")
        pg.wait_for_selector("text=/Incorrect|invalid/i", timeout=REPLY_MS)
        assert pg.locator("#run-btn").count() == 0
        pg.fill("input[type='text']", "team")
        pg.fill("input[type='password']", "s3cret-demo")
        pg.keyboard.press("Enter")
        pg.wait_for_selector("#run-btn", timeout=PAGE_MS)
        pg.screenshot(path=str(ARTIFACTS / "13-after-login.png"))
