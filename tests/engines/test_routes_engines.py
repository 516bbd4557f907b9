"""Mixture-of-experts routes on real engines (tiny MoE models the test builds, float32, the CPU).

One run per router family, each with several sides, so few engines start:
- softmax top-k (Qwen3-MoE) with a planted router near-tie: vLLM and HF on the model route and
  generate identically; an HF side on the same model with that one gate row nudged (the tie
  reversed) flips the experts at exactly the planted (layer, token) with its margin, the explanation
  says so, and replaying the reference's routes on it makes the fork disappear;
- the same models in a scored workload: the reference's routes on the flipped side's tokens, the
  floor's, and the one-pass replay that removes the flip's gap;
- a dump of the near model's rollout with its recorded routes, replayed with the flipped checkpoint
  as the trainer: the flip named at its (layer, token), and R3 closing the gap;
- grouped sigmoid with a shared expert (GLM-4-MoE: DeepSeek-V3's router behind plain attention):
  vLLM and HF route and generate identically.
"""
from __future__ import annotations

import pytest

from parity_ui.core.config import build_config
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.prepare import RunRequest

PROMPT = "def main(args):"


@pytest.fixture(scope="module")
def planted(build_tiny, tmp_path_factory):
    from transformers import AutoTokenizer

    from tiny_models import plant_router_tie

    root = tmp_path_factory.mktemp("moe")
    src = build_tiny("src", arch="qwen3_moe", num_hidden_layers=2, seed=3)
    ids = AutoTokenizer.from_pretrained(src).encode(PROMPT)
    info = plant_router_tie(src, root / "near", root / "flipped", ids, max_new_tokens=12)
    return root / "near", root / "flipped", info


def test_planted_router_tie_flips_at_its_layer_and_token_and_replay_removes_the_fork(service, planted):
    from parity_ui.store.runs import get_run

    near, flipped, info = planted
    cfg = build_config(overrides=["dtype=float32", "max_new_tokens=12", "routes=true"],
                       sides=["ref=vllm", "same=hf", f"flip=hf,model={flipped},replay_routes=ids"])
    run = service.run(RunRequest(model=str(near), prompts=[PromptSpec(text=PROMPT)], config=cfg))
    assert run.status in ("ok", "diverged"), run.error
    stored = get_run(service.db, run.id).prompts[0]  # everything below read back from the store
    ref, same = stored.results["ref"], stored.results["same"]
    assert ref.token_ids == same.token_ids == info["tokens"]
    for res in (ref, same, stored.results["flip"]):
        assert res.routes is not None and res.routes.rows == len(res.token_ids)
        assert res.routes.layers == [0, 1] and res.routes.top_k == 2 and res.routes.weights is not None
    # vLLM (router hooks) and HF (gate hooks) chose the same experts in the same slots, every token and layer
    assert ref.routes.ids == same.routes.ids
    c_same = stored.comparison("same")
    assert c_same.identical and c_same.measures.get("routes").same_order == 1.0 and c_same.measures.get("routes").first_flip is None
    assert set("".join(c_same.measures.get("routes").grid)) == {"="}
    # the planted tie: recorded margin within 1e-6 on both engines, at exactly that (layer, token)
    j = ref.routes.layers.index(info["layer"])
    assert ref.routes.margin(info["step"], j) < 1e-6 and same.routes.margin(info["step"], j) < 1e-6
    c = stored.comparison("flip")
    assert c.first_divergence == info["step"]
    f = c.measures.get("routes").first_flip
    assert (f.step, f.layer) == (info["step"], info["layer"])
    assert info["experts"][0] in f.experts[0] and info["experts"][1] in f.experts[1] and f.overlap == 1
    assert max(f.margins) < 1e-6
    assert c.measures.get("routes").compared == info["step"] + 1  # up to the fork: after it the inputs differ
    e = c.explanation
    assert e.verdict == "router near-tie"
    assert (e.route_layer, e.route_step) == (info["layer"], info["step"]) and e.route_margin < 1e-6
    assert f"experts differ at layer {info['layer']}, token {info['step']}: router margin" in e.summary
    # attribution by replay: routing with the reference's experts, the fork is gone
    r = c.measures.get("route_replay")
    assert r.error is None, r.error
    assert (r.mode, r.source) == ("ids", "ref")
    assert r.before_first_divergence == info["step"] and not r.before_identical
    assert r.after_identical and r.after_first_divergence is None and r.compared == 12
    # parity layers on the MoE model: the routers recorded with the hidden states name the flip at the fork
    # (between the two HF sides: their workers are warm, no vLLM loads again for the capture)
    loc = service.localise(run.id, 0, info["step"], pair=("same", "flip"))
    assert loc.error is None, loc.error
    at = next(x for x in loc.routes["layers"] if x["layer"] == info["layer"])
    assert loc.routes["position"] == loc.token_positions[0] and not at["same_set"] and min(at["margins"]) < 1e-6
    assert f"The routers choose differently at this position first at layer {info['layer']}" in loc.summary


def test_a_scored_workload_compares_routes_on_the_sides_tokens_and_replays_them_in_one_pass(service, planted):
    """Scored mode (the trainer teacher-forces the rollout side's tokens): the reference's routes on the
    flipped side's own sequence against the side's, every token; the flip at the planted (layer, token);
    the floor's routes too; and the cheap replay (the side scores its own tokens routing with the
    reference's experts) removes the gap the flip made, pooled as its own row."""
    from parity_ui.commands.workload.run import WorkloadRequest, run_workload
    from parity_ui.core.workload_record import WorkloadOptions

    near, flipped, info = planted
    cfg = build_config(overrides=["dtype=float32", "max_new_tokens=12", "ignore_eos=true", "routes=true"],
                       sides=["ref=hf", f"b=hf,model={flipped},replay_routes=ids"])
    run = run_workload(service, WorkloadRequest(
        model=str(near), prompts=[PromptSpec(text=PROMPT), PromptSpec(text="import os")], config=cfg,
        options=WorkloadOptions(mode="scored", floor="kernel", chunk=2)))
    assert run.status in ("ok", "diverged"), run.error
    w = run.workload
    b, floor, replayed = w.sides["b"], w.floor_figures, w.sides["b+ref routes"]
    assert b.stats.family("routing")["cells"] == floor.stats.family("routing")["cells"] == 2 * 12 * 2  # every token, both layers
    assert b.stats.family("routing")["route_differ"] > 0 and "the floor's" in b.verdicts.get("routing")
    stored = service.store.get_run(run.id, prompts=[0]).prompts[0]
    c = stored.comparison("b")
    assert c.first_divergence == info["step"] and c.measures.get("routes").compared == 12  # past the fork: the same input
    f = c.measures.get("routes").first_flip
    assert (f.step, f.layer) == (info["step"], info["layer"]) and min(f.margins) < 1e-6
    assert c.explanation.verdict == "router near-tie", c.explanation.summary
    r = c.measures.get("route_replay")
    assert r.error is None and (r.mode, r.source, r.compared) == ("ids", "ref", 12)
    assert r.before_first_divergence == info["step"] and not r.before_identical
    assert r.after_identical and r.after_max_abs_gap < 1e-4 < r.before_max_abs_gap
    assert replayed.stats.tokens.abs_dlogp_max < b.stats.tokens.abs_dlogp_max
    assert replayed.stats.sequences.share_identical == 1.0


def test_a_dumps_recorded_routes_replay_against_the_trainers_and_r3_removes_the_flips_gap(service, planted,
                                                                                          tmp_path):
    """A parity-format dump of the near model's greedy rollout with its real routes (HF gate hooks) and
    logprobs, replayed with the flipped checkpoint as the trainer: the recorded routes differ from the
    trainer's at exactly the planted (layer, token), and rollout routing replay (the trainer scoring
    with the recorded experts) brings its logprobs back to the recorded ones."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parity_ui.engines.routes import routes_hf
    from parity_ui.service import ReplayRequest

    near, flipped, info = planted
    prompt = AutoTokenizer.from_pretrained(near).encode(PROMPT)
    ids = prompt + info["tokens"]
    model = AutoModelForCausalLM.from_pretrained(near, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    lps = [float(logp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(info["tokens"])]
    r = routes_hf(model, ids, list(range(len(ids) - 1)))  # [positions, layers, top_k], as vLLM returns them
    routed = [[r.experts(p, j) for j in range(len(r.layers))] for p in range(r.rows)]
    dump = tmp_path / "rollouts.jsonl"
    dump.write_text(json.dumps({"prompt_ids": prompt, "response_ids": info["tokens"], "rollout_logprobs": lps,
                                "routed_experts": routed, "sampling": {"temperature": 1.0}}) + "\n")
    cfg = build_config(overrides=["dtype=float32", "routes=true"],
                       sides=[f"trainer=hf,model={flipped},replay_routes=ids", "b=hf"])
    run = service.replay(ReplayRequest(dump=str(dump), model=str(near), config=cfg, floor="none"))
    assert run.status in ("ok", "diverged"), run.error
    w = run.workload
    stored = service.store.get_run(run.id, prompts=[0]).prompts[0]
    c = stored.comparison("recorded")
    f = c.measures.get("routes").first_flip  # the rollout's routes against the trainer's, on the same tokens
    assert (f.step, f.layer) == (info["step"], info["layer"]) and c.measures.get("routes").compared == len(info["tokens"])
    assert stored.results["recorded"].routes.ids == stored.results["b"].routes.ids  # the dump's = HF's on near
    assert w.sides["recorded vs trainer"].stats.family("routing")["route_differ"] > 0
    assert w.sides["b vs trainer"].stats.family("routing")["route_differ"] > 0
    natural, r3 = w.sides["recorded vs trainer"].stats.tokens, w.sides["recorded vs trainer+recorded routes"].stats.tokens
    assert r3.abs_dlogp_max < 1e-4 < natural.abs_dlogp_max and r3.pairs == natural.pairs == len(info["tokens"])


@pytest.fixture(scope="module")
def glm(build_tiny):
    return build_tiny("glm4_moe", num_hidden_layers=2)


def test_grouped_sigmoid_router_with_shared_expert_routes_alike_on_both_engines(service, glm):
    model = glm
    cfg = build_config(overrides=["dtype=float32", "max_new_tokens=10", "routes=true", "cross_score=false"],
                       sides=["hf=hf", "vllm=vllm"])
    run = service.run(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT), PromptSpec(text="import os")],
                                 config=cfg))
    assert run.status == "ok", (run.error, [p.comparisons[0].explanation.summary for p in run.prompts])
    for pr in run.prompts:
        hf, vl = pr.results["hf"], pr.results["vllm"]
        assert hf.routes.ids == vl.routes.ids and hf.routes.rows == 10
        c = pr.comparisons[0]
        assert c.measures.get("routes").same_order == 1.0 and c.measures.get("routes").steps_any_differ == 0.0
        assert all(abs(x - y) < 1e-3 for x, y in zip(hf.routes.weights, vl.routes.weights))


def test_a_workload_reports_the_routing_figures_against_its_floor(service, glm):
    """bf16 on the CPU: the routing family pooled for the side and for the floor (the reference again
    at another batch size), judged against it, on the CLI screen and readable by the gate."""
    from parity_ui.commands.gate.metrics import value_of
    from parity_ui.commands.workload.run import WorkloadRequest, run_workload
    from parity_ui.core.figures import FAMILIES
    from parity_ui.core.workload_record import WorkloadOptions
    from parity_ui.render.text import format_workload

    prompts = [PromptSpec(text=t) for t in ("def main(args):", "import os", "class Path(", "return self.",
                                            "for key, value in", "raise ValueError(")]
    cfg = build_config(overrides=["dtype=bfloat16", "max_new_tokens=6", "ignore_eos=true", "routes=true"],
                       sides=["ref=hf", "b=vllm"])
    run = run_workload(service, WorkloadRequest(model=str(glm), prompts=prompts, config=cfg,
                                                options=WorkloadOptions(chunk=3, floor="batch")))
    assert run.status in ("ok", "diverged"), run.error
    w = run.workload
    b, floor = w.sides["b"], w.floor_figures
    for figs in (b, floor):
        r = figs.stats.family("routing")
        assert set(FAMILIES["routing"]) <= set(r) and r["cells"] >= 6 * 2 and r["tokens"] >= 6
        assert 0.0 <= r["route_differ"] <= 1.0 and r["route_same_set"] == pytest.approx(1 - r["route_differ"])
        assert r["route_same_order"] <= r["route_same_set"] <= r["route_overlap"] <= 1.0
    assert "the floor's" in b.verdicts.get("routing") and b.verdicts.get("routing").endswith("floor")
    assert value_of("route_same_set", b.stats) == b.stats.family("routing")["route_same_set"]
    screen = format_workload(w, run.id)
    assert "routes identical" in screen and "tokens with routes differing" in screen
    stored = service.store.get_run(run.id).workload  # the figures are stored with the report
    assert stored.sides["b"].stats.family("routing") == b.stats.family("routing") and stored.sides["b"].verdicts.get("routing") == b.verdicts.get("routing")
    print(screen)  # the figures, for a reader of -s


def test_routes_for_another_model_are_refused_before_replaying(planted):
    """Bad input: routes recorded with other layers, another k, or without weights for ids+weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from parity_ui.core.routes import Routes
    from parity_ui.engines.base import EngineFault
    from parity_ui.engines.routes import ForcedRoutes

    near, _, _ = planted
    model = AutoModelForCausalLM.from_pretrained(near, dtype=torch.float32).eval()
    with pytest.raises(EngineFault, match=r"recorded for MoE layers 3 \(0..2\), and this model's are 2 \(0..1\)"):
        ForcedRoutes(model, Routes(layers=[0, 1, 2], top_k=2, num_experts=8, ids=[0, 1] * 3), 0, "ids")
    with pytest.raises(EngineFault, match="choose 4 of 8 experts, and this model 2 of 8"):
        ForcedRoutes(model, Routes(layers=[0, 1], top_k=4, num_experts=8, ids=[0, 1, 2, 3] * 2), 0, "ids")
    with pytest.raises(EngineFault, match="carry no weights"):
        ForcedRoutes(model, Routes(layers=[0, 1], top_k=2, num_experts=8, ids=[0, 1] * 2), 0, "ids+weights")
    # and forcing works on a plain forward: the recorded experts are the ones used
    from parity_ui.engines.routes import routes_hf

    ids = [1, 5, 9, 12]
    natural = routes_hf(model, ids, [0, 1, 2, 3])
    forced = Routes(layers=[0, 1], top_k=2, num_experts=8,
                    ids=[e if e != natural.ids[0] else (natural.ids[0] + 1) % 8 for e in natural.ids])
    forced.ids[0], forced.ids[1] = 6, 7
    with ForcedRoutes(model, forced, 0, "ids") as f:
        got = routes_hf(model, ids, [0, 1, 2, 3])
    assert got.experts(0, 0) == [6, 7] and f.forced == 4
