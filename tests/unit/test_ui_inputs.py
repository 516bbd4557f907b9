"""#33 items 8 and 13 without a browser: the order of the Sides panel's writes, a readable YAML
error, the upload size card, and Run's refusal while the page shows input that cannot run."""
from __future__ import annotations

import pytest

from parity_ui.core.config import parse_config_text
from parity_ui.core.errors import ConfigError, PromptError
from parity_ui.inputs.prompts import MAX_PROMPT_FILE_BYTES, check_upload_size
from parity_ui.ui.compare_tab import run_refusal
from parity_ui.ui.config_tab import default_yaml
from parity_ui.ui.edits import WriteOrder
from parity_ui.ui.workload_input import WorkloadPick


def test_a_write_older_than_one_done_is_dropped_per_session():
    order = WriteOrder()
    assert order.newer("s1", 5)  # the rename's write
    assert order.newer("s1", 19)  # the option's write lands first
    assert not order.newer("s1", 5)  # the rename's, late: it would take the option back out
    assert order.newer("s2", 1)  # another page is its own
    assert order.newer("s1", 19)  # the same count again (a kind picked twice) is not older


def test_garbage_yaml_names_line_column_and_the_offending_line():
    with pytest.raises(ConfigError) as e:
        parse_config_text("max_new_tokens: 64\ntemperature: : 0\n", "YAML")
    msg = e.value.message
    assert "line 2, column" in msg and "`temperature: : 0`" in msg and "\n" not in msg
    assert "mapping values are not allowed here" in msg
    assert "line 2" in e.value.fix
    with pytest.raises(ConfigError) as e:
        parse_config_text("sides: [a, b\nseed: 1\n", "YAML")
    assert "line 2" in e.value.message and "\n" not in e.value.message


def test_an_upload_over_the_limit_names_its_size_the_limit_and_the_cli():
    check_upload_size("ok.jsonl", MAX_PROMPT_FILE_BYTES)
    with pytest.raises(PromptError) as e:
        check_upload_size("big.jsonl", 60 * 10**6, "workload file")
    assert "57.2 MiB" in e.value.message and "50 MiB" in e.value.message and "Mb" not in e.value.message
    assert "parity compare" in e.value.fix and "--prompt-file" in e.value.fix


def test_run_refuses_while_the_page_shows_bad_input_and_goes_once_fixed():
    good = default_yaml()
    assert run_refusal(good, None, None) is None
    assert run_refusal(good, None, WorkloadPick()) is None
    title, message, fix = run_refusal("a: : b", None, None)
    assert title == "Invalid config" and "line 1" in message and "Config tab" in fix
    assert run_refusal(good, ("prompt file 'x.txt' is 60.0 MiB", "use the CLI"), None)[0] == "Prompt file refused"
    bad_pick = WorkloadPick(path="/tmp/w.jsonl", name="w.jsonl", error="w.jsonl line 3: not JSON", fix="fix it")
    assert run_refusal(good, None, bad_pick) == ("Workload file refused", "w.jsonl line 3: not JSON", "fix it")
