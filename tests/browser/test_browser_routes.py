"""The mixture-of-experts route grid in real headless Chromium: a stored run with routes (written with
the store's functions, no engine) opened by its deep link shows the layer x token grid over the
token panes, the fork and the first route flip marked, the per-layer rates and the replay line."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 120_000


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    from history_runs import _run

    from parity_ui.analysis.compare import compare
    from parity_ui.analysis.explain import explain
    from parity_ui.analysis.routes import compare_routes
    from parity_ui.core.config import build_config
    from parity_ui.core.routes import RouteReplay, Routes
    from parity_ui.store.runs import open_db, save_run

    def routes(rows, margin):
        ids = [e for row in rows for layer in row for e in layer]
        return Routes(layers=[0, 1, 2], top_k=2, num_experts=8, ids=ids, weights=[0.5] * len(ids),
                      margins=[margin] * (len(rows) * 3), source="hooks")

    same = [[1, 2], [3, 4], [5, 6]]
    run = _run("01MOE", "2026-01-01T10:00:00.000+00:00", b_ids=(1, 2, 9, 9))
    p = run.prompts[0]
    p.results["ref"].routes = routes([same] * 4, 4e-7)
    p.results["b"].routes = routes([same, [[1, 2], [4, 3], [5, 6]], [[1, 2], [3, 7], [5, 6]], same], 5e-7)
    c = compare(p.results["ref"], p.results["b"])
    c.measures["routes"] = compare_routes(p.results["ref"].routes, p.results["b"].routes, 3)
    c.explanation = explain(c, p.results["ref"], p.results["b"], build_config())
    c.measures["route_replay"] = RouteReplay(mode="ids", source="ref", before_first_divergence=2, after_first_divergence=None,
                                 before_identical=False, after_identical=True, before_max_abs_gap=0.0,
                                 after_max_abs_gap=2e-6, compared=4)
    p.comparisons = [c]
    path = tmp_path_factory.mktemp("db") / "runs.db"
    d = open_db(path)
    save_run(d, run)
    d.close()
    return path


def test_route_grid_shows_the_flip_next_to_the_fork(db, new_page):
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(db, ARTIFACTS / "browser-routes.log") as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url + "?run=01MOE")
        grid = page.locator("#hist-summary [data-testid='route-grid']")
        grid.wait_for(timeout=PAGE_MS)
        assert grid.locator("tr").count() == 4  # the token header and one row per MoE layer
        rows = [grid.locator("tr").nth(i).inner_text() for i in range(1, 4)]
        assert rows[0].startswith("layer 0") and "100% same set" in rows[0]
        assert "67% same set" in rows[1]
        flip = grid.locator("td.rt-flip")
        assert flip.count() == 1 and flip.inner_text() == "1"
        assert "rt-fork" in flip.get_attribute("class")  # the flip sits in the fork's column (token 2)
        assert flip.get_attribute("title") == "layer 1, token 2: 1 of 2 experts shared"
        assert grid.locator("td.rt-order").count() == 1 and grid.locator("td.rt-na").count() == 3
        card = page.locator("#hist-summary").inner_text()
        assert "router near-tie" in card and "experts differ at layer 1, token 2: router margin" in card
        assert "route replay with ref's experts (ids): before fork at token 2" in card and "after identical" in card
        box = grid.bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 40  # drawn, not collapsed
        page.screenshot(path=str(ARTIFACTS / "30-route-grid.png"))
        # Issue 46 item 12: routes follow the model. A MoE model's card says so, and the Config tab has
        # the control (follow the model / on / off), written into the YAML.
        from fake_engine import fake_model

        moe = str(fake_model(db.parent / "fake-moe", max_position_embeddings=256, moe=True))
        page.get_by_role("tab", name="Compare").click()
        box = page.locator("#model-pick input")
        box.click()
        box.fill(moe)
        box.press("Enter")
        card = page.wait_for_selector(f"#model-info:has-text('{moe}')", timeout=PAGE_MS).inner_text()
        assert "mixture of experts (8 experts, top-2)" in card and "routes recorded" in card, card
        page.get_by_role("tab", name="Config").click()
        field = page.locator("#cfg-routes input")
        assert field.input_value() == "follow the model (on for MoE models)"
        field.click()
        page.get_by_role("option", name="off", exact=True).click()
        page.wait_for_selector("#cfg-yaml .cm-content:has-text('routes: false')", timeout=PAGE_MS)
        field.click()
        page.get_by_role("option", name="follow the model (on for MoE models)").click()
        page.wait_for_selector("#cfg-yaml .cm-content:has-text('routes: null')", timeout=PAGE_MS)
