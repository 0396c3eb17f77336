"""Control calls are typed messages, one struct per call: they survive the wire as their own
type, an unknown or untyped one is refused at decode, and the engine dispatches on the type."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from sglang_pd.engine.control import handle_control
from sglang_pd.protocol import (
    CONTROL_CALLS,
    CheckIntegrity,
    ControlReq,
    EngineStats,
    FlushCache,
    GetLoad,
    ServerInfo,
    SetPrefillRole,
    Shutdown,
    decode_to_engine,
    encode,
)


@pytest.mark.parametrize("call", [GetLoad(call_id=1), ServerInfo(call_id=2), FlushCache(call_id=3),
                                  CheckIntegrity(call_id=4), SetPrefillRole(call_id=5, role="long"),
                                  Shutdown(call_id=6)])
def test_each_call_round_trips_as_its_own_type(call: ControlReq) -> None:
    back = decode_to_engine(encode(call))
    assert type(back) is type(call) and back == call and isinstance(back, ControlReq)
    assert back.method == msgspec.msgpack.decode(encode(call))["type"]


def test_every_call_is_on_the_engine_channel_with_a_distinct_tag() -> None:
    tags = [c.__struct_config__.tag for c in CONTROL_CALLS]
    assert len(set(tags)) == len(tags) == 6
    for cls in CONTROL_CALLS:
        kwargs: dict[str, Any] = {"role": "short"} if cls is SetPrefillRole else {}
        assert type(decode_to_engine(encode(cls(call_id=9, **kwargs)))) is cls


@pytest.mark.parametrize("raw", [{"type": "control", "call_id": 1, "method": "get_load"},  # the old form
                                 {"type": "get_loadd", "call_id": 1},
                                 {"type": "set_prefill_role", "call_id": 1},  # role missing
                                 {"type": "set_prefill_role", "call_id": 1, "role": 3}])
def test_untyped_or_malformed_calls_are_refused_at_decode(raw: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_to_engine(msgspec.msgpack.encode(raw))


class _Core:
    """The parts of EngineCore that control calls read."""

    def __init__(self, busy: bool = False) -> None:
        self.has_work = busy
        self.max_total_num_tokens = 4096
        self.allocator = SimpleNamespace(num_free=200, num_usable=256)
        self.scheduler = SimpleNamespace(num_retractions=3, flush_cache=lambda: 5)
        self.roles: list[str] = []
        self.integrity_error = ""

    def stats(self) -> EngineStats:
        return EngineStats(num_running_reqs=2, num_queue_reqs=5, token_usage=0.2, gen_throughput=12.5,
                           num_used_tokens=700, max_total_num_tokens=4096)

    def set_prefill_role(self, role: str) -> str:
        if role not in ("both", "short", "long"):
            raise ValueError(f"bad role {role!r}")
        self.roles.append(role)
        return role

    def check_integrity(self) -> None:
        if self.integrity_error:
            raise RuntimeError(self.integrity_error)


def test_engine_dispatches_on_the_call_type() -> None:
    core: Any = _Core()
    load = handle_control(core, GetLoad(call_id=7))
    assert load.call_id == 7 and load.ok
    assert (load.result["num_reqs"], load.result["num_waiting_reqs"], load.result["num_tokens"]) == (7, 5, 700)
    role = handle_control(core, SetPrefillRole(call_id=8, role="long"))
    assert role.ok and role.result == {"prefill_role": "long"} and core.roles == ["long"]
    bad = handle_control(core, SetPrefillRole(call_id=9, role="middle"))
    assert not bad.ok and "middle" in bad.error and core.roles == ["long"]
    info = handle_control(core, ServerInfo(call_id=10))
    assert info.result["num_total_pages"] == 256 and info.result["num_retractions"] == 3
    assert handle_control(core, CheckIntegrity(call_id=11)).result == {"num_free_pages": 200}
    core.integrity_error = "page 4 twice"
    assert handle_control(core, CheckIntegrity(call_id=12)).error == "page 4 twice"
    flushed = handle_control(core, FlushCache(call_id=13))
    assert flushed.ok and flushed.result == {"num_freed_pages": 5}  # the cache's unused pages
    assert not handle_control(_Core(busy=True), FlushCache(call_id=14)).ok  # type: ignore[arg-type]
    # the loop owns Shutdown; handed here, it is refused by name rather than half-done
    down = handle_control(core, Shutdown(call_id=15))
    assert not down.ok and "shutdown" in down.error
