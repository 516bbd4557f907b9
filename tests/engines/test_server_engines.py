"""A real `vllm serve` (the CPU build) as a side, started by parity-ui, compared with HF and with
offline vLLM; the same server reached as an `openai` side by URL; a server that cannot start; a
server dying mid-stream; the tool killed while its server starts. ~2 minutes on 2 cores."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil

from misbehaving_server import FakeServer
from parity_ui.core.config import build_config
from parity_ui.run.prepare import RunRequest
from parity_ui.inputs.prompts import PromptSpec, tokenizer_for
from parity_ui.store.runs import get_run
from parity_ui.core.types import to_dict


PROMPT = "def parse_args(self, args=None, namespace=None):"


def _run(service, model, *overrides, sides):
    cfg = build_config(None, ["dtype=float32", "max_new_tokens=32", "ignore_eos=true", *overrides], sides=sides)
    return service.run(RunRequest(model=str(model), prompts=[PromptSpec(text=PROMPT)], config=cfg))


def _servers(port: int | None = None) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "vllm.entrypoints.openai.api_server" in cmd and (port is None or f"--port {port}" in cmd):
            out.append(p)
    return out


def test_vllm_serve_matches_hf_and_offline_vllm_in_float32_and_is_reused(service, tiny_llama):
    run = _run(service, tiny_llama, sides=["ref=hf", "srv=vllm-server"])
    assert run.status == "ok", run.error
    (c,) = run.prompts[0].comparisons
    assert c.identical and len(run.prompts[0].results["srv"].token_ids) == 32
    srv = run.sides[1]
    assert srv.kind == "vllm-server" and srv.resolved["dtype"] == "float32"
    assert srv.resolved["server"].startswith("http://127.0.0.1:") and os.path.exists(srv.resolved["server_log"])
    url, pid = srv.resolved["server"], srv.resolved["server_pid"]

    # The same server by URL, against offline vLLM as the reference; the managed server stays warm.
    run2 = _run(service, tiny_llama, sides=["off=vllm", "srv=vllm-server", f"api=openai,url={url}"])
    assert run2.status == "ok", run2.error
    p = run2.prompts[0]
    assert [(c.a, c.b) for c in p.comparisons] == [("off", "srv"), ("off", "api")]
    assert all(c.identical and c.max_abs_gap < 1e-4 for c in p.comparisons)
    assert p.results["api"].token_ids == p.results["off"].token_ids == run.prompts[0].results["ref"].token_ids
    api = next(s for s in run2.sides if s.name == "api")
    assert api.version.startswith("0.") and api.resolved["served_model"] == str(tiny_llama)
    assert next(s for s in run2.sides if s.name == "srv").resolved["server_pid"] == pid  # reused, not restarted
    scores = to_dict(p.comparisons[1].cross_scores)  # teacher forcing through the server's prompt_logprobs
    assert "error" not in scores and any(k.endswith("_by_api") for k in scores)
    assert get_run(service.db, run2.id).sides[2].kind == "openai"


def test_a_vllm_serve_that_cannot_start_is_an_error_run_with_its_reason(service, tiny_llama):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        run = _run(service, tiny_llama, sides=["ref=hf", f"srv=vllm-server,port={port}"])
    finally:
        taken.close()
    assert run.status == "error"
    assert "side srv" in run.error and "port is taken" in run.error and "leave port unset" in run.error
    assert not _servers(port), "a server that failed to start was left running"


def test_a_server_dying_mid_stream_keeps_the_partial_tokens_and_the_next_run_works(service, tiny_llama):
    tok = tokenizer_for(str(tiny_llama))
    fake = FakeServer(tok.ids_of_text, model=str(tiny_llama))
    try:
        fake.mode = "die-mid-stream"
        run = _run(service, tiny_llama, "max_new_tokens=10", sides=["ref=hf", f"srv=openai,url={fake.url}"])
        assert run.status == "error" and "side srv" in run.error, run.error
        assert run.prompts[0].results["srv"].token_ids == [100, 101, 102]  # what arrived is kept
        assert get_run(service.db, run.id).prompts[0].results["srv"].token_ids == [100, 101, 102]
        fake.mode = "ok"
        again = _run(service, tiny_llama, "max_new_tokens=10", sides=["ref=hf", f"srv=openai,url={fake.url}"])
        assert again.status in ("ok", "diverged"), again.error
        assert len(again.prompts[0].results["srv"].token_ids) == 10
    finally:
        fake.shutdown()
        fake.server_close()


def test_killing_the_cli_while_its_server_starts_leaves_no_server(tmp_path, tiny_llama):
    cmd = [sys.executable, "-m", "parity_ui.cli", "--db", str(tmp_path / "runs.db"), "compare", "--model",
           str(tiny_llama), "--prompt", "def f(x):", "--set", "dtype=float32", "--side", "a=hf",
           "--side", "s=vllm-server", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    started: list[psutil.Process] = []
    while time.monotonic() < deadline and not started:
        # this CLI's own server: another test process may start one at the same time (pytest -n 2)
        mine = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        started = [p for p in _servers() if p.pid in mine]
        time.sleep(0.2)
    assert started, "vllm serve never started"
    family = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in family if psutil.pid_exists(p)], timeout=20)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
