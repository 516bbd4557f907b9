"""The op map in real headless Chromium, on real engines: a tiny Llama and a checkpoint of it whose layer-1
q_proj is perturbed by 1e-3 relative (transformers on both sides, float32: seconds to load). The run and
its op map are made here through the service; the app opened on that database shows the heatmap with
the first cell over the floor boxed, a real mouse click on that cell shows its figures and opens the
token panes at its token, and the swap button re-runs the side with the reference's q swapped in (the
app's own engines) and shows that the divergence is gone."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from conftest_browser import ARTIFACTS, chromium_available, running_app  # noqa: E402

pytestmark = pytest.mark.engines  # real engines, in this process and in the app's

pytest.importorskip("playwright")
if not chromium_available():
    pytest.skip("Debian chromium is not installed (scripts/setup.sh --test installs it)", allow_module_level=True)

PAGE_MS = 180_000
RUN_MS = 200_000


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    from tiny_models import build_model, copy_model, perturb_relative

    from parity_ui.core.config import build_config
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.prepare import RunRequest
    from parity_ui.service import ParityService

    root = tmp_path_factory.mktemp("opmap")
    model = build_model(root / "llama", "llama")
    fault = perturb_relative(copy_model(model, root / "fault"), "model.layers.1.self_attn.q_proj.weight", scale=1e-3)
    db = root / "runs.db"
    svc = ParityService(db_path=str(db))
    try:
        cfg = build_config(None, ["dtype=float32", "max_new_tokens=6", "ignore_eos=true"],
                           sides=["ref=hf", f"b=hf,model={fault}"])
        run = svc.run(RunRequest(model=str(model), prompts=[PromptSpec(text="def f(x):")], config=cfg))
        assert run.status in ("ok", "diverged"), run.error
        c = run.prompts[0].comparisons[0]
        loc = svc.localise(run, 0, None if c.first_divergence is not None else c.compared - 1, None, ops=True)
        assert not loc.error, loc.error
    finally:
        svc.close()
    return {"db": db, "run": run, "loc": loc}


CELL_XY = """([pos, label]) => {
  const el = document.querySelector('#hist-opmap .js-plotly-plot');
  const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, box = el.getBoundingClientRect();
  return [box.left + xa._offset + xa.d2p(pos), box.top + ya._offset + ya.d2p(label)];
}"""


def test_the_map_shows_the_planted_op_a_click_opens_the_cell_and_the_swap_removes_it(stored, new_page):
    from parity_ui.core.op_map import op_map_from_dict
    from parity_ui.store.runs import localisations_of, open_db

    m = op_map_from_dict(stored["loc"].op_map)
    r, t = m.first_over("add")
    assert m.rows[r] == (1, "q")
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(stored["db"], ARTIFACTS / "browser-op-map.log") as url, new_page(1400, 1100) as page:
        page.set_default_timeout(PAGE_MS)
        page.goto(url + f"?run={stored['run'].id}")
        page.wait_for_selector("#hist-opmap .js-plotly-plot .heatmaplayer", timeout=PAGE_MS)
        plot = page.locator("#hist-opmap .js-plotly-plot")
        plot.scroll_into_view_if_needed()
        labels = page.evaluate("() => document.querySelector('#hist-opmap .js-plotly-plot').layout.meta.labels")
        assert labels[r] == "L1 q"
        # the first cell over the floor is boxed, the examined token's column marked
        shapes = page.evaluate("() => document.querySelector('#hist-opmap .js-plotly-plot').layout.shapes"
                               ".map((s) => s.name)")
        assert {"divergence", "first over the floor"} <= set(shapes)
        plot.screenshot(path=str(ARTIFACTS / "op-map-01-heatmap.png"))
        x, y = page.evaluate(CELL_XY, [m.positions[t], labels[r]])
        page.mouse.click(x, y)
        cell = page.wait_for_selector("#hist-om-cell .om-cell", timeout=PAGE_MS)
        text = cell.inner_text()
        assert "L1 q (q (after RoPE))" in text and f"at position {m.positions[t]}" in text and "OVER" in text
        if m.positions[t] >= m.prompt_len:  # a generated token: the panes open there
            page.wait_for_selector(f"#hist-panes .pt-root[data-focus='{m.positions[t] - m.prompt_len}']")
        page.locator("#hist-om-cell").screenshot(path=str(ARTIFACTS / "op-map-02-cell.png"))
        page.click("#hist-om-swap")
        page.wait_for_function(
            "() => document.querySelector('#hist-layers').innerText.includes('removes the divergence')",
            timeout=RUN_MS,
        )
        page.locator("#hist-layers").screenshot(path=str(ARTIFACTS / "op-map-03-swap.png"))
    locs = localisations_of(open_db(stored["db"]), stored["run"].id)
    assert len(locs) == 2 and locs[-1].op_map["swap"]["removes"] and locs[-1].op_map["swap"]["label"] == "L1 q"
