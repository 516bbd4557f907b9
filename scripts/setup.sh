#!/usr/bin/env bash
# Idempotent setup: a virtual environment in .venv with vLLM (GPU or CPU build), transformers and
# the app's packages, plus the bundled demo model converted once into the local cache.
# Re-running it when nothing changed takes about a second: a stamp records what was installed.
#   scripts/setup.sh          app + engines
#   scripts/setup.sh --test   also Debian's chromium for the browser tests
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
venv="$root/.venv"
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if nvidia-smi -L >/dev/null 2>&1; then engine_extra=gpu; else engine_extra=cpu; fi
# The test tools are small: installing them always keeps `make app` and `make test` on one stamp.
# Ray (the cluster extra) comes along: tests/unit/test_cluster.py and tests/engines/test_cluster_engines.py run it.
extras="ui,$engine_extra,test,cluster"
# The stamp changes whenever what we would install changes, so an edit to pyproject.toml re-runs pip.
stamp="$venv/.setup-$(cat pyproject.toml scripts/setup.sh scripts/uv_sources.py | sha256sum | cut -c1-16)-$extras"

if [ $want_test = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing Debian chromium + chromium-driver for the browser tests"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium chromium-driver >/dev/null; fi
fi

# uv installs the same releases as pip (scripts/uv_sources.py hands it pip's indexes, local wheels,
# constraints and CA) in ~1 min instead of ~2.5 on a fresh 2-core machine, ~2 min less on a busy one.
# --compile-bytecode: this environment sets PYTHONDONTWRITEBYTECODE, so a module not compiled here is
# compiled again by every process that imports it (`import vllm` 16 s instead of 10). unsafe-best-match
# is pip's rule: the newest release across all indexes. Any failure falls back to pip.
install_with_uv() {
  # uv pinned: the flags below are its CLI at that release.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check uv==0.13.9 || return 1
  local listed sources=()
  listed=$("$venv/bin/python" scripts/uv_sources.py "$venv/bin/python") || return 1
  [ -z "$listed" ] || mapfile -t sources <<<"$listed"
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" --compile-bytecode \
    --index-strategy unsafe-best-match "${sources[@]}" -e ".[$extras]"
}

if [ ! -f "$stamp" ]; then
  command -v g++ >/dev/null || { echo "[setup] g++ is required (vLLM compiles a helper on first use): apt-get install g++" >&2; exit 1; }
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  echo "[setup] installing parity-ui[$extras] into .venv (a minute or two the first time)"
  if ! install_with_uv; then
    echo "[setup] uv could not install (above); pip instead (slower: ~2.5 min on 2 idle cores)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[$extras]"
  fi
  if [ $engine_extra = cpu ]; then
    # PyPI's CUDA builds of these break `import vllm` next to torch+cpu; vLLM runs without them.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
  rm -f "$venv"/.setup-*
  touch "$stamp"
fi

# Where PYTHONDONTWRITEBYTECODE is set (this environment sets it) no process keeps the modules it
# compiled, so every app and CLI start compiled parity_ui again: ~1 s of an app's start, ~1 s of a
# CLI's. Compiled once here; a file edited since is compiled from its source as before (its .pyc is
# stale by its timestamp), and a second run only looks at timestamps.
"$venv/bin/python" -m compileall -q parity_ui app.py >/dev/null
"$venv/bin/python" -m parity_ui.inputs.demo_model --quiet
