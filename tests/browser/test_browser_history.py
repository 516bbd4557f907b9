"""History in real headless Chromium (#33 item 12): what a user sees of the list (status, result, the
model's short name with its full path on hover, sides and prompt on screen first; a bisect's trials
folded under it; more than a handful of rows) and two stored runs picked from it and compared side by
side. The runs are written with the store's functions (tests/history_runs.py): no engine runs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 120_000  # a page of the app loaded, on a machine whose cores are busy with other work


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    from history_runs import store_history
    from parity_ui.store.runs import open_db

    path = tmp_path_factory.mktemp("db") / "runs.db"
    d = open_db(path)
    store_history(d, extra=14)
    d.close()
    return path


def _row(page, run_id: str):
    """The run's id cell (a bisect's result names the run it searched too)."""
    from parity_ui.ui.history_tab import ID

    return page.locator(f"#hist-table [data-testid^='cell-'][data-col='{ID}']").filter(has_text=run_id).first


def test_history_shows_what_matters_first_and_compares_two_runs(db, new_page):
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(db, ARTIFACTS / "browser-history.log") as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url)
        page.get_by_role("tab", name="History").click()
        _row(page, "01PLAIN").wait_for(timeout=PAGE_MS)
        table = page.locator("#hist-table")
        text = table.inner_text()
        # The columns a user reads first, on screen without scrolling sideways.
        heads = page.evaluate("Array.from(document.querySelectorAll('#hist-table thead th'), "
                              "(th) => th.innerText.trim()).filter(Boolean)")
        assert heads[:5] == ["status", "result", "model", "sides (reference first)", "prompt"], heads
        box = table.bounding_box()
        for col in ("status", "result", "prompt"):
            th = page.locator("#hist-table thead th").filter(has_text=col).first.bounding_box()
            assert th["x"] + th["width"] / 2 < box["x"] + box["width"], col  # its middle inside the table's width
        # The model by its short name; its full cache path on hover.
        assert "Qwen/Qwen2.5-0.5B-Instruct" in text and "snapshots" not in text
        assert page.locator("#hist-table span[title*='snapshots']").count() >= 1
        # A bisect's trials are not listed as runs: its row counts them.
        assert "01TRIAL" not in text and "(3 trials: open it)" in text
        # More than a handful of rows visible at once.
        shown = page.evaluate("""() => {
            const cells = Array.from(document.querySelectorAll("#hist-table [data-testid^='cell-']"));
            let box = cells[0];  // the rows' scrolling box
            while (box && !(box.scrollHeight > box.clientHeight + 2 && getComputedStyle(box).overflowY !== 'visible'))
                box = box.parentElement;
            const b = (box || document.querySelector('#hist-table')).getBoundingClientRect();
            const rows = new Set();
            for (const c of cells) {
                const r = c.getBoundingClientRect();
                if (r.height > 0 && r.top >= b.top - 1 && r.bottom <= Math.min(b.bottom, innerHeight) + 1)
                    rows.add(c.dataset.testid.split('-')[1]);
            }
            return rows.size; }""")
        assert shown >= 12, shown
        page.screenshot(path=str(ARTIFACTS / "17-history-list.png"))
        # Two runs picked from the list, side by side.
        page.get_by_text("Compare two stored runs side by side").click()
        _row(page, "01PLAIN").click()
        page.wait_for_function("() => (document.querySelector('#hist-run-id textarea, #hist-run-id input') || {})"
                               ".value === '01PLAIN'", timeout=PAGE_MS)
        page.click("#hist-use-a")
        page.wait_for_function("() => document.querySelector('#hist-pair-a textarea, #hist-pair-a input')"
                               ".value === '01PLAIN'", timeout=PAGE_MS)
        _row(page, "01OTHER").click()
        page.wait_for_function("() => (document.querySelector('#hist-run-id textarea, #hist-run-id input') || {})"
                               ".value === '01OTHER'", timeout=PAGE_MS)
        page.click("#hist-use-b")
        page.wait_for_function("() => document.querySelector('#hist-pair-b textarea, #hist-pair-b input')"
                               ".value === '01OTHER'", timeout=PAGE_MS)
        page.click("#hist-pair-btn")
        pair = page.wait_for_selector("#hist-pair .rp-pair[data-a='01PLAIN'][data-b='01OTHER']", timeout=PAGE_MS)
        said = pair.inner_text()
        assert "diverged at token 2" in said and "identical on every prompt" in said
        assert "Settings: " in said and "config.dtype" in said and "side b: dtype" in said
        assert page.locator("#hist-pair .rp-panes .pt-root").count() == 2  # each run's token panes
        page.locator("#hist-pair").screenshot(path=str(ARTIFACTS / "18-history-two-runs.png"))


def test_a_deep_linked_workload_sorts_all_its_rows_and_lays_out_only_the_first(tmp_path_factory, new_page):
    """#33 item 6: a workload opened by its link (`?run=ID`: the page selects the History tab itself)
    shows its view; a sort of its 250-row prompt table orders every row, lays out only the first 100
    (the rest wait in the table's <template>, in order) and moves the rest in as the table is
    scrolled; a row opens its prompt's tokens."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from ui_render import synthetic_workload

    from parity_ui.render.workload import EAGER_TABLE_ROWS
    from parity_ui.store.runs import open_db, pair_rows

    ARTIFACTS.mkdir(exist_ok=True)
    path = tmp_path_factory.mktemp("wl") / "runs.db"
    d = open_db(path)
    run = synthetic_workload(d, 250, 8)
    forks = {r["prompt_idx"]: r["first_divergence"] for r in pair_rows(d, run.id) if r["side"] == "b"}
    d.close()
    want = sorted(forks, key=lambda i: (1e12 if forks[i] is None else forks[i], i))
    table = "#hist-wl-prompts table.wl-table[data-init]"
    with running_app(path, ARTIFACTS / "browser-history-workload.log") as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url + f"?run={run.id}")
        page.wait_for_selector(f"#hist-wl-card .pc-workload[data-run='{run.id}']", timeout=PAGE_MS)
        page.wait_for_selector(table, timeout=PAGE_MS)
        assert page.get_by_role("tab", name="History").get_attribute("aria-selected") == "true"
        laid = f"{table} tbody tr"
        assert page.locator(laid).count() == EAGER_TABLE_ROWS

        def order() -> tuple[list[int], list[int]]:  # (laid out, waiting in the template)
            return tuple(page.evaluate(f"""() => {{
                const t = document.querySelector('{table}');
                const rest = t.parentElement.querySelector('template.wl-rest');
                return [Array.from(t.tBodies[0].rows, (r) => Number(r.dataset.i)),
                        rest ? Array.from(rest.content.children, (r) => Number(r.dataset.i)) : []]; }}"""))

        page.click(f"{table} th[data-col='fork:b']")
        assert page.locator(f"{table} th[data-col='fork:b']").get_attribute("aria-sort") == "ascending"
        shown, waiting = order()
        assert shown == want[:EAGER_TABLE_ROWS] and waiting == want[EAGER_TABLE_ROWS:]
        page.click(f"{table} th[data-col='fork:b']")  # the other way, then back
        shown, waiting = order()
        back = sorted(forks, key=lambda i: (-(1e12 if forks[i] is None else forks[i]), i))
        assert len(shown) == EAGER_TABLE_ROWS and shown[:5] == back[:5] and len(shown) + len(waiting) == 250
        page.click(f"{table} th[data-col='fork:b']")
        # Scrolled to its end, again and again: every row laid out, in the sorted order.
        for _ in range(5):
            page.evaluate(f"() => {{ const box = document.querySelector('{table}').closest('.wl-scroll');"
                          "box.scrollTop = box.scrollHeight; box.dispatchEvent(new Event('scroll')); }")
        assert order() == (want, [])
        page.locator(laid).first.click()
        page.wait_for_selector(f"#hist-summary:has-text('Prompt {want[0]} of workload')", timeout=PAGE_MS)
        page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=PAGE_MS)
        page.locator("#hist-wl").screenshot(path=str(ARTIFACTS / "19-history-workload-sorted.png"))


def test_a_sampled_run_says_so_and_its_details_stay_at_the_fork_until_the_pointer_moves(tmp_path_factory, new_page):
    """Issue 46 item 11: History and the card name a sampled run's decoding (not greedy wording), and the
    details box opens at the fork and stays there while content moves under a resting pointer (a scroll
    fires mouseover, not mousemove: the box showed position 40 for a fork at 54); a real move shows the
    token under the pointer."""
    from history_runs import _run

    from parity_ui.store.runs import open_db, save_run

    path = tmp_path_factory.mktemp("sampled") / "runs.db"
    run = _run("01SAMPLED", "2026-01-02T10:00:00.000+00:00", b_ids=(1, 2, 9, 9))
    run.config = {"dtype": "bfloat16", "temperature": 1.0, "sampling": "shared-seed", "seed": 0, "top_p": 0.8}
    d = open_db(path)
    save_run(d, run)
    d.close()
    with running_app(path, ARTIFACTS / "browser-sampled.log") as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url + "?run=01SAMPLED")
        card = page.wait_for_selector("#hist-summary .pc-summary[data-run='01SAMPLED']", timeout=PAGE_MS)
        assert "shared-seed sampling (seed 0), T=1, top_p 0.8" in card.inner_text()
        assert "top-k" not in card.inner_text()  # vLLM's greedy acceptance rule says nothing of drawn tokens
        assert "diverged at token 2 (shared-seed sampling" in page.locator("#hist-table").inner_text()
        page.wait_for_selector("#hist-panes .pt-root[data-init]", timeout=PAGE_MS)
        info = page.locator("#hist-panes .pt-info .pos")
        assert info.inner_text().startswith("Position 2")
        # Content moving under a resting pointer: the browser fires mouseover on the chip now under it.
        page.evaluate("""() => document.querySelector("#hist-panes [data-side='b'] .pt-body .t")
                         .dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))""")
        page.wait_for_timeout(300)
        assert info.inner_text().startswith("Position 2"), info.inner_text()
        page.locator("#hist-panes [data-side='b'] .pt-body .t").nth(0).hover()  # the pointer's own move
        page.wait_for_function("() => document.querySelector('#hist-panes .pt-info .pos').innerText.startsWith('Position 0')",
                               timeout=PAGE_MS)
