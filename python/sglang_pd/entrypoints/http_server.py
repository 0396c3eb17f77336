"""The FastAPI application: app factory, API-key guard, error handlers, admin routes."""

from __future__ import annotations

import dataclasses
import hmac
import random
import logging
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_pd import __version__
from sglang_pd.entrypoints import native, openai_api
from sglang_pd.entrypoints.context import ServerContext
from sglang_pd.entrypoints.responses import (INTERNAL_ERROR, OrjsonResponse, error_response,
                                             read_json_object, wait_all_finished)
from sglang_pd.frontend.errors import ApiError, bad_request
from sglang_pd.frontend.inputs import build_generate_req, new_rid, strict_bool
from sglang_pd.frontend.metrics import CONTENT_TYPE
from sglang_pd.frontend.tokenizer_manager import TokenizerManager
from sglang_pd.protocol import (FAKE_BOOTSTRAP_HOST, BootstrapInfo, FlushCache, GetLoad, SamplingParams,
                                ServerInfo, SetPrefillRole)
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)

_OPEN_PATHS = frozenset({"/health"})
HEALTH_GENERATE_TIMEOUT_S = 20.0


class ApiKeyMiddleware:
    """``Authorization: Bearer KEY`` on every route but /health (pure ASGI: unlike
    BaseHTTPMiddleware it leaves streaming and disconnect detection alone)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        error = ApiError(401, "Unauthorized: missing or wrong API key "
                              "(send 'Authorization: Bearer <key>')")
        await error_response(error)(scope, receive, send)


async def _api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(_: Request, exc: Exception) -> Response:
    # 404 / 405 from routing, in the same {"error": ...} shape as everything else.
    assert isinstance(exc, StarletteHTTPException)
    return error_response(ApiError(exc.status_code, str(exc.detail)))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    # the details go to the log; clients get a stable message (internals are not an API)
    logger.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(ApiError(500, INTERNAL_ERROR))


def _ctx(request: Request) -> ServerContext:
    return request.app.state.ctx


def _public_args(server_args: ServerArgs) -> dict[str, Any]:
    args = dataclasses.asdict(server_args)
    if args.get("api_key"):
        args["api_key"] = "<redacted>"
    return args


def _add_admin_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        tm = _ctx(request).tm
        if tm.engine_dead or not tm.engine_alive():
            return error_response(ApiError(503, "the engine process is not running"))
        stalled = tm.stall_reason()
        if stalled is not None:
            logger.error("health check failed: %s", stalled)
            return error_response(ApiError(503, stalled))
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        """A real 1-token generation through the engine."""
        ctx = _ctx(request)
        # PD servers run it locally, without a transfer: the fake bootstrap host tells the
        # engine so (as SGLang's PD servers do), so no peer is needed for a health check
        bootstrap = None
        if ctx.server_args.disaggregation_mode != "colocated":
            bootstrap = BootstrapInfo(FAKE_BOOTSTRAP_HOST, ctx.server_args.disaggregation_bootstrap_port,
                                      random.randrange(2**63))
        req = build_generate_req(input_ids=[0], engine=ctx.engine_info,
                                 sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
                                 rid=f"HEALTH_CHECK_{new_rid()}", bootstrap=bootstrap)
        states = ctx.tm.submit([req])
        if not await wait_all_finished(states, None, HEALTH_GENERATE_TIMEOUT_S):
            ctx.tm.abort(states[0])
            raise ApiError(503, f"health generation did not finish within "
                                f"{HEALTH_GENERATE_TIMEOUT_S:g}s")
        if states[0].error_status:
            raise ApiError(503, f"health generation failed: {states[0].error_message}")
        return Response(status_code=200)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info(request: Request) -> Response:
        ctx = _ctx(request)
        args = ctx.server_args
        return OrjsonResponse({"model_path": args.model_path,
                               "tokenizer_path": args.tokenizer_path or args.model_path,
                               "is_generation": True,
                               "preferred_sampling_params": None,
                               "served_model_name": ctx.model_name,
                               "architectures": [ctx.engine_info.architecture]
                               if ctx.engine_info.architecture else None})

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info(request: Request) -> Response:
        ctx = _ctx(request)
        internal: dict[str, Any] = {}
        try:
            internal.update((await ctx.tm.control(ServerInfo(), timeout=5.0)).result)
        except ApiError as e:
            internal["error"] = e.message
        if ctx.tm.last_stats is not None:
            internal["last_stats"] = msgspec.to_builtins(ctx.tm.last_stats)
        return OrjsonResponse({**_public_args(ctx.server_args), "version": __version__,
                               "engine_info": msgspec.to_builtins(ctx.engine_info),
                               "internal_states": [internal]})

    @app.get("/get_load")
    async def get_load(request: Request) -> Response:
        ctx = _ctx(request)
        resp = await ctx.tm.control(GetLoad(), timeout=5.0)
        if not resp.ok:
            raise ApiError(503, f"get_load failed in the engine: {resp.error}")
        return OrjsonResponse({**resp.result, "num_frontend_reqs": len(ctx.tm.states)})

    @app.post("/set_prefill_role")
    async def set_prefill_role(request: Request) -> Response:
        """The router's pool controller moves this prefill instance between the short and
        long pools ({"role": "short" | "long" | "both"}); needs --prefill-queues dual."""
        role = (await read_json_object(request)).get("role")
        if role not in ("short", "long", "both"):
            raise bad_request(f"'role' must be one of short, long, both; got {role!r}")
        resp = await _ctx(request).tm.control(SetPrefillRole(role=role), timeout=5.0)
        if not resp.ok:
            raise bad_request(resp.error)
        logger.info("prefill role set to %s", resp.result.get("prefill_role"))
        return OrjsonResponse(resp.result)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        resp = await _ctx(request).tm.control(FlushCache(), timeout=30.0)
        if not resp.ok:
            raise bad_request(f"cache not flushed: {resp.error or 'requests are running'}")
        return PlainTextResponse("Cache flushed.\n")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await read_json_object(request)
        rid, abort_all = body.get("rid"), strict_bool(body.get("abort_all"), "abort_all")
        if not abort_all and (not isinstance(rid, str) or not rid):
            raise bad_request("give 'rid' (a request id) or 'abort_all': true")
        _ctx(request).tm.abort_rid(rid if isinstance(rid, str) and not abort_all else "")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(_ctx(request).tm.metrics.render(), media_type=CONTENT_TYPE)


def create_app(server_args: ServerArgs, tokenizer_manager: TokenizerManager) -> FastAPI:
    """The HTTP app; the caller starts/stops the TokenizerManager around serving."""
    app = FastAPI(title="sglang-pd", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ctx = ServerContext(server_args=server_args, tm=tokenizer_manager)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    if server_args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=server_args.api_key)
    _add_admin_routes(app)
    app.include_router(native.router)
    app.include_router(openai_api.router)
    return app
