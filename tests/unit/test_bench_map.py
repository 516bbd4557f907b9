"""bench/README.md is the map of bench/: every benchmark script and every GPU chain is named there, a
chain moved next to its figures in that folder's row, and every file it names exists. A script added
without its line, or a chain moved without its row following, fails here (the scripts themselves run
only by hand or on a lent GPU, so nothing else would notice)."""
from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
MAP = (BENCH / "README.md").read_text()
# The chains table: "| `figures/FOLDER/first.sh`, `second.sh`, ... | what it made |"
ROW = re.compile(r"^\| `figures/([\w.-]+)/([^`]+)`([^|]*)\|", re.M)


def _in_folders() -> set[str]:
    """The files the chains table places in a figures folder, as paths under bench/."""
    out = set()
    for folder, first, rest in ROW.findall(MAP):
        out |= {f"figures/{folder}/{name}" for name in [first, *re.findall(r"`([^`]+)`", rest)]}
    return out


def _in_bench() -> set[str]:
    """The scripts the map names on their own (outside the table): files directly in bench/."""
    return set(re.findall(r"`([\w.-]+\.(?:py|sh))`", ROW.sub("", MAP)))


def test_every_bench_script_is_named_in_the_map():
    scripts = sorted(p.name for p in BENCH.glob("*.py"))
    assert "workload.py" in scripts and "overhead.py" in scripts
    missing = [name for name in scripts if name not in _in_bench()]
    assert not missing, f"bench scripts bench/README.md does not name: {missing}"


def test_every_gpu_chain_is_named_where_it_lives():
    here = sorted(p.name for p in BENCH.glob("*.sh"))
    moved = sorted(p.relative_to(BENCH).as_posix() for p in BENCH.glob("figures/*/*.sh"))
    assert "gpu_go.sh" in here and moved
    missing = [c for c in here if c not in _in_bench()] + [c for c in moved if c not in _in_folders()]
    assert not missing, f"GPU chains bench/README.md does not name where they are: {missing}"


def test_every_file_the_map_names_exists():
    named = _in_bench() | {p for p in _in_folders() if "*" not in p}
    assert len(named) > 30
    gone = sorted(p for p in named if not (BENCH / p).is_file())
    assert not gone, f"bench/README.md names files that are not there: {gone}"
