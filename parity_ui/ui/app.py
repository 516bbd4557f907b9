"""The Gradio app: build every tab, then wire every event; `main` parses flags and launches.

One ParityService per process (in a ServiceRunner): the engines are shared by every browser session
(the GPU is one), and runs queue on the gradio event with concurrency 1. Per-session data lives in
gr.State.
"""
from __future__ import annotations

import argparse
import os
import signal
from typing import Any

import gradio as gr

from .assets import CSS, JS
from .compare_tab import CompareTab, RunGate
from .config_tab import ConfigTab
from .history_tab import HistoryTab
from .runner import ServiceRunner

TITLE = "parity-ui: vLLM vs HF transformers, token by token"


def create_app(service: ServiceRunner) -> gr.Blocks:
    compare = CompareTab(service, RunGate(service))
    config = ConfigTab(service)
    history = HistoryTab(service)
    with gr.Blocks(title=TITLE) as app:
        gr.Markdown(f"## {TITLE}\nRun the same prompt through both engines with the same canonical config "
                    "and see the first token where they disagree.")
        with gr.Tabs() as tabs:
            compare.create_ui()
            config.create_ui()
            history.create_ui()
        compare.create_event_handlers(cfg_yaml=config.yaml)
        config.create_event_handlers(model=compare.model, trust=compare.trust, summary=compare.config_line)
        history.create_event_handlers(tabs=tabs, app=app)
        app.load(compare.initial, [compare.model, compare.trust, compare.prompt, config.yaml],
                 [compare.model_info, compare.prompt_info], api_name=False)
        app.load(config.yaml_changed, [config.yaml, compare.model, compare.trust],
                 [config.error, compare.config_line, config.mapping, *config.field_list], api_name=False)
    app.queue(default_concurrency_limit=4)
    return app


def launch_kwargs() -> dict[str, Any]:
    """What every launch needs: the page's CSS and script, and the upload size limit."""
    return {"css": CSS, "head": JS, "max_file_size": "50mb", "footer_links": ["api"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="The parity-ui web app (vLLM vs HF transformers).")
    ap.add_argument("--host", default=os.environ.get("PARITY_HOST", "127.0.0.1"),
                    help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("PARITY_PORT", "7860")),
                    help="port (default $PARITY_PORT or 7860)")
    ap.add_argument("--db", default=None, help="run database (default $PARITY_DB or ./runs.db)")
    return ap.parse_args(argv)


def warm_up(service: ServiceRunner) -> None:
    """Load the demo model's tokenizer (and transformers with it, ~5 s) before serving, so the
    first page load does not pay for it."""
    from ..errors import ParityError
    from ..prompts import tokenizer_for

    try:
        tokenizer_for(service.describe("demo").path)
    except ParityError:
        pass  # the page shows the problem when the demo is picked


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # gradio stops serving on it, and the finally below closes the engines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    service = ServiceRunner(args.db)
    warm_up(service)
    try:
        create_app(service).launch(server_name=args.host, server_port=args.port, **launch_kwargs())
    finally:
        service.close()
