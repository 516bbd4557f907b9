"""GPU figures for the side kinds (hf, vllm, vllm-server, openai), parallel vLLM sides and layer
localisation, all through the `parity` CLI itself (subprocess, argument lists, no shell strings).

    python bench/gpu_sides.py --out DIR --parts server,openai,layers       # one GPU (H100)
    python bench/gpu_sides.py --out DIR --parts pp,tp-refused,tp-tiny      # two GPUs

Parts:
  server      bf16, ref=hf vs srv=vllm-server (CUDA graphs, vLLM's default on a GPU)
  openai      a vLLM server started here in the background (port 8011), then off=vllm vs
              api=openai,url=http://127.0.0.1:8011/v1 (bf16); the server is stopped afterwards
  layers      ref=hf vs b=vllm bf16 on the gravity chat prompt, then `parity layers` on it; the same on
              a ~9k-token prompt with --preset long-context-9k, with the GPU memory polled during the
              9k localisation (peak minus the baseline before it)
  pp          ref=hf,device=cuda:0,1 vs b=vllm,pipeline_parallel_size=2,enforce_eager=true and
              c=vllm-server,pipeline_parallel_size=2,enforce_eager=true (bf16)
  tp-refused  b=vllm,tensor_parallel_size=2 on the demo model (9 heads): must be refused before loading
  tp-tiny     a tiny random Llama (8 heads, 4 KV heads, float32) built here: ref=hf vs
              b=vllm,tensor_parallel_size=2 in float32
  presets     eager-vs-graphs, fp32-reference, rl-rollout (the sides presets), with the settings diff
  hf-paths    HF plain / static cache / graphed decode / eager attention vs vLLM, bf16 and fp32, 256 tokens
  cold        bench/profile_prepare.py and bench/cold_start.py (fresh processes)
  overhead    bench/overhead.py (warm, like for like)

Writes DIR/gpu_sides.json (every figure, the raw --json outputs) and DIR/gpu_sides.md after every
step (a timeout keeps what was done), plus DIR/layers-<name>.json (full localisation JSON, for
plots). The summary is printed between the markers below at the end, because vLLM prints its
shutdown logs to stdout after our last line.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "@@GPU_SIDES_BEGIN@@", "@@GPU_SIDES_END@@"
GRAVITY = "Give me a brief explanation of gravity in simple terms."
ALL_PARTS = ("server", "openai", "layers", "pp", "tp-refused", "tp-tiny", "presets", "hf-paths", "cold", "overhead")


# -- running the CLI -----------------------------------------------------------------------------

def _last_json(text: str) -> dict[str, Any] | None:
    """The CLI's one JSON object: the last stdout line that parses as an object."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def cli(db: Path, *args: str, timeout: float = 900) -> dict[str, Any]:
    argv = [sys.executable, "-m", "parity_ui.cli", "--db", str(db), *args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        code = "timeout"
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    return {"argv": argv[1:], "exit": code, "wall_s": round(time.perf_counter() - t0, 2),
            "json": _last_json(out), "stderr_tail": err[-4000:]}


def compare(db: Path, sides: list[str], *extra: str, prompt: str | None = GRAVITY, chat: bool = True,
            prompt_file: Path | None = None, model: str = "demo", dtype: str = "bfloat16",
            max_new: int = 128, timeout: float = 900) -> dict[str, Any]:
    args = ["compare", "--model", model]
    args += ["--prompt-file", str(prompt_file)] if prompt_file else ["--prompt", prompt or ""]
    if chat and not prompt_file:
        args.append("--chat")
    args += ["--set", f"dtype={dtype}", "--set", f"max_new_tokens={max_new}", "--set", "ignore_eos=true"]
    for s in sides:
        args += ["--side", s]
    args += [*extra, "--json", "--quiet"]
    return cli(db, *args, timeout=timeout)


def _per_token(t: dict[str, Any], n: int) -> float | None:
    if t.get("total_s") is None or t.get("prefill_s") is None or n < 2:
        return None
    return (t["total_s"] - t["prefill_s"]) / (n - 1)


def summarise_compare(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of one compare call: exit, status, per side load and per-token time, per
    comparison the first divergence and what it was."""
    d = r.get("json") or {}
    out: dict[str, Any] = {"exit": r["exit"], "wall_s": r["wall_s"], "status": d.get("status"),
                           "error": d.get("error") or (None if r["exit"] in (0, 1) else r["stderr_tail"][-1500:]),
                           "run_id": d.get("run_id"), "first_divergence": d.get("first_divergence"),
                           "phases_s": d.get("timings"), "sides": {}, "comparisons": []}
    for s in d.get("sides") or []:
        res = s.get("resolved") or {}
        out["sides"][s["name"]] = {
            "kind": s["kind"], "load_s": s.get("load_s"), "device": s.get("device"), "dtype": s.get("dtype"),
            "versions": s.get("versions"),
            "resolved": {k: res.get(k) for k in ("cuda_graphs", "attention", "attention_backend", "prefix_caching",
                                                 "chunked_prefill", "tensor_parallel", "pipeline_parallel",
                                                 "logits_dtype", "max_model_len") if k in res}}
    for p in d.get("prompts") or []:
        for name, st in (p.get("sides") or {}).items():
            t, n = st.get("timings") or {}, len(st.get("token_ids") or [])
            side = out["sides"].setdefault(name, {})
            side.setdefault("prompts", []).append({
                "prompt": p["index"], "prompt_tokens": p["prompt_tokens"], "tokens": n,
                "finish": st.get("finish_reason"), "prefill_s": t.get("prefill_s"), "total_s": t.get("total_s"),
                "per_token_s": _per_token(t, n)})
        for c in p.get("comparisons") or []:
            dv = c.get("divergence") or {}
            ex = c.get("explanation") or {}
            out["comparisons"].append({
                "prompt": p["index"], "prompt_tokens": p["prompt_tokens"], "a": c["a"], "b": c["b"],
                "identical": c["identical"], "first_divergence": c["first_divergence"], "compared": c["compared"],
                "tokens_there": dv.get("token_ids"), "texts_there": dv.get("texts"), "reason": dv.get("reason"),
                "accepted_topk": dv.get("accepted"), "verdict": ex.get("verdict"),
                "max_abs_gap_before": c.get("max_abs_gap"), "mean_abs_gap_before": c.get("mean_abs_gap")})
    return out


# -- GPU memory ---------------------------------------------------------------------------------

def _smi(query: str, what: str = "--query-gpu") -> list[list[str]]:
    try:
        txt = subprocess.run(["nvidia-smi", f"{what}={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[x.strip() for x in ln.split(",")] for ln in txt.strip().splitlines() if ln.strip()]


def gpu_used_mib() -> list[int]:
    return [int(r[0]) for r in _smi("memory.used") if r and r[0].isdigit()]


class MemPoller(threading.Thread):
    """Polls nvidia-smi's memory.used per GPU (and per process) until stopped; keeps the peaks."""

    def __init__(self, interval: float = 0.25):
        super().__init__(daemon=True)
        self.interval, self.stop_ev = interval, threading.Event()
        self.peak: list[int] = []
        self.samples = 0
        self.proc_peak: dict[str, int] = {}
        self.series: list[tuple[float, int]] = []
        self.t0 = time.perf_counter()

    def run(self) -> None:
        while not self.stop_ev.is_set():
            used = gpu_used_mib()
            if used:
                self.samples += 1
                self.peak = [max(a, b) for a, b in zip(self.peak, used)] if self.peak else used
                self.series.append((round(time.perf_counter() - self.t0, 2), sum(used)))
            for row in _smi("pid,process_name,used_memory", "--query-compute-apps"):
                if len(row) == 3 and row[2].isdigit():
                    key = f"{row[0]} {_cmdline(row[0]) or row[1]}"
                    self.proc_peak[key] = max(self.proc_peak.get(key, 0), int(row[2]))
            self.stop_ev.wait(self.interval)

    def stop(self) -> None:
        self.stop_ev.set()
        self.join(15)


def _cmdline(pid: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        return raw.strip()[:160]
    except OSError:
        return ""


# -- the parts ----------------------------------------------------------------------------------

def part_server(ctx: "Ctx") -> None:
    r = compare(ctx.db, ["ref=hf", "srv=vllm-server"])
    ctx.put("a_hf_vs_vllm_server_bf16_graphs", r)


def _wait_health(url: str, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not healthy within {timeout:.0f} s")


def part_openai(ctx: "Ctx") -> None:
    model = os.environ.get("PARITY_DEMO_MODEL") or "demo"
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", "bfloat16",
            "--port", "8011", "--gpu-memory-utilization", "0.3", "--host", "127.0.0.1"]
    log_path = ctx.work / "vllm-server-8011.log"
    entry: dict[str, Any] = {"server_argv": argv[1:]}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # its own group: stopped below with all its children
    try:
        entry["server_ready_s"] = round(_wait_health("http://127.0.0.1:8011/health", proc, 600), 1)
        entry["gpu_used_mib_with_server"] = gpu_used_mib()
        r = compare(ctx.db, ["off=vllm", "api=openai,url=http://127.0.0.1:8011/v1"])
        entry.update(r)
    except Exception as e:  # noqa: BLE001 - recorded, the other parts go on
        entry.update(exit="error", json=None, wall_s=None, stderr_tail=f"{type(e).__name__}: {e}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        entry["server_exit"] = proc.poll()
        tail = log_path.read_text(errors="replace").splitlines()
        entry["server_log_tail"] = "\n".join(tail[-40:])
        entry["server_config_line"] = next((ln[-3000:] for ln in tail if "with config:" in ln), None)
    ctx.put("b_vllm_vs_openai_url_bf16", entry)


def _layers(ctx: "Ctx", name: str, run: dict[str, Any], poll: bool) -> None:
    d = run.get("json") or {}
    run_id = d.get("run_id")
    if not run_id:
        ctx.results["layers"][name] = {"error": "the compare run has no run id", "exit": run.get("exit")}
        return
    args = ["layers", run_id, "--sides", "ref,b", "--json", "--quiet"]
    if d.get("first_divergence") is None:  # identical: look at the last shared position instead
        n = min(len(s.get("token_ids") or []) for s in d["prompts"][0]["sides"].values())
        args[2:2] = ["--position", str(max(n - 1, 0))]
    base = gpu_used_mib()
    poller = MemPoller() if poll else None
    if poller:
        time.sleep(1.0)
        base = gpu_used_mib()
        poller.start()
    r = cli(ctx.db, *args, timeout=900)
    if poller:
        poller.stop()
    loc = r.get("json") or {}
    (ctx.out / f"layers-{name}.json").write_text(json.dumps(loc))
    figs = loc.get("per_layer") or []
    layer, block = loc.get("first_divergent_layer"), loc.get("first_divergent_block")
    stream = [f for f in figs if f["block"] == "residual"]
    at = next((f for f in stream if f["layer"] == layer), None)
    entry = {
        "exit": r["exit"], "wall_s": r["wall_s"], "seconds": loc.get("seconds"), "error": loc.get("error") or (
            None if r["exit"] == 0 else r["stderr_tail"][-2000:]),
        "run_id": run_id, "position": loc.get("position"), "token_positions": loc.get("token_positions"),
        "first_divergent_layer": layer, "first_divergent_block": block,
        "noise_floor_method": (loc.get("noise_floor") or {}).get("method"),
        "noise_floor_dtype": (loc.get("noise_floor") or {}).get("dtype"),
        "residual_at_divergent_layer": ({"layer": at["layer"], "rel_l2": at["rel_l2"][0], "floor": at["floor"][0],
                                         "cosine": at["cosine"][0]} if at else None),
        "residual_per_layer": [{"layer": f["layer"], "rel_l2": f["rel_l2"][0], "floor": f["floor"][0],
                                "cosine": f["cosine"][0]} for f in stream],
        "first_over_floor": next(({"layer": f["layer"], "block": f["block"], "rel_l2": f["rel_l2"][0],
                                   "floor": f["floor"][0], "cosine": f["cosine"][0]} for f in figs
                                  if f["rel_l2"][0] > max(10 * f["floor"][0], 1e-6)), None),
        "logits": loc.get("logits"), "summary": loc.get("summary"), "notes": loc.get("notes"),
        "full_json": f"layers-{name}.json"}
    if poller:
        entry["gpu_memory"] = {
            "baseline_mib": base, "peak_mib": poller.peak, "samples": poller.samples,
            "peak_minus_baseline_mib": [p - b for p, b in zip(poller.peak, base)] if poller.peak and base else None,
            "per_process_peak_mib": poller.proc_peak, "total_series": poller.series[:: max(1, len(poller.series) // 200)]}
    ctx.results["layers"][name] = entry
    ctx.flush()


def part_layers(ctx: "Ctx") -> None:
    ctx.results.setdefault("layers", {})
    short = compare(ctx.db, ["ref=hf", "b=vllm"])
    ctx.put("c_hf_vs_vllm_bf16_short", short)
    _layers(ctx, "short", short, poll=False)
    prompts = ctx.work / "long9k.jsonl"
    subprocess.run([sys.executable, "bench/long_prompt.py", "--tokens", str(ctx.args.tokens), "--out", str(prompts),
                    "--only-long"], check=True, cwd=ROOT, capture_output=True, text=True)
    long = compare(ctx.db, ["ref=hf", "b=vllm"], "--preset", "long-context-9k", prompt_file=prompts)
    ctx.put("c_hf_vs_vllm_bf16_9k", long)
    _layers(ctx, "9k", long, poll=True)


def part_pp(ctx: "Ctx") -> None:
    # The sides come from a config file (JSON is YAML), where "cuda:0,1" is plainly one value: the
    # --side parser before commit 158f875 split `device=cuda:0,1` at its comma and refused the side.
    sides = [{"name": "ref", "kind": "hf", "device": "cuda:0,1"},
             {"name": "b", "kind": "vllm", "pipeline_parallel_size": 2, "enforce_eager": True},
             {"name": "c", "kind": "vllm-server", "pipeline_parallel_size": 2, "enforce_eager": True}]

    def run(chosen: list[dict[str, Any]], name: str) -> dict[str, Any]:
        path = ctx.work / f"{name}.json"
        path.write_text(json.dumps({"sides": chosen}))
        return compare(ctx.db, [], "--config", str(path))

    r = run(sides, "pp-three")
    ctx.put("pp2_hf_spread_vs_vllm_and_server_bf16_eager", r)
    if r["exit"] not in (0, 1):  # one failing side sinks the three-way run: try each pair alone
        ctx.put("pp2_pair_vllm", run(sides[:2], "pp-b"))
        ctx.put("pp2_pair_vllm_server", run([sides[0], sides[2]], "pp-c"))


def part_tp_refused(ctx: "Ctx") -> None:
    r = compare(ctx.db, ["ref=hf", "b=vllm,tensor_parallel_size=2"])
    d = r.get("json") or {}
    ctx.results["tp_refused"] = {
        "exit": r["exit"], "wall_s": r["wall_s"], "status": d.get("status"), "error_code": d.get("error_code"),
        "message": d.get("error"), "stderr": r["stderr_tail"][-2000:], "phases_s": d.get("timings"),
        "loaded_sides": [s["name"] for s in d.get("sides") or [] if s.get("load_s")],
        "refused_before_loading": "load" not in (d.get("timings") or {}) or not any(
            s.get("load_s") for s in d.get("sides") or [])}
    ctx.raw["tp_refused"] = d
    ctx.flush()


def part_tp_tiny(ctx: "Ctx") -> None:
    folder = ctx.work / "tiny-llama-8h"
    code = ("import sys; sys.path.insert(0, 'tests'); from tiny_models import build_model; "
            f"build_model({str(folder)!r}, 'llama', num_attention_heads=8, num_key_value_heads=4, hidden_size=256, "
            "dtype='float32')")
    b = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if b.returncode != 0:
        ctx.results["tp_tiny_build"] = {"exit": b.returncode, "stderr": b.stderr[-2000:]}
        ctx.flush()
        return
    ctx.results["tp_tiny_model"] = json.loads((folder / "config.json").read_text())
    r = compare(ctx.db, ["ref=hf", "b=vllm,tensor_parallel_size=2"], model=str(folder), dtype="float32")
    ctx.put("tp2_tiny_llama_fp32", r)


def part_presets(ctx: "Ctx") -> None:
    """Issue 8's GPU pairs: vLLM eager vs CUDA graphs, HF fp32 vs vLLM bf16, and the same with fp32
    logits on both (the RL setup); the resolved-settings diff comes with each run's JSON."""
    for preset in ("eager-vs-graphs", "fp32-reference", "rl-rollout"):
        r = compare(ctx.db, [], "--sides-preset", preset)
        ctx.put(f"preset_{preset}", r)
        d = r.get("json") or {}
        ctx.results.setdefault("settings_diff", {})[preset] = d.get("settings_diff")
        ctx.flush()


def part_hf_paths(ctx: "Ctx") -> None:
    """Issue 12's fast HF reference: plain generate (the reference) against a static cache and
    parity-ui's graphed decode (static cache + one CUDA graph per step), and vLLM with CUDA graphs,
    in one run per dtype; HF with eager attention too. (decode=compiled, measured on 2026-11-23,
    pays a compile of tens of seconds per process: bench/figures/gpu-2026-11-23/hf-paths-h100.md.)"""
    sides = ["ref=hf", "static=hf,decode=static", "graphed=hf,decode=graphed",
             "attn-eager=hf,attn_implementation=eager", "v=vllm"]
    for dtype in ("bfloat16", "float32"):
        ctx.put(f"hf_paths_{dtype}", compare(ctx.db, sides, dtype=dtype, max_new=256, timeout=1200))


def _bench(ctx: "Ctx", name: str, argv: list[str], timeout: float = 900) -> None:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, code = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, code = str(e.stdout or "") + str(e.stderr or ""), "timeout"
    ctx.results.setdefault("benches", {})[name] = {"exit": code, "wall_s": round(time.perf_counter() - t0, 1),
                                                  "tail": out[-6000:]}
    ctx.flush()


def part_cold(ctx: "Ctx") -> None:
    _bench(ctx, "profile_prepare", ["bench/profile_prepare.py", "--top", "30"])
    _bench(ctx, "cold_start_bf16", ["bench/cold_start.py", "--max-new-tokens", "256", "--out",
                                    str(ctx.out / "cold_start.json")])


def part_overhead(ctx: "Ctx") -> None:
    _bench(ctx, "overhead_bf16", ["bench/overhead.py", "--max-new-tokens", "256", "--repeats", "3", "--out",
                                  str(ctx.out / "overhead.json")])


PARTS = {"server": part_server, "openai": part_openai, "layers": part_layers, "pp": part_pp,
         "tp-refused": part_tp_refused, "tp-tiny": part_tp_tiny, "presets": part_presets,
         "hf-paths": part_hf_paths, "cold": part_cold, "overhead": part_overhead}


# -- bookkeeping --------------------------------------------------------------------------------

class Ctx:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.db = self.work / "runs.db"
        self.results: dict[str, Any] = {"machine": machine(), "parts": {}, "compare": {}}
        self.raw: dict[str, Any] = {}

    def put(self, name: str, r: dict[str, Any]) -> None:
        s = summarise_compare(r)
        for k in ("server_argv", "server_ready_s", "gpu_used_mib_with_server", "server_exit", "server_log_tail",
                  "server_config_line"):
            if k in r:
                s[k] = r[k]
        s["argv"] = r.get("argv")
        self.results["compare"][name] = s
        self.raw[name] = r.get("json")
        self.flush()

    def flush(self) -> None:
        (self.out / "gpu_sides.json").write_text(json.dumps({**self.results, "raw": self.raw}, indent=1))
        (self.out / "gpu_sides.md").write_text(markdown(self.results))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"gpus": _smi("index,name,memory.total")}
    for mod in ("torch", "vllm", "transformers"):
        p = subprocess.run([sys.executable, "-c", f"import {mod}; print({mod}.__version__)"], capture_output=True,
                           text=True)
        info[mod] = p.stdout.strip() or p.stderr.strip()[-200:]
    return info


def _f(x: Any, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [f"# gpu_sides: {', '.join(g[1] for g in m.get('gpus') or [] if len(g) > 1)}; torch {m.get('torch')}, "
             f"vLLM {m.get('vllm')}, transformers {m.get('transformers')}", "",
             "| run | exit | side | kind | load s | prompt tok | tokens | first token s | per token ms | resolved |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in res["compare"].items():
        for side, info in s["sides"].items():
            for p in info.get("prompts") or [{}]:
                lines.append(f"| {name} | {s['exit']} | {side} | {info.get('kind', '')} | {_f(info.get('load_s'), '.1f')} | "
                             f"{p.get('prompt_tokens', '')} | {p.get('tokens', '')} | {_f(p.get('prefill_s'), '.3f')} | "
                             f"{_f(None if p.get('per_token_s') is None else p['per_token_s'] * 1000, '.2f')} | "
                             f"{json.dumps(info.get('resolved', {}))} |")
        if not s["sides"]:
            lines.append(f"| {name} | {s['exit']} | - | - | - | - | - | - | - | {(s.get('error') or '')[:300]!r} |")
    lines += ["", "| run | a | b | first divergence | tokens there (a, b) | verdict | max abs logprob gap before |",
              "|---|---|---|---|---|---|---|"]
    for name, s in res["compare"].items():
        for c in s["comparisons"]:
            fd = "identical" if c["identical"] else c["first_divergence"]
            lines.append(f"| {name} | {c['a']} | {c['b']} | {fd} | {c.get('texts_there')} | {c.get('verdict') or ''} | "
                         f"{_f(c.get('max_abs_gap_before'), '.4g')} |")
        if s.get("error"):
            lines.append(f"| {name} | | | ERROR | {s['error'][:400]!r} | | |")
    for name, l in (res.get("layers") or {}).items():
        lines += ["", f"## layers ({name}): run {l.get('run_id')}, position {l.get('position')}, exit {l.get('exit')}, "
                      f"{_f(l.get('seconds'), '.1f')} s (CLI wall {_f(l.get('wall_s'), '.1f')} s)"]
        if l.get("error"):
            lines.append(f"error: {l['error']}")
        lines.append(f"first divergent layer/block: {l.get('first_divergent_layer')} / {l.get('first_divergent_block')}")
        lines.append(f"residual at it: {l.get('residual_at_divergent_layer')}")
        lines.append(f"noise floor: {l.get('noise_floor_method')}")
        lines.append(f"summary: {l.get('summary')}")
        if l.get("gpu_memory"):
            g = l["gpu_memory"]
            lines.append(f"GPU memory: baseline {g['baseline_mib']} MiB, peak {g['peak_mib']} MiB, peak - baseline "
                         f"{g['peak_minus_baseline_mib']} MiB ({g['samples']} samples); per process peak "
                         f"{g['per_process_peak_mib']}")
    if res.get("tp_refused"):
        t = res["tp_refused"]
        lines += ["", f"## TP=2 on the demo model: exit {t['exit']}, refused before loading: "
                      f"{t['refused_before_loading']}, phases {t['phases_s']}", f"message: {t['message']}"]
    lines += ["", "parts: " + json.dumps(res["parts"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where gpu_sides.json / .md and the layers JSON go")
    ap.add_argument("--work", default="/tmp/gpu-sides", help="runs.db, prompt files, the tiny model, server log")
    ap.add_argument("--parts", default="server,openai,layers", help=f"comma list of {', '.join(ALL_PARTS)}")
    ap.add_argument("--tokens", type=int, default=9000, help="tokens of the long prompt")
    args = ap.parse_args()
    ctx = Ctx(args)
    for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
        t0 = time.perf_counter()
        try:
            PARTS[part](ctx)
            ctx.results["parts"][part] = {"ok": True, "s": round(time.perf_counter() - t0, 1)}
        except Exception as e:  # noqa: BLE001 - recorded, the next part goes on
            ctx.results["parts"][part] = {"ok": False, "s": round(time.perf_counter() - t0, 1),
                                          "error": f"{type(e).__name__}: {e}"}
        ctx.flush()
        print(f"[gpu_sides] {part}: {ctx.results['parts'][part]}", flush=True)
    print(BEGIN)
    print((ctx.out / "gpu_sides.md").read_text())
    print(END, flush=True)


if __name__ == "__main__":
    main()
