"""A second Python environment for the tests' "another environment" side: a venv whose own
site-packages hold a different transformers (pure Python, seconds to install), reaching torch and
the rest through a .pth line into the main venv (a copy of torch would take minutes and a GB).

Its own site-packages come first on sys.path, so its transformers wins. Built once, then reused.
A user's real second environment is a full venv (README: "Another environment as a side").
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ALT_TRANSFORMERS = os.environ.get("PARITY_TEST_ALT_TRANSFORMERS", "5.17.0")  # the GPU machine's version
# What that transformers pins differently from the main venv's (pure Python as well).
ALT_EXTRA = ["huggingface-hub>=1.5,<2"]


def alt_env(root: Path) -> tuple[str, str]:
    """(python, transformers version) of the second environment under `root`, built if missing."""
    venv = root / f"transformers-{ALT_TRANSFORMERS}"
    python = venv / "bin" / "python"
    stamp = venv / ".ready"
    if not stamp.is_file():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        (site / "parity-main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                        "--target", str(site), f"transformers=={ALT_TRANSFORMERS}", *ALT_EXTRA], check=True)
        stamp.touch()
    return str(python), ALT_TRANSFORMERS
