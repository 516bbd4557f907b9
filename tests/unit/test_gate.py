"""`parity check` above the engines, on the fake engine kind in real worker processes: the spec's
validation (every error names the case and the line; nothing is written), thresholds that hold and
fail, the JUnit document (checked against the Ant JUnit schema's rules with xmlschema), the Markdown
summary, the baseline corridor, controls that fail (as they must) and pass (the gate cannot fail),
--only, exit codes and the stored check. Seconds; the real engines are in test_gate_engines.py."""
from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fake_engine import fake_model, registered
from parity_ui.cli import main
from parity_ui.store.checks import check_result
from parity_ui.commands.gate.spec import SpecError, parse_spec
from parity_ui.store.runs import get_run, list_runs, open_db

ROOT = Path(__file__).resolve().parents[2]
XSD = Path(__file__).resolve().parents[1] / "fixtures" / "junit-ant.xsd"


@pytest.fixture(scope="module")
def model(build_tiny):
    with registered():
        yield str(build_tiny("fake", max_position_embeddings=64))


@pytest.fixture(autouse=True)
def fake_kind(model):
    with registered():
        yield


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return x * {i}"}) + "\n" for i in range(6)))
    return f


def _spec(tmp_path, text, name="gate.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _case(model, name="c", sides="[{name: ref, kind: fake}, {name: b, kind: fake}]", thresholds="{share_identical: 1.0}",
          extra=""):
    return (f"  - name: {name}\n    model: {model}\n    sides: {sides}\n    prompts: {{file: prompts.jsonl}}\n"
            f"    config: {{max_new_tokens: 8}}\n    thresholds: {thresholds}\n{extra}")


def _check(tmp_path, spec, *args, capsys=None):
    db = str(tmp_path / "runs.db")
    code = main(["--db", db, "check", str(spec), "--quiet", *args])
    return code, db


# -- validation: each error names the case and the line; nothing is written -----------------------------


def _errors(text, env=None):
    with pytest.raises(SpecError) as e:
        parse_spec(text, "gate.yaml", env=env or {})
    return str(e.value), e.value.problems


def test_every_structural_problem_is_named_with_its_case_and_line():
    text = """\
cases:
  - name: fp32
    model: demo
    prompts: {file: p.jsonl}
    thresholds:
      share_identical: 0.9
      abs_dlogp_p98: 0.1
      kl: "small"
    colour: blue
  - name: other
    prompts: {texts: [hi]}
    thresholds: {within_floor: 1.5}
    floor: none
"""
    msg, problems = _errors(text)
    by = {(p.case, p.line): p.message for p in problems}
    assert "unknown metric 'abs_dlogp_p98'" in by[("fp32", 7)]
    assert "threshold k1 is 'small' (str), must be a number" in by[("fp32", 8)]  # kl: k1's old name, read as it
    assert "unknown key 'colour' in a case" in by[("fp32", 9)]
    assert by[("other", 10)] == "has no model"
    assert "within_floor needs the reference's noise floor, and floor is none" in by[("other", 12)]
    assert "gate.yaml:7: case 'fp32': unknown metric 'abs_dlogp_p98'" in msg and "Fix: metrics: share_identical" in msg


def test_yaml_syntax_errors_env_vars_and_duplicates_have_lines():
    assert _errors("cases:\n  - name: a\n    model: [demo\n")[1][0].line == 4
    msg, p = _errors("cases:\n  - name: a\n    model: ${GATE_MODEL}\n")
    assert p[0].line == 3 and "${GATE_MODEL} is not set" in msg
    _, p = _errors("cases:\n  - name: a\n    name: b\n")
    assert p[0].line == 3 and "given twice (first on line 2)" in p[0].message
    spec = parse_spec("cases:\n  - name: a\n    model: ${M:-demo}\n    prompts: {texts: [x], limit: \"${L:-2}\"}\n"
                      "    thresholds: {share_identical: 1}\n", env={})
    assert spec.cases[0].model == "demo" and spec.cases[0].prompts.limit == 2  # typed after substitution


def test_a_null_whole_number_takes_its_default():
    # `floor_batch_size: ~` once reached the case as None (the default applied only to an absent key)
    spec = parse_spec("cases:\n  - name: c\n    model: demo\n    prompts: {file: p.jsonl, seed: ~}\n"
                      "    thresholds: {share_identical: 0.9}\n    floor: batch\n    floor_batch_size: ~\n",
                      "gate.yaml", env={})
    (case,) = spec.cases
    assert case.floor_batch_size == 8 and case.prompts.seed == 0


def test_bad_spec_exits_2_and_writes_nothing(tmp_path, model, prompts):
    spec = _spec(tmp_path, "cases:\n" + _case(model, thresholds="{share_identical: [1]}"))
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    code, db = _check(tmp_path, spec, "--junit", str(junit), "--markdown", str(md))
    assert code == 2 and not junit.exists() and not md.exists()
    assert list_runs(open_db(db)) == []  # no check record, no run


@pytest.mark.parametrize("change,expect", [
    ("model: /nowhere/model", "case 'c': model '/nowhere/model': model '/nowhere/model' not found: the folder /nowhere/model does not exist"),
    ("prompts: {file: missing.jsonl}", "case 'c': prompts:"),
    ("config: {max_new_tokens: -3}", "config key 'max_new_tokens': is -3"),
    ("check_sides: [zz]", "check_sides names 'zz', which is not a compared side"),
    ("sides: [{name: ref, kind: fake}, {name: b, kind: fake, bogus: 1}]", "'bogus' is not an option of kind fake"),
    ("baseline: {run: 01NOSUCHRUN, slack: {share_identical: 0.1}}", "baseline run '01NOSUCHRUN' does not exist"),
])
def test_problems_found_against_the_machine_name_case_and_line(tmp_path, model, prompts, capsys, change, expect):
    key = change.split(":")[0]
    lines = ["cases:", *_case(model).rstrip("\n").split("\n")]
    hit = [i for i, ln in enumerate(lines) if ln.strip().startswith(key + ":") or ln.strip().startswith("- " + key + ":")]
    if hit:
        lines[hit[0]] = "    " + change
    else:
        lines.append("    " + change)
    line = (hit[0] if hit else len(lines) - 1) + 1
    spec = _spec(tmp_path, "\n".join(lines) + "\n")
    junit = tmp_path / "junit.xml"
    code, _ = _check(tmp_path, spec, "--junit", str(junit))
    err = capsys.readouterr().err
    assert code == 2 and not junit.exists(), err
    assert expect in err and f"gate.yaml:{line}: case 'c'" in err, err


def test_a_baseline_of_another_model_or_other_prompts_is_refused(tmp_path, model, prompts, capsys):
    first = _spec(tmp_path, "cases:\n" + _case(model), "first.yaml")
    code, db = _check(tmp_path, first)
    assert code == 0
    run_id = next(r.id for r in list_runs(open_db(db)) if r.kind == "workload")
    other_model = str(fake_model(tmp_path / "other"))
    spec = _spec(tmp_path, "cases:\n" + _case(other_model, extra=f"    baseline: {{run: {run_id}, slack: {{share_identical: 0.1}}}}\n"))
    assert _check(tmp_path, spec)[0] == 2
    assert f"gate.yaml:8: case 'c': baseline run {run_id} is of model" in capsys.readouterr().err
    spec = _spec(tmp_path, "cases:\n" + _case(model, extra=f"    baseline: {{run: {run_id}, slack: {{share_identical: 0.1}}}}\n")
                 .replace("{file: prompts.jsonl}", "{file: prompts.jsonl, limit: 3}"))
    assert _check(tmp_path, spec)[0] == 2
    assert "ran other prompts (content hash" in capsys.readouterr().err
    # A run that did not finish (stopped after some prompts) is no baseline: its figures cover only those.
    db_ = open_db(db)
    db_.execute("UPDATE runs SET status = 'cancelled' WHERE id = ?", [run_id])
    db_.conn.commit()
    spec = _spec(tmp_path, "cases:\n" + _case(model, extra=f"    baseline: {{run: {run_id}, slack: {{share_identical: 0.1}}}}\n"))
    assert _check(tmp_path, spec)[0] == 2
    assert f"baseline run {run_id} did not finish (cancelled" in capsys.readouterr().err


# -- thresholds, JUnit, Markdown, storage ---------------------------------------------------------------


def _validate_junit(path):
    """Against tests/fixtures/junit-ant.xsd (the Ant JUnit schema's rules), and against another JUnit
    XSD too where $PARITY_JUNIT_XSD names one (e.g. windyroad/JUnit-Schema's JUnit.xsd, Jenkins'
    junit-10.xsd)."""
    xmlschema = pytest.importorskip("xmlschema")
    for xsd in filter(None, [str(XSD), os.environ.get("PARITY_JUNIT_XSD")]):
        xmlschema.XMLSchema(xsd).validate(str(path))  # raises with the rule broken
    return ET.parse(path).getroot()


def test_thresholds_pass_and_fail_with_the_figure_and_limit_in_junit(tmp_path, model, prompts, monkeypatch):
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    spec = _spec(tmp_path, "cases:\n"
                 + _case(model, "same", thresholds="{share_identical: 1.0, abs_dlogp_p99: 0.001, kl: 0.001}")
                 + _case(model, "shifted", sides="[{name: ref, kind: fake}, {name: b, kind: fake, shift: 0.25}]",
                         thresholds="{share_identical: 1.0, abs_dlogp_p99: 0.1, within_floor: 1.5}"))
    junit, md = tmp_path / "out" / "junit.xml", tmp_path / "summary.md"
    code, db = _check(tmp_path, spec, "--junit", str(junit), "--markdown", str(md))
    assert code == 1
    root = _validate_junit(junit)
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["same", "shifted"]
    assert (suites["same"].get("tests"), suites["same"].get("failures")) == ("3", "0")
    assert (suites["shifted"].get("tests"), suites["shifted"].get("failures")) == ("3", "2")
    cases = {tc.get("name"): tc for tc in suites["shifted"].findall("testcase")}
    assert set(cases) == {"share_identical >= 1 [b]", "abs_dlogp_p99 <= 0.1 [b]", "within 1.5x the noise floor [b]"}
    fail = cases["abs_dlogp_p99 <= 0.1 [b]"].find("failure")
    assert fail.get("type") == "threshold"
    assert re.match(r"abs_dlogp_p99 = 0\.25 fails the limit <= 0\.1 \(side b, 6 prompts\) \(run \w+\)", fail.get("message"))
    # the fake reference has no noise of its own: any gap above epsilon exceeds its zero floor
    assert "|Δlogprob| p99 0.25 vs 0 (floor is zero)" in cases["within 1.5x the noise floor [b]"].find("failure").get("message")
    assert cases["share_identical >= 1 [b]"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in suites["shifted"].find("properties")}
    assert props["model"] == model and props["side.b"].startswith("fake")
    # Markdown: the file, and appended to the CI step's summary
    text = md.read_text()
    assert text.startswith("## parity check: FAIL") and "| shifted |" in text and "❌ FAIL" in text
    assert "- **shifted** · abs_dlogp_p99 <= 0.1 [b]: abs_dlogp_p99 = 0.25 fails the limit <= 0.1" in text
    assert summary.read_text() == "earlier step\n" + text
    # Stored: the check as a run of kind "check", its cases' runs in its group, the results as JSON
    odb = open_db(db)
    runs = list_runs(odb)
    check = next(r for r in runs if r.kind == "check")
    assert check.status == "diverged" and {r.group_id for r in runs} == {check.group_id}
    assert sorted(r.kind for r in runs) == ["check", "workload", "workload"]
    stored = check_result(odb, check.id)
    assert stored["exit_code"] == 1 and [c["status"] for c in stored["cases"]] == ["pass", "fail"]
    assert stored["cases"][1]["outcomes"][1]["value"] == pytest.approx(0.25)
    assert get_run(odb, stored["cases"][1]["run_id"]).workload.sides["b"].stats.tokens.abs_dlogp_p99 == pytest.approx(0.25)
    assert odb.execute("SELECT headline FROM runs WHERE id = ?", [check.id]).fetchone()[0] == \
        "gate FAIL: 1/2 cases pass"


def test_the_noise_floor_threshold_fails_a_gap_above_the_floor(tmp_path, model, prompts):
    spec = _spec(tmp_path, "cases:\n" + _case(
        model, sides="[{name: ref, kind: fake, batch_noise: 0.2}, {name: b, kind: fake, shift: 0.05}, "
                     "{name: c, kind: fake, shift: -2.0}]",
        thresholds="{within_floor: 1.5}", extra="    floor: batch\n    floor_batch_size: 4\n"))
    junit = tmp_path / "junit.xml"
    assert _check(tmp_path, spec, "--junit", str(junit))[0] == 1
    cases = {tc.get("name"): tc for tc in _validate_junit(junit).iter("testcase")}
    assert cases["within 1.5x the noise floor [b]"].find("failure") is None
    msg = cases["within 1.5x the noise floor [c]"].find("failure").get("message")
    assert msg.startswith("side c: exceeds noise: ") and "|Δlogprob| median 2 vs" in msg
    assert "absolute limits" not in msg  # the floor moved: its factor means something


def test_a_zero_floor_fails_any_difference_and_the_message_says_to_use_absolute_limits(tmp_path, model, prompts):
    # Seen on an H100: vLLM eager at batch 8 was bit-identical to eager at batch 1, so CUDA graphs'
    # small gap "exceeded" a zero floor on every figure.
    spec = _spec(tmp_path, "cases:\n" + _case(
        model, sides="[{name: ref, kind: fake}, {name: b, kind: fake, shift: 0.01}]",
        thresholds="{within_floor: 1.5}", extra="    floor: batch\n    floor_batch_size: 4\n"))
    junit = tmp_path / "junit.xml"
    assert _check(tmp_path, spec, "--junit", str(junit))[0] == 1
    (tc,) = _validate_junit(junit).iter("testcase")
    msg = tc.find("failure").get("message")
    assert "(floor is zero)" in msg and "gate this pair on absolute limits" in msg


def test_per_figure_floor_factors(tmp_path, model, prompts):
    spec = _spec(tmp_path, "cases:\n" + _case(
        model, sides="[{name: ref, kind: fake, batch_noise: 0.2}, {name: c, kind: fake, shift: -2.0}]",
        thresholds="{within_floor: {abs_dlogp_p99: 1000, abs_dlogp_p50: 1.5}}",
        extra="    floor: batch\n    floor_batch_size: 4\n"))
    junit = tmp_path / "junit.xml"
    assert _check(tmp_path, spec, "--junit", str(junit))[0] == 1
    (tc,) = _validate_junit(junit).iter("testcase")
    assert tc.get("name") == "within the noise floor (abs_dlogp_p99 1000x, abs_dlogp_p50 1.5x) [c]"
    msg = tc.find("failure").get("message")
    assert msg.startswith("side c: |Δlogprob| median 2 vs floor ") and "limit 1.5x): exceeds" in msg
    assert "p99" not in msg  # within its factor of 1000: only what failed is named


def test_exit_codes_and_an_engine_error_is_an_error_in_junit(tmp_path, model, prompts):
    ok = _spec(tmp_path, "cases:\n" + _case(model), "ok.yaml")
    assert _check(tmp_path, ok)[0] == 0
    broken = _spec(tmp_path, "cases:\n" + _case(model, "broken", sides="[{name: ref, kind: fake}, "
                                                                          "{name: b, kind: fake, fail_load: true}]")
                   + _case(model, "fine"), "broken.yaml")
    junit = tmp_path / "junit.xml"
    code, db = _check(tmp_path, broken, "--junit", str(junit))
    assert code == 2
    suites = {s.get("name"): s for s in _validate_junit(junit).findall("testsuite")}
    err = suites["broken"].find("testcase/error")
    assert err is not None and "failed: " in err.get("message") and "fail its load" in err.get("message")
    assert suites["fine"].get("failures") == "0" and suites["fine"].get("errors") == "0"  # the next case still ran


def test_only_runs_the_named_cases_and_an_unknown_name_is_an_error(tmp_path, model, prompts, capsys):
    spec = _spec(tmp_path, "cases:\n" + _case(model, "a") + _case(model, "b", thresholds="{abs_dlogp_max: 0}"))
    junit = tmp_path / "junit.xml"
    code, db = _check(tmp_path, spec, "--only", "b", "--junit", str(junit))
    assert code == 0 and [s.get("name") for s in ET.parse(junit).getroot()] == ["b"]
    assert sum(r.kind == "workload" for r in list_runs(open_db(db))) == 1
    assert _check(tmp_path, spec, "--only", "zz")[0] == 2
    assert "case 'zz': no case has this name (--only) Fix: cases: a, b" in capsys.readouterr().err


# -- baseline corridor -----------------------------------------------------------------------------------


def test_the_baseline_corridor_passes_against_itself_and_fails_against_a_perturbed_run(tmp_path, model, prompts):
    base = _spec(tmp_path, "cases:\n" + _case(model, sides="[{name: ref, kind: fake}, {name: b, kind: fake, shift: 0.01}]",
                                              thresholds="{abs_dlogp_p99: 1.0}"), "base.yaml")
    code, db = _check(tmp_path, base)
    assert code == 0
    base_id = next(r.id for r in list_runs(open_db(db)) if r.kind == "workload")
    corridor = f"    baseline: {{run: {base_id}, slack: {{abs_dlogp_p99: 20%, share_identical: 0.05}}}}\n"
    same = _spec(tmp_path, "cases:\n" + _case(model, sides="[{name: ref, kind: fake}, {name: b, kind: fake, shift: 0.01}]",
                                              thresholds="{abs_dlogp_p99: 1.0}", extra=corridor), "same.yaml")
    junit = tmp_path / "junit.xml"
    assert _check(tmp_path, same, "--junit", str(junit))[0] == 0
    names = [tc.get("name") for tc in ET.parse(junit).getroot().iter("testcase")]
    assert names == ["abs_dlogp_p99 <= 1 [b]", "baseline: abs_dlogp_p99 <= baseline + 20% [b]",
                     "baseline: share_identical >= baseline - 0.05 [b]"]
    worse = _spec(tmp_path, "cases:\n" + _case(model, sides="[{name: ref, kind: fake}, {name: b, kind: fake, shift: -0.05}]",
                                               thresholds="{abs_dlogp_p99: 1.0}", extra=corridor), "worse.yaml")
    assert _check(tmp_path, worse, "--junit", str(junit))[0] == 1  # 0.05 > 0.01 + 20%, though under the threshold 1.0
    fail = next(tc for tc in _validate_junit(junit).iter("testcase") if tc.find("failure") is not None)
    assert fail.get("name") == "baseline: abs_dlogp_p99 <= baseline + 20% [b]"
    assert fail.find("failure").get("message") == (
        f"abs_dlogp_p99 = 0.05 against baseline {base_id}'s 0.01: limit <= 0.012 (slack 20%), outside the corridor (side b)")


def test_last_pass_starts_the_corridor_then_holds_each_check_to_the_last_passing_run(tmp_path, model, prompts):
    def spec(shift):
        return _spec(tmp_path, "cases:\n" + _case(
            model, sides=f"[{{name: ref, kind: fake}}, {{name: b, kind: fake, shift: {shift}}}]",
            thresholds="{abs_dlogp_p99: 1.0}", extra="    baseline: {run: last-pass, slack: {abs_dlogp_p99: 0.001}}\n"),
            f"s{shift}.yaml")

    junit = tmp_path / "junit.xml"
    assert _check(tmp_path, spec(0.02), "--junit", str(junit))[0] == 0
    skipped = next(tc for tc in ET.parse(junit).getroot().iter("testcase") if tc.find("skipped") is not None)
    assert "no passing run of case c" in skipped.find("skipped").get("message")
    assert _check(tmp_path, spec(0.02), "--junit", str(junit))[0] == 0
    assert _check(tmp_path, spec(-0.5), "--junit", str(junit))[0] == 1  # against the last pass at 0.02
    assert _check(tmp_path, spec(0.02), "--junit", str(junit))[0] == 0  # the failed run did not become the baseline
    msgs = [tc.find("failure") for tc in ET.parse(junit).getroot().iter("testcase")]
    assert msgs == [None, None]


# -- controls ---------------------------------------------------------------------------------------------


def test_a_control_that_fails_proves_the_gate_and_one_that_passes_fails_the_check(tmp_path, model, prompts):
    good = _spec(tmp_path, "cases:\n" + _case(model, thresholds="{abs_dlogp_p99: 0.1}",
                                              extra="    control: {set: {b.shift: -0.5}}\n"), "good.yaml")
    junit, md = tmp_path / "junit.xml", tmp_path / "s.md"
    code, db = _check(tmp_path, good, "--junit", str(junit), "--markdown", str(md))
    assert code == 0
    tc = [t for t in _validate_junit(junit).iter("testcase")][-1]
    assert tc.get("name") == "control: the thresholds fail" and tc.find("failure") is None
    assert "fails, as it must" in md.read_text()
    kinds = sorted(r.kind for r in list_runs(open_db(db)))
    assert kinds == ["check", "workload", "workload"]  # the case's run and its control's
    weak = _spec(tmp_path, "cases:\n" + _case(model, thresholds="{abs_dlogp_p99: 1.0}",
                                              extra="    control: {set: {b.shift: -0.5}}\n"), "weak.yaml")
    code, db = _check(tmp_path, weak, "--junit", str(junit), "--markdown", str(md))
    assert code == 1
    fail = [t for t in _validate_junit(junit).iter("testcase")][-1].find("failure")
    assert fail.get("type") == "control"
    assert fail.get("message").startswith("the gate cannot fail: its control passed (b.shift=-0.5: every one of 1 checks")
    assert "**passed: the gate cannot fail**" in md.read_text()


def test_a_control_that_changes_nothing_is_a_spec_error(tmp_path, model, prompts, capsys):
    spec = _spec(tmp_path, "cases:\n" + _case(model, extra="    control: {set: {b.shift: 0.0}}\n"))
    assert _check(tmp_path, spec)[0] == 2
    assert "gate.yaml:8: case 'c': the control's set changes nothing" in capsys.readouterr().err


def test_a_control_set_into_a_value_that_is_not_a_section_is_a_spec_error(tmp_path, model, prompts, capsys):
    # The control's set goes through the same dotted-key rule as --set (config.set_key).
    spec = _spec(tmp_path, "cases:\n" + _case(model, extra="    control: {set: {max_new_tokens.x: 1}}\n"))
    assert _check(tmp_path, spec)[0] == 2
    assert "gate.yaml:8: case 'c': control: config key 'max_new_tokens.x': is not a section" in capsys.readouterr().err


# -- upgrades: sides in two environments ------------------------------------------------------------------


def test_sides_in_two_environments_give_the_per_model_table(tmp_path, model, prompts):
    py = sys.executable
    spec = _spec(tmp_path, "cases:\n" + _case(
        model, "upgrade", sides=f"[{{name: old, kind: fake, python: {py}}}, {{name: new, kind: fake, python: {py}}}]"))
    md = tmp_path / "s.md"
    code, db = _check(tmp_path, spec, "--markdown", str(md), "--json")
    assert code == 0
    text = md.read_text()
    assert "### Upgrade: each environment's side, per model" in text
    assert f"| {model} | upgrade | fake 0: reference | fake 0: PASS |" in text


def test_a_missing_interpreter_is_a_spec_error_with_its_line(tmp_path, model, prompts, capsys):
    spec = _spec(tmp_path, "cases:\n" + _case(model, sides="[{name: old, kind: fake, python: /no/python}, {name: new, kind: fake}]"))
    assert _check(tmp_path, spec)[0] == 2
    assert "gate.yaml:4: case 'c': side old: python '/no/python' is not an executable file" in capsys.readouterr().err


# -- the examples and the docs' CI gate page ----------------------------------------------------------


def test_the_examples_validate_and_the_ci_gate_page_embeds_them_verbatim():
    page = (ROOT / "docs" / "ci-gate.md").read_text()
    for name in ("gate.yaml", "github-actions-gate.yml", "gate-gpu.yaml"):
        text = (ROOT / "examples" / name).read_text()
        assert text in page, f"docs/ci-gate.md does not embed examples/{name} exactly"
    env = {"OLD_PYTHON": sys.executable, "NEW_PYTHON": sys.executable}
    for name in ("gate.yaml", "gate-gpu.yaml"):
        spec = parse_spec((ROOT / "examples" / name).read_text(), name, base=ROOT / "examples", env=env)
        assert spec.cases and all(c.control is not None for c in spec.cases)
    import yaml

    job = yaml.safe_load((ROOT / "examples" / "github-actions-gate.yml").read_text())
    steps = [s.get("run", "") for j in job["jobs"].values() for s in j["steps"]]
    assert any("parity check examples/gate.yaml" in s and "--junit" in s for s in steps)


def test_a_corridor_on_a_metric_neither_run_measured_fails_unless_none_is_the_best():
    """route_same_set on a side that records no routes: neither run has it, and the corridor checked
    nothing (it passed); median_first_divergence missing in both means nothing diverged: a pass."""
    from parity_ui.commands.gate.judge import _corridor
    from parity_ui.commands.gate.spec import Slack
    from parity_ui.core.pooled import workload_stats

    empty = workload_stats([])
    got = _corridor(empty, empty, "b", Slack("route_same_set", 0.01, False, 7), "B1", "baseline")
    assert got.status == "fail" and "checked nothing" in got.message
    ok = _corridor(empty, empty, "b", Slack("median_first_divergence", 2, False, 8), "B1", "baseline")
    assert ok.status == "pass"
