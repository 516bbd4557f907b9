"""A workload on a Ray cluster, as the user asks for it: where (`--cluster local` or an address) and
how many replicas of each side (`--replicas 2` or `--replicas ref=1,b=4`), read and checked once; and
what a run records of the cluster it ran on. Plain data: running on Ray is parity_ui.run.cluster's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

LOCAL = "local"  # start a Ray instance on this machine for the run (and stop it with the service)
ALL = "*"  # the replicas key that stands for every side without its own count
MAX_REPLICAS = 4096
# Why a cluster run's figures can differ from an in-process run's even when nothing else does:
# each replica batches the prompts of its own blocks, so which prompts share a batch changes.
BATCH_NOTE = (
    "batch composition differs per replica: each replica batches the prompts of its own blocks, so a "
    "prompt's batch neighbours are not those of an in-process run (an engine that is not batch-invariant "
    "can give other logprobs); the floor is measured the same way, on the cluster"
)
_ADDRESS = re.compile(r"^(ray://|https?://)?[A-Za-z0-9_.\-\[\]:]+$")


@dataclass
class ClusterSpec:
    """Where a workload runs on Ray and with how many replicas a side. `address` "local" starts a Ray
    instance on this machine; anything else joins a running cluster ("auto", "HOST:PORT",
    "ray://HOST:10001")."""

    address: str = LOCAL
    replicas: dict[str, int] = field(default_factory=lambda: {ALL: 1})

    def replicas_of(self, side: str) -> int:
        return self.replicas.get(side, self.replicas.get(ALL, 1))


def parse_cluster(address: str | None) -> str | None:
    """The --cluster value checked: None, "" or "none" means in process. Raises ConfigError."""
    if address is None or not str(address).strip() or str(address).strip().lower() == "none":
        return None
    a = str(address).strip()
    if a != LOCAL and a != "auto" and not _ADDRESS.match(a):
        raise ConfigError(
            "cluster",
            f"is {a!r}, not a Ray address",
            "give --cluster local (a Ray instance on this machine), auto (the cluster this machine "
            "belongs to), HOST:PORT of a running head node, or ray://HOST:10001",
        )
    return a


def parse_replicas(text: Any) -> dict[str, int]:
    """`2` (every side), `ref=1,b=4` (per side) or both (`2,b=4`: b four, every other side two), as
    {side or "*": count}. An int is every side's count. Raises ConfigError naming the part."""
    if text is None or text == "":
        return {ALL: 1}
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if isinstance(text, dict):
        parts = [f"{k}={v}" for k, v in text.items()]
    else:
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
    out: dict[str, int] = {}
    for p in parts:
        side, eq, n = p.rpartition("=")
        side = side.strip() if eq else ALL
        try:
            count = int(n)
        except ValueError:
            count = -1
        if not 1 <= count <= MAX_REPLICAS or (eq and not side):
            raise ConfigError(
                "replicas",
                f"{p!r} is not a count of replicas",
                f"give the replicas as a whole number 1..{MAX_REPLICAS} for every side (e.g. 2) or "
                "per side (e.g. ref=1,b=4)",
            )
        out[side] = count
    out.setdefault(ALL, 1)
    return out


def check_sides(replicas: dict[str, int], sides: list[str]) -> None:
    """Every side named in `replicas` is a side of the run. Raises ConfigError."""
    unknown = [s for s in replicas if s != ALL and s not in sides]
    if unknown:
        raise ConfigError(
            "replicas",
            f"names {', '.join(unknown)}, not a side of this run ({', '.join(sides)})",
            "name the run's sides in --replicas, e.g. " + ",".join(f"{s}=2" for s in sides[:2]),
        )


@dataclass
class ClusterRecord:
    """What a run records of the cluster it ran on (stored in the workload's record)."""

    address: str
    nodes: int
    cpus: float
    gpus: float
    replicas: dict[str, int]  # per side (the floor included), as started
    block: int  # prompts handed to a replica at a time
    placement: str  # how replicas were placed, for people
    retried_blocks: int = 0
    lost_replicas: list[str] = field(default_factory=list)  # "side#r: why" (a replacement that failed too)
    replaced_replicas: list[str] = field(default_factory=list)  # "side#r", each lost replica started again
    note: str = BATCH_NOTE

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "nodes": self.nodes,
            "cpus": self.cpus,
            "gpus": self.gpus,
            "replicas": dict(self.replicas),
            "block": self.block,
            "placement": self.placement,
            "retried_blocks": self.retried_blocks,
            "lost_replicas": list(self.lost_replicas),
            "replaced_replicas": list(self.replaced_replicas),
            "note": self.note,
        }

    def describe(self) -> str:
        sides = ", ".join(f"{s} x{n}" for s, n in self.replicas.items())
        where = f"{self.nodes} node{'s' if self.nodes != 1 else ''}, {self.cpus:g} CPUs, {self.gpus:g} GPUs"
        lost = (
            f"; {len(self.lost_replicas)} replica(s) lost, {len(self.replaced_replicas)} replaced, "
            f"{self.retried_blocks} block(s) retried"
            if self.lost_replicas or self.retried_blocks
            else ""
        )
        return f"Ray cluster {self.address} ({where}): replicas {sides}; blocks of {self.block}{lost}"


def describe_record(d: dict[str, Any] | None) -> str:
    """One line for a stored record (a dict), or "" without one."""
    if not d:
        return ""
    keys = ClusterRecord.__dataclass_fields__
    return ClusterRecord(**{k: v for k, v in d.items() if k in keys}).describe()
