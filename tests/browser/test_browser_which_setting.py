"""Which setting? in real headless Chromium: a comparison stored with the fake engine kind (b forks at
token 3) opened in History by its link, the button pressed, the answer shown. The app runs with the
fake kinds registered (tests/fake_app.py); seconds of engine work."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402


pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 180_000  # a page of the app loaded, on a machine whose cores are busy with other work
SEARCH_MS = 240_000  # the bisect: a few trials, each a worker started on the fake kind


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A diverged comparison in a fresh database, made in this process with the fake kind."""
    from fake_engine import fake_model, registered
    from parity_ui.core.config import build_config
    from parity_ui.run.plan import RunRequest
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.service import ParityService

    db = tmp_path_factory.mktemp("db") / "runs.db"
    with registered():
        model = str(fake_model(tmp_path_factory.mktemp("fake"), max_position_embeddings=256))
        svc = ParityService(str(db))
        try:
            cfg = build_config(None, ["max_new_tokens=8"], sides=["ref=fake,dtype=float32",
                                                                  "b=fake,dtype=float32,swap_at=3,flag=x"])
            run = svc.run(RunRequest(model=model, prompts=[PromptSpec(text="def f(x):"),
                                                           PromptSpec(text="class A:")], config=cfg))
        finally:
            svc.close()
    assert run.status == "diverged", run.error
    return {"db": db, "run_id": run.id}


def test_which_setting_names_the_planted_setting(stored, new_page):
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(stored["db"], ARTIFACTS / "browser-which-setting.log",
                     script=Path(__file__).resolve().parents[1] / "fake_app.py") as url, new_page() as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url + f"?run={stored['run_id']}")
        page.wait_for_selector(f"#hist-summary .pc-summary[data-run='{stored['run_id']}']", timeout=PAGE_MS)
        page.wait_for_selector("#hist-ws-btn", state="visible", timeout=PAGE_MS)
        assert page.locator("#hist-ws-pair input").input_value() == "ref vs b"  # the default pair, reference first
        page.click("#hist-ws-btn")
        result = page.wait_for_selector("#hist-ws-result .pc-bisect-result", timeout=SEARCH_MS)
        text = result.inner_text()
        assert "Which setting is it? b against ref" in text and "swap_at explains the divergence" in text
        page.locator("#hist-ws").screenshot(path=str(ARTIFACTS / "16-which-setting.png"))
