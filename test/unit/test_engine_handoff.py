"""A PD prefill answers a request whose KV hand-off ended before it starts the next forward
(EngineCore._await_handoffs, engine/engine_core.py): a router that awaits the prefill's answer
(SGLang's) would otherwise hold the client's first token for that whole forward. Run on the
real EngineCore with a fake PD side whose hand-off ends after a given number of polls."""

from __future__ import annotations

from sglang_pd.engine import engine_core
from sglang_pd.engine.pd import NullPD
from sglang_pd.engine.pd_events import Finished, PDEvent
from sglang_pd.engine.request import Req
from sglang_pd.protocol import GenerateReq, SamplingParams
from sglang_pd.server_args import ServerArgs


class HandoffPD(NullPD):
    """A prefill side with one request whose KV is on its way: ``polls_left`` more polls, then
    its hand-off ends (None: never)."""

    def __init__(self, polls_left: int | None) -> None:
        super().__init__(role="prefill", flush_early=True)
        self.req: Req | None = None
        self.polls_left, self.polls = polls_left, 0
        self.waited: list[bool] = []

    @property  # type: ignore[override]
    def handing_off(self) -> bool:
        return self.req is not None and not self.waited and not self.req.finished

    @handing_off.setter
    def handing_off(self, value: bool) -> None:
        pass  # NullPD's dataclass __init__ sets its field

    def handoffs_waited(self) -> None:
        self.waited.append(True)

    def poll(self, now: float) -> list[PDEvent]:
        self.polls += 1
        if self.req is None or self.polls_left is None or self.req.finished:
            return []
        self.polls_left -= 1
        return [Finished(self.req, {"type": "length", "length": 1})] if self.polls_left <= 0 else []


def _core(model: str, pd: HandoffPD, wait_ms: float = 50.0) -> tuple[engine_core.EngineCore, Req]:
    core = engine_core.EngineCore(ServerArgs(model_path=model, page_size=4, device="cpu",
                                             max_total_tokens=2048, dtype="float32",
                                             disaggregation_prefill_handoff_wait_ms=wait_ms))
    handed = Req("handed", [1, 2, 3], SamplingParams(max_new_tokens=1), arrival=core.clock())
    handed.output_ids.append(7)
    core.scheduler.park(handed)  # as PrefillSide.on_first_token leaves it: parked, KV on its way
    pd.req = handed
    core.pd = pd
    core.add_request(GenerateReq(rid="next", input_ids=list(range(5, 45)),
                                 sampling_params=SamplingParams(max_new_tokens=2)))
    return core, handed


def test_ended_handoff_answers_before_the_next_forward(tiny_model_factory) -> None:
    core, handed = _core(tiny_model_factory("llama"), HandoffPD(polls_left=3))
    nxt = core.scheduler.find("next")
    outs = core.step()
    assert [o.rid for o in outs] == ["handed"] and handed.finished  # the answer, alone
    assert nxt is not None and nxt.first_run_time is None and nxt.kv_len == 0  # no forward ran
    assert core.pd.waited == [True]
    outs = core.step()  # now the next request's prefill runs
    assert nxt.first_run_time is not None and nxt.kv_len > 0


def test_a_slow_handoff_delays_the_forward_at_most_once(tiny_model_factory) -> None:
    pd = HandoffPD(polls_left=None)  # never ends
    core, handed = _core(tiny_model_factory("llama"), pd)
    core.handoff_wait_s = 0.02
    nxt = core.scheduler.find("next")
    core.step()
    assert pd.waited == [True] and pd.polls >= 2  # it polled, gave up at the bound
    assert nxt is not None and nxt.first_run_time is not None  # and the forward ran
    polls = pd.polls
    core.step()
    assert pd.polls == polls + 1  # no second wait for the same hand-off
    assert not handed.finished



def test_no_wait_answers_after_the_forward_as_sglangs_prefill(tiny_model_factory) -> None:
    """``--disaggregation-prefill-handoff-wait-ms 0``: the loop polls once and starts the
    forward; the ended hand-off is answered at the next loop (the baselines' setting)."""
    pd = HandoffPD(polls_left=2)
    core, handed = _core(tiny_model_factory("llama"), pd, wait_ms=0.0)
    nxt = core.scheduler.find("next")
    outs = core.step()
    assert not handed.finished and "handed" not in [o.rid for o in outs]  # one poll: not ended yet
    assert nxt is not None and nxt.first_run_time is not None  # the forward ran meanwhile
    assert pd.waited == []
    outs = core.step()
    assert "handed" in [o.rid for o in outs] and handed.finished
