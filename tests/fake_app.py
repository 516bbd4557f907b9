"""The app with the tests' fake engine kinds registered: browser tests of the app's own logic above the
engines (python tests/fake_app.py, as app.py). Never shipped to users."""
from __future__ import annotations

import sys
from pathlib import Path

# This checkout's parity_ui first (a script's own folder leads sys.path, not the working directory),
# then the fake kinds beside this file.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from fake_engine import registered, registered_other  # noqa: E402
from parity_ui.ui import main  # noqa: E402

if __name__ == "__main__":
    with registered(), registered_other():
        main()
