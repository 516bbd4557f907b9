"""scripts/uv_sources.py: the setup installs with uv, which does not read pip's configuration; the
arguments it is handed must name the same indexes, local wheels, constraints and CA as pip would use,
with pip's precedence (variables over files, the virtualenv's file over the user's over the global one)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("uv_sources", ROOT / "scripts" / "uv_sources.py")
uv_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_sources)


def test_pips_own_listing_of_a_config_file_and_variables_becomes_uv_arguments(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\n"
        "extra-index-url = file:///opt/a/simple file:///opt/b/simple\n"
        "find-links = /opt/from-file\n"
        "constraint = /etc/constraints.txt\n"
        "timeout = 60\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(conf), PIP_FIND_LINKS="/opt/from-env", PIP_CERT="/etc/ca.pem")
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True, env=env
    ).stdout
    args = uv_sources.uv_arguments(uv_sources.parse_config_list(listing))
    pairs = list(zip(args[::2], args[1::2]))
    # The machine's site-wide pip.conf is read too; what this file and these variables set must win.
    assert [p for p in pairs if p[0] == "--extra-index-url"] == [
        ("--extra-index-url", "file:///opt/a/simple"), ("--extra-index-url", "file:///opt/b/simple")]
    assert [p for p in pairs if p[0] == "--find-links"] == [("--find-links", "/opt/from-env")]
    assert [p for p in pairs if p[0] == "--constraint"] == [("--constraint", "/etc/constraints.txt")]
    assert [p for p in pairs if p[0] == "--cert"] == [("--cert", "/etc/ca.pem")]
    assert "60" not in args  # not a source: uv is not told pip's timeout


def test_precedence_is_pips_not_the_listings_alphabetical_order():
    listing = (
        ":env:.find-links='/from-variable'\n"
        "global.constraint='/global.txt'\n"
        "global.find-links='/global'\n"
        "site.constraint='/venv.txt'\n"
        "user.constraint='/user.txt'\n"
        "user.extra-index-url='file:///user'\n"
    )
    assert uv_sources.uv_arguments(uv_sources.parse_config_list(listing)) == [
        "--extra-index-url", "file:///user",
        "--find-links", "/from-variable",
        "--constraint", "/venv.txt",
    ]


def test_no_configuration_means_no_source_arguments_and_no_index_is_kept():
    assert uv_sources.uv_arguments(uv_sources.parse_config_list("")) == []
    assert uv_sources.uv_arguments({"no-index": "true", "index-url": "file:///mirror"}) == [
        "--index-url", "file:///mirror", "--no-index",
    ]
