"""A check as JUnit XML: one <testsuite> per case, one <testcase> per threshold x side (and one for
the control), the figure and the limit in each failure's message.

The shape follows the strictest JUnit schema CI systems read, Apache Ant's (the JUnit.xsd of
windyroad/JUnit-Schema; Jenkins' junit-10.xsd and GitLab/GitHub reporters accept a superset):
<testsuites> without attributes; each <testsuite> with package, id, name, timestamp (no time zone),
hostname, tests, failures, errors, skipped, time, then <properties>, the test cases, <system-out>
and <system-err>; a <testcase> with name, classname and time, holding at most one of <failure>,
<error> or <skipped>, each failure and error with a type.
"""

from __future__ import annotations

import os
import socket
import tempfile
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path

from .check import CheckResult

PACKAGE = "parity.gate"


def junit_xml(check: CheckResult) -> str:
    """The check as a JUnit XML document (text)."""
    root = ET.Element("testsuites")
    stamp = _timestamp(check.created_utc)
    host = socket.gethostname() or "localhost"
    for i, case in enumerate(check.cases):
        checks = case.checks
        suite = ET.SubElement(
            root,
            "testsuite",
            {
                "package": PACKAGE,
                "id": str(i),
                "name": case.name,
                "timestamp": stamp,
                "hostname": host,
                "tests": str(len(checks)),
                "failures": str(sum(o.status == "fail" for o in checks)),
                "errors": str(sum(o.status == "error" for o in checks)),
                "skipped": str(sum(o.status == "skipped" for o in checks)),
                "time": f"{case.duration_s:.3f}",
            },
        )
        props = ET.SubElement(suite, "properties")
        for name, value in (
            ("model", case.model),
            ("run_id", case.run_id),
            ("group_id", check.group_id),
            ("check_run_id", check.run_id),
            ("reference", case.reference),
            ("baseline_run_id", case.baseline_id),
            ("control_run_id", case.control.run_id if case.control else None),
            ("prompts", str(case.prompts)),
            *((f"side.{s['name']}", _side(s)) for s in case.sides),
        ):
            if value:
                ET.SubElement(props, "property", {"name": name, "value": str(value)})
        share = f"{case.duration_s / max(len(checks), 1):.3f}"
        for o in checks:
            tc = ET.SubElement(
                suite, "testcase", {"name": o.name, "classname": f"{PACKAGE}.{case.name}", "time": share}
            )
            if o.status == "fail":
                ET.SubElement(tc, "failure", {"type": o.kind, "message": o.message}).text = _details(o, case)
            elif o.status == "error":
                ET.SubElement(tc, "error", {"type": o.kind, "message": o.message}).text = _details(o, case)
            elif o.status == "skipped":
                ET.SubElement(tc, "skipped", {"message": o.message})
        ET.SubElement(suite, "system-out").text = "\n".join(
            f"{o.status.upper():7} {o.name}: {o.message}" for o in checks
        )
        ET.SubElement(suite, "system-err").text = ""
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _details(o, case) -> str:
    spec_line = f"\nspec line {o.line}" if o.line else ""
    run = f"\nrun {case.run_id} (parity runs show {case.run_id})" if case.run_id else ""
    return f"{o.message}{spec_line}{run}"


def _side(s: dict) -> str:
    text = f"{s['kind']}" + (f" {s['version']}" if s.get("version") else "")
    return text + (f" python={s['python']}" if s.get("python") else "")


def _timestamp(created_utc: str) -> str:
    """ISO 8601 to the second, without a time zone (the Ant schema's pattern); UTC."""
    try:
        return datetime.fromisoformat(created_utc).strftime("%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%S")


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename: a reader
    (a CI step) sees the old file or the whole new one, never half."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=str(p.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
