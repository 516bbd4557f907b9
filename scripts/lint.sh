#!/usr/bin/env bash
# The checks `make test` runs before the tests (issue 45): parity_ui/ formatted, linted and typed,
# with the configs in pyproject.toml ([tool.ruff], [tool.mypy]). tests/ is not formatted (main keeps it as written).
#   scripts/lint.sh           ruff format --check, ruff check, then mypy where MYPY=1
#   MYPY=1 scripts/lint.sh    the same with mypy (the Makefile's default: make lint and make test run it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=.venv/bin
echo "[lint] ruff format --check parity_ui"
"$bin/ruff" format --check parity_ui
echo "[lint] ruff check parity_ui"
"$bin/ruff" check parity_ui
# bench/, scripts/ and tests/ keep their own style, but a name that does not exist is a crash waiting for
# the GPU (bench/replay.py's `side`, found only on the lent machine): undefined names and syntax misuse
echo "[lint] ruff check bench scripts tests (undefined names)"
"$bin/ruff" check --select F821,F822,F823,F632,F701,F702,F704,F706,F707 bench scripts tests
if [ "${MYPY:-0}" = 1 ]; then
  echo "[lint] mypy (parity_ui)"
  "$bin/mypy"
else
  echo "[lint] mypy skipped (MYPY=0): run MYPY=1 scripts/lint.sh to type-check"
fi
