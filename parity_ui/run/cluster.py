"""A run's sides as replicas on a Ray cluster: Ray started here (`local`) or joined (an address),
each side's replicas started as actors that host the project's own worker (parity_ui.run.replica),
placed by Ray, and one object that answers the same verbs as parity_ui.run.pipeline.Sides (the
side-set contract, parity_ui.run.sideset.SideSet: `generate`, `score_batch`, `routes`,
`replay_routes`, `capture`...) by handing each request to an idle replica of that side.

No scheduler: Ray places the actors (a placement group per replica group where the cluster has
GPUs, so that one replica of every side shares a GPU exactly as an in-process run's sides share one,
and a TP/PP side's group of GPUs is shared with the other sides as in process, they on its first
GPU; spread over the nodes otherwise) and the caller (parity_ui.commands.workload.blocks) hands blocks of
prompts to threads that each run the workload's own chunk function. The driver alone writes the store.

The driver lock: a block's Python (comparing, explaining, storing) runs with `lock` held, so the
workload's state is touched by one block at a time; a verb releases it while a replica works, which
is when the blocks overlap. A replica that fails (its actor or node died, its engine crashed) is
retired and reported as ReplicaLost, so the caller can run its block again on another replica; a
replacement is started in its place (the same placement and resources), at most as many per side as
the side started with (ReplacementBudget), and serves once loaded. A replacement that does not come
up is a lost replica too; the run goes on with the side's others, and stops when it has none.

Ray's connection is process-wide (ray.init): `connect` keeps the one this process made.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..core.cluster import LOCAL, ClusterRecord, ClusterSpec
from ..core.errors import CancelledError, ConfigError, EngineError
from ..core.requests import CaptureRequest, GenerateRequest, RouteReplayRequest, RoutesRequest, ScoreRequest
from ..core.routes import Routes
from ..core.runlog import EventCallback, RunEvent
from ..core.types import EngineInfo, Finding, SideResult, StepColumns, TokenStep
from ..inputs.prompts import settle_tokenizers
from .pipeline import CapabilityError, load_request
from .plan import SidePlan
from .sideset import Loaded, SideSet
from .worker_client import Capture
from .workers import PROJECT_ROOT, EnginePool

LOCAL_OBJECT_STORE_BYTES = 128 * 2**20  # results are small columns: a block's tokens, not tensors
POLL_S = 0.25  # how often a waiting verb looks at Stop
COUNTS_EVERY_S = 1.0  # how often it asks its replica for token counts (progress)
# How long a replacement may take to be placed and start its worker (its load is not timed: a large
# model takes what it takes). Past it the cluster has no room for it (a lost node's GPUs), and a side
# with no other replica must not wait for ever.
REPLACE_START_S = 600.0
REPLICA_CONCURRENCY = 4  # a replica answers cancel and counts while it generates

_connected: dict[str, Any] = {}  # the address this process joined (Ray allows one connection per process)


class ReplicaLost(EngineError):
    """A replica failed while it held a request (its actor or node died, its engine crashed): it is
    retired, and its request can run again on another replica of the side."""

    code = "replica-lost"

    def __init__(self, side: str, index: int, why: str):
        super().__init__(
            f"side {side}: replica {index} was lost: {why}",
            "its block runs again on another replica or on its replacement; resume the run with "
            "'parity resume' if every replica of a side is lost",
        )
        self.side, self.index, self.why = side, index, why


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "cluster",
            "needs Ray, which is not installed",
            "pip install 'parity-ui[cluster]' (or pip install ray), or run without --cluster",
        ) from None
    return ray


def connect(address: str) -> Any:
    """Ray, connected: a new instance on this machine for "local" (its logical CPUs the machine's
    cores, a small object store, no dashboard), else the cluster at `address`. The replicas run this
    checkout's parity_ui: its folder is put on their path (local) or shipped to the nodes (a cluster).
    Raises ConfigError when Ray is missing or the address does not answer."""
    ray = _ray()
    if ray.is_initialized():
        if _connected.get("address") not in (None, address):
            raise ConfigError(
                "cluster",
                f"this process is connected to Ray at {_connected['address']!r}, not {address!r}",
                "run one cluster per process: restart the app or CLI",
            )
        return ray
    path = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        if address == LOCAL:
            ray.init(
                num_cpus=os.cpu_count() or 1,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                include_dashboard=False,
                log_to_driver=False,
                namespace="parity-ui",
                runtime_env={"env_vars": {"PYTHONPATH": path}},
                # Ray starts its workers at nice 15, and the replicas' engines inherit it: beside any
                # other work at nice 0 they got a few percent of a core (a replica's vLLM load took
                # minutes on 2 cores with two busy processes). A replica is the run's engine, not
                # background work: the same priority as an in-process worker.
                _system_config={"worker_niceness": 0},
            )
        else:
            ray.init(
                address=address,
                log_to_driver=False,
                namespace="parity-ui",
                runtime_env={"py_modules": [str(PROJECT_ROOT / "parity_ui")]},
            )
    except ConnectionError as e:
        raise ConfigError(
            "cluster",
            f"no Ray cluster answers at {address!r} ({e})",
            "start one with 'ray start --head' and give its address (HOST:6379), or --cluster local",
        ) from None
    _connected["address"] = address
    return ray


def shutdown() -> None:
    """Leave Ray (a local instance stops with it)."""
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
    _connected.clear()


def resources(ray: Any) -> tuple[int, float, float]:
    """(alive nodes, CPUs, GPUs) of the cluster."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    return len(nodes), float(total.get("CPU", 0)), float(total.get("GPU", 0))


def gpus_per_replica(plan: SidePlan) -> int:
    """A side's GPUs per replica: its tensor x pipeline parallel group (1 without one)."""
    found: dict[str, int] = {}

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("tensor_parallel_size", "pipeline_parallel_size") and isinstance(v, int):
                    found[k] = max(found.get(k, 1), v)
                else:
                    walk(v)

    walk(plan.load_args())
    return found.get("tensor_parallel_size", 1) * found.get("pipeline_parallel_size", 1)


def group_layout(widths: dict[str, int]) -> tuple[int, dict[str, tuple[float, int]]]:
    """How a replica group of these sides (side -> its GPUs per replica: 1, or a TP x PP group) sits
    on its GPUs, as an in-process run's sides sit on a machine's: (the group's GPUs, side -> (the GPUs
    it asks Ray for, how many of the group's GPUs its worker sees)).

    Every side on one GPU: the group is that GPU, each side a share of it, Ray's to assign. A TP/PP
    side: the group is the widest side's GPUs and every side runs on the first of them (a side of
    width w on the first w), as in process, where the reference shares GPU 0 with a TP group's rank
    0. Ray cannot give one GPU to a fraction and whole GPUs to another actor at once, so there the
    sides ask Ray for none and are given the group's GPUs by name (ClusterSides._group_devices); the
    placement group keeps them from anyone else."""
    need = max(widths.values(), default=1)
    if need == 1:
        return 1, {s: (1 / len(widths), 1) for s in widths}
    return need, {s: (0.0, w) for s, w in widths.items()}


def _gpus_of_this_task() -> list[str]:
    """What Ray made visible to a task placed in a replica group with all of its GPUs: their names
    as CUDA_VISIBLE_DEVICES gives them (run on the group's node, by ClusterSides._group_devices)."""
    return [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]


@dataclass
class Handle:
    """One started replica: its side, index, actor, and whether it serves."""

    side: str
    index: int
    key: str
    actor: Any
    alive: bool = True
    busy: bool = False
    starting: bool = False  # a replacement being started: not serving yet, but the side will have it
    host: str = ""
    why: str = ""
    info: Any = None  # what its engine resolved, once loaded

    @property
    def name(self) -> str:
        return f"{self.side}#{self.index}"


@dataclass
class ReplacementBudget:
    """How many lost replicas of each side one run starts again: at most as many as the side started
    with. A replacement is counted when it is started, whether or not it comes up, so a side whose
    engine dies on load (or at its first request) is not started again and again: once its budget is
    spent, the run goes on with the replicas left, and stops when the side has none."""

    allowed: dict[str, int]
    used: dict[str, int] = field(default_factory=dict)

    def take(self, side: str) -> bool:
        """Count one replacement of `side` if its budget has room; False when it has none left."""
        if self.used.get(side, 0) >= self.allowed.get(side, 0):
            return False
        self.used[side] = self.used.get(side, 0) + 1
        return True

    def describe(self, side: str) -> str:
        return f"{self.used.get(side, 0)} of {self.allowed.get(side, 0)}"


_ABANDONED = object()  # a replacement's wait given up (the run ended or was stopped)


@dataclass
class Replicas:
    """The replicas a cluster keeps warm between runs (like EnginePool's workers), by side setup."""

    key: tuple[tuple[str, int], ...] = ()
    handles: dict[tuple[str, int], Handle] = field(default_factory=dict)  # (load key, index)
    groups: list[Any] = field(default_factory=list)  # placement groups, one per replica group
    devices: list[list[str]] = field(default_factory=list)  # each TP/PP group's GPUs, by name (group_layout)
    placement: str = ""

    def clear(self, ray: Any) -> None:
        for h in self.handles.values():
            try:
                ray.kill(h.actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        for g in self.groups:
            try:
                ray.util.remove_placement_group(g)
            except Exception:  # noqa: BLE001
                pass
        self.handles.clear()
        self.groups.clear()
        self.devices.clear()
        self.key = ()


class Cluster:
    """A Ray cluster this service uses: the connection and the warm replicas. Owned by the service."""

    def __init__(self, address: str):
        self.address = address
        self.ray = connect(address)
        self.replicas = Replicas()

    @property
    def local(self) -> bool:
        """Started on this machine (its replicas share this machine's GPUs with in-process workers)."""
        return self.address == LOCAL

    def release(self) -> None:
        """Stop the warm replicas (their GPUs are freed); Ray stays up for the next cluster run."""
        self.replicas.clear(self.ray)

    def close(self) -> None:
        self.replicas.clear(self.ray)
        if self.local:
            shutdown()


class ClusterSides:
    """A run's sides as replicas (see the module docstring). `start()` brings every replica to loaded;
    the verbs then hand each request to an idle replica of its side."""

    def __init__(
        self,
        cluster: Cluster,
        pool: EnginePool,
        plans: list[SidePlan],
        spec: ClusterSpec,
        *,
        gpu: bool,
        emit: EventCallback | None = None,
        on_loaded: Callable[[SidePlan, Loaded], None] | None = None,
        findings: list[Finding] | None = None,
        timings: dict[str, float] | None = None,
    ):
        self.cluster, self.ray, self.pool, self.plans, self.spec = cluster, cluster.ray, pool, plans, spec
        self.gpu = gpu
        self.emit = emit or (lambda e: None)
        self._on_loaded = on_loaded
        self.findings = findings if findings is not None else []
        self.timings = timings
        self.lock = threading.Lock()  # the driver lock (module docstring)
        self.idle = threading.Condition(self.lock)
        self.by_side: dict[str, list[Handle]] = {}
        self.loaded: dict[str, Loaded] = {}
        self.lost: list[str] = []
        self.replaced: list[str] = []  # replicas started again in a lost one's place, and up
        self.budget = ReplacementBudget(self.counts())
        self._replacing: list[threading.Thread] = []
        self._closing = threading.Event()
        self.retried = 0

    # -- bringing them up -----------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return {p.name: self.spec.replicas_of(p.name) for p in self.plans}

    def start(self) -> None:
        """Start (or reuse) every replica, check them all before any loads, then load side by side
        (a side's replicas at once: two engines that measure free GPU memory never start together on
        one GPU). Raises CapabilityError, CancelledError, EngineError."""
        t0 = time.perf_counter()
        ray, reps = self.ray, self.cluster.replicas
        counts = self.counts()
        key = tuple(sorted((p.load_key, i) for p in self.plans for i in range(counts[p.name])))
        if key != reps.key:  # another set of sides: the warm replicas go, their GPUs with them
            reps.clear(ray)
            reps.key = key
            reps.groups, reps.devices, reps.placement = self._placement(max(counts.values()))
        fresh: list[tuple[SidePlan, Handle]] = []
        named: set[int] = set()
        for p in self.plans:
            self.by_side[p.name] = []
            for i in range(counts[p.name]):
                h = reps.handles.get((p.load_key, i))
                if h is None or not h.alive:
                    h = reps.handles[(p.load_key, i)] = Handle(p.name, i, p.load_key, self._actor(p, i, reps))
                    fresh.append((p, h))
                if id(h) not in named:  # sides with one setup (the floor "order") share its replicas, as a worker
                    named.add(id(h))
                    h.side, h.busy = p.name, False
                self.by_side[p.name].append(h)
        if fresh:
            self.emit(
                RunEvent(
                    "status",
                    f"starting {len(fresh)} replica(s) on the Ray cluster "
                    f"({', '.join(h.name for _, h in fresh)}); {reps.placement}",
                )
            )
        try:
            self._bring_up(fresh)
        except BaseException:
            for _, h in fresh:  # a half-started replica serves no later run
                self._retire(h, "it did not start")
            raise
        finally:
            if self.timings is not None:
                self.timings["start"] = round(time.perf_counter() - t0, 4)

    def _placement(self, groups: int) -> tuple[list[Any], list[list[str]], str]:
        """Where replicas go: with GPUs, a placement group per replica group (one GPU, or the widest
        side's TP x PP GPUs, on one node: group_layout), holding one replica of every side; without,
        spread over the nodes. (the placement groups, each TP/PP group's GPUs by name, a line)"""
        if not self.gpu:
            return [], [], "spread over the nodes by Ray (no GPUs asked)"
        need = self._group_gpus()
        most = max((n.get("Resources", {}).get("GPU", 0) for n in self.ray.nodes() if n.get("Alive")), default=0)
        if most < need:  # Ray would wait for ever for a group no node can hold
            raise CapabilityError(
                f"a replica group needs {need} GPUs on one node (the widest side's tensor_parallel_size x "
                f"pipeline_parallel_size), but the cluster's largest node has {most:g}",
                f"lower the side's parallel sizes to at most {most:g} GPUs, or join a cluster with larger nodes",
            )
        from ray.util import placement_group

        groups_ = [placement_group([{"GPU": float(need)}], strategy="STRICT_PACK") for _ in range(groups)]
        self._wait_for(
            [g.ready() for g in groups_],
            what=(f"waiting for {groups} replica group(s) of {need} GPU(s) each on the cluster"),
        )
        if need == 1:
            return (
                groups_,
                [],
                f"{groups} replica group(s) of 1 GPU(s) on one node each, shared by one replica of every side",
            )
        devices = self._group_devices(groups_, need)
        return (
            groups_,
            devices,
            f"{groups} replica group(s) of {need} GPUs on one node each "
            f"({'; '.join(','.join(d) for d in devices)}), one replica of every side: a TP/PP side on all "
            "of them, the others on the first",
        )

    def _group_gpus(self) -> int:
        """A replica group's GPUs (group_layout)."""
        return group_layout({p.name: gpus_per_replica(p) for p in self.plans})[0]

    def _group_devices(self, groups: list[Any], need: int) -> list[list[str]]:
        """Each TP/PP replica group's GPUs by name: what Ray makes visible to a task given all of the
        group's GPUs (a placement group's bundle keeps the GPUs it reserved, so every replica placed
        in it later runs on these)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        probe = _remote(self.ray, _gpus_of_this_task)
        refs = [
            probe.options(
                num_cpus=0,
                num_gpus=need,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=g, placement_group_bundle_index=0),
            ).remote()
            for g in groups
        ]
        devices = self._wait_for(refs, what="reading each replica group's GPUs")
        for d in devices:
            if len(d) != need:
                raise EngineError(
                    f"a replica group of {need} GPUs sees {len(d)} ({','.join(d) or 'none'})",
                    "check that the nodes' CUDA_VISIBLE_DEVICES (when Ray started) name their GPUs",
                )
        return [list(d) for d in devices]

    def _actor(self, p: SidePlan, index: int, reps: Replicas) -> Any:
        from .replica import Replica

        opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": REPLICA_CONCURRENCY, "max_restarts": 0}
        devices: str | None = None
        if reps.groups:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group = index % len(reps.groups)
            asked, width = group_layout({q.name: gpus_per_replica(q) for q in self.plans})[1][p.name]
            opts["num_gpus"] = asked
            if reps.devices:  # a TP/PP group: the side's GPUs by name (group_layout says why)
                devices = ",".join(reps.devices[group][:width])
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=reps.groups[group], placement_group_bundle_index=0
            )
        else:
            opts["scheduling_strategy"] = "SPREAD"
        actor = _remote(self.ray, Replica).options(**opts)
        req = load_request(p)
        return actor.remote(
            p.name,
            p.kind.engine,
            p.python,
            dict(p.worker_env),
            req,
            os.environ.get("OMP_NUM_THREADS"),
            devices,
        )

    def _bring_up(self, fresh: list[tuple[SidePlan, Handle]]) -> None:
        if fresh:
            started = self._wait_for(
                [h.actor.start.remote() for _, h in fresh], what="replicas starting their engine processes"
            )
            errors = []
            for (p, h), got in zip(fresh, started):
                h.host = got["host"]
                for pb in got["problems"]:
                    if pb.severity == "error":
                        errors.append((p, pb))
                    elif h.index == 0:  # one replica's warnings stand for the side's
                        self.findings.append(
                            Finding(
                                code=pb.code,
                                severity="warning",
                                side=p.name,
                                message=f"side {p.name}: {pb.message}",
                                fix=pb.fix,
                            )
                        )
            if errors:
                raise CapabilityError(
                    "; ".join(
                        f"side {p.name} ({p.kind.label}): {pb.message}"
                        for p, pb in dict((p.name, (p, pb)) for p, pb in errors).values()
                    ),
                    "; ".join(dict.fromkeys(pb.fix for _, pb in errors)),
                )
        for p in self.plans:  # side by side; a side's replicas at once
            mine = [h for q, h in fresh if q.name == p.name]
            if mine:
                self.emit(RunEvent("status", f"{p.name}: loading the weights in {len(mine)} replica(s)", side=p.name))
                got = self._wait_for([h.actor.load.remote() for h in mine], what=f"{p.name} loading")
                for h, (hinfo, _) in zip(mine, got):
                    h.info = hinfo
                info, took = got[0][0], max(s for _, s in got)
                self.emit(
                    RunEvent("status", f"{p.name}: loaded in {len(mine)} replica(s) in {took:.1f} s", side=p.name)
                )
                loaded = Loaded(info, took)
            else:
                loaded = self._warm_info(p)
            self.loaded[p.name] = loaded
            if self._on_loaded is not None:
                self._on_loaded(p, loaded)

    def _warm_info(self, p: SidePlan) -> Loaded:
        h = self.by_side[p.name][0]
        return Loaded(h.info, 0.0)

    def _wait_for(self, refs: list[Any], what: str) -> Any:
        """The values of `refs` (Ray object refs), waited for with the run's errors: Stop ends the wait
        (a load cannot be interrupted: the caller retires the replicas), a failed replica is an
        EngineError naming it (or the engine's own error, with its fix)."""
        ray = self.ray
        while True:
            if self.pool.cancelled:
                raise CancelledError("the run was stopped while the replicas were starting", "")
            try:
                return ray.get(refs, timeout=POLL_S)
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, Exception) and hasattr(cause, "fix"):
                    raise cause from None
                raise EngineError(
                    f"a replica failed while {what}: {type(e).__name__}: {str(e)[:1500]}",
                    "see the Ray logs (/tmp/ray/session_latest/logs on each node)",
                ) from None

    # -- the verbs ------------------------------------------------------------------------------------

    def info(self, side: str) -> EngineInfo:
        return self.loaded[side].info

    @property
    def concurrency(self) -> int:
        """Blocks worth running at once: one per live replica (a block uses one side at a time)."""
        return max(1, sum(1 for hs in self.by_side.values() for h in hs if h.alive))

    def alive(self, side: str) -> int:
        """The side's replicas that serve or will: a replacement being started counts (a block that
        lost its replica waits for it when no other replica of the side is free)."""
        return sum(1 for h in self.by_side.get(side, []) if h.alive or h.starting)

    def busy(self) -> list[str]:
        return [h.name for hs in self.by_side.values() for h in hs if h.busy]

    def generate(
        self,
        side: str,
        req: GenerateRequest,
        on_token: Any = None,
        on_counts: Callable[[dict[int, int]], None] | None = None,
    ) -> list[SideResult]:
        settle_tokenizers()  # the run's tokenizer verdict in before an engine is handed a token
        results = self._call(side, "generate", req, on_counts)
        for r in results:
            r.side = side
        return results

    def score_batch(self, side: str, items: list[ScoreRequest]) -> list[list[TokenStep]]:
        settle_tokenizers()
        return self._call(side, "score_batch", items, None)

    def score(self, side: str, req: ScoreRequest) -> list[TokenStep]:
        return self.score_batch(side, [req])[0]

    def routes(self, side: str, req: RoutesRequest) -> Routes:
        """MoE routes by a forced pass on an idle replica (any replica of the side has its weights)."""
        return self._call(side, "routes", req, None)

    def replay_routes(self, side: str, req: RouteReplayRequest) -> list[SideResult]:
        results = _as_results(self._call(side, "replay_routes", req, None))
        for r in results:
            r.side = side
        return results

    def capture(self, side: str, req: CaptureRequest) -> Capture:
        return self._call(side, "capture", req, None)

    @contextmanager
    def _released(self) -> Iterator[None]:
        """Let the other blocks' Python run while a replica works (the caller holds `lock`)."""
        self.lock.release()
        try:
            yield
        finally:
            self.lock.acquire()

    def _acquire(self, side: str) -> Handle:
        while True:
            if self.pool.cancelled:
                raise CancelledError("the run was stopped", "")
            live = [h for h in self.by_side.get(side, []) if h.alive]
            if not live and not self.alive(side):
                raise EngineError(
                    f"side {side}: every replica was lost ({'; '.join(self.lost)})",
                    "the finished blocks are stored: start the replicas again with 'parity resume RUN_ID'",
                )
            free = next((h for h in live if not h.busy), None)
            if free is not None:
                free.busy = True
                return free
            self.idle.wait(POLL_S)

    def _call(self, side: str, method: str, payload: Any, on_counts: Callable[[dict[int, int]], None] | None) -> Any:
        """One verb on an idle replica of `side` (the caller holds `lock`). Raises ReplicaLost when the
        replica fails, CancelledError on Stop, EngineError when no replica of the side is left."""
        ray = self.ray
        h = self._acquire(side)
        try:
            ref = getattr(h.actor, method).remote(payload)
            cancelled, last_counts, failed = False, time.monotonic(), None
            out: Any = None  # the verb's answer, as the actor returned it
            with self._released():
                while True:
                    done, _ = ray.wait([ref], timeout=POLL_S)
                    if done:
                        break
                    if self.pool.cancelled and not cancelled:
                        cancelled = True
                        h.actor.cancel.remote()  # stops at its next token; the answer says so
                    if on_counts is not None and time.monotonic() - last_counts >= COUNTS_EVERY_S:
                        last_counts = time.monotonic()
                        try:
                            moved = ray.get(h.actor.counts.remote(), timeout=5)
                        except ray.exceptions.RayError:
                            moved = {}
                        with self.lock:  # the progress object is the blocks' shared state
                            on_counts(moved)
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    failed = f"its actor died ({type(e).__name__})"
                except ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, CancelledError) or self.pool.cancelled:
                        failed = ""
                    else:
                        failed = (f"{type(cause).__name__}: {cause}" if cause is not None else str(e))[:1500]
            if self.pool.cancelled or failed == "":
                raise CancelledError(f"side {side}: the run was stopped", "")
            if failed is not None:
                raise self._lost(h, failed)
            return _as_results(out) if method == "generate" else out
        finally:
            h.busy = False
            self.idle.notify_all()

    def _lost(self, h: Handle, why: str) -> ReplicaLost:
        """Retire `h` and start its replacement when the side's budget has room (the caller holds
        `lock`); the ReplicaLost to raise, so the caller runs the block again."""
        self._retire(h, why)
        self.lost.append(f"{h.name}: {why}")
        serving = sum(1 for x in self.by_side.get(h.side, []) if x.alive)
        left = f"{self.alive(h.side)} of the side's replicas left"
        if not self.budget.take(h.side):
            what = f"not replaced (side {h.side} has had {self.budget.describe(h.side)} replacements); {left}"
        elif self._replace(h) is None:
            what = f"Ray did not start its replacement ({self.lost[-1]}); {left}"
        else:
            what = (
                f"replacing it (replacement {self.budget.describe(h.side)} for side {h.side}); "
                f"{serving} other replica(s) of the side serve meanwhile"
            )
        self.emit(RunEvent("status", f"replica {h.name} lost ({why}); {what}", side=h.side))
        return ReplicaLost(h.side, h.index, why)

    def _replace(self, old: Handle) -> Handle | None:
        """A new replica in `old`'s place: its index (so its placement group, its share of the GPUs),
        its side and setup, started and loaded by a thread of its own while the run goes on; it serves
        once loaded (`_bring_back`). None (and the loss recorded) when Ray refuses the actor."""
        plan = next(p for p in self.plans if p.name == old.side)
        reps = self.cluster.replicas
        try:
            actor = self._actor(plan, old.index, reps)
        except Exception as e:  # noqa: BLE001 - Ray refused it: the run goes on with the others
            self.lost.append(f"{old.name} (replacement): not started: {type(e).__name__}: {e}"[:1500])
            return None
        new = Handle(old.side, old.index, old.key, actor, alive=False, starting=True)
        reps.handles[(old.key, old.index)] = new
        for hs in self.by_side.values():  # every side that shares the setup (the floor "order") gets it
            for i, x in enumerate(hs):
                if x is old:
                    hs[i] = new
        t = threading.Thread(target=self._bring_back, args=(new,), name=f"parity-replace-{new.name}", daemon=True)
        self._replacing.append(t)
        t.start()
        return new

    def _bring_back(self, h: Handle) -> None:
        """Start and load the replacement `h` (its own thread, the driver lock free), then let it serve;
        a replacement that fails is retired and recorded as lost, one still starting when the run ends
        is stopped (as a half-started replica at start())."""
        t0, why = time.perf_counter(), ""
        got: Any = _ABANDONED  # the load's (info, seconds)
        try:
            started = self._await(h.actor.start.remote(), REPLACE_START_S)
            if started is not _ABANDONED:
                h.host = started["host"]
                errors = [pb.message for pb in started["problems"] if pb.severity == "error"]
                if errors:
                    why = "; ".join(errors)
                else:
                    got = self._await(h.actor.load.remote(), None)
        except TimeoutError:
            why = f"it was not placed and started within {REPLACE_START_S:.0f} s (no room on the cluster?)"
        except self.ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None)
            why = (f"{type(cause).__name__}: {cause}" if isinstance(cause, Exception) else type(e).__name__)[:1500]
        except Exception as e:  # noqa: BLE001 - reported as the replacement's loss, not raised in a thread
            why = f"{type(e).__name__}: {e}"[:1500]
        with self.lock:
            h.starting = False
            if why:
                self._retire(h, why)
                self.lost.append(f"{h.name} (replacement): did not start: {why}")
                self.emit(
                    RunEvent(
                        "status",
                        f"replica {h.name}: its replacement did not start ({why}); "
                        f"{self.alive(h.side)} of the side's replicas left",
                        side=h.side,
                    )
                )
            elif got is _ABANDONED:
                self._retire(h, "the run ended before it was ready")
            else:
                h.info, h.alive = got[0], True
                self.replaced.append(h.name)
                self.emit(
                    RunEvent(
                        "status",
                        f"replica {h.name} replaced: loaded in {time.perf_counter() - t0:.1f} s"
                        + (f" on {h.host}" if h.host else ""),
                        side=h.side,
                    )
                )
            self.idle.notify_all()

    def _await(self, ref: Any, timeout: float | None) -> Any:
        """A replacement's Ray call, waited for until it answers, the run ends (`close`) or is stopped
        (_ABANDONED), or `timeout` seconds pass (TimeoutError). Raises Ray's errors."""
        ray, t0 = self.ray, time.monotonic()
        while not (self._closing.is_set() or self.pool.cancelled):
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError
            try:
                return ray.get(ref, timeout=POLL_S)
            except ray.exceptions.GetTimeoutError:
                continue
        return _ABANDONED

    def close(self) -> None:
        """The run is over: no replacement is waited for (one still starting is stopped; one that
        loaded stays warm for the next run). Call without `lock` held."""
        self._closing.set()
        for t in self._replacing:
            t.join()
        self._replacing.clear()

    def _retire(self, h: Handle, why: str) -> None:
        h.alive, h.why = False, why
        try:
            self.ray.kill(h.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def record(self, block: int) -> ClusterRecord:
        nodes, cpus, gpus = resources(self.ray)
        return ClusterRecord(
            address=self.cluster.address,
            nodes=nodes,
            cpus=cpus,
            gpus=gpus,
            replicas=self.counts(),
            block=block,
            placement=self.cluster.replicas.placement,
            retried_blocks=self.retried,
            lost_replicas=list(self.lost),
            replaced_replicas=list(self.replaced),
        )


_actor_class: dict[int, Any] = {}


def _remote(ray: Any, what: Any) -> Any:
    """The Ray actor class of a class, or the Ray task of a function, made once per process."""
    if id(what) not in _actor_class:
        _actor_class[id(what)] = ray.remote(what)
    return _actor_class[id(what)]


def _as_results(results: list[SideResult]) -> list[SideResult]:
    """A replica's results as a worker's come: steps as columns (parity_ui.run.worker_main)."""
    for r in results:
        if not isinstance(r.steps, StepColumns):
            r.steps = StepColumns.from_steps(r.steps)
    return results


def _is_a_side_set(sides: ClusterSides) -> SideSet:
    return sides  # mypy: ClusterSides implements the side-set contract (parity_ui.run.sideset)
