"""`parity check SPEC`: read and check the spec, run its cases in the service it is given, write what
CI reads.

Exit 0: every threshold held and every control failed them; 1: a threshold failed, or a control
passed (the gate cannot fail); 2: an error (a spec that does not validate, naming case and line;
a case whose run failed). A spec that does not validate writes nothing: no run, no JUnit, no
summary. Outputs are written whole or not at all (a temporary file and a rename).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ...core.errors import ParityError
from ...core.runlog import EventCallback
from ..service_api import Service
from .check import CheckResult, prepare_cases, run_check, select
from .junit import junit_xml, write_atomic
from .spec import load_spec
from .summary import markdown as markdown_text
from .summary import text


def run_gate(
    service: Service,
    spec_path: str | None,
    *,
    self_test_model: str | None = None,
    only: list[str] | None = None,
    overrides: list[str] | None = None,
    limit: int | None = None,
    junit: str | None = None,
    markdown: str | None = None,
    say: Callable[[str], None] | None = None,
    emit: EventCallback | None = None,
) -> CheckResult:
    """The spec at `spec_path` (or the built-in self-test on `self_test_model`) checked, its cases run
    in `service`, judged and stored; JUnit and Markdown written where asked (and the Markdown
    appended to $GITHUB_STEP_SUMMARY when that is set). Raises SpecError / ParityError before
    anything runs."""
    if self_test_model is not None:
        from .selftest import self_test_spec

        spec = self_test_spec(self_test_model, gpu=service.on_gpu)
    elif spec_path is None:
        raise ParityError(
            "no gate spec given", "give a spec file (parity check examples/gate.yaml) or --self-test", code="spec"
        )
    else:
        spec = load_spec(spec_path)
    cases = prepare_cases(service, spec, select(spec, only), overrides=overrides or [], limit=limit)
    check = run_check(service, spec, cases, say=say, emit=emit)
    check.screen = text(check)
    md = markdown_text(check)
    if junit:
        write_atomic(junit, junit_xml(check))
    if markdown:
        write_atomic(markdown, md)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(md)
    return check
