"""`python3 -m parity_ui.cli ...` with the progress lines kept under --json (issue 33 GPU check).

The CLI drops its stderr progress when --json is given; this wrapper keeps both: the JSON on stdout and
the progress lines on stderr, so one bisect gives its own --json output and its trial-by-trial log.
It runs the CLI's main() as a fresh process does (argv from sys.argv) and passes its exit status on.
"""
import sys

from parity_ui import cli

cli._emit = lambda args: cli._progress  # progress lines even with --json
sys.argv = ["parity"] + sys.argv[1:]
raise SystemExit(cli.main())
