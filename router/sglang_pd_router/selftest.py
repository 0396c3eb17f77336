"""Replay hostile requests against a live router and print a pass/fail table (issue 35).

    python -m sglang_pd_router.selftest http://127.0.0.1:30000 [--api-key K] [--admin-api-key K]

Each case says what it sends and which answer a hardened router gives. Nothing here needs a
model: cases that reach the workers ask for one token. Exit status 1 when any case fails.
The slow-client cases wait out the router's idle and body timeouts (defaults 15 s and 30 s;
give the router's values if they differ).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from collections.abc import Awaitable, Callable
from urllib.parse import urlparse

import aiohttp
import orjson

from .limits import MAX_BODY_BYTES

ONE_TOKEN = {"sampling_params": {"max_new_tokens": 1, "temperature": 0}}


@dataclass
class Case:
    name: str
    sends: str
    expect: str
    run: Callable[[], Awaitable[str]]  # what happened, as compared with ``expect``
    ok: Callable[[str], bool]
    got: str = ""
    passed: bool = False


class SelfTest:
    def __init__(self, url: str, api_key: str | None, admin_key: str | None,
                 idle_timeout_s: float, body_timeout_s: float) -> None:
        self.url = url.rstrip("/")
        parsed = urlparse(self.url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.client_auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.admin_auth = ({"Authorization": f"Bearer {admin_key or api_key}"}
                           if admin_key or api_key else {})
        self.api_key = api_key
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.session: aiohttp.ClientSession | None = None

    async def status(self, method: str, path: str, data: bytes | None = None,
                     headers: dict[str, str] | None = None, auth: bool = True) -> str:
        assert self.session is not None
        hdrs = {"Content-Type": "application/json", **(self.client_auth if auth else {}),
                **(headers or {})}
        async with self.session.request(method, self.url + path, data=data, headers=hdrs,
                                        timeout=aiohttp.ClientTimeout(total=120)) as r:
            body = await r.read()
            if r.status >= 400:
                try:
                    orjson.loads(body)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    return f"{r.status} (not a JSON error body)"
            return str(r.status)

    async def raw(self, data: bytes, wait_s: float) -> str:
        """Send raw bytes; the status line answered, or 'closed' / 'open' after ``wait_s``."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        head, sep, rest = data.partition(b"\r\n")  # the key goes right after the request line
        auth = "".join(f"{k}: {v}\r\n" for k, v in self.client_auth.items()).encode()
        writer.write(head + sep + auth + rest)
        await writer.drain()
        try:
            first = await asyncio.wait_for(reader.read(4096), wait_s)
        except asyncio.TimeoutError:
            return "open"
        except ConnectionError:
            return "closed"
        finally:
            writer.close()
        return first.split(b"\r\n", 1)[0].decode(errors="replace")[9:12] if first else "closed"

    async def health_during_big_bodies(self) -> str:
        big_ids = b'{"input_ids": [' + b"1," * (MAX_BODY_BYTES // 2 - 64) + b'1]}'
        big_text = orjson.dumps({"text": "word " * (3 << 20), **ONE_TOKEN})
        loads = [asyncio.ensure_future(self.status("POST", "/generate", big_ids)),
                 asyncio.ensure_future(self.status("POST", "/generate", big_text))]
        await asyncio.sleep(0.05)
        worst = 0.0
        for _ in range(10):
            t0 = time.perf_counter()
            await self.status("GET", "/health", auth=False)
            worst = max(worst, time.perf_counter() - t0)
            if all(t.done() for t in loads):
                break
        await asyncio.gather(*loads, return_exceptions=True)
        return f"{worst * 1000:.0f} ms"

    def cases(self) -> list[Case]:
        gen = lambda body, **kw: lambda: self.status("POST", "/generate", orjson.dumps(body), **kw)  # noqa: E731
        is_ = lambda *codes: lambda got: got in codes  # noqa: E731
        deep = orjson.dumps(ONE_TOKEN)[:-1] + b',"x":' + b"[" * 300 + b"]" * 300 + b"}"
        out = [
            Case("health", "GET /health (no key)", "200",
                 lambda: self.status("GET", "/health", auth=False), is_("200")),
            Case("generate", "POST /generate one token", "200",
                 gen({"text": "Hello", **ONE_TOKEN}), is_("200")),
            Case("ids-int", '{"input_ids": 5}', "400", gen({"input_ids": 5}), is_("400")),
            Case("ids-bool", '{"input_ids": true}', "400", gen({"input_ids": True}), is_("400")),
            Case("ids-dict", '{"input_ids": {"0": 1}}', "400", gen({"input_ids": {"0": 1}}),
                 is_("400")),
            Case("text-type", '{"text": 5}', "400", gen({"text": 5}), is_("400")),
            Case("batch", '{"text": ["a", "b"]}', "400", gen({"text": ["a", "b"]}), is_("400")),
            Case("not-json", "body 'nope'", "400",
                 lambda: self.status("POST", "/generate", b"nope"), is_("400")),
            Case("array", "body [1, 2]", "400",
                 lambda: self.status("POST", "/generate", b"[1, 2]"), is_("400")),
            Case("deep-json", "300 nested lists in an ignored field", "400",
                 lambda: self.status("POST", "/generate", deep), is_("400")),
            Case("bad-gzip", "plain JSON labelled Content-Encoding: gzip", "400",
                 lambda: self.status("POST", "/generate", orjson.dumps(ONE_TOKEN),
                                     {"Content-Encoding": "gzip"}), is_("400")),
            Case("huge-declared", "Content-Length: 10737418240, no body", "413",
                 lambda: self.raw(b"POST /generate HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 10737418240\r\n\r\n", 10), is_("413")),
            Case("huge-body", f"{MAX_BODY_BYTES + 1} bytes of JSON", "413",
                 lambda: self.status("POST", "/generate", b" " * (MAX_BODY_BYTES + 1)),
                 is_("413")),
            Case("huge-text", "a 15 MiB text (over any context x 32 chars)", "400",
                 gen({"text": "x" * (15 << 20), **ONE_TOKEN}), is_("400")),
            Case("health-under-load", "/health while 16 MiB ids and 15 MiB text are in flight",
                 "< 1000 ms", self.health_during_big_bodies,
                 lambda got: got.endswith(" ms") and float(got.split()[0]) < 1000),
            Case("no-route", "GET /nope", "404",
                 lambda: self.status("GET", "/nope"), is_("404")),
            Case("workers-open", "GET /workers without a key", "401|403",
                 lambda: self.status("GET", "/workers", auth=False), is_("401", "403")),
            Case("slow-headers", "headers trickled, never finished", "closed",
                 lambda: self.raw(b"POST /generate HTTP/1.1\r\nHost: x\r\n",
                                  self.idle_timeout_s * 1.5 + 2), is_("closed")),
            Case("slow-body", "Content-Length 100, 10 bytes sent", "408",
                 lambda: self.raw(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100"
                                  b"\r\n\r\n{\"text\": ", self.body_timeout_s * 1.5 + 2),
                 is_("408")),
        ]
        if self.admin_auth:
            add = lambda url: lambda: self.status(  # noqa: E731
                "POST", "/workers", orjson.dumps({"url": url, "kind": "decode"}),
                self.admin_auth)
            out += [Case("bad-url", "POST /workers http://a b:1", "400", add("http://a b:1"),
                         is_("400")),
                    Case("bad-port", "POST /workers http://127.0.0.1:99999", "400",
                         add("http://127.0.0.1:99999"), is_("400")),
                    Case("self", "POST /workers <this router>", "400", add(self.url),
                         is_("400"))]
        if self.api_key:
            out += [Case("no-key", "POST /generate without the key", "401",
                         gen({"text": "Hi", **ONE_TOKEN}, auth=False), is_("401")),
                    Case("models-no-key", "GET /v1/models without the key", "401",
                         lambda: self.status("GET", "/v1/models", auth=False), is_("401")),
                    Case("metrics-no-key", "GET /metrics without the key", "401",
                         lambda: self.status("GET", "/metrics", auth=False), is_("401"))]
        return out

    async def run(self) -> list[Case]:
        async with aiohttp.ClientSession() as self.session:
            cases = self.cases()

            async def one(case: Case) -> None:
                try:
                    case.got = await case.run()
                except Exception as e:  # noqa: BLE001 a crash or a hang of the router is a failure
                    case.got = f"{type(e).__name__}"
                case.passed = case.ok(case.got)

            slow = [c for c in cases if c.name.startswith("slow-")]
            slow_task = asyncio.gather(*(one(c) for c in slow))
            for case in cases:
                if case not in slow:
                    await one(case)
            await slow_task
        return cases


def print_table(cases: list[Case]) -> None:
    rows = [("case", "sends", "expected", "got", "result")] + [
        (c.name, c.sends, c.expect, c.got, "pass" if c.passed else "FAIL") for c in cases]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"{sum(c.passed for c in cases)}/{len(cases)} passed")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_pd_router.selftest",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("--api-key", default=None)
    p.add_argument("--admin-api-key", default=None)
    p.add_argument("--client-idle-timeout-secs", type=float, default=15.0,
                   help="the router's setting (the slow-header case waits 1.5x this + 2 s)")
    p.add_argument("--body-timeout-secs", type=float, default=30.0,
                   help="the router's setting (the slow-body case waits 1.5x this + 2 s)")
    args = p.parse_args(argv)
    test = SelfTest(args.url, args.api_key, args.admin_api_key, args.client_idle_timeout_secs,
                    args.body_timeout_secs)
    cases = asyncio.run(test.run())
    print_table(cases)
    sys.exit(0 if all(c.passed for c in cases) else 1)


if __name__ == "__main__":
    main()
