"""One async request function per backend, all returning a :class:`RequestResult`.

Timing is taken on the client with ``time.perf_counter``: the send time is read just before the
request is issued, and a chunk's time is when its bytes were read from the socket (see sse.py
for which chunks count).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from sglang_pd.bench.sse import (
    ProtocolError,
    StreamError,
    Tracker,
    error_text,
    fold_whole_reply,
    sse_data,
)

BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")
_ENDPOINTS = {
    "sglang": "/generate",
    "sglang-oai": "/v1/completions",
    "sglang-oai-chat": "/v1/chat/completions",
}
_MAX_ERROR_BODY = 2048  # bytes of an error body kept for the message


@dataclass
class RequestSpec:
    """One HTTP request ready to send."""

    index: int
    prompt: list[int] | str | list[dict[str, str]]  # input ids, text, or chat messages
    prompt_len: int  # prompt tokens (our count; see prompts.py)
    output_len: int  # max_new_tokens / max_tokens, with ignore_eos
    session: int = 0
    turn: int = 0


@dataclass
class RequestResult:
    """What the client observed for one request. Times are seconds."""

    index: int
    prompt_len: int
    expected_output_len: int
    output_len: int = 0  # tokens the server reports it generated
    success: bool = False
    error_kind: str = ""  # "", http_<status>, timeout, connection, stream_error, protocol, ...
    error: str = ""
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between output-carrying chunks
    e2e_s: float = 0.0
    start_s: float = 0.0  # send time, seconds since the benchmark started
    end_s: float = 0.0
    scheduled_s: float | None = None  # planned send time (trace or arrival process)
    session: int = 0
    turn: int = 0
    generated_text: str = ""
    output_ids: list[int] | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; undefined for 0 or 1 output tokens."""
        if not self.success or self.output_len <= 1:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_len - 1)


@dataclass(frozen=True)
class BackendConfig:
    backend: str
    base_url: str
    model: str = "default"
    stream: bool = True
    request_timeout_s: float = 600.0
    slo: dict[str, float] = field(default_factory=dict)  # {"ttft_ms": .., "tpot_ms": ..}
    # long prompts' TTFT SLO: prompts of at least long_threshold tokens send this ttft_ms
    slo_ttft_ms_long: float | None = None
    long_threshold: int = 0
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + _ENDPOINTS[self.backend]


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``; nested dicts merge so extra sampling params keep ours."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = (
            deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


def build_body(cfg: BackendConfig, spec: RequestSpec) -> dict[str, Any]:
    """The JSON body for ``spec``: greedy, ignore_eos, exact output length, SLO attached."""
    if cfg.backend == "sglang":
        key = "input_ids" if isinstance(spec.prompt, list) else "text"
        body: dict[str, Any] = {
            key: spec.prompt,
            "sampling_params": {
                "max_new_tokens": spec.output_len,
                "temperature": 0.0,
                "ignore_eos": True,
            },
            "stream": cfg.stream,
        }
    else:
        body = {
            "model": cfg.model,
            "max_tokens": spec.output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": cfg.stream,
        }
        if cfg.backend == "sglang-oai":
            body["prompt"] = spec.prompt
        else:
            prompt = spec.prompt
            body["messages"] = (
                prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            )
        if cfg.stream:
            body["stream_options"] = {"include_usage": True}
    if cfg.slo:
        body["slo"] = dict(cfg.slo)
    if cfg.slo_ttft_ms_long is not None and spec.prompt_len >= cfg.long_threshold:
        body["slo"] = {**body.get("slo", {}), "ttft_ms": cfg.slo_ttft_ms_long}
    return deep_merge(body, cfg.extra_body)


async def send_request(
    session: aiohttp.ClientSession, cfg: BackendConfig, spec: RequestSpec, t0: float
) -> RequestResult:
    """Send one request and time it; never raises except on cancellation."""
    res = RequestResult(
        spec.index, spec.prompt_len, spec.output_len, session=spec.session, turn=spec.turn
    )
    body = orjson.dumps(build_body(cfg, spec))
    chat = cfg.backend == "sglang-oai-chat"
    st = time.perf_counter()
    res.start_s = st - t0
    tr = Tracker(st)
    try:
        async with session.post(
            cfg.url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            if resp.status != 200:
                raw = (await resp.content.read(_MAX_ERROR_BODY)).decode(errors="replace")
                try:
                    msg = error_text(orjson.loads(raw))
                except orjson.JSONDecodeError:
                    msg = raw
                res.error_kind, res.error = f"http_{resp.status}", msg[:500]
            elif cfg.stream:
                async for now, data in sse_data(resp, 4 * spec.output_len + 64):
                    if data == b"[DONE]":
                        break
                    obj = orjson.loads(data)
                    if isinstance(obj, dict) and "error" in obj:
                        raise StreamError(error_text(obj))
                    if cfg.backend == "sglang":
                        tr.native(now, obj)
                    else:
                        tr.openai(now, obj, chat)
            else:
                fold_whole_reply(tr, orjson.loads(await resp.read()), cfg.backend)
        if not res.error_kind:
            if tr.last_t is None:
                raise ProtocolError("response carried no output tokens")
            res.success = True
            res.ttft_s, res.itl_s = tr.ttft, tr.itl
            res.output_len = tr.server_count if tr.server_count is not None else tr.count
            res.generated_text, res.output_ids = tr.text, tr.output_ids
    except asyncio.TimeoutError:
        res.error_kind, res.error = (
            "timeout",
            f"no complete reply within {cfg.request_timeout_s:g} s",
        )
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
        res.error_kind, res.error = "connection", f"{type(e).__name__}: {e}"
    except StreamError as e:
        res.error_kind, res.error = "stream_error", str(e)[:500]
    except (ProtocolError, orjson.JSONDecodeError, AttributeError, TypeError) as e:
        res.error_kind, res.error = "protocol", f"{type(e).__name__}: {e}"[:500]
    except aiohttp.ClientError as e:
        res.error_kind, res.error = "client_error", f"{type(e).__name__}: {e}"[:500]
    end = time.perf_counter()
    res.end_s = end - t0
    res.e2e_s = end - st
    return res
