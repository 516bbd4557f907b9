"""The server kinds (`openai`, `vllm-server`) above the network: argument mapping, the server's
command line, what its log says, and the `openai` client against a misbehaving server (every fault
a clear message with a fix). The real `vllm serve` runs in test_server_engines.py."""
from __future__ import annotations

import socket

import pytest

from misbehaving_server import MODEL, FakeServer
from parity_ui.core.config import build_config
from parity_ui.engines.base import EngineFault, GenerateRequest, InputCheck, LoadRequest, ScoreRequest
from parity_ui.engines.openai_engine import OpenAIEngine, config_from_server_info, step_from_choice
from parity_ui.engines.server_engine import engine_config_from_log, server_argv, why_not_started
from parity_ui.core.errors import ConfigError, SideError
from parity_ui.core.mapping import map_side, resolve
from parity_ui.core.types import ModelInfo


def _tok(text: str) -> list[int]:
    return [ord(c) % 500 for c in text]


@pytest.fixture
def server():
    s = FakeServer(_tok)
    yield s
    s.shutdown()
    s.server_close()


def _load(url: str, **conn) -> LoadRequest:
    return LoadRequest("openai", MODEL, {"connection": {"url": url, "served_model": None, "api_key_env": None,
                                                        "timeout_s": 3.0, "verify_tls": True,
                                                        "check_tokenizer": True, **conn}})


def _sampling(max_tokens: int = 6) -> dict:
    return {"max_tokens": max_tokens, "temperature": 0.0, "logprobs": 2, "return_tokens_as_token_ids": True}


def _generate(engine: OpenAIEngine, steps: list | None = None, max_tokens: int = 6):
    seen = steps if steps is not None else []
    return engine.generate(GenerateRequest(prompts=[[1, 2, 3]], sampling=_sampling(max_tokens), logprobs=2),
                           lambda i, s: seen.append(s), lambda: False)


# -- mapping -------------------------------------------------------------------------------------

def _model(tmp_path) -> ModelInfo:
    return ModelInfo(name="tiny", path=str(tmp_path), architecture="LlamaForCausalLM", model_type="llama", config_dtype="float32",
                     vocab_size=100, eos_token_ids=[2])


def test_openai_side_sends_every_sampling_field_explicitly(tmp_path):
    cfg = build_config(None, [], sides=["ref=hf", "srv=openai,url=http://127.0.0.1:8000/v1"])
    args = map_side(cfg, cfg.side("srv"), resolve(_model(tmp_path), [2], False))
    body = args.sampling
    # A server fills any omitted field from generation_config.json: nothing may be left out.
    for field in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty", "max_tokens", "seed", "stop_token_ids", "ignore_eos", "min_tokens"):
        assert field in body, field
    assert body["return_tokens_as_token_ids"] is True and body["skip_special_tokens"] is False
    assert body["stop_token_ids"] == [2] and body["temperature"] == cfg.temperature
    assert args.connection["url"] == "http://127.0.0.1:8000/v1"


def test_openai_side_without_url_is_refused_when_the_config_is_read():
    with pytest.raises(SideError, match="side 'srv': option 'url'") as e:
        build_config(None, [], sides=["ref=hf", "srv=openai"])
    assert "srv.url" in e.value.fix and "http://127.0.0.1:8000/v1" in e.value.fix


def test_openai_side_rejects_a_url_that_is_not_http():
    with pytest.raises(ConfigError, match="url"):
        build_config(None, [], sides=["ref=hf", "srv=openai,url=ftp://host/v1"])


def test_server_options_do_not_accept_engine_options_of_a_remote_server():
    with pytest.raises(SideError, match="'enforce_eager' is not an option of kind openai"):
        build_config(None, [], sides=["ref=hf", "srv=openai,url=http://h:1/v1,enforce_eager=true"])


def test_vllm_server_side_maps_to_flags_of_vllm_serve(tmp_path):
    cfg = build_config(None, ["dtype=float32"], sides=["ref=hf", "srv=vllm-server,enable_prefix_caching=true,port=9123"])
    args = map_side(cfg, cfg.side("srv"), resolve(_model(tmp_path), [2], False))
    argv = server_argv("/py", args.llm, 9123)
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "9123" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--enable-prefix-caching" in argv and "--no-enable-chunked-prefill" in argv
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--generation-config") + 1] == "vllm"  # neutral: the model's defaults stay out
    assert args.server["port"] == 9123
    assert "presence_penalty" in args.sampling


def test_server_argv_is_a_list_that_keeps_odd_values_whole():
    argv = server_argv("/py", {"model": "/m; rm -rf /", "hf_overrides": {"head_dtype": "float32"},
                               "enforce_eager": False, "seed": 0}, 1)
    assert argv[argv.index("--model") + 1] == "/m; rm -rf /"  # one argument, never a shell string
    assert argv[argv.index("--hf-overrides") + 1] == '{"head_dtype": "float32"}'
    assert "--no-enforce-eager" in argv and argv[argv.index("--seed") + 1] == "0"


# -- what the server says of itself ----------------------------------------------------------------

LOG_LINE = ("(EngineCore pid=6270) INFO 11-23 07:43:41 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
            "config: model='/tmp/fixture/tiny-llama', speculative_config=None, tokenizer='/tmp/fixture/tiny-llama', "
            "trust_remote_code=False, dtype=torch.float32, max_seq_len=2048, download_dir=None, "
            "tensor_parallel_size=1, pipeline_parallel_size=2, enforce_eager=True, seed=0, "
            "served_model_name=/tmp/fixture/tiny-llama, enable_prefix_caching=False, enable_chunked_prefill=True, "
            "compilation_config={'mode': <CompilationMode.NONE: 0>, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>}")


def test_the_servers_resolved_settings_come_from_its_log():
    got = engine_config_from_log("noise\n" + LOG_LINE + "\nmore")
    assert got == {"dtype": "float32", "max_model_len": 2048, "tensor_parallel": 1, "pipeline_parallel": 2,
                   "prefix_caching": False, "chunked_prefill": True, "cuda_graphs": "off", "seed": 0}
    assert engine_config_from_log("no such line") == {}


def test_server_info_of_a_dev_mode_server_maps_to_the_common_vocabulary():
    got = config_from_server_info({"model_config": {"dtype": "torch.bfloat16", "max_model_len": 4096,
                                                    "enforce_eager": False},
                                   "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
                                   "parallel_config": {"tensor_parallel_size": 2}})
    assert got["dtype"] == "bfloat16" and got["tensor_parallel"] == 2 and got["cuda_graphs"] == "FULL_AND_PIECEWISE"


@pytest.mark.parametrize("tail,word", [
    ("OSError: [Errno 98] Address already in use", "port is taken"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "out of memory"),
    ("api_server.py: error: unrecognized arguments: --bogus", "refused an option"),
    ("something else entirely", "exited (code 1)"),
])
def test_why_vllm_serve_did_not_start(tail, word):
    what, fix = why_not_started(tail, 1)
    assert word in what and fix


def test_rank_comes_from_the_returned_top_k():
    step = step_from_choice(0, "token_id:7", -2.0, {"token_id:5": -1.0, "token_id:7": -2.0}, 2)
    assert step.token_id == 7 and step.rank == 2 and [t.token_id for t in step.top] == [5, 7]
    outside = step_from_choice(0, "token_id:9", -5.0, {"token_id:5": -1.0, "token_id:7": -2.0, "token_id:9": -5.0}, 2)
    assert outside.rank is None and [t.token_id for t in outside.top] == [5, 7]


# -- the client against a misbehaving server -------------------------------------------------------

def test_a_well_behaved_server_streams_ids_and_scores(server):
    eng = OpenAIEngine()
    assert eng.check(_load(server.url)) == []
    info = eng.load(_load(server.url))
    assert info.version == "0.32.0-fake" and info.resolved["served_model"] == MODEL
    assert info.resolved["max_model_len"] == 2048
    assert "not exposed" in info.resolved["engine_config"]  # no /server_info: said, not guessed
    streamed: list = []
    (res,) = _generate(eng, streamed)
    assert res.token_ids == [100, 101, 102, 103, 104, 105] and res.finish_reason == "length"
    assert [s.token_id for s in streamed] == res.token_ids  # tokens arrived one by one
    path, body = server.requests[-1]
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["stream"] is True
    steps = eng.score(ScoreRequest(prompt=[1, 2], continuation=[3, 4], logprobs=2))
    assert [s.token_id for s in steps] == [3, 4] and steps[0].logprob == -1.0 and steps[0].rank == 1


def test_connection_refused_names_the_address_and_the_fix():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    problems = OpenAIEngine().check(_load(f"http://127.0.0.1:{port}/v1"))
    assert len(problems) == 1 and problems[0].severity == "error"
    assert f"127.0.0.1:{port}" in problems[0].message and "refused" in problems[0].message
    assert "vllm-server" in problems[0].fix


def test_dns_failure():
    (p,) = OpenAIEngine().check(_load("http://no-such-host.invalid:8000/v1"))
    assert "cannot resolve" in p.message and "host name" in p.fix


def test_tls_to_a_plain_http_server(server):
    (p,) = OpenAIEngine().check(_load(server.url.replace("http://", "https://")))
    assert "TLS" in p.message and "verify_tls" in p.fix


def test_timeout(server):
    eng = OpenAIEngine()
    eng.load(_load(server.url, timeout_s=1.0))
    server.mode = "slow"
    with pytest.raises(EngineFault, match="did not answer within 1 s") as e:
        _generate(eng)
    assert "timeout_s" in e.value.fix


def test_http_errors_carry_the_servers_own_message(server):
    server.mode = "http500-models"
    (p,) = OpenAIEngine().check(_load(server.url))
    assert "HTTP 500" in p.message and "engine core is dead" in p.message
    eng = OpenAIEngine()
    server.mode = "ok"
    eng.load(_load(server.url))
    server.mode = "http400"
    with pytest.raises(EngineFault, match="HTTP 400: max_tokens=99999 cannot be greater"):
        _generate(eng)


def test_an_api_key_comes_from_the_named_environment_variable(server, monkeypatch):
    server.mode = "need-key"
    (p,) = OpenAIEngine().check(_load(server.url))
    assert "HTTP 401" in p.message and "api_key_env" in p.fix
    (p,) = OpenAIEngine().check(_load(server.url, api_key_env="PARITY_TEST_KEY"))
    assert "PARITY_TEST_KEY" in p.message and "not set" in p.message
    monkeypatch.setenv("PARITY_TEST_KEY", "s3cret")
    assert OpenAIEngine().check(_load(server.url, api_key_env="PARITY_TEST_KEY")) == []


def test_a_server_serving_another_model(server):
    (p,) = OpenAIEngine().check(_load(server.url, served_model="my-model"))
    assert "does not serve 'my-model'" in p.message and MODEL in p.message
    server.mode = "two-models"
    (p,) = OpenAIEngine().check(_load(server.url))
    assert "several models" in p.message and "served_model=" in p.fix
    renamed = FakeServer(_tok, model="/models/other-checkpoint")
    try:
        (w,) = OpenAIEngine().check(_load(renamed.url))
        assert w.severity == "warning" and "other-checkpoint" in w.message
    finally:
        renamed.shutdown()
        renamed.server_close()


def test_a_server_whose_tokenizer_differs_is_refused_before_generating(server):
    eng = OpenAIEngine()
    eng.load(_load(server.url))
    text = "<s>hello"
    check = InputCheck(texts=[text], text_ids=[_tok(text)], ids=[_tok(text)], max_new_tokens=4)
    assert eng.check_input(check) == []
    server.mode = "other-tokenizer"
    (p,) = eng.check_input(check)
    assert "tokenizes prompt 0 differently" in p.message and "first difference at token 0" in p.message


def test_a_prompt_longer_than_the_server_serves(server):
    eng = OpenAIEngine()
    eng.load(_load(server.url))
    (p,) = eng.check_input(InputCheck(texts=["x"], text_ids=[_tok("x")], ids=[list(range(2040))], max_new_tokens=16))
    assert "at most 2048 positions" in p.message and "--max-model-len" in p.fix


def test_malformed_answers(server):
    server.mode = "not-json"
    (p,) = OpenAIEngine().check(_load(server.url))
    assert "not JSON" in p.message and "<html>" in p.message
    eng = OpenAIEngine()
    server.mode = "ok"
    eng.load(_load(server.url))
    server.mode = "garbage-mid-stream"
    with pytest.raises(EngineFault, match="not JSON"):
        _generate(eng)
    server.mode = "no-prompt-logprobs"
    with pytest.raises(EngineFault, match="no usable prompt_logprobs") as e:
        eng.score(ScoreRequest(prompt=[1], continuation=[2], logprobs=1))
    assert "cross_score" in e.value.fix


def test_the_server_dying_mid_stream_keeps_the_tokens_that_arrived(server):
    eng = OpenAIEngine()
    eng.load(_load(server.url))
    server.mode = "die-mid-stream"
    streamed: list = []
    with pytest.raises(EngineFault, match="before it finished|broke mid-stream") as e:
        _generate(eng, streamed, max_tokens=10)
    assert [s.token_id for s in streamed] == [100, 101, 102]  # the service keeps these as partial tokens
    assert "kept" in e.value.fix
