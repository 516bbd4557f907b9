# Two commands do everything on a fresh machine (each runs the idempotent setup first):
#   make app    start the web app with the bundled demo model on http://127.0.0.1:7860
#   make test   run the whole test suite
.PHONY: app test setup test-fast bench
PY := .venv/bin/python

setup:
	@bash scripts/setup.sh

app: setup
	$(PY) app.py

test:
	@bash scripts/setup.sh --test
	$(PY) -m pytest tests --durations=30

# Unit tests only (no engines, no browser): seconds.
test-fast: setup
	$(PY) -m pytest tests -m "not engines and not browser"

bench: setup
	$(PY) bench/overhead.py
