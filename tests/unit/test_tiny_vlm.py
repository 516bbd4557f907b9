"""The tiny vision-language test models (tests/tiny_vlm.py) build offline, and name the video processor
that fits the environment: the real one with torchvision, the stand-in without."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

BUILD_OFFLINE = """
import socket, sys
sys.path.insert(0, {tests!r})
import no_network
no_network.install("raise")
try:
    socket.getaddrinfo("huggingface.co", 443)
except OSError as e:
    print("GUARD-REFUSED", e)
from tiny_vlm import build_vlm, needs_remote_code
from transformers import AutoProcessor, AutoTokenizer
folder = build_vlm({folder!r}, arch="qwen2_vl")
# The loads the tool itself makes (parity_ui.inputs.prompts), without local_files_only:
AutoProcessor.from_pretrained(folder, trust_remote_code=needs_remote_code(folder))
AutoTokenizer.from_pretrained(folder)
print("BUILT-OFFLINE")
"""


def test_the_tiny_vlm_builds_and_loads_with_the_network_refused(tmp_path):
    """No step of building or loading the model may look anything up: with every socket to another
    machine refused (and HF_HUB_OFFLINE unset, so nothing is skipped for us), it still builds."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    code = BUILD_OFFLINE.format(tests=str(TESTS), folder=str(tmp_path / "vlm"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "GUARD-REFUSED" in proc.stdout, proc.stdout + proc.stderr[-3000:]  # the guard works
    assert proc.returncode == 0 and "BUILT-OFFLINE" in proc.stdout, proc.stderr[-3000:]


def test_the_video_processor_is_the_real_one_with_torchvision_and_the_stand_in_without(tmp_path):
    from tiny_vlm import VIDEO_STUB_MODULE, needs_remote_code, torchvision_available, write_video_processor

    folder = tmp_path / "m"
    folder.mkdir()
    write_video_processor(folder, "qwen2_vl", 14, [0.5] * 3, [0.5] * 3, stand_in=True)
    cfg = json.loads((folder / "video_preprocessor_config.json").read_text())
    assert cfg["auto_map"]["AutoVideoProcessor"] == f"{VIDEO_STUB_MODULE}.NoVideoProcessor"
    assert needs_remote_code(folder)
    write_video_processor(folder, "qwen3_vl", 16, [0.5] * 3, [0.5] * 3, stand_in=False)
    cfg = json.loads((folder / "video_preprocessor_config.json").read_text())
    assert cfg["video_processor_type"] == "Qwen3VLVideoProcessor" and "auto_map" not in cfg
    assert cfg["patch_size"] == 16 and not needs_remote_code(folder)  # the stand-in's module is gone
    write_video_processor(folder, "qwen2_vl", 14, [0.5] * 3, [0.5] * 3)  # decided by this environment
    assert needs_remote_code(folder) is (not torchvision_available())


def test_the_network_guard_lets_this_machine_through():
    """vLLM and the workers talk over loopback and Unix sockets: the guard must not refuse those."""
    code = (f"import socket, sys; sys.path.insert(0, {str(TESTS)!r}); import no_network; no_network.install('raise');"
            "socket.getaddrinfo('localhost', 80); s = socket.socket(); s.settimeout(1)\n"
            "try:\n    s.connect(('127.0.0.1', 9))\nexcept ConnectionRefusedError:\n    pass\n"
            "try:\n    socket.getaddrinfo(socket.gethostname(), 80)\n"
            "except socket.gaierror:\n    pass  # a machine whose own name does not resolve: not the guard\n"
            "print('LOCAL-OK')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "LOCAL-OK" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("bad", ["ftp", ""])
def test_the_network_guard_refuses_an_unknown_mode(bad):
    import no_network

    with pytest.raises(ValueError, match="'raise' or 'log'"):
        no_network.install(bad)
