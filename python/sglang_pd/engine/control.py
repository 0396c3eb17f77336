"""Request/response calls from the frontend into the engine (/get_load, /flush_cache ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from sglang_pd.protocol import ControlReq, ControlResp, EngineStats

if TYPE_CHECKING:
    from sglang_pd.engine.engine_core import EngineCore


def load_signals(s: EngineStats) -> dict[str, str | int | float | bool | None]:
    """/get_load: every EngineStats field under its own name (the /metrics gauge is
    sglang:<name>), plus SGLang's num_reqs / num_waiting_reqs / num_tokens spellings."""
    out: dict[str, str | int | float | bool | None] = dict(msgspec.structs.asdict(s))
    out.update(num_reqs=s.num_running_reqs + s.num_queue_reqs, num_waiting_reqs=s.num_queue_reqs,
               num_tokens=s.num_used_tokens)
    return out


def handle_control(core: EngineCore, msg: ControlReq) -> ControlResp:
    if msg.method == "get_load":
        s = core.stats()
        return ControlResp(msg.call_id, True, load_signals(s))
    if msg.method == "set_prefill_role":
        try:
            role = core.set_prefill_role(str(msg.args.get("role", "")))
        except ValueError as exc:
            return ControlResp(msg.call_id, False, {}, str(exc))
        return ControlResp(msg.call_id, True, {"prefill_role": role})
    if msg.method == "flush_cache":
        # as in SGLang: only when idle; frees every cached page no request uses
        ok = not core.has_work
        freed = core.scheduler.flush_cache() if ok else 0
        return ControlResp(msg.call_id, ok, {"num_freed_pages": freed},
                           "" if ok else "cannot flush while requests run")
    if msg.method == "check_integrity":
        try:
            core.check_integrity()
        except RuntimeError as exc:
            return ControlResp(msg.call_id, False, {}, str(exc))
        return ControlResp(msg.call_id, True, {"num_free_pages": core.allocator.num_free})
    if msg.method == "server_info":
        s = core.stats()
        return ControlResp(msg.call_id, True, {
            "max_total_num_tokens": core.max_total_num_tokens, "num_free_pages": core.allocator.num_free,
            "num_total_pages": core.allocator.num_usable, "num_retractions": core.scheduler.num_retractions,
            "gen_throughput": s.gen_throughput})
    return ControlResp(msg.call_id, False, {}, f"unknown control method {msg.method!r}")
