"""Hostile input at the router (issue 35): each is answered with a JSON 4xx before any worker
sees it, and the event loop stays free (long texts are tokenized in a thread)."""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading

import orjson
import pytest

from router_helpers import GEN, raw_exchange, router_cluster
from sglang_pd_router.limits import MAX_BODY_BYTES, MAX_CHARS_PER_TOKEN, json_too_deep

pytestmark = pytest.mark.timeout(60)


def _nested(depth: int) -> object:
    obj: object = 1
    for _ in range(depth):
        obj = [obj]
    return obj


@pytest.mark.parametrize("body", [
    {"input_ids": 5}, {"input_ids": True}, {"input_ids": {"0": 1}}, {"input_ids": ["a"]},
    {"text": 5}, {"text": {"a": 1}},
])
async def test_malformed_prompts_are_400(body: dict) -> None:
    async with router_cluster() as c:
        async with c.client.post(c.url + "/generate", json=body) as r:
            assert r.status == 400, await r.text()
            assert "error" in await r.json()
        assert c.prefills[0].bodies == [] and c.decodes[0].bodies == []


async def test_completions_and_chat_shapes_are_400() -> None:
    async with router_cluster() as c:
        for path, body in (("/v1/completions", {"prompt": 5}),
                           ("/v1/completions", {"prompt": [1, "a", None]}),
                           ("/v1/chat/completions", {"messages": "hi"})):
            async with c.client.post(c.url + path, json=body) as r:
                assert r.status == 400, (path, body, await r.text())


async def test_json_nested_deeper_than_the_limit_is_400_even_in_an_ignored_field() -> None:
    async with router_cluster() as c:
        for depth in (300, 1000):
            data = orjson.dumps(GEN)[:-1] + b',"ignored":' + b"[" * depth + b"]" * depth + b"}"
            async with c.client.post(c.url + "/generate", data=data,
                                     headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400, await r.text()
                assert "deeper" in (await r.json())["error"]["message"]
        async with c.client.post(c.url + "/generate", json={**GEN, "ok": _nested(20)}) as r:
            assert r.status == 200
    assert json_too_deep(_nested(200)) and not json_too_deep(_nested(100))


async def test_a_plain_body_labelled_gzip_is_400_and_a_real_gzip_body_works() -> None:
    async with router_cluster() as c:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        async with c.client.post(c.url + "/generate", data=orjson.dumps(GEN),
                                 headers=headers) as r:
            assert r.status == 400, await r.text()
            assert "could not be decoded" in (await r.json())["error"]["message"]
        async with c.client.post(c.url + "/generate", data=gzip.compress(orjson.dumps(GEN)),
                                 headers=headers) as r:
            assert r.status == 200, await r.text()


async def test_oversized_content_length_is_refused_before_the_body_is_sent() -> None:
    async with router_cluster() as c:
        head = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10737418240\r\n\r\n")
        answer = await raw_exchange(c.port, head, read_timeout_s=3.0)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"error"' in answer


async def test_a_body_over_the_limit_is_413() -> None:
    async with router_cluster() as c:
        data = b'{"input_ids": [' + b"1," * (MAX_BODY_BYTES // 2) + b"1]}"
        async with c.client.post(c.url + "/generate", data=data) as r:
            assert r.status == 413
            assert "limit" in (await r.json())["error"]["message"]
        assert c.decodes[0].bodies == []


async def test_text_over_context_times_chars_per_token_is_400_uncounted() -> None:
    async with router_cluster() as c:
        c.service.registry.by_kind["decode"][0].context_length = 100
        counted = []
        c.service.estimator.count_texts = lambda texts: counted.append(texts) or 1
        text = "x" * (100 * MAX_CHARS_PER_TOKEN + 1)
        async with c.client.post(c.url + "/generate", json={"text": text}) as r:
            assert r.status == 400 and "context" in (await r.json())["error"]["message"]
        assert counted == [] and c.decodes[0].bodies == []


async def test_long_texts_are_tokenized_off_the_event_loop(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    async with router_cluster(tokenizer_path=str(tmp_path)) as c:
        threads = []
        real = c.service.estimator.count_texts

        def spy(texts: list[str]) -> int:
            threads.append(threading.get_ident())
            return real(texts)

        c.service.estimator.count_texts = spy
        loop_thread = threading.get_ident()
        for text in ("a a", "a " * 20000):
            async with c.client.post(c.url + "/generate", json={"text": text}) as r:
                assert r.status == 200
        assert threads[0] == loop_thread and threads[1] != loop_thread
        assert c.decodes[0].bodies[1]["text"] == "a " * 20000


async def test_client_bootstrap_fields_are_replaced_by_the_routers() -> None:
    async with router_cluster() as c:
        body = {**GEN, "bootstrap_host": "evil", "bootstrap_port": 1, "bootstrap_room": 7}
        async with c.client.post(c.url + "/generate", json=body) as r:
            assert r.status == 200
        sent = c.decodes[0].bodies[0]
        assert sent["bootstrap_host"] == "127.0.0.1" and sent["bootstrap_port"] == 9000
        assert sent["bootstrap_room"] != 7


async def test_errors_are_json_and_a_crash_logs_one_line_without_traceback(caplog) -> None:
    async with router_cluster() as c:
        async with c.client.get(c.url + "/no/such/route") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == 404

        async def boom(*_a, **_k):
            raise RuntimeError("secret internals")

        c.service.dispatcher.serve = boom
        caplog.set_level(logging.ERROR)
        for _ in range(3):
            async with c.client.post(c.url + "/generate", json=GEN) as r:
                assert r.status == 500
                assert (await r.json())["error"]["message"] == "internal router error"
        errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1 and errors[0].exc_info is None  # rate-limited, no traceback
        assert "secret internals" not in errors[0].getMessage()


async def test_health_answers_while_a_big_body_is_parsed() -> None:
    async with router_cluster() as c:
        big = orjson.dumps({"input_ids": list(range(1_500_000)),
                            "sampling_params": {"max_new_tokens": 1}})
        task = asyncio.ensure_future(c.client.post(c.url + "/generate", data=big))
        async with c.client.get(c.url + "/health") as r:
            assert r.status == 200
        resp = await task
        assert resp.status == 200
        resp.release()
