"""Issue 41 without an engine: the weight check's records and verdict, the digest comparison, the probe
against its floor, two checkpoints told apart from their headers, quantised values within their
format's tolerance, the vllm-updated mapper, the gate's weights case, the store, the screens, and the
CLI's refusals (named before any engine starts)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from parity_ui.analysis.weights import compare_digests, compare_param_digests, probe_comparison, with_diffs
from parity_ui.core.weights import (
    DIFFERS,
    EMPTY_SHA256,
    EQUAL,
    MISSING,
    TOLERATED,
    UNREADABLE,
    DiffFigure,
    ProbeComparison,
    ProbeRecord,
    SideWeights,
    TensorDigest,
    TensorFigure,
    UpdateRecord,
    WeightReport,
    ordered,
    probe_sequences,
)

TESTS = Path(__file__).resolve().parents[1]


def unit(name, part=None, digest="a", shape=(4, 4), dtype="float32", zero=False, norm=1.0, sources=None):
    return TensorDigest(rank="tp0", name=name, part=part, sources=sources or [name], index=[], shape=list(shape),
                        dtype=dtype, digest=digest, norm=norm, zero=zero)


def side(*units):
    return SideWeights(units=list(units), ranks={"tp0": "|".join(u.digest for u in units)})


# --- comparing digests ------------------------------------------------------------------------------


def test_differing_units_come_first_named_by_their_slice_and_source():
    fresh = side(unit("embed.weight"), unit("qkv.weight", "q_proj", sources=["q_proj.weight"]),
                 unit("qkv.weight", "k_proj", "k", sources=["k_proj.weight"]), unit("norm.weight"))
    live = side(unit("embed.weight"), unit("qkv.weight", "q_proj", sources=["q_proj.weight"]),
                unit("qkv.weight", "k_proj", "STALE", zero=True, norm=0.0, sources=["k_proj.weight"]),
                unit("norm.weight"))
    figures, ranks = compare_digests(live, fresh)
    assert [f.status for f in figures] == [DIFFERS, EQUAL, EQUAL, EQUAL]
    first = figures[0]
    assert first.key == "tp0|qkv.weight[k_proj]" and first.label == "k_proj.weight (in qkv.weight)"
    assert first.live_zero  # all zero live while the fresh load's is not: the miles#2706 shape
    assert ranks == [{"rank": "tp0", "live": live.ranks["tp0"], "ref": fresh.ranks["tp0"], "equal": False}]


def test_a_unit_on_one_side_only_or_of_another_shape_is_not_equal():
    figures, _ = compare_digests(side(unit("a"), unit("extra")), side(unit("a", shape=(2, 8)), unit("b")))
    by = {f.name: f for f in figures}
    assert by["a"].status == DIFFERS and "shape" in by["a"].note
    assert by["b"].status == MISSING and by["extra"].status == MISSING


def test_an_unreadable_side_gives_no_figures_and_says_why():
    figures, ranks = compare_digests(SideWeights(readable=False, why="a server without a checker"), side(unit("a")))
    assert figures == [] and ranks[0]["why"] == "a server without a checker"


def test_measured_differences_land_on_their_rows_and_a_quantised_one_within_tolerance_is_tolerated():
    figures, _ = compare_digests(side(unit("w1", digest="x"), unit("w2", digest="y"), unit("w3", digest="z")),
                                 side(unit("w1"), unit("w2"), unit("w3")))
    diffs = [DiffFigure("tp0|w1", 0.5, 0.1, 3, 16), DiffFigure("tp0|w2", 1e-3, 1e-3, 0, 16, "fp8 e4m3", True)]
    out = with_diffs(figures, diffs, over_budget={"tp0|w3"})
    by = {f.name: f for f in out}
    assert by["w1"].status == DIFFERS and (by["w1"].max_abs, by["w1"].n_differ) == (0.5, 3)
    assert by["w2"].status == TOLERATED and "fp8 e4m3" in by["w2"].note
    assert "over the transfer budget" in by["w3"].note
    assert [f.name for f in out][-1] == "w2"  # tolerated sorts after the differing ones


def test_a_quantised_unit_one_step_off_is_not_landed():
    """fp8 values one step from the fresh load's: what a re-quantisation gives, and also what a tensor
    left stale by a small update gives. A fresh load of the same checkpoint holds the same bytes, so it
    is NOT landed, and the headline says how close it is."""
    figures, _ = compare_digests(side(unit("w1"), unit("w2", digest="y")), side(unit("w1"), unit("w2")))
    r = WeightReport(model="B", start_from="A", updated="u", fresh="f", reference=None,
                     tensors=with_diffs(figures, [DiffFigure("tp0|w2", 0.125, 0.1, 0, 16, "fp8 e4m3", True)], set()))
    assert not r.tensors_equal and r.exit_code == 1 and r.verdict == "NOT LANDED"
    assert "1 of 2 tensors differ" in r.headline() and "1 of them within one quantisation step" in r.headline()
    # A report stored under the old name is read by the same rule.
    d = r.to_dict()
    for t in d["tensors"]:
        t["status"] = "within tolerance" if t["status"] == TOLERATED else t["status"]
    assert WeightReport.from_dict(d).verdict == "NOT LANDED"


def test_a_servers_parameter_digests_are_compared_and_empty_ones_are_not_readable():
    ref = {"dp0:pp0:tp0:embed": "e", "dp0:pp0:tp0:qkv": EMPTY_SHA256, "dp0:pp0:tp0:norm": "n"}
    live = {"dp0:pp0:tp0:embed": "e", "dp0:pp0:tp0:qkv": EMPTY_SHA256, "dp0:pp0:tp0:norm": "N"}
    out = compare_param_digests(live, ref, EMPTY_SHA256)
    assert [(f.name, f.status) for f in out] == [("norm", DIFFERS), ("qkv", UNREADABLE), ("embed", EQUAL)]
    assert out[0].rank == "dp0:pp0:tp0"


# --- the probe ---------------------------------------------------------------------------------------


def _lp(n_seq=8, n=32, shift=0.0, seed=0):
    import random

    rng = random.Random(seed)
    return [[-abs(rng.gauss(1.0, 0.5)) + shift for _ in range(n)] for _ in range(n_seq)]


def test_the_probe_is_at_the_floor_when_the_updated_side_matches_the_fresh_load():
    ref = _lp()
    fresh = [[x + 1e-5 for x in s] for s in ref]
    c = probe_comparison("updated", "ref", "fresh vs ref", fresh, ref, fresh, ref)
    assert c.at_floor and c.tokens == 256 and c.first_token is None


def test_a_stale_tensor_moves_the_probe_above_the_floor_and_names_the_first_token():
    ref = _lp()
    fresh = [[x + 1e-5 for x in s] for s in ref]
    stale = [list(s) for s in fresh]
    for s in stale:
        s[5] -= 0.3  # the stale layer's effect shows from the 6th token of every sequence
    c = probe_comparison("updated", "ref", "fresh vs ref", stale, ref, fresh, ref)
    assert not c.at_floor and c.verdict == "exceeds noise" and c.first_token == 5


def test_tokens_an_engine_cannot_score_at_all_exceed_the_floor():
    """A NaN weight makes every logprob NaN (the engine reports it masked): no pair to pool, yet not
    'within noise'."""
    ref = _lp()
    broken = [[-1e30] * len(s) for s in ref]
    c = probe_comparison("updated", "ref", "fresh vs ref", broken, ref, ref, ref)
    assert c.verdict == "exceeds noise" and "no finite logprob" in c.summary and c.first_token == 0


def test_probe_sequences_are_fixed_texts_then_seeded_ids_of_the_asked_length():
    enc = lambda text: [ord(c) % 100 for c in text]  # noqa: E731
    a = probe_sequences(enc, 100, tokens=256, sequences=8)
    assert a == probe_sequences(enc, 100, tokens=256, sequences=8)
    assert len(a) == 8 and all(len(s) == 33 for s in a) and sum(len(s) - 1 for s in a) == 256
    short = probe_sequences(lambda t: [1, 2], 50, tokens=20, sequences=10)
    assert all(len(s) == 3 and s[:2] == [1, 2] for s in short[:8]) and all(0 <= x < 50 for s in short for x in s)


# --- the report --------------------------------------------------------------------------------------


def _report(**kw):
    tensors = [TensorFigure("tp0|a", "tp0", "a", None, ["a"], [2], "float32", EQUAL, "x", "x"),
               TensorFigure("tp0|q[k_proj]", "tp0", "q", "k_proj", ["k_proj.weight"], [2], "float32", DIFFERS, "y",
                            "x", rel_l2=math.inf, max_abs=0.5, n_differ=2, numel=2)]
    comp = ProbeComparison("updated", "fresh", "fresh twice", 256, 0.2, 0.01, 0.0, 0.0, "exceeds noise", "s")
    return WeightReport(model="B", start_from="A", updated="updated", fresh="fresh", reference="ref",
                        tensors=ordered(tensors), probe=ProbeRecord(8, 256, [comp]),
                        update=UpdateRecord("A", "B", "reload", pushed=20, skipped=["k_proj.weight"]), **kw)


def test_the_report_names_the_differing_tensor_and_its_json_keeps_the_order_and_survives_inf():
    r = _report()
    assert r.exit_code == 1 and r.verdict == "NOT LANDED"
    assert "1 of 2 tensors differ: k_proj.weight (in q)" in r.headline() and "probe above the floor" in r.headline()
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert d["differing"] == ["tp0|q[k_proj]"] and d["tensors"][0]["key"] == "tp0|q[k_proj]"
    assert d["tensors"][0]["rel_l2"] == "inf" and d["exit_code"] == 1
    back = WeightReport.from_dict(d)
    assert back.tensors[0].rel_l2 == math.inf and back.probe.comparisons[0].verdict == "exceeds noise"
    assert back.update.skipped == ["k_proj.weight"] and back.headline() == r.headline()


def test_exit_codes_every_tensor_equal_and_the_probe_at_the_floor_or_an_error():
    r = _report()
    r.tensors = [t for t in r.tensors if t.status == EQUAL]
    r.probe.comparisons[0].verdict = "within noise"
    assert r.exit_code == 0 and r.verdict == "LANDED"
    r.error = "the engine died"
    assert r.exit_code == 2
    probe_only = WeightReport(model="B", start_from=None, updated="server", fresh="fresh", reference="ref",
                              readable=False, not_readable="no /weight_checker", probe=r.probe)
    assert probe_only.exit_code == 0 and "probe only" in probe_only.headline()
    assert WeightReport(model="B", start_from=None, updated="s", fresh="f", reference=None, readable=False).exit_code == 2
    only_unread = _report()
    only_unread.tensors = [TensorFigure("tp0|b", "tp0", "b", None, [], [1], "float32", UNREADABLE, "x", None)]
    assert not only_unread.tensors_equal  # nothing checked is not "every tensor equal"


def test_a_probe_shown_but_not_judged_neither_fails_the_weights_nor_stands_in_for_them():
    """check() without calibrate(): the probe has no floor, so it is shown and not judged. Every tensor
    equal is LANDED (it said NOT LANDED, 'probe above the floor'); with no tensor readable it is no
    evidence at all (ERROR)."""
    r = _report()
    r.tensors = [t for t in r.tensors if t.status == EQUAL]
    r.probe.comparisons[0].judged = False
    r.probe.comparisons[0].verdict = "exceeds noise"
    assert r.exit_code == 0 and r.headline().startswith("LANDED:") and "not judged" in r.headline()
    r.readable = False
    assert r.exit_code == 2


def test_the_screens_list_differing_tensors_first():
    from parity_ui.render.weights import check_choices, format_weights, weights_html

    r = _report(run_id="RUN1")
    text = format_weights(r)
    assert text.index("DIFFERS") < text.index("equal      tp0|a") and "left out: k_proj.weight" in text
    html = weights_html(r)
    assert html.index('data-status="differs"') < html.index('data-status="equal"')
    assert "k_proj.weight" in html and 'data-verdict="NOT LANDED"' in html
    label, value = check_choices([{"run_id": "RUN1", "exit_code": 1, "datetime_utc": "2026-11-28T05:00:00",
                                   "model": "/x/step-200", "differing": 1}])[0]
    assert value == "RUN1" and "NOT LANDED" in label and "step-200" in label


def test_the_store_keeps_a_check_and_lists_it(tmp_path):
    from parity_ui.store import Store

    store = Store.open(tmp_path / "runs.db")
    r = _report(run_id="RUN1")
    store.save_weight_check("RUN1", "2026-11-28T05:00:00", r.to_dict())
    assert WeightReport.from_dict(store.weight_check("RUN1")).headline() == r.headline()
    rows = store.weight_checks()
    assert rows[0]["run_id"] == "RUN1" and rows[0]["differing"] == 1 and rows[0]["exit_code"] == 1
    assert store.weight_check("NOPE") is None


# --- checkpoints, before loading -------------------------------------------------------------------


def _ckpt(folder: Path, arch="LlamaForCausalLM", tensors=None, **cfg):
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "llama",
                                                     "hidden_size": 8, "num_hidden_layers": 1, **cfg}))
    save_file({k: np.zeros(s, dtype=np.float32) for k, s in (tensors or {"a.weight": (8, 8)}).items()},
              str(folder / "model.safetensors"))
    return folder


def test_checkpoints_of_another_architecture_shape_or_tensors_are_named_before_loading(tmp_path):
    from parity_ui.inputs.checkpoints import compatibility, tensor_index

    a = _ckpt(tmp_path / "a", tensors={"a.weight": (8, 8), "b.weight": (8,), "old.weight": (2,)})
    same = _ckpt(tmp_path / "same", tensors={"a.weight": (8, 8), "b.weight": (8,), "old.weight": (2,)})
    assert tensor_index(a).tensors["a.weight"] == ("F32", [8, 8])
    ok = compatibility(a, same)
    assert ok.errors == [] and ok.warnings == [] and ok.unknown == []
    other = compatibility(a, _ckpt(tmp_path / "qwen", arch="Qwen2ForCausalLM", hidden_size=16))
    assert any("Qwen2ForCausalLM" in e for e in other.errors) and any("hidden_size 8 -> 16" in e for e in other.errors)
    names = compatibility(a, _ckpt(tmp_path / "b", tensors={"a.weight": (8, 4), "b.weight": (8,), "new.weight": (3,)}))
    assert names.unknown == ["new.weight"] and any("new.weight" in e and "unknown" in e for e in names.errors)
    assert any("a.weight [8, 8] -> [8, 4]" in e for e in names.errors)
    assert names.not_pushed == ["old.weight"] and "stay as loaded" in names.warnings[0]


def test_a_checkpoint_of_pickles_is_refused(tmp_path):
    from parity_ui.core.errors import ModelError
    from parity_ui.inputs.checkpoints import tensor_index

    (tmp_path / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(ModelError, match="PyTorch pickles") as e:
        tensor_index(tmp_path)
    assert "never unpickles" in e.value.fix


# --- quantised values ---------------------------------------------------------------------------------


def test_fp8_weights_are_compared_dequantised_within_one_step_of_the_format():
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from parity_ui.engines.weight_quant import compare_values, dequantised

    w = torch.randn(16, 32)
    scale = w.abs().amax(dim=1, keepdim=True) / 448.0
    q = (w / scale).to(torch.float8_e4m3fn)
    layer = SimpleNamespace(weight_scale=scale)
    a, fmt, smax = dequantised(layer, "weight", q)
    assert fmt == "float8_e4m3fn" and a.dtype == torch.float32 and torch.allclose(a, w, rtol=0.07, atol=1e-3)
    # one ULP up on a few values (another rounding of the same weights): within the tolerance
    bumped = (q.view(torch.uint8) + (torch.arange(q.numel()).reshape(q.shape) % 7 == 0).to(torch.uint8))
    b, _, _ = dequantised(layer, "weight", bumped.view(torch.float8_e4m3fn))
    fig = compare_values("k", a, b, fmt, smax)
    assert fig.within_tolerance and fig.n_differ == 0 and "fp8 e4m3" in fig.tolerance
    # a stale tensor is not
    stale, _, _ = dequantised(layer, "weight", (torch.randn(16, 32) / scale).to(torch.float8_e4m3fn))
    assert not compare_values("k", a, stale, fmt, smax).within_tolerance
    # unquantised: exact, bit for bit
    exact = compare_values("k", w, w.clone(), None)
    assert exact.n_differ == 0 and exact.max_abs == 0.0 and exact.rel_l2 == 0.0
    assert dequantised(SimpleNamespace(), "weight", w)[1] is None


def test_block_scales_cover_their_tiles():
    torch = pytest.importorskip("torch")
    from parity_ui.engines.weight_quant import _broadcast

    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    full = _broadcast(scale, torch.zeros(4, 6))
    assert full.shape == (4, 6) and full[0, 0] == 1 and full[0, 5] == 2 and full[3, 0] == 3 and full[3, 5] == 4


# --- the vllm-updated side's mapping --------------------------------------------------------------


def _args(on_gpu: bool, **options):
    from parity_ui.core.config import config_from_dict
    from parity_ui.core.mapping import map_side, resolve
    from parity_ui.core.types import ModelInfo

    cfg = config_from_dict({"sides": [{"name": "ref", "kind": "hf"},
                                      {"name": "upd", "kind": "vllm-updated", **options}]})
    model = ModelInfo(name="b", path="/ckpt/B", architecture="LlamaForCausalLM", config_dtype="float32",
                      max_position_embeddings=2048)
    return map_side(cfg, cfg.side("upd"), resolve(model, [2], on_gpu))


def test_the_updated_side_loads_start_from_and_pushes_its_model():
    a = _args(False, start_from="/ckpt/A", skip="layers\\.0\\.", sleep=1)
    assert a.llm["model"] == "/ckpt/A" and a.llm["tokenizer"] == "/ckpt/B"
    assert a.update == {"start_from": "/ckpt/A", "pushed_from": "/ckpt/B", "skip": "layers\\.0\\.", "zero": None,
                        "sleep": 1, "path": "reload"}  # auto on the CPU build: reload
    assert "enable_sleep_mode" not in a.llm  # refused on the CPU platform
    g = _args(True, start_from="/ckpt/A", sleep=2)
    assert g.update["path"] == "load_weights" and g.llm["enable_sleep_mode"] is True


def test_the_updated_side_refuses_what_cannot_work_with_the_fix():
    from parity_ui.core.errors import ConfigError, SideError

    with pytest.raises(SideError, match="needs the checkpoint it starts from"):
        _args(False)
    with pytest.raises(SideError, match="load_weights cannot land on vLLM's CPU build") as e:
        _args(False, start_from="/a", update_path="load_weights")
    assert "update_path=reload" in e.value.fix
    with pytest.raises(ConfigError, match="regular expression"):
        _args(False, start_from="/a", skip="layers[")


# --- the gate's weights case ------------------------------------------------------------------------


def _spec(tmp_path, text):
    from parity_ui.commands.gate.spec import load_spec

    p = tmp_path / "gate.yaml"
    p.write_text(text)
    return load_spec(p)


def test_a_weights_case_reads_its_push_and_its_planted_control(tmp_path):
    spec = _spec(tmp_path, "cases:\n  - name: w\n    model: ./b\n    weights: {from: ./a, sleep: 1}\n"
                           "    control: {skip: 'layers[.]0[.]'}\n")
    case = spec.cases[0]
    assert case.weights.start_from == str(tmp_path / "a")  # resolved against the spec's folder
    assert case.weights.sleep == 1 and case.weights.probe and case.control.weights == {"skip": "layers[.]0[.]"}
    assert "skip" in case.control.describe()


@pytest.mark.parametrize("body, words", [
    ("    weights: {from: ./a}\n    thresholds: {share_identical: 0.9}\n", "a weights case takes no thresholds"),
    ("    weights: {from: ./a, url: 'http://h:1/v1'}\n", "from (a checkpoint the engine starts from) or url"),
    ("    weights: {from: ./a}\n    control: {set: {b.dtype: float16}}\n", "plants a fault in the push"),
    ("    weights: {from: ./a, bogus: 1}\n", "bogus"),
])
def test_a_weights_case_is_refused_with_its_line(tmp_path, body, words):
    from parity_ui.commands.gate.spec import SpecError

    with pytest.raises(SpecError) as e:
        _spec(tmp_path, "cases:\n  - name: w\n    model: ./b\n" + body)
    assert words in str(e.value) and "gate.yaml:" in str(e.value)


# --- the CLI: bad input refused before any engine, nothing stored, exit 2 ----------------------------------


def test_the_cli_refuses_another_architecture_and_an_unmatched_skip_before_any_engine(tmp_path):
    sys.path.insert(0, str(TESTS))
    from parity_cli import parity

    a = _ckpt(tmp_path / "a", tensors={"a.weight": (8, 8)})
    b = _ckpt(tmp_path / "b", arch="Qwen2ForCausalLM", tensors={"a.weight": (8, 8)})
    db = tmp_path / "runs.db"
    r = parity("weights", "--model", str(b), "--from", str(a), "--json", db=db)
    assert r.returncode == 2, r.stderr
    assert "Qwen2ForCausalLM" in r.stderr and "Fix:" in r.stderr, r.stderr
    assert r.stdout == ""  # a refusal: no report to print
    both = parity("weights", "--model", str(b), "--from", str(a), "--url", "http://127.0.0.1:1/v1", db=db)
    assert both.returncode == 2 and "not both" in both.stderr
    # Refused before any engine started: nothing stored (issue 46 item 5, as parity compare)
    from parity_ui.store import Store

    store = Store.open(db)
    assert store.weight_checks() == [] and store.list_runs() == []


def test_the_in_loop_api_imports_without_the_ui_or_an_engine():
    import subprocess

    code = ("import sys, parity_ui.weights, parity_ui.commands.weights; "
            "assert not {'gradio', 'plotly', 'torch', 'vllm'} & set(sys.modules), sorted(sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_a_server_without_a_weight_checker_is_not_readable_and_says_which_vllm_has_one():
    """A server that answers 404 on POST /weight_checker (vLLM 0.26, or 0.32 outside dev mode): the
    check says "not readable" with the reason, and the probe is then the whole check."""
    sys.path.insert(0, str(TESTS))
    from misbehaving_server import MODEL, FakeServer
    from parity_ui.core.requests import LoadRequest
    from parity_ui.core.weights import WeightsRequest
    from parity_ui.engines.openai_engine import OpenAIEngine

    server = FakeServer(lambda text: [ord(c) % 500 for c in text])
    try:
        engine = OpenAIEngine()
        engine.load(LoadRequest("openai", MODEL, {"connection": {
            "url": f"http://127.0.0.1:{server.server_address[1]}/v1", "served_model": None, "api_key_env": None,
            "timeout_s": 3.0, "verify_tls": True, "check_tokenizer": False}}))
        got = engine.weights(WeightsRequest(None))
    finally:
        server.shutdown()
        server.server_close()
    assert not got.readable and got.units == [] and got.params == {}
    assert "0.32.0-fake" in got.why and "VLLM_SERVER_DEV_MODE=1" in got.why and "0.26" in got.why
    assert ("/weight_checker", {"action": "checksum"}) in server.requests


def test_a_unit_in_the_engines_own_layout_is_checked_for_change_since_calibration():
    """calibrate() cannot read such a unit against the state dict (the engine re-lays it out), so it
    compares change: a push that skipped it (its weights moved, its bytes did not) is named, even where
    the calibration was made on a state dict the engine did not hold; unchanged with its weights is
    equal; both moved cannot be judged here."""
    from parity_ui.weights import WeightChecker

    c = object.__new__(WeightChecker)
    c.unmapped = {"tp0|experts": "re-laid out"}
    c.at_calibration = {"tp0|experts": ("live-A", "dict-A")}
    assert c._since_calibration("tp0|experts", "live-A", "dict-A")[0] == EQUAL
    status, note = c._since_calibration("tp0|experts", "live-A", "dict-B")
    assert status == DIFFERS and "not pushed" in note
    status, note = c._since_calibration("tp0|experts", "live-X", "dict-A")
    assert status == DIFFERS and "its weights did not" in note
    assert c._since_calibration("tp0|experts", "live-B", "dict-B")[0] == UNREADABLE
    assert c._since_calibration("tp0|experts", "live-B", None)[0] == UNREADABLE  # the state dict lacks it


def test_a_skip_of_tensors_the_pushed_checkpoint_did_not_change_is_refused_before_loading(tmp_path):
    """A tensor left out of the push keeps A's bytes: where B holds the same ones the check cannot see
    it, so a planted --skip there would prove nothing (a LANDED that looks like a caught fault's miss)."""
    import numpy as np
    from safetensors.numpy import save_file

    from parity_ui.commands.weights import WeightsCheckRequest, WeightsError, check_request
    from parity_ui.inputs.checkpoints import changed_tensors

    a = _ckpt(tmp_path / "a", tensors={"a.weight": (8, 8), "b.weight": (8,)})
    b = _ckpt(tmp_path / "b", tensors={"a.weight": (8, 8), "b.weight": (8,)})
    save_file({"a.weight": np.zeros((8, 8), dtype=np.float32), "b.weight": np.ones(8, dtype=np.float32)},
              str(b / "model.safetensors"))  # B changed b.weight only
    assert changed_tensors(a, b, ["a.weight", "b.weight"]) == ["b.weight"]
    with pytest.raises(WeightsError) as e:
        check_request(WeightsCheckRequest(model=str(b), start_from=str(a), skip=r"^a\.weight"))
    assert "hold the same bytes" in str(e.value) and "--zero" in e.value.fix
    model, start = check_request(WeightsCheckRequest(model=str(b), start_from=str(a), skip=r"b\.weight"))
    assert start is not None and model.path == str(b.resolve())


def test_a_weights_gate_case_that_checked_nothing_is_an_error_not_a_pass():
    """A server whose tensors cannot be read and no judged probe (probe: false, or no floor): the gate
    said PASS with every check skipped."""
    from parity_ui.commands.gate.check import _weights_outcomes

    r = WeightReport(model="B", start_from=None, updated="server", fresh="fresh", reference=None,
                     readable=False, not_readable="no /weight_checker on this server")
    (o,) = _weights_outcomes(r, 3)
    assert o.status == "error" and "nothing could be checked" in o.message and "weight_checker" in o.message
