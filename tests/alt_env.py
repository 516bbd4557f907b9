"""A second Python environment for the tests' "another environment" side: a venv whose own
site-packages hold a different transformers (pure Python, seconds to install), reaching torch and
the rest through a .pth line into the main venv (a copy of torch would take minutes and a GB).

Its own site-packages come first on sys.path, so its transformers wins. Built once per main venv,
then reused: the folder's name carries a hash of the main venv's site-packages, because the .pth
names that path, and a second clone (or a clone since deleted) must not reuse a .pth into another
venv (a CI run once did: "No module named 'torch'"). A file lock keeps parallel test workers from
building the same one twice. A user's real second environment is a full venv (README: "Another
environment as a side").
"""
from __future__ import annotations

import fcntl
import hashlib
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
    main_site = sysconfig.get_paths()["purelib"]
    venv = root / f"transformers-{ALT_TRANSFORMERS}-{hashlib.sha256(main_site.encode()).hexdigest()[:10]}"
    python = venv / "bin" / "python"
    stamp = venv / ".ready"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not stamp.is_file():
            subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True)
            site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       check=True, capture_output=True, text=True).stdout.strip())
            (site / "parity-main-venv.pth").write_text(main_site + "\n")
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                            "--target", str(site), f"transformers=={ALT_TRANSFORMERS}", *ALT_EXTRA], check=True)
            stamp.touch()
    return str(python), ALT_TRANSFORMERS
