"""Issue 22 regression tests over HTTP, in front of the fake engine: bounded inputs, strict
validation, stable error texts, queue limit, watchdog, and a drain that outlives its grace."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import httpx
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fake_engine import write_tiny_model_dir  # noqa: E402
from sglang_pd.frontend.inputs import INLINE_TOKENIZE_CHARS  # noqa: E402
from test_http_fake_engine import start_server, stop_server  # noqa: E402

pytestmark = pytest.mark.timeout(120)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMP = {"model": "m", "prompt": "hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_model_dir(str(tmp_path_factory.mktemp("model")), context_length=256)


@pytest.fixture(scope="module")
def url(model_dir: str, tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(model_dir, str(tmp_path_factory.mktemp("log") / "s.log"))
    try:
        yield srv.url
    finally:
        stop_server(srv)


def _err(r: httpx.Response, status: int, needle: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert needle in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("path, body, needle", [
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"tools": []}}, "may not set tools"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"add_generation_prompt": False}},
     "add_generation_prompt"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required", "tools": []}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 7000}, "top_logprobs"),
    ("/v1/completions", {**COMP, "logprobs": 7000}, "logprobs must be in [0, 20]"),
    ("/v1/completions", {**COMP, "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {**COMP, "regex": "[a-z]+"}, "structured output"),
    ("/v1/chat/completions", {**CHAT, "guided_json": {"type": "object"}}, "structured output"),
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 7000}, "[0, 20]"),
    ("/generate", {"text": "hi", "return_logprob": "yes"}, "true or false"),
    ("/generate", {"text": "hi", "sampling_params": {"stop": ["ab"] * 10_000}}, "stop strings"),
    ("/generate", {"text": ["hi"] * 1000}, "at most 512 prompts"),
    ("/generate", {"text": "x" * 100_000}, "characters"),
    ("/abort_request", {"abort_all": "false"}, "abort_all must be true or false"),
    ("/generate", {"text": "hi", "slo": {"ttft": 100}}, "unknown slo keys: ttft"),
    ("/v1/completions", {**COMP, "slo": {"tpot": 10}}, "unknown slo keys: tpot"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": {"x": 1}}]}]}, "needs a string 'text'"),
    ("/generate", {"input_ids": [1] * 300 + ["x"]}, "context length"),
    ("/v1/completions", {**COMP, "prompt": ["a"] * 600}, "at most 512 prompts"),
])
def test_bad_input_is_a_400_with_a_message(url: str, path: str, body: dict, needle: str) -> None:
    _err(httpx.post(url + path, json=body, timeout=30), 400, needle)


def test_nan_slo_header_is_a_400(url: str) -> None:
    r = httpx.post(url + "/generate", json={"text": "hi"}, headers={"x-slo-ttft-ms": "nan"})
    _err(r, 400, "positive finite")


def test_oversized_body_is_a_413_and_health_stays_live(url: str) -> None:
    body = b'{"text": "' + b"a" * (17 << 20) + b'"}'
    r = httpx.post(url + "/generate", content=body, headers={"content-type": "application/json"},
                   timeout=60)
    _err(r, 413, "limit")
    assert httpx.get(url + "/health", timeout=5).status_code == 200


def test_long_text_is_tokenized_off_the_event_loop(tmp_path) -> None:
    """While a big text is being tokenized, /health still answers: the server's tokenizer is
    made to block (blocking_tokenizer_site/sitecustomize.py) until the test has seen /health
    answer, so a tokenization on the event loop would leave /health unanswered (its timeout)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    big_dir = write_tiny_model_dir(str(tmp_path / "model"), context_length=16384)
    site = os.path.join(HERE, "blocking_tokenizer_site")
    srv = start_server(big_dir, str(tmp_path / "s.log"), env={
        "BLOCKING_TOKENIZER_DIR": str(gate),
        "PYTHONPATH": os.pathsep.join([site, HERE, os.environ.get("PYTHONPATH", "")])})
    text = "BLOCK-TOKENIZER " + "ab " * (INLINE_TOKENIZE_CHARS // 3 + 100)
    assert len(text) > INLINE_TOKENIZE_CHARS  # the size that goes to a worker thread
    results: dict[str, Any] = {}

    def big() -> None:
        results["r"] = httpx.post(srv.url + "/generate", json={
            "text": text, "sampling_params": {"max_new_tokens": 1}}, timeout=90)

    t = threading.Thread(target=big)
    try:
        t.start()
        deadline = time.monotonic() + 30  # a hang guard, not a bar
        while not (gate / "started").exists():
            assert time.monotonic() < deadline, "the long prompt never reached the tokenizer"
            time.sleep(0.01)
        # the tokenizer is blocked until "release" exists: /health must answer meanwhile
        assert httpx.get(srv.url + "/health", timeout=15).status_code == 200
        assert not results  # the long request is still waiting for its tokens
    finally:
        (gate / "release").touch()
        t.join(90)
        stop_server(srv)
    assert results["r"].status_code == 200, results["r"].text


def test_queue_limit_answers_503_with_retry_after(model_dir: str, tmp_path) -> None:
    srv = start_server(model_dir, str(tmp_path / "q.log"), "--max-queued-requests", "2",
                       env={"FAKE_ENGINE_STEP_S": "0.2"})
    try:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 40}}
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            done: list[int] = []
            threads = [threading.Thread(target=lambda: done.append(c.post("/generate", json=body).status_code))
                       for _ in range(2)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60  # a hang guard
            while c.get("/get_load").json()["num_frontend_reqs"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            r = c.post("/generate", json=body)
            _err(r, 503, "--max-queued-requests")
            assert r.headers["retry-after"] == "1"
            for t in threads:
                t.join()
            assert done == [200, 200]
    finally:
        stop_server(srv)


def test_watchdog_fails_health_when_the_engine_stops_answering(model_dir: str, tmp_path) -> None:
    """Issue 22 item 8: a stuck engine looked healthy forever."""
    srv = start_server(model_dir, str(tmp_path / "w.log"), "--watchdog-timeout", "1",
                       env={"FAKE_ENGINE_STEP_S": "60"})  # the fake engine then sleeps 60 s
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        def stuck_request() -> None:
            try:
                httpx.post(srv.url + "/generate", json={"text": "hi"}, timeout=120)  # pending
            except httpx.HTTPError:
                pass  # expected: the engine never answers

        t = threading.Thread(target=stuck_request, daemon=True)
        t.start()
        deadline = time.monotonic() + 60  # a hang guard
        status = 200
        while status == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
            status = httpx.get(srv.url + "/health").status_code
        assert status == 503
        assert "watchdog" in httpx.get(srv.url + "/health").json()["error"]["message"]
    finally:
        stop_server(srv)


def test_health_is_503_when_the_engine_reports_no_progress(model_dir: str, tmp_path) -> None:
    """docs/api.md: /health fails when the engine reports queued work that made no progress for
    --watchdog-timeout (EngineStats.engine_stall_s), though it still answers."""
    srv = start_server(model_dir, str(tmp_path / "st.log"), "--watchdog-timeout", "2",
                       env={"FAKE_ENGINE_STALL_S": "3"}, wait=False)
    try:
        deadline = time.monotonic() + 60  # a hang guard: stats arrive every 0.2 s
        while True:
            assert srv.proc.poll() is None, srv.log()
            try:
                r = httpx.get(srv.url + "/health", timeout=5)
                if r.status_code == 503:
                    break
            except httpx.TransportError:
                pass  # not listening yet
            assert time.monotonic() < deadline, "/health never failed"
            time.sleep(0.1)
        assert "made no progress for 3 s" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
        assert httpx.get(srv.url + "/get_load", timeout=10).status_code == 200  # the engine answers
    finally:
        stop_server(srv)


def test_unanswered_control_call_is_a_504_in_the_error_shape(model_dir: str, tmp_path) -> None:
    """docs/api.md: 504 TimeoutError when the engine does not answer a control call in time."""
    srv = start_server(model_dir, str(tmp_path / "c.log"), env={"FAKE_ENGINE_IGNORE_CONTROL": "get_load"})
    try:
        r = httpx.get(srv.url + "/get_load", timeout=60)
        assert r.status_code == 504, r.text
        assert r.json() == {"error": {"message": "the engine did not answer 'get_load' within 5s",
                                      "type": "TimeoutError", "code": 504}}
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200  # nothing else broke
    finally:
        stop_server(srv)


def test_unknown_path_is_a_404_in_the_error_shape(url: str) -> None:
    r = httpx.get(url + "/no/such/path")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundError" and r.json()["error"]["code"] == 404


def test_stop_token_ids_limit_is_256(url: str) -> None:
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1, "stop_token_ids": list(range(256))}}
    assert httpx.post(url + "/generate", json=body, timeout=30).status_code == 200
    body["sampling_params"]["stop_token_ids"] = list(range(257))
    _err(httpx.post(url + "/generate", json=body, timeout=30), 400, "at most 256 stop_token_ids")


def test_drain_past_grace_answers_json_and_a_final_sse_error(model_dir: str, tmp_path) -> None:
    """Issue 22 item 10: past the grace period clients got plain-text 500s and cut streams."""
    srv = start_server(model_dir, str(tmp_path / "d.log"),
                       env={"FAKE_ENGINE_STEP_S": "0.2", "SGLANG_PD_SHUTDOWN_GRACE_S": "2"})
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 100}}
    out: dict[str, Any] = {}

    def plain() -> None:
        out["plain"] = httpx.post(srv.url + "/generate", json=body, timeout=60)

    def stream() -> None:
        events = []
        with httpx.stream("POST", srv.url + "/generate", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and line.strip() != "data: [DONE]":
                    events.append(json.loads(line[5:]))
        out["events"] = events

    threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20  # both requests held by the server before the signal
        while httpx.get(srv.url + "/get_load").json()["num_frontend_reqs"] < 2:
            assert time.monotonic() < deadline, "the requests never reached the server"
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert srv.proc.wait(30) == 0
    finally:
        stop_server(srv)
    r = out["plain"]
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
    assert out["events"] and "error" in out["events"][-1]
    assert "shutting down" in out["events"][-1]["error"]["message"]


def test_streamed_completion_logprobs_match_the_whole_answer(url: str) -> None:
    """The stream now lists only new tokens per chunk (it re-listed all of them, quadratic);
    tokens and text offsets joined over the chunks equal the non-streamed answer."""
    body = {**COMP, "max_tokens": 12, "logprobs": 2}
    whole = httpx.post(url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    tokens: list[str] = []
    offsets: list[int] = []
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                choice = json.loads(line[5:])["choices"][0]
                text += choice["text"]
                if choice["logprobs"]:
                    tokens += choice["logprobs"]["tokens"]
                    offsets += choice["logprobs"]["text_offset"]
    assert text == whole["text"]
    assert tokens == whole["logprobs"]["tokens"] and len(tokens) == 12
    assert offsets == whole["logprobs"]["text_offset"]


def _app_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the server's own app factory registers (included routers
    walked too: FastAPI 0.165 keeps them as one entry each)."""
    from fastapi.routing import APIRoute

    from sglang_pd.entrypoints.http_server import create_app
    from sglang_pd.server_args import ServerArgs

    def walk(routes: list, prefix: str) -> list[tuple[str, str]]:
        found = []
        for r in routes:
            if isinstance(r, APIRoute):
                found += [(m, prefix + r.path) for m in r.methods if m != "HEAD"]
            elif hasattr(r, "original_router"):  # an included router
                found += walk(r.original_router.routes, prefix + r.include_context.prefix)
            else:
                raise AssertionError(f"a route of unknown kind: {r!r}")  # would go unchecked
        return found

    app = create_app(ServerArgs(model_path="m", api_key="k"), tokenizer_manager=None)  # type: ignore[arg-type]
    return sorted(walk(app.routes, ""))


def test_api_key_guards_every_route_but_health(model_dir: str, tmp_path) -> None:
    """docs/api.md: with --api-key every endpoint except GET /health needs the key. The routes
    come from the app's own table, so a new route that skips the guard fails here."""
    routes = _app_routes()
    documented = {("POST", "/abort_request"), ("POST", "/flush_cache"), ("POST", "/set_prefill_role"),
                  ("GET", "/get_load"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                  ("POST", "/generate"), ("GET", "/metrics"), ("GET", "/health")}
    assert documented <= set(routes), documented - set(routes)
    srv = start_server(model_dir, str(tmp_path / "k.log"), "--api-key", "sekret")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            open_routes = []
            for method, path in routes:
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
                    r = c.request(method, path, json={}, headers=headers)
                    if r.status_code != 401:
                        open_routes.append((method, path, headers))
                    else:
                        assert "API key" in r.json()["error"]["message"], r.text
                r = c.request(method, path, json={}, headers={"Authorization": "Bearer sekret"})
                assert r.status_code != 401, (method, path, r.text)  # the key opens every route
            assert open_routes == [("GET", "/health", h) for h in
                                   ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"})]
    finally:
        stop_server(srv)


# ---------------------------------------------------------------- docs/api.md, server lifecycle
def test_start_up_exits_1_when_the_port_is_taken(model_dir: str, tmp_path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = start_server(model_dir, str(tmp_path / "p.log"), "--host", "127.0.0.1",
                           "--port", str(port), wait=False)  # the last --port wins
        try:
            assert srv.proc.wait(60) == 1, srv.log()  # a hang guard, not a bar
            assert str(port) in srv.log() and "in use" in srv.log().lower(), srv.log()
        finally:
            stop_server(srv)


def test_start_up_exits_1_when_the_tokenizer_cannot_load(tmp_path) -> None:
    broken = write_tiny_model_dir(str(tmp_path / "model"))
    with open(os.path.join(broken, "tokenizer.json"), "w") as f:
        f.write("{not json")
    srv = start_server(broken, str(tmp_path / "t.log"), wait=False)
    try:
        assert srv.proc.wait(60) == 1, srv.log()
        assert "tokenizer" in srv.log().lower(), srv.log()
    finally:
        stop_server(srv)


def test_in_flight_requests_get_503_when_the_engine_dies(model_dir: str, tmp_path) -> None:
    srv = start_server(model_dir, str(tmp_path / "e.log"), env={"FAKE_ENGINE_STEP_S": "0.2"})
    out: dict[str, Any] = {}

    def long_request() -> None:
        out["r"] = httpx.post(srv.url + "/generate", json={
            "text": "hi", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}, timeout=60)

    t = threading.Thread(target=long_request)
    try:
        engine_pid = httpx.get(srv.url + "/get_server_info").json()["internal_states"][0]["pid"]
        t.start()
        deadline = time.monotonic() + 30  # a hang guard
        while httpx.get(srv.url + "/get_load").json()["num_running_reqs"] < 1:
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.05)
        os.kill(engine_pid, signal.SIGKILL)
        t.join(60)
        _err(out["r"], 503, "engine")
        assert srv.proc.wait(30) == 1, srv.log()
    finally:
        stop_server(srv)
