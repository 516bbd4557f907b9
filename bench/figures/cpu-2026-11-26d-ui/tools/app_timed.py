"""The app with timers around the History handlers and gradio's process_api (stderr lines 'T ...')."""
import sys, time, functools, os
sys.path.insert(0, os.getcwd())
from parity_ui.ui import history_tab, workload_view, which_setting_view, result_view
import gradio.blocks as gb

def timed(cls, name):
    f = getattr(cls, name)
    @functools.wraps(f)
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            print(f"T {time.time():.3f} {cls.__name__}.{name} {1000*(time.perf_counter()-t0):.1f} ms", file=sys.stderr, flush=True)
    setattr(cls, name, w)

for cls, names in ((history_tab.HistoryTab, ["open", "figures", "refresh", "prefetch"]),
                   (workload_view.WorkloadView, ["show", "parts", "open_prompt", "prompt_figures", "prompt_run"]),
                   (which_setting_view.WhichSettingView, ["show"]),
                   (result_view.ResultView, ["values", "plot_values"])):
    for n in names:
        timed(cls, n)

orig = gb.Blocks.process_api
async def process_api(self, block_fn, *a, **k):
    t0 = time.perf_counter(); s = time.time()
    try:
        return await orig(self, block_fn, *a, **k)
    finally:
        fn = getattr(block_fn, "name", None) or getattr(getattr(block_fn, "fn", None), "__name__", "?")
        print(f"T {s:.3f} process_api {fn} {1000*(time.perf_counter()-t0):.1f} ms", file=sys.stderr, flush=True)
gb.Blocks.process_api = process_api

from parity_ui.ui import main
main()
