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
if [ "${MYPY:-0}" = 1 ]; then
  echo "[lint] mypy (parity_ui)"
  "$bin/mypy"
else
  echo "[lint] mypy skipped (MYPY=0): run MYPY=1 scripts/lint.sh to type-check"
fi
