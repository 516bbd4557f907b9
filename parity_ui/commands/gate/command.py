"""`parity check SPEC`: read and check the spec, run its cases in one service, write what CI reads.

Exit 0: every threshold held and every control failed them; 1: a threshold failed, or a control
passed (the gate cannot fail); 2: an error (a spec that does not validate, naming case and line;
a case whose run failed). A spec that does not validate writes nothing: no run, no JUnit, no
summary. Outputs are written whole or not at all (a temporary file and a rename).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ...core.errors import ParityError
from .check import EXIT_ERROR
from .spec import SpecError


def check_command(args: argparse.Namespace, emit: Any = None) -> int:
    from ...service import ParityService
    from .check import prepare_cases, run_check, select
    from .junit import junit_xml, write_atomic
    from .spec import load_spec
    from .summary import markdown, text

    if bool(args.spec) == bool(args.self_test):
        print("parity: error: give a spec file, or --self-test (not both). Fix: parity check examples/gate.yaml, "
              "or parity check --self-test", file=sys.stderr)
        return EXIT_ERROR
    if args.model and not args.self_test:
        print("parity: error: --model goes with --self-test; a spec names each case's model. Fix: drop --model",
              file=sys.stderr)
        return EXIT_ERROR
    quiet = args.quiet or args.json

    def say(message: str) -> None:
        if not quiet:
            print(f"[parity] {message}", file=sys.stderr)

    service = ParityService(db_path=args.db)
    try:
        try:
            if args.self_test:
                from .selftest import self_test_spec

                spec = self_test_spec(args.model or "demo", gpu=service.on_gpu)
            else:
                spec = load_spec(args.spec)
            cases = prepare_cases(service, spec, select(spec, args.only), overrides=args.overrides, limit=args.limit)
        except SpecError as e:
            print(f"parity: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        except ParityError as e:
            print(f"parity: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        check = run_check(service, spec, cases, say=say, emit=emit)
    finally:
        service.close()
    md = markdown(check)
    if args.junit:
        write_atomic(args.junit, junit_xml(check))
    if args.markdown:
        write_atomic(args.markdown, md)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(md)
    print(json.dumps(check.to_dict()) if args.json else text(check))
    return check.exit_code
