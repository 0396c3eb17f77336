"""Smooth token delivery (``--token-pacing``, off by default): tokens that run ahead of a
streaming request's TPOT SLO are held in the frontend and released at the SLO pace.

Kairos §2.3 assumes this ("excess tokens can be buffered and released gradually"); we make it
optional (deviation, named): with slack-guided decode scheduling a short request may be decoded
several times between two decodes of the others, and without pacing its client sees bursts.
Pacing never delays a token past its pace deadline, so it cannot cost a TPOT SLO; under Kairos's
mean-TPOT metric it cannot raise attainment either (it only evens the gaps: ITL p99 falls).

Rule: the first token goes out at once, at t_first (frontend clock); token k (k = 0 the first)
goes out at max(its arrival, t_first + k * T_slo). Outputs are split per token (logprobs and
``completion_tokens`` with them); the finish rides on the last token. An error or abort finish
flushes everything at once. Everything runs on the frontend's event loop with ``call_later``:
the engine loop and the receive loop never wait.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from sglang_pd.frontend.request_state import ReqState
from sglang_pd.protocol import ReqOutput


def split_output(out: ReqOutput) -> list[ReqOutput]:
    """One piece per new token (the last keeps the finish); an output without tokens stays one."""
    n = len(out.new_token_ids)
    if n <= 1:
        return [out]
    pieces = []
    for i, tok in enumerate(out.new_token_ids):
        last = i == n - 1
        piece = ReqOutput(rid=out.rid, new_token_ids=[tok], prompt_tokens=out.prompt_tokens,
                          completion_tokens=out.completion_tokens - (n - 1 - i),
                          cached_tokens=out.cached_tokens,
                          finish_reason=out.finish_reason if last else None,
                          error_status=out.error_status if last else 0)
        if out.output_token_logprobs is not None:
            piece.output_token_logprobs = out.output_token_logprobs[i:i + 1]
        if out.output_top_logprobs is not None:
            piece.output_top_logprobs = out.output_top_logprobs[i:i + 1]
        pieces.append(piece)
    return pieces


class TokenPacer:
    """Holds one request's outputs and hands them to ``apply`` at the TPOT pace."""

    def __init__(self, tpot_s: float, apply: Callable[[ReqOutput], None],
                 clock: Callable[[], float] = time.perf_counter,
                 call_later: Callable[[float, Callable[[], None]], object] | None = None) -> None:
        if not tpot_s > 0:
            raise ValueError(f"token pacing needs a TPOT > 0 seconds, got {tpot_s}")
        self.tpot_s = tpot_s
        self.apply = apply
        self.clock = clock
        self.call_later = call_later or (
            lambda delay, fn: asyncio.get_running_loop().call_later(delay, fn))
        self.queue: deque[tuple[float, ReqOutput]] = deque()  # (release time, one-token piece)
        self.t_first: float | None = None
        self.tokens_queued = 0  # tokens ever queued (the index of the next one)
        self.timer: object | None = None
        self.closed = False

    @property
    def held(self) -> int:
        return len(self.queue)

    def push(self, out: ReqOutput) -> None:
        if self.closed:
            return
        reason = out.finish_reason or {}
        if out.error_status or reason.get("type") == "abort":
            self.queue.append((0.0, out))  # errors and aborts are never held back
            self.flush()
            return
        now = self.clock()
        for piece in split_output(out):
            if piece.new_token_ids:
                if self.t_first is None:
                    self.t_first = now
                due = self.t_first + self.tokens_queued * self.tpot_s
                self.tokens_queued += 1
            else:  # a finish without tokens goes right after the last token
                due = self.queue[-1][0] if self.queue else now
            self.queue.append((due, piece))
        self.release()

    def release(self) -> None:
        """Hand over every piece that is due; arm a timer for the next one."""
        self.timer = None
        if self.closed:
            return
        now = self.clock()
        while self.queue and self.queue[0][0] <= now:
            self.apply(self.queue.popleft()[1])
        if self.queue and self.timer is None:
            self.timer = self.call_later(max(self.queue[0][0] - now, 0.0), self.release)

    def flush(self) -> None:
        """Hand over everything now (errors, aborts)."""
        while self.queue:
            self.apply(self.queue.popleft()[1])

    def close(self) -> None:
        """The request is gone (client left, server failing): drop what is held."""
        self.closed = True
        self.queue.clear()
        cancel = getattr(self.timer, "cancel", None)
        if cancel is not None:
            cancel()
        self.timer = None


class Pacers:
    """The frontend's pacers, one per streaming request with a TPOT SLO (off unless enabled);
    ``apply`` is how a released output reaches its request (unless it finished meanwhile)."""

    def __init__(self, enabled: bool, apply: Callable[[ReqState, ReqOutput], None]) -> None:
        self.enabled = enabled
        self._apply = apply
        self._by_rid: dict[str, TokenPacer] = {}

    def get(self, state: ReqState) -> TokenPacer | None:
        """``state``'s pacer (made on its first output), or None when it is not paced."""
        if not self.enabled or not state.req.stream:
            return None
        pacer = self._by_rid.get(state.rid)
        if pacer is None:
            tpot_s = state.req.slo.tpot_s if state.req.slo is not None else None  # resolved
            if not tpot_s:
                return None

            def apply(out: ReqOutput, st: ReqState = state) -> None:
                if not st.finished:
                    self._apply(st, out)

            pacer = self._by_rid[state.rid] = TokenPacer(tpot_s, apply)
        return pacer

    def drop(self, rid: str) -> None:
        pacer = self._by_rid.pop(rid, None)
        if pacer is not None:
            pacer.close()
