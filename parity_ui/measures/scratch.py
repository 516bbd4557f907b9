"""Where full_distribution's scratch rows live while a chunk is under way (core.distribution).

A scored chunk of 250 sequences x 128 tokens of a 49k vocabulary leaves up to 6 GiB of rows between
the side that writes them and the scorer that meets them, written once and read once, then deleted.
On a disk that was the run's cost: on an H100 the machine wrote 25 GB of dirty pages per 1,000-prompt
workload and the writes were throttled to the disk's speed (issue 31: 2.7x the run without them). In
memory (/dev/shm, a tmpfs on Linux) they never reach a disk. So: the directory named by
PARITY_ROWS_DIR when set; else /dev/shm when it and the machine's free memory both hold the chunk with
room to spare; else the temp dir (TMPDIR), when its disk holds it; else the run is refused with the
sizes named.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

from ..core.errors import ConfigError

SHM = "/dev/shm"


@dataclass(frozen=True)
class Scratch:
    path: str  # the run's own scratch dir (made here; the caller removes it)
    in_memory: bool  # on a tmpfs: rows never reach a disk

    def describe(self) -> str:
        return f"{self.path} ({'memory' if self.in_memory else 'disk'})"


def available_memory() -> int | None:
    """The machine's MemAvailable in bytes (Linux), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _shm_holds(need: int) -> bool:
    if not os.path.isdir(SHM) or not os.access(SHM, os.W_OK):
        return False
    mem = available_memory()
    # Half of what is free on both counts: the engines, the parent and the page cache need the rest.
    return shutil.disk_usage(SHM).free * 0.5 >= need and (mem is None or mem * 0.5 >= need)


def scratch_dir(need: int) -> Scratch:
    """A fresh scratch dir for `need` bytes of rows (see the module docstring); ConfigError when no
    place holds them."""
    chosen = os.environ.get("PARITY_ROWS_DIR")
    if chosen:
        os.makedirs(chosen, exist_ok=True)
        base, in_memory = chosen, False
    elif _shm_holds(need):
        base, in_memory = SHM, True
    else:
        base, in_memory = tempfile.gettempdir(), False
    if not in_memory:
        free = shutil.disk_usage(base).free
        if need > free * 0.8:
            raise ConfigError(
                "full_distribution",
                f"a chunk writes up to {need / 2**30:,.1f} GiB of full rows to "
                f"the scratch dir {base}, which has {free / 2**30:,.1f} GiB free "
                "(and /dev/shm or free memory cannot hold them either)",
                "use a smaller --chunk, free disk space, or point PARITY_ROWS_DIR (or TMPDIR) at a larger disk",
            )
    return Scratch(tempfile.mkdtemp(prefix="parity-rows-", dir=base), in_memory)
