"""Layer localisation (parity_ui.commands.layers) on real engines: tiny models whose weights differ in one
known layer and block, through the service and the `parity layers` CLI. The figures and the verdict on
synthetic captures, and the bad inputs refused before anything loads, are tests/unit/test_layers.py."""
from __future__ import annotations

import json

import pytest


PROMPT = "def parse_args(self, args=None, namespace=None):"


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory, tiny_llama):
    from tiny_models import copy_model, perturb_weights

    root = tmp_path_factory.mktemp("perturbed")
    mlp = perturb_weights(copy_model(tiny_llama, root / "mlp"), "model.layers.1.mlp.down_proj.weight", scale=0.05)
    attn = perturb_weights(copy_model(tiny_llama, root / "attn"), "model.layers.0.self_attn.o_proj.weight",
                           scale=0.05)
    return {"mlp": mlp, "attn": attn}


def _compare(service, model, sides):
    from parity_ui.core.config import build_config
    from parity_ui.run.prepare import RunRequest
    from parity_ui.inputs.prompts import PromptSpec

    cfg = build_config(None, ["dtype=float32", "max_new_tokens=24", "ignore_eos=true"], sides=sides)
    run = service.run(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT)], config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    return run


def _localise(service, run, **kw):
    from parity_ui.commands.layers import localise

    loc = localise(service, run, 0, **kw)
    assert loc.per_layer and loc.noise_floor["method"].startswith("measured")
    assert len({len(f["rel_l2"]) for f in loc.per_layer}) == 1  # every block at every captured position
    return loc


def test_vllm_and_hf_in_float32_stay_within_the_noise_floor_at_every_layer(service, tiny_llama):
    run = _compare(service, tiny_llama, ["ref=hf", "b=vllm"])
    assert run.status == "ok"
    loc = _localise(service, run, position=12)
    assert loc.first_divergent_layer is None and loc.first_divergent_block is None, loc.summary
    assert all(f["rel_l2"][0] < 1e-4 for f in loc.per_layer)
    assert all(f["floor"][0] > 0 for f in loc.per_layer)  # measured, not assumed zero
    assert "within the noise floor" in loc.summary


@pytest.mark.parametrize("sides,which,layer,block", [
    (["ref=hf", "b=hf,model={mlp}"], "mlp", 1, "mlp"),
    (["ref=hf", "b=vllm,model={mlp}"], "mlp", 1, "mlp"),
    (["ref=vllm", "b=vllm,model={attn}"], "attn", 0, "attn"),
])
def test_a_checkpoint_perturbed_in_one_block_is_found_there(service, tiny_llama, perturbed, sides, which, layer, block):
    run = _compare(service, tiny_llama, [s.format(**perturbed) for s in sides])
    d = run.prompts[0].comparisons[0].first_divergence
    loc = _localise(service, run, position=None if d is not None else 12)
    assert (loc.first_divergent_layer, loc.first_divergent_block) == (layer, block), loc.summary
    assert f"layer {layer}'s {block}" in loc.summary
    before = [f for f in loc.per_layer if f["layer"] is not None and (f["layer"], f["block"]) < (layer, block)
              and f["block"] in ("attn", "mlp")]
    assert all(f["rel_l2"][0] <= 10 * f["floor"][0] + 1e-6 for f in before)  # clean before the culprit


def test_parity_layers_cli_stores_each_localisation_and_failures_too(tmp_path, tiny_llama, perturbed, capsys,
                                                                    cli_on_warm_workers):
    """The `parity` command's main() in this process, on the session's warm workers (the same sides as
    the perturbed-MLP case above): its arguments, output and exit codes; a subprocess CLI is
    tests/engines/test_cli_engines.py."""
    from types import SimpleNamespace

    from parity_ui.cli import main
    from parity_ui.store.runs import localisations_of, open_db

    db = tmp_path / "runs.db"

    def cli(*args):
        code = main(["--db", str(db), *args])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    made = cli("compare", "--model", str(tiny_llama), "--prompt", PROMPT, "--set", "dtype=float32", "--set",
               "max_new_tokens=16", "--set", "ignore_eos=true", "--side", "ref=hf", "--side", f"b=hf,model={perturbed['mlp']}",
               "--json", "--quiet")
    run_id = json.loads(made.stdout)["run_id"]
    ok = cli("layers", run_id, "--position", "3", "--json", "--quiet")
    assert ok.returncode == 0, ok.stderr
    got = json.loads(ok.stdout)
    assert got["first_divergent_layer"] == 1 and got["first_divergent_block"] == "mlp"
    assert {"noise_floor", "per_layer", "first_divergent_layer", "first_divergent_block"} <= set(got)
    text = cli("layers", run_id, "--position", "3", "--quiet")
    assert "layer 1's mlp" in text.stdout and "noise floor: measured" in text.stdout
    bad = cli("layers", run_id, "--position", "999")
    assert bad.returncode == 2 and "Fix:" in bad.stderr and "Traceback" not in bad.stderr
    stored = localisations_of(open_db(db), run_id)
    assert len(stored) == 3 and stored[0].first_divergent_layer == 1 and stored[2].error
