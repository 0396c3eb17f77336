"""HTTP plumbing shared by the route modules: JSON/SSE encoding, body parsing, waiting."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from sglang_pd.frontend.errors import ApiError, bad_request
from sglang_pd.frontend.limits import MAX_BODY_BYTES
from sglang_pd.frontend.request_state import ReqState

SSE_DONE = b"data: [DONE]\n\n"
# what clients see of a bug: stable text, the details go to the server log
INTERNAL_ERROR = "internal server error (see the server log)"


class OrjsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def error_response(error: ApiError) -> OrjsonResponse:
    return OrjsonResponse(error.body(), status_code=error.status, headers=error.headers or None)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, refused with 413 as soon as it exceeds ``limit`` (declared or streamed)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body has {int(declared)} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request) -> dict[str, Any]:
    raw = await read_body(request)
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


class ClientWatch:
    """Notices when the HTTP client goes away, so its requests can be aborted.

    After the body is read, the ASGI receive channel yields ``http.disconnect`` once the
    client closes the connection; a background task waits for exactly that.
    """

    def __init__(self, request: Request) -> None:
        self._task = asyncio.create_task(self._watch(request))

    @staticmethod
    async def _watch(request: Request) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    @property
    def disconnected(self) -> bool:
        return self._task.done()

    async def wait(self, event: asyncio.Event, timeout: float | None = None) -> bool:
        """Wait for ``event``; False if the client disconnected (or on timeout) first."""
        if event.is_set():
            return True
        if self.disconnected:
            return False
        waiter = asyncio.ensure_future(event.wait())
        try:
            done, _ = await asyncio.wait({waiter, self._task}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiter.done():  # also when we are cancelled (Starlette on disconnect)
                waiter.cancel()
        return waiter in done

    def close(self) -> None:
        self._task.cancel()


async def wait_all_finished(states: list[ReqState], watch: ClientWatch | None,
                            timeout: float | None = None) -> bool:
    """Block until every state finished; False if the client left (or timeout) first."""
    notify = states[0].notify
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while not all(s.finished for s in states):
        notify.clear()
        left = None if deadline is None else max(deadline - loop.time(), 0.0)
        if watch is not None:
            if not await watch.wait(notify, left):
                return False
        else:
            try:
                await asyncio.wait_for(notify.wait(), left)
            except asyncio.TimeoutError:
                return False
    return True


def first_error(states: list[ReqState]) -> ApiError | None:
    for state in states:
        if state.finished and state.error_status:
            return ApiError(state.error_status, state.error_message)
    return None


def list_or_item(value: Any, n: int, index: int, name: str) -> Any:
    """Batch requests may give a per-prompt list for a field, or one value for all."""
    if isinstance(value, list):
        if len(value) != n:
            raise bad_request(f"{name} has {len(value)} entries but there are {n} prompts")
        return value[index]
    return value
