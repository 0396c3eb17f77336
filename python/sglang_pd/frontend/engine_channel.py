"""The frontend's two ZMQ sockets to the engine (one process each side, DESIGN.md section 2).

Sending uses a plain (synchronous) PUSH socket with an unbounded queue: a send never
blocks, which lets aborts go out from ``finally`` blocks of cancelled handlers. Receiving is an
asyncio PULL socket that only the TokenizerManager's receive loop reads.
"""

from __future__ import annotations

import msgspec
import zmq
import zmq.asyncio

from sglang_pd.frontend.errors import ApiError
from sglang_pd.protocol import encode
from sglang_pd.server_args import ServerArgs


class EngineChannel:
    def __init__(self, server_args: ServerArgs) -> None:
        self.server_args = server_args
        self._sync_ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._async_ctx: zmq.asyncio.Context | None = None
        self._push: zmq.Socket[bytes] | None = None
        self._pull: zmq.asyncio.Socket | None = None

    def open(self) -> None:
        self._sync_ctx = zmq.Context()
        self._push = self._sync_ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(self.server_args.frontend_to_engine_addr)
        self._async_ctx = zmq.asyncio.Context()
        self._pull = self._async_ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        self.server_args.ensure_ipc_dir()
        self._pull.bind(self.server_args.engine_to_frontend_addr)

    def close(self) -> None:
        for sock in (self._push, self._pull):
            if sock is not None:
                sock.close(linger=0)
        for ctx in (self._sync_ctx, self._async_ctx):
            if ctx is not None:
                ctx.term()
        self._push = self._pull = None
        self._sync_ctx = self._async_ctx = None

    @property
    def connected(self) -> bool:
        return self._push is not None

    def send(self, msg: msgspec.Struct) -> None:
        if self._push is None:
            raise ApiError(503, "the server is not connected to the engine")
        self._push.send(encode(msg), copy=False)

    async def recv(self) -> bytes:
        assert self._pull is not None
        return await self._pull.recv()
