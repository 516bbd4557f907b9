"""Print, one per line, the `uv pip install` arguments that name the package sources pip is configured
with here: pip's config files and PIP_* variables (what `pip config list` shows), which uv does not read.
scripts/setup.sh installs with uv when it can (a fresh 2-core machine: ~1 min against pip's ~2.5) and
must then see exactly the indexes, local wheels and constraints pip would have seen, or the two could
resolve different releases.

    python scripts/uv_sources.py            # e.g. --extra-index-url\nfile:///opt/pypi/simple\n...
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's option -> uv's, for the options that choose where packages come from, which releases, and the
# certificates that reach them (a proxy's own CA). Each may hold several values separated by whitespace,
# as in pip.conf.
SOURCES = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "cert": "--cert",
}


def pip_config(python: str) -> dict[str, str]:
    """pip's effective settings: later scopes override earlier ones and PIP_* variables override files,
    as pip itself reads them."""
    listing = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    return parse_config_list(listing)


# pip's precedence (pip._internal.configuration's OVERRIDE_ORDER), lowest first: the site-wide file, the
# user's, the virtualenv's, the file PIP_CONFIG_FILE names ("env"), then PIP_* variables (":env:").
SCOPE_RANK = {"global": 0, "user": 1, "site": 2, "env": 3, ":env:": 4}


def parse_config_list(listing: str) -> dict[str, str]:
    """`pip config list` prints `scope.key='value'` lines sorted by name, not by precedence."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        scoped, sep, value = line.partition("=")
        scope, dot, key = scoped.rpartition(".")
        if not sep or not dot or scope not in SCOPE_RANK:
            continue
        rank = SCOPE_RANK[scope]
        if key not in ranked or rank >= ranked[key][0]:
            ranked[key] = (rank, shlex.split(value)[0] if value.strip() else "")
    return {key: value for key, (_, value) in ranked.items()}


def uv_arguments(config: dict[str, str]) -> list[str]:
    args: list[str] = []
    for key, flag in SOURCES.items():
        for value in config.get(key, "").split():
            args += [flag, value]
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    return args


if __name__ == "__main__":
    for arg in uv_arguments(pip_config(sys.argv[1] if len(sys.argv) > 1 else sys.executable)):
        print(arg)
