"""`parity check` with the real engines on the CPU (the demo model, 3 prompts, 8 tokens): the
built-in self-test (HF float32 against vLLM float32 passes; its control, vLLM in bfloat16, fails
the same thresholds), a bfloat16 case that passes loose thresholds and fails strict ones with the
figure and the limit in the JUnit message, and the README's CI job run here on its own spec
(examples/gate.yaml: the old environment against the new one, its control a copy of the model with
one layer noised). The CLI's main() runs in this process on the session's warm workers
(conftest.cli_on_warm_workers): the self-test and the bfloat16 case share the demo model's HF worker,
and the job's second run reuses the first's."""
from __future__ import annotations

import json
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from parity_ui.cli import main
from parity_ui.commands.gate.check import prepare_cases, run_check, select
from parity_ui.commands.gate.junit import junit_xml
from parity_ui.store.checks import check_result
from parity_ui.commands.gate.spec import parse_spec
from parity_ui.store.runs import get_run, open_db

ROOT = Path(__file__).resolve().parents[2]


def _suites(path_or_text):
    root = ET.fromstring(path_or_text) if isinstance(path_or_text, str) else ET.parse(path_or_text).getroot()
    return {s.get("name"): {tc.get("name"): tc for tc in s.iter("testcase")} for s in root.findall("testsuite")}


def test_the_self_test_passes_in_float32_and_its_bfloat16_control_fails(tmp_path, cli_on_warm_workers):
    db, junit = str(tmp_path / "runs.db"), tmp_path / "junit.xml"
    code = main(["--db", db, "check", "--self-test", "--junit", str(junit), "--quiet"])
    assert code == 0
    cases = _suites(junit)["self-test-fp32"]
    assert all(tc.find("failure") is None and tc.find("error") is None for tc in cases.values())
    assert list(cases) == ["abs_dlogp_p99 <= 0.02 [vllm]", "k1 <= 0.005 [vllm]", "control: the thresholds fail"]
    odb = open_db(db)
    check = check_result(odb, next(r["run_id"] for r in odb.query("SELECT run_id FROM gate_checks")))
    case = check["cases"][0]
    control = case["control"]
    failed = [o for o in control["outcomes"] if o["status"] == "fail"]
    assert failed and failed[0]["check"] == "abs_dlogp_p99 <= 0.02" and failed[0]["value"] > 0.02
    assert case["outcomes"][0]["value"] < 1e-3  # float32 against float32: rounding only
    ctl = get_run(odb, control["run_id"], prompts=[])
    assert [s.dtype for s in ctl.sides if s.name == "vllm"] == ["bfloat16"]
    assert get_run(odb, case["run_id"], prompts=[]).group_id == ctl.group_id


def test_a_bfloat16_case_passes_loose_thresholds_and_fails_strict_ones(service, tmp_path):
    case = """\
  - name: {name}
    model: demo
    sides: [{{name: ref, kind: hf, dtype: float32}}, {{name: bf16, kind: hf, dtype: bfloat16}}]
    prompts: {{texts: ["Why is the sky blue?", "Write a haiku about the sea.", "What does a compiler do?"]}}
    config: {{max_new_tokens: 8, chat: true, ignore_eos: true}}
    floor: none
    thresholds: {thresholds}
"""
    spec = parse_spec("cases:\n" + case.format(name="loose", thresholds="{abs_dlogp_p99: 1.0, kl: 0.5}")
                      + case.format(name="strict", thresholds="{abs_dlogp_p99: 0.001, share_identical: 1.0}"),
                      "bf16.yaml")
    check = run_check(service, spec, prepare_cases(service, spec, select(spec, None)))
    assert check.exit_code == 1 and [c.status for c in check.cases] == ["pass", "fail"]
    suites = _suites(junit_xml(check))
    assert all(tc.find("failure") is None for tc in suites["loose"].values())
    fail = suites["strict"]["abs_dlogp_p99 <= 0.001 [bf16]"].find("failure")
    p99 = check.cases[1].outcomes[0].value
    assert p99 > 0.001
    assert fail.get("message").startswith(f"abs_dlogp_p99 = {p99:.4g} fails the limit <= 0.001 (side bf16, 3 prompts)")


def test_the_readme_ci_job_runs_here_on_its_own_spec(tmp_path, monkeypatch, alt_env, cli_on_warm_workers):
    """The job's `parity check` step, as the README shows it, on the CPU: hf sides in float32 (the job
    uses vLLM in bfloat16 on a GPU), the old environment transformers 5.17 (tests/alt_env.py), the new
    one this venv, 3 prompts of 8 tokens."""
    import yaml

    job = yaml.safe_load((ROOT / "examples" / "github-actions-gate.yml").read_text())
    step = next(s for j in job["jobs"].values() for s in j["steps"] if "parity check" in s.get("run", ""))
    argv = shlex.split(step["run"])
    assert argv[:3] == [".venv/bin/parity", "check", "examples/gate.yaml"]
    assert set(step["env"]) == {"OLD_PYTHON", "NEW_PYTHON"}
    old_python, _ = alt_env
    for key, value in {"OLD_PYTHON": old_python, "NEW_PYTHON": sys.executable, "GATE_KIND": "hf",
                       "GATE_DTYPE": "float32", "GATE_MODEL": "demo"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(tmp_path)
    args = [str(ROOT / a) if a == "examples/gate.yaml" else a for a in argv[2:]]
    db = str(tmp_path / "runs.db")
    code = main(["--db", db, "check", *args, "--only", "upgrade", "--limit", "3", "--set", "max_new_tokens=8",
                 "--quiet"])
    assert code == 0, (tmp_path / "parity-summary.md").read_text()
    cases = _suites(tmp_path / "parity-junit.xml")["upgrade"]
    assert list(cases) == ["within 2x the noise floor [new]", "abs_dlogp_p99 <= 0.5 [new]",
                           "baseline: last-pass", "control: the thresholds fail"]
    assert cases["baseline: last-pass"].find("skipped") is not None  # the first run starts the corridor
    summary = (tmp_path / "parity-summary.md").read_text()
    assert f"| demo | upgrade | hf 5.17.0: reference | hf {_version(sys.executable)}: PASS |" in summary
    odb = open_db(db)
    check = check_result(odb, next(r["run_id"] for r in odb.query("SELECT run_id FROM gate_checks")))
    control = get_run(odb, check["cases"][0]["control"]["run_id"], prompts=[])
    new = control.side("new")
    made = json.loads((Path(new.model_path) / "parity-control.json").read_text())
    assert made["layer"] == 15 and made["tensors"] and all(".layers.15." in t for t in made["tensors"])
    # A second run of the same job holds it to the first (its last pass): the corridor is checked now
    code = main(["--db", db, "check", *args, "--only", "upgrade", "--limit", "3", "--set", "max_new_tokens=8",
                 "--quiet"])
    assert code == 0
    cases = _suites(tmp_path / "parity-junit.xml")["upgrade"]
    assert "baseline: abs_dlogp_p99 <= baseline + 50% [new]" in cases


def _version(python: str) -> str:
    import subprocess

    return subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                          capture_output=True, text=True).stdout.strip()
