"""`routes` follows the model (issue 46 item 12): unset, it is on for a mixture-of-experts model (its
config.json names experts) and off for a dense one; a value set stays. The model card says "mixture of
experts (N experts, top-k)"; the Config form's control maps to the YAML's null / true / false. Pure, on
the fake kind's model folders (no engine)."""
from __future__ import annotations

import pytest

from fake_engine import fake_model, registered
from parity_ui.core.config import build_config, routes_for
from parity_ui.inputs.models import describe_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("m")
    return {"moe": str(fake_model(root / "moe", max_position_embeddings=64, moe=True)),
            "dense": str(fake_model(root / "dense", max_position_embeddings=64))}


def test_routes_are_on_for_a_moe_model_and_off_for_a_dense_one_unless_set(models):
    moe, dense = describe_model(models["moe"]), describe_model(models["dense"])
    assert (moe.num_experts, moe.experts_per_token) == (8, 2) and dense.num_experts is None
    cfg = build_config()
    assert cfg.routes is None  # the default: follow the model
    assert routes_for(cfg, moe.num_experts).routes is True and routes_for(cfg, dense.num_experts).routes is False
    off = build_config(None, ["routes=false"])
    assert routes_for(off, moe.num_experts).routes is False  # set: it stays
    assert routes_for(build_config(None, ["routes=true"]), dense.num_experts).routes is True


def test_a_run_prepared_on_a_moe_model_records_routes_by_default(models):
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.run.plan import RunRequest
    from parity_ui.run.prepare import prepare

    with registered():
        cfg = build_config(None, ["max_new_tokens=4"], sides=["ref=fake", "b=fake"])
        for name, on in (("moe", True), ("dense", False)):
            prep = prepare(RunRequest(model=models[name], prompts=[PromptSpec(text="def f(x):")], config=cfg), False)
            assert prep.config.routes is on, name


def test_the_model_card_names_a_mixture_of_experts(models):
    from parity_ui.render.cards import model_html

    assert "mixture of experts (8 experts, top-2)" in model_html(describe_model(models["moe"]))
    assert "mixture of experts" not in model_html(describe_model(models["dense"]))


def test_the_form_control_writes_null_true_or_false(tmp_path):
    import gradio as gr

    from parity_ui.ui.config_tab import ConfigTab, config_from_text, default_yaml
    from parity_ui.ui.runner import AppService

    runner = AppService(str(tmp_path / "runs.db"))
    tab = ConfigTab(runner)
    with gr.Blocks():
        tab.create_ui()
        tab.create_event_handlers(gr.Textbox(), gr.Checkbox(), gr.HTML())
    keys = list(tab.fields)
    values = [comp.value for comp in tab.field_list]
    assert values[keys.index("routes")] == "auto"
    for shown, want in (("off", False), ("on", True)):
        values[keys.index("routes")] = shown
        out = tab.form_changed(default_yaml(), "demo", False, *values)
        assert config_from_text(out[tab.yaml]).routes is want
    values[keys.index("routes")] = "auto"
    out = tab.form_changed(out[tab.yaml], "demo", False, *values)
    assert config_from_text(out[tab.yaml]).routes is None
    runner.close()
