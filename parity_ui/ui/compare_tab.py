"""Compare tab: pick a model and the sides, give prompts, run every side with live token streams.

The run itself is the service's: `service.run` runs in a worker thread, its RunEvents come back
through a queue, and the handler yields the live view at most every THROTTLE_S seconds. A workload
file (.jsonl, .parquet; parity_ui.ui.workload_input) runs the same way through `run_workload`, its
progress shown with an ETA, and then its view (parity_ui.ui.workload_view) above the token view. A
stored run whose sides differ gets Which setting? under it (parity_ui.ui.which_setting_view).
"""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator
from typing import Any

import gradio as gr

from ..core.config import ParityConfig
from ..core.context import max_context
from ..core.errors import ConfigError, ModelError, ParityError, PromptError
from ..core.types import Run
from ..core.workload_record import FLOORS
from ..inputs.demo_model import DEMO_LABEL, DEMO_NAME
from ..inputs.images import IMAGE_TYPES, MAX_IMAGE_BYTES, MAX_IMAGES_PER_PROMPT, read_image
from ..inputs.models import local_models
from ..inputs.prompts import PROMPT_FILE_TYPES, PromptSpec, check_upload_size, parse_prompt_bytes, tokenizer_for
from ..render import cards
from ..service import ReplayRequest, Request, RunRequest, plan_request
from .active_run import RunGate, session_of, waiting_text
from .config_tab import config_from_text, config_summary_html, default_yaml
from .live import LiveRun, WorkloadLive, follow
from .replay_input import replay_request
from .result_view import ResultView
from .sides_panel import SidesPanel
from .which_setting_view import WhichSettingView
from .workload_input import WorkloadPick, cleared, is_workload_file, load, note_html, uploaded, with_options
from .workload_view import WorkloadView, read_for_view

REFUSED = "Not run (nothing stored)"
THROTTLE_S = 0.2
UPLOAD_TYPES = (*PROMPT_FILE_TYPES, ".parquet")
MODE_CHOICES = [
    ("free: every side generates", "free"),
    ("scored: the reference teacher-forces the others' tokens", "scored"),
]
FLOOR_CHOICES = [
    ("auto (batch when free; kernel when scored with an HF reference)", "auto"),
    *((f, f) for f in FLOORS if f != "auto"),
]
DEFAULT_PROMPT = "Give me a brief explanation of gravity in simple terms."


def _pick(workload: Any) -> WorkloadPick:
    """The workload state as a handler gets it (None from an API client that leaves it out)."""
    return workload if isinstance(workload, WorkloadPick) else WorkloadPick()


def _what(req: Request) -> str:
    """A run for people, as the other tabs name it: "a comparison on demo (hf vs vllm)"."""
    sides = " vs ".join(s.name for s in req.config.sides)
    model = os.path.basename(str(req.model).rstrip("/")) or str(req.model)
    if isinstance(req, ReplayRequest):
        return f"a replay on {model} ({sides})"
    if isinstance(req, RunRequest):
        n = len(req.prompts)
        return f"a comparison of {n} prompt{'s' if n != 1 else ''} on {model} ({sides})"
    return f"a workload of {len(req.prompts)} prompts on {model} ({sides})"


def model_choices() -> list[tuple[str, str]]:
    return [(DEMO_LABEL, DEMO_NAME)] + [(m, m) for m in local_models()]


def _specs(prompt: str, file_prompts: list[dict] | None, images: list[str] | None = None) -> list[PromptSpec]:
    if file_prompts:
        if images:
            raise PromptError(
                "images were uploaded next to the prompt, and a prompt file is in use",
                "name the images in the .jsonl file, or press 'Use the text box'",
            )
        return [PromptSpec(**d) for d in file_prompts]
    if not prompt or not prompt.strip():
        raise PromptError("the prompt is empty", "type a prompt or upload a .txt/.jsonl file")
    return [PromptSpec(text=prompt, images=read_images(images))]


def _image_prompt_tokens(info: Any, trust: bool, cfg: ParityConfig, spec: PromptSpec) -> int:
    """An image prompt's length as the reference side will see it (image tokens included)."""
    if not info.vision:
        raise PromptError(
            f"images were given, but {info.name} is a text-only model",
            "pick a vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), or drop the images",
        )
    from ..inputs.prompts import vision_for

    v = vision_for(info.path, trust)
    px = {"min_pixels": cfg.image_min_pixels or v.min_pixels, "max_pixels": cfg.image_max_pixels or v.max_pixels}
    return len(v.encode(spec, px).token_ids)


def _paths(files: Any) -> list[str]:
    """gr.File values (paths, or objects with .name) as paths."""
    if not files:
        return []
    files = files if isinstance(files, list) else [files]
    return [f if isinstance(f, str) else getattr(f, "name", str(f)) for f in files]


def read_images(files: Any) -> list[Any]:
    """The uploaded images, checked (type, size, pixels, decodable): PromptError naming the file."""
    paths = _paths(files)
    if len(paths) > MAX_IMAGES_PER_PROMPT:
        raise PromptError(
            f"{len(paths)} images were uploaded; a prompt takes at most {MAX_IMAGES_PER_PROMPT}", "remove some images"
        )
    out = []
    for path in paths:
        img = read_image(path)
        img.name = os.path.basename(path)  # not the upload's temporary folder
        out.append(img)
    return out


def run_refusal(
    cfg_text: str, refused_file: tuple[str, str] | None, workload: WorkloadPick | None
) -> tuple[str, str, str] | None:
    """(title, message, fix) when the page shows input that cannot run: a refused upload, a
    refused workload file or option, a config that does not validate. Run then shows this card and
    stores nothing (the page already says what is wrong); None when the run may go."""
    if refused_file:
        return ("Prompt file refused", *refused_file)
    if workload is not None and workload.error and workload.path is not None:
        return ("Workload file refused", workload.error, workload.fix)
    try:
        config_from_text(cfg_text)
    except ConfigError as e:
        return ("Invalid config", e.message, e.fix + " (in the Config tab)")
    return None


class CompareTab:
    def __init__(self, service: Any, gate: RunGate):
        self.service = service
        self.gate = gate
        self.view = ResultView("cmp", localisations=self._localisations, images=self._image)
        self.sides = SidesPanel()
        self.wview = WorkloadView("cmp", service, gate, self.view)
        self.which = WhichSettingView("cmp", service, gate)

    # -- layout --------------------------------------------------------------------------------

    def create_ui(self) -> None:
        with gr.Tab("Compare", id="compare"):
            with gr.Row(equal_height=False):
                with gr.Column(scale=3):
                    self._render_prompt()
                with gr.Column(scale=2):
                    self._render_model()
            self.sides.create_ui()
            self._render_run()
            self.wview.create_ui()
            self.view.create_ui()
            self.which.create_ui()

    def _render_model(self) -> None:
        self.model = gr.Dropdown(
            choices=model_choices(),
            value=DEMO_NAME,
            allow_custom_value=True,
            label="Model",
            elem_id="model-pick",
            info="the bundled demo, a model in your Hugging Face cache, a local folder "
            "path, or any Hugging Face id (org/name)",
        )
        self.trust = gr.Checkbox(
            value=False, label="trust_remote_code (runs the model's own Python code)", elem_id="trust-remote-code"
        )
        self.model_info = gr.HTML(elem_id="model-info")

    def _render_prompt(self) -> None:
        self.prompt = gr.Textbox(
            value=DEFAULT_PROMPT,
            label="Prompt",
            lines=4,
            max_lines=14,
            elem_id="prompt",
            placeholder="Type or paste a prompt; long ones are fine",
        )
        with gr.Row(equal_height=False):
            self.prompt_file = gr.UploadButton(
                "Upload prompts (.txt: one; .jsonl, .parquet: a workload)",
                file_types=list(UPLOAD_TYPES),
                type="filepath",
                size="sm",
                elem_id="prompt-file",
                scale=2,
            )
            self.clear_file_btn = gr.Button("Use the text box", size="sm", scale=1, visible=False, elem_id="clear-file")
            self.prompt_info = gr.HTML(elem_id="prompt-count", container=False)
        self._render_workload_options()
        self.images = gr.File(
            label=f"Images for the prompt (vision-language models; at most {MAX_IMAGES_PER_PROMPT}, "
            f"{MAX_IMAGE_BYTES // 2**20} MiB each)",
            file_count="multiple",
            file_types=list(IMAGE_TYPES),
            type="filepath",
            elem_id="prompt-images",
            height=170,  # the floating label clears the upload icon (at 120 it sat over it, clipped)
        )
        self.image_info = gr.HTML(elem_id="image-info", container=False)
        self.file_prompts = gr.State(None)
        self.refused_file = gr.State(None)  # (message, fix) of the last upload refused; Run refuses while set
        self.config_line = gr.HTML(config_summary_html(config_from_text(default_yaml())), elem_id="config-line")

    def _render_workload_options(self) -> None:
        """How a workload file's prompts are chosen and run; kept in `self.workload` (a gr.State)."""
        with gr.Accordion(
            "Workload options (a .jsonl or .parquet file of several prompts)", open=False, elem_id="wl-options"
        ):
            with gr.Row():
                self.wl_mode = gr.Dropdown(MODE_CHOICES, value="free", label="Mode", elem_id="wl-mode")
                self.wl_floor = gr.Dropdown(
                    FLOOR_CHOICES,
                    value="auto",
                    label="Noise floor (the reference against itself under a change that must not matter)",
                    elem_id="wl-floor",
                )
            with gr.Row():
                self.wl_field = gr.Textbox(
                    label="Prompt field",
                    placeholder="auto: prompt, messages, text, question, input",
                    elem_id="wl-field",
                )
                self.wl_limit = gr.Number(0, precision=0, label="Only the first N prompts (0: all)", elem_id="wl-limit")
                self.wl_sample = gr.Number(
                    0, precision=0, label="A random N prompts, seed 0 (0: all)", elem_id="wl-sample"
                )
                self.wl_skip = gr.Checkbox(
                    False, label="Skip broken lines or rows (counted and named)", elem_id="wl-skip"
                )
            with gr.Row():
                self.wl_cluster = gr.Textbox(
                    label="Ray cluster (empty: in this process)",
                    elem_id="wl-cluster",
                    placeholder="local, or a head node's address (HOST:6379)",
                )
                self.wl_replicas = gr.Textbox(
                    label="Replicas of each side there", elem_id="wl-replicas", placeholder="2, or per side: ref=1,b=4"
                )
        self.workload = gr.State(WorkloadPick())

    def _render_run(self) -> None:
        with gr.Row():
            self.run_btn = gr.Button("Run every side", variant="primary", elem_id="run-btn", scale=3)
            # Not red while nothing runs (issue 46 item 15): Stop is a plain button; what it stops is said.
            self.stop_btn = gr.Button("Stop", variant="secondary", elem_id="stop-btn", scale=1)
        self.stop_note = gr.HTML(elem_id="stop-note")
        self.progress = gr.HTML(elem_id="progress")
        self.run_id = gr.State(None)

    # -- handlers ------------------------------------------------------------------------------

    def describe(self, model: str, trust: bool) -> str:
        try:
            info = self.service.describe(model or DEMO_NAME, bool(trust))
        except ParityError as e:
            return cards.error_html(e.message, e.fix, "Model not usable")
        return cards.model_html(info, DEMO_LABEL if (model or DEMO_NAME) == DEMO_NAME else model)

    def count_tokens(
        self,
        model: str,
        trust: bool,
        prompt: str,
        file_prompts: list[dict] | None,
        cfg_text: str,
        workload: WorkloadPick | None = None,
    ) -> str:
        """Token count of each prompt as the engines will see it, checked against the context; for a
        workload file, what it holds and how it runs (its prompts are checked when it runs)."""
        if workload is not None and workload.active:
            return note_html(workload)
        try:
            cfg = config_from_text(cfg_text)
            specs = _specs(prompt, file_prompts)
            info = self.service.describe(model or DEMO_NAME, bool(trust))
            tok = tokenizer_for(info.path, bool(trust))
            counts = [
                tok.count(s, cfg.chat) if not s.images else _image_prompt_tokens(info, bool(trust), cfg, s)
                for s in specs
            ]
        except ConfigError:
            return ""  # the config line under the prompt already names the problem
        except ModelError:
            return ""  # the model card beside the prompt names it (not a problem of the prompt)
        except ParityError as e:
            return cards.error_html(e.message, e.fix, "Prompt not usable")
        source = "Uploaded file: " if file_prompts else ""
        return self._count_html(counts, max_context(cfg, info), cfg, source)

    def count_file(self, model: str, trust: bool, file_prompts: list[dict] | None, cfg_text: str) -> Any:
        """After an upload: the count, unless the upload was refused (keep its message)."""
        if not file_prompts:
            return gr.skip()
        return self.count_tokens(model, trust, "", file_prompts, cfg_text)

    @staticmethod
    def _count_html(counts: list[int], limit: int | None, cfg: ParityConfig, source: str = "") -> str:
        from ..core.context import check_context  # the check prepare refuses with, shown here as a card

        check = check_context(counts, cfg.max_new_tokens, limit, cfg.max_model_len)
        what = source + (
            f"{counts[0]:,} prompt tokens"
            if len(counts) == 1
            else f"{len(counts)} prompts, {sum(counts):,} tokens (longest {check.longest:,})"
        )
        if check.over is not None:
            return cards.error_html(f"{what}: {check.message}.", check.fix, "Prompt too long")
        ctx = f" · context {limit:,}" if limit else ""
        if check.vllm_context != limit:
            ctx += f" (a vLLM side gets {check.vllm_context:,})"
        return f'<div class="pc-count">{what} + {cfg.max_new_tokens} new{ctx}</div>'

    def _file_values(self, prompts: list[dict] | None, note: str) -> dict[Any, Any]:
        return {
            self.file_prompts: prompts,
            self.clear_file_btn: gr.Button(visible=prompts is not None),
            self.prompt_info: note,
            self.refused_file: None,
        }

    def upload(self, path: str | None, workload: WorkloadPick | None = None) -> dict[Any, Any]:
        """A file given: .txt/.md one prompt; .jsonl/.parquet a workload, read and described (or
        refused, with the problem and the fix) before anything runs."""
        pick = _pick(workload)
        if not path:
            return {**self._file_values(None, ""), self.workload: cleared(pick)}
        name = os.path.basename(path)
        if is_workload_file(name):
            pick = uploaded(pick, path)
            return {
                self.file_prompts: None,
                self.clear_file_btn: gr.Button(visible=True),
                self.prompt_info: note_html(pick),
                self.workload: pick,
                self.refused_file: None,
            }
        try:
            check_upload_size(name, os.path.getsize(path))  # refuse before reading it into memory
            with open(path, "rb") as fh:
                specs = parse_prompt_bytes(fh.read(), name)
        except ParityError as e:
            return {
                **self._file_values(None, cards.error_html(e.message, e.fix, "Prompt file refused")),
                self.workload: cleared(pick),
                self.refused_file: (e.message, e.fix),
                self.clear_file_btn: gr.Button(visible=True),
            }
        data = [{"text": s.text, "messages": s.messages, "images": s.images} for s in specs]
        return {
            **self._file_values(
                data, cards.notice_html(f"{len(specs)} prompt(s) from {name} run instead of the text box.")
            ),
            self.workload: cleared(pick),
        }

    def workload_options(
        self,
        workload: WorkloadPick | None,
        mode: str,
        floor: str,
        field: str | None,
        limit: Any,
        sample: Any,
        skip_bad: bool,
        cluster: str = "",
        replicas: str = "",
    ) -> dict[Any, Any]:
        """An option of the workload changed: kept, and the file read again when it picks other prompts."""
        pick = with_options(_pick(workload), mode, floor, field, limit, sample, skip_bad, cluster or "", replicas or "")
        shown = (
            note_html(pick)
            if pick.active
            else cards.error_html(pick.error, pick.fix, "Workload option refused")
            if pick.error
            else gr.skip()
        )
        return {self.workload: pick, self.prompt_info: shown}

    def check_images(self, files: Any) -> str:
        """As soon as images are uploaded: each one checked, its size shown, or why it is refused."""
        if not files:
            return ""
        try:
            images = read_images(files)
        except ParityError as e:
            return cards.error_html(e.message, e.fix, "Image refused")
        return cards.notice_html(
            "; ".join(f"{i.name}: {i.width} x {i.height} {i.format}" for i in images)
            + " (the model's processor resizes them; see the findings after the run)"
        )

    def clear_file(self, workload: WorkloadPick | None = None) -> dict[Any, Any]:
        pick = _pick(workload)
        return {**self._file_values(None, ""), self.workload: cleared(pick)}

    def run(
        self,
        model: str,
        trust: bool,
        prompt: str,
        file_prompts: list[dict] | None,
        cfg_text: str,
        images: Any = None,
        workload: WorkloadPick | None = None,
        refused_file: Any = None,
        request: gr.Request | None = None,
    ) -> Iterator[dict[Any, Any]]:
        """Run every side; yields the progress card, the view and the run id as tokens arrive
        (each yield sets only what changed). With a workload file: the workload, its progress with
        the prompts done and the time left. Refused with a card, nothing stored, while the page
        shows input that cannot run (run_refusal)."""
        try:
            yield from self._run(model, trust, prompt, file_prompts, cfg_text, images, workload, refused_file, request)
        finally:  # the click is over (click_note): the next one runs
            self.release_click(request)

    def _run(
        self,
        model: str,
        trust: bool,
        prompt: str,
        file_prompts: list[dict] | None,
        cfg_text: str,
        images: Any,
        workload: WorkloadPick | None,
        refused_file: Any,
        request: gr.Request | None,
    ) -> Iterator[dict[Any, Any]]:
        refusal = run_refusal(cfg_text, refused_file, workload)
        if refusal is not None:
            title, message, fix = refusal  # shown where a run's result shows, as any refusal (below)
            yield {
                self.progress: "",
                **self.view.cleared(cards.error_html(f"{title}: {message}", fix, REFUSED)),
                self.run_id: None,
            }
            return
        model = model or DEMO_NAME
        given = _pick(workload)
        pick = given if given.active else None
        try:
            if pick is not None:
                req: Request = self._workload_request(pick, model, bool(trust), cfg_text, images)
            else:
                req = plan_request(
                    model,
                    config_from_text(cfg_text),
                    _specs(prompt, file_prompts, images),
                    trust_remote_code=bool(trust),
                )
        except ParityError as e:
            # Refused before anything runs (a config, prompt or file the page already says is wrong):
            # shown, not stored; History keeps the runs that ran (#33 item 12).
            yield {
                self.progress: "",
                **self.view.cleared(cards.error_html(e.message, e.fix, REFUSED)),
                self.run_id: None,
            }
            return
        cfg = req.config
        session = session_of(request)
        if isinstance(req, RunRequest):
            live: Any = LiveRun([side.name for side in cfg.sides], len(req.prompts), cfg.max_new_tokens)
        elif isinstance(req, ReplayRequest):
            live = WorkloadLive(pick.prompts if pick is not None else 0, pick.description if pick is not None else "")
        else:
            live = WorkloadLive(len(req.prompts), req.options.source.get("description", ""))
        active, events = self.gate.launch(session, _what(req), live, lambda emit: self.service.run(req, emit))
        try:
            yield from self._stream(active, events)
        finally:  # the run goes on if this tab went away: every tab's bar then shows it (active_run)
            self.gate.unfollow(active)

    def _workload_request(self, pick: WorkloadPick, model: str, trust: bool, cfg_text: str, images: Any) -> Request:
        """The picked file read again (as it runs), as the service's plan_request makes it: a workload, or
        one comparison for a .jsonl file of one prompt (the CLI's rule). Raises ParityError naming the
        problem and the fix."""
        if pick.error:
            raise PromptError(pick.error, pick.fix)
        if _paths(images):
            raise PromptError(
                "images were uploaded next to the prompt, and a workload file is in use",
                "name the images in the .jsonl file, or press 'Use the text box'",
            )
        if pick.rollout is not None:  # a rollout dump: a replay (parity_ui.ui.replay_input)
            assert pick.path is not None  # an active pick has its file: _run passes only those
            return replay_request(
                pick.path,
                pick.rollout,
                model,
                config_from_text(cfg_text),
                trust=trust,
                skip_bad=pick.skip_bad,
                limit=pick.limit,
                floor=pick.floor,
                name=pick.name,
            )
        return plan_request(
            model,
            config_from_text(cfg_text),
            [],
            source=load(pick),
            options=pick.options(),
            trust_remote_code=trust,
            source_name=pick.name,
        )

    def _finished(self, run: Run) -> dict[Any, Any]:
        if run.workload is not None:  # its view follows (workload_view), a prompt's tokens on a click there
            note = "Pick a prompt in the workload's table above to see its tokens here."
            return {self.progress: "", **self.view.values(None, message=note), self.run_id: run.id}
        return {self.progress: "", **self.view.values(run, reveal=True), self.run_id: run.id}

    def _stream(self, active: Any, events: queue.Queue) -> Iterator[dict[Any, Any]]:
        """The live view (a LiveRun, or a WorkloadLive: progress only) until the run is done. The worker
        thread feeds it (RunGate.launch); this draws it."""
        yield {**self.view.cleared(), self.progress: self.gate.draw(active, lambda live: live.progress())}
        for item in follow(events, lambda ev: None, THROTTLE_S):
            if isinstance(item, Run):
                yield self._finished(item)
                return
            if isinstance(item, ParityError):  # refused before anything ran: shown, not stored
                yield {
                    self.progress: "",
                    **self.view.cleared(cards.error_html(item.message, item.fix, REFUSED)),
                    self.run_id: None,
                }
                return
            if isinstance(item, BaseException):
                yield {
                    self.progress: "",
                    **self.view.error_values(
                        f"internal error: {type(item).__name__}: {item}", "the app keeps serving; please report this"
                    ),
                    self.run_id: None,
                }
                return
            yield self.gate.draw(
                active,
                lambda live: {
                    self.progress: live.progress(),
                    **({self.view.panes: live.panes()} if live.streams_tokens else {}),
                },
            )

    def click_note(self, request: gr.Request | None = None) -> str:
        """Run pressed: nothing to say, unless this tab's run is still queued or running (the click
        starts nothing: gradio lets one run per event at a time) or another run holds the engines
        (this one waits for it: which one, and Stop ends it)."""
        session = session_of(request)
        if not self.gate.claim(session):
            return cards.notice_html(
                "A run of this tab is still under way, so this click started nothing. "
                "Wait for it to end, or press Stop, then press Run again."
            )
        head = self.gate.head()
        if head is not None and head.session != session:
            return cards.notice_html(waiting_text(head, session) + ": this run starts when that one ends.")
        return ""

    def stale_refusal(
        self,
        summary: str | None,
        model: str,
        trust: bool,
        prompt: str,
        file_prompts: list[dict] | None,
        cfg_text: str,
        refused_file: Any = None,
        workload: WorkloadPick | None = None,
    ) -> Any:
        """After an input changed (the config checked, reset or loaded, a model picked, a file given or
        cleared): a "Not run" card whose problem is gone goes (issue 46 item 6: it stayed, even after
        Reset to defaults). It stays while the page would refuse the run again."""
        if REFUSED not in (summary or ""):
            return gr.skip()
        pick = _pick(workload)
        if run_refusal(cfg_text, refused_file, pick) is not None:
            return gr.skip()
        try:
            self.service.describe(model or DEMO_NAME, bool(trust))
            if not pick.active:
                _specs(prompt, file_prompts)
        except ParityError:
            return gr.skip()
        return {self.view.summary: ""}

    def clear_stale(self, event: Any) -> None:
        """Chain `stale_refusal` after `event`."""
        event.then(
            self.stale_refusal,
            [self.view.summary, *self.count_inputs[:5], self.refused_file, self.workload],
            [self.view.summary],
            api_name=False,
            show_progress="hidden",
        )

    def release_click(self, request: gr.Request | None = None) -> None:
        self.gate.release(session_of(request))

    def stop(self, request: gr.Request) -> str:
        return cards.notice_html(self.gate.stop(session_of(request)))

    # -- events --------------------------------------------------------------------------------

    def create_event_handlers(self, cfg_yaml: Any) -> None:
        """The prompt is counted when the box is left (or on Shift+Enter), not on every key: each
        count is a server round trip (the tokenizer, the image processor), and per keystroke they
        queued up on a busy machine. A new config recounts it through `recount`."""
        ctx = [self.model, self.trust]
        self.count_inputs = [*ctx, self.prompt, self.file_prompts, cfg_yaml, self.workload]
        described = self.model.change(self.describe, ctx, self.model_info, api_name="describe_model")
        self.recount(described)
        self.clear_stale(described)
        self.trust.change(self.describe, ctx, self.model_info, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        gr.on(
            [self.prompt.blur, self.prompt.submit],
            self.count_tokens,
            self.count_inputs,
            self.prompt_info,
            api_name="count_tokens",
            trigger_mode="always_last",
            show_progress="hidden",
            concurrency_limit=1,
            concurrency_id="count",
        )
        file_outputs = [self.file_prompts, self.clear_file_btn, self.prompt_info, self.workload, self.refused_file]
        uploaded_file = self.prompt_file.upload(
            self.upload, [self.prompt_file, self.workload], file_outputs, api_name="upload_prompts"
        )
        self.clear_stale(uploaded_file)
        uploaded_file.then(
            self.count_file,
            [*ctx, self.file_prompts, cfg_yaml],
            self.prompt_info,
            api_name=False,
            show_progress="hidden",
        )
        cleared_file = self.clear_file_btn.click(self.clear_file, [self.workload], file_outputs, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        self.recount(cleared_file)
        self.clear_stale(cleared_file)
        # Workload options: a pick at once, a typed one when it is left (or on Enter).
        options = [
            self.workload,
            self.wl_mode,
            self.wl_floor,
            self.wl_field,
            self.wl_limit,
            self.wl_sample,
            self.wl_skip,
            self.wl_cluster,
            self.wl_replicas,
        ]
        gr.on(
            [
                self.wl_mode.input,
                self.wl_floor.input,
                self.wl_skip.input,
                self.wl_field.blur,
                self.wl_field.submit,
                self.wl_limit.blur,
                self.wl_limit.submit,
                self.wl_sample.blur,
                self.wl_sample.submit,
                self.wl_cluster.blur,
                self.wl_cluster.submit,
                self.wl_replicas.blur,
                self.wl_replicas.submit,
            ],
            self.workload_options,
            options,
            [self.workload, self.prompt_info],
            api_name=False,
            show_progress="hidden",
            trigger_mode="always_last",
            concurrency_limit=1,
            concurrency_id="wl-options",
        )
        self.images.change(self.check_images, [self.images], self.image_info, api_name=False, show_progress="hidden")  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        # Edits of the Sides panel the YAML has not had yet go in first (Run pressed straight from
        # a slot); then one run at a time on the engines, every other click waiting in gradio's queue.
        self.commit_sides = self.run_btn.click(
            self.sides.commit,
            [cfg_yaml, *self.sides.state],
            [cfg_yaml, self.sides.error, self.sides.drawn],
            api_name=False,  # type: ignore[arg-type]  # gradio: False keeps it out of the API
            queue=False,
            show_progress="hidden",
        )
        ran = self.commit_sides.success(
            self.run,
            [*ctx, self.prompt, self.file_prompts, cfg_yaml, self.images, self.workload, self.refused_file],
            [self.progress, *self.view.outputs, self.run_id],
            api_name="run",
            concurrency_limit=1,
            concurrency_id="engines",
            show_progress="minimal",
        )
        # A workload's view once it is stored (hidden for any other run): the run's own outputs stay
        # those of every run, as API clients know them.
        ran.then(self.wview.revealed, [self.run_id], self.wview.outputs, api_name=False, show_progress="hidden")
        # Which setting? under a stored run whose sides differ (hidden for any other).
        ran.then(self.which.show, [self.run_id], self.which.outputs, api_name=False, show_progress="hidden")
        self.stop_btn.click(self.stop, None, self.stop_note, api_name="stop", queue=False)
        self.run_btn.click(self.click_note, None, self.stop_note, api_name=False, queue=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        # Sides that cannot run raise in commit (a toast): the run never starts, so the click is over.
        self.commit_sides.failure(self.release_click, None, None, api_name=False, queue=False)
        self.run_btn.click(self.wview.hidden, None, self.wview.outputs, api_name=False, queue=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        self.run_btn.click(self.which.hidden, None, self.which.outputs, api_name=False, queue=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        picks = [self.run_id, self.view.prompt_pick, self.view.side_pick]
        self.view.prompt_pick.input(self.switch_view, picks, self.view.outputs, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        self.view.side_pick.input(self.switch_view, picks, self.view.outputs, api_name=False)  # type: ignore[arg-type]  # gradio: False keeps it out of the API
        self.view.wire_layers(self.service, picks)
        self.wview.create_event_handlers()
        self.which.create_event_handlers()

    def recount(self, event: Any) -> None:
        """Count the prompt again once `event` is done (a new model, a new config): the last one
        asked wins, and counts run one after the other so an older one never lands last."""
        event.then(
            self.count_tokens,
            self.count_inputs,
            self.prompt_info,
            api_name=False,
            trigger_mode="always_last",
            show_progress="hidden",
            concurrency_limit=1,
            concurrency_id="count",
        )

    def _image(self, sha256: str) -> Any:
        return self.service.reader.image_bytes(sha256)

    def _localisations(self, run_id: str) -> list[Any]:
        return self.service.reader.localisations_of(run_id)

    def switch_view(self, run_id: str | None, index: int | None, side: str | None) -> dict[Any, Any]:
        """Another prompt of the batch, or another side against the reference (a workload's prompt
        is read alone)."""
        run = read_for_view(self.service.reader, run_id, int(index or 0)) if run_id else None
        return self.view.values(run, int(index or 0), side)

    def initial(self, model: str, trust: bool, prompt: str, cfg_text: str) -> dict[Any, Any]:
        return {
            self.model_info: self.describe(model, trust),
            self.prompt_info: self.count_tokens(model, trust, prompt, None, cfg_text),
        }
