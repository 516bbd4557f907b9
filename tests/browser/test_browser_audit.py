"""The Audit tab in real headless Chromium (the app with the fake engine kinds, tests/fake_app.py, on a
fresh database): an audit of two fake sides, one of them batch-variant, runs from the tab; its verdict
and its axes x prompts grid show; a broken cell opens that axis's two streams in the token view at the
break, marked; the certificate is offered; History lists the audit, and its link opens the same grid.
Seconds of engine work."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 180_000
AUDIT_MS = 240_000  # the fake sides' workers started, every axis's passes, a second instance each
FAKE_APP = Path(__file__).resolve().parents[1] / "fake_app.py"


def test_an_audit_runs_from_its_tab_and_a_broken_cell_opens_its_tokens(tmp_path, new_page):
    from fake_engine import fake_model

    ARTIFACTS.mkdir(exist_ok=True)
    model = str(fake_model(tmp_path / "fake", max_position_embeddings=1024))
    with running_app(tmp_path / "runs.db", ARTIFACTS / "browser-audit.log", script=FAKE_APP) as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url)
        page.get_by_role("tab", name="Audit").click()
        page.locator("#aud-model textarea, #aud-model input").first.fill(model)
        page.locator("#aud-sides textarea").fill("ref=fake\nb=fake,batch_noise=0.5")
        page.locator("#aud-settings textarea").fill("max_new_tokens=4")
        page.locator("#aud-n textarea, #aud-n input").first.fill("3")
        page.locator("#aud-longest textarea, #aud-longest input").first.fill("60")
        page.click("#aud-run")
        grid = "#aud-au table.au-grid[data-init]"
        page.wait_for_selector(grid, timeout=AUDIT_MS)
        card = page.locator("#aud-au .au-card").inner_text()
        assert "BROKEN" in card and "control" in card and "detected" in card, card
        run_id = re.search(r"audit ([0-9A-Z]{26})", card).group(1)
        rows = page.locator(f"{grid} tbody tr")
        assert rows.count() == 2 * 11  # every axis of both sides, those that do not apply with their reason
        assert "not applicable" in page.locator(grid).inner_text()
        broken = page.locator(f"{grid} td.c.broken[data-k^='b|batch|']").first
        key = broken.get_attribute("data-k")
        token = broken.inner_text().strip().lstrip("✗")  # the cell reads ✗N: broken at token N
        page.locator("#aud-au").screenshot(path=str(ARTIFACTS / "audit-view.png"))
        broken.click()
        page.wait_for_selector(f"#aud-summary:has-text('Audit {run_id}, side b, batch')", timeout=PAGE_MS)
        page.wait_for_selector("#aud-panes .pt-root[data-init]", timeout=PAGE_MS)
        assert "parity layers" in page.locator("#aud-summary").inner_text()
        marked = page.locator(f"#aud-panes .pt-root[data-focus='{token}'] .t.f")
        assert marked.count() == page.locator("#aud-panes .pt-pane").count() >= 2  # the break's token, in each pane
        assert key.startswith("b|batch|")
        page.locator("#aud-panes").screenshot(path=str(ARTIFACTS / "audit-break.png"))
        assert page.locator("a[download], .file-preview a").count() >= 1  # the certificate's files
        # History lists the audit (its pairs are under it, not in the list); its link opens the grid.
        page.goto(url + f"?run={run_id}")
        page.wait_for_selector("#hist-au table.au-grid[data-init]", timeout=PAGE_MS)
        assert run_id in page.locator("#hist-au .au-card").inner_text()
        page.locator("#hist-au td.broken[data-k]").first.click()
        page.wait_for_selector("#hist-panes .pt-root[data-focus]", timeout=PAGE_MS)
        table = page.locator("#hist-table").inner_text()
        assert "audit BROKEN" in table and table.count("audit BROKEN") == 1
