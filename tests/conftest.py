"""Shared test setup: runs go to a temporary database, engine caches to known places."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # the shared helpers (tiny_models, fake_engine, ...) for every folder
from scheduling import scope, scope_rank  # noqa: E402 - the scopes of the scheduler below

# The folder is the marker: tests/unit/ runs no engine and no browser, tests/engines/ starts real vLLM
# and transformers engines, tests/browser/ drives the app in headless Chromium (a browser test that also
# starts real engines says `engines` itself). `-m "not engines and not browser"` is then tests/unit/.
FOLDER_MARKERS = {"engines": "engines", "browser": "browser"}
# Idle engine workers the session service keeps warm on the CPU (see `service`): a tiny model's vLLM
# worker holds ~1 GB, HF ~0.5 GB; the pool keeps none while less than 6 GiB is available.
KEEP_IDLE = 6


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path, monkeypatch):
    # No test may write the user's ./runs.db.
    monkeypatch.setenv("PARITY_DB", str(tmp_path / "runs.db"))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:  # a test file outside tests/
            continue
        marker = FOLDER_MARKERS.get(folder)
        if marker is not None:
            item.add_marker(marker)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    class ByModule(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False  # collection order within a rank

        def _assign_work_unit(self, node) -> None:
            # the best-ranked scope left goes next (the first of them in collection order)
            best = min(self.workqueue, key=scope_rank)
            self.workqueue.move_to_end(best, last=False)
            super()._assign_work_unit(node)

    return ByModule(config, log)


def pytest_configure(config):
    cache = Path(os.environ.get("PARITY_CACHE_DIR") or Path.home() / ".cache" / "parity-ui")
    # vLLM/inductor write compiled helpers here; keep them out of /tmp defaults shared with others.
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may reach a model hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Each test process's engines get their share of the cores: `make test` runs two processes on a
    # 2-core machine, so an engine's second thread only fights the other process's engine for a core,
    # and on a busy machine every OpenMP barrier waits on a descheduled partner. Measured on 2 cores
    # with two busy processes beside (4 engine modules, -n 2): 366 s at torch's 2 threads, 267 s at 1.
    # Inherited by every worker, fork server and Ray replica; a test of what the thread count changes
    # sets its sides' cpu_threads. An OMP_NUM_THREADS of the caller's is left alone.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """One ParityService for every real-engine test: workers stay warm across modules whenever
    the load-time settings match, so each distinct (model, dtype, ...) pays one engine start. On the
    CPU its pool also keeps the KEEP_IDLE most recently used workers that a run does not need (the
    app stops them): tests take many setups in turn, and a vLLM start costs ~20-30 s of 2 cores. On
    a GPU idle workers would hold the memory the next side loads into, so none is kept there."""
    from parity_ui.run.hardware import on_gpu
    from parity_ui.run.workers import EnginePool
    from parity_ui.service import ParityService

    pool = EnginePool(keep_idle=0 if on_gpu() else KEEP_IDLE)
    svc = ParityService(db_path=str(tmp_path_factory.mktemp("engine-db") / "runs.db"), pool=pool)
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def build_tiny(tmp_path_factory):
    """The session's one model factory: `build_tiny(name, arch=name, **options)` builds a tiny model once
    per session and returns its folder, named `name`; every module asking for the same one gets the same
    folder (and, on the session service, its warm workers). `arch`: "llama" or "qwen2"
    (tiny_models.build_model), one of tiny_models.MOE_ARCHS (build_moe_model), or "fake" (the fake engine
    kind's folder, a tokenizer and a config: fake_engine.fake_model; it needs the kind registered to run).
    `options` go to the builder (seed, max_position_embeddings, num_hidden_layers, ...). The folder is
    shared: a test that changes a model copies it first (tiny_models.copy_model)."""
    from fake_engine import fake_model
    from tiny_models import MOE_ARCHS, build_model, build_moe_model

    built: dict[str, Path] = {}

    def build(name: str, arch: str | None = None, **options) -> Path:
        arch = arch or name
        key = json.dumps([name, arch, options], sort_keys=True, default=str)
        if key not in built:
            if arch == "fake":  # the folder itself, as the fake's tests always made it
                built[key] = Path(fake_model(tmp_path_factory.mktemp(name), **options))
            else:
                folder = tmp_path_factory.mktemp(f"tiny-{name}") / name
                maker = build_moe_model if arch in MOE_ARCHS else build_model
                built[key] = Path(maker(folder, arch, **options))
        return built[key]

    return build


@pytest.fixture(scope="session")
def tiny_llama(build_tiny):
    """The shared tiny Llama (seed 0): same folder for every module, so its workers are reused."""
    return build_tiny("llama")


@pytest.fixture(scope="session")
def alt_env():
    """A second Python environment with another transformers (tests/alt_env.py): (python, version)."""
    from alt_env import alt_env as build

    cache = Path(os.environ.get("PARITY_CACHE_DIR") or Path.home() / ".cache" / "parity-ui")
    return build(cache / "test-envs")


@pytest.fixture
def cli_on_warm_workers(service, monkeypatch):
    """`parity_ui.cli.main()` called in this process runs its command on the session service's warm
    workers: its own database, arguments, output and exit code, but no engine start that an earlier
    test (or an earlier main() in the same test) already paid for. A subprocess CLI starts its own."""
    import parity_ui.cli as cli
    from parity_ui.service import ParityService

    class OnSessionWorkers(ParityService):
        def close(self) -> None:  # the workers are the session's, stopped when the session ends
            self.close_cluster()

    monkeypatch.setattr(cli, "_service", lambda args: OnSessionWorkers(db_path=args.db, pool=service.pool))
