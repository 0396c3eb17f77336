"""The real server process (``python -m sglang_pd.launch_server``) in front of the fake engine.

The fake engine answers token t+1 = (t + 1) % vocab after the last prompt token, so every
expected output is computable here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterator

import httpx
import pytest
from tokenizers import Tokenizer

from sglang_pd.utils.server_procs import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fake_engine import write_tiny_model_dir  # noqa: E402

try:
    import openai
except ImportError:  # only the OpenAI-client tests need it (they skip); the rest speak plain HTTP
    openai = None

API_KEY = "test-key"
CONTEXT_LENGTH = 256
pytestmark = pytest.mark.timeout(120)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    model_dir: str
    log_path: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


def start_server(model_dir: str, log_path: str, *extra: str, env: dict[str, str] | None = None,
                 wait: bool = True) -> Server:
    port = free_port()
    full_env = {**os.environ, "SGLANG_PD_ENGINE_ENTRY": "fake_engine:run_engine_process",
                "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
                "SGLANG_PD_SHUTDOWN_GRACE_S": "5", **(env or {})}
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", model_dir,
           "--port", str(port), "--log-level", "debug", *extra]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    server = Server(proc, f"http://127.0.0.1:{port}", model_dir, log_path)
    if wait:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
            try:
                if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                stop_server(server)
                raise RuntimeError(f"server not healthy within 60s:\n{server.log()}")
            time.sleep(0.1)
    return server


def stop_server(server: Server) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


def _pid_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # zombies count as gone
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_model_dir(str(tmp_path_factory.mktemp("model")),
                                context_length=CONTEXT_LENGTH)


@pytest.fixture(scope="module")
def server(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    srv = start_server(model_dir, log, "--api-key", API_KEY, "--served-model-name", "tiny")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def tok(model_dir: str) -> Tokenizer:
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    require_openai()
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def require_openai() -> None:
    if openai is None:
        pytest.skip("the openai client is not installed (pip install -e '.[test]')")


def expected_ids(last: int, n: int, vocab: int) -> list[int]:
    return [(last + i) % vocab for i in range(1, n + 1)]


def sse_events(response: httpx.Response) -> list[Any]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def ascii_run(tok: Tokenizer, n: int) -> int:
    """A start id whose next n tokens each decode to plain printable ASCII."""
    vocab = tok.get_vocab_size()
    for start in range(3, vocab - n - 1):
        texts = [tok.decode([t]) for t in range(start + 1, start + n + 1)]
        if all(t and t.isascii() and t.isprintable() and t.strip() == t for t in texts):
            return start
    raise AssertionError("no ascii run in the vocabulary")


# ------------------------------------------------------------------ /generate
def test_generate_non_stream(client: httpx.Client, tok: Tokenizer) -> None:
    r = client.post("/generate", json={"text": "Hello world",
                                       "sampling_params": {"max_new_tokens": 6}})
    assert r.status_code == 200, r.text
    out = r.json()
    last = tok.encode("Hello world").ids[-1]
    assert out["output_ids"] == expected_ids(last, 6, tok.get_vocab_size())
    assert out["text"] == tok.decode(out["output_ids"])
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(tok.encode("Hello world").ids)
    assert meta["completion_tokens"] == 6 and meta["cached_tokens"] == 0
    assert meta["e2e_latency"] > 0 and len(meta["id"]) == 32


def test_generate_stream(client: httpx.Client, tok: Tokenizer) -> None:
    body = {"input_ids": [10, 20], "sampling_params": {"max_new_tokens": 12}, "stream": True,
            "rid": "stream-1"}
    with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    final = chunks[-1]
    assert final["output_ids"] == expected_ids(20, 12, tok.get_vocab_size())
    assert final["meta_info"]["finish_reason"]["type"] == "length"
    assert final["meta_info"]["id"] == "stream-1"
    for c in chunks[:-1]:
        assert c["meta_info"]["finish_reason"] is None
        assert final["text"].startswith(c["text"])  # cumulative text
        assert final["output_ids"][: len(c["output_ids"])] == c["output_ids"]


def test_generate_batch(client: httpx.Client, tok: Tokenizer) -> None:
    r = client.post("/generate", json={"text": ["Hello", "the fox"],
                                       "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == 2
    for prompt, out in zip(["Hello", "the fox"], outs):
        last = tok.encode(prompt).ids[-1]
        assert out["output_ids"] == expected_ids(last, 3, tok.get_vocab_size())
    r = client.post("/generate", json={"input_ids": [[5], [6, 7]], "rid": ["b-1", "b-2"],
                                       "sampling_params": [{"max_new_tokens": 1},
                                                           {"max_new_tokens": 2}]})
    assert [o["meta_info"]["id"] for o in r.json()] == ["b-1", "b-2"]
    assert [o["output_ids"] for o in r.json()] == [[6], [8, 9]]
    with client.stream("POST", "/generate", json={"input_ids": [[5], [6]], "stream": True,
                                                  "sampling_params": {"max_new_tokens": 2}}) as r:
        events = sse_events(r)
    finals = {e["index"]: e for e in events[:-1] if e["meta_info"]["finish_reason"]}
    assert finals[0]["output_ids"] == [6, 7] and finals[1]["output_ids"] == [7, 8]


def test_generate_logprobs(client: httpx.Client, tok: Tokenizer) -> None:
    r = client.post("/generate", json={"input_ids": [40], "return_logprob": True,
                                       "top_logprobs_num": 2, "return_text_in_logprobs": True,
                                       "sampling_params": {"max_new_tokens": 3}})
    meta = r.json()["meta_info"]
    assert [t[1] for t in meta["output_token_logprobs"]] == [41, 42, 43]
    assert all(isinstance(t[0], float) and t[2] == tok.decode([t[1]], skip_special_tokens=False)
               for t in meta["output_token_logprobs"])
    assert len(meta["output_top_logprobs"]) == 3 and len(meta["output_top_logprobs"][0]) == 2
    r = client.post("/generate", json={"input_ids": [40], "return_logprob": True,
                                       "sampling_params": {"max_new_tokens": 1}})
    assert r.json()["meta_info"]["output_token_logprobs"][0][2] is None


def test_stop_string_is_trimmed(client: httpx.Client, tok: Tokenizer) -> None:
    start = ascii_run(tok, 6)
    ids = expected_ids(start, 6, tok.get_vocab_size())
    stop = tok.decode([ids[3]])
    body = {"input_ids": [start], "sampling_params": {"max_new_tokens": 20, "stop": stop}}
    out = client.post("/generate", json=body).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == ids[:4]
    assert out["text"] == tok.decode(ids[:3])
    body["sampling_params"]["no_stop_trim"] = True
    assert client.post("/generate", json=body).json()["text"] == tok.decode(ids[:4])
    body.update(stream=True)
    body["sampling_params"]["no_stop_trim"] = False
    with client.stream("POST", "/generate", json=body) as r:
        events = sse_events(r)[:-1]
    assert events[-1]["text"] == tok.decode(ids[:3])
    assert all(stop not in e["text"] for e in events)


def test_stop_token_ids(client: httpx.Client, tok: Tokenizer) -> None:
    out = client.post("/generate", json={"input_ids": [50], "sampling_params": {
        "max_new_tokens": 10, "stop_token_ids": [53]}}).json()
    assert out["output_ids"] == [51, 52, 53]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 53}
    assert out["text"] == tok.decode([51, 52])


# ------------------------------------------------------------------ OpenAI API
def test_openai_completions(oai: openai.OpenAI, tok: Tokenizer) -> None:
    r = oai.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
    last = tok.encode("Hello").ids[-1]
    assert r.choices[0].text == tok.decode(expected_ids(last, 4, tok.get_vocab_size()))
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 4
    assert r.usage.prompt_tokens == len(tok.encode("Hello").ids)
    chunks = list(oai.completions.create(model="tiny", prompt="Hello", max_tokens=4,
                                         stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == r.usage.total_tokens
    r = oai.completions.create(model="tiny", prompt=[[7, 8], [9]], max_tokens=2, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].logprobs is not None and len(r.choices[0].logprobs.tokens or []) == 2


def test_openai_chat(oai: openai.OpenAI, tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" \
             "<|im_start|>assistant\n"
    ids = tok.encode(prompt, add_special_tokens=False).ids
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == tok.decode(
        expected_ids(ids[-1], 5, tok.get_vocab_size()))
    assert r.choices[0].finish_reason == "length" and r.model == "tiny"
    chunks = list(oai.chat.completions.create(model="tiny", messages=messages, max_tokens=5,
                                              stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    r = oai.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                    logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content is not None and len(content) == 2 and len(content[0].top_logprobs) == 2


def test_openai_errors(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="max_new_tokens must be >= 0"):
        oai.completions.create(model="tiny", prompt="x", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                    n=2)
    with pytest.raises(openai.BadRequestError, match="context length is 256"):
        oai.completions.create(model="tiny", prompt=[5] * 300, max_tokens=1)


def test_models(oai: openai.OpenAI) -> None:
    models = oai.models.list().data
    assert [m.id for m in models] == ["tiny"]


# ------------------------------------------------------------------ errors and auth
BAD_GENERATE = [
    (b"{not json", "malformed JSON"),
    (json.dumps({"text": "a", "input_ids": [1]}).encode(), "exactly one of 'text' or 'input_ids'"),
    (json.dumps({"sampling_params": {}}).encode(), "exactly one of 'text' or 'input_ids'"),
    (json.dumps({"text": ""}).encode(), "the prompt is empty"),
    (json.dumps({"input_ids": []}).encode(), "the prompt is empty"),
    (json.dumps({"text": "a", "sampling_params": {"temperature": -1}}).encode(),
     "temperature must be >= 0"),
    (json.dumps({"text": "a", "sampling_params": {"top_p": 2}}).encode(), "top_p must be in"),
    (json.dumps({"text": "a", "sampling_params": {"max_new_tokens": -5}}).encode(),
     "max_new_tokens must be >= 0, got -5"),
    (json.dumps({"text": "a", "sampling_params": {"max_tokens": 5, "bogus": 1}}).encode(),
     "unknown sampling_params keys: bogus, max_tokens"),
    (json.dumps({"input_ids": [1] * 300}).encode(), ("300 tokens but the model's context length "
                                                     "is 256")),
    (json.dumps({"input_ids": [1, 5000]}).encode(), "outside the vocabulary"),
    (json.dumps({"input_ids": [1], "rid": "fake-reject-x"}).encode(), "rejected by the fake"),
]


@pytest.mark.parametrize("body,message", BAD_GENERATE)
def test_bad_generate_requests(client: httpx.Client, body: bytes, message: str) -> None:
    r = client.post("/generate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"]
    assert error["type"] == "BadRequestError" and error["code"] == 400


def test_server_healthy_after_errors(client: httpx.Client) -> None:
    client.post("/generate", content=b"{")
    assert client.get("/health").status_code == 200
    assert client.post("/generate", json={"input_ids": [1], "sampling_params": {
        "max_new_tokens": 1}}).status_code == 200


def test_api_key(server: Server) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    for method, path in [("POST", "/generate"), ("GET", "/metrics"), ("GET", "/v1/models"),
                         ("GET", "/get_server_info")]:
        r = httpx.request(method, f"{server.url}{path}", json={"input_ids": [1]})
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        r = httpx.request(method, f"{server.url}{path}", json={"input_ids": [1]},
                          headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401


def test_api_key_through_the_openai_client(server: Server) -> None:
    require_openai()
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# ------------------------------------------------------------------ lifecycle of requests
def _load(client: httpx.Client) -> dict[str, Any]:
    r = client.get("/get_load")
    assert r.status_code == 200
    return r.json()


def _wait_for(predicate: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_client_disconnect_aborts_in_engine(client: httpx.Client, server: Server) -> None:
    before = _load(client)["num_aborted"]
    body = {"input_ids": [5], "stream": True,
            "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True}}
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=10) as c2:
        with c2.stream("POST", "/generate", json=body) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen >= 3:
                    break  # leaving the block closes the connection mid-stream
    _wait_for(lambda: _load(client)["num_aborted"] > before)
    load = _load(client)
    assert load["num_running_reqs"] == 0 and load["num_frontend_reqs"] == 0
    # Non-streaming requests are aborted too when the client gives up.
    with pytest.raises(httpx.ReadTimeout):
        client.post("/generate", json={**body, "stream": False}, timeout=0.3)
    _wait_for(lambda: _load(client)["num_aborted"] > before + 1)


def test_abort_request_endpoint(client: httpx.Client, server: Server) -> None:
    import threading

    result: dict[str, Any] = {}

    def run() -> None:
        result["out"] = client.post("/generate", json={
            "input_ids": [5], "rid": "to-abort",
            "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True}}).json()

    t = threading.Thread(target=run)
    t.start()
    _wait_for(lambda: _load(client)["num_running_reqs"] >= 1)
    assert client.post("/abort_request", json={"rid": "to-abort"}).status_code == 200
    t.join(10)
    assert result["out"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert client.post("/abort_request", json={}).status_code == 400


def test_info_endpoints(client: httpx.Client, server: Server) -> None:
    for path in ("/get_model_info", "/model_info"):
        info = client.get(path).json()
        assert info["model_path"] == server.model_dir and info["is_generation"] is True
        assert info["tokenizer_path"] == server.model_dir
    info = client.get("/get_server_info").json()
    assert info["api_key"] == "<redacted>" and info["port"] == int(server.url.rsplit(":", 1)[1])
    assert info["engine_info"]["context_length"] == CONTEXT_LENGTH
    assert info["internal_states"][0]["engine"] == "fake"
    assert client.get("/server_info").status_code == 200
    assert client.get("/health_generate").status_code == 200
    r = client.post("/flush_cache")
    assert r.status_code == 200 and "flushed" in r.text


def _metric_values(client: httpx.Client) -> dict[str, float]:
    """/metrics -> {sample name: value} for the served model's unlabelled-but-model samples."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for fam in text_string_to_metric_families(client.get("/metrics").text)
            for s in fam.samples if s.labels == {"model_name": "tiny"}}


def test_metrics(client: httpx.Client) -> None:
    """One finished request moves each counter by what it did (values, not names printed at 0)."""
    before = _metric_values(client)
    r = client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 3, "ignore_eos": True}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3
    after = _metric_values(client)
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    assert moved["sglang:prompt_tokens_total"] == 2
    assert moved["sglang:generation_tokens_total"] == 3
    assert moved["sglang:num_requests_total"] == 1
    assert moved["sglang:time_to_first_token_seconds_count"] == 1
    assert moved["sglang:e2e_request_latency_seconds_count"] == 1
    assert moved["sglang:e2e_request_latency_seconds_sum"] > 0
    assert moved["sglang:inter_token_latency_seconds_count"] >= 1  # 2 gaps, maybe sent together
    for gauge in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                  "sglang:gen_throughput"):
        assert gauge in after, gauge


def _slo_counts(client: httpx.Client) -> dict[tuple[str, str], float]:
    """{(metric, request_class): value} of the SLO attainment counters."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, s.labels["request_class"]): s.value
            for fam in text_string_to_metric_families(client.get("/metrics").text)
            for s in fam.samples if s.name.startswith("sglang:slo_") and s.name.endswith("_total")}


def test_slo_counters_follow_the_documented_rules(client: httpx.Client) -> None:
    """docs/api.md: TTFT/TPOT within the SLO counts met, over it missed; a request of one token
    is not counted for TPOT; a request without an SLO is not counted. The fake engine makes a
    token every 5 ms, so a 1 us SLO is always missed and a 60 s one always met."""
    def gen(n: int, slo: dict | None) -> None:
        body: dict[str, Any] = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": n,
                                                                         "ignore_eos": True}}
        if slo is not None:
            body["slo"] = slo
        assert client.post("/generate", json=body).status_code == 200

    before = _slo_counts(client)
    gen(4, {"ttft_ms": 60_000, "tpot_ms": 60_000})  # met, met
    gen(4, {"ttft_ms": 0.001, "tpot_ms": 0.001})  # missed, missed
    gen(1, {"ttft_ms": 60_000, "tpot_ms": 0.001})  # met; one token: no TPOT
    gen(4, None)  # no SLO (the server sets none): not counted
    after = _slo_counts(client)
    moved = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    assert moved == {("sglang:slo_ttft_met_total", "short"): 2, ("sglang:slo_ttft_missed_total", "short"): 1,
                     ("sglang:slo_tpot_met_total", "short"): 1, ("sglang:slo_tpot_missed_total", "short"): 1}


# ------------------------------------------------------------------ process lifecycle
def test_sigterm_exits_cleanly(model_dir: str, tmp_path: Any) -> None:
    srv = start_server(model_dir, str(tmp_path / "log"))
    info = httpx.get(f"{srv.url}/get_server_info").json()
    engine_pid, ipc_dir = info["internal_states"][0]["pid"], info["ipc_dir"]
    assert _pid_running(engine_pid) and os.path.isdir(ipc_dir)
    body = {"input_ids": [5], "stream": True,
            "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}
    with httpx.stream("POST", f"{srv.url}/generate", json=body, timeout=10) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        srv.proc.send_signal(signal.SIGTERM)  # the in-flight stream may still finish
        events = [json.loads(line[6:]) for line in lines
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(events[-1]["output_ids"]) == 100
    assert srv.proc.wait(10) == 0, srv.log()  # a hang guard, not a bar
    _wait_for(lambda: not _pid_running(engine_pid))
    assert not os.path.exists(ipc_dir)


def test_engine_crash_stops_server(model_dir: str, tmp_path: Any) -> None:
    srv = start_server(model_dir, str(tmp_path / "log"))
    try:
        engine_pid = httpx.get(f"{srv.url}/get_server_info").json()["internal_states"][0]["pid"]
        os.kill(engine_pid, signal.SIGKILL)
        assert srv.proc.wait(10) == 1
        assert "engine process died" in srv.log()
    finally:
        stop_server(srv)


def test_engine_start_failure(model_dir: str, tmp_path: Any) -> None:
    srv = start_server(model_dir, str(tmp_path / "log"), env={"FAKE_ENGINE_FAIL": "no GPU here"},
                       wait=False)
    try:
        assert srv.proc.wait(30) == 1
        assert "no GPU here" in srv.log()
    finally:
        stop_server(srv)


def test_skip_tokenizer_init(model_dir: str, tmp_path: Any) -> None:
    srv = start_server(model_dir, str(tmp_path / "log"), "--skip-tokenizer-init")
    try:
        out = httpx.post(f"{srv.url}/generate", json={
            "input_ids": [5], "sampling_params": {"max_new_tokens": 2}}).json()
        assert out["output_ids"] == [6, 7] and "text" not in out
        r = httpx.post(f"{srv.url}/generate", json={"text": "hi"})
        assert r.status_code == 400 and "--skip-tokenizer-init" in r.json()["error"]["message"]
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": [5], "max_tokens": 1})
        assert r.status_code == 400
    finally:
        assert stop_server(srv) == 0
