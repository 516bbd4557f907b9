"""The Gradio app: build every tab, then wire every event; `main` parses flags and launches.

One ParityService per process (in a AppService): the sides' engines are shared by every browser
session (the GPU is one), and runs queue on the gradio event with concurrency 1. Per-session data
lives in gr.State.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import gradio as gr

from ..render.assets import CSS, JS
from . import plots
from .active_run import ActiveRunBar, RunGate
from .audit_tab import AuditTab
from .compare_tab import CompareTab
from .config_tab import ConfigTab
from .history_tab import HistoryTab
from .runner import AppService
from .weights_tab import WeightsTab

TITLE = "parity-ui: engine setups side by side, token by token"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# What gradio itself lets through. Above it the page only shows gradio's own short-lived toast, so it
# sits far above the app's own upload limit (parity_ui.inputs.prompts.MAX_PROMPT_FILE_BYTES): a file
# between the two reaches the upload handler, which refuses it with a card naming the size, the
# limit and the command line for large files (#33 item 13).
TRANSPORT_MAX_FILE = "2gb"


def create_app(service: AppService) -> gr.Blocks:
    gate = RunGate(service)  # one engine set: Stop (and Resume) in either tab acts on the same runs
    compare = CompareTab(service, gate)
    config = ConfigTab(service)
    history = HistoryTab(service, gate)
    bar = ActiveRunBar(gate)  # a run another tab started (or whose tab went away): seen, and stopped, from any tab
    audit = AuditTab(service, gate)
    weights = WeightsTab(service, gate)
    with gr.Blocks(title=TITLE) as app:
        gr.Markdown(
            f"## {TITLE}\nRun the same prompt through every side (vLLM, HF transformers, other settings, "
            "versions or checkpoints) with one canonical config, and see the first token where a side "
            "leaves the reference."
        )
        bar.create_ui()
        with gr.Tabs() as tabs:
            compare.create_ui()
            config.create_ui()
            history.create_ui()
            audit.create_ui()
            weights.create_ui()
        compare.create_event_handlers(cfg_yaml=config.yaml)
        config.create_event_handlers(model=compare.model, trust=compare.trust, summary=compare.config_line)
        validate = [config.yaml, compare.model, compare.trust]
        checked = [config.error, compare.config_line, config.mapping, *config.field_list]

        def after_yaml(event: Any) -> None:
            # The last one asked wins, one after the other: the config line shows the newest YAML.
            compare.recount(
                event.then(
                    config.yaml_changed,
                    validate,
                    checked,
                    api_name=False,
                    trigger_mode="always_last",
                    show_progress="hidden",
                    concurrency_limit=1,
                    concurrency_id="validate",
                )
            )

        compare.sides.create_event_handlers(config.yaml, after_yaml)
        after_yaml(compare.commit_sides)  # Run wrote the panel's last edits into the YAML
        for event in config.validations:  # the YAML editor left, a form field, a preset: a new config
            compare.recount(event)
            compare.clear_stale(event)  # a "Not run" card whose problem the new config fixed goes
        for event in config.yaml_rewrites:  # presets, reset, a loaded file: redraw the Sides panel
            event.then(
                compare.sides.from_yaml,
                [config.yaml],
                compare.sides.redrawn,
                api_name=False,
                trigger_mode="always_last",
            )
        history.create_event_handlers(tabs=tabs, app=app)
        bar.create_event_handlers(app)
        audit.create_event_handlers()
        weights.create_event_handlers(app)
        # A long view's page script fetches the rest of its hover details here once it shows.
        gr.api(history.pane_details, api_name="pane_details", api_visibility="undocumented")
        app.load(
            compare.initial,
            [compare.model, compare.trust, compare.prompt, config.yaml],
            [compare.model_info, compare.prompt_info],
            api_name=False,
        )
        app.load(config.yaml_changed, validate, checked, api_name=False)
        # The page loads plotly.js (~3.5 MB, a 1-1.5 s freeze of a headless page) with its first
        # figure. A tiny figure drawn off screen when the page loads pays that while the reader is
        # still reading, rather than just after a run's panes show, when they reach for a token.
        warm_plot = gr.Plot(show_label=False, elem_classes=["pc-offscreen"], container=False)
        app.load(plots.tiny_figure, None, warm_plot, api_name=False, show_progress="hidden")
    app.queue(default_concurrency_limit=4)
    plots.warm_up()
    return app


def launch_kwargs() -> dict[str, Any]:
    """What every launch needs: the page's CSS and script, and the upload size limit."""
    return {"css": CSS, "head": JS, "max_file_size": TRANSPORT_MAX_FILE, "footer_links": ["api"]}


def parse_auth(value: str | None) -> tuple[str, str] | None:
    """`USER:PASSWORD` -> (user, password). Raises ValueError naming the problem."""
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ValueError("--auth (or PARITY_AUTH) must be USER:PASSWORD, both non-empty")
    return user, password


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="The parity-ui web app.")
    ap.add_argument(
        "--host",
        default=os.environ.get("PARITY_HOST", "127.0.0.1"),
        help="address to bind (default 127.0.0.1: this machine only)",
    )
    ap.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("PARITY_PORT", "7860")),
        help="port (default $PARITY_PORT or 7860)",
    )
    ap.add_argument("--db", default=None, help="run database (default $PARITY_DB or ./runs.db)")
    ap.add_argument(
        "--auth",
        default=None,
        metavar="USER:PASSWORD",
        help="require this login (Gradio's own authentication); default $PARITY_AUTH. Use it whenever "
        "--host is not 127.0.0.1",
    )
    return ap.parse_args(argv)


def bind_warning(host: str, auth: tuple[str, str] | None) -> str | None:
    """The warning printed when the app is reachable from other machines without a login."""
    if host in LOCAL_HOSTS or auth is not None:
        return None
    return (
        f"parity-ui: WARNING: serving on {host} without a login: anyone who can reach this machine can run "
        "models on it and read every stored run. Add --auth USER:PASSWORD (or set PARITY_AUTH), and use it on "
        "a trusted network only."
    )


def warm_up(service: AppService) -> None:
    """Load the demo model's tokenizer (and transformers with it, ~5 s) before serving, so the
    first page load does not pay for it."""
    from ..core.errors import ParityError
    from ..inputs.prompts import tokenizer_for

    try:
        tokenizer_for(service.describe("demo").path)
    except ParityError:
        pass  # the page shows the problem when the demo is picked


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # gradio stops serving on it, and the finally below closes the engines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        auth = parse_auth(args.auth or os.environ.get("PARITY_AUTH"))
    except ValueError as e:
        sys.exit(f"parity-ui: error: {e}")
    warning = bind_warning(args.host, auth)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    service = AppService(args.db)
    warm_up(service)
    try:
        create_app(service).launch(
            server_name=args.host,
            server_port=args.port,
            auth=auth,
            auth_message="parity-ui: log in with the user and password the host set (--auth / PARITY_AUTH)"
            if auth
            else None,
            **launch_kwargs(),
        )
    finally:
        service.close()
