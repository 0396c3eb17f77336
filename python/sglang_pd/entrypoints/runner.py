"""Running the generate requests of one HTTP call: wait, stream, abort on disconnect."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sglang_pd.entrypoints.responses import (INTERNAL_ERROR, SSE_DONE, ClientWatch, first_error,
                                             sse, wait_all_finished)
from sglang_pd.frontend.errors import ApiError
from sglang_pd.frontend.request_state import ReqState
from sglang_pd.frontend.tokenizer_manager import TokenizerManager
from sglang_pd.protocol import GenerateReq

logger = logging.getLogger(__name__)


class ClientGone(Exception):
    pass


@dataclass
class RequestRun:
    tm: TokenizerManager
    states: list[ReqState]
    watch: ClientWatch

    def close(self) -> None:
        """Abort whatever is still running (the client left or the handler failed)."""
        for state in self.states:
            if not state.finished:
                self.tm.abort(state)
        self.watch.close()

    async def finish_all(self) -> None:
        if not await wait_all_finished(self.states, self.watch):
            raise ClientGone()
        error = first_error(self.states)
        if error is not None:
            raise error

    async def first_update(self) -> None:
        """Wait for the first output before sending headers: engine rejections become HTTP
        errors instead of a 200 stream that carries an error."""
        if not await self.watch.wait(self.states[0].notify):
            raise ClientGone()
        if len(self.states) == 1:
            error = first_error(self.states)
            if error is not None:
                raise error

    async def updates(self) -> AsyncIterator[tuple[int, ReqState]]:
        """Yield (index, state) whenever a state has new output, until all finish."""
        notify = self.states[0].notify
        while True:
            notify.clear()
            for index, state in enumerate(self.states):
                if state.take_update():
                    yield index, state
            if all(s.finished for s in self.states):
                return
            if not await self.watch.wait(notify):
                return  # client gone; the caller's close() aborts the rest


async def guarded_stream(chunks: AsyncIterator[bytes], path: str) -> AsyncIterator[bytes]:
    """``chunks``, but a bug while streaming ends the stream with a final SSE error event
    (a stable message; the details go to the log) instead of a cut connection."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception:
        logger.exception("unhandled error while streaming %s", path)
        yield sse(ApiError(500, INTERNAL_ERROR).body())
        yield SSE_DONE


def start_run(request: Request, tm: TokenizerManager, reqs: list[GenerateReq],
              return_text_in_logprobs: bool = False) -> RequestRun:
    states = tm.submit(reqs, return_text_in_logprobs)
    return RequestRun(tm=tm, states=states, watch=ClientWatch(request))


async def respond(request: Request, tm: TokenizerManager, reqs: list[GenerateReq], stream: bool,
                  on_done: Callable[[RequestRun], Response],
                  chunks: Callable[[RequestRun], AsyncIterator[bytes]],
                  return_text_in_logprobs: bool = False) -> Response:
    """Submit ``reqs``; answer with ``on_done(run)`` or stream ``chunks(run)`` as SSE."""
    run = start_run(request, tm, reqs, return_text_in_logprobs)
    handed_over = False
    try:
        if not stream:
            await run.finish_all()
            return on_done(run)
        await run.first_update()

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in guarded_stream(chunks(run), request.url.path):
                    yield chunk
            finally:
                run.close()

        handed_over = True
        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    except ClientGone:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    finally:
        if not handed_over:
            run.close()
