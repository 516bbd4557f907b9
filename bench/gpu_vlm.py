"""Image prompts on the GPU machine: a tiny random Qwen2-VL (and Qwen2.5-VL) built here with
tests/tiny_vlm.py, a small PNG made here, and one image prompt through parity-ui's own ParityService,
sides HF (reference) vs vLLM, in float32 and in bfloat16.

    python bench/gpu_vlm.py --out DIR [--archs qwen2_vl,qwen2_5_vl] [--dtypes float32,bfloat16]
                            [--timeout 300] [--total 0] [--max-new-tokens 32] [--expect cuda|cpu|any]

Every step runs in a child process of its own, bounded by --timeout seconds: a progress line before
and after each, the child's own lines as they come (prefixed with the step), and a child past its
limit first dumps the Python stacks of itself and of its engine workers (faulthandler; the workers'
go to their logs, which are read back), then is killed. The build step runs with the network
refused (tests/no_network.py): the builder must work offline. The run steps and their workers run
with it logged: one line per attempt, naming the host and the frames that asked.

Figures, per arch and dtype: identical or not, first divergence, max abs logprob gap before it, the
verdict, each side's image token count, the sides' load / first token / total times and the run's
phases, the run's warnings, and the warning lines of the run's own output and of its workers' logs.
Written to DIR/gpu_vlm.json and DIR/gpu_vlm.md after every step (a timeout keeps what was done),
DIR/gpu_vlm.log holds every line; the summary is printed between the markers below at the end
(vLLM prints its shutdown logs after our last line).

Needs torch, transformers, tokenizers, numpy, pillow, pyyaml, sqlite-utils, pydantic, vllm: no gradio, no
plotly. Without torchvision (a CPU machine here) the tiny model ships its stand-in video processor and
the workers get tests/tiny_vlm.py's shim; with it, neither is used.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
BEGIN, END = "@@GPU_VLM_BEGIN@@", "@@GPU_VLM_END@@"
PROMPT = "Describe the picture."
PIXELS = {"min_pixels": 3136, "max_pixels": 12544}  # a 112x84 image: 12 image tokens (6 x 8 patches / 4)
# A line worth keeping from a step's output or a worker's log (vLLM's INFO lines mention "error" in
# their settings dumps: not those).
WARNING_LINE = re.compile(r"warn|\[no_network\]|traceback|error\b|exception|timed out", re.IGNORECASE)
_LOG: list[Any] = []  # the parent's log file, once open
HEARTBEAT_S = 30  # a line from the parent this often while a step runs


def say(msg: str) -> None:
    line = f"[gpu_vlm {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    for f in _LOG:
        f.write(line + "\n")
        f.flush()


# -- the children ---------------------------------------------------------------------------------

def _child_setup(args: argparse.Namespace, net: str) -> None:
    """In a child: stacks on a crash and on SIGUSR2 (the parent sends it to the child and to every
    process under it when the step passes its limit), the network guard, tests/ importable."""
    import faulthandler

    faulthandler.enable()
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    sys.path.insert(0, str(TESTS))
    import no_network  # type: ignore[import-not-found]

    no_network.install(net)


def child_probe(args: argparse.Namespace) -> dict[str, Any]:
    """Versions and the device, read in a fresh process (importing vLLM takes a while on its own)."""
    _child_setup(args, "log")
    from importlib import metadata

    out: dict[str, Any] = {"python": sys.version.split()[0], "versions": {}}
    for name in ("torch", "transformers", "tokenizers", "vllm", "torchvision", "huggingface_hub", "pillow",
                 "sqlite-utils", "pydantic", "numpy"):
        try:
            out["versions"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out["versions"][name] = None
    import torch

    out["cuda"] = torch.cuda.is_available()
    out["device"] = torch.cuda.get_device_name(0) if out["cuda"] else "cpu"
    from transformers.utils import is_torchvision_available

    out["torchvision_usable"] = bool(is_torchvision_available())
    t = time.perf_counter()
    say("importing vllm")
    import vllm  # noqa: F401

    out["import_vllm_s"] = round(time.perf_counter() - t, 1)
    out["versions"]["vllm"] = vllm.__version__  # the CPU build's distribution is not named vllm
    out["env"] = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_USE_FLASHINFER_SAMPLER",
                                                 "PYTHONPATH", "PARITY_CACHE_DIR")}
    for mod in ("gradio", "plotly"):
        out[f"{mod}_installed"] = _installed(mod)
    return out


def _installed(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def child_build(args: argparse.Namespace) -> dict[str, Any]:
    """Build the tiny model with the network refused, then load its processor once."""
    _child_setup(args, "raise")
    t = time.perf_counter()
    from tiny_vlm import build_vlm, needs_remote_code, torchvision_available  # type: ignore[import-not-found]

    say(f"building {args.arch} into {args.folder}")
    folder = build_vlm(Path(args.folder), arch=args.arch)
    build_s = time.perf_counter() - t
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(folder, trust_remote_code=needs_remote_code(folder), local_files_only=True)
    return {"build_s": round(build_s, 1), "torchvision": torchvision_available(),
            "needs_remote_code": needs_remote_code(folder), "processor": type(proc).__name__,
            "image_processor": type(proc.image_processor).__name__,
            "video_processor": type(getattr(proc, "video_processor", None)).__name__,
            "config": json.loads((folder / "config.json").read_text()).get("architectures")}


def make_png(path: Path, w: int = 112, h: int = 84) -> Path:
    """A colour gradient (no randomness): the image of tests/engines/test_image_engines.py."""
    import numpy as np
    from PIL import Image

    x = np.linspace(0, 255, w, dtype=np.float32)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None].repeat(w, 1)
    Image.fromarray(np.stack([x, y, 255 - (x + y) / 2], -1).astype(np.uint8), "RGB").save(path)
    return path


def child_run(args: argparse.Namespace) -> dict[str, Any]:
    """One image prompt, HF (reference) vs vLLM, through ParityService; the figures of the run."""
    _child_setup(args, "log")
    t0 = time.perf_counter()
    from parity_ui.core.config import build_config
    from parity_ui.inputs.images import read_image
    from parity_ui.run.prepare import RunRequest
    from parity_ui.inputs.prompts import PromptSpec
    from parity_ui.render.report import format_summary, run_json
    from parity_ui.service import ParityService
    from tiny_vlm import needs_remote_code  # type: ignore[import-not-found]

    cfg = build_config(None, [f"dtype={args.dtype}", f"max_new_tokens={args.max_new_tokens}", "ignore_eos=true",
                              "max_model_len=1024", f"image_min_pixels={PIXELS['min_pixels']}",
                              f"image_max_pixels={PIXELS['max_pixels']}"], sides=["hf=hf", "vllm=vllm"])
    req = RunRequest(model=args.folder, prompts=[PromptSpec(text=PROMPT, images=[read_image(args.image)])],
                     config=cfg, trust_remote_code=needs_remote_code(Path(args.folder)))

    def on_event(e: Any) -> None:
        if e.kind != "token":
            say(f"event {e.kind}: {e.message}")

    svc = ParityService(db_path=args.db)
    try:
        say(f"run: {args.arch} {args.dtype}, sides hf (reference) and vllm")
        run = svc.run(req, on_event)
    finally:
        svc.close()
    print(format_summary(run), flush=True)
    d = run_json(run)
    out: dict[str, Any] = {"status": run.status, "error": run.error, "error_code": run.error_code,
                           "run_s": round(time.perf_counter() - t0, 1), "phases_s": run.timings,
                           "warnings": [{"code": w.code, "severity": w.severity, "side": w.side, "message": w.message}
                                        for w in run.warnings],
                           "sides": {s.name: {"kind": s.kind, "device": s.device, "dtype": s.dtype, "load_s": s.load_s,
                                              "version": s.version, "resolved": s.resolved} for s in run.sides}}
    for p in run.prompts:
        out["prompt_tokens"] = len(p.prompt_token_ids)
        out["image_tokens"] = [img.get("tokens") for img in p.images]
        out["streams"] = {n: {"tokens": len(r.token_ids), "finish": r.finish_reason, "prefill_s": r.timings.prefill_s,
                              "total_s": r.timings.total_s, "text": r.text[:200], "error": r.error}
                          for n, r in p.results.items()}
        out["comparisons"] = [{
            "a": c.a, "b": c.b, "identical": c.identical, "first_divergence": c.first_divergence,
            "compared": c.compared, "max_abs_gap_before": c.max_abs_gap, "mean_abs_gap_before": c.mean_abs_gap,
            "tokens_there": c.divergence.token_ids if c.divergence else None,
            "texts_there": c.divergence.texts if c.divergence else None,
            "verdict": c.explanation.verdict if c.explanation else None,
            "summary": c.explanation.summary if c.explanation else None}
            for c in p.comparisons]
    out["run_json"] = d
    return out


CHILDREN = {"probe": child_probe, "build": child_build, "run": child_run}


# -- the parent ------------------------------------------------------------------------------------

SITECUSTOMIZE = '''"""Written by bench/gpu_vlm.py for its children and their engine workers (not a project file)."""
import faulthandler as _fh
import importlib.util as _ilu
import signal as _signal

_fh.register(_signal.SIGUSR2, all_threads=True)  # the parent asks for every thread's stack on a timeout
_spec = _ilu.spec_from_file_location("_gpu_vlm_no_network", {guard!r})
_guard = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_guard)
_guard.install("log")
'''


def write_site(folder: Path) -> Path:
    """sitecustomize.py for every process under this script: tests/tiny_vlm.py's shim (it acts only
    without torchvision), stacks on SIGUSR2, the network logged."""
    sys.path.insert(0, str(TESTS))
    from tiny_vlm import SHIM_SOURCE  # type: ignore[import-not-found]

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SHIM_SOURCE + "\n\n" + SITECUSTOMIZE.format(
        guard=str(TESTS / "no_network.py")))
    return folder


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Step:
    """One child process: its lines streamed (prefixed) and kept, bounded by a timeout."""

    def __init__(self, ctx: "Ctx", name: str, argv: list[str], timeout: float):
        self.ctx, self.name, self.argv, self.timeout = ctx, name, argv, timeout
        self.lines: list[str] = []

    def _pump(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            self.ctx.log(f"  [{self.name}] {line}")

    def run(self) -> dict[str, Any]:
        result = self.ctx.work / f"{self.name}.result.json"
        result.unlink(missing_ok=True)
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", *self.argv, "--result", str(result)]
        say(f"step {self.name}: start (limit {self.timeout:.0f} s)")
        t0 = time.perf_counter()
        logs_before = set(self.ctx.logs.glob("*.log")) if self.ctx.logs.is_dir() else set()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.ctx.env, start_new_session=True)
        pump = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        pump.start()
        timed_out, code = False, None
        while code is None:
            left = self.timeout - (time.perf_counter() - t0)
            if left <= 0:
                timed_out, code = True, "timeout"
                self._kill(proc)
                break
            try:
                code = proc.wait(min(HEARTBEAT_S, left))
            except subprocess.TimeoutExpired:  # a heartbeat: the step is alive, and here is where
                last = self.lines[-1][:200] if self.lines else "(no output yet)"
                say(f"step {self.name}: still running after {time.perf_counter() - t0:.0f} s; last line: {last}")
        pump.join(10)
        wall = round(time.perf_counter() - t0, 1)
        entry: dict[str, Any] = {"exit": code, "wall_s": wall}
        if result.is_file():
            entry.update(json.loads(result.read_text()))
        elif not timed_out:
            entry["error"] = "the step wrote no result: " + " | ".join(self.lines[-15:])
        if timed_out:
            entry["error"] = (f"timed out after {self.timeout:.0f} s; last lines: " + " | ".join(self.lines[-25:]))
        entry["output_warnings"] = _warning_lines(self.lines)
        new_logs = sorted(set(self.ctx.logs.glob("*.log")) - logs_before) if self.ctx.logs.is_dir() else []
        entry["worker_logs"] = {p.name: _log_digest(p) for p in new_logs}
        say(f"step {self.name}: exit {code} in {wall} s" + (f" -- {entry['error'][:300]}" if entry.get("error") else ""))
        return entry

    def _kill(self, proc: subprocess.Popen) -> None:
        """Stacks first (the child's own faulthandler fires before the limit; the workers' on SIGUSR2
        into their logs), then the whole tree."""
        tree = _descendants(proc.pid)
        say(f"step {self.name}: over its limit; asking {len(tree)} descendant process(es) for their stacks")
        for pid in [proc.pid, *tree]:
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
        time.sleep(3)
        for pid in [*reversed(tree), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass


def _warning_lines(lines: list[str], limit: int = 60) -> list[str]:
    hits = [ln.strip()[:400] for ln in lines if WARNING_LINE.search(ln) and " INFO " not in ln]
    return list(dict.fromkeys(hits))[:limit]


def _log_digest(path: Path) -> dict[str, Any]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return {"error": str(e)}
    return {"lines": len(lines), "warnings": _warning_lines(lines), "stacks": _stacks(lines), "tail": lines[-40:]}


def _stacks(lines: list[str], limit: int = 200) -> list[str]:
    """The faulthandler dumps in a log (what a worker was doing when the step ran out of time)."""
    out: list[str] = []
    inside = False
    for ln in lines:
        if ln.startswith(("Thread 0x", "Current thread 0x")):
            inside = True
        elif inside and not ln.startswith("  File ") and ln.strip():
            inside = False
        if inside:
            out.append(ln)
    return out[:limit]


class Ctx:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        cache = self.work / "cache"
        self.logs = cache / "logs"  # parity-ui's worker logs (parity_ui.core.paths.cache_dir)
        site = write_site(self.work / "site")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "PARITY_CACHE_DIR": str(cache),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")]))}
        # Nothing below may wait on a model hub: an offline machine answers at once instead.
        self.env.setdefault("HF_HUB_OFFLINE", "1")
        self.env.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not carried to the GPU machine
        self.results: dict[str, Any] = {"args": vars(args), "steps": {}}
        self.t0 = time.perf_counter()
        self._log = open(self.out / "gpu_vlm.log", "a", encoding="utf-8")
        _LOG.append(self._log)

    def log(self, line: str) -> None:
        print(line, flush=True)
        self._log.write(line + "\n")
        self._log.flush()

    def step(self, name: str, argv: list[str]) -> dict[str, Any]:
        limit = self.args.timeout
        if self.args.total:
            left = self.args.total - (time.perf_counter() - self.t0)
            if left < 30:
                entry = {"exit": "skipped", "wall_s": 0, "error": f"skipped: {left:.0f} s of --total left"}
                say(f"step {name}: {entry['error']}")
                self.results["steps"][name] = entry
                self.flush()
                return entry
            limit = min(limit, left - 5)
        entry = Step(self, name, argv, limit).run()
        self.results["steps"][name] = entry
        self.flush()
        return entry

    def flush(self) -> None:
        (self.out / "gpu_vlm.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "gpu_vlm.md").write_text(markdown(self.results))


def _f(x: Any, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(res: dict[str, Any]) -> str:
    probe = res["steps"].get("probe") or {}
    v = probe.get("versions") or {}
    lines = [f"# gpu_vlm: {probe.get('device', '?')}; torch {v.get('torch')}, vLLM {v.get('vllm')}, "
             f"transformers {v.get('transformers')}, torchvision {v.get('torchvision')} "
             f"(usable: {probe.get('torchvision_usable')})", ""]
    for name, s in res["steps"].items():
        if name.startswith("build-"):
            lines.append(f"- {name}: exit {s['exit']} in {s['wall_s']} s; video processor {s.get('video_processor')}, "
                         f"image processor {s.get('image_processor')}, remote code {s.get('needs_remote_code')}"
                         + (f"; ERROR {s['error'][:500]}" if s.get("error") else ""))
    lines += ["", "| arch | dtype | status | identical | first divergence | max abs gap before | verdict | "
                  "image tokens | hf load / first / total s | vllm load / first / total s | run s | warnings |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in res["steps"].items():
        if not name.startswith("run-"):
            continue
        _, arch, dtype = name.split("-", 2)
        c = (s.get("comparisons") or [{}])[0]
        st, sides = s.get("streams") or {}, s.get("sides") or {}

        def times(side: str) -> str:
            return (f"{_f((sides.get(side) or {}).get('load_s'), '.1f')} / {_f((st.get(side) or {}).get('prefill_s'), '.3f')}"
                    f" / {_f((st.get(side) or {}).get('total_s'), '.3f')}")
        warns = ", ".join(w["code"] for w in s.get("warnings") or []) or "-"
        lines.append(f"| {arch} | {dtype} | {s.get('status') or s['exit']} | {c.get('identical')} | "
                     f"{c.get('first_divergence')} | {_f(c.get('max_abs_gap_before'))} | {c.get('verdict')} | "
                     f"{s.get('image_tokens')} | {times('hf')} | {times('vllm')} | {s['wall_s']} | {warns} |")
        if s.get("error"):
            lines.append(f"| {arch} | {dtype} | ERROR | {s['error'][:600]!r} | | | | | | | | |")
    for name, s in res["steps"].items():
        if s.get("exit") == "timeout":
            lines += ["", f"## {name}: timed out; where the workers were (faulthandler, from their logs)"]
            for k, d in (s.get("worker_logs") or {}).items():
                lines += [f"  worker log {k}:", *[f"    {ln}" for ln in (d.get("stacks") or [])[:60]]]
    for name, s in res["steps"].items():
        ws = s.get("output_warnings") or []
        wl = {k: d.get("warnings") for k, d in (s.get("worker_logs") or {}).items() if d.get("warnings")}
        if ws or wl:
            lines += ["", f"## {name}: warning lines", *[f"    {w}" for w in ws[:30]]]
            for k, hits in wl.items():
                lines += [f"  worker log {k}:", *[f"    {w}" for w in hits[:20]]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="where gpu_vlm.json / .md / .log go")
    ap.add_argument("--work", default="/tmp/gpu-vlm", help="the tiny models, the image, runs.db, worker logs")
    ap.add_argument("--archs", default="qwen2_vl,qwen2_5_vl", help="comma list of qwen2_vl, qwen2_5_vl, qwen3_vl")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma list of float32, bfloat16, float16")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=300, help="seconds each step may take")
    ap.add_argument("--total", type=float, default=0,
                    help="seconds for the whole script (0: no limit); a step gets at most what is left")
    ap.add_argument("--expect", default="any", choices=("any", "cuda", "cpu"),
                    help="stop after the probe unless the machine has this device")
    # the children's arguments
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--arch", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--image", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        out = CHILDREN[args.child](args)
        Path(args.result).write_text(json.dumps(out, default=str))
        # vLLM and torch may leave non-daemon threads behind; the result is written: leave now.
        sys.stdout.flush()
        os._exit(0)
    if not args.out:
        ap.error("--out DIR is required")
    ctx = Ctx(args)
    probe = ctx.step("probe", ["probe"])
    if args.expect != "any" and (probe.get("cuda") is not (args.expect == "cuda")):
        say(f"--expect {args.expect}, but the probe found: {probe.get('device') or probe.get('error')}; stopping")
    else:
        image = make_png(ctx.work / "gradient.png")
        for arch in [a.strip() for a in args.archs.split(",") if a.strip()]:
            folder = ctx.work / "models" / arch
            built = ctx.step(f"build-{arch}", ["build", "--arch", arch, "--folder", str(folder)])
            if built.get("error") or built["exit"] != 0:
                continue
            for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
                ctx.step(f"run-{arch}-{dtype}", ["run", "--arch", arch, "--dtype", dtype, "--folder", str(folder),
                                                 "--image", str(image), "--db", str(ctx.work / "runs.db"),
                                                 "--max-new-tokens", str(args.max_new_tokens)])
    ctx.results["total_s"] = round(time.perf_counter() - ctx.t0, 1)
    ctx.flush()
    print(BEGIN)
    print((ctx.out / "gpu_vlm.md").read_text())
    print(END, flush=True)


if __name__ == "__main__":
    main()
