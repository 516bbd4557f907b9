"""Worker processes started ahead of a run (EnginePool.prestart): handed to the run that needs their
setup, dropped at once when none does. Real processes, with the standard-library engine (openai)."""
from __future__ import annotations

import sys

from parity_ui.core.config import build_config
from parity_ui.run.hardware import on_gpu
from parity_ui.run.prepare import RunRequest, likely_workers, prepare
from parity_ui.inputs.prompts import PromptSpec
from parity_ui.run.workers import EnginePool

ENGINE = "parity_ui.engines.openai_engine:OpenAIEngine"


def test_a_worker_started_ahead_is_handed_to_the_run_that_needs_its_setup():
    pool = EnginePool()
    try:
        assert pool.prestart("a", ENGINE, sys.executable, {"PARITY_T": "1"})
        assert not pool.prestart("a", ENGINE, sys.executable, {"PARITY_T": "1"})  # one per setup
        w = pool.worker("key-1", "a", ENGINE, sys.executable, {"PARITY_T": "1"})
        assert w.ensure_started()["pid"] == w.pid and w.alive and w.preloaded
        assert not pool.spares
        # A warm worker of that setup: nothing is started ahead of the next run.
        assert not pool.prestart("a", ENGINE, sys.executable, {"PARITY_T": "1"})
    finally:
        pool.close()
    assert not w.alive


def test_a_worker_started_ahead_that_no_run_takes_is_killed_at_once():
    pool = EnginePool()
    try:
        assert pool.prestart("a", ENGINE, sys.executable, {"PARITY_T": "2"})
        (spare,) = pool.spares.values()
        other = pool.worker("key-2", "a", ENGINE, sys.executable, {"PARITY_T": "3"})  # the guess missed
        assert other is not spare and pool.spares
        other.ensure_started()
        pool.drop_spares()
        assert not pool.spares
        proc = spare._proc
        assert proc is None or proc.poll() is not None  # killed (and reaped), started or not
        spare._starting.join(timeout=30)
        assert not spare.alive
        assert other.alive  # the run's own worker is untouched
    finally:
        pool.close()


def test_the_guess_made_before_tokenizing_is_the_setup_prepare_decides():
    cfg = build_config(None, ["dtype=float32", "b.batch_invariant=true"],
                       sides=["hf=hf", "vllm=vllm", "b=vllm", "srv=openai,url=http://127.0.0.1:9"])
    req = RunRequest(model="demo", prompts=[PromptSpec(text="hello")], config=cfg)
    gpu = on_gpu()
    prep = prepare(req, gpu)
    wanted = [(p.name, p.kind.engine, p.python, p.worker_env) for p in prep.sides if p.kind.head_start]
    assert [w[0] for w in wanted] == ["hf", "vllm", "b"]  # the server side's worker imports nothing heavy
    assert likely_workers(req, gpu) == wanted


def test_a_worker_abandoned_while_it_started_ahead_starts_again_for_the_next_run():
    # What a failed run does to a side still importing its libraries (it will not wait for them):
    # that run sees the worker fail; the next run starts it afresh.
    import pytest

    from parity_ui.core.errors import EngineError

    pool = EnginePool()
    try:
        assert pool.prestart("a", ENGINE, sys.executable, {"PARITY_T": "4"})
        w = pool.worker("key-4", "a", ENGINE, sys.executable, {"PARITY_T": "4"})
        w.abandon()
        with pytest.raises(EngineError):
            w.ensure_started()
        assert not w.alive
        assert w.ensure_started()["pid"] == w.pid and w.alive
    finally:
        pool.close()


def test_plain_turns_engine_objects_into_builtins():
    """What a worker answers must unpickle without the engine's libraries (see types.plain)."""
    import enum
    import pickle
    from fractions import Fraction

    from parity_ui.core.types import EngineInfo, plain

    class Mode(enum.IntEnum):
        COMPILE = 3

    class Version(str):
        pass

    class Scalar(float):
        pass

    info = EngineInfo(kind="vllm", version=Version("0.26.0"), device="cpu", dtype="float32",
                      versions={"torch": Version("2.11.0")},
                      resolved={"compilation": Mode.COMPILE, "sizes": (1, Mode.COMPILE), "gap": Scalar(0.5),
                                "ratio": Fraction(1, 3), "flag": True, "none": None})
    out = plain(info)
    assert out == EngineInfo(kind="vllm", version="0.26.0", device="cpu", dtype="float32", versions={"torch": "2.11.0"},
                             resolved={"compilation": "COMPILE", "sizes": (1, "COMPILE"), "gap": 0.5,
                                       "ratio": Fraction(1, 3), "flag": True, "none": None})
    assert type(out.version) is str and type(out.resolved["gap"]) is float and out.resolved["flag"] is True
    seen = set()

    class Spy(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add(module)
            return super().find_class(module, name)

    import io

    Spy(io.BytesIO(pickle.dumps({k: v for k, v in out.resolved.items() if k != "ratio"}))).load()
    assert seen == set()  # nothing but builtins: no module to import


def test_a_pool_that_keeps_idle_workers_keeps_the_most_recently_used_and_frees_the_rest():
    # The test suite's pool (tests/conftest.py): workers a run does not need stay warm, up to
    # keep_idle of them, the least recently used stopped first; retain(set(), keep_idle=0) stops all.
    pool = EnginePool(keep_idle=2, keep_idle_free_gib=0.0)
    try:
        ws = {}
        for n in "abc":
            ws[n] = pool.worker(f"key-{n}", n, ENGINE, sys.executable, {"PARITY_T": f"idle-{n}"})
            ws[n].ensure_started()
        pool.worker("key-a", "a", ENGINE, sys.executable, {"PARITY_T": "idle-a"})  # a used again: b is the oldest
        never = pool.worker("key-n", "n", ENGINE, sys.executable, {"PARITY_T": "idle-n"})  # made, never started
        pool.retain({"key-d"})
        assert list(pool.workers) == ["key-c", "key-a"] and ws["a"].alive and ws["c"].alive
        assert never.pid is None  # a worker that is not alive is never kept: by_side() gives live ones only
        assert not ws["b"].alive
        assert pool.worker("key-a", "a2", ENGINE, sys.executable, {"PARITY_T": "idle-a"}) is ws["a"]  # warm
        assert pool.by_side()["a2"] is ws["a"]
        pool.retain(set(), keep_idle=0)
        assert not pool.workers and not ws["a"].alive and not ws["c"].alive
    finally:
        pool.close()


def test_a_pool_keeps_no_idle_worker_by_default_nor_when_memory_is_short():
    for pool in (EnginePool(), EnginePool(keep_idle=3, keep_idle_free_gib=1e9)):
        try:
            w = pool.worker("key-x", "x", ENGINE, sys.executable, {"PARITY_T": "idle-x"})
            w.ensure_started()
            pool.retain({"key-y"})
            assert not pool.workers and not w.alive
        finally:
            pool.close()


def test_vllm_s_model_class_inspection_is_prewarmed_on_a_gpu_host_only_while_its_cache_lacks_it(tmp_path,
                                                                                                monkeypatch):
    """Issue 44: a GPU host's head start also runs vLLM's model-class inspection in a process of its own
    (Kind.prewarm) while vLLM's cache lacks the model's class; never on the CPU, never twice."""
    from parity_ui.inputs.models import describe_model
    from parity_ui.run.prepare import likely_prewarms

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    cfg = build_config(None, ["dtype=float32"], sides=["hf=hf", "vllm=vllm", "b=vllm,enforce_eager=true"])
    req = RunRequest(model="demo", prompts=[PromptSpec(text="hello")], config=cfg)
    assert likely_prewarms(req, gpu=False) == []
    got = likely_prewarms(req, gpu=True)
    folder = describe_model("demo").path
    assert [(m, f) for m, _, _, f in got] == [("parity_ui.engines.vllm_prewarm", folder)] * len(got) and got
    (tmp_path / "vllm" / "modelinfos").mkdir(parents=True)
    (tmp_path / "vllm" / "modelinfos" / "vllm-model_executor-models-llama-LlamaForCausalLM.json").write_text("{}")
    assert likely_prewarms(req, gpu=True) == []  # kept already: nothing to start
