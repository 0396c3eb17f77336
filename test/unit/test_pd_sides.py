"""PrefillSide / DecodeSide (engine/pd_prefill.py, pd_decode.py) over FakeKVTransport and real
loopback bootstrap sockets, without a model: a fake engine holds a real Scheduler and page
allocator, applies the sides' events as EngineCore does, and "runs" prefill by advancing KV
lengths. Every failure path must give every page back."""

from __future__ import annotations

import ast
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
import torch
from sglang_pd.core.page_allocator import PageAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ReqState
from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.transfer.fake import FakeFabric, FakeKVTransport
from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.engine.pd import NullPD, PDHooks
from sglang_pd.engine.pd_decode import DecodeSide
from sglang_pd.engine.pd_events import PDEvent
from sglang_pd.engine.pd_prefill import PrefillSide
from sglang_pd.engine.request import Req
from sglang_pd.protocol import BootstrapInfo, EngineStats, GenerateReq, SamplingParams
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy

pytestmark = pytest.mark.timeout(60)
PAGE = 4
NUM_PAGES = 24
ENVS = DisaggEnvs(bootstrap_timeout=30, waiting_timeout=30, heartbeat_interval=1.0, heartbeat_max_failure=2)


@dataclass
class FakeEngine:
    """EngineCore's side of the PD hooks, with a real Scheduler and allocator: it applies the
    sides' events with EngineCore._apply; the sides never see it."""

    whole_prompt: bool
    page_size: int = PAGE
    now: float = 0.0
    pd: PDHooks | None = None
    answers: dict[str, tuple[dict, int]] = field(default_factory=dict)
    streamed: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cfg = PolicyConfig(page_size=PAGE, chunked_prefill_size=8, max_prefill_tokens=8)
        self.scheduler = Scheduler(PageAllocator(NUM_PAGES), cfg, FcfsPrefillPolicy(cfg),
                                   ContinuousDecodePolicy(cfg), whole_prompt_pages=self.whole_prompt)

    def apply(self, events: list[PDEvent]) -> None:
        """The engine's own event application, run on this fake (its scheduler, finish and
        accept_token), so these tests cover EngineCore._apply too."""
        EngineCore._apply(self, events, self.now)  # type: ignore[arg-type]

    def poll(self, now: float | None = None) -> None:
        assert self.pd is not None
        self.apply(self.pd.poll(self.now if now is None else now))

    def finish(self, req: Req, reason: dict, status: int = 0) -> None:
        if req.finish_reason is not None:
            return
        req.finish_reason = reason
        req.state = ReqState.FINISHED
        self.scheduler.remove(req)
        assert self.pd is not None
        self.pd.forget(req)
        self.answers[req.rid] = (reason, status)

    def accept_token(self, req: Req, tok: int, logprob: float | None, top: list | None, now: float,
                     first: bool) -> None:
        req.output_ids.append(tok)
        assert self.pd is not None
        if first:
            events = self.pd.on_first_token(req, logprob, top, now)
            if events:
                self.apply(events)
                return
        self.streamed.setdefault(req.rid, []).append(tok)

    def run_prefill(self) -> None:
        """One scheduler step with a pretend forward: chunks advance, finished prompts sample 5."""
        step = self.scheduler.schedule(self.now)
        assert step is not None
        done = set(self.scheduler.after_extend(step.plan))
        for r, _ in step.plan:
            if r not in done:
                self.apply(self.pd.on_chunk(r, self.now))  # type: ignore[union-attr]
        for r in done:
            self.accept_token(r, 5, None, None, self.now, first=True)

    def pages_conserved(self) -> None:
        self.scheduler.check_integrity()


def _msg(rid: str, room: int, port: int, prompt_len: int = 10, host: str = "127.0.0.1") -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=list(range(1, prompt_len + 1)),
                       sampling_params=SamplingParams(max_new_tokens=4),
                       bootstrap=BootstrapInfo(host=host, port=port, room=room))


def _admit(eng: FakeEngine, msg: GenerateReq) -> Req:
    req = Req.from_msg(msg, eng.now)
    assert eng.pd is not None
    admitted = eng.pd.admit(req, msg, eng.now)
    assert not isinstance(admitted, str), admitted
    eng.apply([admitted])
    return req


@pytest.fixture
def pair():
    fab = FakeFabric()
    def buf() -> torch.Tensor:
        return torch.zeros(2, 2, NUM_PAGES, PAGE, 2, 8)

    p_eng, d_eng = FakeEngine(whole_prompt=True), FakeEngine(whole_prompt=False)
    pm = KVSenderManager(FakeKVTransport("prefill", buf(), fab), envs=ENVS, bootstrap_host="127.0.0.1",
                         bootstrap_port=0)
    dm = KVReceiverManager(FakeKVTransport("decode", buf(), fab), envs=ENVS)
    p_eng.pd = PrefillSide(p_eng.scheduler, PAGE, pm)
    d_eng.pd = DecodeSide(d_eng.scheduler, PAGE, dm, reserved_pages=0, max_running=8)
    yield p_eng, d_eng, pm.server.port, fab
    p_eng.pd.close()
    d_eng.pd.close()


def _poll_until(engines: list[FakeEngine], cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in engines:
            e.poll()
        if cond():
            return
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


def _all_free(*engines: FakeEngine) -> None:
    for e in engines:
        e.pages_conserved()
        assert e.scheduler.allocator.num_free == e.scheduler.allocator.num_usable


def _schedulable(p_eng: FakeEngine, d_eng: FakeEngine, p_req: Req) -> None:
    """Poll both sides until decode's Register has made ``p_req`` schedulable on prefill."""
    _poll_until([p_eng, d_eng], lambda: p_req in p_eng.scheduler.waiting, "decode's Register")


def _nothing_held(p_eng: FakeEngine) -> None:
    """Prefill keeps no trace of any request: no room, no bootstrapping entry, no page."""
    side = p_eng.pd
    assert isinstance(side, PrefillSide)
    assert not side.rooms and not side.bootstrapping and not side.started_at and not side.mgr.rooms
    assert not p_eng.scheduler.all_reqs()
    _all_free(p_eng)


def test_null_pd_queues_requests() -> None:
    eng = FakeEngine(whole_prompt=False)
    eng.pd = NullPD()
    msg = GenerateReq(rid="a", input_ids=[1, 2, 3], sampling_params=SamplingParams())
    req = _admit(eng, msg)
    assert eng.scheduler.waiting == [req] and not eng.pd.has_pending


def test_transfer_success_parks_then_runs_on_decode(pair) -> None:
    p_eng, d_eng, port, _ = pair
    msg = _msg("a", room=7, port=port, prompt_len=10)
    p_req, d_req = _admit(p_eng, msg), _admit(d_eng, msg)
    assert d_req in d_eng.scheduler.parked and d_req.pages == []  # waits for pre-allocation
    d_eng.poll(0.0)
    assert len(d_req.pages) == 3  # 10 tokens / 4 per page, registered with prefill
    _schedulable(p_eng, d_eng, p_req)
    p_eng.run_prefill()  # chunk of 8: whole-prompt pages allocated, first chunk handed off
    assert len(p_req.pages) == 3 and p_req in p_eng.scheduler.waiting
    p_eng.run_prefill()  # last chunk: first token sampled, request parked with its pages
    assert p_req in p_eng.scheduler.parked and p_req.state is ReqState.PARKED
    p_eng.pages_conserved()
    _poll_until([p_eng, d_eng], lambda: "a" in p_eng.answers and d_req in d_eng.scheduler.running, "transfer")
    assert p_eng.answers["a"] == ({"type": "length", "length": 1}, 0)
    assert d_req.kv_len == 10 and d_req.output_ids == [5] and d_eng.streamed["a"] == [5]
    _all_free(p_eng)
    d_eng.finish(d_req, {"type": "length"})
    _all_free(d_eng)


def test_decode_abort_quarantines_pages_until_prefill_confirms(pair) -> None:
    p_eng, d_eng, port, _ = pair
    msg = _msg("a", room=8, port=port)
    p_req = _admit(p_eng, msg)
    d_req = _admit(d_eng, msg)
    d_eng.poll(0.0)
    _schedulable(p_eng, d_eng, p_req)
    p_eng.run_prefill()  # first chunk in flight
    _poll_until([p_eng, d_eng], lambda: d_eng.pd.mgr.rooms[8].state.acked_at is not None, "ack")
    d_eng.pd.abort(d_req, 0.1)
    d_eng.finish(d_req, {"type": "abort"})
    assert len(d_eng.scheduler.quarantine[8]) == 3 and d_req.pages == []
    assert d_eng.scheduler.allocator.num_free == d_eng.scheduler.allocator.num_usable - 3
    # a new request may not reuse the room while prefill may still write into those pages
    again = _msg("b", room=8, port=port)
    err = d_eng.pd.admit(Req.from_msg(again, 0.1), again, 0.1)
    assert isinstance(err, str) and "winding down" in err
    d_eng.pages_conserved()
    _poll_until([p_eng, d_eng], lambda: "a" in p_eng.answers and not d_eng.scheduler.quarantine, "abort ack")
    assert p_eng.answers["a"][1] == 502  # prefill's request failed with the transfer
    _all_free(p_eng, d_eng)


def test_prefill_abort_fails_decode_room(pair) -> None:
    p_eng, d_eng, port, _ = pair
    msg = _msg("a", room=9, port=port)
    p_req = _admit(p_eng, msg)
    _admit(d_eng, msg)
    d_eng.poll(0.0)
    _schedulable(p_eng, d_eng, p_req)
    p_eng.run_prefill()
    p_eng.pd.abort(p_req, 0.1)
    p_eng.finish(p_req, {"type": "abort"})
    _all_free(p_eng)
    _poll_until([p_eng, d_eng], lambda: "a" in d_eng.answers and not d_eng.scheduler.quarantine, "decode fail")
    reason, status = d_eng.answers["a"]  # the fault table: decode 502 "prefill aborted room ..."
    assert status == 502 and "prefill aborted" in reason["message"], reason
    _all_free(d_eng)


def test_decode_waiting_timeout_fails_and_frees(pair) -> None:
    p_eng, d_eng, port, _ = pair
    msg = _msg("a", room=10, port=port)
    _admit(p_eng, msg)
    _admit(d_eng, msg)  # prefill never computes it: decode's KV never comes
    d_eng.poll(0.0)
    _poll_until([p_eng, d_eng], lambda: d_eng.pd.mgr.rooms[10].state.acked_at is not None, "ack")
    d_eng.now = ENVS.waiting_timeout + 1.0
    _poll_until([d_eng], lambda: "a" in d_eng.answers, "waiting timeout")
    assert "KV transfer failed" in d_eng.answers["a"][0]["message"]
    p_eng.now = d_eng.now
    _poll_until([p_eng, d_eng], lambda: not d_eng.scheduler.quarantine, "quarantine release", timeout=10)
    _all_free(d_eng)


def test_prefill_peer_loss_fails_decode_room(pair) -> None:
    p_eng, d_eng, port, fab = pair
    msg = _msg("a", room=11, port=port)
    _admit(d_eng, msg)
    d_eng.poll(0.0)
    _poll_until([p_eng, d_eng], lambda: d_eng.pd.mgr.rooms[11].state.acked_at is not None, "ack")
    p_eng.pd.close()  # the prefill server is gone: no heartbeat replies
    fab.kill("prefill")
    for step in range(1, 41):  # fake time: 20 s, far past the heartbeats' 2 x 1 s
        d_eng.now = step * 0.5
        d_eng.poll(d_eng.now)
        if "a" in d_eng.answers:
            break
        time.sleep(0.005)
    assert "a" in d_eng.answers, "the room never failed"
    reason, status = d_eng.answers["a"]  # the fault table: decode 502 "missed N heartbeats"
    assert status == 502 and "missed" in reason["message"], reason
    assert not d_eng.scheduler.quarantine  # decode frees at once: nobody is left to write
    _all_free(d_eng)


def test_bad_bootstrap_host_fails_only_that_room(pair) -> None:
    """Issue 22 item 1: the ZMQ connect to "x y" raised inside poll and killed the engine."""
    _, d_eng, port, _ = pair
    bad, good = _msg("bad", room=1, port=port, host="x y"), _msg("good", room=2, port=port)
    err = d_eng.pd.admit(Req.from_msg(bad, 0.0), bad, 0.0)
    assert isinstance(err, str) and "not a valid hostname" in err  # a 400 at admission
    good_req = _admit(d_eng, good)
    d_eng.poll(0.0)
    assert good_req.bootstrap_room in d_eng.pd.transferring  # the other request went on
    d_eng.pages_conserved()


def test_unreachable_prefill_fails_the_room_and_frees_its_pages(pair) -> None:
    """docs/disaggregation.md, fault table: a wrong bootstrap port -> decode's heartbeats go
    unanswered -> 502 "missed N heartbeats", and decode frees the pages at once."""
    _, d_eng, _, _ = pair
    req = _admit(d_eng, _msg("lost", room=5, port=1))  # nothing listens on port 1
    d_eng.poll(0.0)
    assert len(req.pages) == 3 and 5 in d_eng.pd.transferring  # registered, pages reserved
    for step in range(1, 41):  # fake time: 20 s, far past the heartbeats' 2 x 1 s
        d_eng.now = step * 0.5
        d_eng.poll(d_eng.now)
        if "lost" in d_eng.answers:
            break
        time.sleep(0.005)  # the bootstrap socket's I/O (real time) between polls
    assert "lost" in d_eng.answers, "the room never failed"
    reason, status = d_eng.answers["lost"]
    assert status == 502 and "missed" in reason["message"] and "heartbeats" in reason["message"]
    assert 5 not in d_eng.pd.transferring and req.pages == [] and not d_eng.scheduler.quarantine
    _all_free(d_eng)


def test_decode_respects_max_running_requests(pair) -> None:
    _, d_eng, port, _ = pair
    d_eng.pd.max_running = 1
    a, b = _admit(d_eng, _msg("a", 3, port)), _admit(d_eng, _msg("b", 4, port))
    d_eng.poll(0.0)
    assert list(d_eng.pd.transferring.values()) == [a] and list(d_eng.pd.prealloc) == [b]
    assert b.pages == []
    d_eng.pages_conserved()


# ---------------------------------------------------------------- prefill's bootstrap queue
# A PD request is schedulable on prefill only once decode registered its destination pages
# (core/pd_rules.py: prefill_schedulable): no hold-and-wait with decode's FIFO pre-allocation.


def test_prefill_schedules_only_after_decode_registers(pair) -> None:
    p_eng, d_eng, port, _ = pair
    d_eng.pd.max_running = 0  # decode claims the room but reserves no pages yet
    msg = _msg("a", room=12, port=port)
    p_req, d_req = _admit(p_eng, msg), _admit(d_eng, msg)
    for _ in range(20):  # the Claim arrives; prefill still must not schedule it
        p_eng.poll(0.0)
        d_eng.poll(0.0)
        time.sleep(0.002)
    assert p_req not in p_eng.scheduler.waiting and p_req.pages == []
    assert p_eng.pd.bootstrapping == {12: p_req} and p_eng.scheduler.find("a") is p_req  # abortable
    assert p_eng.scheduler.schedule(0.0) is None  # the policy never sees it
    stats = p_eng.pd.stats()
    assert stats["num_prefill_bootstrap_queue_reqs"] == 1 and stats["num_prefill_inflight_queue_reqs"] == 0
    # every key is an EngineStats field: /get_load and /metrics (sglang:<field>) carry it
    assert EngineStats(0, 0, 0.0, 0.0, 0, 1, **stats).num_prefill_bootstrap_queue_reqs == 1
    assert p_eng.pd.has_pending
    d_eng.pd.max_running = 8
    d_eng.poll(0.0)  # decode reserves pages and registers them
    assert len(d_req.pages) == 3
    _schedulable(p_eng, d_eng, p_req)
    assert p_req.state is ReqState.WAITING and p_req.arrival == 0.0  # its deadline still counts from arrival
    assert not p_eng.pd.bootstrapping and p_eng.pd.stats()["num_prefill_bootstrap_queue_reqs"] == 0
    p_eng.run_prefill()
    p_eng.run_prefill()
    _poll_until([p_eng, d_eng], lambda: "a" in p_eng.answers and d_req in d_eng.scheduler.running, "transfer")
    assert p_eng.answers["a"][1] == 0
    _nothing_held(p_eng)


def test_decode_registered_first_is_schedulable_at_once(pair) -> None:
    p_eng, d_eng, port, _ = pair
    msg = _msg("a", room=13, port=port)
    _admit(d_eng, msg)
    d_eng.poll(0.0)  # registers before the request reaches prefill
    _poll_until([p_eng, d_eng], lambda: p_eng.pd.mgr.decode_registered(13), "register")
    p_req = _admit(p_eng, msg)
    assert p_eng.scheduler.waiting == [p_req] and not p_eng.pd.bootstrapping
    p_eng.run_prefill()
    p_eng.run_prefill()
    _poll_until([p_eng, d_eng], lambda: "a" in p_eng.answers, "transfer")
    _nothing_held(p_eng)


def test_health_check_is_schedulable_at_once(pair) -> None:
    p_eng, _, _, _ = pair
    req = _admit(p_eng, _msg("health", room=0, port=1, host="2.2.2.2"))  # FAKE_BOOTSTRAP_HOST
    assert p_eng.scheduler.waiting == [req] and req.bootstrap_room == -1 and not p_eng.pd.bootstrapping


def test_abort_while_bootstrapping_leaks_nothing(pair) -> None:
    p_eng, d_eng, port, _ = pair
    d_eng.pd.max_running = 0  # decode claims the room, never reserves pages
    msg = _msg("a", room=14, port=port)
    _admit(p_eng, msg)
    d_req = _admit(d_eng, msg)
    _poll_until([p_eng, d_eng], lambda: p_eng.pd.mgr.rooms[14].state.claimed, "claim")
    req = p_eng.scheduler.find("a")  # as EngineCore.abort (and shutdown: every request) finds it
    assert req is not None and req.bootstrap_room in p_eng.pd.bootstrapping
    p_eng.pd.abort(req, 0.0)
    p_eng.finish(req, {"type": "abort", "message": "aborted by the client"})
    assert p_eng.answers["a"][0]["type"] == "abort"
    # the decode that claimed the room hears of it and answers its client too
    _poll_until([p_eng, d_eng], lambda: "a" in d_eng.answers and not p_eng.pd.mgr.rooms, "abort")
    reason, status = d_eng.answers["a"]  # the fault table: prefill aborts -> decode 502
    assert status == 502 and "prefill aborted" in reason["message"], reason
    assert d_req not in d_eng.pd.prealloc
    _nothing_held(p_eng)
    _all_free(d_eng)
    assert not d_eng.scheduler.all_reqs()
    # the room number is free for a new request
    again = _admit(p_eng, _msg("b", room=14, port=port))
    assert p_eng.pd.bootstrapping == {14: again}


def test_bootstrap_timeout_fails_a_bootstrapping_request_and_leaks_nothing(pair) -> None:
    p_eng, _, port, _ = pair
    _admit(p_eng, _msg("a", room=15, port=port))  # its decode never registers
    p_eng.poll(0.0)
    assert "a" not in p_eng.answers
    p_eng.now = ENVS.bootstrap_timeout + 1.0
    _poll_until([p_eng], lambda: "a" in p_eng.answers, "bootstrap timeout")
    reason, status = p_eng.answers["a"]
    assert status == 503 and "did not register" in reason["message"]
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" in reason["message"]
    assert p_eng.pd.stats()["num_bootstrap_failed_reqs_total"] == 1
    _nothing_held(p_eng)


def test_pd_sides_never_call_back_into_the_engine() -> None:
    """Issue 33: the sides return events (engine/pd_events.py) that the engine applies; none of
    them imports the engine, calls its finish/accept_token, or keeps an engine field."""
    engine_dir = Path(__file__).resolve().parents[2] / "python" / "sglang_pd" / "engine"
    for name in ("pd.py", "pd_prefill.py", "pd_decode.py", "pd_events.py"):
        tree = ast.parse((engine_dir / name).read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "sglang_pd.engine.engine_core" not in modules, name
        called = {n.func.attr for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert not called & {"finish", "accept_token"}, (name, called & {"finish", "accept_token"})
    for side in (PrefillSide, DecodeSide, NullPD):
        assert not {"core", "engine"} & {f.name for f in fields(side)}, side
