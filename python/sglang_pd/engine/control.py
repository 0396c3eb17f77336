"""Request/response calls from the frontend into the engine (/get_load, /flush_cache ...).

Each call is its own typed message (protocol.ControlReq subclasses); ``handle_control``
dispatches on the type. ``Shutdown`` is the engine loop's own business (engine_process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from sglang_pd.protocol import (
    CheckIntegrity,
    ControlReq,
    ControlResp,
    EngineStats,
    FlushCache,
    GetLoad,
    ServerInfo,
    SetPrefillRole,
)

if TYPE_CHECKING:
    from sglang_pd.engine.engine_core import EngineCore


def load_signals(s: EngineStats) -> dict[str, str | int | float | bool | None]:
    """/get_load: every EngineStats field under its own name (the /metrics gauge is
    sglang:<name>), plus SGLang's num_reqs / num_waiting_reqs / num_tokens spellings."""
    out: dict[str, str | int | float | bool | None] = dict(msgspec.structs.asdict(s))
    out.update(num_reqs=s.num_running_reqs + s.num_queue_reqs, num_waiting_reqs=s.num_queue_reqs,
               num_tokens=s.num_used_tokens)
    return out


def _get_load(core: EngineCore, msg: GetLoad) -> ControlResp:
    return ControlResp(msg.call_id, True, load_signals(core.stats()))


def _set_prefill_role(core: EngineCore, msg: SetPrefillRole) -> ControlResp:
    try:
        role = core.set_prefill_role(msg.role)
    except ValueError as exc:
        return ControlResp(msg.call_id, False, {}, str(exc))
    return ControlResp(msg.call_id, True, {"prefill_role": role})


def _flush_cache(core: EngineCore, msg: FlushCache) -> ControlResp:
    # as in SGLang: only when idle; frees every cached page no request uses
    ok = not core.has_work
    freed = core.scheduler.flush_cache() if ok else 0
    return ControlResp(msg.call_id, ok, {"num_freed_pages": freed},
                       "" if ok else "cannot flush while requests run")


def _check_integrity(core: EngineCore, msg: CheckIntegrity) -> ControlResp:
    try:
        core.check_integrity()
    except RuntimeError as exc:
        return ControlResp(msg.call_id, False, {}, str(exc))
    return ControlResp(msg.call_id, True, {"num_free_pages": core.allocator.num_free})


def _server_info(core: EngineCore, msg: ServerInfo) -> ControlResp:
    s = core.stats()
    return ControlResp(msg.call_id, True, {
        "max_total_num_tokens": core.max_total_num_tokens, "num_free_pages": core.allocator.num_free,
        "num_total_pages": core.allocator.num_usable, "num_retractions": core.scheduler.num_retractions,
        "gen_throughput": s.gen_throughput})


_HANDLERS: dict[type[ControlReq], Callable[[EngineCore, Any], ControlResp]] = {
    GetLoad: _get_load, SetPrefillRole: _set_prefill_role, FlushCache: _flush_cache,
    CheckIntegrity: _check_integrity, ServerInfo: _server_info}


def handle_control(core: EngineCore, msg: ControlReq) -> ControlResp:
    handler = _HANDLERS.get(type(msg))
    if handler is None:
        return ControlResp(msg.call_id, False, {}, f"unknown control call {msg.method!r}")
    return handler(core, msg)
